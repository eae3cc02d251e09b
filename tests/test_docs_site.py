"""The documentation: the README stays a short entry point whose links all lead somewhere,
and the site under ``docs/`` builds with ``mkdocs build --strict`` (a broken link, a
missing anchor or a page left out of the navigation fails it). The command-line
reference is generated from the click commands when the site is built; the metrics page
is held equal to the metrics the code registers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click

from falcon_es.cli import COMMANDS, main
from falcon_es.observability.metrics import Metrics

from falcon_es.domain.spec import KNOWN_FIELDS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250
#: A Markdown link or image: the target up to the closing parenthesis (an optional
#: title after a space is left out).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into a page under docs/")


def relative_links(text: str) -> list[str]:
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", t)]


def test_every_relative_link_in_the_readme_points_at_an_existing_file() -> None:
    links = relative_links(README.read_text(encoding="utf-8"))
    assert links, "the README links nowhere: where would a newcomer go next?"
    missing = [link for link in links
               if not (ROOT / link.split("#", 1)[0]).exists()]
    assert missing == []


def test_the_link_pattern_reads_markdown_links() -> None:
    text = ("[a](docs/a.md) ![i](docs/i.png \"title\") [b](https://x.org/y) [c](#top) "
            "[e](docs/e.md#part)")
    assert relative_links(text) == ["docs/a.md", "docs/i.png", "docs/e.md#part"]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # Not --quiet: it filters the warnings out before --strict counts them.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    # The command-line reference is read from the click group when the site is built:
    # every command of the program has its section there.
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for path in command_paths():
        assert f"falcon-es {path}" in cli, f"{path} missing from the generated CLI reference"


def command_paths() -> list[str]:
    """Every command of the program and of its groups, as typed after ``falcon-es``."""
    ctx = click.Context(main)
    paths = []
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        paths.append(name)
        if isinstance(command, click.Group):
            paths.extend(f"{name} {sub}" for sub in command.list_commands(ctx))
    return paths


def test_the_cli_reference_is_generated_from_the_click_group() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "::: mkdocs-click" in page
    assert ":module: falcon_es.cli" in page
    assert ":command: main" in page
    assert set(main.list_commands(click.Context(main))) == set(COMMANDS)


def registered_metrics() -> set[str]:
    metrics = Metrics(process_collectors=False)
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_the_metrics_page_lists_exactly_the_metrics_the_code_registers() -> None:
    page = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(falcon_\w+)` \|", page, re.MULTILINE))
    assert documented == registered_metrics()


def test_the_task_spec_page_lists_exactly_the_fields_the_code_knows() -> None:
    page = (DOCS / "reference" / "task-spec.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)` \| ", page, re.MULTILINE))
    assert documented == set(KNOWN_FIELDS)


#: A path of the project's own source, as the docs name it (``falcon_es/engine/runtime.py``,
#: ``falcon_es/handlers/``); a path ending in ``/`` names a folder.
SOURCE_PATH = re.compile(r"\b(?:falcon_es|tests|deploy)/[\w/]*(?:\.py|/)")


def test_every_source_path_the_docs_name_exists() -> None:
    """The walkthrough and the architecture page lead a newcomer file by file: a module
    that moved must take its mention with it."""
    missing = sorted(
        f"{page.relative_to(ROOT)}: {path}"
        for page in [README, *DOCS.rglob("*.md")]
        for path in set(SOURCE_PATH.findall(page.read_text(encoding="utf-8")))
        if not (ROOT / path).exists()
    )
    assert missing == [], "the docs name paths that do not exist:\n" + "\n".join(missing)


def test_the_source_path_pattern_reads_paths_in_prose() -> None:
    text = "see `falcon_es/engine/runtime.py`, the folder falcon_es/handlers/ and tests/fakes/x.py."
    assert SOURCE_PATH.findall(text) == [
        "falcon_es/engine/runtime.py", "falcon_es/handlers/", "tests/fakes/x.py"]
