"""One simulated world behind the wire protocols of GKE, Compute and Kubernetes.

The gcp backend's end-to-end tests run the real adapters (google-cloud-container,
google-cloud-compute, the kubernetes client, google-auth, google-cloud-pubsub) against
local servers whose state *is* a ``SimWorld``: node pools, operations, reservations,
Jobs, Pods and Nodes behave exactly as in the sim backend's lifecycle tests, so the same
scenarios must reach the same job-table results.

- ``SimGke`` answers ``google.container.v1.ClusterManager`` (gRPC and REST, through the
  servers of ``gke_server``) from the world's node-pool services; ``GetCluster`` hands
  out each edge cluster's Kubernetes endpoint and CA, as GKE does.
- ``SimCompute`` answers the Compute reservation URL from the world's reservation
  accounting (other Compute routes: ``FakeCompute``).
- ``SimKubeServer`` is a ``FakeKubeServer`` per edge cluster: a Job created through it
  is submitted to the world, a deleted one is deleted there, and after every change of
  the world its Jobs, Pods and Nodes are brought in line (``reflect``), so list/watch,
  resourceVersions and 410s are the fake API server's own and the real ``EdgeInformer``
  watches them and publishes to Google's Pub/Sub emulator. The Job controller's events
  on a Job are reflected too: ``SuccessfulCreate`` for each pod the world creates, and
  ``FailedCreate`` (aggregated, its count the world's) for a Job whose pods an
  admission webhook denies (the ``create-denied`` outcome) or a JobSet child whose
  followers the JobSet webhook refuses while its leader waits. A JobSet created through it
  is submitted to the world, whose JobSet controller makes the child Jobs
  (``<jobset>-slice-<i>``, recreated under the same names on a restart); the API server
  shows those children (owned by the JobSet, made as its own small controller makes
  them), their pods and events, then the JobSet's restarts and verdict, in that order.
- ``TokenAuthority`` is the OAuth2 token endpoint of a throwaway service-account key
  (``GOOGLE_APPLICATION_CREDENTIALS``), so ``google.auth.default()`` finds credentials
  the way it does in production and the Kubernetes servers accept its tokens.
- ``EdgeTrace`` tells a driver on a virtual clock when the edge pipeline is quiet:
  every Job change has been published by its informer (the newest observation
  published of each Job is the one the API server's state gives) and every published
  message has been acknowledged by the controller. Only then may virtual time jump.

Everything the world does happens under one lock; the world only moves when the test's
driver steps it or a client call reaches a server.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import datetime as dt
import http.server
import json
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import google.auth.jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.cloud import compute_v1, container_v1
from google.rpc import status_pb2

from falcon_es.adapters.gcp import informer as gcp_informer
from falcon_es.adapters.gcp import job_observations
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.sim import ClusterSim, SimWorld
from falcon_es.adapters.sim.config import SimClusterConfig
from falcon_es.adapters.sim.gke import NodePoolService
from falcon_es.adapters.sim.kube_api import KubeService
from falcon_es.adapters.sim.kube_objects import SimJob, SimPod
from falcon_es.domain.clock import Clock
from falcon_es.domain.ports import (
    ALREADY_EXISTS, INVALID, JOB_KIND, JOBSET_KIND, NOT_FOUND, PERMISSION_DENIED,
    QUOTA_EXCEEDED, RETRYABLE, STOCKOUT, BusMessage, CreateRefusal, NodePoolInfo,
    NodePoolSpec, Operation, PortError,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.tpu import TPU_TYPES, SliceShape, TopologyError, slice_shape
from tests.fakes import compute_server, gke_server, resource_manager_server
from tests.fakes.compute_server import FakeCompute, HttpError
from tests.fakes.gke_server import RPC_CODE, ApiError, refuse_disabled_upgrades
from tests.fakes.kube_server import (
    JOBSET_NAME_LABEL, FakeKubeServer, KubeApiError, timestamp,
)
from tests.fakes.resource_manager_server import FakeResourceManager

T = TypeVar("T")

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
SERVICE_ACCOUNT = "falcon-controller@falcon-test.iam.gserviceaccount.com"
#: Long enough that no scenario outlives a token (token expiry has tests of its own).
TOKEN_LIFETIME_SECONDS = 30 * 24 * 3600
#: A reservation configured without a machine type serves the 4-chip VMs of its
#: cluster's TPU type (every multi-host slice and the 4-chip single-host one).
RESERVED_CHIPS_PER_VM = 4
POOL_STATUS = MappingProxyType({status.name: status for status in container_v1.NodePool.Status})
#: The PortError codes the world raises -> the canonical status GKE answers with.
GKE_STATUS = MappingProxyType({
    NOT_FOUND: "NOT_FOUND", ALREADY_EXISTS: "ALREADY_EXISTS", INVALID: "INVALID_ARGUMENT",
    QUOTA_EXCEEDED: "RESOURCE_EXHAUSTED", PERMISSION_DENIED: "PERMISSION_DENIED",
})
#: A failed operation's PortError code -> (google.rpc code, StatusCondition code).
OPERATION_ERRORS = MappingProxyType({
    QUOTA_EXCEEDED: (RPC_CODE["RESOURCE_EXHAUSTED"],
                     container_v1.StatusCondition.Code.GCE_QUOTA_EXCEEDED),
    STOCKOUT: (RPC_CODE["RESOURCE_EXHAUSTED"], container_v1.StatusCondition.Code.GCE_STOCKOUT),
    RETRYABLE: (RPC_CODE["UNAVAILABLE"], None),
    INVALID: (RPC_CODE["INVALID_ARGUMENT"], None),
})
_CLUSTER_PATH = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/"
                           r"clusters/(?P<cluster>[^/]+)$")
_RESERVATION = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/"
                          r"reservations/(?P<name>[^/]+)$")


# ----------------------------------------------------------------------- tokens

class TokenAuthority:
    """Google's OAuth2 token endpoint, for a service-account key made for the test.

    Access tokens it issues are valid, on the world's clock, on every ``SimKubeServer``
    of the cloud (one Google identity for every edge cluster, as in production).
    """

    def __init__(self, clock: Clock, *, lifetime_seconds: int = TOKEN_LIFETIME_SECONDS) -> None:
        self.clock = clock
        self.lifetime = dt.timedelta(seconds=lifetime_seconds)
        self._lock = threading.Lock()
        self._tokens: dict[str, dt.datetime] = {}
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.grants: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def token_uri(self) -> str:
        if self._server is None:
            raise RuntimeError("the token endpoint is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def issue(self, lifetime: dt.timedelta | None = None) -> str:
        token = f"ya29.sim-{secrets.token_hex(8)}"
        with self._lock:
            self._tokens[token] = self.clock.now() + (lifetime or self.lifetime)
        return token

    def valid(self, token: str | None) -> bool:
        with self._lock:
            expiry = self._tokens.get(token or "")
        return expiry is not None and self.clock.now() < expiry

    def service_account_file(self, directory: Path, project: str) -> Path:
        """A key file as `gcloud iam service-accounts keys create` writes it, whose
        ``token_uri`` is this endpoint (``GOOGLE_APPLICATION_CREDENTIALS``)."""
        pem = self._key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()
        path = directory / "falcon-controller-key.json"
        path.write_text(json.dumps({
            "type": "service_account", "project_id": project, "private_key_id": "sim-key-1",
            "private_key": pem, "client_email": SERVICE_ACCOUNT, "client_id": "1000",
            "token_uri": self.token_uri,
        }))
        return path

    def grant(self, form: Mapping[str, str]) -> dict[str, Any]:
        """A JWT-bearer grant whose assertion the key signed -> an access token."""
        if form.get("grant_type") != JWT_GRANT or not form.get("assertion"):
            raise ValueError(f"unsupported grant {form.get('grant_type')!r}")
        public = self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        # google-auth addresses the assertion to Google's token endpoint whatever the
        # key file's token_uri says.
        claims = google.auth.jwt.decode(form["assertion"], certs=public.decode(),
                                        audience=[self.token_uri, GOOGLE_TOKEN_AUDIENCE])
        if claims.get("iss") != SERVICE_ACCOUNT:
            raise ValueError(f"assertion issued by {claims.get('iss')!r}")
        self.grants.append(str(claims.get("scope", "")))
        return {"access_token": self.issue(), "token_type": "Bearer",
                "expires_in": int(self.lifetime.total_seconds())}

    def start(self) -> TokenAuthority:
        authority = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                try:
                    status, body = 200, authority.grant(form)
                except ValueError as error:
                    status, body = 400, {"error": "invalid_grant",
                                         "error_description": str(error)}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.01},
                                        name="fake-token-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()


# ----------------------------------------------------------------------- the edge trace

EdgeKey = tuple[tuple[tuple[Any, ...], ...], str | None, int, int, tuple[str, int] | None]


def published_key(data: Mapping[str, Any]) -> EdgeKey:
    """What an observation says of its Job (pods, condition, counts, the Job
    controller's refusal)."""
    pods = tuple(sorted((p["name"], p["phase"], p["reason"], p["exit_code"], p["message"])
                        for p in data["pods"]))
    refusal = data.get("refusal")
    return (pods, data.get("condition"), int(data["succeeded"]), int(data["failed"]),
            None if refusal is None else (refusal["message"], int(refusal["count"])))


class EdgeTrace:
    """Which Job states the informers still have to publish, and which published
    messages the controller has not acknowledged yet."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generation = 0
        self._expected: dict[tuple[str, str], EdgeKey] = {}
        self._published: dict[tuple[str, str], EdgeKey] = {}
        self._unacked: set[str] = set()
        self._acked: set[str] = set()
        self.messages = 0

    def expect(self, cluster: str, job: str, key: EdgeKey | None) -> None:
        with self._changed:
            if key is None:
                self._expected.pop((cluster, job), None)
                self._published.pop((cluster, job), None)
            else:
                self._expected[(cluster, job)] = key
            self._generation += 1
            self._changed.notify_all()

    def published(self, cluster: str, data: Mapping[str, Any], message_id: str) -> None:
        with self._changed:
            self._published[(cluster, str(data["job_name"]))] = published_key(data)
            self.messages += 1
            if message_id not in self._acked:
                self._unacked.add(message_id)
            self._generation += 1
            self._changed.notify_all()

    def acked(self, message_ids: Sequence[str]) -> None:
        with self._changed:
            self._acked.update(message_ids)
            self._unacked.difference_update(message_ids)
            self._generation += 1
            self._changed.notify_all()

    def quiet(self) -> bool:
        with self._changed:
            return self._quiet()

    def _quiet(self) -> bool:
        return not self._unacked and all(
            self._published.get(job) == key for job, key in self._expected.items())

    def wait_until_published(self, timeout: float) -> bool:
        """Wait (wall time, bounded) until the informers have published every Job's
        current state, acknowledged or not: a reader that acks only when it next looks
        (``falcon-es smoke``) then finds everything there."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(self._published.get(job) == key
                            for job, key in self._expected.items()), timeout)

    def wait_for_news(self, timeout: float) -> None:
        """Wait (wall time, bounded) until something is published or acknowledged."""
        with self._changed:
            seen = self._generation
            self._changed.wait_for(lambda: self._generation != seen, timeout)

    def describe(self) -> str:
        with self._changed:
            behind = {f"{c}/{j}": (key, self._published.get((c, j)))
                      for (c, j), key in self._expected.items()
                      if self._published.get((c, j)) != key}
            return f"informers behind on {behind}; unacknowledged {sorted(self._unacked)}"


