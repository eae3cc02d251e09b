"""The deprovision handler: the fate of an ended task's pool -- handed over to a task
of the same queue, or deleted -- once no create or Job still holds it; failed deletes
retried; retained pools re-homed when their taker went away."""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.handlers import deprovision
from tests.support.bench import (
    SQLITE_ONLY, HandlerBenches, reserved_cluster, without_jitter,
)

pytestmark = SQLITE_ONLY


def test_an_ended_tasks_pool_is_deleted_when_no_task_of_its_queue_waits(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("done", "succeeded")
    bench.bring("other-shape", "waiting", topology="4x4")

    assert bench.run() == [("done", ev.NodePoolDeleteRequested("falcon-done-2x2"))]
    assert bench.run() == []  # decided once
    assert bench.row("done")["status"] == "Succeeded"  # a note, not a new status


def test_the_pool_goes_to_the_slot_holder_without_a_pool_before_waiting_tasks(
        make_bench: HandlerBenches) -> None:
    """The holder of the queue's slot is provisioning right now; a waiting task, even
    an earlier one, would only start after it."""
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("waiting-first", "waiting")
    bench.advance(1)
    bench.bring("slot-holder", "picked")
    bench.bring("done", "succeeded")

    assert bench.run() == [("done", ev.NodePoolRetained("falcon-done-2x2", "slot-holder"))]


def test_a_pool_is_decided_once_its_create_settled_and_only_a_ready_one_is_handed_over(
        make_bench: HandlerBenches) -> None:
    """A task that failed while its create ran: GKE refuses a delete before the create
    operation is done, and a pool that never got ready nodes is no pool to hand over.
    A create refused outright created nothing to delete."""
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("timed-out", "create-started")
    bench.given("timed-out", ev.NodePoolTimedOut("falcon-timed-out-2x2", 1800))
    bench.bring("refused", "create-requested")
    bench.given("refused", ev.NodePoolFailed("falcon-refused-2x2", "Insufficient quota"))
    bench.bring("waiting", "waiting")

    assert bench.run() == []

    bench.advance(60)  # the create operation is done
    assert bench.run() == [("timed-out", ev.NodePoolDeleteRequested("falcon-timed-out-2x2"))]


def test_a_failed_delete_is_not_asked_for_again_by_the_handler(
        make_bench: HandlerBenches) -> None:
    """A failed delete stays an open intent that the effect executor tries again on the
    GKE backoff (tests/test_quiet_waits.py): asking again here would append an event a
    try, for as long as GKE refuses."""
    bench = make_bench(deprovision.deprovision, reserved_cluster(), retry=without_jitter())
    bench.bring("done", "succeeded")
    bench.given("done", ev.NodePoolDeleteRequested("falcon-done-2x2"),
                ev.NodePoolDeleteFailed("falcon-done-2x2", "Cluster is running incompatible "
                                        "operation", 1))

    for _ in range(3):
        bench.advance(10)  # past the gke policy's first delay, and more
        assert bench.run() == []


def test_a_retained_pool_whose_taker_went_away_goes_to_the_next_taker(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("done", "succeeded")
    bench.given("done", ev.NodePoolRetained("falcon-done-2x2", "promised"))
    bench.bring("promised", "waiting")
    bench.advance(1)
    bench.bring("second", "waiting")

    assert bench.run() == []  # the promised task can still take it

    bench.given("promised", ev.AbortRequested(bench.clock.now(), "Pending/Waiting"),
                ev.TaskAborted("Pending/Waiting"))
    assert bench.run() == [("done", ev.NodePoolRetained("falcon-done-2x2", "second"))]

    bench.given("second", ev.AbortRequested(bench.clock.now(), "Pending/Waiting"),
                ev.TaskAborted("Pending/Waiting"))
    assert bench.run() == [("done", ev.NodePoolDeleteRequested("falcon-done-2x2"))]


def test_a_pool_taken_over_is_decided_for_its_last_taker_only(make_bench: HandlerBenches) -> None:
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("first", "succeeded")
    bench.given("first", ev.NodePoolRetained("falcon-first-2x2", "second"))
    bench.bring("second", "picked")
    bench.given("second", ev.NodePoolReused("falcon-first-2x2", "first", "reservation"),
                ev.JobSubmitRequested("falcon-second", "falcon-first-2x2"),
                ev.JobSubmitted("falcon-second", "uid-second"), ev.JobSucceeded(1, 2))

    assert bench.run() == [("second", ev.NodePoolDeleteRequested("falcon-first-2x2"))]


def test_each_pool_of_a_multi_slice_task_is_decided_alone(make_bench: HandlerBenches) -> None:
    """Two single-slice tasks wait: each gets one pool of the ended two-slice task. With
    one waiting, the other pool is deleted; a two-slice task waiting takes both."""
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("ms", "succeeded", slices=2, topology="4x8")
    bench.bring("w1", "waiting", topology="4x8")
    bench.advance(1)
    bench.bring("w2", "waiting", topology="4x8")
    bench.bring("ms-b", "succeeded", slices=2, topology="4x4")
    bench.bring("w3", "waiting", topology="4x4")
    bench.advance(1)
    bench.bring("ms-w", "waiting", topology="2x4", slices=2)
    bench.bring("ms-c", "succeeded", slices=2, topology="2x4")

    assert sorted(bench.run(), key=repr) == sorted([
        ("ms", ev.NodePoolRetained("falcon-ms-4x8", "w1")),
        ("ms", ev.NodePoolRetained("falcon-ms-4x8-s1", "w2")),
        ("ms-b", ev.NodePoolRetained("falcon-ms-b-4x4", "w3")),
        ("ms-b", ev.NodePoolDeleteRequested("falcon-ms-b-4x4-s1")),
        ("ms-c", ev.NodePoolRetained("falcon-ms-c-2x4", "ms-w")),
        ("ms-c", ev.NodePoolRetained("falcon-ms-c-2x4-s1", "ms-w")),
    ], key=repr)


def test_a_taken_pool_goes_on_and_a_create_that_failed_is_deleted(
        make_bench: HandlerBenches) -> None:
    """A two-slice task took a retained pool, and its own slice's create failed: the
    taken pool, which ran, goes to the next task; its own is deleted."""
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("first", "succeeded", topology="4x4")
    bench.given("first", ev.NodePoolRetained("falcon-first-4x4", "ms"))
    bench.bring("ms", "picked", slices=2, topology="4x4")
    bench.given("ms", ev.NodePoolTaken("falcon-first-4x4", "first", "reservation"),
                ev.NodePoolCreateRequested("falcon-ms-4x4", "reservation", "ct6e-standard-4t",
                                           4, "v6e-res-r", 60, slices=2, first_slice=1),
                ev.NodePoolCreateStarted("falcon-ms-4x4", "op-1"),
                ev.NodePoolFailed("falcon-ms-4x4-s1", "no capacity"))
    bench.bring("next", "waiting", topology="4x4")

    assert bench.run() == [("ms", ev.NodePoolRetained("falcon-first-4x4", "next")),
                           ("ms", ev.NodePoolDeleteRequested("falcon-ms-4x4-s1"))]
    assert bench.run() == []  # "first" answers for its pool no more


def test_a_flex_start_pool_goes_only_to_a_task_that_fits_in_its_nodes_life(
        make_bench: HandlerBenches) -> None:
    """Flex-start nodes live at most 7 days: five days after its create, a pool has two
    left, too few for a 3-day timeout and enough for a 1-day one."""
    day = 24 * 3600
    bench = make_bench(deprovision.deprovision, reserved_cluster())
    bench.bring("done", "succeeded", supply_mode="flex-start")
    bench.bring("long", "waiting", supply_mode="flex-start", timeout_seconds=3 * day)
    bench.advance(5 * day)
    assert bench.run() == [("done", ev.NodePoolDeleteRequested("falcon-done-2x2"))]

    bench.bring("done-2", "succeeded", supply_mode="flex-start")
    bench.bring("short", "waiting", supply_mode="flex-start", timeout_seconds=day)
    bench.advance(5 * day)
    assert bench.run() == [("done-2", ev.NodePoolRetained("falcon-done-2-2x2", "short"))]
