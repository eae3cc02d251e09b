"""The owner's structural rules, checked on the source: the dependency direction
(core -> nothing of ours above it), no module-level mutable state, and no modules
that import each other."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Calls that build a mutable container.
MUTABLE_FACTORIES = frozenset({"list", "dict", "set", "defaultdict", "deque", "OrderedDict",
                               "Counter", "bytearray"})
MUTABLE_LITERALS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
ADAPTERS = "falcon_es.adapters"


def modules(*tops: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for top in tops for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def imported(relative: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import, including those inside functions."""
    path = ROOT / relative
    package = relative.removesuffix(".py").split("/")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def test_the_floor_plan_holds() -> None:
    """The layers and independences declared in pyproject.toml ([tool.importlinter]),
    checked by import-linter on the installed package, TYPE_CHECKING imports included.

    In a process of its own: its CLI configures logging with ``dictConfig``, which
    disables every logger that exists already, and the tests after it that read logs
    (``caplog``) would see nothing."""
    linted = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}))"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert linted.returncode == 0, (
        "an import breaks the floor plan:\n" + linted.stdout + linted.stderr)


def test_the_floor_plan_covers_every_package() -> None:
    """Every sub-package of falcon_es sits in a layer, so nothing escapes the contract."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = next(c["layers"] for c in config["tool"]["importlinter"]["contracts"]
                  if c["type"] == "layers")
    declared = {name.strip() for layer in layers for name in layer.split("|")}
    packages = {f"falcon_es.{path.parent.name}" for path in (ROOT / "falcon_es").glob("*/__init__.py")}
    assert packages - {"falcon_es.demo_data"} == declared


#: The most lines a module may have: past it, a module holds several concepts that
#: want modules (and names) of their own.
MAX_MODULE_LINES = 700


def test_no_module_is_over_the_size_limit() -> None:
    lengths = {module: len((ROOT / module).read_text(encoding="utf-8").splitlines())
               for module in modules("falcon_es")}
    over = {module: n for module, n in lengths.items() if n > MAX_MODULE_LINES}
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines: split them along their concepts"


#: The lifecycle index's writing methods: a projection is written only from committed
#: events (its InlineProjection half) or when the log is folded again.
INDEX_WRITES = frozenset({"apply", "committed", "discarded", "rebuild", "resync", "forget",
                          "update"})


def index_writes_in(source: str, label: str) -> Iterator[str]:
    """Calls of ``<...>index.<write>(...)``: a handler writing the lifecycle index."""
    for node in ast.walk(ast.parse(source, label)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in INDEX_WRITES):
            owner = node.func.value
            name = (owner.id if isinstance(owner, ast.Name)
                    else owner.attr if isinstance(owner, ast.Attribute) else "")
            if name == "index":
                yield f"{label}:{node.lineno} {ast.unparse(node.func)}"


def test_handlers_never_write_the_lifecycle_index() -> None:
    """Projections are written only from committed events: what a handler keeps across
    ticks (when a create is next looked at) lives in the engine's ``OperationPolls``."""
    found = [hit for module in modules("falcon_es/handlers")
             for hit in index_writes_in((ROOT / module).read_text(encoding="utf-8"), module)]
    assert found == []
    assert list(index_writes_in("ctx.index.update(s)\nindex.ids()\n", "s")) == [
        "s:1 ctx.index.update"]


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, MUTABLE_LITERALS):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in MUTABLE_FACTORIES
    return False


def mutables_in(source: str, label: str) -> Iterator[str]:
    """Top-level assignments of list/dict/set literals or of list()/dict()/set() calls.
    Dunder names (``__all__``) are Python's own protocol, not state."""
    for node in ast.parse(source, label).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [ast.unparse(t) for t in targets]
        if all(n.startswith("__") and n.endswith("__") for n in names):
            continue
        if _mutable(value):
            yield f"{label}:{node.lineno} {' = '.join(names)}"


@pytest.mark.parametrize("module", modules("falcon_es"))
def test_no_module_level_mutable_state(module: str) -> None:
    found = list(mutables_in((ROOT / module).read_text(encoding="utf-8"), module))
    assert found == [], ("module constants must be immutable (tuple, frozenset, "
                         "MappingProxyType): " + "; ".join(found))


