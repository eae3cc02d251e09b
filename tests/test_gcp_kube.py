"""The Kubernetes edge-cluster adapter through the real ``kubernetes`` client, against a
local API server that speaks the real wire protocol over TLS (tests/fakes/kube_server.py).

Credentials are real google-auth OAuth2 credentials refreshed at the fake's token
endpoint; the endpoint and CA come from GKE's get_cluster where that is the point.
Time is a VirtualClock shared by the fake and the token source, started at the wall
clock's now (google-auth stamps a token's expiry with the real time); it moves by
``advance``, never by sleeping.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import google.oauth2.credentials
import pytest
from google.cloud import container_v1

from falcon_es.adapters.gcp.gke import cluster_manager_client
from falcon_es.adapters.gcp.kube import KubeEdgeCluster, KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import (
    GkeEndpoints,
    GoogleAccessTokens,
    KubeEndpoint,
    endpoint_from_gke,
)
from falcon_es.domain.clock import VirtualClock, utcnow
from falcon_es.domain import naming
from falcon_es.domain.manifests import TASK_ID_ANNOTATION
from falcon_es.domain.ports import (
    ALREADY_EXISTS,
    FAILED,
    INVALID,
    NOT_FOUND,
    PERMISSION_DENIED,
    QUOTA_EXCEEDED,
    RETRYABLE,
    JobRef,
    NodeCounts,
    PortError,
)
from tests.fakes import fixtures, gke_server
from tests.fakes.fixtures import (
    access_tokens,
    auth_request,
    edge_cluster_row,
    edge_clusters_for,
)
from tests.fakes.fixtures import falcon_manifest as manifest
from tests.fakes.kube_server import FakeKubeServer, label_matcher, make_tls

# The fixtures this module uses (pytest looks them up by name in the module).
kube_server = fixtures.kube_server
edge_clusters = fixtures.edge_clusters

NAMESPACE = "falcon-jobs"


@pytest.fixture
def edge(edge_clusters: KubeEdgeClusters) -> KubeEdgeCluster:
    return edge_clusters.for_cluster(edge_cluster_row())


# ------------------------------------------------------------ endpoint, CA, caching

def test_endpoint_and_ca_from_gke_get_cluster_reach_the_api_over_tls(
        kube_server: FakeKubeServer) -> None:
    gke = gke_server.FakeGke()
    row = edge_cluster_row()
    gke.add_cluster(row.project, row.location, row.name, endpoint=kube_server.endpoint,
                    ca_pem=(kube_server.ca_pem or "").encode())
    with gke_server.serve_grpc(gke) as api_endpoint:
        manager = cluster_manager_client(api_endpoint=api_endpoint)
        clusters = KubeEdgeClusters(GkeEndpoints(manager), tokens=access_tokens(kube_server),
                                    namespace=NAMESPACE)
        edge = clusters.for_cluster(row)

        assert edge.version() == "v1.33.5-gke.fake"
        assert clusters.for_cluster(row) is edge  # one client per cluster, cached
        assert [m for m, _ in gke.calls].count("GetCluster") == 1
        clusters.close()


def test_endpoint_from_gke_decodes_the_ca_and_falls_back_to_the_dns_endpoint() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    ip_cluster = container_v1.Cluster(
        name="edge-a", endpoint="34.1.2.3",
        master_auth=container_v1.MasterAuth(
            cluster_ca_certificate=base64.b64encode(pem.encode()).decode()))
    dns_cluster = container_v1.Cluster(name="edge-b", control_plane_endpoints_config={
        "dns_endpoint_config": {"endpoint": "gke-abc.us-east5.gke.goog"}})

    assert endpoint_from_gke(ip_cluster) == KubeEndpoint("https://34.1.2.3", pem)
    assert endpoint_from_gke(dns_cluster) == KubeEndpoint("https://gke-abc.us-east5.gke.goog",
                                                          None)
    with pytest.raises(PortError) as no_endpoint:
        endpoint_from_gke(container_v1.Cluster(name="edge-c"))
    assert "no control-plane endpoint" in no_endpoint.value.message


def test_a_server_signed_by_another_ca_is_refused(kube_server: FakeKubeServer,
                                                  tmp_path: Path) -> None:
    other_ca = make_tls(tmp_path).ca_pem
    clusters = KubeEdgeClusters(lambda c: KubeEndpoint(kube_server.url, other_ca),
                                tokens=access_tokens(kube_server), namespace=NAMESPACE)
    with pytest.raises(PortError) as refused:
        clusters.for_cluster(edge_cluster_row()).get_job("falcon-x")
    assert refused.value.code == RETRYABLE
    assert "CERTIFICATE_VERIFY_FAILED" in refused.value.message
    assert "cluster edge-a" in refused.value.message
    clusters.close()


# ----------------------------------------------------------------------------- Jobs

def test_submit_get_and_delete_a_job_with_its_pods(edge: KubeEdgeCluster,
                                                   kube_server: FakeKubeServer) -> None:
    ref = edge.submit_job(manifest("task-1", "4x4"))

    stored = kube_server.get("jobs", ref.name)
    assert stored is not None
    assert ref == JobRef("falcon-task-1", stored["metadata"]["uid"], "task-1", "task-1")
    # What went over the wire is the manifest, TPU chips as strings, Indexed, 4 hosts.
    pod_spec = stored["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert (stored["spec"]["completions"], stored["spec"]["completionMode"]) == (4, "Indexed")
    assert edge.get_job("falcon-task-1") == ref

    pods = kube_server.start_pods("falcon-task-1")
    assert len(pods) == 4
    edge.delete_job("falcon-task-1")

    assert kube_server.get("jobs", "falcon-task-1") is None
    assert kube_server.names("pods") == []  # propagation took the pods along
    (delete,) = [r for r in kube_server.requests if r.method == "DELETE"]
    assert delete.query["propagationPolicy"] == "Background"
    edge.delete_job("falcon-task-1")  # gone already: success
    assert edge.get_job("falcon-task-1") is None


def test_without_propagation_the_pods_would_stay(kube_server: FakeKubeServer) -> None:
    """Why the adapter always sets a propagation policy: the fake, like batch/v1,
    orphans the pods of a Job deleted without one."""
    clusters = edge_clusters_for(kube_server)
    edge = clusters.for_cluster(edge_cluster_row())
    edge.submit_job(manifest("task-2"))
    kube_server.start_pods("falcon-task-2")
    edge.batch.delete_namespaced_job("falcon-task-2", NAMESPACE)
    assert len(kube_server.names("pods")) == 1
    clusters.close()


def test_foreground_propagation_is_sent_when_configured(kube_server: FakeKubeServer) -> None:
    clusters = edge_clusters_for(kube_server, propagation_policy="Foreground")
    edge = clusters.for_cluster(edge_cluster_row())
    edge.submit_job(manifest("task-3"))
    edge.delete_job("falcon-task-3")
    assert [r.query.get("propagationPolicy") for r in kube_server.requests
            if r.method == "DELETE"] == ["Foreground"]
    with pytest.raises(ValueError, match="orphans pods"):
        edge_clusters_for(kube_server, propagation_policy="Orphan").for_cluster(
            edge_cluster_row("edge-b"))
    clusters.close()


def test_resubmitting_adopts_the_tasks_own_job(edge: KubeEdgeCluster,
                                               kube_server: FakeKubeServer) -> None:
    first = edge.submit_job(manifest("task-4"))
    again = edge.submit_job(manifest("task-4"))  # a crash between create and its outcome

    assert again == first
    assert kube_server.names("jobs") == ["falcon-task-4"]
    assert [r.status for r in kube_server.requests if r.method == "POST"] == [201, 409]


def test_a_same_named_job_of_another_task_is_not_adopted(edge: KubeEdgeCluster) -> None:
    edge.submit_job(manifest("task-5"))
    foreign = manifest("task-5")
    foreign["metadata"]["annotations"][TASK_ID_ANNOTATION] = "someone-else"

    with pytest.raises(PortError) as refused:
        edge.submit_job(foreign)

    assert refused.value.code == ALREADY_EXISTS
    assert "belongs to task task-5" in refused.value.message


COLLIDED = ("job-2026-07-01/user4883@example.com", "job-2026-07-01/user8747@example.com")


def test_a_job_of_another_task_with_the_same_label_is_not_adopted(edge: KubeEdgeCluster) -> None:
    """Ownership is the full id of the annotation: the two ids once shared a label."""
    first, second = COLLIDED
    theirs = manifest("task-31")
    theirs["metadata"]["annotations"][TASK_ID_ANNOTATION] = first
    theirs["metadata"]["labels"]["falcon-task"] = naming.legacy_task_label(first)
    edge.submit_job(theirs)
    mine = copy.deepcopy(theirs)
    mine["metadata"]["annotations"][TASK_ID_ANNOTATION] = second

    with pytest.raises(PortError) as refused:
        edge.submit_job(mine)

    assert refused.value.code == ALREADY_EXISTS
    assert f"belongs to task {first}" in refused.value.message


def test_a_job_made_before_the_annotation_is_adopted_by_its_label(edge: KubeEdgeCluster) -> None:
    old = manifest("task-32")
    del old["metadata"]["annotations"][TASK_ID_ANNOTATION]
    first = edge.submit_job(old)

    assert edge.submit_job(manifest("task-32")).uid == first.uid
    assert edge.get_job("falcon-task-32") == JobRef("falcon-task-32", first.uid, None, "task-32")


# ------------------------------------------------- multi-host: the headless Service

def owner_uids(obj: dict[str, Any]) -> list[str]:
    return [o["uid"] for o in obj["metadata"].get("ownerReferences", [])]


def test_a_multi_host_job_comes_with_its_headless_service_owned_by_the_job(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    ref = edge.submit_job(manifest("task-20", "4x4"))

    service = kube_server.get("services", "falcon-task-20")
    assert service is not None
    assert owner_uids(service) == [ref.uid]
    assert service["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    job = kube_server.get("jobs", "falcon-task-20")
    assert job["spec"]["template"]["spec"]["subdomain"] == "falcon-task-20"
    # The Service selects exactly the pods the Job controller makes for this Job.
    pods = kube_server.start_pods("falcon-task-20")
    selects = label_matcher(",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items()))
    assert sorted(p for p in pods
                  if selects(kube_server.get("pods", p)["metadata"]["labels"])) == sorted(pods)
    posts = [r.path for r in kube_server.requests if r.method == "POST"]
    assert posts == [f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                     f"/api/v1/namespaces/{NAMESPACE}/services"]  # the Job first: its uid


def test_a_single_host_job_comes_without_a_service(edge: KubeEdgeCluster,
                                                   kube_server: FakeKubeServer) -> None:
    edge.submit_job(manifest("task-21", "2x2"))
    assert kube_server.names("services") == []
    assert "subdomain" not in kube_server.get("jobs", "falcon-task-21")["spec"]["template"]["spec"]


def test_resubmitting_a_multi_host_job_adopts_it_and_its_service(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    first = edge.submit_job(manifest("task-22", "4x4"))
    service_uid = kube_server.get("services", "falcon-task-22")["metadata"]["uid"]

    again = edge.submit_job(manifest("task-22", "4x4"))

    assert again == first
    assert kube_server.names("services") == ["falcon-task-22"]
    assert kube_server.get("services", "falcon-task-22")["metadata"]["uid"] == service_uid
    assert not [r for r in kube_server.requests if r.method == "DELETE"]


def test_a_crash_between_the_job_and_its_service_heals_on_the_next_submit(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    kube_server.inject("POST", r"/services$", 503, message="apiserver is shutting down")
    with pytest.raises(PortError) as interrupted:
        edge.submit_job(manifest("task-23", "4x4"))
    assert interrupted.value.code == RETRYABLE
    assert "creating Service falcon-task-23" in interrupted.value.message
    assert kube_server.names("jobs") == ["falcon-task-23"]
    assert kube_server.names("services") == []

    ref = edge.submit_job(manifest("task-23", "4x4"))  # re-issued: adopts the Job

    assert owner_uids(kube_server.get("services", "falcon-task-23")) == [ref.uid]


def test_deleting_the_job_takes_its_service_along(edge: KubeEdgeCluster,
                                                  kube_server: FakeKubeServer) -> None:
    edge.submit_job(manifest("task-24", "4x4"))
    kube_server.start_pods("falcon-task-24")

    edge.delete_job("falcon-task-24")

    assert kube_server.names("services") == []
    assert kube_server.names("pods") == []


def test_a_service_left_by_an_earlier_job_of_the_task_is_replaced(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    earlier = edge.submit_job(manifest("task-25", "4x4"))
    # Deleted without propagation (by hand): the Service stays, owned by nobody.
    edge.batch.delete_namespaced_job("falcon-task-25", NAMESPACE)
    stale = kube_server.get("services", "falcon-task-25")
    assert stale is not None and owner_uids(stale) == []

    ref = edge.submit_job(manifest("task-25", "4x4"))

    assert ref.uid != earlier.uid
    service = kube_server.get("services", "falcon-task-25")
    assert owner_uids(service) == [ref.uid]
    assert service["metadata"]["uid"] != stale["metadata"]["uid"]
    (removed,) = [r for r in kube_server.requests
                  if r.method == "DELETE" and "/services/" in r.path]
    assert removed.body["preconditions"] == {"uid": stale["metadata"]["uid"]}


@pytest.mark.parametrize(("labels", "owner"), [
    ({"app": "web"}, "no Falcon task"),
    ({"managed-by": "falcon", "falcon-task": "someone-else"}, "task someone-else"),
])
def test_a_same_named_service_of_someone_else_fails_the_submit_and_withdraws_the_job(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer, labels: dict[str, str],
        owner: str) -> None:
    edge.core.create_namespaced_service(NAMESPACE, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "falcon-task-26", "labels": labels},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
    foreign_uid = kube_server.get("services", "falcon-task-26")["metadata"]["uid"]

    with pytest.raises(PortError) as refused:
        edge.submit_job(manifest("task-26", "4x4"))

    assert refused.value.code == FAILED
    assert refused.value.message == (
        f'services "falcon-task-26" already exists in namespace {NAMESPACE} on cluster edge-a '
        f"and belongs to {owner}; Job falcon-task-26 needs that name for its workers to find "
        "each other, so it was deleted again")
    assert kube_server.names("jobs") == []
    assert kube_server.get("services", "falcon-task-26")["metadata"]["uid"] == foreign_uid


def test_a_job_may_not_leave_its_namespace(edge: KubeEdgeCluster,
                                           kube_server: FakeKubeServer) -> None:
    escaping = manifest("task-6")
    escaping["metadata"]["namespace"] = "kube-system"

    with pytest.raises(PortError) as refused:
        edge.submit_job(escaping)

    assert refused.value.code == INVALID
    assert "namespace kube-system" in refused.value.message
    assert not [r for r in kube_server.requests if r.method == "POST"]


@pytest.mark.parametrize(("code", "message", "expected"), [
    (403, 'jobs.batch is forbidden: User "x" cannot create resource "jobs"', PERMISSION_DENIED),
    (403, ('jobs.batch "falcon-task-7" is forbidden: exceeded quota: tpu-quota, requested: '
           "requests.google.com/tpu=4, used: requests.google.com/tpu=16, limited: "
           "requests.google.com/tpu=16"), QUOTA_EXCEEDED),
    (429, "too many requests", RETRYABLE),
    (500, "etcdserver: request timed out", RETRYABLE),
    (404, 'namespaces "falcon-jobs" not found', NOT_FOUND),
])
def test_api_errors_become_port_codes_with_the_servers_words(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer, code: int, message: str,
        expected: str) -> None:
    kube_server.inject("POST", r"/jobs$", code, message=message)
    with pytest.raises(PortError) as refused:
        edge.submit_job(manifest("task-7"))
    assert refused.value.code == expected
    assert message in refused.value.message
    assert "on cluster edge-a" in refused.value.message


def test_an_invalid_manifest_is_refused_by_the_server(edge: KubeEdgeCluster) -> None:
    broken = manifest("task-8")
    broken["spec"]["template"]["spec"]["containers"] = []
    with pytest.raises(PortError) as refused:
        edge.submit_job(broken)
    assert refused.value.code == INVALID
    assert "spec.template.spec.containers: Required value" in refused.value.message


def test_an_unreachable_api_server_is_retryable(kube_server: FakeKubeServer) -> None:
    clusters = KubeEdgeClusters(lambda c: KubeEndpoint("https://127.0.0.1:9", kube_server.ca_pem),
                                tokens=access_tokens(kube_server), request_timeout_seconds=2.0)
    with pytest.raises(PortError) as unreachable:
        clusters.for_cluster(edge_cluster_row()).delete_job("falcon-x")
    assert unreachable.value.code == RETRYABLE
    assert "cannot reach the Kubernetes API at https://127.0.0.1:9" in unreachable.value.message
    clusters.close()


# ---------------------------------------------------------------------------- nodes

def test_node_counts_of_a_pool(edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    kube_server.add_node("gke-a-1", "falcon-task-9-4x4")
    kube_server.add_node("gke-a-2", "falcon-task-9-4x4")
    kube_server.add_node("gke-a-3", "falcon-task-9-4x4", ready=False)
    kube_server.add_node("gke-b-1", "default-pool")

    assert edge.node_counts("falcon-task-9-4x4") == NodeCounts(registered=3, ready=2)
    kube_server.set_node_ready("gke-a-3", True)
    assert edge.node_counts("falcon-task-9-4x4") == NodeCounts(registered=3, ready=3)
    assert edge.node_counts("falcon-missing") == NodeCounts(registered=0, ready=0)


# ---------------------------------------------------------------------- diagnostics

NO_TPU = ("0/3 nodes are available: 3 Insufficient google.com/tpu. preemption: 0/3 nodes "
          "are available: 3 No preemption victims found for incoming pod.")
WEBHOOK = ('admission webhook "jobset.x-k8s.io" denied the request: follower pod node '
           "selector not set")


def test_diagnosis_puts_the_leaders_missing_accelerators_before_the_webhook_symptom(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    edge.submit_job(manifest("task-10", "4x4"))
    kube_server.add_node("gke-pool-1", "falcon-task-10-4x4")
    (leader,) = kube_server.start_pods("falcon-task-10", 1)
    # The follower pods never got created: the webhook complains on the Job, and the
    # complaint is the newest event. The leader waits for TPU chips.
    kube_server.unschedulable(leader, NO_TPU)
    kube_server.add_event("Job", "falcon-task-10", "FailedCreate", WEBHOOK,
                          source="job-controller")

    diagnosis = edge.diagnose_pending("falcon-task-10")

    assert diagnosis is not None
    assert diagnosis.startswith(f"pod {leader} cannot be scheduled: 0/3 nodes are available: "
                                "3 Insufficient google.com/tpu.")
    assert diagnosis.index("Insufficient google.com/tpu") < diagnosis.index("follower pod")


def test_diagnosis_leads_with_the_autoscaler_then_the_pool_without_ready_nodes(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    edge.submit_job(manifest("task-11", "2x2"))
    kube_server.add_node("gke-pool-11", "falcon-task-11-2x2", ready=False)
    (pod,) = kube_server.start_pods("falcon-task-11")
    kube_server.unschedulable(pod, "0/2 nodes are available: 1 node(s) had untolerated taint "
                                   "{node.kubernetes.io/not-ready: }, 1 node(s) didn't match "
                                   "Pod's node affinity/selector.")
    kube_server.add_event("Pod", pod, "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 "
                          "node(s) didn't match Pod's node affinity/selector",
                          event_type="Normal", source="cluster-autoscaler")

    diagnosis = edge.diagnose_pending("falcon-task-11") or ""

    first, second, third = diagnosis.split("; ")[:3]
    assert first == ("cluster autoscaler NotTriggerScaleUp: pod didn't trigger scale-up: 1 "
                     "node(s) didn't match Pod's node affinity/selector")
    assert second == "node pool falcon-task-11-2x2 has no Ready nodes (1 registered)"
    assert third.startswith(f"pod {pod} cannot be scheduled: 0/2 nodes are available")


def test_diagnosis_reads_container_waiting_and_termination_reasons(
        edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    edge.submit_job(manifest("task-12", "4x4", image="us-docker.pkg.dev/p/r/missing:1"))
    kube_server.add_node("gke-pool-12", "falcon-task-12-4x4")
    first, second = kube_server.start_pods("falcon-task-12", 2)
    kube_server.wait_container(first, "ErrImagePull", 'failed to pull image '
                               '"us-docker.pkg.dev/p/r/missing:1": not found')
    kube_server.finish_pod(second, 137, reason="OOMKilled")

    diagnosis = edge.diagnose_pending("falcon-task-12") or ""

    assert diagnosis.split("; ") == [
        (f'pod {first} container task: ErrImagePull: failed to pull image '
         '"us-docker.pkg.dev/p/r/missing:1": not found'),
        f"pod {second} container task terminated: OOMKilled (exit code 137)",
        # backoffLimit 0: the job controller failed the Job; that comes last.
        ("Job falcon-task-12 failed: BackoffLimitExceeded: Job has reached the specified "
         "backoff limit"),
    ]


def test_nothing_to_diagnose(edge: KubeEdgeCluster, kube_server: FakeKubeServer) -> None:
    assert edge.diagnose_pending("falcon-absent") is None
    edge.submit_job(manifest("task-13"))
    kube_server.start_pods("falcon-task-13")
    assert edge.diagnose_pending("falcon-task-13") is None  # just created: no news yet


# ---------------------------------------------------------------------------- token

def test_the_token_is_refreshed_before_it_expires() -> None:
    clock = VirtualClock(utcnow())
    with FakeKubeServer(token_lifetime_seconds=3600, clock=clock) as server:
        tokens = access_tokens(server, refresh_margin_seconds=300, clock=clock)
        clusters = edge_clusters_for(server, tokens=tokens)
        edge = clusters.for_cluster(edge_cluster_row())

        edge.get_job("falcon-a")
        edge.get_job("falcon-a")
        clock.advance(54 * 60)  # 6 minutes left: not yet in the margin
        edge.get_job("falcon-a")
        assert tokens.refreshes == 1
        clock.advance(2 * 60)  # 4 minutes left: refresh now, not at 0
        edge.get_job("falcon-a")
        clock.advance(10 * 60)  # the first token has expired by now
        edge.get_job("falcon-a")

        assert tokens.refreshes == 2
        assert len(server.tokens_used("/apis/")) == 2
        assert not [r for r in server.requests if r.status == 401]
        clusters.close()


def test_a_token_that_is_never_refreshed_is_refused_by_the_server() -> None:
    clock = VirtualClock(utcnow())
    with FakeKubeServer(token_lifetime_seconds=600, clock=clock) as server:
        static = google.oauth2.credentials.Credentials(token=server.issue_token())
        clusters = edge_clusters_for(server, tokens=GoogleAccessTokens(static, clock=clock))
        edge = clusters.for_cluster(edge_cluster_row())
        assert edge.get_job("falcon-a") is None

        clock.advance(11 * 60)
        with pytest.raises(PortError) as refused:
            edge.get_job("falcon-a")

        assert refused.value.code == PERMISSION_DENIED
        assert "401 Unauthorized" in refused.value.message
        clusters.close()


def test_a_revoked_token_is_replaced_after_invalidate(edge: KubeEdgeCluster,
                                                      kube_server: FakeKubeServer) -> None:
    assert edge.get_job("falcon-a") is None
    kube_server.expire_tokens()
    with pytest.raises(PortError) as refused:
        edge.get_job("falcon-a")
    assert refused.value.code == PERMISSION_DENIED

    assert edge.tokens is not None
    edge.tokens.invalidate()
    assert edge.get_job("falcon-a") is None
    assert len(kube_server.tokens_used("/apis/")) == 2


def test_a_bad_refresh_grant_is_a_clear_permission_error(kube_server: FakeKubeServer) -> None:
    wrong = google.oauth2.credentials.Credentials(
        token=None, refresh_token="not-the-right-one", token_uri=f"{kube_server.url}/token",
        client_id="x", client_secret="y")
    clusters = edge_clusters_for(kube_server, tokens=GoogleAccessTokens(
        wrong, auth_request=auth_request(kube_server)))
    with pytest.raises(PortError) as refused:
        clusters.for_cluster(edge_cluster_row()).get_job("falcon-a")
    assert refused.value.code == PERMISSION_DENIED
    assert "refreshing the Google access token" in refused.value.message
    clusters.close()
