"""Every event type Falcon-ES records, registered in one place (most defined here too;
those of one concern may live in its own module, on ``event_base``'s ``Event``).

Events are immutable facts. Each is a frozen dataclass registered by its class name,
carries a schema version, and is serialised to JSON-friendly ``data``. Older stored
versions are upcast on read (see ``UPCASTERS``); stored rows are never rewritten.

The task stream's event names are also the state chart's event names
(``falcon_es.domain.chart``), so "is this fact allowed now?" has exactly one answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from falcon_es.domain import event_json
from falcon_es.domain.event_base import (  # noqa: F401 (Event and UnknownEventType re-exported)
    Event, JsonDict, UnknownEventType, conversions_of,
)
from falcon_es.domain.slot_loans import SlotBorrowed, SlotLent

# --------------------------------------------------------------------- task stream
# Intake and scheduling (Pending/Waiting)


@dataclasses.dataclass(frozen=True)
class TaskAccepted(Event):
    """A `job` row passed validation and entered the log."""

    name: str
    actor: str
    spec: JsonDict
    tpu_type: str
    topology: str
    submitted_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class TaskRejected(Event):
    """A `job` row failed validation; ``reason`` becomes the job's Reason."""

    name: str
    actor: str
    reason: str
    field: str
    detail: str

    def failure(self) -> str | None:
        return self.reason


