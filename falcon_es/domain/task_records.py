"""The records a ``TaskState`` holds its fields in, one per concern, each small enough
to read on a screen: what the task is, where it queues, its pools, its workload, what
it retries, and how it ends.

They are frozen, and the fold (``task.evolve``) replaces a record only when an event is
about it; a task the log has not mentioned yet shares each record's default.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain import events as ev
from falcon_es.domain.intents import JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.spec import TaskSpec

#: The spec of a task not accepted (yet): its defaults, so readers need no None check.
NO_SPEC = TaskSpec(image="", tpu_type="", topology="", sim=None)
#: An empty read-only mapping: the default of the records' mappings (a record's
#: default is shared by every task that has not changed it, so it must not change).
NOTHING: Mapping[Any, Any] = MappingProxyType({})


def _nothing() -> Mapping[Any, Any]:
    """``NOTHING``, as a default factory (a dataclass takes no unhashable default)."""
    return NOTHING


@dataclasses.dataclass(frozen=True)
class Submission:
    """What the task is: the row as intake accepted it (``TaskAccepted``, or the name
    and actor of a ``TaskRejected``), and the priority it is served by."""

    name: str = ""
    actor: str = ""
    #: The accepted spec, typed (``NO_SPEC`` before ``TaskAccepted``).
    spec: TaskSpec = NO_SPEC
    tpu_type: str = ""
    topology: str = ""
    submitted_at: dt.datetime | None = None
    #: The priority the task is served by (the spec's, until ``PriorityChanged``;
    #: higher first).
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the task queues: its cluster (with its topology, the queue it waits in)."""

    cluster_id: str | None = None
    cluster_name: str | None = None
    #: Times the task moved to another cluster while it waited (``TaskMoved``).
    moves: int = 0
    #: The slot holder that lent this task its queue's slot (``SlotBorrowed``); cleared
    #: when it moves back to Waiting (``TaskMoved``), the one way back for a borrower.
    borrowed_from: str | None = None


@dataclasses.dataclass(frozen=True)
class PoolRecord:
    """The task's node pools: the create it asked for, the pools it took from ended
    tasks, and what became of them once it ended."""

    #: The task's first pool: the one it creates, took or reuses.
    name: str | None = None
    supply_mode: str | None = None
    intent: PoolIntent | None = None
    requested_at: dt.datetime | None = None
    #: The create intent itself: the task's last ``NodePoolCreateRequested``.
    request: ev.NodePoolCreateRequested | None = None
    operation: str | None = None  # the GKE create operation ("" when adopted)
    #: The create operations of a multi-slice task's other pools (slices 1..N-1; of a
    #: partial create's continuation, its pools after the first).
    slice_operations: tuple[str, ...] = ()
    #: How many slices' pools have been asked for (0: none yet); fewer than ``slices``
    #: while a partial create waits for the rest.
    slices_requested: int = 0
    from_task: str | None = None  # the task that handed its pool over to this one
    #: The machine type of a pool it reused (``NodePoolReused``); a multi-slice task's
    #: is always the multi-host one, so the pools it takes need not say.
    machine_type: str | None = None
    #: Pools a multi-slice task took from ended tasks (``NodePoolTaken``), in the order
    #: taken, the task each came from, and the slice each stands for: the slices asked
    #: for so far when it was taken (before any create, the first slices; with
    #: ``multislice_partial_create``, a partial create may take pools for slices after
    #: those it created).
    taken_pools: tuple[str, ...] = ()
    taken_from: tuple[str, ...] = ()
    taken_slices: tuple[int, ...] = ()
    disposition: PoolDisposition | None = None
    #: The task's pools retained for a waiting task once it ended: pool -> that task
    #: (``NodePoolRetained``; the task that took it, ``NodePoolHandedOver``); a pool
    #: leaves when its delete is asked for.
    retained: Mapping[str, str] = dataclasses.field(default_factory=_nothing)
    #: Those of them another task took, as the task's own stream says
    #: (``NodePoolHandedOver``).
    handed_over: tuple[str, ...] = ()
    #: The pools of the task's last delete request (``NodePoolDeleteRequested``).
    deleting: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """The task's workload (a Job, or a multi-slice task's JobSet) and what its last
    observations said."""

    name: str | None = None
    uid: str | None = None
    intent: JobIntent | None = None
    #: When the workload was submitted, or its pods got their nodes: the Job's own
    #: timeout counts from it.
    dispatched_at: dt.datetime | None = None
    last_resource_version: int = 0  # of the last Job observation folded
    pods_active: int | None = None
    pending_diagnosis: str | None = None
    #: When the Job controller's current run of pod-create refusals was first folded
    #: (``PodsRefused``, not transient): the grace before JobSubmitFailed counts from it.
    refused_since: dt.datetime | None = None
    #: When the pods of a submitted workload began waiting for an autoscaled pool's
    #: nodes (``NodesAwaited``), and when that wait was last extended
    #: (``NodeWaitExtended``): the node deadline counts from them.
    awaiting_nodes_since: dt.datetime | None = None
    wait_extended_at: dt.datetime | None = None
    #: Disruptions folded so far (``WorkloadDisrupted``) and the pods they killed, so
    #: a disrupted pod seen again in a later observation is not counted twice.
    disruptions: int = 0
    disrupted_pods: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Retries:
    """What the task is retrying: a polled step (a pool not visible yet, nodes not
    Ready, a reservation too full) and calls that failed with transient API errors."""

    kind: str | None = None  # the event type of the step being retried
    attempt: int = 0
    at: dt.datetime | None = None
    #: Calls retried after transient API errors (``ApiCallRetrying``): per step, the
    #: attempts made so far and when the next one is due.
    api_calls: Mapping[str, tuple[int, dt.datetime]] = dataclasses.field(
        default_factory=_nothing)
    not_visible_since: dt.datetime | None = None  # first 404 of the current streak
    #: When the first of the current series of failed pool deletes failed.
    failing_since: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the task ends: an abort asked for and done, the end, and a failure's Reason."""

    aborting_at: dt.datetime | None = None
    abort_phase: str | None = None
    aborted_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    failure_reason: str | None = None
