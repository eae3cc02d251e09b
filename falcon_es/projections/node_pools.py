"""The node-pool view (``falcon-es clusters``): every falcon-* pool the log knows of,
folded from the task states -- its cluster, topology, supply mode, state and the task
responsible for it.

A pool passes from task to task (``NodePoolReused.from_task``,
``NodePoolTaken.from_task``); the task holding it is the last one it was handed to
(``LifecycleIndex``), and that task's bookkeeping says what became of the pool (of a
multi-slice task, of each of its pools). Pools found by the orphan sweep belong to no
task and are not in this view (they are deleted as soon as they are found).
"""

from __future__ import annotations

from collections.abc import Mapping

from falcon_es.domain.intents import PoolDisposition, PoolIntent
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.observability.metrics import PoolSample
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates

CREATING, ACTIVE, IDLE_RETAINED, DELETING, DELETED = (
    "creating", "active", "idle-retained", "deleting", "deleted")


def pool_state(holder: TaskState, pool: str) -> str:
    """What became of the pool, as its holder's events tell."""
    if pool in holder.retained_idle:
        return IDLE_RETAINED
    disposition = holder.pool.disposition
    if disposition is not None and holder.pool.deleting and pool not in holder.pool.deleting:
        return DELETED  # deleted by an earlier request of the task
    if disposition == PoolDisposition.DELETED:
        return DELETED
    if (disposition in (PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED)
            or holder.pool.intent == PoolIntent.FAILED):
        return DELETING
    if disposition == PoolDisposition.RETAINED:
        return IDLE_RETAINED
    if holder.pool.intent in (PoolIntent.CREATE_REQUESTED, PoolIntent.CREATE_STARTED):
        return CREATING
    return ACTIVE


def pool_samples(tasks: TaskStates, clusters: Mapping[str, Cluster]) -> list[PoolSample]:
    """One sample per pool, deleted ones included; ``clusters`` maps cluster id -> row."""
    index = LifecycleIndex(tasks)
    index.rebuild()
    samples = []
    for (cluster_id, name), holder_id in sorted(index.pools().items()):
        holder = tasks.get(holder_id)
        if holder is None:
            continue
        cluster = clusters.get(cluster_id)
        samples.append(PoolSample(
            cluster=cluster.name if cluster is not None else cluster_id, name=name,
            topology=holder.submission.topology, supply_mode=holder.pool.supply_mode or "",
            state=pool_state(holder, name), owner_task=holder_id,
            created_at=index.created_at((cluster_id, name)),
        ))
    return samples
