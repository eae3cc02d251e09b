"""Priorities: the classes and range, aging on its grid, the spec field, the settings,
and the pick that serves them (with the record of what it compared)."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_es.domain import events as ev
from falcon_es.domain.priority import PriorityError, PriorityPolicy, parse_classes
from falcon_es.config.settings import Settings, SettingsError
from falcon_es.domain.spec import SpecError, SpecLimits, parse_spec
from tests.test_scheduling_properties import World

T0 = dt.datetime(2026, 11, 1, 9, 0, 0)  # on the 5-minute grid
POLICY = PriorityPolicy()  # low -100, normal 0, high 100; 10 points per 300 s
SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}


def test_classes_and_integers_resolve_within_the_range() -> None:
    assert POLICY.resolve("high") == 100
    assert POLICY.resolve("low") == -100
    assert POLICY.resolve(7) == 7
    for bad in (101, -101, "urgent", True, 1.5, None):
        with pytest.raises(PriorityError):
            POLICY.resolve(bad)


def test_aging_counts_whole_intervals_of_one_grid_and_stops_at_the_highest_class() -> None:
    assert POLICY.effective(0, T0, T0 + dt.timedelta(seconds=299)) == 0
    assert POLICY.effective(0, T0, T0 + dt.timedelta(seconds=300)) == 10
    # Submitted late in an interval: the grid's next boundary counts a whole one.
    late = T0 + dt.timedelta(seconds=290)
    assert POLICY.effective(0, late, late + dt.timedelta(seconds=10)) == 10
    assert POLICY.effective(-100, T0, T0 + dt.timedelta(days=1)) == 100
    assert POLICY.effective(100, T0, T0 + dt.timedelta(days=1)) == 100
    assert PriorityPolicy(points=0).effective(-100, T0, T0 + dt.timedelta(days=1)) == -100
    # The bound: at most this long until a task reaches the highest class.
    assert POLICY.effective(-100, late, late + POLICY.time_to_top(-100)) == 100
    assert POLICY.time_to_top(100) == dt.timedelta(0)


def test_class_settings_parse_and_bad_ones_are_named() -> None:
    assert parse_classes("bulk=-5, normal=0,urgent=20") == (
        ("bulk", -5), ("normal", 0), ("urgent", 20))
    for bad in ("bulk", "a=x", "a=1,a=2", "=3"):
        with pytest.raises(PriorityError):
            parse_classes(bad)
    settings = Settings.from_env({"FALCON_PRIORITY_CLASSES": "bulk=-5,urgent=20",
                                  "FALCON_AGING_POINTS": "0", "FALCON_AGING_INTERVAL": "60",
                                  "FALCON_PREEMPT_CLUSTER_BUSY": "false"})
    assert settings.scheduling.priorities == PriorityPolicy((("bulk", -5), ("urgent", 20)), 0, 60)
    assert settings.features.preempt_cluster_busy is False
    for env, named in (({"FALCON_PRIORITY_CLASSES": "x"}, "FALCON_PRIORITY_CLASSES"),
                       ({"FALCON_AGING_POINTS": "-1"}, "FALCON_AGING_POINTS"),
                       ({"FALCON_AGING_INTERVAL": "0"}, "FALCON_AGING_INTERVAL"),
                       ({"FALCON_PREEMPT_CLUSTER_BUSY": "maybe"}, "FALCON_PREEMPT_CLUSTER_BUSY")):
        with pytest.raises(SettingsError, match=named):
            Settings.from_env(env)


def test_spec_priority_takes_a_class_or_an_integer_and_fails_the_task_otherwise() -> None:
    assert parse_spec(SPEC).priority == 0
    assert parse_spec({**SPEC, "priority": "high"}).priority == 100
    assert parse_spec({**SPEC, "priority": "high"}).to_data()["priority"] == 100
    assert parse_spec({**SPEC, "priority": -3}).priority == -3
    limits = SpecLimits(priorities=PriorityPolicy((("bulk", -5), ("urgent", 20))))
    assert parse_spec({**SPEC, "priority": "urgent"}, limits).priority == 20
    with pytest.raises(SpecError) as raised:
        parse_spec({**SPEC, "priority": 500})
    assert (raised.value.reason, raised.value.field) == ("InvalidField", "priority")
    assert "outside the range -100 to 100" in raised.value.detail
    with pytest.raises(SpecError, match="high"):
        parse_spec({**SPEC, "priority": "high"}, limits)


def _picked_event(world: World, task_id: str) -> ev.TaskPicked:
    state = world.tasks.get(task_id)
    assert state is not None and isinstance(state.message_event, ev.TaskPicked)
    return state.message_event


def test_the_highest_priority_is_picked_first_and_the_pick_records_what_it_compared() -> None:
    world = World(cluster_count=1, policy=PriorityPolicy(points=0))
    low = world.arrive("ann", "2x2", -100)
    normal = world.arrive("bob", "2x2", 0)
    high = world.arrive("cid", "2x2", 100)
    world.tick()  # all three arrive in one tick: the first pick compares them
    assert world.picks[0].task_id == high
    picked = _picked_event(world, high)
    assert (picked.why, picked.priority, picked.effective) == ("priority", 100, 100)
    assert picked.priorities == (
        {"priority": 100, "effective": 100, "waiting": 1},
        {"priority": 0, "effective": 0, "waiting": 1},
        {"priority": -100, "effective": -100, "waiting": 1})
    order = [e.task_id for e in world.view.book.pick_order(("c0", "2x2"), world.now)]
    assert order == [normal, low]
    assert world.conn.messages[normal].startswith("#1,")
    assert world.conn.messages[low].startswith("#2, 1 ahead (bob: bob-job-2)")


def test_an_aged_band_ties_with_the_highest_and_is_served_by_todays_rule() -> None:
    world = World(cluster_count=1, policy=PriorityPolicy(points=100, interval_seconds=60))
    first = world.arrive("ann", "2x2", 100)
    world.tick()  # ann takes the slot
    old = world.arrive("bob", "2x2", -100)
    world.tick()
    world.now += dt.timedelta(minutes=3)  # bob's low task has aged to 100
    new = world.arrive("cid", "2x2", 100)
    world.tick()
    world.free(first, fail=False)
    world.tick()
    assert world.picks[-1].task_id == old  # tied at 100; the earlier submitted wins
    assert _picked_event(world, old).why == "fifo"
    assert world.view.book.pick_order(("c0", "2x2"), world.now)[0].task_id == new


def _busy_holder(settings: Settings = Settings()) -> tuple[World, str]:
    """A low-priority task holding the slot in ClusterBusy (its reservation full)."""
    world = World(cluster_count=1, policy=PriorityPolicy(points=0), settings=settings)
    low = world.arrive("ann", "2x2", -100)
    world.tick()
    world.emit(low, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    return world, low


def test_a_cluster_busy_holder_yields_its_slot_to_a_higher_priority() -> None:
    world, low = _busy_holder()
    world.now += dt.timedelta(seconds=5)
    same = world.arrive("bob", "2x2", -100)
    world.tick()
    assert world.tasks.get(low).reason == "ClusterBusy", "an equal priority does not preempt"
    high = world.arrive("cid", "2x2", 100)
    world.tick()
    yielded = world.tasks.get(low)
    assert (yielded.reason, yielded.cluster_id, yielded.retry_attempt) == ("Waiting", "c0", 0)
    assert yielded.message_event == ev.SlotYielded(high, "cid-job-3", 100, -100)
    assert world.picks[-1].task_id == high
    assert [e.task_id for e in world.view.book.pick_order(("c0", "2x2"), world.now)] == [low, same]
    assert world.conn.messages[low].startswith("#1, next in line; slot held by cid: cid-job-3")


def test_no_preemption_when_the_setting_is_off_or_the_holder_got_further() -> None:
    world, low = _busy_holder(Settings(preempt_cluster_busy=False))
    world.arrive("cid", "2x2", 100)
    world.tick()
    assert world.tasks.get(low).reason == "ClusterBusy"
    world = World(cluster_count=1, policy=PriorityPolicy(points=0))
    provisioning = world.arrive("ann", "2x2", -100)
    world.tick()
    world.arrive("cid", "2x2", 100)
    world.tick()
    assert world.tasks.get(provisioning).reason == "Provisioning"


def _stuck_queue() -> tuple[World, str, str]:
    """c0's slot holder (ann's) in ClusterBusy with bob's task waiting behind it; c1
    just became active, its queue empty."""
    world = World(cluster_count=2, policy=PriorityPolicy(points=0),
                  settings=Settings(replace_after_seconds=900))
    world.set_status(1, "maintenance")
    stuck = world.arrive("ann", "2x2")
    world.tick()
    mover = world.arrive("bob", "2x2")
    world.tick()
    world.emit(stuck, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    world.set_status(1, "active")
    return world, stuck, mover


def test_a_waiting_task_moves_off_a_stuck_queue_to_a_free_one() -> None:
    world, stuck, mover = _stuck_queue()
    world.now += dt.timedelta(seconds=899)
    world.tick()
    assert world.tasks.get(mover).cluster_id == "c0", "not stuck long enough yet"
    world.now += dt.timedelta(seconds=1)
    world.tick()
    moved = world.tasks.get(mover)
    assert moved.message_event is not None and moved.reason == "Provisioning"
    assert (moved.cluster_id, moved.moves) == ("c1", 1)
    assert world.picks[-1].task_id == mover and world.picks[-1].queue == ("c1", "2x2")
    # Its new queue gets stuck too and the old one frees: a slot holder never moves.
    world.emit(mover, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    world.free(stuck, fail=False)
    world.now += dt.timedelta(seconds=1000)
    world.tick()
    assert world.tasks.get(mover).holds_slot and world.tasks.get(mover).cluster_id == "c1"


def test_a_move_names_both_clusters_and_why() -> None:
    world, _, mover = _stuck_queue()
    world.now += dt.timedelta(seconds=1000)
    world.tick()
    assert [(t, e) for t, e in world.decided if isinstance(e, ev.TaskMoved)] == [
        (mover, ev.TaskMoved("c0", "tpu-0", "c1", "tpu-1", "ClusterBusy", 1000, 1))]


@pytest.mark.parametrize("max_moves", [1, 2])
def test_moves_per_task_are_bounded(max_moves: int) -> None:
    world = World(cluster_count=3, policy=PriorityPolicy(points=0),
                  settings=Settings(replace_after_seconds=900, max_moves=max_moves))
    world.set_status(1, "maintenance")
    world.set_status(2, "maintenance")
    stuck = world.arrive("ann", "2x2")
    world.tick()
    mover = world.arrive("bob", "2x2", -100)
    world.tick()
    world.emit(stuck, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    world.set_status(1, "active")
    world.now += dt.timedelta(seconds=900)
    world.tick()  # bob's task moves to c1, where it takes the slot
    world.emit(mover, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    world.set_status(0, "maintenance")
    high = world.arrive("cid", "2x2", 100)
    world.tick()  # cid's task lands on c1 and bob's yields the slot to it
    world.emit(high, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    assert (world.tasks.get(mover).reason, world.tasks.get(mover).moves) == ("Waiting", 1)
    world.set_status(2, "active")
    world.now += dt.timedelta(seconds=900)
    world.tick()
    assert world.tasks.get(mover).cluster_id == ("c1" if max_moves == 1 else "c2")


def test_a_new_task_goes_where_the_fewest_of_its_priority_or_higher_are_ahead() -> None:
    world = World(cluster_count=2, policy=PriorityPolicy(points=0))
    world.set_status(1, "maintenance")
    for actor in ("ann", "bob", "cid"):  # c0: a holder and two low tasks waiting
        world.arrive(actor, "2x2", -100)
    world.tick()
    world.set_status(1, "active")
    world.now += dt.timedelta(seconds=1)
    world.arrive("dee", "2x2", 100)  # c1: dee's takes the slot
    world.tick()
    assert world.tasks.get(world.picks[-1].task_id).cluster_id == "c1"
    high = world.arrive("fay", "2x2", 100)
    world.tick()
    # c0 holds three tasks and c1 one, but one would be ahead of it in each: the tie
    # goes to the name (by queue length alone it went to c1).
    assert world.tasks.get(high).cluster_id == "c0"
    assert world.picks[-1].task_id != high
    assert world.view.book.ahead(("c0", "2x2"), 100) == 2  # its holder and fay's
    assert world.view.book.ahead(("c0", "2x2"), -100) == 4


def test_a_priority_request_applies_to_a_waiting_task_only_and_says_why_not() -> None:
    from falcon_es.domain.priority_requests import (
        PriorityChange, PriorityRefused, judge_priority_request,
    )
    from falcon_es.domain.task import fold

    accepted = ev.TaskAccepted("t", "user-a", {"priority": 0}, "v6e", "2x2", T0)
    chosen = ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ())
    waiting = fold("t", [(accepted, T0), (chosen, T0)])
    picked = fold("t", [(accepted, T0), (chosen, T0),
                        (ev.TaskPicked("c-1", "2x2", "only-waiting", (), None), T0)])
    assert judge_priority_request("t", waiting, "high", POLICY) == PriorityChange(0, 100)
    assert judge_priority_request("t", waiting, 0, POLICY) is None  # nothing to record
    assert judge_priority_request("t", picked, 0, POLICY) is None  # applied before, read again
    refused = judge_priority_request("t", picked, 5, POLICY)
    assert isinstance(refused, PriorityRefused)
    assert "is Pending/Provisioning, no longer waiting" in refused.why
    refused = judge_priority_request("t", None, 5, POLICY)
    assert isinstance(refused, PriorityRefused) and "has no task t" in refused.why
    refused = judge_priority_request("t", waiting, 101, POLICY)
    assert isinstance(refused, PriorityRefused) and "outside the range" in refused.why