class TracedPublisher:
    """An informer's publisher: the real bus, plus a note of what went out."""

    def __init__(self, bus: Any, trace: EdgeTrace, cluster: str) -> None:
        self._bus, self._trace, self._cluster = bus, trace, cluster

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        message_id = str(self._bus.publish(topic, data, ordering_key=ordering_key,
                                           attributes=attributes))
        self._trace.published(self._cluster, data, message_id)
        return message_id


class TracedBus:
    """The controller's bus: the real one, plus a note of what it acknowledged."""

    def __init__(self, bus: Any, trace: EdgeTrace) -> None:
        self.inner, self._trace = bus, trace

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        return str(self.inner.publish(topic, data, ordering_key=ordering_key,
                                      attributes=attributes))

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        return self.inner.pull(subscription, max_messages)

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        self.inner.ack(subscription, message_ids)
        self._trace.acked(message_ids)


# ----------------------------------------------------------------------- Kubernetes

PodState = tuple[str, str | None, int | None, str | None, str | None, object]


def _pod_state(pod: SimPod) -> PodState:
    return pod.phase, pod.reason, pod.exit_code, pod.message, pod.node, pod.disruption


def _pod_status(pod: SimPod, containers: Sequence[str], moment: dt.datetime) -> dict[str, Any]:
    """The pod status the kubelet and the scheduler would report for this sim pod."""
    now = timestamp(moment)

    def containers_in(state: Mapping[str, Any], ready: bool = False) -> list[dict[str, Any]]:
        return [{"name": name, "state": dict(state), "ready": ready, "restartCount": 0,
                 "image": "image", "imageID": ""} for name in containers]

    status: dict[str, Any] = {"phase": pod.phase, "qosClass": "BestEffort"}
    if pod.phase == "Pending" and pod.node is None:
        if pod.reason == "Unschedulable":
            status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable", "message": pod.message or "",
                                     "lastTransitionTime": now}]
        return status
    status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    status["startTime"] = now
    if pod.phase == "Pending":
        waiting = {"reason": pod.reason or "ContainerCreating"}
        if pod.message:
            waiting["message"] = pod.message
        status["containerStatuses"] = containers_in({"waiting": waiting})
    elif pod.phase == "Running":
        status["conditions"].append({"type": "Ready", "status": "True"})
        status["containerStatuses"] = containers_in({"running": {"startedAt": now}}, ready=True)
    elif pod.exit_code is None:
        status["reason"] = pod.reason or "Failed"  # the pod went with its node
        if pod.message:
            status["message"] = pod.message
    else:
        if pod.disruption is not None:  # Kubernetes "Pod disruption conditions"
            reason, message = pod.disruption
            status["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": reason, "message": message,
                                         "lastTransitionTime": now})
        finished = (pod.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ")
                    if pod.finished_at is not None else now)
        terminated: dict[str, Any] = {"exitCode": pod.exit_code, "finishedAt": finished,
                                      "reason": pod.reason or "Error"}
        if pod.message:
            terminated["message"] = pod.message
        status["containerStatuses"] = containers_in({"terminated": terminated})
    return status


