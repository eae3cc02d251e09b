"""The EdgeCluster port on an edge GKE cluster's Kubernetes API (the ``kubernetes`` client).

Where the API server is and the token it is sent come from ``kube_auth``: an
``EndpointProvider`` asks GKE, and ``GoogleAccessTokens`` keeps a Google access token
current. One ``ApiClient`` per cluster is built on first use and cached.

Effects are idempotent, since an intent left open by a crash is carried out again: a
Job, JobSet or Service that already exists is adopted only when its ``falcon/task-id``
annotation holds this very task id (``naming.owned_by``; one made before the
annotation was written is recognised by its label of that time), deleting a Job that is gone is success, and deletes
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

``diagnose_pending`` reads the Job, its pods and their events, and ``kube_diagnosis``
turns them into a Message that puts the root cause first.

A multi-slice task's JobSet (``jobset.x-k8s.io/v1alpha2``, a custom resource) goes
through ``CustomObjectsApi``: created (or adopted when it carries the task's id),
read and deleted (Background propagation, so its child Jobs, their pods and its
headless Service go too) by kind. The JobSet controller creates the children and the
Service; the diagnosis of a JobSet is that of its first child Job whose pods wait, the
leader's cause before the followers' refusal.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from falcon_es.adapters.gcp.kube_auth import (
    EndpointProvider,
    GoogleAccessTokens,
    kube_configuration,
)
from falcon_es.adapters.gcp.job_observations import jobset_refusal
from falcon_es.adapters.gcp.kube_diagnosis import diagnosis, examined_pods, pod_order
from falcon_es.adapters.gcp.kube_objects import (
    JOB_NAME_LABEL,
    NODEPOOL_LABEL,
    job_ref,
    metadata_of,
    name_of,
    node_ready,
    owner_of,
    owner_words,
    workload_ref,
)
from falcon_es.domain.naming import OwnerMarks, owned_by
from falcon_es.domain.manifests import (
    JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, render_headless_service,
)
from falcon_es.domain.ports import (
    ALREADY_EXISTS,
    JOB_KIND,
    JOBSET_KIND,
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
from falcon_es.domain.clusters import Cluster

log = logging.getLogger("falcon_es.adapters.gcp.kube")

DEFAULT_NAMESPACE = "falcon-jobs"
#: A call's deadline: seconds, or (connect, read) seconds (``CallSettings``).
Timeout = float | tuple[float, float]
DEFAULT_TIMEOUT: Timeout = (5.0, 20.0)
#: The label the JobSet controller puts on its child Jobs and their pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
PROPAGATION_POLICIES = ("Background", "Foreground")


class KubeEdgeCluster:
    """One edge cluster's Kubernetes API: Jobs in one namespace, Nodes, Pods, Events."""

    def __init__(
        self,
        name: str,
        api_client: client.ApiClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        propagation_policy: str = "Background",
        request_timeout_seconds: Timeout = DEFAULT_TIMEOUT,
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
        self.custom = client.CustomObjectsApi(api_client)
        self.tokens = tokens
        self._propagation = propagation_policy
        self._timeout = request_timeout_seconds

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    # ------------------------------------------------------------------- the port

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef:
        body = self._checked_manifest(manifest)
        if body.get("kind") == JOBSET_KIND:
            return self._create_or_adopt_jobset(body)
        ref = self._create_or_adopt_job(body)
        service = render_headless_service(body, ref.uid)
        if service is not None:
            self._ensure_service(service, ref)
        return ref

    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None:
        if kind == JOBSET_KIND:
            return self._get_jobset(name)
        try:
            return job_ref(self.batch.read_namespaced_job(name, self.namespace,
                                                           _request_timeout=self._timeout))
        except ApiException as error:
            if error.status == 404:
                return None
            raise self.error(error, f"reading Job {name}") from error
        except Exception as error:  # connection failures become PortErrors too
            raise self.error(error, f"reading Job {name}") from error

    def delete_job(self, name: str, kind: str = JOB_KIND) -> None:
        if kind == JOBSET_KIND:
            self._delete_jobset(name)
            return
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
        ready = sum(1 for node in nodes if node_ready(node))
        return NodeCounts(registered=len(nodes), ready=ready)

    def diagnose_pending(self, job_name: str) -> str | None:
        doing = f"diagnosing Job {job_name}"
        try:
            job = self.batch.read_namespaced_job(job_name, self.namespace,
                                                 _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return self._diagnose_jobset(job_name)
            raise self.error(error, doing) from error
        except Exception as error:
            raise self.error(error, doing) from error
        return self._diagnose_job(job, job_name, doing)

    def _diagnose_job(self, job: client.V1Job, job_name: str, doing: str) -> str | None:
        try:
            pods = self._pods_of(job)
            events = [*self._events_of("Job", job_name),
                      *(e for pod in examined_pods(pods)
                        for e in self._events_of("Pod", name_of(pod, "a Pod")))]
        except PortError:
            raise
        except Exception as error:
            raise self.error(error, doing) from error
        return diagnosis(job, pods, events, self.node_counts)

    def job_conditions(self, name: str) -> list[str]:
        """The Job's conditions of status True, in the order the API lists them
        (``falcon-es smoke`` compares them with the model; the controller reads the
        informer's observations instead)."""
        try:
            job = self.batch.read_namespaced_job(name, self.namespace,
                                                 _request_timeout=self._timeout)
        except Exception as error:
            raise self.error(error, f"reading Job {name}") from error
        conditions = (job.status.conditions if job.status else None) or ()
        return [c.type for c in conditions if c.status == "True"]

    def pod_events(self, job_name: str) -> list[tuple[str, str]]:
        """(reason, message) of every event on the Job's pods, oldest first: what the
        cluster autoscaler said about them, for ``falcon-es smoke``."""
        doing = f"reading the events of Job {job_name}'s pods"
        try:
            job = self.batch.read_namespaced_job(job_name, self.namespace,
                                                 _request_timeout=self._timeout)
            events = [e for pod in self._pods_of(job)
                      for e in self._events_of("Pod", name_of(pod, "a Pod"))]
        except Exception as error:
            raise self.error(error, doing) from error
        return [(str(e.reason or ""), str(e.message or "")) for e in events]

    # ------------------------------------------------------------------ JobSets

    def _create_or_adopt_jobset(self, body: dict[str, Any]) -> JobRef:
        name = body["metadata"]["name"]
        try:
            created = self.custom.create_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSET_PLURAL, body,
                _request_timeout=self._timeout)
            return _jobset_ref(created, name)
        except ApiException as error:
            if error.status != 409:
                raise self.error(error, f"creating JobSet {name}") from error
        except Exception as error:
            raise self.error(error, f"creating JobSet {name}") from error
        existing = self._get_jobset(name)
        if existing is None:
            raise PortError(RETRYABLE, f"JobSet {name} in namespace {self.namespace} on "
                                       f"cluster {self.name} was being deleted while it was "
                                       "submitted; submit again")
        wanted = owner_of(body["metadata"]).task_id
        if wanted is None or not owned_by(existing.owner, wanted):
            owner = owner_words(existing.owner)
            raise PortError(ALREADY_EXISTS, f'jobsets.jobset.x-k8s.io "{name}" already exists '
                                            f"in namespace {self.namespace} on cluster "
                                            f"{self.name} and belongs to {owner}")
        log.info("adopted existing JobSet %s (uid %s) on %s", name, existing.uid, self.name)
        return existing

    def _get_jobset(self, name: str) -> JobRef | None:
        found = self._read_jobset(name)
        return None if found is None else _jobset_ref(found, name)

    def _read_jobset(self, name: str) -> dict[str, Any] | None:
        """The JobSet as the API holds it (None: there is none)."""
        try:
            found = self.custom.get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSET_PLURAL, name,
                _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404 and not _crd_missing(error):
                return None
            raise self.error(error, f"reading JobSet {name}") from error
        except Exception as error:
            raise self.error(error, f"reading JobSet {name}") from error
        return dict(cast(Mapping[str, Any], found))

    def _delete_jobset(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSET_PLURAL, name,
                propagation_policy=self._propagation, _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404 and not _crd_missing(error):
                return
            raise self.error(error, f"deleting JobSet {name}") from error
        except Exception as error:
            raise self.error(error, f"deleting JobSet {name}") from error

    def _diagnose_jobset(self, name: str) -> str | None:
        """The JobSet controller's own refusal to create a child Job (an event on the
        JobSet) first, then the first child Job (in slice order) whose pods wait, each
        in its own words."""
        doing = f"diagnosing JobSet {name}"
        try:
            children = self.batch.list_namespaced_job(
                self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}",
                _request_timeout=self._timeout).items
            jobset = self._read_jobset(name)
            events = [self.api_client.sanitize_for_serialization(e)
                      for e in self._events_of(JOBSET_KIND, name)] if jobset else []
        except PortError:
            raise
        except Exception as error:
            raise self.error(error, doing) from error
        refused = jobset_refusal(jobset, events, len(children)) if jobset else None
        found = [refused.message] if refused is not None else []
        for child in sorted(children, key=lambda j: _slice_index(name_of(j, "a Job"))):
            child_name = name_of(child, "a Job")
            child_found = self._diagnose_job(child, child_name, doing)
            if child_found:
                found.append(f"Job {child_name}: {child_found}")
                break
        return "; ".join(found) or None

    def jobset_crd_installed(self) -> bool:
        """The JobSet CRD is served (``falcon-es doctor``): listing JobSets answers."""
        try:
            self.custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSET_PLURAL, limit=1,
                _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return False
            raise self.error(error, "listing JobSets") from error
        except Exception as error:
            raise self.error(error, "listing JobSets") from error
        return True

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
            return PortError(error.code, f"{where}: {error.message}",
                             unanswered=error.unanswered)
        if isinstance(error, ApiException):
            words = _status_message(error)
            return PortError(_code_for_status(error.status, words),
                             f"{where}: {error.status} {error.reason}: {words}")
        if isinstance(error, (urllib3.exceptions.HTTPError, OSError)):
            return PortError(RETRYABLE, f"{where}: cannot reach the Kubernetes API at "
                                        f"{self.host}: {error}", unanswered=True)
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
            return job_ref(created)
        except ApiException as error:
            if error.status != 409:
                raise self.error(error, f"creating Job {name}") from error
        except Exception as error:  # connection failures become PortErrors too
            raise self.error(error, f"creating Job {name}") from error
        return self._adopt(name, owner_of(body["metadata"]).task_id)

    def _ensure_service(self, service: dict[str, Any], job: JobRef) -> None:
        """The Job's headless Service exists and is owned by this Job afterwards."""
        name = service["metadata"]["name"]
        if self._create_service(service):
            return
        existing = self._read_service(name)
        wanted = owner_of(service["metadata"]).task_id
        existing_meta = metadata_of(existing, f"Service {name}")
        owner = owner_of(existing_meta)
        if wanted is None or not owned_by(owner, wanted):
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
            preconditions=client.V1Preconditions(uid=metadata_of(existing, f"Service {name}").uid))
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

    def _foreign_service(self, job: JobRef, service: str, owner: OwnerMarks) -> PortError:
        """Another's Service holds the name the Job's pods resolve each other under: the
        Job could never form its slice, so the submit fails (and the Job is deleted)."""
        belongs = owner_words(owner)
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
        ref = job_ref(existing)
        if metadata_of(existing, f"Job {name}").deletion_timestamp is not None:
            raise PortError(RETRYABLE, f"Job {name} in namespace {self.namespace} on cluster "
                                       f"{self.name} is being deleted; submit again once it "
                                       "is gone")
        if task_id is None or not owned_by(ref.owner, task_id):
            owner = owner_words(ref.owner)
            raise PortError(ALREADY_EXISTS, f'jobs.batch "{name}" already exists in namespace '
                                            f"{self.namespace} on cluster {self.name} and "
                                            f"belongs to {owner}")
        log.info("adopted existing Job %s (uid %s) of task %s on %s", name, ref.uid, task_id,
                 self.name)
        return ref

    def _pods_of(self, job: client.V1Job) -> list[client.V1Pod]:
        meta = metadata_of(job, "a Job")
        name, uid = meta.name, meta.uid
        pods = self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"{JOB_NAME_LABEL}={name}",
                                             _request_timeout=self._timeout).items
        owned = [p for p in pods
                 if any(o.uid == uid for o in metadata_of(p, "a Pod").owner_references or ())]
        return sorted(owned, key=pod_order)

    def _events_of(self, kind: str, name: str) -> list[client.CoreV1Event]:
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector,
                                                    _request_timeout=self._timeout).items)


