"""Provisioning: get the picked task a ready TPU node pool on its cluster.

For a task holding its queue's slot (Pending/Provisioning, ClusterBusy, WaitingForNode):

1. Reuse: an idle pool of the same topology retained on the task's cluster (the one
   handed over to this task first, else any idle one of its queue) -> NodePoolReused.
   A multi-slice task (``slices`` N > 1) takes idle pools of its queue and supply mode
   first, one per slice (NodePoolTaken each, the task stays in Provisioning), and
   creates the rest as below (slices taken leave their names of the task's group
   unused); having taken all N it is ready at once (NodePoolReady). It takes them only
   in the tick in which the rest can be asked for too (the reservation has room for
   them), so a task waiting for room holds no pool it took either. A partial create
   (below), which holds slices anyway, takes idle pools for the slices it lacks
   whenever they are there, before and after its creates, and goes on to its readiness
   check once no slice is missing.
2. Otherwise choose the supply mode: the task's ``supply_mode`` over the cluster
   default (reservation when the cluster has a default reservation, else flex-start).
   Reservation: remaining slices ((count - inUseCount - creates in flight) / hosts per
   slice) against the N slices the task needs; too few -> ReservationInsufficient
   (Pending/ClusterBusy with both numbers), tried again after a backoff and never
   silently replaced by another supply mode. No pool is created until all N fit, so a
   waiting multi-slice task holds no slices -- unless ``multislice_partial_create``
   (``FALCON_MULTISLICE_PARTIAL_CREATE``) is on: then the slices that fit are created
   at once and held, and once their creates are done the rest is asked for the same
   way (ClusterBusy, with the slices still needed, while none fits).
3. NodePoolCreateRequested (an intent; the effect executor creates the pool with its
   deterministic name; N pools named after the first for N slices) ->
   NodePoolCreateStarted(operations) -> follow the operations:
   failed -> NodePoolFailed with the API's words; done -> look at the pool: a 404
   within the create-visibility grace -> NodePoolNotVisible (look again later); ERROR
   -> NodePoolFailed; an autoscaled (flex-start) pool RUNNING -> NodePoolReady at once
   (Dispatching: its nodes come only for the workload's pending pods, and the status
   handler shows the wait for them as WaitingForNode); a fixed-size pool RUNNING with
   fewer Ready nodes than the slice has -> NodesNotReady (Pending/WaitingForNode with
   the registered and Ready counts, retried with backoff); every node Ready ->
   NodePoolReady (Dispatching).

The deadline (NodePoolTimedOut) is enforced by ``handlers.timeouts``. The pool's
scale-down-unneeded time follows the supply mode actually used.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from falcon_es.domain import chart, naming
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.create_operations import ask_create_operation
from falcon_es.domain.handover import needs_disposal
from falcon_es.domain.intents import RESERVATION_CHECK, PoolIntent
from falcon_es.engine.lifecycle_index import Group
from falcon_es.domain.ports import AWAITING, NOT_FOUND, PortError
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import (
    call_failed, call_retry_due_at, failed_calls, gave_up, next_attempt, records_try,
    scheduled_try, wait_delay,
)
from falcon_es.engine.runtime import Tick
from falcon_es.config.settings import Settings
from falcon_es.domain.spec import FLEX_START, ON_DEMAND, RESERVATION, autoscaled
from falcon_es.domain.tpu import SliceShape, choose_machine, machine_types, shape_of
from falcon_es.domain.task import TaskState

log = logging.getLogger("falcon_es.handlers.provisioning")

_POLL_KINDS = frozenset({"NodePoolNotVisible", "NodesNotReady"})


def supply_mode_for(state: TaskState, cluster: Cluster) -> str:
    """The task's own supply mode, else the cluster default: the reservation where the
    cluster has one, flex-start otherwise."""
    asked = state.submission.spec.supply_mode
    if asked:
        return asked
    return RESERVATION if cluster.default_reservation else FLEX_START


def scale_down_seconds(supply_mode: str, settings: Settings) -> int:
    return {
        RESERVATION: settings.lifecycle.scale_down_reservation_seconds,
        ON_DEMAND: settings.lifecycle.scale_down_on_demand_seconds,
        FLEX_START: settings.lifecycle.scale_down_flex_start_seconds,
    }[supply_mode]


def _machine_open(state: TaskState) -> bool:
    """The task's machine type is still to be chosen by its reservation: the one shape
    two machine types make (v5e/v6e 2x4), no pool asked for or taken yet, neither the
    spec nor Multislice deciding it (``tpu.choose_machine``)."""
    submission = state.submission
    return (state.pool.request is None and state.pool.machine_type is None
            and not submission.spec.machine_type and state.slices == 1
            and len(machine_types(submission.tpu_type, submission.topology)) > 1)


def _shape(state: TaskState, reserved: str | None) -> SliceShape:
    """The slice the task's pools are made of: its own, or on the machine type its
    reservation holds while that is still to be chosen."""
    if reserved is None or not _machine_open(state):
        return state.shape
    submission = state.submission
    machine = choose_machine(submission.tpu_type, submission.topology, reserved=reserved)
    return shape_of(submission.tpu_type, submission.topology, machine)


def _fits(state: TaskState, machine: str) -> bool:
    """A pool of ``machine`` VMs can run the task: the task's machine type is that one,
    or still open (then the pool decides it)."""
    return machine == state.machine_type or _machine_open(state)


class _Provisioner:
    """One tick's provisioning decisions, with what they have used up so far."""

    def __init__(self, tick: Tick, ctx: HandlerContext) -> None:
        self.tick = tick
        self.ctx = ctx
        self.ports = ctx.ports
        self.clusters = {c.id: c for c in ctx.clusters}
        self.taken: set[tuple[str, str]] = set()  # (cluster id, pool) reused this tick
        self.handed_over = tick.handed_over_now()
        #: Reservation hosts granted to creates earlier in this tick, which the API
        #: cannot see until the executor has issued them.
        self.granted_hosts: dict[tuple[str, str], int] = {}
        #: The machine type each reservation read this tick holds (None: it names none).
        self.reserved_machines: dict[tuple[str, str], str | None] = {}

    def run(self, state: TaskState) -> None:
        cluster = self.clusters.get(state.placement.cluster_id or "")
        if cluster is None:
            log.error("task %s is provisioning on cluster %s, which is not registered",
                      state.task_id, state.placement.cluster_id)
            return
        if state.pool.intent is None:
            if state.slices > 1:
                self.take(state, cluster)
            elif not self.reuse(state, cluster) and not self._pool_coming(state, cluster):
                self.acquire(state, cluster)
        elif state.pool.intent == PoolIntent.CREATE_STARTED:
            self.follow(state, cluster)

    # ------------------------------------------------------------------- reuse
    def reuse(self, state: TaskState, cluster: Cluster) -> bool:
        """Start the task on an idle pool of its queue: True when it did, or when it
        waits for one (a pool being repaired, a look that failed)."""
        for holder, pool in self._idle_pools(state, cluster):
            verdict = self._idle_pool_usable(holder, pool, cluster)
            if verdict is None:
                continue
            if verdict:
                self.tick.emit(state.task_id, ev.NodePoolReused(
                    pool, holder.task_id,
                    holder.pool.supply_mode or supply_mode_for(state, cluster),
                    holder.machine_type))
                self._handed_over(holder, pool, state)
            return True
        return False

    def _pool_coming(self, state: TaskState, cluster: Cluster) -> bool:
        """An aborting task of this queue still holds a pool (or its create still runs)
        whose fate is not decided: it comes to this task, the queue's slot holder, once
        the abort has followed it to its end, so the task waits for it rather than
        create (or wait for reservation room for) a second pool."""
        topology = state.submission.topology
        for task_id in self.ctx.index.ids(Group.ABORTING):
            other = self.tick.state(task_id)
            if (other is not None and other.status == chart.ABORTING
                    and other.placement.cluster_id == cluster.id
                    and other.submission.topology == topology
                    and needs_disposal(other)
                    and other.pool.intent not in (PoolIntent.FAILED, PoolIntent.NOT_CREATED)):
                return True
        return False

    def take(self, state: TaskState, cluster: Cluster) -> None:
        """A multi-slice task takes idle pools of its queue and supply mode for the
        slices it has no pool for, then creates the rest (or, with every slice taken,
        is ready). Without ``multislice_partial_create`` it takes them only in the tick
        in which the rest can be created too, so a task waiting for room holds nothing."""
        # A task holding pools it took came from a partial create (the setting may have
        # been turned off since): it goes on as one.
        partial = self.ctx.settings.features.multislice_partial_create or bool(state.pool.taken_pools)
        if not partial and not self._due(state):
            return  # the idle pools are looked at when it tries again, not every tick
        supply_mode = supply_mode_for(state, cluster)
        taking, waiting = self._choose_idle(state, cluster, supply_mode)
        rest = state.slices - state.pool.slices_requested - len(taking)
        granted: int | None = None
        if not partial:
            if waiting:
                return
            if rest:
                granted = self._grant(state, cluster, rest)
                if granted is None:
                    return  # nothing taken: the pools stay free for other takers
        state = self._take_all(state, taking, supply_mode)
        if waiting:
            return
        if len(state.pool.taken_pools) < state.slices:
            if granted is None:
                self.acquire(state, cluster)
            else:
                self._create(state, cluster, granted)
        elif state.pool.taken_pools:
            # Every slice on a pool that was running its earlier task's work: as a reused
            # pool, ready at once.
            hosts = state.shape.hosts
            self.tick.emit(state.task_id, ev.NodePoolReady(
                state.pool.taken_pools[0], hosts * len(state.pool.taken_pools)))

    def take_missing(self, state: TaskState, cluster: Cluster) -> tuple[TaskState, bool]:
        """A partial create takes idle pools of its queue for the slices it has neither
        created nor asked for: it holds its slices anyway, and each pool taken is one
        slice less to wait for reservation room for. Returns the task as it is then,
        and whether it waits for an idle pool being repaired (it asks for no slice in
        its place meanwhile)."""
        supply_mode = state.pool.supply_mode or supply_mode_for(state, cluster)
        taking, waiting = self._choose_idle(state, cluster, supply_mode)
        return self._take_all(state, taking, supply_mode), waiting

    def _choose_idle(self, state: TaskState, cluster: Cluster,
                     supply_mode: str) -> tuple[list[tuple[TaskState, str]], bool]:
        """The idle pools of the task's queue and supply mode it can take now, at most
        one per slice it has no pool for, and whether one it would take next is not
        usable yet (being repaired, a look that failed)."""
        taking: list[tuple[TaskState, str]] = []
        for holder, pool in self._idle_pools(state, cluster):
            if state.pool.slices_requested + len(taking) >= state.slices:
                break
            if (holder.pool.supply_mode or supply_mode) != supply_mode:
                continue  # one supply mode per group: the task's pools scale alike
            verdict = self._idle_pool_usable(holder, pool, cluster)
            if verdict is None:
                continue
            if not verdict:
                return taking, True  # wait for it rather than create a pool in its place
            taking.append((holder, pool))
        return taking, False

    def _take_all(self, state: TaskState, taking: list[tuple[TaskState, str]],
                  supply_mode: str) -> TaskState:
        for holder, pool in taking:
            state = self.tick.emit(state.task_id, ev.NodePoolTaken(
                pool, holder.task_id, supply_mode)) or state
            self._handed_over(holder, pool, state)
        return state

    def _handed_over(self, holder: TaskState, pool: str, taker: TaskState) -> None:
        """The holder of several pools records that one of them is the taker's now."""
        if len(holder.held_pools) > 1:
            self.tick.emit(holder.task_id, ev.NodePoolHandedOver(pool, taker.task_id))

    def _idle_pool_usable(self, holder: TaskState, pool: str, cluster: Cluster) -> bool | None:
        """Whether an idle pool can be taken now: True; False: not yet (being repaired,
        a look that failed); None: never (gone or broken: its holder deletes it)."""
        try:
            info = self.ports.node_pools.get(cluster, pool)
        except PortError as error:
            if error.code != NOT_FOUND:
                if error.code != AWAITING:
                    log.warning("idle pool %s on %s: %s", pool, cluster.name, error)
                return False  # look again next tick rather than create a second pool
            info = None
        self.taken.add((cluster.id, pool))
        if info is None or info.status == "ERROR":
            # Gone or broken while idle: let its last holder delete it.
            self.tick.emit(holder.task_id, ev.NodePoolDeleteRequested(pool))
            return None
        return info.status == "RUNNING"

    def _idle_pools(self, state: TaskState, cluster: Cluster) -> list[tuple[TaskState, str]]:
        """Retained pools of this queue and the ended task holding each: those kept for
        this task first."""
        index = self.ctx.index
        idle = []
        for holder_id, pool in index.retained((cluster.id, state.submission.topology)):
            holder = self.tick.state(holder_id)
            if (holder is None or not holder.is_terminal or pool not in holder.retained_idle
                    or (cluster.id, pool) in self.taken
                    or not index.is_holder(holder, pool, self.handed_over)
                    or not _fits(state, holder.machine_type)):
                continue
            idle.append((holder, pool))
        idle.sort(key=lambda held: (held[0].pool.retained[held[1]] != state.task_id, held[1]))
        return idle

    # ----------------------------------------------------------------- acquire
    def acquire(self, state: TaskState, cluster: Cluster) -> None:
        granted = self._grant(state, cluster, state.slices - state.pool.slices_requested)
        if granted is not None:
            self._create(state, cluster, granted)

    def _grant(self, state: TaskState, cluster: Cluster, needed: int) -> int | None:
        """How many of the ``needed`` slices may be created now (every one, except in
        a reservation: those it has room for); None: none now (a backoff runs, the
        reservation is too small or could not be read, or the task failed)."""
        if not self._due(state):
            return None
        if supply_mode_for(state, cluster) != RESERVATION:
            return needed
        pool = naming.pool_name(state.task_id, state.submission.topology)
        reservation = cluster.default_reservation
        if not reservation:
            self.tick.emit(state.task_id, ev.NodePoolFailed(
                pool, f"supply mode reservation was asked for, but cluster {cluster.name} "
                      "has no reservation"))
            return None
        return self._reserve(state, cluster, reservation, pool, needed) or None

    def _due(self, state: TaskState) -> bool:
        """No backoff runs: neither the wait after a too-small reservation nor the one
        after a reservation read that failed."""
        if state.reason == chart.PendingReason.CLUSTER_BUSY:
            due = self.ctx.wait_due_at(state, "ReservationInsufficient")
            if due is not None and self.ctx.now < due:
                return False
        due = call_retry_due_at(state, RESERVATION_CHECK)
        return due is None or self.ctx.now >= due

    def _create(self, state: TaskState, cluster: Cluster, granted: int) -> None:
        """Ask for the task's pools: the ``granted`` slices after those it has."""
        supply_mode = supply_mode_for(state, cluster)
        reserved = self.reserved_machines.get((cluster.id, cluster.default_reservation or ""))
        shape = _shape(state, reserved if supply_mode == RESERVATION else None)
        upto = 0  # every slice still to create
        if state.pool.slices_requested + granted < state.slices:
            upto = state.pool.slices_requested + granted
        self.tick.emit(state.task_id, ev.NodePoolCreateRequested(
            pool_name=naming.pool_name(state.task_id, state.submission.topology),
            supply_mode=supply_mode, machine_type=shape.machine_type,
            node_count=shape.hosts,
            reservation=cluster.default_reservation if supply_mode == RESERVATION else None,
            scale_down_unneeded_seconds=scale_down_seconds(supply_mode, self.ctx.settings),
            slices=state.slices, first_slice=state.pool.slices_requested, upto=upto,
        ))

    def _reserve(self, state: TaskState, cluster: Cluster, reservation: str, pool: str,
                 needed: int) -> int:
        """The slices the reservation grants this task now (less what creates granted
        earlier in this tick will take): every one of the ``needed``, or none; with
        ``multislice_partial_create``, as many as fit."""
        try:
            shape = _shape(state, self._reserved_machine(state, cluster, reservation))
            remaining = self.ports.reservations.remaining_slices(cluster, reservation, shape)
        except PortError as error:
            if error.code == NOT_FOUND:  # Compute deleted it (a calendar-mode one ended)
                self.tick.emit(state.task_id, ev.NodePoolFailed(
                    pool, error.message, reservation_gone=reservation, cluster_name=cluster.name))
            elif error.code != AWAITING:  # awaited: decided once the answer is in
                self._check_failed(state, pool, f"reservation {reservation}: {error.message}")
            return 0
        key = (cluster.id, reservation)
        granted = self.granted_hosts.get(key, 0)
        # Compute counts VMs that exist: creates in flight (asked for in earlier ticks,
        # by any queue, and earlier in this one) are not in its answer yet.
        in_flight = granted + self.ctx.index.reserving(cluster.id, reservation,
                                                       besides=state.task_id)
        remaining -= -(-in_flight // shape.hosts)  # slices of this shape those hosts cover
        if remaining < needed:
            if not (self.ctx.settings.features.multislice_partial_create and remaining > 0):
                found = (reservation, max(remaining, 0), needed)
                shown = state.message_event
                same = (isinstance(shown, ev.ReservationInsufficient)
                        and (shown.reservation, shown.remaining, shown.needed) == found)
                wait_tried(self.tick, self.ctx, state, "ReservationInsufficient", same,
                           lambda attempt: ev.ReservationInsufficient(*found, attempt))
                return 0
            needed = remaining  # a part now, the rest once it fits
        self.granted_hosts[key] = granted + needed * shape.hosts
        return needed

    def _reserved_machine(self, state: TaskState, cluster: Cluster,
                          reservation: str) -> str | None:
        """The machine type the reservation holds, read (once a tick) only for a task
        whose shape it decides."""
        if not _machine_open(state):
            return None
        key = (cluster.id, reservation)
        if key not in self.reserved_machines:
            self.reserved_machines[key] = self.ports.reservations.capacity(
                cluster, reservation).machine_type
        return self.reserved_machines[key]

    def _check_failed(self, state: TaskState, pool: str, words: str) -> None:
        """Compute did not answer the capacity read: record the attempt (the Message
        shows it) and read again after the compute backoff, or give up."""
        retrying = call_failed(state, RESERVATION_CHECK, words, self.ctx.settings.retry)
        if retrying is None:
            attempts = failed_calls(state, RESERVATION_CHECK) + 1
            self.tick.emit(state.task_id, ev.NodePoolFailed(pool, gave_up(attempts, words)))
            return
        log.warning("task %s: %s; attempt %d, next in %ds", state.task_id, words,
                    retrying.attempt, retrying.retry_in_seconds)
        self.tick.emit(state.task_id, retrying)

    # ------------------------------------------------------------------ follow
    def follow(self, state: TaskState, cluster: Cluster) -> None:
        if lacks_slices(state):
            # A partial create: idle pools of its queue first, for the slices it lacks
            # (taking one in ClusterBusy makes it Provisioning: the readiness check
            # below then says whether it is ready or still asks for the rest).
            state, waiting = self.take_missing(state, cluster)
            if waiting:
                return
        pool = state.pool.name or ""
        if state.reason == chart.PendingReason.CLUSTER_BUSY:
            # A partial create holding its first slices, waiting for room for the rest.
            self.acquire(state, cluster)
            return
        if state.retries.kind in _POLL_KINDS:
            # Looking again after a 404 or unready nodes: the create operation had
            # finished without error before either was recorded, and a finished
            # operation never changes, so only the retry's time matters.
            due = self.ctx.wait_due_at(state, state.retries.kind)
            if due is not None and self.ctx.now < due:
                return
            polled = self.ctx.polls.due(state)  # the last look failed: not before
            if polled is not None and self.ctx.now < polled:
                return
        elif state.pool.operation or state.pool.slice_operations:
            operation = ask_create_operation(state, cluster, self.ctx)
            if operation is None or not operation.done:
                return
            if operation.error:
                self.tick.emit(state.task_id, ev.NodePoolFailed(pool, operation.error))
                return
        ready = registered = 0
        for name in state.node_pools:
            try:
                info = self.ports.node_pools.get(cluster, name)
            except PortError as error:
                if error.code == NOT_FOUND:
                    self._not_visible(state, name)
                elif error.code != AWAITING:  # awaited: looked at again next tick
                    log.warning("pool %s on %s: %s", name, cluster.name, error)
                    self._look_again_later(state)
                return
            if info.status == "ERROR":
                self.tick.emit(state.task_id, ev.NodePoolFailed(
                    name, info.status_message or f"node pool {name} is in status ERROR"))
                return
            if info.status != "RUNNING":
                self._look_again_later(state)  # still provisioning, or being repaired
                return
            if autoscaled(state.pool.supply_mode):
                continue  # its nodes come for the workload's pods: no need to count
            try:
                counts = self.ports.edges.for_cluster(cluster).node_counts(name)
            except PortError as error:
                if error.code != AWAITING:
                    log.warning("nodes of pool %s on %s: %s", name, cluster.name, error)
                    self._look_again_later(state)
                return
            ready += counts.ready
            registered += counts.registered
        shape = state.shape
        total = shape.hosts * len(state.node_pools)
        partial = state.pool.slices_requested < state.slices
        if ready >= total and partial:
            # The part created is up (its VMs count in inUseCount now): ask for the rest.
            self.acquire(state, cluster)
        elif ready >= total or autoscaled(state.pool.supply_mode):
            self.tick.emit(state.task_id, ev.NodePoolReady(pool, ready))
        elif partial:
            self._look_again_later(state)  # no WaitingForNode before every slice is asked for
        else:
            shown = state.message_event
            same = (isinstance(shown, ev.NodesNotReady)
                    and (shown.pool_name, shown.ready, shown.total, shown.registered)
                    == (pool, ready, total, registered))
            wait_tried(self.tick, self.ctx, state, "NodesNotReady", same,
                       lambda attempt: ev.NodesNotReady(pool, ready, total, attempt, registered))

    def _look_again_later(self, state: TaskState) -> None:
        """Nothing to record yet (or a call failed): the next look waits a poll
        interval, so neither a slow pool nor an error turns it into a call per tick."""
        self.ctx.polls.polled(state, self.ctx.now + dt.timedelta(
            seconds=self.ctx.settings.lifecycle.operation_poll_seconds), self.ctx.now)

    def _not_visible(self, state: TaskState, pool: str) -> None:
        """The grace runs from the first 404 after the create finished: GKE's listing
        lags the operation, and a long flex-start create must not use the grace up."""
        grace = self.ctx.settings.lifecycle.create_visibility_grace_seconds
        since = (state.retries.not_visible_since if state.retries.kind == "NodePoolNotVisible"
                 else None) or self.ctx.now
        waited = (self.ctx.now - since).total_seconds()
        if waited < grace:
            self.tick.emit(state.task_id, ev.NodePoolNotVisible(
                pool, next_attempt(state, "NodePoolNotVisible")))
            return
        self.tick.emit(state.task_id, ev.NodePoolFailed(
            pool, f"node pool {pool} still not found {waited:.0f}s after its create finished "
                  f"(create-visibility grace {grace}s)"))


def wait_tried(tick: Tick, ctx: HandlerContext, state: TaskState, kind: str, same: bool,
               event: Callable[[int], ev.Event]) -> None:
    """A try of the wait ``kind`` found what it waits on not there yet. It is recorded
    (``event`` of the try's number) when what it found changed, or at a checkpoint
    (``records_try``); otherwise it appends nothing and the try's number and the next
    one's moment are kept in memory, where a restarted controller reconstructs them
    from the retry schedule (``scheduled_try``)."""
    tried = ctx.polls.tried(state)
    if tried is not None:
        attempt = tried.attempt + 1
    else:
        attempt = scheduled_try(state, kind, ctx.settings.retry, ctx.now)
    if not same or records_try(attempt):
        tick.emit(state.task_id, event(attempt))
        return
    ctx.polls.polled(state, ctx.now + wait_delay(state, kind, attempt, ctx.settings.retry),
                     ctx.now, attempt)


def lacks_slices(state: TaskState) -> bool:
    """A partial create (``multislice_partial_create``) whose creates so far leave
    slices without a pool."""
    return (state.pool.intent == PoolIntent.CREATE_STARTED
            and state.pool.slices_requested < state.slices)


def provision(tick: Tick, ctx: HandlerContext) -> None:
    """Move every task that holds a slot one step towards a ready pool."""
    work = [s for s in tick.candidates(ctx.index.ids(Group.ACQUIRING))
            if s.status == chart.PENDING and s.reason in chart.ACQUIRING_REASONS]
    if not work:
        return
    provisioner = _Provisioner(tick, ctx)
    index = ctx.index
    touched = {s.task_id for s in tick.touched()}
    for state in work:
        fresh = tick.state(state.task_id)
        if (fresh is None or fresh.status != chart.PENDING
                or fresh.reason not in chart.ACQUIRING_REASONS):
            continue
        if lacks_slices(fresh) and fresh.placement.cluster_id and index.retained(
                (fresh.placement.cluster_id, fresh.submission.topology)):
            provisioner.run(fresh)  # an idle pool for a slice it lacks: no waiting for polls
            continue
        if (fresh.task_id not in touched and fresh.pool.intent == PoolIntent.CREATE_STARTED
                and fresh.retries.kind in _POLL_KINDS):
            # Waiting for a retry: its wake moment (no later than the retry) says
            # whether ``follow`` has anything to do yet, without working the retry out.
            wake = index.wake_at(fresh.task_id)
            if wake is not None and ctx.now < wake:
                continue
        if (fresh.task_id not in touched and fresh.pool.intent == PoolIntent.CREATE_STARTED
                and fresh.retries.kind not in _POLL_KINDS):
            # A running create operation asked a moment ago: nothing to ask it yet.
            due = ctx.polls.due(fresh)
            if due is not None and ctx.now < due:
                continue
        provisioner.run(fresh)
