"""Deprovisioning: what becomes of a task's node pool once the task has ended.

After every terminal outcome, abort included: when a task of the same
topology waits on that cluster, the pool is retained and handed over
(``NodePoolRetained(for_task)``); otherwise it is deleted (``NodePoolDeleteRequested``,
carried out by the effect executor). A failed delete (``NodePoolDeleteFailed``) stays
open: the executor tries it again after a backoff until the pool is gone, and records a
try only when its error changed or at a checkpoint of the count, so a pool GKE refuses
to delete for a week costs the log a few dozen events; the note says since when and how
often it failed, and the task's Status keeps following its Job's result.

A pool is handed over only when it reached readiness (or was taken ready from an
earlier task) and no Job of the ending task still occupies it. Each of a multi-slice
task's pools is decided alone: each may go to a different waiting task (a multi-slice
one takes up to one per slice it still needs), and those nobody takes are deleted
together (one ``NodePoolDeleteRequested`` naming them all). A retained pool whose
intended taker went away (aborted, re-queued, given a pool of its own) is handed to
another waiting task of its queue or deleted.

Every pool is traced, through ``NodePoolReused.from_task``, to the one task currently
responsible for it (its holder); the effect executor's ``LifecycleIndex`` keeps that
and the candidate lists current, so a tick looks only at tasks that can need work.
"""

from __future__ import annotations

import logging

from falcon_es.engine.context import HandlerContext
from falcon_es.engine.create_operations import pool_settled
from falcon_es.domain.handover import needs_disposal
from falcon_es.engine.pool_handover import PoolDecider
from falcon_es.engine.runtime import Tick

log = logging.getLogger("falcon_es.handlers.deprovision")


def deprovision(tick: Tick, ctx: HandlerContext) -> None:
    """Decide every ended task's pool; re-home retained pools whose taker went away."""
    index = ctx.index
    clusters = {c.id: c for c in ctx.clusters}
    decider = PoolDecider(tick, index)
    handed_over = tick.handed_over_now()
    # A retained pool whose taker can still take it needs no look (``pool_watch``):
    # ``check_retained`` would find nothing to do for it.
    watch = index.pool_watch(s.task_id for s in tick.touched())
    for holder in tick.candidates(watch):
        if not holder.is_terminal:
            continue
        if needs_disposal(holder):
            if pool_settled(holder, clusters.get(holder.placement.cluster_id or ""), ctx):
                decider.dispose(holder)
            continue
        for pool in sorted(holder.retained_idle):
            if index.is_holder(holder, pool, handed_over):
                decider.check_retained(holder, pool)
                holder = tick.state(holder.task_id) or holder
