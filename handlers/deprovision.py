"""Deprovisioning: what becomes of a task's node pool once the task has ended.

After every terminal outcome, abort included: when a task of the same
topology waits on that cluster, the pool is retained and handed over
(``NodePoolRetained(for_task)``); otherwise it is deleted (``NodePoolDeleteRequested``,
carried out by the effect executor). A failed delete (``NodePoolDeleteFailed``) is
requested again after a backoff; each attempt lands in the Message as a note, and the
task's Status keeps following its Job's result.

A pool is handed over only when it reached readiness and no Job of the ending task
still occupies it. A multi-slice task's pools are deleted together (the effect
executor deletes the group), never handed over. A retained pool whose intended taker went away (aborted, re-queued,
given a pool of its own) is handed to another waiting task of its queue or deleted.

Every pool is traced, through ``NodePoolReused.from_task``, to the one task currently
responsible for it (its holder); the effect executor's ``LifecycleIndex`` keeps that
and the candidate lists current, so a tick looks only at tasks that can need work.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from falcon_es import events as ev
from falcon_es.context import HandlerContext
from falcon_es.handlers.provisioning import ask_create_operation
from falcon_es.handover import can_take_pool, needs_disposal, taker_rank
from falcon_es.intents import JobIntent, PoolDisposition, PoolIntent
from falcon_es.lifecycle_index import LifecycleIndex
from falcon_es.registry import Cluster
from falcon_es.retry import retry_due_at
from falcon_es.runtime import Tick
from falcon_es.scheduling import QueueKey
from falcon_es.task import TaskState

log = logging.getLogger("falcon_es.handlers.deprovision")

#: Job intents after which no pod of the task occupies the pool's nodes.
JOB_GONE = frozenset({None, JobIntent.FINISHED, JobIntent.DELETED, JobIntent.CANCELLED,
                      JobIntent.SUBMIT_FAILED})


class PoolDecider:
    """Decides the fate of ended tasks' pools within one tick, remembering which
    waiting tasks were already promised a pool so two pools never go to one task."""

    def __init__(self, tick: Tick, index: LifecycleIndex) -> None:
        self.tick = tick
        self.index = index
        self.promised: set[str] = set()
        self._loaded: set[QueueKey] = set()

    def _load(self, key: QueueKey) -> None:
        """Tasks already promised a pool of this queue (by an earlier tick)."""
        if key in self._loaded:
            return
        self._loaded.add(key)
        for holder_id in self.index.retained(key):
            holder = self.tick.state(holder_id)
            if (holder is not None and holder.pool_disposition == PoolDisposition.RETAINED
                    and holder.retained_for):
                self.promised.add(holder.retained_for)

    def taker_for(self, cluster_id: str, topology: str) -> TaskState | None:
        """The slot holder without a pool first (it is provisioning now), then the
        waiting tasks in submit order."""
        key = (cluster_id, topology)
        self._load(key)
        touched = {s.task_id for s in self.tick.touched()}
        best: TaskState | None = None
        for task_id in self.index.takers_in_order(key):
            # Untouched tasks are as the index ranked them: the first free one is best.
            if task_id not in touched and task_id not in self.promised:
                state = self.tick.state(task_id)
                if can_take_pool(state, cluster_id, topology):
                    best = state
                    break
        for task_id in touched - self.promised:
            state = self.tick.state(task_id)
            if (state is not None and can_take_pool(state, cluster_id, topology)
                    and (best is None or taker_rank(state) < taker_rank(best))):
                best = state
        return best

    def dispose(self, state: TaskState) -> None:
        """Hand the ended task's pool over, or delete it."""
        pool = state.node_pool_name
        if pool is None or state.cluster_id is None:
            return
        taker = None
        if state.pool_intent == PoolIntent.READY and state.slices == 1:
            taker = self.taker_for(state.cluster_id, state.topology)
        if taker is not None and state.job_intent not in JOB_GONE:
            return  # hand over once the Job no longer holds the nodes
        if taker is not None:
            self.promised.add(taker.task_id)
            self.tick.emit(state.task_id, ev.NodePoolRetained(pool, taker.task_id))
        else:
            self.tick.emit(state.task_id, delete_requested(state))

    def check_retained(self, holder: TaskState) -> None:
        """A retained pool stays promised while its taker can still take it."""
        if holder.cluster_id is None or holder.node_pool_name is None:
            return
        self._load((holder.cluster_id, holder.topology))
        taker = self.tick.state(holder.retained_for) if holder.retained_for else None
        if can_take_pool(taker, holder.cluster_id, holder.topology):
            return
        self.promised.discard(holder.retained_for or "")
        other = self.taker_for(holder.cluster_id, holder.topology)
        if other is not None:
            self.promised.add(other.task_id)
            self.tick.emit(holder.task_id, ev.NodePoolRetained(holder.node_pool_name,
                                                               other.task_id))
        else:
            self.tick.emit(holder.task_id, delete_requested(holder))


def delete_requested(state: TaskState) -> ev.NodePoolDeleteRequested:
    """The delete of the task's pool, naming every pool of a multi-slice group."""
    first, *others = state.node_pools
    return ev.NodePoolDeleteRequested(first, tuple(others))


def pool_settled(state: TaskState, cluster: Cluster | None, ctx: HandlerContext) -> bool:
    """True once no create of the task's pool is in flight (a delete issued while GKE
    still runs the create operation is refused)."""
    if state.pool_intent == PoolIntent.CREATE_REQUESTED:
        return False
    if state.pool_intent != PoolIntent.CREATE_STARTED or not state.pool_operation:
        return True
    if cluster is None:
        return False
    operation = ask_create_operation(state, cluster, ctx)
    return operation is not None and operation.done


def deprovision(tick: Tick, ctx: HandlerContext) -> None:
    """Decide every ended task's pool; retry failed deletes; re-home retained pools
    whose taker went away."""
    index = ctx.index
    clusters = {c.id: c for c in ctx.clusters}
    decider = PoolDecider(tick, index)
    handed_over = tick.handed_over_now()
    # A retained pool whose taker can still take it needs no look (``pool_watch``):
    # ``check_retained`` would find nothing to do for it.
    watch = index.pool_watch(s.task_id for s in tick.touched())
    for holder in _ended_with_pools(tick.candidates(watch)):
        if not index.is_holder(holder, handed_over):
            continue
        if needs_disposal(holder):
            if pool_settled(holder, clusters.get(holder.cluster_id or ""), ctx):
                decider.dispose(holder)
        elif holder.pool_disposition == PoolDisposition.RETAINED:
            decider.check_retained(holder)
        elif holder.pool_disposition == PoolDisposition.DELETE_FAILED:
            due = retry_due_at(holder, "NodePoolDeleteFailed", ctx.settings)
            if due is None or ctx.now >= due:
                tick.emit(holder.task_id, delete_requested(holder))


def _ended_with_pools(states: Iterable[TaskState]) -> list[TaskState]:
    return [s for s in states if s.is_terminal and s.node_pool_name]
