"""The edge adapter's JobSets through the official ``kubernetes`` client
(``CustomObjectsApi``) against the fake API server's JobSet CRD and controller: submit
and adopt, read and delete by kind (children and Service go too), the diagnosis that
puts a Pending leader before its followers' refusal, the JobSet controller's own
refusal (``JobCreationFailed`` on the JobSet) watched and leading, and the CRD check of
doctor."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from falcon_es.domain import naming
from falcon_es.adapters.gcp.informer import EdgeInformer, InformerSettings
from falcon_es.adapters.gcp.kube import KubeEdgeCluster
from falcon_es.domain.manifests import JobPlacement, render_jobset
from falcon_es.domain.ports import ALREADY_EXISTS, JOBSET_KIND, JobObservation, PortError
from falcon_es.domain.spec import SpecLimits, parse_spec
from falcon_es.domain.tpu import slice_shape
from tests.fakes import fixtures
from tests.fakes.fixtures import RecordingBus, edge_cluster_row, edge_clusters_for
from tests.fakes.kube_server import FakeKubeServer

kube_server = fixtures.kube_server
edge_clusters = fixtures.edge_clusters

PLACEMENT = JobPlacement(namespace="falcon-jobs", service_account="falcon-task",
                         bucket="logs", ttl_seconds_after_finished=None)


@pytest.fixture
def edge(edge_clusters: Any) -> KubeEdgeCluster:
    return edge_clusters.for_cluster(edge_cluster_row())


def jobset(task_id: str, slices: int = 2) -> dict[str, Any]:
    spec = parse_spec({"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                       "topology": "4x4", "slices": slices}, SpecLimits(max_slices=4))
    return render_jobset(task_id=task_id, spec=spec.to_data(), shape=slice_shape("v6e", "4x4"),
                         pool_names=naming.pool_group(naming.pool_name(task_id, "4x4"), slices),
                         placement=PLACEMENT)


def test_a_jobset_is_created_adopted_read_and_deleted_with_its_children(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    ref = edge.submit_job(jobset("task-1"))
    assert (ref.name, ref.task_id) == ("falcon-task-1", "task-1")
    assert kube_server.names("jobsets") == ["falcon-task-1"]
    assert kube_server.names("jobs") == ["falcon-task-1-slice-0", "falcon-task-1-slice-1"]
    assert kube_server.names("services") == ["falcon-task-1"]
    again = edge.submit_job(jobset("task-1"))  # re-issued after a crash: adopted
    assert again == ref
    assert edge.get_job("falcon-task-1", JOBSET_KIND) == ref
    assert edge.get_job("falcon-task-1") is None  # no Job of that name
    kube_server.start_pods("falcon-task-1-slice-0")
    edge.delete_job("falcon-task-1", JOBSET_KIND)
    assert kube_server.names("jobsets") == kube_server.names("jobs") == []
    assert kube_server.names("services") == kube_server.names("pods") == []
    edge.delete_job("falcon-task-1", JOBSET_KIND)  # gone: done
    assert edge.get_job("falcon-task-1", JOBSET_KIND) is None
    created = [r for r in kube_server.requests if r.method == "POST"]
    assert created[0].path == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/falcon-jobs/jobsets"


def test_another_tasks_jobset_of_that_name_is_not_adopted(edge: KubeEdgeCluster) -> None:
    foreign = jobset("task-1")
    foreign["metadata"]["annotations"]["falcon/task-id"] = "someone-else"
    foreign["metadata"]["labels"]["falcon-task"] = "someone-else"
    edge.submit_job(foreign)
    with pytest.raises(PortError) as refused:
        edge.submit_job(jobset("task-1"))
    assert refused.value.code == ALREADY_EXISTS and "someone-else" in refused.value.message


def test_the_diagnosis_leads_with_the_pending_leader_not_the_refused_followers(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    edge.submit_job(jobset("task-2"))
    (leader,) = kube_server.start_pods("falcon-task-2-slice-0", 1)
    kube_server.unschedulable(leader, "0/6 nodes are available: 4 Insufficient google.com/tpu, "
                                      "2 node(s) didn't match Pod's node affinity/selector.")
    kube_server.refuse_followers("falcon-task-2-slice-0")
    found = edge.diagnose_pending("falcon-task-2")
    assert found is not None and found.startswith("Job falcon-task-2-slice-0: ")
    leader_cause = found.index("cannot be scheduled: 0/6 nodes are available: 4 Insufficient "
                               "google.com/tpu")
    # the words Falcon's followers get: they have selectors, only not the pool's
    assert leader_cause < found.index("follower pod node selector for topology domain not "
                                      "found. missing selector: cloud.google.com/gke-nodepool")


def test_without_the_crd_doctor_is_told_and_a_submit_fails_clearly() -> None:
    server = FakeKubeServer(jobset_crd=False).start()
    clusters = edge_clusters_for(server, request_timeout_seconds=10.0)
    try:
        edge = clusters.for_cluster(edge_cluster_row())
        assert edge.jobset_crd_installed() is False
        with pytest.raises(PortError) as refused:
            edge.submit_job(jobset("task-3"))
        assert "could not find the requested resource" in refused.value.message
        with pytest.raises(PortError):
            edge.get_job("falcon-task-3", JOBSET_KIND)  # not "gone": the type is missing
    finally:
        clusters.close()
        server.stop()


def test_with_the_crd_doctor_finds_it(edge: KubeEdgeCluster) -> None:
    assert edge.jobset_crd_installed() is True


# ------------------------------------------------------------------- the informer

@contextlib.contextmanager
def informing(kube_server: FakeKubeServer) -> Iterator[tuple[KubeEdgeCluster, RecordingBus]]:
    """An informer on the fake cluster, its five watches open (Jobs, pods, events on
    Jobs, JobSets, events on JobSets), publishing to a recording bus."""
    edges = edge_clusters_for(kube_server, request_timeout_seconds=10.0)
    edge = edges.for_cluster(edge_cluster_row())
    bus = RecordingBus()
    informer = EdgeInformer(edge, bus, rng=random.Random(1),
                            settings=InformerSettings(topic="edge"))
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        kube_server.wait_for_watches(5)
        yield edge, bus
    finally:
        stop.set()
        thread.join(timeout=5)
        edges.close()


def latest(bus: RecordingBus, accept: Callable[[JobObservation], bool]) -> JobObservation:
    """The newest published observation ``accept`` takes (waiting for one)."""
    found: list[JobObservation] = []

    def seen(published: list[dict[str, Any]]) -> bool:
        found[:] = [o for o in map(JobObservation.from_data, published) if accept(o)]
        return bool(found)
    bus.wait_for(seen)
    return found[-1]


def test_the_informer_publishes_one_observation_per_jobset(kube_server: FakeKubeServer) -> None:
    """Child Jobs are published only inside their JobSet's observation: pods in slice
    order, a child's FailedCreate transient while its leader has no node, then the
    JobSet's restarts and final condition."""
    with informing(kube_server) as (edge, bus):
        ref = edge.submit_job(jobset("task-9"))
        (leader,) = kube_server.start_pods("falcon-task-9-slice-0", 1)
        kube_server.unschedulable(leader, "0/4 nodes are available: 4 Insufficient "
                                          "google.com/tpu.")
        kube_server.refuse_followers("falcon-task-9-slice-0")
        refused = latest(bus, lambda o: o.refusal is not None)
        assert (refused.kind, refused.job_uid, refused.job_name) == (
            "JobSet", ref.uid, "falcon-task-9")
        assert refused.refusal is not None and refused.refusal.transient
        assert refused.refusal.message.startswith("child Job falcon-task-9-slice-0: Error "
                                                  "creating: admission webhook")
        assert refused.completions == 8  # two slices of four VMs
        kube_server.set_jobset_condition("falcon-task-9", "Failed", "ReachedMaxRestarts",
                                         restarts=2)
        # The JobSet's verdict seen before any child failed (the watches are not
        # ordered) is held back until the child Job that failed is seen.
        kube_server.finish_pod(leader, 137, reason="OOMKilled")
        failed = latest(bus, lambda o: o.condition == "Failed")
        assert (failed.condition_reason, failed.restarts) == ("ReachedMaxRestarts", 2)
        verdicts = [o for o in map(JobObservation.from_data, bus.data()) if o.condition]
        assert all(o.failed == 1 and o.pods[0].reason == "OOMKilled" for o in verdicts)
        published = {d["job_uid"] for d in bus.data()}
        assert published == {ref.uid}  # no child Job published on its own


