"""Scheduling: where each accepted task queues and when it takes its queue's slot.

Six handlers, run in this order after intake in every tick:

1. ``requeue_from_inactive_clusters`` -- waiting tasks queued on a cluster that is now
   in maintenance or offline leave that queue (TaskRequeued); tasks acquiring or
   running there stay.
2. ``choose_clusters`` -- every task without a cluster (just accepted, just re-queued,
   or waiting for an active cluster) gets one (ClusterChosen), fails when no cluster
   serves its TPU type or no cluster's reservation can ever serve its request (another
   machine type, fewer VMs in total: NoMatchingCluster naming both sides), or keeps
   waiting with a Message naming the clusters and their status (NoActiveCluster,
   appended again only when that changes). A cluster whose reservation can never serve
   the task is no candidate.
3. ``move_from_stuck_queues`` -- when a queue's slot holder has been in ClusterBusy or
   WaitingForNode for ``FALCON_REPLACE_AFTER_SECONDS``, its next waiting task moves to
   another active cluster of its TPU type (and supply mode) whose queue is empty with
   the slot free (TaskMoved, naming both clusters and why), at most
   ``FALCON_MAX_MOVES`` times per task. So does the slot holder itself when it waits in
   ClusterBusy holding nothing, to such a cluster whose reservation has room for it
   now; a task holding a pool, or in any other slot state, never moves.
4. ``yield_busy_slots`` -- a slot holder that has created no pool yet (ClusterBusy: its
   reservation is full) gives the slot back when a waiting task of higher effective
   priority waits (SlotYielded; ``FALCON_PREEMPT_CLUSTER_BUSY``). Nothing past that is
   preempted: a pool being created, a Job dispatched or running keeps its slot.
5. ``lend_stuck_slots`` -- a slot holder in ClusterBusy that holds nothing lends the
   slot to the first waiting task (in pick order) that needs another supply mode than
   its reservation (SlotLent on the holder, SlotBorrowed on the borrower, naming each
   other, why, and the tasks passed over); the holder goes on the moment its
   reservation has room. ``FALCON_BEST_EFFORT_FIFO=false`` keeps strict FIFO.
6. ``fill_free_slots`` -- every queue with waiting tasks and a free slot on an active
   cluster picks one task (TaskPicked, with the priorities it compared), all queues
   in the same tick.

Each decision event records the candidates and why the winner won, so
``falcon-es history ID`` explains a task's whole wait. The handlers update the
controller's ``QueueBook`` as they emit (it journals and is confirmed or rolled back
with the tick's append), so a decision sees the ones made before it in the same tick.
"""

from __future__ import annotations

import functools
import logging
from typing import TypeGuard

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.lifecycle_index import Group
from falcon_es.domain.clusters import Cluster
from falcon_es.engine.runtime import Tick
from falcon_es.domain.cluster_choice import (
    ACTIVE,
    ClusterChoice,
    NeverFit,
    NoMatch,
    NoneActive,
    STUCK_REASONS,
    choose_cluster,
    move_target,
    never_fits,
)
from falcon_es.domain.ports import AWAITING, PortError, ReservationCapacity
from falcon_es.domain.reservation_end import RESERVATION_ENDING, EndsTooSoon, ends_too_soon
from falcon_es.domain.slot_loans import (
    LoanCandidate, SlotBorrowed, SlotLent, choose_borrower, competes, resolved_mode,
)
from falcon_es.domain.spec import RESERVATION
from falcon_es.domain.tpu import TopologyError, choose_machine, slice_shape
from falcon_es.engine.reservation_reads import reserved_shape
from falcon_es.domain.queue_book import QueueBook
from falcon_es.domain.task import TaskState

log = logging.getLogger("falcon_es.handlers.scheduling")

def _book(tick: Tick, ctx: HandlerContext) -> QueueBook:
    """The book, brought up to date with what earlier handlers emitted this tick."""
    book = ctx.queues
    book.begin(tick)
    for state in tick.touched():
        book.sync(state)
    return book


