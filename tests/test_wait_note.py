"""The Waiting Message says why a task waits and when it is expected to start: the
slot holder and its state since when, a full reservation's numbers, and an expected
start from the queue's recent slot holds; in English and Chinese."""

from __future__ import annotations

import datetime as dt

from falcon_es import events as ev
from falcon_es.eta import FLOOR, WINDOW, SlotTimes
from falcon_es.simulate import EtaLog
from tests.test_scheduling_properties import World

KEY = ("c0", "2x2")


def _three_waiting(lang: str = "en") -> tuple[World, list[str]]:
    world = World(cluster_count=1, lang=lang)
    ids = []
    for actor in ("ann", "bob", "cid"):  # a second apart; ann's task takes the slot
        ids.append(world.arrive(actor, "2x2"))
        world.tick()
        world.now += dt.timedelta(seconds=1)
    return world, ids


def test_the_message_names_the_slot_holder_and_its_state_since_when() -> None:
    world, (held, first, second) = _three_waiting()
    assert world.conn.messages[first] == (
        "#1, next in line; slot held by ann: ann-job-1 (Provisioning since 2026-11-01 09:00 UTC)")
    world.now = world.now.replace(minute=3)
    world.emit(held, ev.ReservationInsufficient("v6e-res", 0, 1, 1))
    world.tick()
    assert world.conn.messages[second] == (
        "#2, 1 ahead (bob: bob-job-2); slot held by ann: ann-job-1 (ClusterBusy since "
        "2026-11-01 09:03 UTC); reservation v6e-res full: 0 slice(s) free, 1 needed")


def test_the_message_in_chinese() -> None:
    world, (_, first, _) = _three_waiting("zh")
    assert world.conn.messages[first] == (
        "队列位置 #1，下一个；资源槽被 ann: ann-job-1 占用（自 2026-11-01 09:00 UTC 起 Provisioning）")


def test_the_expected_start_follows_the_queues_slot_holds() -> None:
    world, (held, first, second) = _three_waiting()
    later = world.arrive("dee", "2x2")
    world.tick()
    assert "expected start" not in world.conn.messages[later]  # no slot hold measured yet
    world.now = world.now.replace(minute=10, second=0)
    world.free(held, fail=False)  # ann's task ran after holding the slot 10 minutes
    world.tick()  # bob's task takes the slot
    assert world.conn.messages[second].endswith(
        "(Provisioning since 2026-11-01 09:10 UTC); expected start ~2026-11-01 09:20 UTC")
    assert world.conn.messages[later].endswith("expected start ~2026-11-01 09:30 UTC")
    rows = world.view.wait(KEY, world.now).estimate
    assert rows is not None and rows.step == dt.timedelta(minutes=10)


def test_a_holder_past_the_usual_hold_is_expected_to_end_soon_not_at_once() -> None:
    times = SlotTimes()
    now = dt.datetime(2026, 11, 1, 10)
    assert times.estimate(KEY, now, None) is None
    for seconds in (200.0, 600.0, 700.0):
        times.record(KEY, seconds)
    assert times.typical(KEY) == 500.0, "the mean: the waits told are sums of holds"
    fresh = times.estimate(KEY, now, now - dt.timedelta(seconds=200))
    assert fresh is not None and fresh.first == now + dt.timedelta(seconds=300)
    late = times.estimate(KEY, now, now - dt.timedelta(hours=2))
    assert late is not None and late.first == now + dt.timedelta(seconds=500 * FLOOR)
    assert late.start(2) == late.first + dt.timedelta(seconds=1000)
    free = times.estimate(KEY, now, None)
    assert free is not None and free.first == now
    for _ in range(WINDOW):
        times.record(KEY, 60.0)
    assert times.typical(KEY) == 60.0, "only the recent holds count"


def test_simulate_measures_each_expected_start_against_the_pick() -> None:
    log = EtaLog()
    t0 = dt.datetime(2026, 1, 5, 9)
    minutes = lambda m: t0 + dt.timedelta(minutes=m)  # noqa: E731
    log.record("a", minutes(0), minutes(10))  # at submit: 10 min, picked after 20: 50%
    log.record("a", minutes(10), minutes(20))  # then 10 more, picked after 10: 0%
    log.record("a", minutes(10), minutes(18))  # the last rendering of a moment counts
    log.record("b", minutes(0), minutes(0))  # told 'now', picked 30 s later: 50% of a minute
    log.record("d", minutes(0), minutes(0))  # told 'now', picked then: 0%
    log.record("c", minutes(0), minutes(5))  # never picked: not counted
    report = log.report({"a": minutes(20), "b": t0 + dt.timedelta(seconds=30), "d": t0})
    assert report["tasks_with_estimate"] == 3
    assert report["at_submit"] == {"median": 0.5, "p90": 0.5, "count": 3}
    assert report["at_every_refresh"] == {"median": 0.35, "p90": 0.5, "count": 4}
