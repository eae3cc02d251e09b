"""Which tasks each lifecycle handler must look at, who holds each pool, and when each
task next needs a look by time alone.

A controller runs for years and sees every task that ever ran; a tick must cost what
changed, not that history. So the index is an inline projection like the queue view:
it follows each commit's task-state changes (and a reload's, after another writer won
a race), and handlers ask it for the handful of candidates of their phase. Memberships
are hints: handlers re-read each candidate's state before deciding.

It is written only from committed task states. When a task's create is next looked at
is no fact of the log: handlers keep it in ``OperationPolls``, which the index reads
to tell when each task next needs a look by time alone.
"""

from __future__ import annotations

import datetime as dt
import enum
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence

from sortedcontainers import SortedKeyList, SortedList
from sqlalchemy.engine import Connection

from falcon_es.domain import chart, naming
from falcon_es.domain.handover import can_take_pool, needs_disposal, taker_rank
from falcon_es.domain.intents import Intent, PoolDisposition, PoolIntent
from falcon_es.domain.queue_places import QueueKey
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from falcon_es.domain.task_intents import task_intents
from falcon_es.engine.operation_polls import OperationPolls, Poll

PoolKey = tuple[str, str]  # (cluster id, pool name)
#: One pool of one task: (task id, pool name). A multi-slice task answers for each of
#: its pools on its own (retained for one task, handed on, deleted).
HeldPool = tuple[str, str]
#: A task's next deadline or retry (the timeouts handler knows them, the core does not).
WakeOf = Callable[[TaskState], dt.datetime | None]


class Group(enum.StrEnum):
    """Which lifecycle handlers have to look at a task."""

    ACQUIRING = "acquiring"  # Pending/Provisioning, ClusterBusy, WaitingForNode
    DISPATCHING = "dispatching"  # Pending/Dispatching
    RUNNING = "running"
    ABORTING = "aborting"
    POOL_WATCH = "pool-watch"  # ended, holding a pool whose fate is open or retained


_NO_POOLS: frozenset[str] = frozenset()
_STREAM_ID = operator.attrgetter("stream_id")


def _moment(wake: tuple[dt.datetime, str]) -> dt.datetime:
    return wake[0]