def _is_waiting(state: TaskState | None) -> TypeGuard[TaskState]:
    return state is not None and state.status == chart.PENDING and state.reason == "Waiting"


def requeue_from_inactive_clusters(tick: Tick, ctx: HandlerContext) -> None:
    book = _book(tick, ctx)
    clusters = {c.id: c for c in ctx.clusters}
    for key in book.waiting_queues():
        cluster = clusters.get(key[0])
        if cluster is not None and cluster.status == ACTIVE:
            continue
        name = cluster.name if cluster else key[0]
        status = cluster.status if cluster else "unregistered"
        for entry in book.waiting(key):
            state = tick.state(entry.task_id)
            if not _is_waiting(state):
                if state is not None:
                    book.sync(state)
                continue
            after = tick.emit(entry.task_id, ev.TaskRequeued(key[0], name, status))
            if after is not None:
                book.sync(after)


def choose_clusters(tick: Tick, ctx: HandlerContext) -> None:
    book = _book(tick, ctx)
    unplaced = book.unplaced()
    if not unplaced:
        return
    idle_pools = book.idle_pool_queues()
    capacities = _Capacities(ctx)
    for tpu_type, entries in unplaced.items():
        # Without an active cluster of the type the verdict is the same for every task
        # of the group asking for the same supply mode (it does not depend on queue
        # depths; a reservation narrows the candidates): work it out once per mode.
        shared: dict[str | None, NoMatch | NoneActive | None] = {}
        for entry in entries:
            state = tick.state(entry.task_id)
            if not _is_waiting(state) or state.placement.cluster_id is not None:
                if state is not None:
                    book.sync(state)
                continue
            mode = _supply_mode(state)
            if mode not in shared:
                verdict = choose_cluster(tpu_type, "", ctx.clusters, book.depth, idle_pools,
                                         mode)
                shared[mode] = verdict if isinstance(verdict, (NoMatch, NoneActive)) else None
            choice = shared[mode] or choose_cluster(
                tpu_type, entry.topology, ctx.clusters,
                functools.partial(book.ahead, priority=state.submission.priority), idle_pools, mode,
                functools.partial(capacities.never_fit, state))
            event = _decision_event(choice, state)
            if event is None:
                continue
            after = tick.emit(entry.task_id, event)
            if after is not None:
                book.sync(after)


def _decision_event(choice: ClusterChoice | NoMatch | NoneActive, state: TaskState) -> ev.Event | None:
    if isinstance(choice, ClusterChoice):
        return ev.ClusterChosen(choice.cluster.id, choice.cluster.name, state.submission.topology,
                                choice.why, choice.candidates)
    if isinstance(choice, NoMatch):
        needs = None
        if choice.never_fit:
            shape = slice_shape(state.submission.tpu_type, state.submission.topology)
            needs = {"topology": shape.topology, "machine_type": shape.machine_type,
                     "vms": shape.hosts * state.slices}
        return ev.NoMatchingCluster(state.submission.tpu_type, choice.registered_tpu_types,
                                    choice.supply_mode, choice.without_reservation, needs,
                                    tuple(u.as_data() for u in choice.never_fit))
    unchanged = (state.message_key == "NoActiveCluster"
                 and list(state.message_args.get("clusters", ())) == list(choice.clusters))
    return None if unchanged else ev.NoActiveCluster(state.submission.tpu_type, choice.clusters)


