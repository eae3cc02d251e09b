"""The abort handler: what an Aborting task asks for in each phase the abort found it
in, and that it becomes Aborted only once nothing it started is left open."""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.handlers import abort
from tests.support.bench import SQLITE_ONLY, HandlerBench, HandlerBenches, reserved_cluster

pytestmark = SQLITE_ONLY


def aborted(bench: HandlerBench, task_id: str, phase: str) -> None:
    """The upper layer's abort, as intake folds it into the log."""
    bench.given(task_id, ev.AbortRequested(bench.clock.now(), phase))


def test_a_task_with_nothing_started_is_aborted_at_once(make_bench: HandlerBenches) -> None:
    bench = make_bench(abort.advance_aborts, reserved_cluster(count=0))
    bench.bring("queued", "waiting")
    aborted(bench, "queued", "Pending/Waiting")
    bench.bring("busy", "picked")
    bench.given("busy", ev.ReservationInsufficient("v6e-res-r", 0, 1, 1))
    aborted(bench, "busy", "Pending/ClusterBusy")

    assert sorted(bench.run(), key=lambda pair: pair[0]) == [
        ("busy", ev.TaskAborted("Pending/ClusterBusy")),
        ("queued", ev.TaskAborted("Pending/Waiting"))]
    row = bench.row("queued")
    assert (row["status"], row["message"]) == ("Aborted", "aborted while Pending/Waiting")
    assert row["aborted_at"] is not None


def test_a_pool_create_in_flight_is_waited_out_then_the_pool_is_deleted(
        make_bench: HandlerBenches) -> None:
    """GKE refuses to delete a pool while its create operation runs: the abort waits
    for the create to settle. A create asked for whose outcome the log does not hold
    yet may be issued at any moment: that task waits as well."""
    bench = make_bench(abort.advance_aborts, reserved_cluster())
    bench.bring("started", "create-started")
    aborted(bench, "started", "Pending/Provisioning")
    bench.bring("requested", "create-requested")
    aborted(bench, "requested", "Pending/Provisioning")

    assert bench.run() == []
    assert bench.state("started").status == "Aborting"

    bench.advance(60)  # the create operation is done
    assert bench.run() == [("started", ev.NodePoolDeleteRequested("falcon-started-2x2")),
                           ("started", ev.TaskAborted("Pending/Provisioning"))]
    assert bench.state("requested").status == "Aborting"


def test_a_running_job_is_deleted_first_then_its_pool(make_bench: HandlerBenches) -> None:
    bench = make_bench(abort.advance_aborts, reserved_cluster())
    bench.bring("t1", "running")
    aborted(bench, "t1", "Running")

    assert bench.run() == [("t1", ev.JobDeleteRequested("falcon-t1", "abort"))]
    assert bench.run() == []  # the delete is in flight

    bench.given("t1", ev.JobDeleted("falcon-t1"))
    assert bench.run() == [("t1", ev.NodePoolDeleteRequested("falcon-t1-2x2")),
                           ("t1", ev.TaskAborted("Running"))]


def test_the_pool_of_an_aborted_task_goes_to_the_next_task_of_its_queue(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(abort.advance_aborts, reserved_cluster())
    bench.bring("t1", "running")
    bench.bring("next", "waiting")
    bench.bring("other-shape", "waiting", topology="4x4")
    aborted(bench, "t1", "Running")
    bench.given("t1", ev.JobDeleteRequested("falcon-t1", "abort"), ev.JobDeleted("falcon-t1"))

    assert bench.run() == [("t1", ev.NodePoolRetained("falcon-t1-2x2", "next")),
                           ("t1", ev.TaskAborted("Running"))]


def test_a_submit_in_flight_is_left_to_the_executor(make_bench: HandlerBenches) -> None:
    """The executor cancels a submit it has not issued (or adopts one an earlier
    controller issued): the handler neither asks for a delete of a Job that may not
    exist nor ends the task while the submit is open."""
    bench = make_bench(abort.advance_aborts, reserved_cluster())
    bench.bring("t1", "submit-requested")
    aborted(bench, "t1", "Pending/Dispatching")

    assert bench.run() == []

    bench.given("t1", ev.JobSubmitCancelled("falcon-t1"))
    assert bench.run() == [("t1", ev.NodePoolDeleteRequested("falcon-t1-2x2")),
                           ("t1", ev.TaskAborted("Pending/Dispatching"))]
