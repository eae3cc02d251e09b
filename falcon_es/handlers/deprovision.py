"""Deprovisioning: what becomes of a task's node pool once the task has ended.

After every terminal outcome, abort included: when a task of the same
topology waits on that cluster, the pool is retained and handed over
(``NodePoolRetained(for_task)``); otherwise it is deleted (``NodePoolDeleteRequested``,
carried out by the effect executor). A failed delete (``NodePoolDeleteFailed``) is
requested again after a backoff; each attempt lands in the Message as a note, and the
task's Status keeps following its Job's result.

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
from collections import Counter
from collections.abc import Sequence

from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.handlers.provisioning import ask_create_operation
from falcon_es.domain.handover import can_take_pool, needs_disposal, pools_wanted, taker_rank
from falcon_es.domain.intents import JobIntent, PoolDisposition, PoolIntent
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import retry_due_at
from falcon_es.engine.runtime import Tick
from falcon_es.domain.queue_book import QueueKey
from falcon_es.domain.task import TaskState

log = logging.getLogger("falcon_es.handlers.deprovision")

#: Job intents after which no pod of the task occupies the pool's nodes.
JOB_GONE = frozenset({None, JobIntent.FINISHED, JobIntent.DELETED, JobIntent.CANCELLED,
                      JobIntent.SUBMIT_FAILED})


class PoolDecider:
    """Decides the fate of ended tasks' pools within one tick, remembering how many
    pools each waiting task was already promised, so no task is promised more pools
    than it has slices to take them for."""

    def __init__(self, tick: Tick, index: LifecycleIndex) -> None:
        self.tick = tick
        self.index = index
        self.promised: Counter[str] = Counter()
        self._loaded: set[QueueKey] = set()

    def _load(self, key: QueueKey) -> None:
        """Tasks already promised pools of this queue (by an earlier tick)."""
        if key in self._loaded:
            return
        self._loaded.add(key)
        for holder_id, pool in self.index.retained(key):
            holder = self.tick.state(holder_id)
            taker_id = holder.pools_retained.get(pool) if holder is not None else None
            if taker_id:
                self.promised[taker_id] += 1

    def _free(self, state: TaskState | None, cluster_id: str, topology: str) -> bool:
        return (can_take_pool(state, cluster_id, topology) and state is not None
                and self.promised[state.task_id] < pools_wanted(state))

    def taker_for(self, cluster_id: str, topology: str) -> TaskState | None:
        """The slot holder without a pool first (it is provisioning now), then the
        waiting tasks in submit order."""
        key = (cluster_id, topology)
        self._load(key)
        touched = {s.task_id for s in self.tick.touched()}
        best: TaskState | None = None
        for task_id in self.index.takers_in_order(key):
            # Untouched tasks are as the index ranked them: the first free one is best.
            if task_id not in touched:
                state = self.tick.state(task_id)
                if self._free(state, cluster_id, topology):
                    best = state
                    break
        for task_id in touched:
            state = self.tick.state(task_id)
            if (state is not None and self._free(state, cluster_id, topology)
                    and (best is None or taker_rank(state) < taker_rank(best))):
                best = state
        return best

    def dispose(self, state: TaskState) -> None:
        """Hand each of the ended task's pools over, or delete it: a pool that reached
        readiness goes to the best waiting task of its queue, one pool per slice that
        task still needs, and the pools nobody takes are deleted together."""
        if state.cluster_id is None or not state.held_pools:
            return
        taken = set(state.taken_pools)
        handed: list[tuple[str, TaskState]] = []
        for pool in state.held_pools:
            if state.pool_intent != PoolIntent.READY and pool not in taken:
                continue  # its create failed or never finished: it goes
            taker = self.taker_for(state.cluster_id, state.topology)
            if taker is None:
                break
            self.promised[taker.task_id] += 1
            handed.append((pool, taker))
        if handed and state.job_intent not in JOB_GONE:
            self.promised.subtract(taker.task_id for _, taker in handed)
            return  # hand over once the Job no longer holds the nodes
        for pool, taker in handed:
            self.tick.emit(state.task_id, ev.NodePoolRetained(pool, taker.task_id))
        kept = {pool for pool, _ in handed}
        rest = [pool for pool in state.held_pools if pool not in kept]
        if rest:
            self.tick.emit(state.task_id, delete_requested(rest))

    def check_retained(self, holder: TaskState, pool: str) -> None:
        """A retained pool stays promised while its taker can still take it."""
        if holder.cluster_id is None:
            return
        self._load((holder.cluster_id, holder.topology))
        taker_id = holder.pools_retained.get(pool)
        taker = self.tick.state(taker_id) if taker_id else None
        if can_take_pool(taker, holder.cluster_id, holder.topology):
            return
        if taker_id:
            self.promised[taker_id] -= 1
        other = self.taker_for(holder.cluster_id, holder.topology)
        if other is not None:
            self.promised[other.task_id] += 1
            self.tick.emit(holder.task_id, ev.NodePoolRetained(pool, other.task_id))
        else:
            # A delete of its other pools may still be under way: the new request
            # names them too, so none is left behind.
            deleting = (holder.pools_deleting if holder.pool_disposition in (
                PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED) else ())
            self.tick.emit(holder.task_id, delete_requested([*deleting, pool]))


def delete_requested(pools: Sequence[str]) -> ev.NodePoolDeleteRequested:
    """The delete of these pools of a task, naming every one of them."""
    first, *others = pools
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
    for holder in tick.candidates(watch):
        if not holder.is_terminal:
            continue
        if needs_disposal(holder):
            if pool_settled(holder, clusters.get(holder.cluster_id or ""), ctx):
                decider.dispose(holder)
            continue
        for pool in sorted(holder.retained_idle):
            if index.is_holder(holder, pool, handed_over):
                decider.check_retained(holder, pool)
                holder = tick.state(holder.task_id) or holder
        if (holder.pool_disposition == PoolDisposition.DELETE_FAILED
                and holder.pools_deleting):
            due = retry_due_at(holder, "NodePoolDeleteFailed", ctx.settings.retry)
            if due is None or ctx.now >= due:
                tick.emit(holder.task_id, delete_requested(holder.pools_deleting))
