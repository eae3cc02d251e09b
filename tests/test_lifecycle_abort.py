"""Abort in every phase (the abort table in ``falcon_es/handlers/abort.py``).

Each test asserts the exact (Status, Reason) sequence of the job table, that nothing
the task started is left running, and what became of its node pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from falcon_es.adapters.sim.config import FaultRule, Span, StockoutConfig
from falcon_es.domain.clock import VirtualClock
from tests.support.harness import (
    Crash, CrashPlan, Harness, Harnesses, flex_cluster, reserved_cluster,
)

Make = Callable[..., Harness]
ABORTED = [("Aborting", None), ("Aborted", None)]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def status_is(h: Harness, task_id: str, status: str,
              reason: str | None = None) -> Callable[[], bool]:
    return lambda: h.statuses().get(task_id) == (status, reason)


def has_event(h: Harness, task_id: str, event: str) -> Callable[[], bool]:
    return lambda: event in h.events(task_id)


def test_abort_before_intake(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1")
    h.abort("t1")
    h.run()
    assert h.history["t1"] == [("Aborted", None)]
    assert h.events("t1") == ["AbortRequested", "TaskAborted"]
    assert h.row("t1")["message"] == "aborted while New" and h.row("t1")["aborted_at"]
    assert h.world.pools(include_deleted=True) == []


def test_abort_while_waiting_leaves_the_queue(make: Make) -> None:
    h = make(reserved_cluster(count=1))
    h.submit("first", sim={"duration_seconds": 60})
    h.clock.advance(1)
    h.submit("second")
    h.clock.advance(1)
    h.submit("third", sim={"duration_seconds": 60})
    h.run(status_is(h, "second", "Pending", "Waiting"))
    h.abort("second")
    h.run()
    assert h.history["second"] == [("Pending", "Waiting"), ("Aborted", None)]
    assert h.events("second")[-2:] == ["AbortRequested", "TaskAborted"]
    assert h.history["third"][-1] == ("Succeeded", None)
    assert "second" not in [e.for_task for e in _retained(h)]
    assert h.live_pools() == []


def test_abort_while_cluster_busy_creates_nothing(make: Make) -> None:
    h = make(reserved_cluster(count=4, in_use=4))
    h.submit("t1")
    h.run(status_is(h, "t1", "Pending", "ClusterBusy"))
    h.abort("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "ClusterBusy"), ("Aborted", None)]
    assert h.row("t1")["message"] == "aborted while Pending/ClusterBusy"
    assert h.world.pools(include_deleted=True) == []


def test_abort_while_the_pool_is_being_created_waits_for_the_create(make: Make) -> None:
    h = make(flex_cluster())
    h.submit("t1")
    h.run(has_event(h, "t1", "NodePoolCreateStarted"))
    h.abort("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), *ABORTED]
    events = h.events("t1")
    assert events[events.index("AbortRequested"):] == [
        "AbortRequested", "NodePoolDeleteRequested", "TaskAborted", "NodePoolDeleted"]
    assert h.row("t1")["message"] == ("aborted while Pending/Provisioning; "
                                      "node pool falcon-t1-2x2 deleted")
    (pool,) = h.world.pools(include_deleted=True)
    # The delete waited for the create to settle.
    assert pool.running_at is not None and pool.deleted_at >= pool.running_at


def test_abort_while_waiting_for_nodes_deletes_the_pool(make: Make) -> None:
    h = make(flex_cluster(stockout=StockoutConfig(first_n=1, duration=None)))
    h.submit("t1")
    h.run(status_is(h, "t1", "Pending", "WaitingForNode"))
    h.abort("t1")
    h.run()
    # The workload waiting for the autoscaled pool's nodes is deleted, then the pool.
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode"), ("Aborting", None),
                               ("Aborted", None)]
    assert h.world.job_state("v6e-flex", "falcon-t1") is None
    assert h.row("t1")["message"] == ("aborted while Pending/WaitingForNode; "
                                      "node pool falcon-t1-2x2 deleted")
    assert h.live_pools() == []


def test_abort_before_the_submit_was_issued_cancels_it(make: Make) -> None:
    """The submit intent is committed but the controller died before issuing it."""
    plan = CrashPlan(effect_named=("submit-job", "falcon-t1"), effect_when="before")
    h = make(reserved_cluster(), plan=plan)
    h.submit("t1")
    with pytest.raises(Crash):
        h.run()
    h.abort("t1")
    h.restart()
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                               ("Pending", "Dispatching"), *ABORTED]
    assert "JobSubmitCancelled" in h.events("t1")
    assert ("submit-job", "falcon-t1") not in plan.done  # never issued
    assert h.world.job_state("v6e-res", "falcon-t1") is None
    assert h.row("t1")["message"] == ("aborted while Pending/Dispatching; "
                                      "node pool falcon-t1-2x2 deleted")
    assert h.live_pools() == []


def test_abort_after_a_submit_whose_outcome_was_lost_deletes_the_job(make: Make) -> None:
    """The Job was created, the controller died before recording it: adopt, then delete."""
    plan = CrashPlan(effect_named=("submit-job", "falcon-t1"), effect_when="after")
    h = make(reserved_cluster(), plan=plan)
    h.submit("t1")
    with pytest.raises(Crash):
        h.run()
    h.abort("t1")
    h.restart()
    h.run()
    assert h.history["t1"][-2:] == ABORTED
    events = h.events("t1")
    assert events[events.index("AbortRequested"):] == [
        "AbortRequested", "JobSubmitted", "JobDeleteRequested", "JobDeleted",
        "NodePoolDeleteRequested", "TaskAborted", "NodePoolDeleted"]
    assert plan.done.count(("submit-job", "falcon-t1")) == 1
    assert h.world.job_state("v6e-res", "falcon-t1") is None
    assert h.live_pools() == []


def test_abort_while_dispatching_deletes_the_job_and_the_pool(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "unschedulable"})
    h.run(has_event(h, "t1", "PodsPending"))
    h.abort("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                               ("Pending", "Dispatching"), *ABORTED]
    events = h.events("t1")
    assert events[events.index("AbortRequested"):] == [
        "AbortRequested", "JobDeleteRequested", "JobDeleted", "NodePoolDeleteRequested",
        "TaskAborted", "NodePoolDeleted"]
    assert h.world.job_state("v6e-res", "falcon-t1") is None and h.live_pools() == []


def test_abort_while_running_hands_the_pool_to_the_next_task(make: Make) -> None:
    h = make(reserved_cluster(count=1))
    h.submit("long", sim={"duration_seconds": 5000})
    h.clock.advance(1)
    h.submit("next", sim={"duration_seconds": 60})
    h.run(status_is(h, "long", "Running"))
    h.abort("long")
    h.run()
    assert h.history["long"] == [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                                 ("Pending", "Dispatching"), ("Running", None), *ABORTED]
    events = h.events("long")
    assert events[events.index("AbortRequested"):] == [
        "AbortRequested", "JobDeleteRequested", "JobDeleted", "NodePoolRetained", "TaskAborted"]
    assert h.row("long")["message"] == ("aborted while Running; "
                                        "node pool falcon-long-2x2 handed over to next")
    assert h.row("long")["aborted_at"] is not None
    assert h.history["next"][-3:] == [("Pending", "Dispatching"), ("Running", None),
                                      ("Succeeded", None)]
    assert "NodePoolReused" in h.events("next")
    assert [p.name for p in h.world.pools(include_deleted=True)] == ["falcon-long-2x2"]
    assert h.live_pools() == []


def test_abort_of_the_task_a_pool_was_kept_for_hands_it_to_another(make: Make) -> None:
    h = make(reserved_cluster(count=1))
    h.submit("a", sim={"duration_seconds": 100})
    for name in ("b", "c"):
        h.clock.advance(1)
        h.submit(name, sim={"duration_seconds": 60})
    h.run(has_event(h, "a", "NodePoolRetained"))
    kept_for = _retained(h)[-1].for_task
    other = "c" if kept_for == "b" else "b"
    h.abort(kept_for)
    h.run()
    assert h.history[kept_for][-1] == ("Aborted", None)
    assert [e.for_task for e in _retained(h)][:2] == [kept_for, other]
    assert h.history[other][-1] == ("Succeeded", None)
    assert "NodePoolReused" in h.events(other)
    assert h.live_pools() == []


def test_a_failing_pool_delete_after_the_abort_keeps_the_status_aborted(make: Make) -> None:
    h = make(reserved_cluster(delete_failures=FaultRule(first_n=2)))
    h.submit("t1", sim={"duration_seconds": 5000})
    h.run(status_is(h, "t1", "Running"))
    h.abort("t1")
    h.run()
    assert h.history["t1"][-2:] == ABORTED
    # A failed delete stays open: the executor tries again, no new request in the log.
    assert h.events("t1")[-5:] == ["NodePoolDeleteRequested", "TaskAborted",
                                   "NodePoolDeleteFailed", "NodePoolDeleteFailed",
                                   "NodePoolDeleted"]
    assert any("failed (attempt 2)" in m for m in h.messages["t1"])
    assert h.row("t1")["message"] == "aborted while Running; node pool falcon-t1-2x2 deleted"
    assert h.live_pools() == []


def test_late_outcomes_while_aborting_are_recorded_not_fatal(make: Make) -> None:
    """The abort arrives while the pool create is still only an intent: its outcome
    lands while Aborting (the chart allows it) and the task still ends Aborted."""
    plan = CrashPlan(effect_named=("create-pool", "falcon-t1-2x2"), effect_when="after")
    h = make(flex_cluster(create_latency={"reservation": Span(60, 60),
                                          "on-demand": Span(60, 60),
                                          "flex-start": Span(60, 60)}), plan=plan)
    h.submit("t1")
    with pytest.raises(Crash):
        h.run()
    h.abort("t1")
    h.restart()
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), *ABORTED]
    events = h.events("t1")
    assert events[events.index("AbortRequested"):][:2] == ["AbortRequested",
                                                           "NodePoolCreateStarted"]
    assert plan.done.count(("create-pool", "falcon-t1-2x2")) == 1  # adopted, not re-created
    assert h.live_pools() == []


def _retained(h: Harness) -> list:
    return [r.event for r in h.app.store.read_after(0) if r.type_name == "NodePoolRetained"]


@pytest.mark.parametrize("phase", ["Provisioning", "WaitingForNode"])
def test_an_abort_while_the_pool_is_created_hands_it_to_the_task_waiting(
        make: Make, phase: str) -> None:
    """The create is followed to its end and the pool goes through the same
    reuse check as any ended task's: the task waiting in the queue gets it, and no
    second pool is created (a 1-VM reservation would make it wait for room first)."""
    h = make(reserved_cluster(count=1))
    h.submit("p", sim={"duration_seconds": 60})
    h.clock.advance(1)
    h.submit("q", sim={"duration_seconds": 60})
    if phase == "Provisioning":
        h.run(has_event(h, "p", "NodePoolCreateStarted"))
    else:
        h.run(status_is(h, "p", "Pending", "WaitingForNode"))
    h.abort("p")
    h.run()
    assert h.history["p"][-1] == ("Aborted", None)
    assert h.row("p")["message"] == (f"aborted while Pending/{phase}; "
                                     "node pool falcon-p-2x2 handed over to q")
    assert h.history["q"][-1] == ("Succeeded", None)
    assert "NodePoolReused" in h.events("q")
    assert "ReservationInsufficient" not in h.events("q")
    assert [p.name for p in h.world.pools(include_deleted=True)] == ["falcon-p-2x2"]
    assert h.live_pools() == []
