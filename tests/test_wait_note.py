"""The Waiting Message says why a task waits and when it is expected to start: the
slot holder and its state since when, a full reservation's numbers, and an expected
start from the queue's recent slot holds; in English and Chinese."""

from __future__ import annotations

import datetime as dt

from falcon_es.domain import events as ev
from falcon_es.domain.eta import (
    CALIBRATED, FLOOR, UNCALIBRATED, WINDOW, Calibration, Estimate, SlotTimes,
)
from falcon_es.engine.eta_error import EtaLog, range_width
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
        "(Provisioning since 2026-11-01 09:10 UTC); expected start ~2026-11-01 09:20 UTC "
        "(likely 2026-11-01 09:12–09:50 UTC)")  # nothing measured yet: a quarter to 4x the wait
    assert world.conn.messages[later].endswith(
        "expected start ~2026-11-01 09:30 UTC (likely 2026-11-01 09:15–10:30 UTC)")
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
    # Of the holds longer than the 200 s spent (600, 700), the median of what is left.
    assert fresh is not None and fresh.first == now + dt.timedelta(seconds=450)
    late = times.estimate(KEY, now, now - dt.timedelta(hours=2))
    assert late is not None and late.first == now + dt.timedelta(seconds=500 * FLOOR)
    # The hold in progress (two hours) counts as a fourth hold: the queue slowed down.
    assert late.step == dt.timedelta(seconds=(3 * 500 + 7200) / 4)
    assert late.start(2) == late.first + 2 * late.step
    assert fresh.step == dt.timedelta(seconds=500), "a hold within the usual changes nothing"
    free = times.estimate(KEY, now, None)
    assert free is not None and free.first == now
    for _ in range(WINDOW):
        times.record(KEY, 60.0)
    assert times.typical(KEY) == 60.0, "only the recent holds count"


def test_simulate_measures_each_expected_start_against_the_pick() -> None:
    log = EtaLog()
    t0 = dt.datetime(2026, 1, 5, 9)
    minutes = lambda m: t0 + dt.timedelta(minutes=m)  # noqa: E731
    told = lambda m, low, high: (minutes(m), minutes(low), minutes(high))  # noqa: E731
    log.record("a", minutes(0), *told(10, 5, 15))  # at submit: 10 min, picked after 20: 50%
    log.record("a", minutes(10), *told(20, 15, 25))  # then 10 more, picked after 10: 0%
    log.record("a", minutes(10), *told(18, 15, 25))  # the last rendering of a moment counts
    log.record("b", minutes(0), *told(0, 0, 1))  # told 'now', picked 30 s later: 50% of a minute
    log.record("d", minutes(0), *told(0, 0, 1))  # told 'now', picked then: 0%
    log.record("c", minutes(0), *told(5, 0, 10))  # never picked: not counted
    report = log.report({"a": minutes(20), "b": t0 + dt.timedelta(seconds=30), "d": t0})
    assert report["tasks_with_estimate"] == 3
    assert report["at_submit"] == {"median": 0.5, "p90": 0.5, "count": 3}
    assert report["at_every_refresh"] == {"median": 0.35, "p90": 0.5, "count": 4}
    # a's first range (5-15 min) missed its pick at 20; b's and d's held theirs.
    assert report["in_range_at_submit"] == round(2 / 3, 3)
    # a's range is 3x wide, b's and d's (under a minute each way) 1x: the median is 1x.
    assert range_width(t0, minutes(5), minutes(15)) == 3.0
    assert range_width(t0, t0, minutes(0.5)) == 1.0, "each end at least a minute"
    assert report["range_width_at_submit"] == 1.0


