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
``cli/controller.py``     ``run``
``cli/gcp.py``            ``informer``, ``doctor``
``cli/sim.py``            ``demo``, ``simulate``
``cli/bench.py``          ``bench store|scheduler|e2e``
========================  ===========================================================

``cli/common.py`` holds what they share (errors and exit codes, output, opening the
app and the gcp backend); ``cli/process.py`` the set-up of the long-running
processes (``run`` and ``informer``): logging, signals, health server, leader election.
"""

from __future__ import annotations

import click

from falcon_es.cli import audit, bench, clusters, controller, db, gcp, queues, sim, tasks
from falcon_es.cli.common import EXIT_BAD_INPUT, EXIT_DATABASE, EXIT_PROBLEM, Failure
from falcon_es.settings import Settings, SettingsError

__all__ = ["EXIT_BAD_INPUT", "EXIT_DATABASE", "EXIT_PROBLEM", "main", "run"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", envvar="FALCON_DB_URL", default=None,
              help="Database URL (default sqlite:///falcon.db; MySQL: mysql+pymysql://...).")
@click.option("--lang", type=click.Choice(["en", "zh"]), default=None,
              help="Language of rendered Messages (default FALCON_LANG or en).")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, lang: str | None) -> None:
    """Falcon-ES: event-sourced TPU resource manager for GKE."""
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        raise Failure(str(error)) from error
    overrides: dict[str, str] = {}
    if db_url:
        overrides["db_url"] = db_url
    if lang:
        overrides["language"] = lang
    ctx.obj = {"settings": Settings(**{**settings.__dict__, **overrides})}


main.add_command(db.db_group)
main.add_command(clusters.cluster_group)
main.add_command(clusters.clusters_command)
main.add_command(tasks.task_group)
main.add_command(audit.history)
main.add_command(audit.events_command)
main.add_command(audit.replay)
main.add_command(audit.chart_command)
main.add_command(queues.queues_command)
main.add_command(controller.run_command)
main.add_command(gcp.informer_command)
main.add_command(gcp.doctor_command)
main.add_command(sim.demo_command)
main.add_command(sim.simulate_command)
main.add_command(bench.bench_group)


def run() -> None:
    """Entry point of ``python -m falcon_es``: the program is named as the console
    script is, whatever ``sys.argv[0]`` says."""
    main(prog_name="falcon-es")
