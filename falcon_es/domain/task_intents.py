"""The intents of a task that have no outcome yet: what the effect executor still has
to carry out for it (a pool to create or delete, a Job to submit or delete)."""

from __future__ import annotations

from falcon_es.domain.intents import Intent, IntentKind, JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.task import TaskState


_DELETING = frozenset({PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED})
#: The members compared, bound once: every commit asks this of each task it changed.
_CREATE_REQUESTED = PoolIntent.CREATE_REQUESTED
_SUBMIT_REQUESTED, _DELETE_REQUESTED = JobIntent.SUBMIT_REQUESTED, JobIntent.DELETE_REQUESTED


def task_intents(state: TaskState) -> tuple[Intent, ...]:
    """The intents of one task that have no outcome yet."""
    pool, job = state.pool, state.job
    cluster_id = state.placement.cluster_id or ""
    found: list[Intent] = []
    if pool.intent == _CREATE_REQUESTED and pool.name:
        # The first pool of the task's own group (not a pool it took, which comes first
        # in ``node_pools``).
        request = pool.request
        own = request.pool_name if request is not None else pool.name
        found.append(Intent(IntentKind.POOL_CREATE, state.task_id, own, cluster_id))
    if job.name and job.intent == _SUBMIT_REQUESTED:
        found.append(Intent(IntentKind.JOB_SUBMIT, state.task_id, job.name, cluster_id))
    if job.name and job.intent == _DELETE_REQUESTED:
        found.append(Intent(IntentKind.JOB_DELETE, state.task_id, job.name, cluster_id))
    # A failed delete stays open: the executor tries it again until the pool is gone.
    if pool.disposition in _DELETING:
        deleting = pool.deleting or state.node_pools[:1]
        if deleting:
            found.append(Intent(IntentKind.POOL_DELETE, state.task_id, deleting[0], cluster_id))
    return tuple(found)
