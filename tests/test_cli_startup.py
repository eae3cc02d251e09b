"""The command line loads what a command needs, when it runs: the commands an upper
layer or a person scripts (``task``, ``queues``, ``history``, ``events``, ``db``) never
load the Google and Kubernetes clients or the metrics library, and the ``task``
commands not even the controller's modules or the state chart's engine.

Each command runs in a fresh interpreter (an import done by an earlier test would hide
one), in-process through click, and the probe reports the modules loaded afterwards.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from falcon_es.cli import COMMANDS, main
from falcon_es.cli.common import USER_ERRORS

from tests.test_cli import cli, ok, submit, take_in

ROOT = Path(__file__).resolve().parent.parent
#: Runs ``falcon-es ARGS`` in this interpreter and prints what it printed and every
#: module loaded by then, as JSON.
PROBE = """
import contextlib, io, json, sys
from falcon_es.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(sys.argv[1:], prog_name="falcon-es", standalone_mode=False)
print(json.dumps({"output": out.getvalue(), "modules": sorted(sys.modules)}))
"""
#: The Google Cloud and Kubernetes clients (and what they stand on), and the metrics
#: library of the long-running processes.
CLIENTS = ("google", "grpc", "kubernetes", "prometheus_client")
#: What only the controller and the commands that fold or append need.
CONTROLLER = ("statemachine", "alembic", "falcon_es.app.bootstrap", "falcon_es.handlers",
              "falcon_es.projections", "falcon_es.adapters", "falcon_es.observability",
              "falcon_es.domain.chart", "falcon_es.domain.events")


def loaded(*args: str) -> tuple[str, set[str]]:
    """What ``falcon-es ARGS`` printed, and the modules loaded once it is done."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    return report["output"], set(report["modules"])


def among(modules: set[str], packages: Sequence[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.fixture
def known_task(db_url: str) -> str:
    """A task the log knows (so ``history`` has events to show)."""
    task_id = submit(db_url)
    take_in(db_url)
    return task_id


#: Each command, and what it must not load: the ``task`` commands only read and write
#: the job table; the others fold the log or migrate, but never talk to GCP.
#: ``task list`` and ``task show`` read through the driver alone, on either dialect.
DRIVER_ONLY = ("sqlalchemy", "tabulate")
COMMANDS_AND_UNNEEDED = (
    *((command, (*CLIENTS, *CONTROLLER, *DRIVER_ONLY)) for command in (
        ("task", "list"), ("task", "list", "--json"), ("task", "show", "{task}"),
        ("task", "list", "--status", "Pending", "--limit", "5"),
        ("task", "show", "{task}", "--json"))),
    *((command, (*CLIENTS, *CONTROLLER)) for command in (
        ("task", "submit", "--actor", "a", "--name", "n", "--tpu-type", "v6e", "--topology",
         "2x2", "--image", "img:1"),
        ("task", "abort", "{task}"))),
    *((command, CLIENTS) for command in (
        ("queues",), ("queues", "--json"), ("history", "{task}"), ("events",),
        ("db", "check"), ("db", "upgrade"))),
)


@pytest.mark.parametrize(("command", "unneeded"), COMMANDS_AND_UNNEEDED,
                         ids=[" ".join(c) for c, _ in COMMANDS_AND_UNNEEDED])
def test_a_command_loads_no_client_it_does_not_use(
        db_url: str, known_task: str, command: tuple[str, ...], unneeded: tuple[str, ...]) -> None:
    output, modules = loaded("--db", db_url, *(a.format(task=known_task) for a in command))
    assert output
    assert among(modules, unneeded) == []


def test_history_and_events_read_the_log_without_the_controller(db_url: str,
                                                                 known_task: str) -> None:
    for command in (("history", known_task), ("events", "--json")):
        output, modules = loaded("--db", db_url, *command)
        assert "TaskAccepted" in output
        assert among(modules, ("statemachine", "falcon_es.app.bootstrap", "falcon_es.handlers",
                               "falcon_es.projections", "falcon_es.adapters")) == []


def test_the_command_line_itself_loads_no_command() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys, falcon_es.cli; print('\\n'.join(sys.modules))"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    modules = set(result.stdout.split())
    assert among(modules, ("falcon_es",)) == ["falcon_es", "falcon_es.cli", "falcon_es.cli.common"]
    assert among(modules, ("sqlalchemy", *CLIENTS)) == []


def test_every_command_is_registered_under_its_own_name() -> None:
    assert ok(cli(None, "--help"))
    with main.make_context("falcon-es", ["--help"], resilient_parsing=True) as ctx:
        names = main.list_commands(ctx)
        assert names == sorted(COMMANDS)
        for name in names:
            command = main.get_command(ctx, name)
            assert command is not None and command.name == name


def test_the_user_errors_caught_by_name_exist() -> None:
    for module, name in USER_ERRORS:
        error = getattr(importlib.import_module(module), name)
        assert isinstance(error, type) and issubclass(error, Exception), (module, name)
