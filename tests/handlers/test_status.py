"""The status handler: what the edge informers saw of a task's Job, folded into the
task's log -- running pods, the root cause of a failure, duplicates and early or torn
views -- with each message acknowledged only once it was decided on."""

from __future__ import annotations

import pytest

from falcon_es.domain import events as ev
from falcon_es.handlers import status
from falcon_es.domain.ports import CreateRefusal, PodObservation
from tests.support.bench import SQLITE_ONLY, HandlerBenches, flex_cluster, reserved_cluster

pytestmark = SQLITE_ONLY

#: The sim bus's ack deadline: an unacknowledged message is delivered again after it.
ACK_DEADLINE = 60


def test_pending_pods_then_running_pods_move_the_task_to_running(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")
    unschedulable = PodObservation("falcon-t1-0", "Pending", reason="Unschedulable",
                                   message="0/2 nodes are available: 2 Insufficient google.com/tpu")

    bench.observe("t1", resource_version=3, pods=(unschedulable,))
    assert bench.run() == [("t1", ev.PodsPending(
        "Unschedulable: 0/2 nodes are available: 2 Insufficient google.com/tpu", 3))]

    bench.observe("t1", resource_version=5, active=1,
                  pods=(PodObservation("falcon-t1-0", "Running"),))
    assert bench.run() == [("t1", ev.PodsRunning(1, 1, 5))]
    assert (bench.row("t1")["status"], bench.row("t1")["message"]) == ("Running", "1/1 active")
    assert bench.backlog() == 0


def log_of(pod: str) -> str:
    """The blamed pod's log file in the test cluster's bucket, as the Message names it."""
    return f"gs://logs-bucket/logs/t1/{pod}.log"


@pytest.mark.parametrize(("pod", "cause", "exit_code"), [
    (PodObservation("falcon-t1-0", "Failed", reason="OOMKilled", exit_code=137),
     "OOMKilled (exit code 137)", 137),
    (PodObservation("falcon-t1-0", "Failed", reason="Error", exit_code=3, message="loss is NaN"),
     "exit code 3: loss is NaN", 3),
])
def test_a_failed_pod_fails_the_task_with_its_root_cause(
        make_bench: HandlerBenches, pod: PodObservation, cause: str, exit_code: int) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")

    bench.observe("t1", resource_version=9, failed=1, condition="Failed", pods=(pod,))

    assert bench.run() == [("t1", ev.JobFailed(cause, exit_code, 9, log_of("falcon-t1-0")))]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Failed", "JobFailed")
    assert cause in row["message"]


def test_an_image_that_cannot_be_pulled_fails_the_task_and_deletes_the_job(
        make_bench: HandlerBenches) -> None:
    """Such pods would wait forever: the Job is deleted rather than left behind."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")
    stuck = PodObservation("falcon-t1-0", "Pending", reason="ErrImagePull",
                           message="manifest unknown")

    bench.observe("t1", resource_version=4, pods=(stuck,))

    assert bench.run() == [("t1", ev.JobFailed("ErrImagePull: manifest unknown", None, 4)),
                           ("t1", ev.JobDeleteRequested("falcon-t1", "image pull failure"))]


def test_duplicate_and_older_observations_change_nothing_and_are_acknowledged(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")
    running = (PodObservation("falcon-t1-0", "Running"),)
    bench.observe("t1", resource_version=5, active=1, pods=running)
    assert bench.run() == [("t1", ev.PodsRunning(1, 1, 5))]

    bench.observe("t1", resource_version=5, active=1, pods=running)
    bench.observe("t1", resource_version=4, pods=(PodObservation("falcon-t1-0", "Pending"),))
    bench.observe("t1", resource_version=6, active=1, pods=running, job_uid="uid-of-another-job")

    assert bench.run() == []
    assert bench.backlog() == 0


def test_a_job_failed_without_its_failed_pod_waits_for_the_pods_root_cause(
        make_bench: HandlerBenches) -> None:
    """The informer's Job and Pod watches deliver independently: "Job failed, no pod
    failed" is held back unacknowledged for a grace, so the pod's cause can arrive."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")

    bench.observe("t1", resource_version=6, failed=1, condition="Failed",
                  pods=(PodObservation("falcon-t1-0", "Running"),))
    assert bench.run() == []
    assert bench.backlog() == 1

    bench.observe("t1", resource_version=7, failed=1, condition="Failed",
                  pods=(PodObservation("falcon-t1-0", "Failed", reason="OOMKilled"),))
    assert bench.run() == [("t1", ev.JobFailed("OOMKilled (exit code 137)", 137, 7,
                                                log_of("falcon-t1-0")))]

    bench.advance(ACK_DEADLINE)  # the held message comes back: an old view now
    assert bench.run() == []
    assert bench.backlog() == 0


def test_an_observation_before_the_submits_outcome_comes_back_and_is_folded_then(
        make_bench: HandlerBenches) -> None:
    """Until ``JobSubmitted`` is in the log the handler cannot tell this task's Job from
    another: the observation is left unacknowledged rather than dropped."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submit-requested")

    bench.observe("t1", resource_version=2, active=1, job_uid="uid-t1",
                  pods=(PodObservation("falcon-t1-0", "Running"),))
    assert bench.run() == []

    bench.given("t1", ev.JobSubmitted("falcon-t1", "uid-t1"))
    bench.advance(ACK_DEADLINE)
    # Only a message held back can be folded now. (The executor behind this tick really
    # submitted the open intent, so the sim's informer reports a Job of another uid as
    # well: dropped as not this task's Job.)
    assert bench.run() == [("t1", ev.PodsRunning(1, 1, 2))]


def test_the_pod_that_failed_first_is_blamed_not_the_leader_that_crashed_after_it(
        make_bench: HandlerBenches) -> None:
    """In a multi-host slice one worker's OOM makes the others fail a moment later;
    the Message names the first failure (by ``finishedAt``), whatever its index."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")

    bench.observe("t1", resource_version=6, failed=2, condition="Failed", completions=2, pods=(
        PodObservation("falcon-t1-0", "Failed", reason="Error", exit_code=1,
                       message="lost connection to worker 1",
                       finished_at="2026-11-01T09:20:07Z"),
        PodObservation("falcon-t1-1", "Failed", reason="OOMKilled", exit_code=137,
                       finished_at="2026-11-01T09:20:01Z"),
    ))

    assert bench.run() == [("t1", ev.JobFailed("OOMKilled (exit code 137)", 137, 6,
                                                log_of("falcon-t1-1")))]