@dataclasses.dataclass(frozen=True)
class NoMatchingCluster(Event):
    """No cluster can take the task: none of its TPU type is registered, it asked for a
    reservation and none of its type has one (``without_reservation``), or no cluster's
    reservation can ever serve it (``needs``, and what each holds: ``never_fit``)."""

    failure_reason: ClassVar[str | None] = "NoMatchingCluster"
    tpu_type: str
    registered_tpu_types: tuple[str, ...]
    supply_mode: str | None = None
    without_reservation: tuple[str, ...] = ()
    needs: dict[str, Any] | None = None
    never_fit: tuple[dict[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class NoActiveCluster(Event):
    """Clusters of the TPU type exist but none is active; the task keeps waiting."""

    tpu_type: str
    clusters: tuple[JsonDict, ...]  # {"name": ..., "status": ...}


@dataclasses.dataclass(frozen=True)
class ClusterChosen(Event):
    """Decision log: which clusters were considered and why this one won."""

    cluster_id: str
    cluster_name: str
    topology: str
    why: str  # idle-pool | queue-depth | only-candidate | tie-break
    candidates: tuple[JsonDict, ...]


@dataclasses.dataclass(frozen=True)
class TaskRequeued(Event):
    """The chosen cluster left `active` while the task waited in its queue."""

    from_cluster_id: str
    from_cluster_name: str
    cluster_status: str


@dataclasses.dataclass(frozen=True)
class TaskPicked(Event):
    """Decision log: the task took its queue's acquisition slot."""

    cluster_id: str
    topology: str
    why: str  # only-waiting | fifo | round-robin | priority
    candidates: tuple[JsonDict, ...]  # the earliest actors' heads (at most 10)
    last_actor: str | None
    actors_waiting: int = 0  # how many actors had a candidate
    #: The winner's base priority, the effective priority served, and every base
    #: priority compared ({"priority", "effective", "waiting"}, highest first).
    priority: int = 0
    effective: int = 0
    priorities: tuple[JsonDict, ...] = ()


@dataclasses.dataclass(frozen=True)
class TaskMoved(Event):
    """Re-placement: the waiting task (or a ClusterBusy slot holder holding nothing)
    moved to another active cluster of its TPU type where the slot was free, since its
    queue's slot holder (itself) had been stuck (in ``holder_reason`` for ``held_seconds``)."""

    from_cluster_id: str
    from_cluster_name: str
    to_cluster_id: str
    to_cluster_name: str
    holder_reason: str
    held_seconds: int
    moves: int  # this task's moves so far, this one included


@dataclasses.dataclass(frozen=True)
class PriorityChanged(Event):
    """The upper layer changed a waiting task's base priority (``task set-priority``
    or the job table's ``priority`` column); the queue order follows at once."""

    old: int
    new: int
    requester: str  # who asked (the request's ``priority_requested_by``)
    requested_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class SlotYielded(Event):
    """Preemption: the slot holder had created no pool yet (ClusterBusy, its reservation
    full) and a waiting task of higher effective priority took its place, and waits."""

    to_task: str
    to_name: str
    to_effective: int  # the effective priority served next
    effective: int  # the yielding task's own


# Provisioning

@dataclasses.dataclass(frozen=True)
class ReservationInsufficient(Event):
    reservation: str
    remaining: int
    needed: int
    attempt: int


@dataclasses.dataclass(frozen=True)
class NodePoolReused(Event):
    pool_name: str
    from_task: str | None
    supply_mode: str
    machine_type: str | None = None  # the pool's; None: recorded before it was kept


@dataclasses.dataclass(frozen=True)
class NodePoolTaken(Event):
    """A multi-slice task took a pool retained by an ended task for one of its slices.
    Unlike ``NodePoolReused`` it keeps the task in Provisioning: the task creates the
    slices it could not take (or, having taken them all, is ready at once)."""

    pool_name: str
    from_task: str
    supply_mode: str


@dataclasses.dataclass(frozen=True)
class NodePoolCreateRequested(Event):
    """Intent: create the pool. Re-issued after a crash until an outcome follows."""

    pool_name: str
    supply_mode: str
    machine_type: str
    node_count: int  # per pool
    reservation: str | None
    scale_down_unneeded_seconds: int
    #: Pools of this request: a multi-slice task's N, ``pool_name`` the first of them
    #: and the others named after it (``naming.pool_group``).
    slices: int = 1
    #: A partial create (``FALCON_MULTISLICE_PARTIAL_CREATE``): this request creates the
    #: group's slices ``first_slice`` .. ``upto`` - 1 (``upto`` 0: up to the last); the
    #: slices before ``first_slice`` were created by earlier requests of the task or
    #: are pools it took (``NodePoolTaken``).
    first_slice: int = 0
    upto: int = 0


@dataclasses.dataclass(frozen=True)
class NodePoolCreateStarted(Event):
    pool_name: str
    operation: str
    #: The create operations of a multi-slice task's other pools, in slice order
    #: ("" for one adopted).
    slice_operations: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodePoolNotVisible(Event):
    """A get 404'd inside the create-visibility grace; keep the lease and look again."""

    pool_name: str
    attempt: int


@dataclasses.dataclass(frozen=True)
class NodesNotReady(Event):
    """A fixed-size pool's control plane is RUNNING but not all its nodes are Ready."""

    pool_name: str
    ready: int
    total: int
    attempt: int
    #: Nodes registered with Kubernetes (None in events recorded before it was kept).
    registered: int | None = None


@dataclasses.dataclass(frozen=True)
class NodesAwaited(Event):
    """An autoscaled (flex-start) pool's workload is submitted and its pods wait for
    the cluster autoscaler to bring nodes: the pool's counts and the autoscaler's (or
    the scheduler's) words, which lead the Message as the root cause."""

    pool_name: str
    expected: int
    registered: int
    ready: int
    control_plane: str
    cause: str
    resource_version: int


@dataclasses.dataclass(frozen=True)
class NodeWaitExtended(Event):
    """The wait for nodes reached its deadline and the pool is kept (single-tenant
    retention: no task of another topology waits on the cluster): GKE keeps trying
    until a node is Ready or the task is aborted; looked at again later."""

    pool_name: str
    waited_seconds: int


@dataclasses.dataclass(frozen=True)
class NodePoolReady(Event):
    pool_name: str
    nodes: int


@dataclasses.dataclass(frozen=True)
class NodePoolFailed(Event):
    failure_reason: ClassVar[str | None] = "NodePoolFailed"
    pool_name: str
    error: str
    reservation_gone: str | None = None  # the reservation Compute no longer has
    cluster_name: str | None = None  # whose reservation that was

    def failure(self) -> str | None:
        return "ReservationGone" if self.reservation_gone else self.failure_reason


@dataclasses.dataclass(frozen=True)
class NodePoolTimedOut(Event):
    failure_reason: ClassVar[str | None] = "NodePoolTimeout"
    pool_name: str
    waited_seconds: int
    #: What the wait showed last (the autoscaler's words, the node counts): the cause.
    cause: str = ""


# Dispatch and status

@dataclasses.dataclass(frozen=True)
class JobSubmitRequested(Event):
    job_name: str
    pool_name: str


@dataclasses.dataclass(frozen=True)
class JobSubmitted(Event):
    job_name: str
    job_uid: str


@dataclasses.dataclass(frozen=True)
class JobSubmitFailed(Event):
    failure_reason: ClassVar[str | None] = "JobSubmitFailed"
    job_name: str
    error: str
    #: Set when the Job was created but its pods were refused (``PodsRefused``) for
    #: this long, past the grace: ``error`` is then the refusal's words.
    refused_seconds: int = 0


@dataclasses.dataclass(frozen=True)
class JobSubmitCancelled(Event):
    """The abort came before the submit was issued: the Job does not exist and never will."""

    job_name: str


@dataclasses.dataclass(frozen=True)
class PodsPending(Event):
    """Pods exist but are not running; ``diagnosis`` is the upstream root cause."""

    diagnosis: str
    resource_version: int = 0  # of the observation folded (stale ones are ignored)
    #: A JobSet's followers refused while their leader waits (the FailedCreate words):
    #: the symptom, shown after the leader's cause and never failing the task.
    followers_refused: str = ""


@dataclasses.dataclass(frozen=True)
class PodsRefused(Event):
    """The Job exists but the Job controller cannot create its pods (``FailedCreate``):
    ``message`` is the API server's refusal. The first of a run of these starts the
    grace after which the task fails (JobSubmitFailed), unless it is ``transient``."""

    job_name: str
    message: str
    transient: bool = False
    resource_version: int = 0


@dataclasses.dataclass(frozen=True)
class PodsRunning(Event):
    active: int
    total: int
    resource_version: int = 0
    #: A JobSet's whole restarts so far (each recreates every child Job).
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class WorkloadDisrupted(Event):
    """Pods killed by a disruption (``DisruptionTarget``), which the Job recreates:
    not the workload's failure. ``disruptions``: the task's so far, budget-bounded."""

    pods: tuple[str, ...]
    node: str
    cause: str
    disruptions: int
    resource_version: int = 0


@dataclasses.dataclass(frozen=True)
class JobSucceeded(Event):
    succeeded: int
    resource_version: int = 0


@dataclasses.dataclass(frozen=True)
class JobFailed(Event):
    failure_reason: ClassVar[str | None] = "JobFailed"
    cause: str
    exit_code: int | None
    resource_version: int = 0
    log_file: str = ""  # gs://<bucket>/logs/<job_id>/<pod>.log of the pod blamed, if known


@dataclasses.dataclass(frozen=True)
class TaskTimedOut(Event):
    failure_reason: ClassVar[str | None] = "Timeout"
    timeout_seconds: int
    #: The root cause the pods were waiting on, when they never all ran: the
    #: Message names that cause, not only the timeout.
    pods_pending: str = ""


@dataclasses.dataclass(frozen=True)
class JobDeleteRequested(Event):
    job_name: str
    why: str


@dataclasses.dataclass(frozen=True)
class JobDeleted(Event):
    job_name: str


# Abort

@dataclasses.dataclass(frozen=True)
class AbortRequested(Event):
    folds_abort: ClassVar[bool] = True
    requested_at: dt.datetime | None
    phase: str  # the Status/Reason the task was in


@dataclasses.dataclass(frozen=True)
class AbortIgnored(Event):
    """The abort arrived after the task had ended; the row goes back to its result."""

    folds_abort: ClassVar[bool] = True
    status: str


@dataclasses.dataclass(frozen=True)
class TaskAborted(Event):
    phase: str


# Deprovisioning (after any terminal outcome, abort included)

@dataclasses.dataclass(frozen=True)
class NodePoolRetained(Event):
    pool_name: str
    for_task: str


@dataclasses.dataclass(frozen=True)
class NodePoolHandedOver(Event):
    """A task took this ended task's retained pool (its ``NodePoolReused`` or
    ``NodePoolTaken`` names this task). Recorded only for a holder of more than one
    pool (a multi-slice task): it may stay in memory for its other pools after the
    taker has left it, and its own stream then says this pool is no longer its
    business, so a restarted controller, which does not fold the taker, knows it too.
    A holder of one pool leaves memory with the taker's commit and needs no such word."""

    pool_name: str
    to_task: str


@dataclasses.dataclass(frozen=True)
class NodePoolDeleteRequested(Event):
    pool_name: str
    #: A multi-slice task's other pools, deleted with ``pool_name`` (in slice order),
    #: so the event, and the Message rendered from it, names every pool.
    slice_pools: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodePoolDeleted(Event):
    pool_name: str
    #: As in ``NodePoolDeleteRequested``: every other pool of the group is gone too.
    slice_pools: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodePoolDeleteFailed(Event):
    pool_name: str
    error: str
    attempt: int


# Transient API errors (see docs/explanation/retries.md)

@dataclasses.dataclass(frozen=True)
class ApiCallRetrying(Event):
    """A call to an external API failed with a transient error (429, a concurrent
    operation, 5xx, no answer) and will be made again in ``retry_in_seconds``.

    One per failed attempt, so the task's Message can say which attempt it waits on.
    ``step`` is what was being done (``pool-create``, ``pool-delete``, ``job-submit``,
    ``job-delete``, ``reservation-check``); ``attempts`` is the limit, ``None`` for
    steps never given up (deletes: a pool left behind costs money)."""

    api: str
    step: str
    attempt: int
    attempts: int | None
    error: str
    retry_in_seconds: int


@dataclasses.dataclass(frozen=True)
class ClusterApiUnanswered(Event):
    """The ``api`` of the task's cluster has not answered since ``since`` (``error``:
    its last call's words); ``since`` None: it answers again."""

    cluster: str
    api: str
    since: dt.datetime | None
    error: str = ""


# ------------------------------------------------------------- streams of their own


@dataclasses.dataclass(frozen=True)
class ClusterRegistered(Event):
    cluster_id: str
    name: str
    project: str
    location: str
    tpu_type: str
    gcs_bucket: str
    default_reservation: str | None
    status: str
    node_location: str | None = None  # its TPU pools' zone; None in events from before


@dataclasses.dataclass(frozen=True)
class ClusterNodeLocationSet(Event):
    """A cluster's TPU pools go to another zone (``cluster set-node-location``)."""

    cluster_id: str
    name: str
    old_node_location: str | None
    new_node_location: str


@dataclasses.dataclass(frozen=True)
class ClusterStatusChanged(Event):
    cluster_id: str
    name: str
    old_status: str
    new_status: str


@dataclasses.dataclass(frozen=True)
class OrphanPoolFound(Event):
    cluster_id: str
    pool_name: str
    owner_task: str | None


@dataclasses.dataclass(frozen=True)
class OrphanPoolDeleted(Event):
    cluster_id: str
    pool_name: str


@dataclasses.dataclass(frozen=True)
class ReservationRead(Event):
    """A scheduled read of a cluster's reservation: how many slices of ``topology`` it
    can still give. Recorded in the cluster's stream when the value differs from the
    one this controller read before (and at its first read), so the gauge and
    ``falcon-es clusters`` have it without a row per read."""

    cluster_id: str
    cluster: str
    reservation: str
    topology: str
    slices: int


#: The stream of job rows that could not become task streams of their own.
REFUSED_ROWS_STREAM = "intake:refused"


@dataclasses.dataclass(frozen=True)
class RowRefused(Event):
    """A job row that cannot become a task stream (its id does not fit the log's
    ``stream_id``), in ``REFUSED_ROWS_STREAM``; the row fails with ``reason`` as Reason."""

    row_id: str
    reason: str
    field: str
    detail: str


#: The stream of what the job table was found to hold against the log (rows set back,
#: forged, rewritten, deleted or reused, specs changed after acceptance).
ROW_CHECKS_STREAM = "intake:rows"
#: What ``JobRowDiverged.found`` says of a row.
ROW_REWRITTEN = "rewritten"  # Status/Reason differ from the log's: written again
ROW_DELETED = "deleted"  # gone while its task runs: the task runs on
ROW_REPLACED = "replaced"  # the id now names another submission (DuplicateId)
SPEC_CHANGED = "spec-changed"  # the accepted spec runs
ROW_FINDINGS = (ROW_REWRITTEN, ROW_DELETED, ROW_REPLACED, SPEC_CHANGED)


@dataclasses.dataclass(frozen=True)
class JobRowDiverged(Event):
    """A task's job row was found to differ from the log, recorded (once per finding)
    in ``ROW_CHECKS_STREAM`` so the log says what the upper layer did to the row; a
    ``rewritten`` row is written again from the task's state in the same append."""

    task_id: str
    found: str
    detail: str


TASK_EVENTS: tuple[type[Event], ...] = (
    TaskAccepted, TaskRejected, NoMatchingCluster, NoActiveCluster, ClusterChosen,
    TaskRequeued, TaskPicked, SlotYielded, TaskMoved, PriorityChanged, SlotLent, SlotBorrowed,
    ReservationInsufficient, NodePoolReused, NodePoolTaken,
    NodePoolCreateRequested, NodePoolCreateStarted, NodePoolNotVisible, NodesNotReady,
    NodePoolReady, NodePoolFailed, NodePoolTimedOut, JobSubmitRequested, JobSubmitted,
    JobSubmitFailed, PodsPending, PodsRunning, JobSucceeded, JobFailed, TaskTimedOut,
    JobDeleteRequested, JobDeleted, AbortRequested, AbortIgnored, TaskAborted,
    NodePoolRetained, NodePoolHandedOver, NodePoolDeleteRequested, NodePoolDeleted,
    NodePoolDeleteFailed,
    JobSubmitCancelled, ApiCallRetrying,
    PodsRefused, NodesAwaited, NodeWaitExtended, WorkloadDisrupted, ClusterApiUnanswered,
)
OTHER_EVENTS: tuple[type[Event], ...] = (
    ClusterRegistered, ClusterStatusChanged, ClusterNodeLocationSet, OrphanPoolFound,
    OrphanPoolDeleted, RowRefused, ReservationRead, JobRowDiverged,
)

REGISTRY: Mapping[str, type[Event]] = MappingProxyType(
    {cls.__name__: cls for cls in TASK_EVENTS + OTHER_EVENTS})

Upcaster = Callable[[JsonDict], JsonDict]
#: (type name, stored version) -> function returning the data of version + 1.
UPCASTERS: Mapping[tuple[str, int], Upcaster] = MappingProxyType({})


def decode(type_name: str, schema_version: int, data: JsonDict, *,
           registry: Mapping[str, type[Event]] = REGISTRY,
           upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS) -> Event:
    """Build the typed event from a stored row, upcasting old versions in a chain."""
    return reader(type_name, schema_version, registry=registry, upcasters=upcasters)(data)


def reader(type_name: str, schema_version: int, *,
           registry: Mapping[str, type[Event]] = REGISTRY,
           upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
           ) -> Callable[[JsonDict], Event]:
    """``decode`` of the rows of one type and stored version, worked out once: a fold
    of the whole log looks it up per row instead of per type."""
    try:
        cls = registry[type_name]
    except KeyError:
        raise UnknownEventType(f"unknown event type {type_name!r}") from None
    build = _READERS.get(cls) or event_json.reader(
        cls, conversions_of(cls))  # type: ignore[arg-type]  # a class is hashable
    if schema_version >= cls.schema_version:
        return build
    chain: list[Upcaster] = []
    for version in range(schema_version, cls.schema_version):
        try:
            chain.append(upcasters[(type_name, version)])
        except KeyError:
            raise UnknownEventType(
                f"no upcaster for {type_name} v{version} -> v{version + 1}"
            ) from None
    return functools.partial(_upcast, tuple(chain), build)


def _upcast(chain: tuple[Upcaster, ...], build: Callable[[JsonDict], Event],
            data: JsonDict) -> Event:
    for upcast in chain:
        data = upcast(dict(data))
    return build(data)


#: ``event_json.reader`` of each registered event class.
_READERS: Mapping[type[Event], Callable[[JsonDict], Event]] = MappingProxyType({
    cls: event_json.reader(cls, conversions_of(cls))  # type: ignore[arg-type]  # hashable
    for cls in REGISTRY.values()})