class _Capacities:
    """What each cluster's default reservation holds at most, read once per tick in
    which a task is placed (a reservation's machine type and size seldom change, and
    tasks are placed when they arrive), for ``never_fit``."""

    def __init__(self, ctx: HandlerContext) -> None:
        self.ctx = ctx
        self.read: dict[tuple[str, str], ReservationCapacity] = {}

    def never_fit(self, state: TaskState, cluster: Cluster) -> NeverFit | EndsTooSoon | None:
        """The cluster's reservation, when the task would use it there and it can never
        serve the task, or it ends before the task's timeout could (None: it can, the
        task would not use it, or it is not known)."""
        reservation = cluster.default_reservation
        mode = _supply_mode(state)
        if not reservation or mode not in (None, RESERVATION):
            return None
        capacity = self._capacity(cluster, reservation)
        return self._never_fits(state, cluster, reservation, capacity) or ends_too_soon(
            cluster.name, reservation, capacity, self.ctx.now,
            state.submission.spec.timeout_seconds)

    def ends_too_soon(self, state: TaskState, cluster: Cluster) -> EndsTooSoon | None:
        """The cluster's reservation ends before the task, picked now, could time out
        (None: it does not, or the task would not use it). ``PortError(AWAITING)`` while
        the read is asked on the cluster's workers: the pick waits for it."""
        reservation = cluster.default_reservation
        if not reservation or _supply_mode(state) not in (None, RESERVATION):
            return None
        capacity = self._capacity(cluster, reservation, awaited=True)
        return ends_too_soon(cluster.name, reservation, capacity, self.ctx.now,
                             state.submission.spec.timeout_seconds)

    @staticmethod
    def _never_fits(state: TaskState, cluster: Cluster, reservation: str,
                    capacity: ReservationCapacity) -> NeverFit | None:
        submission = state.submission
        machine = choose_machine(submission.tpu_type, submission.topology,
                                 asked=submission.spec.machine_type,
                                 reserved=capacity.machine_type, multislice=state.slices > 1)
        try:
            shape = slice_shape(submission.tpu_type, submission.topology, machine)
        except TopologyError:
            return None  # intake refuses such a task; nothing to say here
        return never_fits(cluster.name, reservation, capacity, shape, state.slices)

    def can_serve(self, state: TaskState, cluster: Cluster) -> bool:
        """A cluster a waiting task may move to: its reservation is not one that can
        never serve the task, nor one that ends before the task could finish."""
        return self.never_fit(state, cluster) is None

    def _capacity(self, cluster: Cluster, reservation: str, *,
                  awaited: bool = False) -> ReservationCapacity:
        key = (cluster.id, reservation)
        if key not in self.read:
            try:
                self.read[key] = self.ctx.ports.reservations.capacity(cluster, reservation)
            except PortError as error:
                if error.code == AWAITING:  # asked on the cluster's workers: a later tick
                    if awaited:
                        raise
                    return ReservationCapacity()
                # Unknown: the task queues, and provisioning reads the reservation anyway.
                log.warning("reading reservation %s of cluster %s: %s", reservation,
                            cluster.name, error)
                self.read[key] = ReservationCapacity()
        return self.read[key]


def _supply_mode(state: TaskState) -> str | None:
    return state.submission.spec.supply_mode or None


def move_from_stuck_queues(tick: Tick, ctx: HandlerContext) -> None:
    book = _book(tick, ctx)
    settings = ctx.settings
    clusters = {c.id: c for c in ctx.clusters}
    capacities = _Capacities(ctx)
    _move_stuck_holders(tick, ctx, book, clusters)
    for key in book.waiting_queues():
        holders = book.holders(key)
        holder = tick.state(holders[0]) if holders else None
        if holder is None or holder.reason not in STUCK_REASONS:
            continue
        held = int((tick.now - (holder.phase_started_at or tick.now)).total_seconds())
        source = clusters.get(key[0])
        if held < settings.scheduling.replace_after_seconds or source is None:
            continue
        for entry in book.pick_order(key, tick.now):
            state = tick.state(entry.task_id)
            if not _is_waiting(state) or state.placement.moves >= settings.scheduling.max_moves:
                continue
            target = move_target(state.submission.tpu_type, state.submission.topology, key[0],
                                 ctx.clusters, book, _supply_mode(state),
                                 functools.partial(capacities.can_serve, state))
            if target is None:
                break  # no free queue elsewhere: the others of this queue cannot move either
            after = tick.emit(entry.task_id, ev.TaskMoved(
                source.id, source.name, target.id, target.name, str(holder.reason), held,
                state.placement.moves + 1))
            if after is not None:
                book.sync(after)
            break  # one per queue per tick: the target is no longer free