def test_a_task_without_a_command_names_no_log_file(make_bench: HandlerBenches) -> None:
    """The log wrapper runs only around a spec's command: without one the image's
    entrypoint writes to the pod log, and no file in the bucket is named."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running", command=[])

    bench.observe("t1", resource_version=9, failed=1, condition="Failed",
                  pods=(PodObservation("falcon-t1-0", "Failed", reason="Error", exit_code=2),))

    assert bench.run() == [("t1", ev.JobFailed("exit code 2", 2, 9, ""))]
    assert bench.row("t1")["message"].startswith("exit code 2")
    assert "log:" not in bench.row("t1")["message"]


def test_a_failed_pod_with_a_termination_time_is_blamed_before_one_without(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")

    bench.observe("t1", resource_version=6, failed=2, condition="Failed", completions=2, pods=(
        PodObservation("falcon-t1-0", "Failed", reason="Error", exit_code=3),
        PodObservation("falcon-t1-1", "Failed", reason="OOMKilled", exit_code=137,
                       finished_at="2026-11-01T09:20:01Z"),
    ))

    # A pod with a time comes before one without: its failure is known to be earliest.
    assert bench.run() == [("t1", ev.JobFailed("OOMKilled (exit code 137)", 137, 6,
                                                log_of("falcon-t1-1")))]


WEBHOOK = ('Error creating: admission webhook "tpu-policy.example.com" denied the request: '
           "pods requesting google.com/tpu must carry a cost-center label")


def test_pods_refused_by_a_webhook_show_at_once_and_clear_when_pods_are_created(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")

    bench.observe("t1", resource_version=3, refusal=CreateRefusal(WEBHOOK))
    assert bench.run() == [("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 3))]
    row = bench.row("t1")
    assert (row["status"], row["reason"], row["message"]) == (
        "Pending", "Dispatching", f"pods of Job falcon-t1 cannot be created: {WEBHOOK}")
    refused_at = bench.state("t1").job.refused_since
    assert refused_at == bench.clock.now()

    bench.advance(30)  # the Job controller tried again: the same words, counted
    bench.observe("t1", resource_version=6, refusal=CreateRefusal(WEBHOOK, count=4))
    assert bench.run() == []
    assert bench.state("t1").job.refused_since == refused_at

    pending = PodObservation("falcon-t1-0", "Pending", reason="Unschedulable",
                             message="0/2 nodes are available: 2 Insufficient google.com/tpu")
    bench.observe("t1", resource_version=8, pods=(pending,))
    assert [type(e) for _, e in bench.run()] == [ev.PodsPending]
    assert bench.state("t1").job.refused_since is None
    assert bench.row("t1")["message"].startswith("pods pending: ")
    assert bench.backlog() == 0


def test_a_refusal_comes_before_the_pods_that_were_created(make_bench: HandlerBenches) -> None:
    """A quota that let two of four pods through: the refusal is the root cause."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")
    quota = ('Error creating: pods "falcon-t1-2-" is forbidden: exceeded quota: tpu-quota, '
             "requested: google.com/tpu=4, used: google.com/tpu=8, limited: google.com/tpu=8")

    bench.observe("t1", resource_version=5, completions=4, refusal=CreateRefusal(quota, 2),
                  pods=(PodObservation("falcon-t1-0", "Running"),
                        PodObservation("falcon-t1-1", "Pending", reason="ContainerCreating")))

    assert bench.run() == [("t1", ev.PodsRefused("falcon-t1", quota, False, 5))]