def test_the_mutable_state_check_catches_what_it_should() -> None:
    sample = (
        "A = []\nB: dict[str, int] = {}\nC = set()\nD = collections.defaultdict(list)\n"
        "E = (1, 2)\nF = frozenset({1})\nG = MappingProxyType({'a': 1})\n__all__ = ['x']\n"
        "H = I = [x for x in E]\nlog = logging.getLogger('x')\n"
        "def f():\n    local = []\n"
        "class K:\n    inner = []\n"
    )
    assert list(mutables_in(sample, "s")) == ["s:1 A", "s:2 B", "s:3 C", "s:4 D", "s:9 H = I"]


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    resolved = {name for _, name in imported("falcon_es/app/application.py")}
    assert "falcon_es.storage.store" in resolved and "falcon_es.projections.job_table" in resolved


# --- Import cycles -----------------------------------------------------------------
#
# Modules that import each other depend on import order: whichever runs first sees the
# other half-initialised, so a name it needs may not exist yet, and a change far away
# (a new import in a third module) can reorder them and break start-up. The graph below
# has one node per module of the installed package and an edge for every import that
# executes; a strongly connected component of more than one module is a cycle.
#
# What counts as an edge: ``importer -> imported`` when one of importer's import
# statements runs imported's code or reads its namespace.
# * Imports inside functions count: they run, only later (a cycle through them fails
#   the first time that function runs, in whatever state the other module is then).
# * Imports under ``if TYPE_CHECKING:`` do not: they never execute (their ``else``
#   branch does, and counts).
# * A package's ``__init__`` is the package's own node (``a.b``).
# * ``from a.b import n`` depends on ``a.b.n`` when that is a module, and always on
#   ``a.b``: Python looks ``n`` up in the package's namespace, which ``a.b/__init__``
#   fills, and falls back to the submodule only when the name is missing.
#   ``import a.b.c`` (``as x`` or not) depends on ``a.b.c`` and on ``a`` and ``a.b``,
#   through whose namespaces the name ``c`` is reached.
# * Importing runs the ``__init__`` of each package on the path first, except of the
#   packages that contain the importer: Python starts a package's ``__init__`` before
#   any of its modules, so a module never triggers its own package's ``__init__``.
# So a package ``__init__`` may import its submodules to re-export their names, and
# they may import each other with ``from a.b.c import name`` (which reads only
# ``a.b.c``); but an ``__init__`` importing submodules that take anything from the
# package (``from falcon_es.adapters.gcp import pools`` in one of its modules) is a
# cycle: that module sees whatever the half-run ``__init__`` has bound so far.

#: Where each package of the wheel lives in the repository.
INSTALLED_PACKAGES = (("falcon_es", "falcon_es"),)


@dataclasses.dataclass(frozen=True)
class Source:
    """One module as the import graph sees it: its text, and whether it is a package's
    ``__init__`` (a package contains itself, a module only its parents)."""
    label: str
    text: str
    is_package: bool


@dataclasses.dataclass(frozen=True)
class Edge:
    """``importer`` runs ``imported`` or reads its namespace (at ``label:line``)."""
    importer: str
    imported: str
    label: str
    line: int

    def __str__(self) -> str:
        return f"{self.label}:{self.line} {self.importer} -> {self.imported}"


def installed_sources() -> dict[str, Source]:
    """Every module of the installed package, by its installed dotted name."""
    found: dict[str, Source] = {}
    for top, installed in INSTALLED_PACKAGES:
        for relative in modules(top):
            parts = relative.removesuffix(".py").split("/")[1:]
            is_package = parts[-1:] == ["__init__"]
            name = ".".join([installed, *(parts[:-1] if is_package else parts)])
            found[name] = Source(relative, (ROOT / relative).read_text(encoding="utf-8"),
                                 is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def executed_imports(node: ast.AST, *, for_types: bool = False
                     ) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that can run: all of them, in functions
    too, except the bodies of ``if TYPE_CHECKING:`` (unless ``for_types``: those are
    the imports the type checker follows)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif isinstance(node, ast.If) and _is_type_checking(node.test) and not for_types:
        for statement in node.orelse:
            yield from executed_imports(statement)
    else:
        for child in ast.iter_child_nodes(node):
            yield from executed_imports(child, for_types=for_types)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_edges(sources: Mapping[str, Source], *, for_types: bool = False) -> list[Edge]:
    """The edges between ``sources`` (imports of anything else are not ours);
    ``for_types`` counts the imports under ``if TYPE_CHECKING:`` too."""
    edges: list[Edge] = []
    for importer, source in sorted(sources.items()):
        own = importer if source.is_package else importer.rpartition(".")[0]
        containing = set(_ancestors(importer)) | ({importer} if source.is_package else set())
        for node in executed_imports(ast.parse(source.text, source.label),
                                     for_types=for_types):
            named: list[str]
            if isinstance(node, ast.Import):
                named = [n for alias in node.names for n in (*_ancestors(alias.name), alias.name)]
            else:
                if node.level:
                    base = own.split(".")[: len(own.split(".")) - node.level + 1]
                    package = ".".join([*base, node.module] if node.module else base)
                else:
                    package = node.module or ""
                named = [package]
                named += [f"{package}.{a.name}" for a in node.names
                          if f"{package}.{a.name}" in sources]
            targets = set(named)
            for name in named:
                targets.update(a for a in _ancestors(name) if a not in containing)
            edges += [Edge(importer, target, source.label, node.lineno)
                      for target in sorted(targets)
                      if target in sources and target != importer]
    return edges


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm),
    each sorted, in sorted order."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe_cycles(edges: list[Edge]) -> list[str]:
    """Each cycle's modules, then the import lines that join them."""
    described = []
    for component in cycles(edges):
        members = set(component)
        lines = [str(e) for e in edges if e.importer in members and e.imported in members]
        described.append(" <-> ".join(component) + "\n    " + "\n    ".join(lines))
    return described


