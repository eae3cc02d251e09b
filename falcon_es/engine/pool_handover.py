"""Deciding the fate of ended tasks' pools within one tick: handed over to a waiting
task of their queue (``NodePoolRetained``) or deleted (``NodePoolDeleteRequested``).

Shared by the deprovisioning handler (every ended task) and the abort handler (an
aborting task once its Job is gone), which is why it lives in the engine and not in
either of them: it reads the tick and the lifecycle index. The rules themselves
(who may take a pool, in which order) are the domain's ``handover``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from falcon_es.domain import events as ev
from falcon_es.domain.handover import can_take_pool, fits_pool_life, pools_wanted, taker_rank
from falcon_es.domain.intents import JOB_GONE, PoolDisposition, PoolIntent
from falcon_es.domain.queue_places import QueueKey
from falcon_es.domain.task import TaskState
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.runtime import Tick


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
            taker_id = holder.pool.retained.get(pool) if holder is not None else None
            if taker_id:
                self.promised[taker_id] += 1

    def _free(self, state: TaskState | None, holder: TaskState) -> bool:
        cluster_id, topology = holder.placement.cluster_id or "", holder.submission.topology
        return (can_take_pool(state, cluster_id, topology) and state is not None
                and self.promised[state.task_id] < pools_wanted(state)
                and fits_pool_life(state, holder, self.tick.now))

    def taker_for(self, holder: TaskState) -> TaskState | None:
        """Who takes a pool of ``holder``'s queue: the slot holder without a pool first
        (it is provisioning now), then the waiting tasks in submit order; for a
        flex-start pool, only a task whose timeout fits in its nodes' life."""
        cluster_id, topology = holder.placement.cluster_id or "", holder.submission.topology
        key = (cluster_id, topology)
        self._load(key)
        touched = {s.task_id for s in self.tick.touched()}
        best: TaskState | None = None
        for task_id in self.index.takers_in_order(key):
            # Untouched tasks are as the index ranked them: the first free one is best.
            if task_id not in touched:
                state = self.tick.state(task_id)
                if self._free(state, holder):
                    best = state
                    break
        for task_id in touched:
            state = self.tick.state(task_id)
            if (state is not None and self._free(state, holder)
                    and (best is None or taker_rank(state) < taker_rank(best))):
                best = state
        return best

    def dispose(self, state: TaskState, *, created: bool = False) -> None:
        """Hand each of the ended task's pools over, or delete it: a pool that reached
        readiness goes to the best waiting task of its queue, one pool per slice that
        task still needs, and the pools nobody takes are deleted together. ``created``:
        the caller followed the task's running create to its end and it succeeded (an
        abort during provisioning), so its pools are as good as ready ones: the taker
        looks at the pool before it uses it, as at any idle pool."""
        if state.placement.cluster_id is None or not state.held_pools:
            return
        taken = set(state.pool.taken_pools)
        usable = state.pool.intent == PoolIntent.READY or (
            created and state.pool.intent == PoolIntent.CREATE_STARTED)
        handed: list[tuple[str, TaskState]] = []
        for pool in state.held_pools:
            if not usable and pool not in taken:
                continue  # its create failed or never finished: it goes
            taker = self.taker_for(state)
            if taker is None:
                break
            self.promised[taker.task_id] += 1
            handed.append((pool, taker))
        if handed and state.job.intent not in JOB_GONE:
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
        if holder.placement.cluster_id is None:
            return
        self._load((holder.placement.cluster_id, holder.submission.topology))
        taker_id = holder.pool.retained.get(pool)
        taker = self.tick.state(taker_id) if taker_id else None
        if (can_take_pool(taker, holder.placement.cluster_id, holder.submission.topology)
                and taker is not None and fits_pool_life(taker, holder, self.tick.now)):
            return
        if taker_id:
            self.promised[taker_id] -= 1
        other = self.taker_for(holder)
        if other is not None:
            self.promised[other.task_id] += 1
            self.tick.emit(holder.task_id, ev.NodePoolRetained(pool, other.task_id))
        else:
            # A delete of its other pools may still be under way: the new request
            # names them too, so none is left behind.
            deleting = (holder.pool.deleting if holder.pool.disposition in (
                PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED) else ())
            self.tick.emit(holder.task_id, delete_requested([*deleting, pool]))


def delete_requested(pools: Sequence[str]) -> ev.NodePoolDeleteRequested:
    """The delete of these pools of a task, naming every one of them."""
    first, *others = pools
    return ev.NodePoolDeleteRequested(first, tuple(others))
