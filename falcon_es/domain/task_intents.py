"""The intents of a task that have no outcome yet: what the effect executor still has
to carry out for it (a pool to create or delete, a Job to submit or delete)."""

from __future__ import annotations

from falcon_es.domain.intents import Intent, IntentKind, JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.task import TaskState


_DELETING = frozenset({PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED})


def task_intents(state: TaskState) -> tuple[Intent, ...]:
    """The intents of one task that have no outcome yet."""
    cluster_id = state.placement.cluster_id or ""
    found: list[Intent] = []
    if state.pool.intent == PoolIntent.CREATE_REQUESTED and state.pool.name:
        # The first pool of the task's own group (not a pool it took, which comes first
        # in ``node_pools``).
        request = state.pool.request
        own = request.pool_name if request is not None else state.pool.name
        found.append(Intent(IntentKind.POOL_CREATE, state.task_id, own, cluster_id))
    if state.job.name and state.job.intent == JobIntent.SUBMIT_REQUESTED:
        found.append(Intent(IntentKind.JOB_SUBMIT, state.task_id, state.job.name, cluster_id))
    if state.job.name and state.job.intent == JobIntent.DELETE_REQUESTED:
        found.append(Intent(IntentKind.JOB_DELETE, state.task_id, state.job.name, cluster_id))
    deleting = state.pool.deleting or state.node_pools[:1]
    # A failed delete stays open: the executor tries it again until the pool is gone.
    if deleting and state.pool.disposition in _DELETING:
        found.append(Intent(IntentKind.POOL_DELETE, state.task_id, deleting[0], cluster_id))
    return tuple(found)
