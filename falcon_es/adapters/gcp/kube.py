"""The EdgeCluster port on an edge GKE cluster's Kubernetes API (the ``kubernetes`` client).

Where and as whom: the API server's address and CA come from GKE's ``get_cluster``
(``endpoint`` and the base64 ``master_auth.cluster_ca_certificate``) through an
``EndpointProvider``, so no kubeconfig exists anywhere; the bearer token is a Google
access token from ``google.auth.default()`` (Workload Identity in the central
cluster). One ``ApiClient`` per cluster is built on first use and cached.

The token: kubernetes 37 asks ``refresh_api_key_hook`` for the key before every
request, but only when ``api_key`` already holds the key (reference §6.2), so the key
is seeded and the hook keeps it current. The hook refreshes the credentials a margin
*before* they expire, so a reconnecting watch never presents a token that is about to
lapse; long watches therefore outlive any one token (the informer reconnects them).

Effects are idempotent, since an intent left open by a crash is carried out again: a
Job that already exists is adopted when it
carries the same task id, deleting a Job that is gone is success, and deletes
propagate (Background by default) so the pods go with the Job; batch/v1 would
otherwise orphan them.

A multi-host Job comes with its headless Service (``manifests.render_headless_service``)
in the same ``submit_job``: created right after the Job, whose uid its ownerReference
needs, and again whenever a submit adopts the Job, so a crash between the two creates
heals when the submit is re-issued. An existing Service of the task's is adopted (one
left by an earlier Job of the same name is replaced); one of anybody else's fails the
submit and takes the just-submitted Job away again, since its workers could never find
each other. Deleting the Job deletes the Service: the garbage collector follows the
ownerReference.

``diagnose_pending`` puts the root cause first, so the Message says what to fix rather
than the symptom: a node pool without Ready
nodes, then a pod the scheduler cannot place (PodScheduled=False / FailedScheduling),
then containers that cannot start or died, and only then complaints about the Job
itself (FailedCreate from an admission webhook is a symptom when the leader pod is
Pending for lack of accelerators).
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import google.auth
import google.auth.transport.requests
import urllib3
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import Credentials
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from falcon_es.adapters.gcp.errors import port_error
from falcon_es.clock import Clock, WallClock, utcnow
from falcon_es.manifests import (
    MANAGED_BY,
    MANAGED_BY_VALUE,
    TASK_ID_ANNOTATION,
    TASK_LABEL,
    render_headless_service,
)
from falcon_es.ports import (
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
from falcon_es.registry import Cluster

log = logging.getLogger("falcon_es.adapters.gcp.kube")

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_NAMESPACE = "falcon-jobs"
PROPAGATION_POLICIES = ("Background", "Foreground")
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
FALCON_SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE}"
#: Refresh this long before the token expires (google-auth itself says 3 min 45 s).
DEFAULT_REFRESH_MARGIN_SECONDS = 300
#: Waiting reasons of a container that will not start by itself.
CONTAINER_FAILURES = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
    "CrashLoopBackOff",
})
#: Cluster-autoscaler event reasons on a pending pod worth quoting next to the cause.
AUTOSCALER_REASONS = frozenset({"NotTriggerScaleUp", "FailedScaleUp"})
#: Findings quoted in a diagnosis at most (the first is the root cause).
MAX_FINDINGS = 3
#: Pending pods whose events are read, leader first (a 64-host slice has 64 pods).
MAX_PODS_EXAMINED = 3
_PLACEHOLDER_TOKEN = "token-not-fetched-yet"


@dataclasses.dataclass(frozen=True)
class KubeEndpoint:
    """Where an edge cluster's API server listens and the CA that signs its certificate
    (PEM text; None trusts the system store, as for a DNS endpoint with a public CA)."""

    host: str
    ca_cert_pem: str | None


EndpointProvider = Callable[[Cluster], KubeEndpoint]


def endpoint_from_gke(gke_cluster: Any) -> KubeEndpoint:
    """The API server of a ``google.cloud.container_v1.Cluster`` (get_cluster's answer).

    The IP endpoint is preferred; a cluster with only the DNS-based control-plane
    endpoint is reached through that name.
    """
    address = gke_cluster.endpoint
    if not address:
        dns = gke_cluster.control_plane_endpoints_config.dns_endpoint_config.endpoint
        address = dns
    if not address:
        raise PortError(INVALID, f"GKE cluster {gke_cluster.name} reports no control-plane "
                                 "endpoint (is it still being created?)")
    encoded = gke_cluster.master_auth.cluster_ca_certificate
    ca_pem = None
    if encoded:
        try:
            ca_pem = base64.b64decode(encoded, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError) as error:
            raise PortError(INVALID, f"GKE cluster {gke_cluster.name}: cluster CA certificate "
                                     f"is not base64 PEM ({error})") from None
    host = address if address.startswith(("https://", "http://")) else f"https://{address}"
    return KubeEndpoint(host, ca_pem)


class GkeEndpoints:
    """An ``EndpointProvider`` that asks GKE: ``get_cluster`` on the cluster's resource
    name (``projects/P/locations/L/clusters/N``) with a ClusterManagerClient."""

    def __init__(self, cluster_manager: Any) -> None:
        self._cluster_manager = cluster_manager

    def __call__(self, cluster: Cluster) -> KubeEndpoint:
        name = f"projects/{cluster.project}/locations/{cluster.location}/clusters/{cluster.name}"
        try:
            gke_cluster = self._cluster_manager.get_cluster(name=name)
        except gexc.GoogleAPIError as error:
            raise port_error(error, f"reading GKE cluster {name} for its endpoint") from error
        return endpoint_from_gke(gke_cluster)


class GoogleAccessTokens:
    """Google OAuth2 access tokens for the Kubernetes API, refreshed before expiry.

    ``credentials`` default to ``google.auth.default()`` (fetched on first use);
    ``auth_request`` is the google-auth transport used to refresh them.
    """

    def __init__(
        self,
        credentials: Credentials | None = None,
        *,
        scopes: Sequence[str] = (CLOUD_PLATFORM_SCOPE,),
        refresh_margin_seconds: float = DEFAULT_REFRESH_MARGIN_SECONDS,
        clock: Clock | None = None,
        auth_request: google.auth.transport.Request | None = None,
    ) -> None:
        self._credentials = credentials
        self._scopes = tuple(scopes)
        self._margin = dt.timedelta(seconds=refresh_margin_seconds)
        self._clock = clock or WallClock()
        self._auth_request = auth_request
        self._lock = threading.Lock()
        self._valid_until: dt.datetime | None = None
        self.refreshes = 0

    def token(self) -> str:
        with self._lock:
            credentials = self._ensure_credentials()
            if self._needs_refresh(credentials):
                self._refresh(credentials)
            return str(credentials.token)

    def invalidate(self) -> None:
        """Forget the current token (the API server refused it): the next call refreshes."""
        with self._lock:
            self._valid_until = None
            if self._credentials is not None:
                self._credentials.token = None

    def _ensure_credentials(self) -> Credentials:
        if self._credentials is None:
            try:
                self._credentials, _ = google.auth.default(scopes=list(self._scopes))
            except auth_exceptions.DefaultCredentialsError as error:
                raise PortError(PERMISSION_DENIED, "no Google credentials for the Kubernetes "
                                                   f"API: {error}") from None
        return self._credentials

    def _needs_refresh(self, credentials: Credentials) -> bool:
        if not credentials.token:
            return True
        if self._valid_until is None:
            if credentials.expiry is None:
                return False  # a token without expiry: kept until the server refuses it
            self._valid_until = self._on_our_clock(credentials.expiry)
        return self._clock.now() >= self._valid_until - self._margin

    def _on_our_clock(self, expiry: dt.datetime) -> dt.datetime:
        """google-auth stamps ``expiry`` with the wall clock; what counts is the token's
        remaining lifetime, measured from now on the injected clock."""
        return self._clock.now() + (expiry.replace(tzinfo=None) - utcnow())

    def _refresh(self, credentials: Credentials) -> None:
        request = self._auth_request or google.auth.transport.requests.Request()
        try:
            credentials.refresh(request)
        except auth_exceptions.RefreshError as error:
            code = RETRYABLE if getattr(error, "retryable", False) else PERMISSION_DENIED
            raise PortError(code, f"refreshing the Google access token: {error}") from None
        except auth_exceptions.TransportError as error:
            raise PortError(RETRYABLE, f"refreshing the Google access token: {error}") from None
        self.refreshes += 1
        expiry = credentials.expiry
        self._valid_until = self._on_our_clock(expiry) if expiry is not None else None


def kube_configuration(endpoint: KubeEndpoint, tokens: GoogleAccessTokens) -> client.Configuration:
    """A client Configuration whose bearer token is asked for before every request."""
    configuration = client.Configuration(host=endpoint.host, ca_cert_data=endpoint.ca_cert_pem)
    # One key, "authorization", everywhere: a seeded "BearerToken" would win the lookup
    # and be sent forever (reference §6.2).
    configuration.api_key = {"authorization": _PLACEHOLDER_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}

    def refresh(config: client.Configuration) -> None:
        config.api_key["authorization"] = tokens.token()

    # The client declares the hook None-only, yet calls it before every request.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    return configuration


class KubeEdgeCluster:
    """One edge cluster's Kubernetes API: Jobs in one namespace, Nodes, Pods, Events."""

    def __init__(
        self,
        name: str,
        api_client: client.ApiClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        propagation_policy: str = "Background",
        request_timeout_seconds: float = 30.0,
        tokens: GoogleAccessTokens | None = None,
    ) -> None:
        if propagation_policy not in PROPAGATION_POLICIES:
            raise ValueError(f"propagation policy {propagation_policy!r}: expected one of "
                             f"{', '.join(PROPAGATION_POLICIES)} (anything else orphans pods)")
        self.name = name
        self.namespace = namespace
        self.api_client = api_client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.tokens = tokens
        self._propagation = propagation_policy
        self._timeout = request_timeout_seconds

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    # ------------------------------------------------------------------- the port

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef:
        body = self._checked_manifest(manifest)
        ref = self._create_or_adopt_job(body)
        service = render_headless_service(body, ref.uid)
        if service is not None:
            self._ensure_service(service, ref)
        return ref

    def get_job(self, name: str) -> JobRef | None:
        try:
            return _job_ref(self.batch.read_namespaced_job(name, self.namespace,
                                                           _request_timeout=self._timeout))
        except ApiException as error:
            if error.status == 404:
                return None
            raise self.error(error, f"reading Job {name}") from error
        except Exception as error:  # connection failures become PortErrors too
            raise self.error(error, f"reading Job {name}") from error

    def delete_job(self, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, self.namespace,
                                             propagation_policy=self._propagation,
                                             _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return
            raise self.error(error, f"deleting Job {name}") from error
        except Exception as error:
            raise self.error(error, f"deleting Job {name}") from error

    def node_counts(self, pool_name: str) -> NodeCounts:
        try:
            nodes = self.core.list_node(label_selector=f"{NODEPOOL_LABEL}={pool_name}",
                                        _request_timeout=self._timeout).items
        except Exception as error:
            raise self.error(error, f"listing nodes of node pool {pool_name}") from error
        ready = sum(1 for node in nodes if _node_ready(node))
        return NodeCounts(registered=len(nodes), ready=ready)

    def diagnose_pending(self, job_name: str) -> str | None:
        doing = f"diagnosing Job {job_name}"
        try:
            job = self.batch.read_namespaced_job(job_name, self.namespace,
                                                 _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise self.error(error, doing) from error
        except Exception as error:
            raise self.error(error, doing) from error
        try:
            pods = self._pods_of(job)
            pending = [p for p in pods if p.status is None or p.status.phase == "Pending"]
            events = [*self._events_of("Job", job_name),
                      *(e for pod in pending[:MAX_PODS_EXAMINED]
                        for e in self._events_of("Pod", _name(pod, "a Pod")))]
        except PortError:
            raise
        except Exception as error:
            raise self.error(error, doing) from error
        findings = self._findings(job, pods, events)
        if not findings:
            return None
        ordered = sorted(dict.fromkeys(findings), key=lambda finding: finding[0])
        return "; ".join(text for _, text in ordered[:MAX_FINDINGS])

    # ------------------------------------------------------------------- helpers

    def version(self) -> str:
        """The API server's gitVersion (``falcon-es doctor``)."""
        try:
            return str(client.VersionApi(self.api_client).get_code(
                _request_timeout=self._timeout).git_version)
        except Exception as error:
            raise self.error(error, "reading the API server version") from error

    def close(self) -> None:
        self.api_client.close()

    def error(self, error: BaseException, doing: str) -> PortError:
        """A PortError naming the cluster, what was being done, and the API's words."""
        where = f"{doing} in namespace {self.namespace} on cluster {self.name}"
        if isinstance(error, PortError):
            return PortError(error.code, f"{where}: {error.message}")
        if isinstance(error, ApiException):
            words = _status_message(error)
            return PortError(_code_for_status(error.status, words),
                             f"{where}: {error.status} {error.reason}: {words}")
        if isinstance(error, (urllib3.exceptions.HTTPError, OSError)):
            return PortError(RETRYABLE, f"{where}: cannot reach the Kubernetes API at "
                                        f"{self.host}: {error}")
        return PortError(FAILED, f"{where}: {type(error).__name__}: {error}")

    def _checked_manifest(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(manifest, Mapping):
            raise PortError(INVALID, f"Job manifest must be an object, got "
                                     f"{type(manifest).__name__}")
        body = copy.deepcopy(dict(manifest))
        metadata = body.get("metadata")
        if not isinstance(metadata, dict) or not metadata.get("name"):
            raise PortError(INVALID, "Job manifest has no metadata.name")
        namespace = metadata.get("namespace") or self.namespace
        if namespace != self.namespace:
            raise PortError(INVALID, f"Job {metadata['name']} asks for namespace {namespace}; "
                                     f"Jobs run only in {self.namespace} on cluster {self.name}")
        metadata["namespace"] = self.namespace
        return body

    def _create_or_adopt_job(self, body: dict[str, Any]) -> JobRef:
        name = body["metadata"]["name"]
        try:
            created = self.batch.create_namespaced_job(
                # The client is declared to take a V1Job but takes a dict body as well.
                self.namespace, body, _request_timeout=self._timeout)  # type: ignore[arg-type]
            return _job_ref(created)
        except ApiException as error:
            if error.status != 409:
                raise self.error(error, f"creating Job {name}") from error
        except Exception as error:  # connection failures become PortErrors too
            raise self.error(error, f"creating Job {name}") from error
        return self._adopt(name, _task_of(body["metadata"]))

    def _ensure_service(self, service: dict[str, Any], job: JobRef) -> None:
        """The Job's headless Service exists and is owned by this Job afterwards."""
        name = service["metadata"]["name"]
        if self._create_service(service):
            return
        existing = self._read_service(name)
        wanted = service["metadata"]["labels"].get(TASK_LABEL)
        existing_meta = _meta(existing, f"Service {name}")
        owner = (existing_meta.labels or {}).get(TASK_LABEL)
        if wanted is None or owner != wanted:
            self.delete_job(job.name)
            raise self._foreign_service(job, name, owner)
        owners = existing_meta.owner_references or ()
        if any(reference.uid == job.uid for reference in owners):
            log.info("adopted existing Service %s of Job %s (uid %s) on %s", name, job.name,
                     job.uid, self.name)
            return
        self._replace_stale_service(existing, service)

    def _create_service(self, service: dict[str, Any]) -> bool:
        """Create the Service; False when one of that name exists already."""
        name = service["metadata"]["name"]
        try:
            # The client is declared to take a V1Service but takes a dict body as well.
            self.core.create_namespaced_service(self.namespace, service,  # type: ignore[arg-type]
                                                _request_timeout=self._timeout)
            return True
        except ApiException as error:
            if error.status == 409:
                return False
            raise self.error(error, f"creating Service {name}") from error
        except Exception as error:
            raise self.error(error, f"creating Service {name}") from error

    def _read_service(self, name: str) -> client.V1Service:
        try:
            return self.core.read_namespaced_service(name, self.namespace,
                                                     _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                raise PortError(RETRYABLE, f"Service {name} in namespace {self.namespace} on "
                                           f"cluster {self.name} was deleted while it was "
                                           "created; submit again") from error
            raise self.error(error, f"reading existing Service {name}") from error
        except Exception as error:
            raise self.error(error, f"reading existing Service {name}") from error

    def _replace_stale_service(self, existing: client.V1Service,
                               service: dict[str, Any]) -> None:
        """A Service of this task owned by an earlier Job of the same name: the garbage
        collector would take it away from the new Job too, so it makes room for one owned
        by the Job that runs now. Only that very Service is deleted (a uid precondition)."""
        name = service["metadata"]["name"]
        preconditions = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=_meta(existing, f"Service {name}").uid))
        try:
            self.core.delete_namespaced_service(name, self.namespace, body=preconditions,
                                                _request_timeout=self._timeout)
        except ApiException as error:
            if error.status not in (404, 409):
                raise self.error(error, f"deleting stale Service {name}") from error
        except Exception as error:
            raise self.error(error, f"deleting stale Service {name}") from error
        log.info("replaced Service %s left by an earlier Job on %s", name, self.name)
        if not self._create_service(service):
            raise PortError(RETRYABLE, f"Service {name} in namespace {self.namespace} on "
                                       f"cluster {self.name} was recreated by someone else "
                                       "while it was replaced; submit again")

    def _foreign_service(self, job: JobRef, service: str, owner: str | None) -> PortError:
        """Another's Service holds the name the Job's pods resolve each other under: the
        Job could never form its slice, so the submit fails (and the Job is deleted)."""
        belongs = f"task {owner}" if owner else "no Falcon task"
        return PortError(FAILED, f'services "{service}" already exists in namespace '
                                f"{self.namespace} on cluster {self.name} and belongs to "
                                f"{belongs}; Job {job.name} needs that name for its workers "
                                "to find each other, so it was deleted again")

    def _adopt(self, name: str, task_id: str | None) -> JobRef:
        try:
            existing = self.batch.read_namespaced_job(name, self.namespace,
                                                      _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                raise PortError(RETRYABLE, f"Job {name} in namespace {self.namespace} on "
                                           f"cluster {self.name} was being deleted while it "
                                           "was submitted; submit again") from error
            raise self.error(error, f"reading existing Job {name}") from error
        ref = _job_ref(existing)
        if _meta(existing, f"Job {name}").deletion_timestamp is not None:
            raise PortError(RETRYABLE, f"Job {name} in namespace {self.namespace} on cluster "
                                       f"{self.name} is being deleted; submit again once it "
                                       "is gone")
        if task_id is None or ref.task_id != task_id:
            owner = f"task {ref.task_id}" if ref.task_id else "no Falcon task"
            raise PortError(ALREADY_EXISTS, f'jobs.batch "{name}" already exists in namespace '
                                            f"{self.namespace} on cluster {self.name} and "
                                            f"belongs to {owner}")
        log.info("adopted existing Job %s (uid %s) of task %s on %s", name, ref.uid, task_id,
                 self.name)
        return ref

    def _pods_of(self, job: client.V1Job) -> list[client.V1Pod]:
        meta = _meta(job, "a Job")
        name, uid = meta.name, meta.uid
        pods = self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"{JOB_NAME_LABEL}={name}",
                                             _request_timeout=self._timeout).items
        owned = [p for p in pods
                 if any(o.uid == uid for o in _meta(p, "a Pod").owner_references or ())]
        return sorted(owned, key=_pod_order)

    def _events_of(self, kind: str, name: str) -> list[client.CoreV1Event]:
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector,
                                                    _request_timeout=self._timeout).items)

    def _findings(self, job: client.V1Job, pods: Sequence[client.V1Pod],
                  events: Iterable[client.CoreV1Event]) -> list[tuple[int, str]]:
        by_object: dict[tuple[str, str], list[client.CoreV1Event]] = {}
        for event in events:
            involved = event.involved_object
            by_object.setdefault((involved.kind or "", involved.name or ""), []).append(event)
        findings: list[tuple[int, str]] = []
        pools_checked: set[str] = set()
        for pod in pods:
            pod_name = _name(pod, "a Pod")
            pod_events = sorted(by_object.get(("Pod", pod_name), []), key=_event_time)
            unschedulable = _unschedulable_message(pod, pod_events)
            if unschedulable is not None:
                pool = (pod.spec.node_selector or {}).get(NODEPOOL_LABEL) if pod.spec else None
                if pool and pool not in pools_checked:
                    pools_checked.add(pool)
                    counts = self.node_counts(pool)
                    if counts.ready == 0:
                        findings.append((0, (f"node pool {pool} has no Ready nodes "
                                             f"({counts.registered} registered)")))
                text = f"pod {pod_name} cannot be scheduled: {unschedulable}"
                scale = [e.message for e in pod_events if e.reason in AUTOSCALER_REASONS]
                if scale:
                    text += f" (cluster autoscaler: {scale[-1]})"
                findings.append((1, text))
            findings.extend(_container_findings(pod))
            status = pod.status
            if status is not None and status.phase == "Failed" and status.reason:
                detail = f": {status.message}" if status.message else ""
                findings.append((4, f"pod {pod_name} failed: {status.reason}{detail}"))
        job_name = _name(job, "a Job")
        for event in sorted(by_object.get(("Job", job_name), []), key=_event_time):
            if event.type == "Warning":
                findings.append((5, f"Job {job_name}: {event.reason}: {event.message}"))
        for condition in (job.status.conditions if job.status else None) or ():
            if condition.type == "Failed" and condition.status == "True":
                findings.append((6, (f"Job {job_name} failed: {condition.reason}: "
                                     f"{condition.message}")))
        return findings


class KubeEdgeClusters:
    """The ``EdgeClusters`` port: one cached Kubernetes client per edge cluster."""

    def __init__(
        self,
        endpoints: EndpointProvider,
        *,
        tokens: GoogleAccessTokens | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        propagation_policy: str = "Background",
        request_timeout_seconds: float = 30.0,
    ) -> None:
        self._endpoints = endpoints
        self.tokens = tokens or GoogleAccessTokens()
        self._namespace = namespace
        self._propagation = propagation_policy
        self._timeout = request_timeout_seconds
        self._lock = threading.Lock()
        self._edges: dict[str, KubeEdgeCluster] = {}

    def for_cluster(self, cluster: Cluster) -> KubeEdgeCluster:
        with self._lock:
            edge = self._edges.get(cluster.name)
            if edge is None:
                endpoint = self._endpoints(cluster)
                api_client = client.ApiClient(kube_configuration(endpoint, self.tokens))
                edge = KubeEdgeCluster(cluster.name, api_client, namespace=self._namespace,
                                       propagation_policy=self._propagation,
                                       request_timeout_seconds=self._timeout,
                                       tokens=self.tokens)
                self._edges[cluster.name] = edge
            return edge

    def forget(self, cluster_name: str) -> None:
        """Drop a cached client (the cluster was recreated, its CA rotated)."""
        with self._lock:
            edge = self._edges.pop(cluster_name, None)
        if edge is not None:
            edge.close()

    def close(self) -> None:
        with self._lock:
            edges, self._edges = list(self._edges.values()), {}
        for edge in edges:
            edge.close()


# ----------------------------------------------------------------------- helpers

def _task_of(metadata: Any) -> str | None:
    """The task id of a Job: the annotation holds it verbatim, the label maybe shortened."""
    if isinstance(metadata, Mapping):
        annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
    else:
        annotations, labels = metadata.annotations or {}, metadata.labels or {}
    return annotations.get(TASK_ID_ANNOTATION) or labels.get(TASK_LABEL) or None


class _KubeObject(Protocol):
    """An object the Kubernetes API returns (a Job, Pod, Service ...)."""

    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def _meta(obj: _KubeObject, what: str) -> client.V1ObjectMeta:
    """The object's metadata, which the API server always sets: an answer without it
    is malformed (a PortError naming ``what`` the object is)."""
    if obj.metadata is None:
        raise PortError(FAILED, f"the Kubernetes API returned {what} without metadata")
    return obj.metadata


def _name(obj: _KubeObject, what: str) -> str:
    """The object's metadata.name, likewise always set by the API server."""
    name = _meta(obj, what).name
    if name is None:
        raise PortError(FAILED, f"the Kubernetes API returned {what} without metadata.name")
    return name


def _job_ref(job: client.V1Job) -> JobRef:
    name = _name(job, "a Job")
    meta = _meta(job, f"Job {name}")
    if meta.uid is None:
        raise PortError(FAILED, f"the Kubernetes API returned Job {name} without metadata.uid")
    return JobRef(name=name, uid=meta.uid, task_id=_task_of(meta))


def _node_ready(node: client.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _pod_order(pod: client.V1Pod) -> tuple[int, str]:
    """The leader (completion index 0) first: its trouble is upstream of the others'."""
    meta = _meta(pod, "a Pod")
    raw = (meta.labels or {}).get(COMPLETION_INDEX) or (meta.annotations or {}).get(
        COMPLETION_INDEX)
    index = int(raw) if raw is not None and raw.isdigit() else 1 << 30
    return index, _name(pod, "a Pod")


def _event_time(event: client.CoreV1Event) -> dt.datetime:
    moment = event.last_timestamp or event.event_time or event.first_timestamp
    if moment is None:
        return dt.datetime.min
    return moment.replace(tzinfo=None)


def _unschedulable_message(pod: client.V1Pod, events: Sequence[client.CoreV1Event]) -> str | None:
    status = pod.status
    if status is None or status.phase != "Pending":
        return None
    for condition in status.conditions or ():
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or condition.reason or "Unschedulable"
    failed = [e for e in events if e.reason == "FailedScheduling"]
    if failed and not (pod.spec and pod.spec.node_name):
        return failed[-1].message
    return None


def _container_findings(pod: client.V1Pod) -> list[tuple[int, str]]:
    status = pod.status
    statuses = [*(status.init_container_statuses or ()), *(status.container_statuses or ())] \
        if status else []
    findings: list[tuple[int, str]] = []
    for container in statuses:
        state = container.state
        where = f"pod {_meta(pod, 'a Pod').name} container {container.name}"
        if state and state.waiting and state.waiting.reason in CONTAINER_FAILURES:
            detail = f": {state.waiting.message}" if state.waiting.message else ""
            findings.append((2, f"{where}: {state.waiting.reason}{detail}"))
            last = container.last_state.terminated if container.last_state else None
            if last is not None and last.exit_code:
                findings.append((3, (f"{where} last terminated: {last.reason} "
                                     f"(exit code {last.exit_code})")))
        terminated = state.terminated if state else None
        if terminated is not None and (terminated.exit_code or terminated.reason == "OOMKilled"):
            detail = f": {terminated.message}" if terminated.message else ""
            findings.append((3, (f"{where} terminated: {terminated.reason} "
                                 f"(exit code {terminated.exit_code}){detail}")))
    return findings


def _status_message(error: ApiException) -> str:
    try:
        body = json.loads(error.body) if error.body else None
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.body or error.reason or "no details")


def _code_for_status(status: int | None, words: str) -> str:
    if status in (400, 422):
        return INVALID
    if status == 403 and "exceeded quota" in words.lower():
        return QUOTA_EXCEEDED  # a namespace ResourceQuota refused the Job
    if status in (401, 403):
        return PERMISSION_DENIED
    if status == 404:
        return NOT_FOUND
    if status == 409:
        return ALREADY_EXISTS
    if status in (408, 410, 429) or (status is not None and status >= 500):
        return RETRYABLE
    return FAILED
