"""The simulated world without a cluster or credentials: ``falcon-es demo`` (a dozen
tasks on three clusters, every kind of outcome, in seconds) and ``falcon-es simulate``
(a what-if at scale in virtual time)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from falcon_es.cli.common import Failure, friendly


@click.command("demo")
@click.option("--db-file", type=click.Path(dir_okay=False), default="falcon-demo.db",
              show_default=True, help="SQLite file to (re)create for the demo.")
@click.option("--seed", type=int, default=None, help="Seed of the simulated world.")
@click.option("--live/--no-live", default=None,
              help="Redraw the table in place (default: when stdout is a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print only the summary, as JSON.")
@click.pass_context
@friendly
def demo_command(ctx: click.Context, db_file: str, seed: int | None, live: bool | None,
                 as_json: bool) -> None:
    """Three simulated clusters, a dozen tasks, every kind of outcome, in seconds."""
    from falcon_es.app import demo

    live = sys.stdout.isatty() if live is None else live
    echo = (lambda _line: None) if as_json else click.echo
    summary = demo.run_demo(Path(db_file).resolve(), seed=seed,
                            lang=ctx.obj["settings"].job_table.language, echo=echo, live=live and not as_json)
    if as_json:
        click.echo(demo.summary_json(summary))


@click.command("simulate")
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="The simulated world, whose clusters the run registers (default: the "
                   "packaged simulate_world.json).")
@click.option("--tasks", type=int, default=200, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--html", "html", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the run's timeline page (pools, tasks, waits per actor and "
                   "queue) to this HTML file.")
@friendly
def simulate_command(config: str | None, tasks: int, seed: int, as_json: bool,
                     html: str | None) -> None:
    """What-if at scale in virtual time: throughput, waits, pool reuse, pool hours."""
    from falcon_es.app import simulate

    if tasks <= 0:
        raise Failure(f"--tasks {tasks}: expected a positive number of tasks")
    report = simulate.run_simulation(config=config, tasks=tasks, seed=seed,
                                     html=Path(html) if html else None)
    click.echo(json.dumps(report, indent=2) if as_json else simulate.format_report(report))
