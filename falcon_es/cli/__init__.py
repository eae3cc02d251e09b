"""The ``falcon-es`` command line (also ``python -m falcon_es``).

Human-readable tables by default, ``--json`` for scripts. Exit codes: 0 success,
1 the command ran and found a problem (a replay difference, a failed check),
2 bad input, 3 the database cannot be used.

Each command lives in the module of its group:

========================  ===========================================================
``cli/db.py``             ``db upgrade``, ``db check``
``cli/clusters.py``       ``cluster add|list|set-status``, ``clusters``
``cli/tasks.py``          ``task submit|list|show|abort``
``cli/audit.py``          ``history``, ``events``, ``replay``, ``chart``
``cli/queues.py``         ``queues``
``cli/observe.py``        ``logs``, ``timeline``
``cli/controller.py``     ``run``
``cli/gcp.py``            ``informer``, ``doctor``
``cli/smoke.py``          ``smoke``
``cli/sim.py``            ``demo``, ``simulate``
``cli/bench.py``          ``bench store|scheduler|e2e``
========================  ===========================================================

``cli/common.py`` holds what they share (errors and exit codes, output, opening the
database, the log and the app, the gcp backend); ``cli/process.py`` the set-up of the
long-running processes (``run`` and ``informer``): logging, signals, health server,
leader election.

A command's module is imported when that command runs (``LazyGroup``), not when the
program starts: ``task list`` loads the job table's modules and SQLAlchemy, never the
controller, the simulated world or the Google and Kubernetes clients, so it answers
as fast as Python and SQLAlchemy start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import click

from falcon_es.cli.common import EXIT_BAD_INPUT, EXIT_DATABASE, EXIT_PROBLEM, Failure

__all__ = ["EXIT_BAD_INPUT", "EXIT_DATABASE", "EXIT_PROBLEM", "main", "run"]


# Each loader imports the module of some commands: written as import statements, so the
# import graph (tests/test_architecture.py) sees them, and run when a command is used.
def _audit() -> ModuleType:
    from falcon_es.cli import audit
    return audit


def _bench() -> ModuleType:
    from falcon_es.cli import bench
    return bench


def _clusters() -> ModuleType:
    from falcon_es.cli import clusters
    return clusters


def _controller() -> ModuleType:
    from falcon_es.cli import controller
    return controller


def _db() -> ModuleType:
    from falcon_es.cli import db
    return db


def _gcp() -> ModuleType:
    from falcon_es.cli import gcp
    return gcp


def _observe() -> ModuleType:
    from falcon_es.cli import observe
    return observe


def _queues() -> ModuleType:
    from falcon_es.cli import queues
    return queues


def _sim() -> ModuleType:
    from falcon_es.cli import sim
    return sim


def _smoke() -> ModuleType:
    from falcon_es.cli import smoke
    return smoke


def _tasks() -> ModuleType:
    from falcon_es.cli import tasks
    return tasks


#: Every command: the loader of its module, and its name there.
COMMANDS: Mapping[str, tuple[Callable[[], ModuleType], str]] = MappingProxyType({
    "db": (_db, "db_group"),
    "cluster": (_clusters, "cluster_group"),
    "clusters": (_clusters, "clusters_command"),
    "task": (_tasks, "task_group"),
    "history": (_audit, "history"),
    "explain": (_audit, "explain_command"),
    "events": (_audit, "events_command"),
    "replay": (_audit, "replay"),
    "chart": (_audit, "chart_command"),
    "queues": (_queues, "queues_command"),
    "logs": (_observe, "logs_command"),
    "timeline": (_observe, "timeline_command"),
    "run": (_controller, "run_command"),
    "informer": (_gcp, "informer_command"),
    "doctor": (_gcp, "doctor_command"),
    "smoke": (_smoke, "smoke_command"),
    "demo": (_sim, "demo_command"),
    "simulate": (_sim, "simulate_command"),
    "bench": (_bench, "bench_group"),
})


class LazyGroup(click.Group):
    """A group that imports a command's module when the command is invoked (``--help``
    lists every command, and so imports them all)."""

    def __init__(self, *args: Any,
                 lazy: Mapping[str, tuple[Callable[[], ModuleType], str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.lazy, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        load, attribute = self.lazy[cmd_name]
        command = getattr(load(), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"falcon-es {cmd_name}: {attribute} is not a click command")
        return command


@click.group(cls=LazyGroup, lazy=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", default=None,
              help="Database URL (default sqlite:///falcon.db; MySQL: mysql+pymysql://...).")
@click.option("--lang", type=click.Choice(["en", "zh"]), default=None,
              help="Language of rendered Messages (default FALCON_LANG or en).")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, lang: str | None) -> None:
    """Falcon-ES: event-sourced TPU resource manager for GKE."""
    from falcon_es.config.settings import Settings, SettingsError

    overrides: dict[str, dict[str, str]] = {}
    if db_url:
        overrides["database"] = {"db_url": db_url}
    if lang:
        overrides["job_table"] = {"language": lang}
    try:
        settings = Settings.from_env(overrides=overrides)
    except SettingsError as error:
        raise Failure(str(error)) from error
    ctx.obj = {"settings": settings}


def run() -> None:
    """Entry point of ``python -m falcon_es``: the program is named as the console
    script is, whatever ``sys.argv[0]`` says."""
    main(prog_name="falcon-es")
