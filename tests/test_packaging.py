"""``pip install`` of the wheel into a fresh venv is enough to run ``falcon-es db upgrade``:
the migrations ship in the wheel, and the declared dependencies are all it needs.

Unlike the deploy test (which lends the venv this environment's packages), this one
lets pip resolve the wheel's own dependency list from the package index, so a module
imported but not declared in pyproject.toml fails here.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What a source distribution of the project holds (everything the build reads).
SOURCES = ("pyproject.toml", "README.md", "falcon_es")
TABLES = {"task_events", "log_head", "checkpoints", "clusters", "job", "alembic_version"}


def _run(args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: int = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the working tree, so a concurrent build elsewhere (or a
    stale ``build/`` directory) cannot leak into it."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.db*"))
        else:
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("wheels")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
          "-w", out, source], cwd=source)
    (built,) = out.glob("falcon_es-*.whl")
    return built


def test_the_wheel_holds_the_migrations_and_every_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "falcon_es/migrations/env.py" in names
    assert any(n.startswith("falcon_es/migrations/versions/0001") for n in names)
    for package in ("falcon_es/__init__.py", "falcon_es/__main__.py",
                    "falcon_es/projections/__init__.py", "falcon_es/handlers/__init__.py",
                    "falcon_es/migrations/__init__.py"):
        assert package in names, package
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "falcon_es").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert on_disk <= names, f"modules left out of the wheel: {sorted(on_disk - names)}"
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"falcon_es"}, f"the wheel installs more than one top-level name: {tops}"


@pytest.mark.slow
def test_pip_install_of_the_wheel_into_a_fresh_venv_runs_db_upgrade(wheel: Path, tmp_path: Path) -> None:
    """pip resolves and installs the wheel's declared dependencies into the new venv
    (driven by this environment's pip through ``--python``; ``--no-compile`` skips
    byte-compiling the large Google and Kubernetes clients, which is most of the time)."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FALCON_", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
          "--no-compile", wheel], cwd=tmp_path, env=env, timeout=600)

    located = _run([venv / "bin" / "python", "-c", "import falcon_es, falcon_es.migrations; "
                    "print(falcon_es.__file__); print(falcon_es.migrations.__file__)"],
                   cwd=tmp_path, env=env)
    for path in located.stdout.split():
        assert path.startswith(str(venv)), f"imported from outside the venv: {path}"
    for top in ("handlers", "projections", "migrations"):
        clash = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {top}"],
                               cwd=tmp_path, env=env, capture_output=True, text=True,
                               check=False)
        assert clash.returncode != 0 and "ModuleNotFoundError" in clash.stderr, (
            f"the wheel installs a top-level {top!r}")

    helped = _run([venv / "bin" / "falcon-es", "--help"], cwd=tmp_path, env=env)
    assert "Falcon-ES" in helped.stdout
    for command in ("db", "cluster", "task", "history", "events", "replay", "chart"):
        assert f"  {command} " in helped.stdout

    database = tmp_path / "x.db"
    upgraded = _run([venv / "bin" / "falcon-es", "--db", f"sqlite:///{database}", "db", "upgrade",
                     "--create-job-table"], cwd=tmp_path, env=env)
    assert upgraded.stdout.startswith("database at revision ")
    with sqlite3.connect(database) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert TABLES <= tables
        assert conn.execute("SELECT last_seq FROM log_head").fetchall() == [(0,)]
    checked = _run([venv / "bin" / "python", "-m", "falcon_es", "--db", f"sqlite:///{database}",
                    "db", "check"], cwd=tmp_path, env=env)
    assert "all 16 columns present" in checked.stdout
