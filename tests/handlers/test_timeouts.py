"""The timeouts handler: a dispatched task's own timeout, counted from its dispatch,
and the provisioning deadline of its supply mode, each at the deadline and not before."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_es.domain import events as ev
from falcon_es.handlers import timeouts
from tests.support.bench import SQLITE_ONLY, HandlerBenches, flex_cluster, reserved_cluster

pytestmark = SQLITE_ONLY


def test_a_running_task_times_out_at_its_deadline_and_not_before(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster())
    bench.bring("t1", "running", timeout_seconds=600)

    bench.advance(599)
    assert bench.run() == []

    bench.advance(1)
    assert bench.run() == [("t1", ev.TaskTimedOut(600, "")),
                           ("t1", ev.JobDeleteRequested("falcon-t1", "timeout"))]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Failed", "Timeout")
    assert bench.run() == []  # an ended task has no deadline left


def test_the_timeout_counts_from_the_dispatch_not_from_the_submission(
        make_bench: HandlerBenches) -> None:
    """Queueing and provisioning do not eat into the task's own time: the clock starts
    when its Job was submitted."""
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster())
    bench.bring("t1", "create-started", timeout_seconds=600)
    bench.advance(500)
    bench.given("t1", ev.NodePoolReady("falcon-t1-2x2", 1),
                ev.JobSubmitRequested("falcon-t1", "falcon-t1-2x2"),
                ev.JobSubmitted("falcon-t1", "uid-t1"))

    bench.advance(599)
    assert bench.run() == []

    bench.advance(1)
    assert [type(e) for _, e in bench.run()] == [ev.TaskTimedOut, ev.JobDeleteRequested]


def test_pods_that_never_ran_time_out_with_what_they_waited_on(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster())
    bench.bring("t1", "submitted", timeout_seconds=300)
    waited_on = "0/1 nodes are available: 1 node(s) had untolerated taint {google.com/tpu}"
    bench.given("t1", ev.PodsPending(waited_on, 3))

    bench.advance(300)

    assert bench.run() == [("t1", ev.TaskTimedOut(300, waited_on)),
                           ("t1", ev.JobDeleteRequested("falcon-t1", "timeout"))]


def test_a_pool_not_ready_in_time_fails_with_its_supply_modes_deadline(
        make_bench: HandlerBenches) -> None:
    """Flex-start may queue for capacity much longer than a reservation takes: each
    supply mode has its own provisioning deadline, counted from the create request."""
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster("res"), flex_cluster("flex"),
                       provisioning_timeout_seconds=600,
                       flex_start_provisioning_timeout_seconds=3600)
    bench.bring("r1", "create-started", cluster="res")
    bench.bring("f1", "create-requested", cluster="flex")

    bench.advance(599)
    assert bench.run() == []

    bench.advance(1)
    assert bench.run() == [("r1", ev.NodePoolTimedOut("falcon-r1-2x2", 600))]
    assert (bench.row("r1")["status"], bench.row("r1")["reason"]) == ("Failed", "NodePoolTimeout")

    bench.advance(2999)
    assert bench.run() == []
    bench.advance(1)
    assert bench.run() == [("f1", ev.NodePoolTimedOut("falcon-f1-2x2", 3600))]


def test_no_deadline_runs_before_a_pool_is_asked_for(make_bench: HandlerBenches) -> None:
    """Waiting in a queue, or for reservation capacity, has no deadline: the task keeps
    its place however long it takes."""
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster(count=0),
                       provisioning_timeout_seconds=600)
    bench.bring("queued", "waiting", timeout_seconds=600)
    bench.bring("busy", "picked", timeout_seconds=600)
    bench.given("busy", ev.ReservationInsufficient("v6e-res-r", 0, 1, 1))

    bench.advance(7 * 24 * 3600)

    assert bench.run() == []


WEBHOOK = ('Error creating: admission webhook "tpu-policy.example.com" denied the request: '
           "pods requesting google.com/tpu must carry a cost-center label")


def test_a_refusal_past_the_grace_fails_the_task_in_its_words_and_deletes_the_job(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster())
    bench.bring("t1", "submitted")
    bench.given("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 3))
    bench.advance(300)
    bench.given("t1", ev.PodsRefused("falcon-t1", WEBHOOK + " (again)", False, 5))
    assert timeouts.next_due([bench.state("t1")], bench.settings) == (
        bench.clock.now() + dt.timedelta(seconds=300))  # from the first refusal

    bench.advance(299)
    assert bench.run() == []

    bench.advance(1)
    assert bench.run() == [
        ("t1", ev.JobSubmitFailed("falcon-t1", WEBHOOK + " (again)", 600)),
        ("t1", ev.JobDeleteRequested("falcon-t1", "pods refused"))]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Failed", "JobSubmitFailed")
    assert row["message"] == (f"pods of Job falcon-t1 refused for 600s: {WEBHOOK} (again); "
                              "Job deleted")


def test_the_grace_is_a_setting(make_bench: HandlerBenches) -> None:
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster(),
                       failed_create_grace_seconds=60)
    bench.bring("t1", "submitted")
    bench.given("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 3))
    bench.advance(60)
    assert [type(e) for _, e in bench.run()] == [ev.JobSubmitFailed, ev.JobDeleteRequested]


@pytest.mark.parametrize("after", [
    ev.PodsPending("0/1 nodes are available: 1 Insufficient google.com/tpu", 4),
    ev.PodsRefused("falcon-t1", WEBHOOK, True, 4),  # transient: shown, never fails
])
def test_a_refusal_that_clears_or_is_transient_fails_nothing(
        make_bench: HandlerBenches, after: ev.Event) -> None:
    bench = make_bench(timeouts.enforce_deadlines, reserved_cluster())
    bench.bring("t1", "submitted", timeout_seconds=7200)
    bench.given("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 3))
    bench.advance(100)
    bench.given("t1", after)

    bench.advance(3600)
    assert bench.run() == []
    assert timeouts.next_due([bench.state("t1")], bench.settings) == (
        bench.state("t1").dispatched_at + dt.timedelta(seconds=7200))  # its own timeout only
