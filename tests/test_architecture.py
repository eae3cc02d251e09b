"""The owner's structural rules, checked on the source: the dependency direction
(core -> nothing of ours above it) and no module-level mutable state."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The composition root: the only core modules that may wire in handlers, projections
#: and adapters (DESIGN §2, the brief's "bootstrap.py and cli.py").
#: service.py wires a running controller for the commands built on it (demo.py,
#: simulate.py): they choose backends and handlers, so they belong to the root too.
#: cli.py is now the falcon_es/cli/ package: every module in it is part of the root.
COMPOSITION_ROOT_PACKAGES = ("falcon_es/cli/",)
COMPOSITION_ROOT = frozenset({
    "falcon_es/bootstrap.py", "falcon_es/__main__.py",
    "falcon_es/service.py", "falcon_es/demo.py", "falcon_es/simulate.py",
})
#: Benchmarks drive the whole application, like the CLI that runs them.
OUTSIDE_THE_CORE = ("falcon_es/bench/",)
ABOVE_THE_CORE = ("falcon_es.handlers", "falcon_es.projections")
ADAPTERS = "falcon_es.adapters"
#: Calls that build a mutable container.
MUTABLE_FACTORIES = frozenset({"list", "dict", "set", "defaultdict", "deque", "OrderedDict",
                               "Counter", "bytearray"})
MUTABLE_LITERALS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


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


CORE = [m for m in modules("falcon_es")
        if m not in COMPOSITION_ROOT and not m.startswith(COMPOSITION_ROOT_PACKAGES)
        and not m.startswith(OUTSIDE_THE_CORE)]


def test_the_scan_sees_the_core() -> None:
    for expected in ("falcon_es/store.py", "falcon_es/task.py", "falcon_es/chart.py",
                     "falcon_es/runtime.py", "falcon_es/db.py"):
        assert expected in CORE
    assert not any(m in CORE for m in COMPOSITION_ROOT)
    assert "falcon_es/cli/__init__.py" in modules("falcon_es")
    assert not any(m.startswith(COMPOSITION_ROOT_PACKAGES) for m in CORE)
    assert list(imported("falcon_es/bootstrap.py"))


@pytest.mark.parametrize("module", CORE)
def test_core_modules_import_no_handlers_projections_or_adapters(module: str) -> None:
    is_adapter = module.startswith("falcon_es/adapters/")
    wrong = []
    for line, name in imported(module):
        if any(name == above or name.startswith(above + ".") for above in ABOVE_THE_CORE):
            wrong.append(f"{module}:{line} imports {name}")
        elif not is_adapter and (name == ADAPTERS or name.startswith(ADAPTERS + ".")):
            wrong.append(f"{module}:{line} imports {name}")
    wrong = [w for w in wrong if not any(w.startswith(other + ".") for other in wrong)]
    assert wrong == [], (
        "falcon_es core must not import handlers, projections or an adapter; only the "
        "composition root (bootstrap.py, cli/) may: " + "; ".join(wrong))


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


@pytest.mark.parametrize("module", modules("falcon_es", "handlers", "projections"))
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
    resolved = {name for _, name in imported("falcon_es/bootstrap.py")}
    assert "falcon_es.store" in resolved and "falcon_es.projections.job_table" in resolved
