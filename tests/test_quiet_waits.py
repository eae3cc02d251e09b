"""A wait costs the log nothing per unit of time: a task kept waiting for a
virtual week appends when what it waits on changes (and at doubling checkpoints of its
tries, so its Message's count stays within a factor of two), not at every try; a
controller restarted midway goes on counting the tries on the retry schedule, and a
replay of the log rebuilds the job table exactly."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable


from falcon_es.adapters.sim.config import FaultRule, StockoutConfig
from falcon_es.config.settings import Settings
from falcon_es.projections import replay
from tests.support.harness import Harness, flex_cluster, reserved_cluster

Make = Callable[..., Harness]
WEEK = 7 * 24 * 3600
#: The issue's bound on the events of a task kept waiting for a week.
MOST_EVENTS = 50


def _half_a_week(h: Harness) -> None:
    end = h.clock.now() + dt.timedelta(seconds=WEEK / 2)
    h.run(lambda: h.clock.now() >= end, max_steps=20_000, max_seconds=WEEK)


def _tries(h: Harness, task_id: str, kind: str) -> list[int]:
    return [r.event.attempt for r in h.app.store.read_stream(task_id) if r.type_name == kind]


def test_a_week_in_cluster_busy_through_a_restart(make: Make) -> None:
    h = make(reserved_cluster(count=4, in_use=4))
    h.submit("t1")
    _half_a_week(h)
    before = h.row("t1")["message"]
    tries_before = _tries(h, "t1", "ReservationInsufficient")
    h.restart()
    assert h.row("t1")["message"] == before  # the fold after the restart says the same
    _half_a_week(h)
    assert h.statuses()["t1"] == ("Pending", "ClusterBusy")
    assert len(h.events("t1")) <= MOST_EVENTS
    tries = _tries(h, "t1", "ReservationInsufficient")
    # About 2,000 tries in a week (every 300 s once the backoff is at its longest),
    # recorded at 1, 2, 4, ...: the restarted controller counted on where the schedule
    # had got to, not from 1.
    assert tries[:len(tries_before)] == tries_before
    assert tries == sorted(set(tries)) and tries[-1] >= 1024
    assert tries[len(tries_before)] > tries_before[-1]
    message = h.row("t1")["message"]
    assert f"retry {tries[-1]}, waiting since 2026-" in message
    assert h.world.pools(include_deleted=True) == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_week_waiting_for_nodes_under_retention_through_a_restart(
        make: Make, db_url: str) -> None:
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600)
    # The first two pools never get nodes: t1's, and that of the task that comes later.
    h = make(flex_cluster(stockout=StockoutConfig(first_n=2, duration=None)), settings=settings)
    h.submit("t1")
    _half_a_week(h)
    before = h.row("t1")["message"]
    h.restart()
    assert h.row("t1")["message"] == before
    _half_a_week(h)
    assert h.statuses()["t1"] == ("Pending", "WaitingForNode")
    events = h.events("t1")
    assert len(events) <= MOST_EVENTS
    assert events.count("NodeWaitExtended") == 1  # kept once, looked at every 10 min since
    assert "kept after 3600s without nodes" in h.row("t1")["message"]
    assert h.live_pools() == ["falcon-t1-2x2"]
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []
    # What it waits on changes: a task of another topology comes to wait on the
    # cluster, and the next look (at most 10 minutes on) lets the pool go.
    h.submit("t2", topology="4x4")
    h.run(lambda: h.statuses()["t1"][0] == "Failed", max_steps=2000, max_seconds=900)
    assert h.statuses()["t1"] == ("Failed", "NodePoolTimeout")


def test_a_week_of_refused_pool_deletes_through_a_restart(make: Make) -> None:
    """GKE refuses the delete of an ended task's pool for a week: the executor goes on
    trying on the GKE backoff, and the log records the tries at 1, 2, 4, ... only (the
    refusal stays of one kind); a restarted controller counts on from the schedule, and
    the note says how many tries and since when."""
    h = make(reserved_cluster(delete_failures=FaultRule(probability=1.0)))
    h.submit("t1", sim={"duration_seconds": 60})
    h.run(lambda: h.statuses()["t1"] == ("Succeeded", None))
    _half_a_week(h)
    before = h.row("t1")["message"]
    tries_before = _tries(h, "t1", "NodePoolDeleteFailed")
    h.restart()
    assert h.row("t1")["message"] == before
    _half_a_week(h)
    assert h.statuses()["t1"] == ("Succeeded", None)
    assert len(h.events("t1")) <= MOST_EVENTS
    tries = _tries(h, "t1", "NodePoolDeleteFailed")
    assert tries[:len(tries_before)] == tries_before
    assert tries == sorted(set(tries)) and tries[-1] >= 1024
    assert tries[len(tries_before)] > tries_before[-1]
    message = h.row("t1")["message"]
    assert f"deleting node pool falcon-t1-2x2 failed (attempt {tries[-1]}): " in message
    assert message.endswith(", failing since 2026-11-01 09:02 UTC")
    assert h.live_pools() == ["falcon-t1-2x2"]
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []
