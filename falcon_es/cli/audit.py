"""Reading the event log: ``history`` (one task's events), ``events`` (tail the log),
``replay`` (verify or rebuild the projections, or the state as of a moment),
``chart`` (the state chart every task's events follow) and ``explain`` (a task's causal
chain, root cause first)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from falcon_es.jobtable import job_rows
from falcon_es.storage import registry
from falcon_es.cli.common import (
    EXIT_PROBLEM, Failure, app_of, cell, emit, engine_of, friendly, gcp_ports, job_of, jsonable,
    settings_of, store_of)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from falcon_es.app.application import App
    from falcon_es.projections.explain import LiveLook
    from falcon_es.domain.clusters import Cluster
    from falcon_es.config.settings import Settings
    from falcon_es.storage.store import RecordedEvent
    from falcon_es.domain.task import TaskState


@click.command("chart")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid")
def chart_command(fmt: str) -> None:
    """Print the task state chart (Mermaid or DOT)."""
    from falcon_es.domain import chart

    click.echo(chart.to_mermaid() if fmt == "mermaid" else chart.to_dot())


def _event_row(record: RecordedEvent) -> dict[str, Any]:
    return {
        "seq": record.seq, "stream_id": record.stream_id, "version": record.version,
        "recorded_at": record.recorded_at, "type": record.type_name,
        "data": record.event.to_data(), "causation_id": record.meta.get("causation_id"),
        "correlation_id": record.meta.get("correlation_id"), "actor": record.meta.get("actor"),
    }


@click.command("history")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def history(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """A task's events in order: time, type, data, causation and actor."""
    records = store_of(ctx).read_stream(task_id)
    if not records:
        row = job_rows.get_row(engine_of(ctx), task_id, job=job_of(ctx))
        raise Failure(f"task {task_id} has no events in the log yet (status {row['status']}: "
                      "the controller has not taken it in)", EXIT_PROBLEM)
    rows = [_event_row(r) for r in records]
    emit(rows, as_json, None if as_json else
         ["version", "recorded_at", "type", "actor", "causation_id", "data"])


