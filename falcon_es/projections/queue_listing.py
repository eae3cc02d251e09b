"""The queues as people and scripts read them (``falcon-es queues``, the audit): one
dict per queue, with the slot holder and the waiting tasks in pick order, and the
tasks still waiting for a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from falcon_es.domain.clusters import Cluster
from falcon_es.domain.task_states import TaskStates
from falcon_es.projections.position_messages import positions
from falcon_es.projections.queues import QueueView


def queue_rows(
    view: QueueView, clusters: Mapping[str, Cluster], tasks: TaskStates | None = None,
) -> list[dict[str, Any]]:
    """The queue view for people and scripts: one dict per queue."""
    book = view.book
    tasks = tasks if tasks is not None else view.tasks
    rows = []
    for key in book.queue_keys():
        cluster_id, topology = key
        cluster = clusters.get(cluster_id)
        holders = []
        for task_id in book.holders(key):
            state = tasks.get(task_id)
            holders.append({
                "task_id": task_id,
                "actor": state.submission.actor if state else None,
                "name": state.submission.name if state else None,
                "status": state.status if state else None,
                "reason": state.reason if state else None,
            })
        now = view.now()
        order = book.pick_order(key, now)
        wait = view.wait(key, now)
        estimate = wait.estimate
        policy = book.policy
        waiting = [
            {"position": index + 1, "task_id": e.task_id, "actor": e.actor, "name": e.name,
             "submitted_at": e.submitted_at.isoformat(), "priority": e.priority,
             "effective_priority": policy.effective(e.priority, e.submitted_at, now),
             "reason": wait.reason if wait.reason else ("next in line" if index == 0
                                                        else "tasks ahead"),
             "expected_start": estimate.start(index).isoformat() if estimate else None,
             "message": message}
            for index, (e, (_, message)) in enumerate(zip(order, positions(order, view.lang,
                                                                           wait)))
        ]
        rows.append({
            "cluster_id": cluster_id,
            "cluster": cluster.name if cluster else None,
            "cluster_status": cluster.status if cluster else None,
            "tpu_type": cluster.tpu_type if cluster else None,
            "topology": topology,
            "slot_holder": holders[0] if holders else None,
            "waiting_count": len(waiting),
            "waiting": waiting,
            "running": book.running(key),
            "last_actor": book.last_actor(key),
        })
    return rows


def unplaced_rows(view: QueueView) -> list[dict[str, Any]]:
    """Tasks still waiting for a cluster (none active for their TPU type)."""
    return [
        {"tpu_type": tpu_type, "task_id": e.task_id, "actor": e.actor, "name": e.name,
         "submitted_at": e.submitted_at.isoformat()}
        for tpu_type, entries in view.book.unplaced().items() for e in entries
    ]