# --------------------------------------------- the JobSet controller's own refusals

QUOTA_WORDS = ('job "falcon-task-8-slice-1" creation failed with error: jobs.batch '
               '"falcon-task-8-slice-1" is forbidden: exceeded quota: falcon-jobs, requested: '
               "count/jobs.batch=1, used: count/jobs.batch=1, limited: count/jobs.batch=1")


def test_the_jobset_controllers_refusal_is_watched_and_leads(
        kube_server: FakeKubeServer) -> None:
    """A ResourceQuota admits one Job: the JobSet controller creates one child and
    records JobCreationFailed on the JobSet for the other. The informer's watch of
    events on JobSets publishes it as the JobSet's refusal in the controller's words
    (not transient: it does not clear by itself), the diagnosis leads with it, and once
    the missing child exists it is no longer a refusal."""
    with informing(kube_server) as (edge, bus):
        kube_server.job_quota = 1
        ref = edge.submit_job(jobset("task-8"))
        assert kube_server.names("jobs") == ["falcon-task-8-slice-0"]
        cause = f"JobSet controller JobCreationFailed: {QUOTA_WORDS}"
        refused = latest(bus, lambda o: o.refusal is not None)
        assert (refused.kind, refused.job_uid) == ("JobSet", ref.uid)
        assert refused.refusal is not None
        assert (refused.refusal.message, refused.refusal.transient) == (cause, False)
        assert edge.diagnose_pending("falcon-task-8") == cause
        # The controller tried again, in the same words: one event, its count grown.
        kube_server.record_event("JobSet", "falcon-task-8", "JobCreationFailed", QUOTA_WORDS,
                                 source="jobset")
        assert latest(bus, lambda o: o.refusal is not None and o.refusal.count == 2)
        # The quota raised, the controller creates the missing child: no refusal now.
        kube_server.job_quota = None
        jobset_now = kube_server.get("jobsets", "falcon-task-8")
        assert jobset_now is not None
        kube_server.add_jobset_child(kube_server.namespace, jobset_now,
                                     jobset_now["spec"]["replicatedJobs"][0], 1)
        cleared = latest(bus, lambda o: o.refusal is None
                         and o.resource_version > refused.resource_version)
        assert cleared.job_uid == ref.uid
        assert edge.diagnose_pending("falcon-task-8") is None


def test_a_job_past_the_quota_is_refused_in_the_quota_plugins_words(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    """The same quota refuses a single-slice task's own Job create: the API's 403, which
    the adapter names a quota (the task fails with the quota plugin's words)."""
    from falcon_es.domain.manifests import render_job

    kube_server.job_quota = 0
    manifest = render_job(task_id="task-7", spec={"image": "busybox"},
                          shape=slice_shape("v6e", "2x2"), pool_name="falcon-task-7-2x2",
                          placement=PLACEMENT)
    with pytest.raises(PortError) as refused:
        edge.submit_job(manifest)
    assert refused.value.code == "QUOTA_EXCEEDED"
    assert "exceeded quota: falcon-jobs" in refused.value.message