@click.command("events")
@click.option("--after", type=int, default=0, help="Start after this seq.")
@click.option("--follow", is_flag=True, help="Keep printing new events as they commit.")
@click.option("--poll", type=float, default=1.0, help="Seconds between polls with --follow.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@friendly
def events_command(ctx: click.Context, after: int, follow: bool, poll: float, as_json: bool) -> None:
    """Tail the log."""
    store = store_of(ctx)
    position = after
    while True:
        for record in store.read_after(position):
            row = _event_row(record)
            if as_json:
                click.echo(json.dumps(jsonable(row), ensure_ascii=False))
            else:
                click.echo(f"{row['seq']:>8}  {cell(row['recorded_at'])}  {row['stream_id']}"
                           f"  v{row['version']}  {row['type']}  {json.dumps(row['data'], ensure_ascii=False)}")
            position = record.seq
        if not follow:
            return
        try:
            time.sleep(poll)
        except KeyboardInterrupt:
            return


@click.command("replay")
@click.option("--verify", "mode", flag_value="verify", help="Rebuild into scratch and diff with live.")
@click.option("--rebuild", "mode", flag_value="rebuild", help="Rebuild the live projections in place.")
@click.option("--until", "until", default=None, help="A seq or an ISO time: the state as of then.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def replay(ctx: click.Context, mode: str | None, until: str | None, as_json: bool) -> None:
    """Replay the log: verify, rebuild, or time-travel (--until)."""
    from falcon_es.projections import replay as rp

    app = app_of(ctx)
    lang = app.settings.job_table.language
    if until is not None:
        seq = _position(app, until)
        states, queues = rp.fold_views(app.store, lang, until=seq,
                                       policy=app.settings.scheduling.priorities)
        rows = rp.state_rows(states, lang, queues)
        if as_json:
            emit(rows, True)
        else:
            click.echo(f"state as of seq {seq}")
            emit(rows, False, ["id", "name", "actor", "status", "reason", "message", "updated_at"])
        return
    if mode == "rebuild":
        head = app.store.head()
        with app.engine.begin() as conn:
            count = rp.rebuild_streamed(conn, app.store, lang, until=head, job=app.job,
                                        refused=rp.refused_rows(app.store),
                                        policy=app.settings.scheduling.priorities)
        click.echo(f"rebuilt {count} job rows from {head} events")
        return
    if mode == "verify":
        differences = rp.verify(app.engine, app.store, lang, job=app.job,
                                refresh_seconds=app.settings.scheduling.position_refresh_seconds,
                                policy=app.settings.scheduling.priorities)
        if as_json:
            click.echo(json.dumps([jsonable(d.__dict__) for d in differences], indent=2))
        elif differences:
            for difference in differences:
                click.echo(str(difference))
        if differences:
            click.echo(f"replay differs from the live projections in {len(differences)} value(s)", err=True)
            sys.exit(EXIT_PROBLEM)
        if not as_json:
            click.echo(f"replay of {app.store.head()} events matches the live projections")
        return
    raise Failure("replay: choose --verify, --rebuild or --until SEQ|ISO-TIME")


def _position(app: App, until: str) -> int:
    """The seq ``--until`` names: a number as it is; an ISO time (naive is taken as UTC,
    as the log records) as the last event recorded at or before it."""
    if until.isdigit():
        return int(until)
    try:
        moment = dt.datetime.fromisoformat(until)
    except ValueError:
        raise Failure(f"--until {until!r}: expected a seq number or an ISO time "
                      "such as 2026-11-29T12:00:00") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return app.store.seq_at(moment)


@click.command("explain")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="The tree as JSON.")
@click.option("--live", is_flag=True,
              help="Also look at the edge cluster, its node pools and the reservation now "
                   "(the gcp backend's clients).")
@click.pass_context
@friendly
def explain_command(ctx: click.Context, task_id: str, as_json: bool, live: bool) -> None:
    """A task's causal chain, upstream root cause first, each link with its source and
    time: from the log, the queue view and, with --live, the clusters themselves."""
    from falcon_es.app.application import load_task_states
    from falcon_es.projections.explain import explain, render
    from falcon_es.projections.queue_listing import queue_rows
    from falcon_es.domain.task import fold

    app = app_of(ctx)
    records = app.store.read_stream(task_id)
    if not records:
        job_rows.get_row(engine_of(ctx), task_id, job=job_of(ctx))  # unknown id: says so
    state = fold(task_id, [(r.event, r.recorded_at) for r in records])
    with app.engine.connect() as conn:
        clusters = {c.id: c for c in registry.list_clusters(conn)}
    queue = None
    if state.reason == "Waiting":
        load_task_states(app)
        queue = next((row for row in queue_rows(app.queue_view, clusters)
                      if any(w["task_id"] == task_id for w in row["waiting"])), None)
    lang = app.settings.job_table.language
    look = _live_look(settings_of(ctx), state, clusters, lang) if live else None
    from falcon_es.domain.events import ROW_CHECKS_STREAM

    tree = explain(task_id, records, queue, look, app.store.read_stream(ROW_CHECKS_STREAM),
                   lang=lang)
    if as_json:
        click.echo(json.dumps(tree.to_data(), indent=2, ensure_ascii=False))
    else:
        click.echo("\n".join(render(tree)))


def _live_look(settings: Settings, state: TaskState, clusters: Mapping[str, Cluster],
               lang: str = "en") -> LiveLook:
    """What the task's cluster, pools and reservation say now (gcp backend), in the
    job table's language (the APIs' words as they come)."""
    from falcon_es.domain.clock import WallClock
    from falcon_es.domain.ports import PortError
    from falcon_es.projections.explain import LiveLook
    from falcon_es.projections.explain_words import say
    from falcon_es.projections.recorded_phrases import in_language
    from falcon_es.engine.task_manifests import workload_kind

    cluster = clusters.get(state.placement.cluster_id or "")
    now = WallClock().now()
    if cluster is None:
        return LiveLook(at=now)
    ports = gcp_ports(settings)
    edge = ports.edges.for_cluster(cluster)
    shape = state.shape
    workload = None
    if state.job.name:
        try:
            found = edge.diagnose_pending(state.job.name)
            workload = in_language(found, lang) if found else say(
                "live-no-pod", lang, kind=workload_kind(state), name=state.job.name)
        except PortError as error:
            workload = say("live-unseen", lang, what=state.job.name, error=error.message)
    pools = []
    for name in state.node_pools:
        try:
            info = ports.node_pools.get(cluster, name)
            ready = edge.node_counts(name).ready
            pools.append(say("live-pool-state", lang, name=name, status=info.status,
                             ready=ready, hosts=shape.hosts))
        except PortError as error:
            pools.append(say("live-unseen", lang, what=name, error=error.message))
    asked = state.pool.request.reservation if state.pool.request is not None else None
    reservation = asked or cluster.default_reservation
    seen = None
    if reservation:
        try:
            free = ports.reservations.remaining_slices(cluster, str(reservation), shape)
            seen = say("live-free", lang, reservation=reservation, free=free,
                       topology=state.submission.topology)
        except PortError as error:
            seen = say("live-unseen", lang, what=reservation, error=error.message)
    return LiveLook(workload=workload, pools=tuple(pools), reservation=seen, at=now)
