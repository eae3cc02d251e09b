"""``falcon-es smoke``: one tiny task end to end on a registered cluster of the gcp
backend, each step timed, and every fidelity-ledger row the run could observe held
against what GCP did; a disagreement is printed as a finding ready to file."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from falcon_es.cli.common import EXIT_PROBLEM, Failure, app_of, friendly
from falcon_es.config.settings import Settings
from falcon_es.storage import registry

if TYPE_CHECKING:
    from falcon_es.app.smoke import SmokeReport, SmokeTools
    from falcon_es.domain.clusters import Cluster

SUPPLY_MODES = ("reservation", "on-demand", "flex-start")
#: Exit code of a run stopped by SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130


@click.command("smoke")
@click.option("--cluster", "name", required=True, metavar="NAME",
              help="The registered cluster to run on.")
@click.option("--supply-mode", type=click.Choice(SUPPLY_MODES), default=None,
              help="How the pool gets its VMs (default: reservation when the cluster has "
                   "a default reservation, else flex-start).")
@click.option("--topology", default=None,
              help="The slice (default: the smallest of the cluster's TPU type that its "
                   "reservation's machine type makes).")
@click.option("--keep", is_flag=True,
              help="Keep the node pool after a passing run; the next run reuses it.")
@click.option("--image", default=None, help="The container image that prints the line.")
@click.option("--poll-seconds", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True,
              help="Seconds between two looks (each an API call): the resolution of every "
                   "time measured, and the tolerance of every comparison.")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
@click.pass_context
@friendly
def smoke_command(ctx: click.Context, name: str, supply_mode: str | None,
                  topology: str | None, keep: bool, image: str | None,
                  poll_seconds: float, as_json: bool) -> None:
    """Run one tiny task on a real cluster through the gcp backend's own calls
    (doctor's checks, a smoke- node pool, a Job that prints a line, its log read back
    from GCS, then the Job and pool deleted) and check the model against what GCP did.
    Exit 1 when a step failed, the run was refused or a ledger row differs."""
    from falcon_es.app.smoke import (
        DEFAULT_IMAGE, SmokeOptions, SmokeRun, default_supply_mode, real_tools,
    )

    settings: Settings = ctx.obj["settings"]
    app = app_of(ctx)
    with app.engine.connect() as conn:
        cluster = registry.find_cluster(conn, name)
    if cluster is None:
        raise Failure(f"smoke: no registered cluster named {name} (see falcon-es cluster list)")
    tools, close = real_tools(settings, app)
    try:
        mode = supply_mode or default_supply_mode(cluster)
        topology = topology or _smallest_topology(cluster, mode, tools)
        options = SmokeOptions(supply_mode=mode, topology=topology, keep=keep,
                               image=image or DEFAULT_IMAGE, poll_seconds=poll_seconds)
        run = SmokeRun(cluster, tools, options,
                       on_step=None if as_json else lambda step: click.echo(f"... {step}",
                                                                            err=True))
        report = run.run()
    finally:
        close()
    command = (f"falcon-es smoke --cluster {name} --supply-mode {mode} --topology {topology}"
               f" (project {cluster.project}, {cluster.location})")
    if as_json:
        click.echo(json.dumps(report_data(report, command), indent=2, ensure_ascii=False))
    else:
        click.echo(report_text(report, command))
    if report.outcome == "interrupted":
        sys.exit(EXIT_INTERRUPTED)
    if report.outcome != "passed" or any(c.agrees is False for c in report.checks):
        sys.exit(EXIT_PROBLEM)


def _smallest_topology(cluster: Cluster, mode: str, tools: SmokeTools) -> str:
    """The smallest slice of the cluster's type that its reservation's VMs make."""
    from falcon_es.app.smoke import StepFailed, default_topology
    from falcon_es.domain.ports import PortError

    try:
        machine = None
        if mode == "reservation" and cluster.default_reservation:
            machine = tools.reservations.capacity(cluster,
                                                  cluster.default_reservation).machine_type
        return default_topology(cluster.tpu_type, machine)
    except PortError as error:
        raise Failure(f"smoke: reading reservation {cluster.default_reservation}: "
                      f"{error.message} (or name --topology)", EXIT_PROBLEM) from error
    except StepFailed as error:
        raise Failure(f"smoke: {error} (name --topology)", EXIT_PROBLEM) from error


def report_data(report: SmokeReport, command: str) -> dict[str, object]:
    from falcon_es.app.smoke_model import disagreements, finding

    data = report.as_dict()
    data["findings"] = [finding(c, f"cluster {report.cluster}", command)
                        for c in disagreements(report.checks)]
    return data


def report_text(report: SmokeReport, command: str) -> str:
    """The steps, the model's rows, what was left, then each finding in full."""
    from falcon_es.app.smoke_model import disagreements, finding

    lines = [f"smoke run {report.run_id} on {report.cluster}: {report.supply_mode} "
             f"{report.topology}: {report.outcome}", "", "steps:"]
    lines += [f"  {s.outcome:<11} {s.name:<18} {s.seconds:8.1f} s  {s.observed}"
              for s in report.steps]
    lines += ["", "the model, row by row:"]
    for check in report.checks:
        lines.append(f"  {check.verdict:<12} {check.row}")
        lines.append(f"      assumed:  {check.assumed}")
        lines.append(f"      observed: {check.observed}")
    if report.kept:
        lines += ["", "kept:"] + [f"  {item}" for item in report.kept]
    lines += ["", "left behind:" if report.left else "left behind: nothing"]
    lines += [f"  {item}" for item in report.left]
    for check in disagreements(report.checks):
        lines += ["", finding(check, f"cluster {report.cluster}", command)]
    return "\n".join(lines)