def test_the_range_is_as_wide_as_the_told_waits_were_off() -> None:
    calibration = Calibration()
    t0 = dt.datetime(2026, 1, 5, 9)
    assert calibration.spread(KEY) == UNCALIBRATED, "nothing compared yet"
    for n in range(WINDOW):  # told 10 minutes each, picked after 10 to 30 minutes
        task = f"t{n}"
        calibration.told(task, KEY, t0, t0 + dt.timedelta(minutes=10))
        calibration.told(task, KEY, t0, t0 + dt.timedelta(minutes=99))  # only the first counts
        calibration.picked(task, t0 + dt.timedelta(minutes=10 + 20 * n / (WINDOW - 1)))
    low, high = calibration.spread(KEY)
    assert 2.7 < high <= 3.0 and low == 1 / high, "off by up to 3x: a third to 3x"
    estimate = Estimate(t0, t0 + dt.timedelta(minutes=10), dt.timedelta(minutes=10),
                        spread=(low, high))
    earliest, latest = estimate.start_range(1)  # told 20 minutes
    assert earliest == t0 + 20 * low * dt.timedelta(minutes=1)
    assert latest == t0 + 20 * high * dt.timedelta(minutes=1)
    # A new queue (fewer than CALIBRATED picks of its own) takes the factor of the tasks
    # told while their queue was new (KEY's first ones, 1 to 1.4x off, not its later
    # ones, up to 3x), its earliest at least the uncalibrated one's: a new queue's first
    # holds are its longest, its told waits err long.
    other = ("c1", "4x4")
    new_low, new_high = calibration.spread(other)
    assert new_low == UNCALIBRATED[0] and 1.0 < new_high < 1.5
    for n in range(CALIBRATED):  # its tasks start 5x sooner than told
        calibration.told(f"o{n}", other, t0, t0 + dt.timedelta(minutes=10))
        calibration.picked(f"o{n}", t0 + dt.timedelta(minutes=2))
    assert calibration.spread(other) == (0.2, 5.0), "its own, now that it has enough"
    assert calibration.spread(KEY) == (low, high), "a new queue's errors widen no other"
    assert calibration.spread(("c2", "2x2")) == (0.2, 5.0), "they widen the next new one"
    before = calibration.spread(KEY)
    calibration.told("gone", KEY, t0, t0 + dt.timedelta(minutes=10))
    calibration.forget("gone")
    calibration.picked("gone", t0 + dt.timedelta(days=3))  # left without a pick: not counted
    assert calibration.spread(KEY) == before


def test_a_new_queue_takes_the_new_queues_range_where_it_is_wider_than_the_default() -> None:
    calibration = Calibration()
    t0 = dt.datetime(2026, 1, 5, 9)
    for n in range(CALIBRATED):  # another new queue's waits came 8x longer than told
        calibration.told(f"t{n}", KEY, t0, t0 + dt.timedelta(minutes=10))
        calibration.picked(f"t{n}", t0 + dt.timedelta(minutes=80))
    assert calibration.spread(("c1", "4x4")) == (1 / 8, 8.0)


def test_a_holders_remaining_time_follows_its_state() -> None:
    """A holder Dispatching is seconds from running, one in ClusterBusy may wait long
    for room: each state's remaining time is measured on its own."""
    times = SlotTimes()
    now = dt.datetime(2026, 11, 1, 10)
    for _ in range(3):  # 20 min holds: 18 of them in ClusterBusy, the last 30 s Dispatching
        times.record(KEY, 1200.0, [("Pending.Provisioning", 1200.0),
                                   ("Pending.ClusterBusy", 1140.0),
                                   ("Pending.Dispatching", 30.0)])
    held = now - dt.timedelta(minutes=19)
    dispatching = times.estimate(KEY, now, held, ("Pending.Dispatching", now))
    assert dispatching is not None and dispatching.first == now + dt.timedelta(seconds=30)
    busy = times.estimate(KEY, now, held, ("Pending.ClusterBusy", now - dt.timedelta(minutes=4)))
    assert busy is not None and busy.first == now + dt.timedelta(seconds=1140 - 240)
    unknown = times.estimate(KEY, now, held, ("Pending.WaitingForNode", now))
    # No record of that state: the whole hold (19 of its 20 min spent).
    assert unknown is not None and unknown.first == now + dt.timedelta(seconds=60)
    past = times.estimate(KEY, now, now - dt.timedelta(minutes=25), ("Pending.WaitingForNode", now))
    assert past is not None and past.first == now + dt.timedelta(seconds=1200 * FLOOR)
    assert dispatching.step == dt.timedelta(minutes=20)


def _pool_leaving_queue(times: SlotTimes, now: dt.datetime) -> None:
    """Ten holds over 10,000 s, every other one taking a pool a run left (20 s) and the
    others creating one (980 s); ten runs of 2,000 s ended in that span, half of them
    leaving their pool to the next pick."""
    at = now - dt.timedelta(seconds=10_000)
    for index in range(10):
        reused = index % 2 == 1
        seconds = 20.0 if reused else 980.0
        at += dt.timedelta(seconds=seconds)
        times.record(KEY, seconds, reused=reused, ended_at=at)
        times.record_run(KEY, 2_000.0, at)


