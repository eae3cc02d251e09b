"""The dispatch handler: once a task's pool is ready, ask for its Job (once)."""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.handlers import dispatch
from tests.support.bench import SQLITE_ONLY, HandlerBenches, reserved_cluster

pytestmark = SQLITE_ONLY


def test_a_task_whose_pool_is_ready_asks_for_its_job_on_that_pool(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    bench.bring("t1", "pool-ready")

    assert bench.run() == [("t1", ev.JobSubmitRequested("falcon-t1", "falcon-t1-2x2"))]
    assert bench.state("t1").job_intent == "submit-requested"
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == ("Pending", "Dispatching")


def test_a_pool_handed_over_is_used_under_its_own_name(make_bench: HandlerBenches) -> None:
    """A reused pool keeps the name its first task gave it: the Job must go there, not
    to a pool named after the task that takes it over."""
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    bench.bring("t2", "picked")
    bench.given("t2", ev.NodePoolReused("falcon-t1-2x2", "t1", "reservation"))

    assert bench.run() == [("t2", ev.JobSubmitRequested("falcon-t2", "falcon-t1-2x2"))]


def test_the_job_is_asked_for_once(make_bench: HandlerBenches) -> None:
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    bench.bring("t1", "pool-ready")
    bench.bring("t2", "submitted")

    assert bench.run() == [("t1", ev.JobSubmitRequested("falcon-t1", "falcon-t1-2x2"))]
    assert bench.run() == []


def test_nothing_is_asked_for_before_the_pool_is_ready(make_bench: HandlerBenches) -> None:
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    bench.bring("creating", "create-started")
    bench.bring("waiting", "waiting")
    bench.advance(120)  # the pool is RUNNING with its node Ready on the world: only the log counts

    assert bench.run() == []


def test_an_abort_that_came_before_the_submit_keeps_the_job_from_being_asked_for(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    bench.bring("t1", "pool-ready")
    bench.given("t1", ev.AbortRequested(bench.clock.now(), "Pending/Dispatching"))

    assert bench.run() == []


def test_every_ready_task_is_dispatched_in_the_same_tick(make_bench: HandlerBenches) -> None:
    bench = make_bench(dispatch.dispatch, reserved_cluster())
    for task_id in ("a", "b", "c"):
        bench.bring(task_id, "pool-ready")

    emitted = bench.run()

    assert sorted(emitted, key=lambda pair: pair[0]) == [
        (t, ev.JobSubmitRequested(f"falcon-{t}", f"falcon-{t}-2x2")) for t in ("a", "b", "c")]