def test_a_transient_refusal_is_shown_and_starts_no_grace(make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "submitted")

    bench.observe("t1", resource_version=3, refusal=CreateRefusal(WEBHOOK, transient=True))
    assert bench.run() == [("t1", ev.PodsRefused("falcon-t1", WEBHOOK, True, 3))]
    assert bench.state("t1").job.refused_since is None
    assert bench.row("t1")["message"].endswith(" (expected to clear; waiting)")

    # The same words, no longer transient: the grace starts now.
    bench.observe("t1", resource_version=4, refusal=CreateRefusal(WEBHOOK))
    assert bench.run() == [("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 4))]
    assert bench.state("t1").job.refused_since == bench.clock.now()


def test_pods_waiting_for_an_autoscaled_pools_nodes_are_waiting_for_node_and_a_refusal_shows(
        make_bench: HandlerBenches) -> None:
    """Flex-start: the workload is in before the pool has nodes. Its pending pods are
    WaitingForNode with the pool's counts; a refusal of its pods is still the cause
    shown (and starts the grace); the pods running end the wait, and the task's
    timeout counts from then."""
    bench = make_bench(status.fold_observations, flex_cluster())
    bench.bring("t1", "submitted")
    pending = PodObservation("falcon-t1-0", "Pending", reason="Unschedulable",
                             message="0/3 nodes are available: 3 node(s) didn't match "
                                     "Pod's node affinity/selector.")

    bench.observe("t1", resource_version=3, pods=(pending,))
    ((_, awaited),) = bench.run()
    assert isinstance(awaited, ev.NodesAwaited)
    assert (awaited.expected, awaited.registered, awaited.ready) == (1, 0, 0)
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Pending", "WaitingForNode")
    assert "node pool falcon-t1-2x2 control-plane RUNNING but 0/1 expected node(s) " \
           "registered (Ready=0)" in row["message"]
    bench.observe("t1", resource_version=4, pods=(pending,))
    assert bench.run() == []  # the same wait: nothing new to record

    bench.advance(30)
    bench.observe("t1", resource_version=6, refusal=CreateRefusal(WEBHOOK))
    assert bench.run() == [("t1", ev.PodsRefused("falcon-t1", WEBHOOK, False, 6))]
    row = bench.row("t1")
    assert (row["status"], row["reason"], row["message"]) == (
        "Pending", "Dispatching", f"pods of Job falcon-t1 cannot be created: {WEBHOOK}")
    assert bench.state("t1").job.refused_since == bench.clock.now()

    bench.observe("t1", resource_version=8, pods=(pending,))
    assert [type(e) for _, e in bench.run()] == [ev.NodesAwaited]
    assert bench.state("t1").job.refused_since is None
    bench.advance(3600)
    bench.observe("t1", resource_version=9, active=1,
                  pods=(PodObservation("falcon-t1-0", "Running"),))
    assert bench.run() == [("t1", ev.PodsRunning(1, 1, 9))]
    state = bench.state("t1")
    assert (state.status, state.job.dispatched_at) == ("Running", bench.clock.now())
    assert bench.backlog() == 0


EVICTED = "EvictionByEvictionAPI: Eviction API: evicting"


def evicted(name: str, node: str) -> PodObservation:
    """A pod a drain killed: the container stopped by SIGTERM, DisruptionTarget set."""
    return PodObservation(name, "Failed", reason="Error", exit_code=143, node=node,
                          disruption=EVICTED)


def test_a_disrupted_pod_is_no_failure_and_leads_until_its_replacement_runs(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")
    gone = evicted("falcon-t1-0-a", "gke-node-1")

    bench.observe("t1", resource_version=10, failed=1, pods=(gone,))
    assert bench.run() == [("t1", ev.WorkloadDisrupted(
        ("falcon-t1-0-a",), "gke-node-1", f"DisruptionTarget {EVICTED}", 1, 10))]
    row = bench.row("t1")
    assert row["status"] == "Running" and row["message"].startswith(
        "disrupted: 1 pod(s) killed on node gke-node-1 (DisruptionTarget EvictionByEviction")

    bench.observe("t1", resource_version=11, failed=1,
                  pods=(gone, PodObservation("falcon-t1-0-b", "Pending")))
    assert bench.run() == []  # the disruption still leads: no "0/1 active"
    bench.observe("t1", resource_version=12, failed=1, active=1,
                  pods=(gone, PodObservation("falcon-t1-0-b", "Running")))
    assert bench.run() == [("t1", ev.PodsRunning(1, 1, 12))]


def test_one_more_disruption_than_the_budget_fails_the_task_and_deletes_the_job(
        make_bench: HandlerBenches) -> None:
    """FALCON_DISRUPTION_BUDGET (5): each disruption over once the pods run again."""
    bench = make_bench(status.fold_observations, reserved_cluster())
    bench.bring("t1", "running")
    seen: list[PodObservation] = []
    version = 10
    for episode in range(1, 7):
        seen.append(evicted(f"falcon-t1-0-{episode}", f"gke-node-{episode}"))
        bench.observe("t1", resource_version=version, failed=len(seen), pods=tuple(seen))
        events = bench.run()
        if episode <= 5:
            assert [type(e).__name__ for _, e in events] == ["WorkloadDisrupted"]
            assert events[0][1].disruptions == episode  # type: ignore[attr-defined]
            bench.observe("t1", resource_version=version + 1, failed=len(seen), active=1,
                          pods=(*seen, PodObservation(f"falcon-t1-0-r{episode}", "Running")))
            assert [type(e).__name__ for _, e in bench.run()] == ["PodsRunning"]
        version += 2
    assert [type(e).__name__ for _, e in events] == ["JobFailed", "JobDeleteRequested"]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Failed", "JobFailed")
    assert row["message"].startswith("disrupted 6 times, more than the budget of 5 "
                                     "(FALCON_DISRUPTION_BUDGET); last: 1 pod(s) killed on "
                                     "node gke-node-6")
