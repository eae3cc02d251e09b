"""Pool hand-over rules: which ended task still owes its pool a decision, and which
waiting task may take a retained pool.

A pool outlives its task when a task of the same (cluster, topology) queue waits: it is
retained for that task instead of deleted, and its nodes are already up. Each pool is
decided alone: a multi-slice task's N pools may go to N different waiting tasks, and a
multi-slice task takes retained pools for as many of its slices as it can (once the
rest fits: waiting for room holding nothing, it is promised none; holding slices it
created or took, a partial create's, it is promised pools for the slices it lacks).
These rules
are read by the lifecycle index (who are the takers of each queue), by the
deprovisioning and abort handlers (what to decide) and by the node-pool view (what
became of each pool); they live in the core so all of them read the same rules.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from falcon_es.domain import chart
from falcon_es.domain.spec import FLEX_START, FLEX_START_MAX_RUN_SECONDS

if TYPE_CHECKING:
    from falcon_es.domain.task import TaskState

#: Pending reasons in which a task may still take a retained pool: waiting, or holding
#: the slot without a pool of its own yet.
TAKER_REASONS = frozenset({chart.PendingReason.WAITING, chart.PendingReason.PROVISIONING,
                           chart.PendingReason.CLUSTER_BUSY})
_PENDING_PREFIX = f"{chart.PENDING}."


#: Pool intents of a task whose create is asked for or running: it still takes pools
#: for the slices that create does not cover (a partial create's missing slices).
_CREATING = frozenset({"create-requested", "create-started"})


def pools_wanted(state: TaskState) -> int:
    """How many more retained pools the task could take: one per slice it has neither
    taken nor asked to create (a task creating all of its slices takes none; a partial
    create, ``multislice_partial_create``, takes pools for the slices it lacks)."""
    if state.pool.intent is None:
        return state.slices - state.pool.slices_requested
    if state.pool.intent not in _CREATING:
        return 0
    return state.slices - (state.pool.slices_requested or state.slices)


def can_take_pool(state: TaskState | None, cluster_id: str, topology: str) -> bool:
    """A task that could start (or, multi-slice, go on) on a retained pool of this
    (cluster, topology) queue. A multi-slice task waiting for reservation room
    (ClusterBusy) holding nothing is none: it could not use a pool before the rest fits,
    and a pool kept for it would hold a slice while it waits; it takes idle pools of its
    queue when it tries again. One holding slices (``multislice_partial_create``: slices
    it created or took) is one: it holds them anyway, and a pool for a slice it lacks
    lets it start sooner."""
    return (
        state is not None
        and pools_wanted(state) > 0
        and state.placement.cluster_id == cluster_id
        and state.submission.topology == topology
        and state.state.startswith(_PENDING_PREFIX)
        and state.state[len(_PENDING_PREFIX):] in TAKER_REASONS
        and not (state.slices > 1 and state.reason == chart.PendingReason.CLUSTER_BUSY
                 and not state.held_pools)
    )


def fits_pool_life(taker: TaskState, holder: TaskState, now: dt.datetime) -> bool:
    """A flex-start pool's nodes live at most 7 days: a task takes the retained pool only
    if its timeout ends before they do. Their birth is bounded by the holder's pool
    request (or, for a pool the holder itself took over, its submission): conservative
    for a pool created for the holder; a pool handed on several times may be older,
    and then its node's end under the taker is a disruption the Job survives."""
    if holder.pool.supply_mode != FLEX_START:
        return True
    born = holder.pool.requested_at or holder.submission.submitted_at
    if born is None:
        return False
    left = (born - now).total_seconds() + FLEX_START_MAX_RUN_SECONDS
    return taker.submission.spec.timeout_seconds <= left


def taker_rank(state: TaskState) -> tuple[bool, dt.datetime, str]:
    """Who gets a retained pool first: a slot holder still short of a pool (it is
    provisioning now, or holds some slices and waits for room for the rest), then
    waiting tasks, each in submit order."""
    return (state.reason == chart.PendingReason.WAITING,
            state.submission.submitted_at or dt.datetime.min, state.task_id)


def needs_disposal(state: TaskState) -> bool:
    """The task holds pools whose fate (hand over or delete) is not decided yet."""
    return state.pool.disposition is None and bool(state.held_pools)