def test_the_import_graph_sees_every_installed_module() -> None:
    sources = installed_sources()
    for expected in ("falcon_es", "falcon_es.storage.store", "falcon_es.adapters.gcp",
                     "falcon_es.adapters.sim.world", "falcon_es.handlers",
                     "falcon_es.handlers.intake", "falcon_es.projections.job_table",
                     "falcon_es.migrations.env"):
        assert expected in sources, expected
    assert not any(name.startswith(("handlers", "projections", "schema"))
                   for name in sources)
    edges = import_edges(sources)
    assert Edge("falcon_es.adapters.sim", "falcon_es.adapters.sim.world",
                "falcon_es/adapters/sim/__init__.py", 23) in edges


def test_no_import_cycles() -> None:
    found = describe_cycles(import_edges(installed_sources(), for_types=True))
    assert found == [], "modules import each other (TYPE_CHECKING included):\n" + "\n".join(found)


def test_adapters_import_only_downward_even_for_types() -> None:
    """An adapter's modules form layers: the world or the wiring builds the port
    adapters and hands them what they need, so none of them refers back to what
    builds it, not even in a type hint."""
    edges = [e for e in import_edges(installed_sources(), for_types=True)
             if e.importer.startswith(ADAPTERS) and e.imported.startswith(ADAPTERS)]
    found = describe_cycles(edges)
    assert found == [], "adapter modules refer to each other:\n" + "\n".join(found)


def test_the_cycle_finder_catches_a_cycle() -> None:
    def source(text: str, is_package: bool = False) -> Source:
        return Source("sample", text, is_package)

    sample = {
        # An __init__ re-exporting a submodule, which imports a sibling by the
        # package's namespace: a cycle (pkg, pkg.a).
        "pkg": source("from pkg.a import f\n", is_package=True),
        "pkg.a": source("from pkg import b\ndef f():\n    return b\n"),
        # A name from a sibling module reads only that module: no cycle.
        "pkg.b": source("from pkg.c import X\n"),
        "pkg.c": source("X = 1\n"),
        # A cycle through a function's import; and one under TYPE_CHECKING that is not.
        "m": source("import n\n"),
        "n": source("def g():\n    from m import h\n"),
        "p": source("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import q\n"
                    "else:\n    import r\n"),
        "q": source("import p\n"),
        "r": source("X = 1\n"),
        # Importing a module of another package runs that package's __init__.
        "other": source("from pkg.c import X\n", is_package=True),
        # ``import a.b.c as x`` reaches c through a.b's namespace, like ``from a.b import c``.
        "pkg2": source("import pkg2.x\n", is_package=True),
        "pkg2.x": source("import pkg2.y as y\n"),
        "pkg2.y": source("X = 1\n"),
    }
    edges = import_edges(sample)
    assert cycles(edges) == [["m", "n"], ["pkg", "pkg.a"], ["pkg2", "pkg2.x"]]
    assert Edge("p", "r", "sample", 5) in edges and not any(e.imported == "q" for e in edges)
    assert ["p", "q"] in cycles(import_edges(sample, for_types=True))
    assert {e.imported for e in edges if e.importer == "other"} == {"pkg", "pkg.c"}
    assert {e.imported for e in edges if e.importer == "pkg.b"} == {"pkg.c"}
    assert "pkg <-> pkg.a" in describe_cycles(edges)[1]
