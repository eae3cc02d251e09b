"""Property tests of slot lending over random sequences (hypothesis), on the in-memory
world of the pick-rule properties (the real scheduling handlers and queue book): tasks
of every supply mode arrive on clusters with a reservation, slot holders get stuck on
it, their reservation gets room, slots free.

- No task is overtaken by one that competes for the same capacity: a borrower is the
  first task in pick order that does not wait for the lender's reservation, so every
  task it passes waits for that reservation and none needs what the borrower needs.
- The head is never delayed by more than one acquisition: the lender's state and retry
  schedule are untouched by a loan (it goes on the moment its reservation has room),
  a queue never has more than one borrower acquiring beside its holder, and a free
  slot is filled in the tick it frees whether or not a borrower still acquires (the
  next task in line never waits for the loan).
Every pick is still checked against the naive reading of the rule (``World``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from falcon_es.config.settings import Settings
from falcon_es.domain import events as ev
from falcon_es.domain.slot_loans import SlotBorrowed, SlotLent, resolved_mode
from falcon_es.domain.task import TaskState
from tests.test_scheduling_properties import ACTORS, TOPOLOGIES, World

RESERVATION = "res-1"
MODES = (None, "reservation", "flex-start", "on-demand")

step = st.one_of(
    st.tuples(st.just("arrive"),
              st.lists(st.tuples(st.sampled_from(ACTORS), st.sampled_from(TOPOLOGIES),
                                 st.sampled_from(MODES)), min_size=2, max_size=5)),
    # A holder finds its reservation full (twice as likely: loans need stuck holders).
    st.tuples(st.just("stuck"), st.integers(0, 7)),
    st.tuples(st.just("stuck"), st.integers(0, 7)),
    st.tuples(st.just("room"), st.integers(0, 7)),  # a stuck holder's reservation has room
    st.tuples(st.just("run"), st.integers(0, 7)),  # an acquiring task's pods run
    st.tuples(st.just("wait"), st.integers(1, 400)),
)


def _mode(state: TaskState) -> str:
    return resolved_mode(state.submission.spec.supply_mode, RESERVATION)


def _acquiring(world: World, reason: str) -> list[TaskState]:
    return sorted((s for s in world.tasks.all() if s.holds_slot and s.reason == reason),
                  key=lambda s: s.task_id)


def _apply(world: World, kind: str, args: list[Any]) -> None:
    if kind == "arrive":
        for actor, topology, mode in args[0]:
            world.arrive(actor, topology, mode=mode)
    elif kind == "stuck":
        provisioning = [s for s in _acquiring(world, "Provisioning")
                        if _mode(s) == "reservation"]
        if provisioning:
            task = provisioning[args[0] % len(provisioning)]
            world.emit(task.task_id, ev.ReservationInsufficient(RESERVATION, 0, 1, 1))
    elif kind == "room":
        stuck = _acquiring(world, "ClusterBusy")
        if stuck:
            task = stuck[args[0] % len(stuck)]
            world.emit(task.task_id, ev.NodePoolReused("falcon-pool", None, "reservation"))
    elif kind == "run":
        acquiring = _acquiring(world, "Provisioning") + _acquiring(world, "Dispatching")
        if acquiring:
            task = acquiring[args[0] % len(acquiring)]
            if task.reason == "Dispatching":  # its reservation had room: a pool it has
                world.emit(task.task_id, ev.PodsRunning(1, 1))
            else:
                world.free(task.task_id, fail=False)
    else:
        world.now += dt.timedelta(seconds=args[0])


def _check_loans(world: World, before: dict[str, TaskState], decided: int) -> None:
    for stream_id, event in world.decided[decided:]:
        if isinstance(event, SlotBorrowed):
            key = (event.cluster_id, event.topology)
            order = world.orders_before_lending[key]
            borrower = world.tasks.get(stream_id)
            assert borrower is not None and _mode(borrower) != "reservation"
            for passed in order[:order.index(stream_id)]:
                state = world.tasks.get(passed)
                assert state is not None
                # Everyone passed over waits for the lender's reservation; so nobody
                # passed over needs what the borrower needs.
                assert _mode(state) == "reservation", (passed, _mode(state))
                assert _mode(state) != _mode(borrower)
            assert event.passed_over_count == order.index(stream_id)
        elif isinstance(event, SlotLent):
            old, lender = before[stream_id], world.tasks.get(stream_id)
            assert lender is not None and lender.reason == "ClusterBusy"
            assert (lender.retries, lender.phase_started_at, lender.message_event,
                    lender.placement) == (old.retries, old.phase_started_at,
                                          old.message_event, old.placement)


def _check_slots(world: World) -> None:
    book = world.view.book
    for key in book.waiting_queues():
        assert book.holders(key), f"{key}: tasks wait while the slot is free"
        assert len(book.borrowers(key)) <= 1


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=8, max_size=40))
def test_lending_never_overtakes_a_competitor_nor_delays_the_head(
        steps: list[tuple[Any, ...]]) -> None:
    world = World(cluster_count=1, reservation=RESERVATION)
    for kind, *args in steps:
        _apply(world, kind, args)
        before = {s.task_id: s for s in world.tasks.all()}
        decided = len(world.decided)
        world.tick()
        _check_loans(world, before, decided)
        _check_slots(world)
    loans = sum(isinstance(e, SlotBorrowed) for _, e in world.decided)
    event(f"loans: {min(loans, 3)}{'+' if loans >= 3 else ''}")


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=40))
def test_strict_fifo_never_lends(steps: list[tuple[Any, ...]]) -> None:
    world = World(reservation=RESERVATION, settings=Settings(best_effort_fifo=False))
    for kind, *args in steps:
        _apply(world, kind, args)
        world.tick()
    assert not any(isinstance(e, (SlotLent, SlotBorrowed)) for _, e in world.decided)
    assert all(s.placement.borrowed_from is None for s in world.tasks.all())