def _condition_of(job: Mapping[str, Any]) -> str | None:
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


class SimKubeServer(FakeKubeServer):
    """One edge cluster's API server whose Jobs, Pods and Nodes are the world's."""

    def __init__(self, cloud: SimBackedCloud, cluster_name: str, *, namespace: str) -> None:
        super().__init__(clock=cloud.world.clock, namespace=namespace,
                         token_lifetime_seconds=int(cloud.authority.lifetime.total_seconds()))
        self.cloud = cloud
        self.cluster_name = cluster_name
        self._pods: dict[tuple[str, str], PodState] = {}
        self._jobs: dict[str, tuple[Any, ...]] = {}
        self._nodes: dict[str, bool] = {}
        #: The FailedCreate count reflected per Job (the world's ``SimJob.refused``).
        self._refusals: dict[str, int] = {}
        #: The autoscaler event and its count reflected per pod (the world's
        #: ``SimPool.autoscaler_event`` and ``autoscaler_event_count``).
        self._autoscaled: dict[tuple[str, str], tuple[str, str, int]] = {}
        #: Per JobSet child reflected, the world's uid of that child: a JobSet restart
        #: recreates its children under the same names.
        self._child_uids: dict[str, str] = {}
        #: Per JobSet, the (restarts, condition, reason) reflected.
        self._jobsets: dict[str, tuple[int, str | None, str | None]] = {}
        #: Per JobSet, the count of its controller's JobCreationFailed reflected.
        self._creation_failures: dict[str, int] = {}

    # -- one identity for every cluster ----------------------------------------------

    def issue_token(self, lifetime: dt.timedelta | None = None) -> str:
        return self.cloud.authority.issue(lifetime)

    def token_valid(self, token: str | None) -> bool:
        return self.cloud.authority.valid(token)

    # -- Jobs go to the world ----------------------------------------------------------

    def _create_job(self, ns: str, body: Any) -> dict[str, Any]:
        return self.cloud.create_job(self, ns, body)

    def _delete_job(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        return self.cloud.delete_job(self, ns, name, policy)

    def _create_jobset(self, ns: str, body: Any, *, children: bool = True) -> dict[str, Any]:
        return self.cloud.create_job(self, ns, body)

    def _delete_jobset(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        return self.cloud.delete_job(self, ns, name, policy, JOBSET_KIND)

    def store_job(self, ns: str, body: Any) -> dict[str, Any]:
        return FakeKubeServer._create_job(self, ns, body)

    def store_jobset(self, ns: str, body: Any) -> dict[str, Any]:
        """The JobSet and its Service; its children are the world's (``reflect``)."""
        return FakeKubeServer._create_jobset(self, ns, body, children=False)

    def remove_jobset(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        """The JobSet, its children first (the world deleted them already, so they go
        here without a round through the world), then the JobSet and its Service."""
        with self._cond:
            self._jobsets.pop(name, None)
            jobset = self._objects.get(("jobsets", ns, name))
            if jobset is not None:
                for child in self._owned_by(jobset["metadata"]["uid"], "jobs", ns):
                    self.remove_job(ns, child["metadata"]["name"], "Background")
            return FakeKubeServer._delete_jobset(self, ns, name, policy)

    def remove_job(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        with self._cond:
            self._jobs.pop(name, None)
            self._refusals.pop(name, None)
            self._child_uids.pop(name, None)
            for key in [k for k in self._pods if k[0] == name]:
                del self._pods[key]
            return FakeKubeServer._delete_job(self, ns, name, policy)

    # -- the world's state, reflected --------------------------------------------------

    def reflect(self, kube: KubeService, pools: NodePoolService) -> dict[str, EdgeKey | None]:
        """Bring Nodes, Pods and Jobs in line with the simulated cluster. Returns, per
        Job that changed, what its informer must publish next (None: it went away)."""
        ns = self.namespace
        changed: dict[str, EdgeKey | None] = {}
        touched: set[str] = set()  # Jobs and JobSets whose observation may have changed
        with self._cond:
            self._reflect_nodes(pools)
            for name in self.names("jobsets", ns):
                if name not in kube.jobsets.jobsets:  # gone in the world (its TTL)
                    self.remove_jobset(ns, name, "Background")
                    changed[name] = None
            for name in self.names("jobs", ns):
                sim_job = kube.jobs.get(name)
                if sim_job is None or self._child_uids.get(name, sim_job.uid) != sim_job.uid:
                    # the TTL controller removed it, or a JobSet restart replaced it
                    parent = self._parent_of(ns, name)
                    self.remove_job(ns, name, "Background")
                    changed[name] = None
                    touched.update([parent] if parent else [])
            touched.update(self._add_children(ns, kube))
            for name, sim_job in kube.jobs.items():
                job = self._objects.get(("jobs", ns, name))
                if job is not None and self._reflect_job(ns, job, sim_job):
                    touched.add(sim_job.jobset or name)
                if job is not None:
                    # Events are not part of a Job's observation: the diagnosis reads
                    # them when the pods' change is folded.
                    self._reflect_autoscaler(ns, sim_job, pools)
            # After its children: the JobSet controller concludes from their status.
            touched.update(self._reflect_jobset_status(ns, kube))
            for name in touched:
                if ("jobsets", ns, name) in self._objects:
                    changed[name] = self._jobset_key(ns, name)
                elif ("jobs", ns, name) in self._objects:
                    changed[name] = self._key(ns, name)
        return changed

    def _parent_of(self, ns: str, job_name: str) -> str | None:
        job = self._objects.get(("jobs", ns, job_name)) or {}
        return ((job.get("metadata") or {}).get("labels") or {}).get(JOBSET_NAME_LABEL)

    def _add_children(self, ns: str, kube: KubeService) -> set[str]:
        """The child Jobs the world's JobSet controller made, added as the fake's own
        controller would make them."""
        touched = set()
        for name, sim_jobset in kube.jobsets.jobsets.items():
            jobset = self._objects.get(("jobsets", ns, name))
            if jobset is None:
                continue
            (entry,) = jobset["spec"]["replicatedJobs"]
            for child in sim_jobset.children:
                sim_child = kube.jobs.get(child)
                if sim_child is None or ("jobs", ns, child) in self._objects:
                    continue
                self.add_jobset_child(ns, jobset, entry, int(child.rsplit("-", 1)[1]))
                self._child_uids[child] = sim_child.uid
                touched.add(name)
        return touched

    def _reflect_jobset_status(self, ns: str, kube: KubeService) -> set[str]:
        """The world's JobSet restarts and verdict, and its controller's JobCreationFailed
        (an event on the JobSet, its count the world's)."""
        touched = set()
        for name, sim_jobset in kube.jobsets.jobsets.items():
            jobset = self._objects.get(("jobsets", ns, name))
            if jobset is None:
                continue
            failures = sim_jobset.creation_failures
            if sim_jobset.creation_failed and self._creation_failures.get(name) != failures:
                self._creation_failures[name] = failures
                self.record_event("JobSet", name, "JobCreationFailed",
                                  sim_jobset.creation_failed, namespace=ns, source="jobset",
                                  count=failures)
                touched.add(name)
            wanted = (sim_jobset.restarts, sim_jobset.condition, sim_jobset.condition_reason)
            if self._jobsets.get(name) == wanted:
                continue
            self._jobsets[name] = wanted
            updated = copy.deepcopy(jobset)
            status: dict[str, Any] = {"restarts": sim_jobset.restarts}
            if sim_jobset.condition is not None:
                now = timestamp(self.clock.now())
                status["conditions"] = [{
                    "type": sim_jobset.condition, "status": "True",
                    "reason": sim_jobset.condition_reason or "",
                    "message": f"jobset {sim_jobset.condition.lower()}",
                    "lastTransitionTime": now}]
            updated["status"] = status
            self._put("jobsets", ns, updated, "MODIFIED")
            touched.add(name)
        return touched

    def _reflect_nodes(self, pools: NodePoolService) -> None:
        wanted = {node.name: (pool, node.ready) for pool in pools.pools.values()
                  for node in pool.nodes}
        for name in sorted(set(self._nodes) - set(wanted)):
            del self._nodes[name]
            node = self._objects.get(("nodes", "", name))
            if node is not None:
                self._put("nodes", "", copy.deepcopy(node), "DELETED")
        for name, (pool, ready) in sorted(wanted.items()):
            if self._nodes.get(name) == ready:
                continue
            self._nodes[name] = ready
            node = {
                "metadata": {"name": name, "labels": dict(pool.node_labels())},
                "spec": {"taints": [{"key": "google.com/tpu", "value": "present",
                                     "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready",
                                           "status": "True" if ready else "False"}]},
            }
            event = "MODIFIED" if ("nodes", "", name) in self._objects else "ADDED"
            self._put("nodes", "", node, event)

    def _reflect_job(self, ns: str, job: dict[str, Any], sim_job: SimJob) -> bool:
        moment = self.clock.now()
        template = job["spec"]["template"]
        containers = [c["name"] for c in template["spec"]["containers"]]
        changed = False
        live = {pod.name for pod in sim_job.pods}
        for (job_name, pod_name) in [k for k in self._pods if k[0] == sim_job.name]:
            if pod_name not in live:
                del self._pods[(job_name, pod_name)]
                pod = self._objects.get(("pods", ns, pod_name))
                if pod is not None:
                    self._put("pods", ns, copy.deepcopy(pod), "DELETED")
                changed = True
        for sim_pod in sim_job.pods:
            state = _pod_state(sim_pod)
            if self._pods.get((sim_job.name, sim_pod.name)) == state:
                continue
            self._pods[(sim_job.name, sim_pod.name)] = state
            existing = self._objects.get(("pods", ns, sim_pod.name))
            pod = copy.deepcopy(existing) if existing else self._new_pod(ns, job, sim_pod)
            if sim_pod.node or sim_pod.last_node:
                pod["spec"]["nodeName"] = sim_pod.node or sim_pod.last_node
            pod["status"] = _pod_status(sim_pod, containers, moment)
            self._put("pods", ns, pod, "MODIFIED" if existing else "ADDED")
            if not existing:
                self.record_event("Job", sim_job.name, "SuccessfulCreate",
                                  f"Created pod: {sim_pod.name}", namespace=ns,
                                  event_type="Normal")
            changed = True
        refused = sim_job.refused
        if refused is not None and self._refusals.get(sim_job.name) != refused.count:
            self._refusals[sim_job.name] = refused.count
            self.record_event("Job", sim_job.name, "FailedCreate",
                              refused.event_message, namespace=ns,
                              count=refused.count, first=refused.first)
            changed = True
        wanted = self._job_status(sim_job)
        if self._jobs.get(sim_job.name) != wanted:
            self._jobs[sim_job.name] = wanted
            updated = copy.deepcopy(job)
            updated["status"] = self._status_body(wanted, job.get("status") or {}, moment)
            self._put("jobs", ns, updated, "MODIFIED")
            changed = True
        return changed

    def _reflect_autoscaler(self, ns: str, sim_job: SimJob, pools: NodePoolService) -> None:
        """The cluster autoscaler's latest event about the Job's pool, on each of its
        unscheduled pods, as the autoscaler records it (source cluster-autoscaler;
        FailedScaleUp a Warning, TriggeredScaleUp and NotTriggerScaleUp Normal; a
        repeat the world counted counts up the pod's same event)."""
        pool = pools.pools.get(sim_job.pool or "")
        if pool is None or pool.autoscaler_event is None:
            return
        reason, message = pool.autoscaler_event
        said = (reason, message, pool.autoscaler_event_count)
        for sim_pod in sim_job.pods:
            key = (sim_job.name, sim_pod.name)
            if sim_pod.node is not None or sim_pod.phase != "Pending" or \
                    self._autoscaled.get(key) == said:
                continue
            self._autoscaled[key] = said
            self.record_event("Pod", sim_pod.name, reason, message, namespace=ns,
                              event_type="Warning" if reason == "FailedScaleUp" else "Normal",
                              source="cluster-autoscaler")

    def _new_pod(self, ns: str, job: Mapping[str, Any], sim_pod: SimPod) -> dict[str, Any]:
        """A pod as the job controller creates it from the Job's template."""
        template = job["spec"]["template"]
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
        annotations = dict((template.get("metadata") or {}).get("annotations") or {})
        if job["spec"].get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(sim_pod.index)
            annotations["batch.kubernetes.io/job-completion-index"] = str(sim_pod.index)
        return {
            "metadata": {"name": sim_pod.name, "namespace": ns, "labels": labels,
                         "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": name, "uid": uid, "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": copy.deepcopy(template["spec"]),
            "status": {},
        }

    @staticmethod
    def _job_status(sim_job: SimJob) -> tuple[Any, ...]:
        phases = [pod.phase for pod in sim_job.pods]
        return (sum(1 for p in phases if p in ("Pending", "Running")),
                sum(1 for p in phases if p == "Running"),
                sum(1 for p in phases if p == "Succeeded"), sim_job.failed, sim_job.condition)

    @staticmethod
    def _status_body(wanted: tuple[Any, ...], current: Mapping[str, Any],
                     moment: dt.datetime) -> dict[str, Any]:
        active, ready, succeeded, failed, condition = wanted
        status: dict[str, Any] = {"startTime": current.get("startTime") or timestamp(moment),
                                  "ready": ready}
        for field, value in (("active", active), ("succeeded", succeeded), ("failed", failed)):
            if value:
                status[field] = value
        if condition is not None:
            kept = [c for c in current.get("conditions") or () if c.get("type") == condition]
            status["conditions"] = kept or [{
                "type": condition, "status": "True", "lastProbeTime": timestamp(moment),
                "lastTransitionTime": timestamp(moment),
                **({"reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit"}
                   if condition == "Failed" else {})}]
            if condition == "Complete":
                status["completionTime"] = current.get("completionTime") or timestamp(moment)
        return status

    def _key(self, ns: str, name: str) -> EdgeKey:
        """What the informer's observation of the Job will say (its own pod reading)."""
        job = self._objects[("jobs", ns, name)]
        pods, succeeded, failed, refusal = self._parts(ns, job)
        return (tuple(sorted(pods)), _condition_of(job), succeeded, failed,
                None if refusal is None else (refusal.message, refusal.count))

    def _jobset_key(self, ns: str, name: str) -> EdgeKey:
        """What the informer's observation of the JobSet will say: its children's pods
        and counts summed, its controller's refusal or else the first child's (named),
        the JobSet's verdict."""
        jobset = self._objects[("jobsets", ns, name)]
        uid = jobset["metadata"]["uid"]
        children = sorted(
            (job for (kind, space, _), job in self._objects.items()
             if kind == "jobs" and space == ns and any(
                 o.get("uid") == uid for o in job["metadata"].get("ownerReferences", ()))),
            key=lambda job: int(str(job["metadata"]["name"]).rsplit("-", 1)[1]))
        pods: list[tuple[Any, ...]] = []
        succeeded = failed = 0
        refusal: tuple[str, int] | None = None
        for child in children:
            child_pods, child_succeeded, child_failed, refused = self._parts(ns, child)
            pods.extend(child_pods)
            succeeded, failed = succeeded + child_succeeded, failed + child_failed
            if refused is not None and refusal is None:
                refusal = (f"child Job {child['metadata']['name']}: {refused.message}",
                           refused.count)
        own = job_observations.jobset_refusal(jobset, [
            event for (kind, space, _), event in self._objects.items()
            if kind == "events" and space == ns and event["involvedObject"].get("uid") == uid],
            len(children))
        if own is not None:  # the controller's own refusal, upstream of a child's
            refusal = (own.message, own.count)
        verdicts = {"Completed": "Complete", "Failed": "Failed"}
        condition = next((verdicts[c["type"]] for c in (jobset.get("status") or {}).get(
            "conditions") or () if c.get("type") in verdicts and c.get("status") == "True"),
            None)
        return tuple(sorted(pods)), condition, succeeded, failed, refusal

    def _parts(self, ns: str, job: Mapping[str, Any]) -> tuple[
            list[tuple[Any, ...]], int, int, CreateRefusal | None]:
        """A Job's pods (as the informer reads them), counts and refusal."""
        uid = job["metadata"]["uid"]
        pods = [job_observations.pod_observation(pod)
                for (kind, space, _), pod in self._objects.items()
                if kind == "pods" and space == ns and any(
                    o.get("uid") == uid for o in pod["metadata"].get("ownerReferences", ()))]
        status = job.get("status") or {}
        refusal = job_observations.refusal_of(
            event for (kind, space, _), event in self._objects.items()
            if kind == "events" and space == ns and event["involvedObject"].get("uid") == uid)
        return ([(p.name, p.phase, p.reason, p.exit_code, p.message) for p in pods],
                int(status.get("succeeded") or 0), int(status.get("failed") or 0), refusal)


# ----------------------------------------------------------------------- GKE

@dataclasses.dataclass(frozen=True)
class _OperationRecord:
    cluster: str
    kind: container_v1.Operation.Type
    pool: str


class SimGke:
    """``google.container.v1.ClusterManager`` over the world (for ``gke_server``'s
    ``serve_grpc`` / ``serve_rest``, which call these methods by name)."""

    def __init__(self, cloud: SimBackedCloud) -> None:
        self.cloud = cloud
        self.raw_bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._operations: dict[str, _OperationRecord] = {}
        self._created: dict[tuple[str, str], container_v1.NodePool] = {}
        #: What ``GetCluster`` reports (``falcon-es doctor`` checks these).
        self.workload_identity = True
        self.gcs_fuse = True
        self.release_channel = container_v1.ReleaseChannel.Channel.REGULAR

    def _cluster(self, path: str) -> tuple[ClusterSim, Cluster]:
        match = _CLUSTER_PATH.match(path)
        config = self.cloud.world.config.cluster(match["cluster"]) if match else None
        if (match is None or config is None or config.project != match["project"]
                or config.location != match["location"]):
            raise ApiError("NOT_FOUND", f"Not found: {path}.")
        row = Cluster(id=f"sim-{config.name}", name=config.name, project=config.project,
                      location=config.location, tpu_type=config.tpu_type,
                      gcs_bucket=config.gcs_bucket or "", status="active",
                      default_reservation=config.default_reservation,
                      created_at=self.cloud.world.clock.now(),
                      node_location=config.node_location)
        return self.cloud.world.cluster(config.name), row

    def _call(self, action: Callable[[dt.datetime], T]) -> T:
        try:
            return self.cloud.call(action)
        except PortError as error:
            status = GKE_STATUS.get(error.code)
            if status is None:
                status = ("RESOURCE_EXHAUSTED" if "too many operations" in error.message.lower()
                          else "FAILED_PRECONDITION")
            raise ApiError(status, error.message) from None

    def create_node_pool(self, request: container_v1.CreateNodePoolRequest
                         ) -> container_v1.Operation:
        sim, row = self._cluster(request.parent)
        pool = container_v1.NodePool(request.node_pool)
        refuse_disabled_upgrades(self.get_cluster(container_v1.GetClusterRequest(
            name=request.parent)), pool)
        spec = NodePoolSpec(cluster=row, name=pool.name, shape=_shape_of(pool),
                            supply_mode=_supply_mode_of(pool), reservation=_reservation_of(pool),
                            scale_down_unneeded_seconds=_delay_of(pool),
                            labels=dict(pool.config.labels), locations=tuple(pool.locations))
        operation = self._call(lambda now: sim.gke.create(spec, now))
        with self._lock:
            self._created[(row.name, pool.name)] = pool
        return self._operation(operation, _OperationRecord(
            row.name, container_v1.Operation.Type.CREATE_NODE_POOL, pool.name))

    def get_operation(self, request: container_v1.GetOperationRequest
                      ) -> container_v1.Operation:
        operation_id = request.name.rsplit("/", 1)[-1]
        with self._lock:
            record = self._operations.get(operation_id)
        if record is None:
            raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
        sim = self.cloud.world.cluster(record.cluster)
        return self._operation(self._call(lambda now: sim.gke.get_operation(operation_id)),
                               record)

    def get_node_pool(self, request: container_v1.GetNodePoolRequest) -> container_v1.NodePool:
        sim, row = self._cluster(request.name.split("/nodePools/")[0])
        name = request.name.rsplit("/", 1)[-1]
        return self._node_pool(row, self._call(lambda now: sim.gke.get(name, now)))

    def list_node_pools(self, request: container_v1.ListNodePoolsRequest
                        ) -> container_v1.ListNodePoolsResponse:
        sim, row = self._cluster(request.parent)
        infos = self._call(lambda now: sim.gke.list(now))
        return container_v1.ListNodePoolsResponse(
            node_pools=[self._node_pool(row, info) for info in infos])

    def delete_node_pool(self, request: container_v1.DeleteNodePoolRequest
                         ) -> container_v1.Operation:
        sim, row = self._cluster(request.name.split("/nodePools/")[0])
        name = request.name.rsplit("/", 1)[-1]
        operation = self._call(lambda now: sim.gke.delete(name, now))
        if operation is None:
            raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
        return self._operation(operation, _OperationRecord(
            row.name, container_v1.Operation.Type.DELETE_NODE_POOL, name))

    def get_cluster(self, request: container_v1.GetClusterRequest) -> container_v1.Cluster:
        sim, row = self._cluster(request.name)
        server = self.cloud.kube[row.name]
        ca = base64.b64encode((server.ca_pem or "").encode()).decode()
        return container_v1.Cluster(
            name=row.name, location=row.location, locations=list(sim.identity.zones),
            endpoint=server.endpoint, status=container_v1.Cluster.Status.RUNNING,
            master_auth=container_v1.MasterAuth(cluster_ca_certificate=ca),
            current_master_version="1.33.5-gke.1000000",
            workload_identity_config=container_v1.WorkloadIdentityConfig(
                workload_pool=f"{row.project}.svc.id.goog" if self.workload_identity else ""),
            addons_config=container_v1.AddonsConfig(
                gcs_fuse_csi_driver_config=container_v1.GcsFuseCsiDriverConfig(
                    enabled=self.gcs_fuse)),
            release_channel=container_v1.ReleaseChannel(channel=self.release_channel),
        )

    def _operation(self, operation: Operation, record: _OperationRecord
                   ) -> container_v1.Operation:
        with self._lock:
            self._operations[operation.id] = record
        message = container_v1.Operation(
            name=operation.id, operation_type=record.kind,
            status=(container_v1.Operation.Status.DONE if operation.done
                    else container_v1.Operation.Status.RUNNING),
            target_link=f"https://container.googleapis.com/v1/clusters/{record.cluster}/"
                        f"nodePools/{record.pool}",
        )
        if operation.error:
            rpc_code, condition = OPERATION_ERRORS.get(operation.error_code or "",
                                                       (RPC_CODE["INTERNAL"], None))
            message.error = status_pb2.Status(code=rpc_code, message=operation.error)
            if condition is not None:
                message.nodepool_conditions = [container_v1.StatusCondition(
                    code=condition, message=operation.error)]
        return message

    def _node_pool(self, row: Cluster, info: NodePoolInfo) -> container_v1.NodePool:
        with self._lock:
            created = self._created.get((row.name, info.name))
        pool = container_v1.NodePool(created) if created is not None else container_v1.NodePool(
            name=info.name, initial_node_count=info.node_count,
            config=container_v1.NodeConfig(labels=dict(info.labels)))
        pool.status = POOL_STATUS[info.status]
        pool.status_message = info.status_message
        return pool


def _shape_of(pool: container_v1.NodePool) -> SliceShape:
    """The slice the request describes, checked against its wire fields as GKE would
    (machine type, node count, TPU topology)."""
    labels = pool.config.labels
    try:
        shape = slice_shape(labels.get("falcon-tpu-type", ""), labels.get("falcon-topology", ""),
                            pool.config.machine_type)
    except TopologyError as error:
        raise ApiError("INVALID_ARGUMENT", f"node pool {pool.name}: machine type "
                                           f"{pool.config.machine_type} cannot host the slice: "
                                           f"{error}") from None
    nodes = pool.autoscaling.max_node_count if pool.config.flex_start else pool.initial_node_count
    if nodes != shape.hosts:
        raise ApiError("INVALID_ARGUMENT", f"a {shape.topology} slice on {shape.machine_type} "
                                           f"needs {shape.hosts} nodes, not {nodes}")
    topology = pool.placement_policy.tpu_topology
    if topology and topology != shape.topology:
        raise ApiError("INVALID_ARGUMENT", f"placement topology {topology} differs from the "
                                           f"slice's {shape.topology}")
    return shape


def _supply_mode_of(pool: container_v1.NodePool) -> str:
    if pool.config.flex_start:
        return "flex-start"
    specific = container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION
    if pool.config.reservation_affinity.consume_reservation_type == specific:
        return "reservation"
    return "on-demand"


def _reservation_of(pool: container_v1.NodePool) -> str | None:
    values = list(pool.config.reservation_affinity.values)
    return values[0] if values else None


def _delay_of(pool: container_v1.NodePool) -> int:
    delay = pool.config.consolidation_delay
    return int(delay.total_seconds()) if isinstance(delay, dt.timedelta) else 0


# ----------------------------------------------------------------------- Compute

class SimCompute:
    """Compute's reservation GET over the world's reservation accounting (for
    ``compute_server.serve_rest``, which calls ``handle``)."""

    def __init__(self, cloud: SimBackedCloud) -> None:
        self.cloud = cloud
        self.others = FakeCompute()

    def handle(self, method: str, path: str, body: bytes) -> Any:
        match = _RESERVATION.match(path)
        if method != "GET" or match is None:
            return self.others.handle(method, path, body)
        project, zone, name = match["project"], match["zone"], match["name"]
        config = next((c for c in self.cloud.world.config.clusters
                       if c.project == project and _reservation_zone(c, name) == zone), None)
        if config is None:
            raise HttpError(404, f"The resource 'projects/{project}/zones/{zone}/reservations/"
                                 f"{name}' was not found")
        usage = self.cloud.call(lambda now: self.cloud.world.reservation_usage(config.name, name))
        machine_type = usage.machine_type or (
            f"{TPU_TYPES[config.tpu_type].machine_prefix}-{RESERVED_CHIPS_PER_VM}t")
        return compute_v1.Reservation(
            name=name, status="READY", specific_reservation_required=True,
            zone=f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            specific_reservation=compute_v1.AllocationSpecificSKUReservation(
                count=usage.count, in_use_count=usage.in_use + usage.held_by_pools,
                assured_count=usage.count,
                instance_properties=compute_server.InstanceProperties(machine_type=machine_type),
            ),
        )


def _reservation_zone(config: SimClusterConfig, name: str) -> str | None:
    """The zone the cluster's reservation ``name`` lives in (None: it has none)."""
    reservation = config.reservation(name)
    if reservation is None or config.location is None:
        return None
    return reservation.zone or config.node_zone(config.location)


# ----------------------------------------------------------------------- the cloud

class SimBackedCloud:
    """The world, its lock, and every server that fronts it."""

    def __init__(self, world: SimWorld, *, namespace: str = "falcon-jobs",
                 gke_transport: str = "grpc") -> None:
        self.world = world
        self.lock = threading.RLock()
        self.authority = TokenAuthority(world.clock)
        self.trace = EdgeTrace()
        self.gke = SimGke(self)
        self.compute = SimCompute(self)
        self.resource_manager = FakeResourceManager()
        self.gke_transport = gke_transport
        self.kube = {config.name: SimKubeServer(self, config.name, namespace=namespace)
                     for config in world.config.clusters}
        self.endpoints: dict[str, str] = {}
        self._stack = contextlib.ExitStack()
        self._informers: list[tuple[threading.Event, threading.Thread]] = []

    def start(self) -> SimBackedCloud:
        self.authority.start()
        self._stack.callback(self.authority.stop)
        for server in self.kube.values():
            server.start()
            self._stack.callback(server.stop)
        serve = gke_server.serve_grpc if self.gke_transport == "grpc" else gke_server.serve_rest
        self.endpoints["gke"] = self._stack.enter_context(serve(self.gke))  # type: ignore[arg-type]
        self.endpoints["compute"] = self._stack.enter_context(
            compute_server.serve_rest(self.compute))  # type: ignore[arg-type]
        self.endpoints["resource_manager"] = self._stack.enter_context(
            resource_manager_server.serve_rest(self.resource_manager))
        return self

    def stop(self) -> None:
        for stop, _ in self._informers:
            stop.set()
        for server in self.kube.values():
            server.end_watches()  # an informer sees its stop between two watch events
        for _, thread in self._informers:
            thread.join(timeout=10)
        self._stack.close()

    def environment(self, key_file: Path) -> dict[str, str]:
        """What ``falcon-es run --backend gcp`` needs to find this cloud."""
        return {"FALCON_GKE_ENDPOINT": self.endpoints["gke"],
                "FALCON_GKE_TRANSPORT": self.gke_transport,
                "FALCON_COMPUTE_ENDPOINT": self.endpoints["compute"],
                "FALCON_RESOURCE_MANAGER_ENDPOINT": self.endpoints["resource_manager"],
                "GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}

    # -- the world moves here ------------------------------------------------------

    def call(self, action: Callable[[dt.datetime], T]) -> T:
        """One API call on the world at the clock's moment, then reflect its effects."""
        with self.lock:
            try:
                return self.world.call(action)
            finally:
                self.sync()

    def step(self) -> None:
        """Play the world up to the clock and reflect what changed."""
        with self.lock:
            self.world.step()
            self.sync()

    def sync(self) -> None:
        with self.lock:
            for name, server in self.kube.items():
                sim = self.world.cluster(name)
                for job, key in server.reflect(sim.kube, sim.gke).items():
                    self.trace.expect(name, job, key)

    def create_job(self, server: SimKubeServer, ns: str, body: Any) -> dict[str, Any]:
        """A Job or a JobSet: submitted to the world (whose JobSet controller makes a
        JobSet's children), then stored by the API server."""
        sim = self.world.cluster(server.cluster_name)
        kind = JOBSET_KIND if (body or {}).get("kind") == JOBSET_KIND else JOB_KIND
        store = server.store_jobset if kind == JOBSET_KIND else server.store_job
        with self.lock:
            try:
                self.world.call(lambda now: sim.kube.submit(body, now))
            except PortError as error:
                raise _kube_error(error, body) from None
            try:
                created = store(ns, body)
            except KubeApiError:
                self.world.call(lambda now: sim.kube.delete_job(body["metadata"]["name"], now,
                                                                kind))
                raise
            self.sync()
            return created

    def delete_job(self, server: SimKubeServer, ns: str, name: str, policy: str | None,
                   kind: str = JOB_KIND) -> dict[str, Any]:
        sim = self.world.cluster(server.cluster_name)
        remove = server.remove_jobset if kind == JOBSET_KIND else server.remove_job
        with self.lock:
            result = remove(ns, name, policy)
            self.world.call(lambda now: sim.kube.delete_job(name, now, kind))
            self.trace.expect(server.cluster_name, name, None)
            self.sync()
            return result

    # -- informers -------------------------------------------------------------------

    def start_informer(self, cluster: Cluster, edges: KubeEdgeClusters, bus: Any,
                       settings: gcp_informer.InformerSettings) -> None:
        """The real informer of ``cluster``, publishing through ``bus`` (traced)."""
        stop = threading.Event()
        publisher = TracedPublisher(bus, self.trace, cluster.name)
        thread = threading.Thread(
            target=gcp_informer.run_informer, args=(cluster, edges, publisher, stop),
            kwargs={"settings": settings, "clock": self.world.clock},
            name=f"informer-{cluster.name}", daemon=True)
        thread.start()
        self._informers.append((stop, thread))
        self.kube[cluster.name].wait_for_watches(4)


def _kube_error(error: PortError, body: Any) -> KubeApiError:
    name = ((body or {}).get("metadata") or {}).get("name", "")
    if error.code == ALREADY_EXISTS:
        group, kind = (("jobset.x-k8s.io", "jobsets") if (body or {}).get("kind") == JOBSET_KIND
                       else ("batch", "jobs"))
        return KubeApiError(409, "AlreadyExists", f'{kind}.{group} "{name}" already exists',
                            {"name": name, "group": group, "kind": kind})
    if error.code == INVALID:
        return KubeApiError(422, "Invalid", error.message)
    if error.code == QUOTA_EXCEEDED:  # a ResourceQuota's admission refusal
        return KubeApiError(403, "Forbidden", error.message)
    return KubeApiError(500, "InternalError", error.message)


@contextlib.contextmanager
def sim_backed_cloud(world: SimWorld, **options: Any) -> Iterator[SimBackedCloud]:
    cloud = SimBackedCloud(world, **options).start()
    try:
        yield cloud
    finally:
        cloud.stop()