def test_a_queue_picks_faster_the_more_of_its_tasks_run() -> None:
    """Pools are left at the rate the queue's running tasks end: the mix of the last
    holds alone would lag a queue whose running tasks grew."""
    times = SlotTimes()
    now = dt.datetime(2026, 11, 1, 10)
    _pool_leaving_queue(times, now)
    assert times.typical(KEY) == 500.0
    few, many = times.step(KEY, running=1), times.step(KEY, running=20)
    assert few is not None and many is not None
    # Half the run ends are taken: 1 running -> 1/4000 a second; each long hold 980 s.
    assert abs(few - 1 / (1 / 4000 + (1 - 20 / 4000) / 980)) < 1e-6
    assert many < 200.0 < few, (few, many)
    # Without the running count (or any run measured) the mean hold stands.
    assert times.step(KEY, running=None) == 500.0
    assert SlotTimes().step(KEY, running=3) is None


def test_pools_idle_now_go_to_the_next_picks_at_once() -> None:
    times = SlotTimes()
    now = dt.datetime(2026, 11, 1, 10)
    _pool_leaving_queue(times, now)
    estimate = times.estimate(KEY, now, None, running=1, idle=2)
    assert estimate is not None and estimate.first == now
    assert estimate.start(1) == now + dt.timedelta(seconds=20)
    assert estimate.start(2) == now + dt.timedelta(seconds=40)
    assert estimate.start(3) == now + dt.timedelta(seconds=40) + estimate.step
    none_idle = times.estimate(KEY, now, None, running=1)
    assert none_idle is not None and none_idle.start(1) == now + none_idle.step


def test_the_queue_view_times_runs_and_tells_pool_takes_from_other_holds() -> None:
    """The view feeds the estimate what it needs: which holds took a pool a run left,
    and how long the queue's tasks ran."""
    world = World(cluster_count=1)
    for actor in ("ann", "bob", "cid", "dan"):
        world.arrive(actor, "2x2")
        world.tick()
        world.now += dt.timedelta(seconds=1)
    (ann,) = world.slot_holders()
    world.now += dt.timedelta(minutes=10)
    world.emit(ann, ev.NodePoolReady("falcon-pool-a", 1))  # a long hold: 604 s, its own pool
    world.emit(ann, ev.PodsRunning(1, 1))
    world.tick()  # bob takes the slot
    (bob,) = world.slot_holders()
    world.now += dt.timedelta(minutes=1)
    world.free(bob, fail=False)  # a short one: 60 s, a pool taken
    world.now += dt.timedelta(minutes=19)
    world.emit(ann, ev.JobSucceeded(1))  # ann ran 20 min
    world.tick()  # cid takes the slot
    times = world.view.slot_times
    assert times.typical(KEY) == (604 + 60) / 2
    # One run ended since the first hold, and one pick took a pool: p = 1; bob runs and
    # cid will: 2 running, 1200 s a run.
    rate = 2 / 1200
    expected = 1 / (rate + (1 - rate * 60) / 604)
    estimate = world.view.wait(KEY, world.now).estimate
    assert estimate is not None
    assert abs(estimate.step.total_seconds() - expected) < 1e-6, (estimate.step, expected)
    assert estimate.step < dt.timedelta(seconds=(604 + 60) / 2), "not the plain mean"


def test_a_creation_in_progress_longer_than_the_step_is_no_slowdown() -> None:
    """In a queue whose picks are mostly pool takes, a hold longer than the mean step
    is the usual creation; only one longer than the usual long hold says the queue
    slowed down."""
    times = SlotTimes()
    now = dt.datetime(2026, 11, 1, 10)
    _pool_leaving_queue(times, now)
    step = times.step(KEY, running=10)
    assert step is not None and step < 500.0
    creating = times.estimate(KEY, now, now - dt.timedelta(seconds=500), running=10)
    assert creating is not None and abs(creating.step.total_seconds() - step) < 1e-3
    stuck = times.estimate(KEY, now, now - dt.timedelta(seconds=4000), running=10)
    assert stuck is not None and abs(stuck.step.total_seconds() - (step * 10 + 4000) / 11) < 1e-3