class LifecycleIndex:
    """Which tasks each lifecycle handler must look at, and who holds each pool.

    Built from every folded task once, when the controller starts; from then on kept
    current from the streams each commit changed.
    """

    def __init__(self, tasks: TaskStates, wake_of: WakeOf | None = None, *,
                 polls: OperationPolls | None = None) -> None:
        self.tasks = tasks
        #: When each task next needs a look by time alone (a deadline or a retry), so
        #: loops and handlers find what is due without looking at every task. None for a
        #: read-only view (the node-pool view), which never asks what is due.
        self.wake_of = wake_of
        #: When each task's create is next looked at: the handlers' bookkeeping, read
        #: here (the index never writes it but to drop a poll of an outdated version).
        self.polls = polls if polls is not None else OperationPolls()
        self._groups: dict[Group, set[str]] = {g: set() for g in Group}
        self._takers: dict[QueueKey, set[str]] = {}
        #: The same takers by ``taker_rank``: the first of a queue that is not promised
        #: yet is usually the one, where a scan of every waiting task cost O(queue).
        self._taker_order: dict[QueueKey, SortedList] = {}
        self._retained: dict[QueueKey, set[HeldPool]] = {}
        #: Each indexed task's groups, the queue it could take a pool of, and its
        #: retained pools no task has taken yet (with their queue).
        self._member: dict[str, tuple[tuple[Group, ...], QueueKey | None,
                                      QueueKey | None, frozenset[str]]] = {}
        self._ranks: dict[str, tuple[bool, dt.datetime, str]] = {}
        self._intents: dict[str, tuple[Intent, ...]] = {}
        self._holders: dict[PoolKey, str] = {}
        self._created_at: dict[PoolKey, dt.datetime] = {}
        #: Pools taken over by a later task: their earlier holder answers for them no more.
        self._superseded: set[HeldPool] = set()
        #: ``falcon-task`` label -> task id, for the ids that are not valid label values
        #: themselves (informers report the label).
        self._by_label: dict[str, str] = {}
        #: Each task's ``wake_of`` moment as of the last commit (polls left out).
        self._wake_at: dict[str, dt.datetime] = {}
        self._wakes: SortedKeyList = SortedKeyList(key=_moment)  # (moment, task id)
        #: Retained pools and the task each is promised to (held pool -> taker, and
        #: taker -> held pools), and the pools whose taker could take them as of the
        #: last commit: those need no look from deprovisioning until one of the two
        #: changes. ``_only_retained``: ended tasks whose only duty is such pools.
        self._promised_to: dict[HeldPool, str] = {}
        self._promised_by: dict[str, set[HeldPool]] = {}
        self._kept: set[HeldPool] = set()
        self._only_retained: set[str] = set()
        #: The ``Group.POOL_WATCH`` tasks that need a look whatever a tick changed: kept
        #: per task as the three above change (``_settle``), since deprovisioning asks
        #: every tick and most watched tasks only wait for a taker that still can take.
        self._unsettled: set[str] = set()
        #: Reservation VMs asked for by creates in flight, per (cluster id, reservation):
        #: Compute's inUseCount counts VMs that exist, so a create not yet up is not in
        #: it, and two queues sharing a reservation would both see room.
        self._reserving: dict[tuple[str, str], dict[str, int]] = {}
        self._reserves: dict[str, tuple[str, str]] = {}
        #: Streams the append in progress changed (applied when it commits).
        self._changed: set[str] = set()

    def rebuild(self) -> None:
        """Index every folded task (once, after the log was folded at start)."""
        for group in self._groups.values():
            group.clear()
        for index in (self._takers, self._taker_order, self._ranks, self._retained,
                      self._member, self._intents,
                      self._holders, self._created_at, self._by_label, self._wake_at,
                      self._promised_to, self._promised_by, self._reserving,
                      self._reserves):
            index.clear()
        self._wakes.clear()
        self.polls.clear()
        self._kept.clear()
        self._only_retained.clear()
        self._unsettled.clear()
        self._superseded.clear()
        for state in self.tasks.all():
            self.update(state)

    # ------------------------------------------------------------ InlineProjection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        self._changed.update(map(_STREAM_ID, recorded))

    def committed(self) -> None:
        changed, self._changed = self._changed, set()
        for stream_id in changed:
            state = self.tasks.get(stream_id)
            if state is not None:
                self.update(state)

    def discarded(self) -> None:
        self._changed.clear()

    def resync(self, states: Iterable[TaskState]) -> None:
        """Tasks folded again from the log (another writer won a race). What was
        decided on the replaced states goes: a poll decided on this controller's version
        N of a task says nothing about the other writer's version N."""
        for state in states:
            self.polls.forget(state.task_id)
            self.update(state)

    def forget(self, states: Iterable[TaskState]) -> None:
        """Tasks that leave memory because they hold nothing (``falcon_es.engine.live_set``):
        every trace of them goes, so the index stays the size of the live set. A pool
        the task held only as a deleted one has no holder any more."""
        for state in states:
            task_id = state.task_id
            self._leave_groups(task_id)
            self._intents.pop(task_id, None)
            self.polls.forget(task_id)
            self._set_wake(task_id, None)
            for pool in {*state.node_pools, *state.pool.retained}:
                self._superseded.discard((task_id, pool))
            for pool, from_task in state.took:
                if self.tasks.get(from_task) is None:
                    self._superseded.discard((from_task, pool))
            for pool in state.node_pools if state.placement.cluster_id else ():
                key = (state.placement.cluster_id or "", pool)
                holder = self._holders.get(key)
                if holder == task_id:
                    del self._holders[key]
                if holder in (None, task_id):
                    self._created_at.pop(key, None)
            label = naming.task_label(task_id)
            if self._by_label.get(label) == task_id:
                del self._by_label[label]

    def handed_on(self, task_id: str) -> frozenset[str]:
        """The task's pools another task took over (``NodePoolReused.from_task``,
        ``NodePoolTaken.from_task``)."""
        state = self.tasks.get(task_id)
        if state is None:
            return frozenset()
        return frozenset(p for p in {*state.node_pools, *state.pool.retained}
                         if (task_id, p) in self._superseded)

    def _leave_groups(self, task_id: str) -> None:
        previous = self._member.pop(task_id, None)
        self._only_retained.discard(task_id)
        if previous is not None:
            groups, taker, retained, pools = previous
            self._drop_promises(task_id, pools)
            for group in groups:
                self._groups[group].discard(task_id)
            if taker is not None:
                self._takers[taker].discard(task_id)
                self._taker_order[taker].discard(self._ranks.pop(task_id))
            if retained is not None:
                self._retained[retained].difference_update((task_id, p) for p in pools)
        self._unsettled.discard(task_id)

    def update(self, state: TaskState) -> None:
        task_id = state.task_id
        self._leave_groups(task_id)
        self._track_pool(state)
        # Retained pools a later task took belong to it now (most tasks retain none).
        waiting = frozenset(p for p in state.retained_idle
                            if (task_id, p) not in self._superseded) \
            if state.pool.retained else _NO_POOLS
        groups = self._groups_of(state, waiting)
        for group in groups:
            self._groups[group].add(task_id)
        taker = retained = None
        if state.placement.cluster_id and can_take_pool(
                state, state.placement.cluster_id, state.submission.topology):
            taker = (state.placement.cluster_id, state.submission.topology)
            self._takers.setdefault(taker, set()).add(task_id)
            rank = self._ranks[task_id] = taker_rank(state)
            self._taker_order.setdefault(taker, SortedList()).add(rank)
        if not (state.placement.cluster_id and state.is_terminal):
            waiting = frozenset()
        if waiting:
            retained = (state.placement.cluster_id or "", state.submission.topology)
            self._retained.setdefault(retained, set()).update((task_id, p) for p in waiting)
            if not (needs_disposal(state)
                    or state.pool.disposition == PoolDisposition.DELETE_FAILED):
                self._only_retained.add(task_id)
        self._member[task_id] = (groups, taker, retained, waiting)
        if waiting:
            self._track_promises(state, waiting)
        self._settle(task_id)
        for held in self._promised_by.get(task_id, ()):
            holder = self.tasks.get(held[0])
            if holder is not None:
                self._judge_promise(holder, held[1])
        self._track_reservation(state)
        intents = task_intents(state)
        if intents:
            self._intents[task_id] = intents
        else:
            self._intents.pop(task_id, None)
        if state.job.name:
            label = naming.task_label(task_id)
            if label != task_id:
                self._by_label[label] = task_id
        self.polls.moved(state)
        self._set_wake(task_id, self.wake_of(state) if self.wake_of is not None else None)

    def _track_reservation(self, state: TaskState) -> None:
        """A create of the task's pool against a reservation is in flight from its
        request until the pool is ready (its VMs are in inUseCount then), fails or is
        deleted: counted twice for the moments its VMs are up and not yet ready, never
        missed."""
        task_id = state.task_id
        previous = self._reserves.pop(task_id, None)
        if previous is not None:
            hosts = self._reserving[previous]
            hosts.pop(task_id, None)
            if not hosts:
                del self._reserving[previous]
        request = state.pool.request
        reservation = request.reservation if request is not None else None
        if (request is not None and reservation and state.placement.cluster_id
                and state.pool.intent in (PoolIntent.CREATE_REQUESTED, PoolIntent.CREATE_STARTED)
                and state.pool.disposition != PoolDisposition.DELETED
                # A partial create waiting for the rest: its creates are done, its VMs
                # are in inUseCount.
                and state.reason != chart.PendingReason.CLUSTER_BUSY):
            key = (state.placement.cluster_id, reservation)
            creating = (request.upto or request.slices) - request.first_slice
            self._reserving.setdefault(key, {})[task_id] = request.node_count * creating
            self._reserves[task_id] = key

    def reserving(self, cluster_id: str, reservation: str, *, besides: str = "") -> int:
        """Reservation VMs that creates in flight on the cluster will take (those of
        task ``besides`` left out), as of the last commit."""
        hosts = self._reserving.get((cluster_id, reservation), {})
        return sum(n for task_id, n in hosts.items() if task_id != besides)

    def _track_promises(self, state: TaskState, waiting: frozenset[str]) -> None:
        for pool in waiting:
            held = (state.task_id, pool)
            taker_id = state.pool.retained[pool]
            self._promised_to[held] = taker_id
            self._promised_by.setdefault(taker_id, set()).add(held)
            self._judge_promise(state, pool)

    def _drop_promises(self, holder_id: str, pools: Iterable[str]) -> None:
        """Forget the promises of these pools of the holder."""
        for pool in pools:
            held = (holder_id, pool)
            self._kept.discard(held)
            taker_id = self._promised_to.pop(held, None)
            if taker_id is not None:
                holders = self._promised_by[taker_id]
                holders.discard(held)
                if not holders:
                    del self._promised_by[taker_id]
        self._settle(holder_id)

    def _judge_promise(self, holder: TaskState, pool: str) -> None:
        taker_id = holder.pool.retained.get(pool)
        taker = self.tasks.get(taker_id) if taker_id else None
        held = (holder.task_id, pool)
        if holder.placement.cluster_id and can_take_pool(
                taker, holder.placement.cluster_id, holder.submission.topology):
            self._kept.add(held)
        else:
            self._kept.discard(held)
        self._settle(holder.task_id)

    def _settle(self, task_id: str) -> None:
        """Whether the task is among ``_unsettled`` now: watched, with a duty besides
        retained pools or with a retained pool whose taker could not take it."""
        member = self._member.get(task_id)
        if member is not None and task_id in self._groups[Group.POOL_WATCH] and (
                task_id not in self._only_retained
                or any((task_id, p) not in self._kept for p in member[3])):
            self._unsettled.add(task_id)
        else:
            self._unsettled.discard(task_id)

    def _set_wake(self, task_id: str, moment: dt.datetime | None) -> None:
        previous = self._wake_at.get(task_id)
        if previous == moment:
            return
        if previous is not None:
            self._wakes.remove((previous, task_id))
            del self._wake_at[task_id]
        if moment is not None:
            self._wake_at[task_id] = moment
            self._wakes.add((moment, task_id))

    def _groups_of(self, state: TaskState, waiting: frozenset[str]) -> tuple[Group, ...]:
        status, _, reason = state.state.partition(".")
        if status == chart.PENDING:
            if reason in chart.ACQUIRING_REASONS:
                return (Group.ACQUIRING,)
            return (Group.DISPATCHING,) if reason == chart.PendingReason.DISPATCHING else ()
        if status == chart.RUNNING:
            return (Group.RUNNING,)
        if status == chart.ABORTING:
            return (Group.ABORTING,)
        if status in chart.TERMINAL_STATUSES and (
                needs_disposal(state) or waiting
                or state.pool.disposition == PoolDisposition.DELETE_FAILED):
            return (Group.POOL_WATCH,)
        return ()

    def _track_pool(self, state: TaskState) -> None:
        """The holder of a pool is the task that last took it: its creator, then each
        task it was handed over to (``NodePoolReused.from_task`` and
        ``NodePoolTaken.from_task`` name the previous one)."""
        if not state.placement.cluster_id:
            return
        for pool, from_task in state.took:
            if (from_task, pool) not in self._superseded:
                self._superseded.add((from_task, pool))
                self._forget_pool_duty(from_task, pool)
        created = state.pool.requested_at
        taken = set(state.pool.taken_pools)
        for pool in state.held_pools:
            if pool in state.pool.handed_over:
                continue  # the task that took it holds it (if it is still known)
            key = (state.placement.cluster_id, pool)
            if created is not None and pool not in taken:
                known = self._created_at.get(key)
                if known is None or created < known:
                    self._created_at[key] = created
            if (state.task_id, pool) in self._superseded:
                continue
            current = self._holders.get(key)
            if (current is None or (current, pool) in self._superseded
                    or current == state.task_id):
                self._holders[key] = state.task_id

    def _forget_pool_duty(self, task_id: str, pool: str) -> None:
        """The task handed this pool on: nothing about it is its business now (the
        task leaves the pool watch once no other pool of it needs a look)."""
        member = self._member.get(task_id)
        if member is None:
            return
        groups, taker, retained, waiting = member
        self._drop_promises(task_id, (pool,))
        if retained is not None:
            self._retained[retained].discard((task_id, pool))
        waiting = waiting - {pool}
        if not waiting and task_id in self._only_retained:
            self._only_retained.discard(task_id)
            self._groups[Group.POOL_WATCH].discard(task_id)
            groups = tuple(g for g in groups if g != Group.POOL_WATCH)
        self._member[task_id] = (groups, taker, retained if waiting else None, waiting)
        self._settle(task_id)

    # ------------------------------------------------------------------ reading
    def ids(self, *groups: Group) -> set[str]:
        found: set[str] = set()
        for group in groups:
            found |= self._groups[group]
        return found

    def pool_watch(self, changed: Iterable[str] = ()) -> set[str]:
        """The ``Group.POOL_WATCH`` tasks whose pool may need a decision: all but the holders
        of a retained pool whose taker could still take it at the last commit, unless
        that taker is among ``changed`` (states a tick has moved since)."""
        watch = self._groups[Group.POOL_WATCH]
        found = set(self._unsettled)
        for task_id in changed:
            found.update(h for h, _ in self._promised_by.get(task_id, ()) if h in watch)
        return found

    def is_holder(self, state: TaskState, pool: str, handed_over: set[HeldPool]) -> bool:
        """Still responsible for this pool of its own: no task took it over, in an
        earlier tick (the index knows) or in this one (``handed_over``, from
        ``Tick.handed_over_now``)."""
        if state.placement.cluster_id is None:
            return False
        if self.holder((state.placement.cluster_id, pool)) not in (None, state.task_id):
            return False
        return (state.task_id, pool) not in handed_over

    def takers(self, key: QueueKey) -> set[str]:
        return set(self._takers.get(key, ()))

    def takers_in_order(self, key: QueueKey) -> Iterator[str]:
        """This queue's takers as of the last commit, best ``taker_rank`` first."""
        return (rank[2] for rank in self._taker_order.get(key, ()))

    def retained(self, key: QueueKey) -> set[HeldPool]:
        """The queue's retained pools no task has taken yet, with their holders."""
        return set(self._retained.get(key, ()))

    def holder(self, key: PoolKey) -> str | None:
        return self._holders.get(key)

    def pools(self) -> dict[PoolKey, str]:
        return dict(self._holders)

    def created_at(self, key: PoolKey) -> dt.datetime | None:
        return self._created_at.get(key)

    def task_for_label(self, label: str) -> str:
        """The task id a ``falcon-task`` label value stands for."""
        return self._by_label.get(label, label)

    def intents(self) -> list[Intent]:
        return [i for group in self._intents.values() for i in group]

    def intents_of(self, task_id: str) -> tuple[Intent, ...]:
        return self._intents.get(task_id, ())

    def wake_at(self, task_id: str) -> dt.datetime | None:
        """The task's ``wake_of`` moment as of the last commit (or its next operation
        poll, when that comes first or the moment was spent)."""
        return _wake(self._wake_at.get(task_id), self.polls.of(task_id))

    def next_wake(self) -> dt.datetime | None:
        """The earliest moment a task needs a look by time alone (``wake_of``, polls)."""
        moments = [m for m in (self._first_unspent(), self.polls.earliest()) if m is not None]
        return min(moments) if moments else None

    def waking(self, now: dt.datetime) -> list[str]:
        """Tasks whose wake moment (``wake_at``) has come, earliest first."""
        found: dict[str, dt.datetime] = {}
        for moment, task_id in self._wakes.irange_key(max_key=now):
            if not _spent(moment, self.polls.of(task_id)):
                found[task_id] = moment
        for next_at, task_id in self.polls.until(now):
            found[task_id] = min(next_at, found.get(task_id, next_at))
        return sorted(found, key=lambda task_id: (found[task_id], task_id))

    def _first_unspent(self) -> dt.datetime | None:
        """The earliest ``wake_of`` moment a poll did not spend (few are spent: one
        per create in flight at most)."""
        for moment, task_id in self._wakes:
            if not _spent(moment, self.polls.of(task_id)):
                return moment  # type: ignore[no-any-return]
        return None


def _spent(moment: dt.datetime, poll: Poll | None) -> bool:
    """A ``wake_of`` moment already due when the poll was decided: the look it was for
    happened and failed, and the poll says when the next one comes."""
    return poll is not None and moment <= poll.decided_at


def _wake(deadline: dt.datetime | None, poll: Poll | None) -> dt.datetime | None:
    """The earlier of a task's ``wake_of`` moment (unless spent) and its next poll."""
    if poll is None:
        return deadline
    if deadline is None or _spent(deadline, poll):
        return poll.next_at
    return min(poll.next_at, deadline)


