"""Deprovisioning: what becomes of a task's node pool once the task has ended.

After every terminal outcome, abort included (DESIGN §9): when a task of the same
topology waits on that cluster, the pool is retained and handed over
(``NodePoolRetained(for_task)``); otherwise it is deleted (``NodePoolDeleteRequested``,
carried out by the effect executor). A failed delete (``NodePoolDeleteFailed``) is
requested again after a backoff; each attempt lands in the Message as a note, and the
task's Status keeps following its Job's result.

A pool is handed over only when it reached readiness and no Job of the ending task
still occupies it. A retained pool whose intended taker went away (aborted, re-queued,
given a pool of its own) is handed to another waiting task of its queue or deleted.

The module also holds the pool inventory the provisioning and orphan handlers share:
every pool is traced, through ``NodePoolReused.from_task``, to the one task currently
responsible for it (its holder).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.context import HandlerContext
from falcon_es.effects import retry_due_at
from falcon_es.ports import PortError
from falcon_es.registry import Cluster
from falcon_es.runtime import Tick
from falcon_es.task import TaskState

log = logging.getLogger("falcon_es.handlers.deprovision")

QueueKey = tuple[str, str]  # (cluster id, topology)
PoolKey = tuple[str, str]  # (cluster id, pool name)

#: Pending reasons in which a task may still take a retained pool.
TAKER_REASONS = frozenset({"Waiting", "Provisioning", "ClusterBusy"})
#: Job intents after which no pod of the task occupies the pool's nodes.
JOB_GONE = frozenset({None, "finished", "deleted", "cancelled", "submit-failed"})
_EARLIEST = dt.datetime.min


@dataclasses.dataclass(frozen=True)
class PoolRecord:
    """One node pool as the log knows it."""

    cluster_id: str
    pool_name: str
    topology: str
    holder: TaskState  # the task currently responsible for the pool
    created_at: dt.datetime | None  # when its creator asked for it


def current_states(tick: Tick, ctx: HandlerContext) -> list[TaskState]:
    """Every task as this tick sees it (earlier handlers' events included)."""
    seen = {s.task_id for s in ctx.tasks.all()} | {s.task_id for s in tick.touched()}
    return [s for task_id in seen if (s := tick.state(task_id)) is not None]


def live_states(tick: Tick, ctx: HandlerContext) -> list[TaskState]:
    """Non-terminal tasks as this tick sees them, earliest submitted first (so when
    they compete for reservation capacity in one tick, the older one wins)."""
    ids = {s.task_id for s in ctx.tasks.live()} | {s.task_id for s in tick.touched()}
    states = [s for task_id in ids if (s := tick.state(task_id)) is not None]
    states.sort(key=lambda s: (s.submitted_at or _EARLIEST, s.task_id))
    return [s for s in states if not s.is_terminal]


def pool_records(states: Iterable[TaskState]) -> dict[PoolKey, PoolRecord]:
    """Each pool's current holder: the task holding it that handed it to no one."""
    by_pool: dict[PoolKey, list[TaskState]] = {}
    for state in states:
        if state.node_pool_name and state.cluster_id and state.pool_intent not in (
                None, "not-created"):
            by_pool.setdefault((state.cluster_id, state.node_pool_name), []).append(state)
    records = {}
    for key, holders in by_pool.items():
        superseded = {h.pool_from_task for h in holders if h.pool_from_task}
        current = [h for h in holders if h.task_id not in superseded] or holders
        holder = max(current, key=lambda h: (not h.is_terminal, h.updated_at or _EARLIEST,
                                             h.task_id))
        created = [h.pool_requested_at for h in holders if h.pool_requested_at is not None]
        records[key] = PoolRecord(key[0], key[1], holder.topology, holder,
                                  min(created) if created else None)
    return records


def can_take_pool(state: TaskState | None, cluster_id: str, topology: str) -> bool:
    """A task that could start on a retained pool of this queue."""
    return (
        state is not None
        and state.status == chart.PENDING
        and state.reason in TAKER_REASONS
        and state.cluster_id == cluster_id
        and state.topology == topology
        and state.pool_intent is None
    )


def takers_by_queue(states: Iterable[TaskState]) -> dict[QueueKey, list[TaskState]]:
    """Per queue, the tasks that could take a pool: the slot holder first (it is the
    one provisioning now), then the waiting tasks in submit order."""
    queues: dict[QueueKey, list[TaskState]] = {}
    for state in states:
        if state.cluster_id and can_take_pool(state, state.cluster_id, state.topology):
            queues.setdefault((state.cluster_id, state.topology), []).append(state)
    for takers in queues.values():
        takers.sort(key=lambda s: (s.reason == "Waiting", s.submitted_at or _EARLIEST,
                                   s.task_id))
    return queues


class PoolDecider:
    """Decides the fate of ended tasks' pools within one tick, remembering which
    waiting tasks were already promised a pool so two pools never go to one task."""

    def __init__(self, tick: Tick, states: list[TaskState]) -> None:
        self.tick = tick
        self.takers = takers_by_queue(states)
        self.promised = {
            s.retained_for for s in states
            if s.pool_disposition == "retained" and s.retained_for and s.is_terminal
        }

    def taker_for(self, cluster_id: str, topology: str) -> TaskState | None:
        for candidate in self.takers.get((cluster_id, topology), ()):
            fresh = self.tick.state(candidate.task_id)
            if fresh is not None and fresh.task_id not in self.promised and can_take_pool(
                    fresh, cluster_id, topology):
                return fresh
        return None

    def dispose(self, state: TaskState) -> None:
        """Hand the ended task's pool over, or delete it."""
        pool = state.node_pool_name
        if pool is None or state.cluster_id is None:
            return
        taker = None
        if state.pool_intent == "ready":
            taker = self.taker_for(state.cluster_id, state.topology)
        if taker is not None and state.job_intent not in JOB_GONE:
            return  # hand over once the Job no longer holds the nodes
        if taker is not None:
            self.promised.add(taker.task_id)
            self.tick.emit(state.task_id, ev.NodePoolRetained(pool, taker.task_id))
        else:
            self.tick.emit(state.task_id, ev.NodePoolDeleteRequested(pool))


def pool_settled(state: TaskState, cluster: Cluster | None, ctx: HandlerContext) -> bool:
    """True once no create of the task's pool is in flight (a delete issued while GKE
    still runs the create operation is refused)."""
    if state.pool_intent == "create-requested":
        return False
    if state.pool_intent != "create-started" or not state.pool_operation:
        return True
    if cluster is None or ctx.ports is None:
        return False
    try:
        return ctx.ports.node_pools.get_operation(cluster, state.pool_operation).done
    except PortError as error:
        log.warning("operation %s of pool %s: %s", state.pool_operation,
                    state.node_pool_name, error)
        return False


def needs_disposal(state: TaskState) -> bool:
    """The task ended holding a pool whose fate is not decided yet."""
    return (state.node_pool_name is not None
            and state.pool_intent not in (None, "not-created")
            and state.pool_disposition is None)


def deprovision(tick: Tick, ctx: HandlerContext) -> None:
    """Decide every ended task's pool; retry failed deletes; re-home retained pools
    whose taker went away."""
    if ctx.ports is None:
        return
    clusters = {c.id: c for c in ctx.clusters}
    states = current_states(tick, ctx)
    decider = PoolDecider(tick, states)
    for record in sorted(pool_records(states).values(), key=lambda r: (r.cluster_id,
                                                                       r.pool_name)):
        holder = tick.state(record.holder.task_id)
        if holder is None or not holder.is_terminal:
            continue
        if needs_disposal(holder):
            if pool_settled(holder, clusters.get(record.cluster_id), ctx):
                decider.dispose(holder)
        elif holder.pool_disposition == "retained":
            _check_retained(tick, decider, holder)
        elif holder.pool_disposition == "delete-failed":
            due = retry_due_at(holder, "NodePoolDeleteFailed", ctx.settings)
            if due is None or ctx.now >= due:
                tick.emit(holder.task_id, ev.NodePoolDeleteRequested(record.pool_name))


def _check_retained(tick: Tick, decider: PoolDecider, holder: TaskState) -> None:
    """A retained pool stays promised while its taker can still take it."""
    if holder.cluster_id is None or holder.node_pool_name is None:
        return
    taker = tick.state(holder.retained_for) if holder.retained_for else None
    if can_take_pool(taker, holder.cluster_id, holder.topology):
        return
    decider.promised.discard(holder.retained_for)
    other = decider.taker_for(holder.cluster_id, holder.topology)
    if other is not None:
        decider.promised.add(other.task_id)
        tick.emit(holder.task_id, ev.NodePoolRetained(holder.node_pool_name, other.task_id))
    else:
        tick.emit(holder.task_id, ev.NodePoolDeleteRequested(holder.node_pool_name))
