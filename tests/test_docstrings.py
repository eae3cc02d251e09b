"""Comments and docstrings cite nothing a reader of the repository cannot open.

The design document and the issue tracker the project started from are not in the
repository, so a section number of the one or an issue number of the other tells the
reader nothing: the text says the reason itself, or points to a page of the documentation
(README.md and the site under docs/). The scan covers every text file of the shipped
code, the tests, the deployment, the README and the documentation; it has no allow-list.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What is scanned: folders (walked without following symlinks) and single files.
SCANNED = ("falcon_es", "tests", "deploy", "README.md", "docs", "mkdocs.yml")
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache"})
#: Citations of documents that are not in the repository. The patterns are spelled in
#: pieces so that this file does not match them itself.
CITATION = re.compile(
    "|".join((
        "DESIGN" + r"\s*§",  # a section of the design document
        "DESIGN" + r"\.md",  # the design document by name
        # an issue by number, with or without "#", in the singular or the plural; not
        # the word in ordinary English, nor re-issue or issue_token followed by a number
        r"(?<![\w-])" + "issue" + r"s?\s*#?\d",
    )),
    re.IGNORECASE,
)


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            yield top
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for file in sorted(files):
                path = Path(folder) / file
                if not path.is_symlink():
                    yield path


def citations_in(text: str, label: str) -> Iterator[str]:
    for number, line in enumerate(text.splitlines(), start=1):
        if CITATION.search(line):
            yield f"{label}:{number}: {line.strip()}"


def test_no_comment_or_docstring_cites_a_document_outside_the_repository() -> None:
    found: list[str] = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # not text (a compiled file, an image)
            continue
        found.extend(citations_in(text, str(path.relative_to(ROOT))))
    assert found == [], (
        "say the reason itself or point to a documentation page "
        "(see docs/reference/job-table.md) "
        "instead of citing the design document or an issue number:\n" + "\n".join(found))


def test_the_scan_reads_every_scanned_folder() -> None:
    seen = {str(p.relative_to(ROOT)) for p in scanned_files()}
    for expected in ("README.md", "falcon_es/domain/events.py", "falcon_es/handlers/abort.py",
                     "falcon_es/projections/node_pools.py", "tests/test_docstrings.py",
                     "deploy/README.md", "docs/explanation/scheduling.md", "docs/FIDELITY.md",
                     "mkdocs.yml"):
        assert expected in seen
    assert any(s.startswith("falcon_es/migrations/versions/") for s in seen)


def test_the_pattern_matches_citations_and_not_ordinary_words() -> None:
    issue, design = "issue", "DESIGN"
    cited = [f"({issue} 4)", f"Task lifecycle ({issue} 4): x", f"{issue} #12",
             f"the {issue}s 4 and 5", f"{issue.capitalize()} 6, high availability",
             f"{design} §10", f"({design} §3 intent before effect)", f"see {design}.md",
             f"see {design.lower()}.md"]
    ordinary = [f"an {issue} with the pool", f"re-{issue} 2 intents", f"{issue}_token(3)",
                f"re-{issue}d 4 times", f"{issue}d 3 tokens", f"{issue}r 2",
                "the design of the chart", f"no {issue} here, 4 left"]
    assert [c for c in cited if not CITATION.search(c)] == []
    assert [o for o in ordinary if CITATION.search(o)] == []
    assert list(citations_in(f"a\nb ({issue} 4)\n", "f.py")) == [f"f.py:2: b ({issue} 4)"]
