"""Ports: the controller's only way to touch the outside world.

Each port has a simulated implementation (``falcon_es.adapters.sim``, the embedded
default) and a Google Cloud / Kubernetes one (``falcon_es.adapters.gcp``). Handlers
see only these types, never which backend runs. Errors cross the boundary as
``PortError`` with a portable ``code`` and the API's own words in ``message``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from falcon_es.domain import naming
from falcon_es.domain.clock import Clock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.topics import EDGE_EVENTS_TOPIC, TASK_EVENTS_TOPIC  # noqa: F401 (re-exported)
from falcon_es.domain.tpu import SliceShape

# PortError codes
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
STOCKOUT = "STOCKOUT"
RETRYABLE = "RETRYABLE"  # 429, concurrent operation (FAILED_PRECONDITION), 5xx
INVALID = "INVALID"  # the request itself was refused (400 other than the above)
PERMISSION_DENIED = "PERMISSION_DENIED"
FAILED = "FAILED"
#: A read the executor was asked for and whose answer has not come yet (handlers wait
#: for it quietly: it says nothing about the world).
AWAITING = "AWAITING"
#: The kinds of workload an edge cluster runs for a task.
JOB_KIND, JOBSET_KIND = "Job", "JobSet"


class PortError(Exception):
    def __init__(self, code: str, message: str, *, unanswered: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        #: The API did not answer at all (no connection, nothing within the deadline),
        #: as opposed to an answer that refused: its cluster is named as unanswering.
        self.unanswered = unanswered


@dataclasses.dataclass(frozen=True)
class NodePoolSpec:
    """Everything needed to create a TPU node pool for one task."""

    cluster: Cluster
    name: str  # deterministic: falcon-<...>
    shape: SliceShape
    supply_mode: str  # reservation | on-demand | flex-start
    reservation: str | None
    scale_down_unneeded_seconds: int
    labels: Mapping[str, str]  # managed-by=falcon, falcon-task, falcon-topology, ...
    #: GKE's ``NodePool.locations``: the zones of the pool's nodes. Empty means what
    #: GKE does then, every zone of the cluster (three for a regional cluster).
    locations: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodePoolInfo:
    cluster_name: str
    name: str
    status: str  # PROVISIONING | RUNNING | RECONCILING | STOPPING | ERROR
    labels: Mapping[str, str]
    #: The nodes the pool is sized for (the slice's hosts); registered / Ready nodes
    #: come from EdgeCluster.node_counts.
    node_count: int
    status_message: str = ""


@dataclasses.dataclass(frozen=True)
class Operation:
    id: str
    done: bool
    error: str | None = None  # the API's words when the operation failed
    error_code: str | None = None  # a PortError code for the failure
    #: The API's own status word (GKE: PENDING, RUNNING, DONE, ABORTING); only ``done``
    #: decides anything, the word is kept for ``falcon-es smoke`` to compare.
    status: str = ""


class NodePools(Protocol):
    def create(self, spec: NodePoolSpec) -> Operation: ...
    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation: ...
    def get(self, cluster: Cluster, name: str) -> NodePoolInfo: ...  # PortError(NOT_FOUND)
    def delete(self, cluster: Cluster, name: str) -> Operation | None: ...  # None: already gone
    def list(self, cluster: Cluster) -> list[NodePoolInfo]: ...


@dataclasses.dataclass(frozen=True)
class ReservationCapacity:
    """What a reservation holds at most, whatever is in use: the machine type of its
    VMs and how many (None: not known, e.g. an aggregate reservation counting chips, or
    any machine of the cluster's TPU type). A request beyond it can never be served.
    ``ends_at``: when Compute deletes it and the VMs that consume it (a calendar-mode
    reservation's end); None when it has no end."""

    machine_type: str | None = None
    vms: int | None = None
    ends_at: dt.datetime | None = None


class Reservations(Protocol):
    def remaining_slices(self, cluster: Cluster, reservation: str, shape: SliceShape) -> int: ...
    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity: ...


@dataclasses.dataclass(frozen=True)
class JobRef:
    name: str
    uid: str
    #: The full task id the workload names (its ``falcon/task-id`` annotation); None
    #: for an object without one.
    task_id: str | None
    #: Its ``falcon-task`` label value (``naming.task_label``, maybe shortened).
    task_label: str | None = None

    @property
    def owner(self) -> naming.OwnerMarks:
        """What ``naming.owned_by`` decides on."""
        return naming.OwnerMarks(task_id=self.task_id, label=self.task_label)


@dataclasses.dataclass(frozen=True)
class NodeCounts:
    registered: int
    ready: int


class EdgeCluster(Protocol):
    """One edge GKE cluster's Kubernetes API.

    ``submit_job`` creates the Job and, for a multi-host Job (its pods' subdomain is its
    name), the headless Service its workers find each other through, owned by the Job
    (``manifests.render_headless_service``): one call, so no caller can forget the
    Service, and a crash between the two creates heals when the re-issued submit adopts
    the Job. ``delete_job`` takes the Service along (Kubernetes' garbage collector
    follows the ownerReference).

    A multi-slice task's workload is a JobSet (``kind`` JOBSET_KIND): ``submit_job``
    takes its manifest as it takes a Job's; the JobSet controller creates its child
    Jobs and headless Service, and deleting the JobSet deletes them.
    """

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef: ...  # PortError(ALREADY_EXISTS)
    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None: ...
    def delete_job(self, name: str, kind: str = JOB_KIND) -> None: ...  # not found is success
    def node_counts(self, pool_name: str) -> NodeCounts: ...
    def diagnose_pending(self, job_name: str) -> str | None: ...  # root cause, upstream first


class EdgeClusters(Protocol):
    def for_cluster(self, cluster: Cluster) -> EdgeCluster: ...


@dataclasses.dataclass(frozen=True)
class PodObservation:
    name: str
    phase: str  # Pending | Running | Succeeded | Failed
    reason: str | None = None  # OOMKilled, ErrImagePull, Unschedulable, ...
    exit_code: int | None = None
    message: str | None = None
    #: When its container terminated (``terminated.finishedAt``, ISO 8601), so the pod
    #: that failed first is told from siblings that crashed because it did.
    finished_at: str | None = None
    #: The node it is (or was last) bound to (``spec.nodeName``).
    node: str | None = None
    #: Its ``DisruptionTarget`` condition, "<reason>: <message>" (e.g.
    #: "EvictionByEvictionAPI: Eviction API: evicting"): a pod killed by a disruption
    #: (drain, eviction, preemption, node gone), which the Job's pod failure policy
    #: ignores; None for any other pod.
    disruption: str | None = None


@dataclasses.dataclass(frozen=True)
class CreateRefusal:
    """The Job controller cannot create the Job's pods: the newest ``FailedCreate``
    event on the Job, with no ``SuccessfulCreate`` after it (an admission webhook, Pod
    Security, a missing service account, a ResourceQuota). There are no pods to look
    at, so without it the wait would be silent.

    ``transient`` marks a refusal expected to clear by itself (a caller that knows
    why, e.g. a follower refused while its leader waits): it is shown, and it never
    fails the task.
    """

    message: str  # the event's words: "Error creating: admission webhook ... denied ..."
    count: int = 1  # attempts the event aggregates
    transient: bool = False


#: The JobSet controller's own refusals, recorded as events on the JobSet itself, not on
#: a child Job (kubernetes-sigs/jobset ``pkg/constants/constants.go``): it could not
#: create a child Job, or the JobSet's headless Service.
JOB_CREATION_FAILED = "JobCreationFailed"
JOBSET_EVENT_REASONS = frozenset({JOB_CREATION_FAILED, "HeadlessServiceCreationFailed"})
#: The component a JobSet-level cause names, ahead of its reason and words.
JOBSET_CONTROLLER = "JobSet controller"


def jobset_cause(reason: str, words: str) -> str:
    """A JobSet-level cause as the Message and ``explain`` quote it: the component, its
    event's reason and its words ("JobSet controller JobCreationFailed: job ...")."""
    return f"{JOBSET_CONTROLLER} {reason}: {words}"


def is_jobset_cause(text: str) -> bool:
    """The refusal is the JobSet controller's own (``jobset_cause``)."""
    return text.startswith(f"{JOBSET_CONTROLLER} ")


@dataclasses.dataclass(frozen=True)
class JobObservation:
    """What an informer saw of one Job and its Pods, published on the edge-events bus.

    ``resource_version`` orders observations of one Job (larger is newer); the pair
    (job_uid, resource_version) identifies an observation for de-duplication.
    """

    cluster_name: str
    job_name: str
    job_uid: str
    #: The task's own id (the Job's falcon/task-id annotation), the stream to fold into.
    task_id: str
    resource_version: int
    #: Pods in phase Running (Kubernetes' status.active also counts Pending pods).
    active: int
    succeeded: int
    failed: int
    completions: int
    pods: tuple[PodObservation, ...]
    observed_at: dt.datetime
    condition: str | None = None  # Complete | Failed | None
    #: The Job controller's refusal to create pods, while it lasts.
    refusal: CreateRefusal | None = None
    #: ``JobSet`` for a multi-slice task: one observation of the JobSet and every pod
    #: of its current child Jobs (pods, counts and refusals summed over the children).
    kind: str = JOB_KIND
    #: A JobSet's whole restarts so far (``status.restarts``).
    restarts: int = 0
    #: Why a JobSet ended (its condition's reason: AllJobsCompleted, FailedJobs,
    #: ReachedMaxRestarts).
    condition_reason: str | None = None

    def to_data(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["observed_at"] = self.observed_at.isoformat()
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> JobObservation:
        values = dict(data)
        values["pods"] = tuple(PodObservation(**p) for p in values["pods"])
        values["observed_at"] = dt.datetime.fromisoformat(values["observed_at"])
        if values.get("refusal") is not None:
            values["refusal"] = CreateRefusal(**values["refusal"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class BusMessage:
    id: str
    data: Mapping[str, Any]
    attributes: Mapping[str, str]


class Bus(Protocol):
    """At-least-once, possibly out-of-order delivery (Pub/Sub semantics)."""

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str: ...
    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]: ...
    def ack(self, subscription: str, message_ids: Sequence[str]) -> None: ...


@dataclasses.dataclass
class Ports:
    node_pools: NodePools
    reservations: Reservations
    edges: EdgeClusters
    bus: Bus
    clock: Clock
    #: The next moment the backend's world changes by itself (the sim backend), so an
    #: idle controller on a virtual clock can jump there; None for real backends.
    next_due: Callable[[], dt.datetime | None] | None = None


@dataclasses.dataclass(frozen=True)
class LogObject:
    """One pod's log file: its object name in the bucket, its size in bytes now and
    when it was last written (UTC, naive as the log records; None when unknown)."""

    name: str
    size: int
    updated: dt.datetime | None = None


class LogFiles(Protocol):
    """The pods' log files in a cluster's bucket (``gs://<bucket>/logs/<job_id>/``):
    read by ``falcon-es logs``, never by the controller. Errors are ``PortError``s whose
    message names the bucket or object and, when refused, the permission missing."""

    def list(self, bucket: str, prefix: str) -> Sequence[LogObject]: ...

    def read(self, bucket: str, name: str, start: int = 0) -> bytes:
        """The object's bytes from offset ``start`` to its end now (b"" when none)."""
        ...
