"""The code type-checks: mypy over the three packages, with the settings in
pyproject.toml, reports nothing (type hints are part of the code's contract)."""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors() -> None:
    report, errors, status = api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental",
        "--cache-dir", "/dev/null",
        "-p", "falcon_es"])
    assert status == 0, report + errors