class KubeEdgeClusters:
    """The ``EdgeClusters`` port: one cached Kubernetes client per edge cluster."""

    def __init__(
        self,
        endpoints: EndpointProvider,
        *,
        tokens: GoogleAccessTokens | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        propagation_policy: str = "Background",
        request_timeout_seconds: Timeout = DEFAULT_TIMEOUT,
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
        if edge is not None:
            return edge
        # Asking GKE for the endpoint is a call on behalf of this cluster: made outside
        # the lock, so it holds up no other cluster's client.
        endpoint = self._endpoints(cluster)
        api_client = client.ApiClient(kube_configuration(endpoint, self.tokens))
        built = KubeEdgeCluster(cluster.name, api_client, namespace=self._namespace,
                                propagation_policy=self._propagation,
                                request_timeout_seconds=self._timeout, tokens=self.tokens)
        with self._lock:
            edge = self._edges.setdefault(cluster.name, built)
        if edge is not built:
            built.close()
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


def _jobset_ref(found: Any, name: str) -> JobRef:
    """The port's handle on a JobSet (a plain dict from CustomObjectsApi)."""
    metadata = found.get("metadata") if isinstance(found, Mapping) else None
    if not isinstance(metadata, Mapping) or not metadata.get("uid"):
        raise PortError(FAILED, f"the Kubernetes API returned JobSet {name} without "
                                "metadata.uid")
    return workload_ref(str(metadata.get("name") or name), str(metadata["uid"]), metadata)


def _crd_missing(error: ApiException) -> bool:
    """A 404 for the resource type itself, not for one JobSet: the CRD is not installed."""
    body = _status_message(error)
    return "could not find the requested resource" in body


def _slice_index(child: str) -> int:
    """The index at the end of a child Job's name (``<jobset>-<replicatedJob>-<i>``)."""
    tail = child.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _status_message(error: ApiException) -> str:
    """The API server's own words: the ``message`` of the Status body it sends with a
    refusal, else the raw body or the HTTP reason."""
    try:
        body = json.loads(error.body) if error.body else None
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.body or error.reason or "no details")


def _code_for_status(status: int | None, words: str) -> str:
    """The port's error code for an HTTP status, so the caller knows whether to retry,
    to fix the request, or to give up."""
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
