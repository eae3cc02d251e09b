"""What users look at: ``logs`` (a task's log files, from the bucket its pods wrote to)
and ``timeline`` (the clusters' node pools and tasks on one self-contained HTML page)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from falcon_es.cli.common import (
    EXIT_PROBLEM, Failure, engine_of, friendly, job_of, settings_of, store_of)
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.jobtable import job_rows
from falcon_es.storage import registry

if TYPE_CHECKING:
    from falcon_es.storage.store import RecordedEvent


@click.command("logs")
@click.argument("task_id")
@click.option("--pod", default=None, help="Only this pod's file (a name as the headers show).")
@click.option("--index", type=int, default=None,
              help="Only the pods of this completion index (the host of a multi-host slice).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep reading the files as they grow until the task has ended.")
@click.option("--since", default=None,
              help="Only files written since: a duration (30s, 10m, 2h, 1d) or an ISO time.")
@click.option("--poll", type=float, default=2.0, show_default=True,
              help="Seconds between reads with --follow.")
@click.pass_context
@friendly
def logs_command(ctx: click.Context, task_id: str, pod: str | None, index: int | None,
                 follow: bool, since: str | None, poll: float) -> None:
    """A task's log files (gs://<bucket>/logs/<job_id>/<pod>.log), the failed pod's
    first, a header per pod; on the sim backend, what the simulated pods wrote."""
    from falcon_es.app import task_logs
    from falcon_es.domain.clock import WallClock
    from falcon_es.domain.ports import PortError
    from falcon_es.domain.task import fold

    if pod is not None and index is not None:
        raise Failure("--pod and --index: choose one")
    store = store_of(ctx)
    clock = WallClock()
    try:
        records = _records(ctx, task_id)
        with engine_of(ctx).connect() as conn:
            clusters = {c.id: c for c in registry.list_clusters(conn)}
        target = task_logs.target_of(task_id, records, clusters)
        choice = task_logs.Choice(pod, index, task_logs.parse_since(since, clock.now())
                                  if since else None)
        files = task_logs.log_files_for(settings_of(ctx), engine_of(ctx),
                                        list(clusters.values()), clock)

        def ended() -> bool:
            events = [(r.event, r.recorded_at) for r in store.read_stream(task_id)]
            return fold(task_id, events).is_terminal

        follower = task_logs.Follower(files, target, choice, click.echo, ended, time.sleep,
                                      poll_seconds=poll)
        follower.run(follow)
    except task_logs.LogsError as error:
        raise Failure(str(error), EXIT_PROBLEM) from error
    except PortError as error:
        raise Failure(error.message, EXIT_PROBLEM) from error
    except KeyboardInterrupt:
        return


def _records(ctx: click.Context, task_id: str) -> Sequence[RecordedEvent]:
    """The task's events; a clear line when it has none (an unknown id says so)."""
    records = store_of(ctx).read_stream(task_id)
    if not records:
        row = job_rows.get_row(engine_of(ctx), task_id, job=job_of(ctx))
        raise Failure(f"task {task_id} has no events in the log yet (status {row['status']}: "
                      "the controller has not taken it in), so no pod of it ran", EXIT_PROBLEM)
    return records


@click.command("timeline")
@click.option("--since", default=None, help="From this ISO time (default: the log's first pool "
                                            "or task).")
@click.option("--until", default=None, help="Up to this ISO time (default: the last event).")
@click.option("--cluster", default=None, help="Only this cluster's pools and tasks.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The HTML file to write (self-contained: opens with no network).")
@click.pass_context
@friendly
def timeline_command(ctx: click.Context, since: str | None, until: str | None,
                     cluster: str | None, output: str) -> None:
    """One HTML page of what the clusters did: each node pool as a bar from create to
    delete, coloured by supply mode, with the tasks that held it in turn, idle stretches
    and hand-overs; below, each task's wait and run."""
    from falcon_es.projections.timeline import Window, build
    from falcon_es.projections.timeline_page import render

    window = Window(_moment("--since", since), _moment("--until", until), cluster)
    if window.since and window.until and window.since >= window.until:
        raise Failure(f"--since {since} is not before --until {until}")
    page = build(store_of(ctx).read_after(0), window)
    if cluster is not None and not page.pools and not page.tasks:
        raise Failure(f"--cluster {cluster}: no node pool or task of that cluster in the log"
                      + (" in that window" if since or until else ""), EXIT_PROBLEM)
    try:
        Path(output).write_text(render(page), encoding="utf-8")
    except OSError as error:
        raise Failure(f"{output}: {error.strerror}") from error
    click.echo(f"{output}: {len(page.pools)} node pool(s) on {len(page.clusters)} "
               f"cluster(s), {len(page.tasks)} task(s)")


def _moment(option: str, text: str | None) -> dt.datetime | None:
    """An ISO time option as the log records times (naive UTC)."""
    if text is None:
        return None
    moment = as_timestamp(text)
    if moment is None:
        raise Failure(f"{option} {text!r}: expected an ISO time such as 2026-11-29T12:00:00")
    return moment