def _move_stuck_holders(tick: Tick, ctx: HandlerContext, book: QueueBook,
                        clusters: dict[str, Cluster]) -> None:
    """A slot holder in ClusterBusy that holds nothing (no pool taken or created) for
    ``FALCON_REPLACE_AFTER_SECONDS`` moves, as a waiting task of its queue would, to
    another active cluster of its TPU type whose queue is empty with the slot free and
    whose reservation has room for it now (TaskMoved, back to Waiting there)."""
    settings = ctx.settings.scheduling
    # Slot holders are acquiring: looking at those, not at every queue, keeps the tick
    # cheap where thousands of queues have no holder in ClusterBusy.
    for holder in tick.candidates(ctx.index.ids(Group.ACQUIRING)):
        source = clusters.get(holder.placement.cluster_id or "")
        if (source is None or holder.status != chart.PENDING
                or holder.reason != chart.PendingReason.CLUSTER_BUSY
                or holder.held_pools or holder.pool.intent is not None
                or holder.placement.moves >= settings.max_moves):
            continue
        key = (source.id, holder.submission.topology)
        held = int((tick.now - (holder.phase_started_at or tick.now)).total_seconds())
        due = ctx.wait_due_at(holder, "ReservationInsufficient")
        if held < settings.replace_after_seconds or (due is not None and tick.now < due):
            continue  # looked at when it tries again: each look reads reservations
        target = move_target(holder.submission.tpu_type, key[1], key[0], ctx.clusters, book,
                             RESERVATION, functools.partial(_has_room, ctx, holder))
        if target is None:
            continue
        after = tick.emit(holder.task_id, ev.TaskMoved(
            source.id, source.name, target.id, target.name, str(holder.reason), held,
            holder.placement.moves + 1))
        if after is not None:
            book.sync(after)


