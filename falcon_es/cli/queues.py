"""``falcon-es queues``: who holds each (cluster, topology) slot and who waits next,
folded from the log, for answering "why is my task not running yet"."""

from __future__ import annotations

import json

import click

from falcon_es.storage import registry
from falcon_es.cli.common import app_of, emit, friendly


@click.command("queues")
@click.option("--json", "as_json", is_flag=True)
@click.option("--show", type=int, default=3, show_default=True,
              help="Waiting tasks listed per queue in the table.")
@click.pass_context
@friendly
def queues_command(ctx: click.Context, as_json: bool, show: int) -> None:
    """The (cluster, topology) queues, folded from the log: slot holder, waiting tasks
    in pick order, running count, actor served last."""
    from falcon_es.app.application import load_task_states
    from falcon_es.projections.queue_listing import queue_rows, unplaced_rows

    app = app_of(ctx)
    load_task_states(app)  # the live streams, as a starting controller folds them
    view = app.queue_view
    with app.engine.connect() as conn:
        clusters = {c.id: c for c in registry.list_clusters(conn)}
    rows = queue_rows(view, clusters)
    unplaced = unplaced_rows(view)
    if as_json:
        click.echo(json.dumps({"queues": rows, "unplaced": unplaced}, indent=2, ensure_ascii=False))
        return
    table = []
    for row in rows:
        holder = row["slot_holder"]
        waiting = [f"#{w['position']} {w['actor']}: {w['name']}" for w in row["waiting"][:show]]
        if row["waiting_count"] > show:
            waiting.append(f"... {row['waiting_count'] - show} more")
        table.append({
            "cluster": row["cluster"] or row["cluster_id"],
            "status": row["cluster_status"] or "",
            "topology": row["topology"],
            "slot": f"{holder['actor']}: {holder['name']} ({holder['reason'] or holder['status']})"
            if holder else "free",
            "waiting": row["waiting_count"],
            "running": row["running"],
            "last served": row["last_actor"] or "",
            "next": "\n".join(waiting),
        })
    emit(table, False)
    if unplaced:
        click.echo(f"\n{len(unplaced)} task(s) waiting for an active cluster: " + ", ".join(
            f"{u['actor']}: {u['name']} ({u['tpu_type']})" for u in unplaced[:show])
            + (" ..." if len(unplaced) > show else ""))
