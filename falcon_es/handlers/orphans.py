"""Orphan sweep: Falcon pools that no task is responsible for any more get deleted.

Every ``orphan_sweep_seconds`` the handler lists the pools of each registered
cluster. A pool named ``falcon-*`` and labelled ``managed-by=falcon`` is an orphan
when the log knows no task holding it, or its last holder's delete already "succeeded"
(a pool that became visible after a 404 on delete), unless:

- a non-terminal task holds it (creating, running, being aborted);
- it is retained for a waiting task, or its ended holder's deprovisioning is still
  deciding or deleting it (the deprovision handler owns those);
- GKE is already deleting it (STOPPING);
- its creator asked for it less than the create-visibility grace ago.

Each pool of a multi-slice task is held on its own: one of them retained for a waiting
task is spared while the others are deleted, and a pool another task took over is
that task's.

An orphan is recorded as ``OrphanPoolFound`` (an intent) in the stream
``orphans:<cluster id>``; the effect executor deletes the pool and the outcome is
``OrphanPoolDeleted`` in the same stream.
"""

from __future__ import annotations

import datetime as dt
import logging

from falcon_es.domain import events as ev
from falcon_es.domain import naming
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.intents import PoolDisposition, orphan_stream
from falcon_es.domain.manifests import MANAGED_BY_VALUE
from falcon_es.domain.ports import AWAITING, NodePoolInfo, PortError
from falcon_es.engine.runtime import Tick
from falcon_es.engine.task_manifests import POOL_MANAGED_BY, POOL_TASK_LABEL

log = logging.getLogger("falcon_es.handlers.orphans")

#: Dispositions under which the deprovision handler still owns an ended task's pool.
OWNED_BY_DEPROVISION = frozenset({None, PoolDisposition.RETAINED,
                                  PoolDisposition.DELETE_REQUESTED,
                                  PoolDisposition.DELETE_FAILED})


def sweep_orphans(tick: Tick, ctx: HandlerContext) -> None:
    executor = ctx.executor
    if not executor.sweep_due(ctx.now):
        return
    index = ctx.index
    already = executor.open_orphans()
    awaiting = False  # a list is being fetched: the sweep goes on next tick
    for cluster in ctx.clusters:
        try:
            pools = ctx.ports.node_pools.list(cluster)
        except PortError as error:
            awaiting = awaiting or error.code == AWAITING
            if error.code != AWAITING:
                log.warning("listing node pools of %s: %s", cluster.name, error)
            continue
        for pool in sorted(pools, key=lambda p: p.name):
            if (cluster.id, pool.name) in already or not _is_ours(pool):
                continue
            holder_id = _holder(tick, ctx, cluster.id, pool.name)
            if holder_id is not None and not _orphaned(tick, ctx, holder_id, pool.name,
                                                       index.created_at((cluster.id, pool.name))):
                continue
            if pool.status == "STOPPING":
                continue
            owner = holder_id or pool.labels.get(POOL_TASK_LABEL)
            tick.emit(orphan_stream(cluster.id), ev.OrphanPoolFound(cluster.id, pool.name, owner))
    if not awaiting:
        executor.swept(ctx.now)


def _holder(tick: Tick, ctx: HandlerContext, cluster_id: str, name: str) -> str | None:
    """The task holding a pool: the index's (as of the last commit), or the task it
    was handed over to in this tick, as its holder's own stream already says."""
    holder_id = ctx.index.holder((cluster_id, name))
    holder = tick.state(holder_id) if holder_id is not None else None
    if holder is not None and name in holder.pool.handed_over:
        return holder.pool.retained.get(name, holder_id)
    return holder_id


def _is_ours(pool: NodePoolInfo) -> bool:
    return (naming.is_falcon_pool(pool.name)
            and pool.labels.get(POOL_MANAGED_BY) == MANAGED_BY_VALUE)


def _orphaned(tick: Tick, ctx: HandlerContext, holder_id: str, pool: str,
              created_at: dt.datetime | None) -> bool:
    holder = tick.state(holder_id)
    if holder is None:
        return True
    if not holder.is_terminal or pool in holder.retained_idle:
        return False
    if pool in holder.pool.deleting or holder.pool.disposition is None:
        owned = holder.pool.disposition in OWNED_BY_DEPROVISION
    else:
        owned = False  # retained once, then deleted with other pools: not this one
    if owned:
        return False
    if created_at is not None:
        age = (ctx.now - created_at).total_seconds()
        if age < ctx.settings.lifecycle.create_visibility_grace_seconds:
            return False
    return True