def _has_room(ctx: HandlerContext, state: TaskState, cluster: Cluster) -> bool:
    """The cluster's reservation can give the task all its slices now (creates in
    flight there counted, as provisioning counts them)."""
    reservation = cluster.default_reservation
    if not reservation:
        return False
    try:
        shape = reserved_shape(ctx.ports.reservations, cluster, reservation,
                               state.submission.topology)
        remaining = ctx.ports.reservations.remaining_slices(cluster, reservation, shape)
    except (PortError, TopologyError):
        return False
    in_flight = ctx.index.reserving(cluster.id, reservation)
    return remaining - -(-in_flight // shape.hosts) >= state.slices


def yield_busy_slots(tick: Tick, ctx: HandlerContext) -> None:
    if not ctx.settings.features.preempt_cluster_busy:
        return
    book = _book(tick, ctx)
    policy = book.policy
    for key in book.queue_keys():
        holders = book.holders(key)
        if not holders or not book.waiting_count(key):
            continue
        state = tick.state(holders[0])
        if state is None or state.reason != chart.PendingReason.CLUSTER_BUSY:
            continue
        if state.held_pools:
            # Pools taken over or created in part: yielding would send them back to
            # Waiting with the task, holding capacity no one could use.
            continue
        decision = book.decide(key, tick.now)
        held = policy.effective(state.submission.priority,
                                state.submission.submitted_at or tick.now, tick.now)
        if decision is None or decision.effective <= held:
            continue
        after = tick.emit(state.task_id, ev.SlotYielded(
            decision.winner.task_id, decision.winner.name, decision.effective, held))
        if after is not None:
            book.sync(after)


def _ending(capacities: _Capacities, state: TaskState, cluster: Cluster) -> bool | None:
    """Whether the cluster's reservation ends before the task, picked now, could time
    out; None while that is being read."""
    try:
        return capacities.ends_too_soon(state, cluster) is not None
    except PortError as error:
        if error.code == AWAITING:
            return None
        raise


def lend_stuck_slots(tick: Tick, ctx: HandlerContext) -> None:
    if not ctx.settings.features.best_effort_fifo:
        return
    book = _book(tick, ctx)
    clusters: dict[str, Cluster] = {c.id: c for c in ctx.clusters}
    for key in book.lending_queues():
        cluster = clusters.get(key[0])
        lender = tick.state(book.holders(key)[0])
        if cluster is None or cluster.status != ACTIVE or lender is None or not _can_lend(lender):
            continue
        reservation = cluster.default_reservation
        mode = resolved_mode(_supply_mode(lender), reservation)
        if all(competes(asked, reservation, mode) for asked in book.asked_modes(key)):
            continue  # everyone behind it waits for the same capacity
        loan = choose_borrower((LoanCandidate(e.task_id, e.name, e.actor, e.supply_mode)
                                for e in book.pick_order(key, tick.now)), reservation, mode)
        if loan is None:
            continue
        borrower = tick.state(loan.borrower.task_id)
        if not _is_waiting(borrower) or borrower.placement.cluster_id != key[0]:
            if borrower is not None:
                book.sync(borrower)  # a stale place: lent at the next tick
            continue
        lent = tick.emit(lender.task_id, SlotLent(
            borrower.task_id, borrower.submission.name, loan.supply_mode,
            reservation or "", loan.why))
        after = tick.emit(borrower.task_id, SlotBorrowed(
            key[0], key[1], lender.task_id, lender.submission.name, reservation or "",
            loan.supply_mode, loan.why, loan.passed_over_record(), loan.passed_over_count))
        # Not a turn of the borrower's actor (the queue's last served stays): the loan
        # takes nothing any task passed over could use.
        for state in (lent, after):
            if state is not None:
                book.sync(state)


def _can_lend(state: TaskState) -> bool:
    """A slot holder waiting for room on its reservation and holding nothing: no pool
    taken or created, none asked for (a loan would leave such capacity idle too, but
    a holder with pools is past waiting for its reservation alone)."""
    return (state.status == chart.PENDING and state.reason == chart.PendingReason.CLUSTER_BUSY
            and not state.held_pools and state.pool.intent is None)


def fill_free_slots(tick: Tick, ctx: HandlerContext) -> None:
    book = _book(tick, ctx)
    clusters: dict[str, Cluster] = {c.id: c for c in ctx.clusters}
    capacities = _Capacities(ctx)
    for key in book.free_queues():
        cluster = clusters.get(key[0])
        if cluster is None or cluster.status != ACTIVE:
            continue
        while (decision := book.decide(key, tick.now)) is not None:
            state = tick.state(decision.winner.task_id)
            if not _is_waiting(state) or state.placement.cluster_id != key[0]:
                if state is None:
                    break
                book.sync(state)
                continue
            ending = _ending(capacities, state, cluster)
            if ending is None:
                break  # the reservation's end is being read: picked at a later tick
            if ending:  # its reservation ends first: it waits for another one
                requeued = tick.emit(state.task_id, ev.TaskRequeued(
                    cluster.id, cluster.name, RESERVATION_ENDING))
                book.sync(requeued or state)
                continue
            after = tick.emit(decision.winner.task_id, ev.TaskPicked(
                cluster_id=key[0], topology=key[1], why=decision.why,
                candidates=decision.candidates(), last_actor=decision.last_actor,
                actors_waiting=decision.actors_waiting, priority=decision.winner.priority,
                effective=decision.effective, priorities=decision.priorities(),
            ))
            book.served(key, decision.winner.actor)
            if after is not None:
                book.sync(after)
            break
