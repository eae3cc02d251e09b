"""The task aggregate: a task's state folded from its stream.

``evolve`` is pure and uses the compiled chart table, so folding a million events costs
dictionary look-ups, not state-machine engine calls. Handlers decide from a
``TaskState``; projections render it into the job table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from falcon_es.domain import chart, naming
from falcon_es.domain import events as ev

#: Events that describe a pool after the task ended (or, NodeWaitExtended, that its
#: wait for nodes goes on): they add a note to the Message and leave the main message
#: (the task's result, the wait's cause) alone.
_NOTE_EVENTS = (
    ev.NodePoolRetained, ev.NodePoolDeleteRequested, ev.NodePoolDeleted,
    ev.NodePoolDeleteFailed, ev.AbortIgnored, ev.NodeWaitExtended,
)
#: Events that change no field shown to users besides the log itself.
_SILENT_EVENTS = (ev.JobDeleted, ev.JobDeleteRequested, ev.NodePoolHandedOver)
#: The outcomes that end each retried step (``ApiCallRetrying.step``, the effect
#: executor's intent kinds): once one is folded, a note saying the step is being
#: retried is stale and the note it replaced comes back.
STEP_OUTCOMES: Mapping[str, frozenset[str]] = MappingProxyType({
    "pool-create": frozenset({"NodePoolCreateStarted", "NodePoolFailed"}),
    "job-submit": frozenset({"JobSubmitted", "JobSubmitFailed", "JobSubmitCancelled"}),
    "job-delete": frozenset({"JobDeleted"}),
    "pool-delete": frozenset({"NodePoolDeleted", "NodePoolDeleteFailed"}),
    "reservation-check": frozenset({"NodePoolCreateRequested", "ReservationInsufficient",
                                    "NodePoolFailed"}),
})
_WAITING_FOR_NODE = f"{chart.PENDING}.{chart.PendingReason.WAITING_FOR_NODE}"
#: The Status of each chart state, looked up once per folded event.
_STATUS_OF: Mapping[str, str] = MappingProxyType({s: chart.status_of(s) for s in chart.STATES})


@dataclasses.dataclass(frozen=True)
class TaskState:
    task_id: str
    state: str = chart.NEW
    version: int = 0
    failure_reason: str | None = None
    name: str = ""
    actor: str = ""
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    tpu_type: str = ""
    topology: str = ""
    submitted_at: dt.datetime | None = None
    #: The priority the task is served by (the spec's; higher first).
    priority: int = 0
    #: Times the task moved to another cluster while it waited (``TaskMoved``).
    moves: int = 0
    cluster_id: str | None = None
    cluster_name: str | None = None
    node_pool_name: str | None = None
    supply_mode: str | None = None
    job_name: str | None = None
    job_uid: str | None = None
    dispatched_at: dt.datetime | None = None
    aborting_at: dt.datetime | None = None
    aborted_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    #: Structured message: the event whose type is the catalog key and whose data are
    #: its arguments. The event itself, not its data: a fold sets it on most events and
    #: the arguments are only needed when a row is rendered.
    message_event: ev.Event | None = None
    note_event: ev.Event | None = None
    #: The note an ``ApiCallRetrying`` note replaced, shown again once the step ends.
    note_before_retry: ev.Event | None = None
    #: Provisioning bookkeeping the handlers need (which step is in flight).
    pool_intent: str | None = None  # create-requested | create-started | ready
    job_intent: str | None = None  # submit-requested | submitted | delete-requested
    pool_disposition: str | None = None  # retained | delete-requested | deleted
    last_event_at: dt.datetime | None = None
    phase_started_at: dt.datetime | None = None
    #: Lifecycle bookkeeping: what the provisioning, dispatch, status, abort and
    #: deprovision handlers decide from.
    pool_requested_at: dt.datetime | None = None
    pool_request: dict[str, Any] = dataclasses.field(default_factory=dict)  # the create intent
    pool_operation: str | None = None  # the GKE create operation ("" when adopted)
    #: The create operations of a multi-slice task's other pools (slices 1..N-1; of a
    #: partial create's continuation, its pools after the first).
    slice_operations: tuple[str, ...] = ()
    #: How many slices' pools have been asked for (0: none yet); fewer than ``slices``
    #: while a partial create waits for the rest.
    slices_requested: int = 0
    pool_from_task: str | None = None  # the task that handed its pool over to this one
    #: Pools a multi-slice task took from ended tasks (``NodePoolTaken``), in the order
    #: taken, the task each came from, and the slice each stands for: the slices asked
    #: for so far when it was taken (before any create, the first slices; with
    #: ``multislice_partial_create``, a partial create may take pools for slices after
    #: those it created).
    taken_pools: tuple[str, ...] = ()
    taken_from: tuple[str, ...] = ()
    taken_slices: tuple[int, ...] = ()
    #: The task's pools retained for a waiting task once it ended: pool -> that task
    #: (``NodePoolRetained``; the task that took it, ``NodePoolHandedOver``); a pool
    #: leaves when its delete is asked for.
    pools_retained: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Those of them another task took, as the task's own stream says
    #: (``NodePoolHandedOver``).
    pools_handed_over: tuple[str, ...] = ()
    #: The pools of the task's last delete request (``NodePoolDeleteRequested``).
    pools_deleting: tuple[str, ...] = ()
    retry_kind: str | None = None  # the event type of the step being retried
    retry_attempt: int = 0
    retry_at: dt.datetime | None = None
    #: Calls retried after transient API errors (``ApiCallRetrying``): per step, the
    #: attempts made so far and when the next one is due.
    api_retries: dict[str, tuple[int, dt.datetime]] = dataclasses.field(default_factory=dict)
    not_visible_since: dt.datetime | None = None  # first 404 of the current streak
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
    abort_phase: str | None = None

    @property
    def status(self) -> str:
        # Looked up, not split: handlers ask every candidate's status each tick.
        return _STATUS_OF.get(self.state) or chart.status_of(self.state)

    @property
    def reason(self) -> str | None:
        status = self.status
        if status == chart.PENDING:
            return chart.pending_reason(self.state)
        if status == chart.FAILED:
            return self.failure_reason
        return None

    @property
    def message_key(self) -> str | None:
        return type(self.message_event).__name__ if self.message_event is not None else None

    @property
    def message_args(self) -> dict[str, Any]:
        return self.message_event.to_data() if self.message_event is not None else {}

    @property
    def note_key(self) -> str | None:
        return type(self.note_event).__name__ if self.note_event is not None else None

    @property
    def note_args(self) -> dict[str, Any]:
        return self.note_event.to_data() if self.note_event is not None else {}

    @property
    def slices(self) -> int:
        """Slices the task runs on: one node pool each (the spec's ``slices``)."""
        return int(self.spec.get("slices") or 1)

    @property
    def node_pools(self) -> tuple[str, ...]:
        """Every pool the task holds or asked for, in slice order: each slice's pool it
        took, or the one it creates (``node_pool_name`` and, for a multi-slice task, the
        pools named after it; slices taken leave their names of the group unused)."""
        if self.node_pool_name is None:
            return ()
        if not self.taken_pools:
            return naming.pool_group(self.node_pool_name, self.slices_requested or self.slices)
        own = self.pool_request.get("pool_name")
        if not own:
            return self.taken_pools
        group = naming.pool_group(str(own), self.slices_requested)
        taken = dict(zip(self.taken_slices, self.taken_pools, strict=True))
        return tuple(taken.get(i, name) for i, name in enumerate(group))

    @property
    def held_pools(self) -> tuple[str, ...]:
        """The pools whose fate the task decides when it ends: those it took and those
        its create may have made (none when GKE refused the create outright)."""
        if self.pool_intent in (None, "not-created"):
            return self.taken_pools
        return self.node_pools

    @property
    def retained_idle(self) -> tuple[str, ...]:
        """The task's retained pools no task took, as far as its own stream says."""
        return tuple(p for p in self.pools_retained if p not in self.pools_handed_over)

    @property
    def took(self) -> tuple[tuple[str, str], ...]:
        """(pool, task it came from) of every pool the task took over."""
        if self.pool_from_task and self.node_pool_name and not self.taken_pools:
            return ((self.node_pool_name, self.pool_from_task),)
        return tuple(zip(self.taken_pools, self.taken_from, strict=True))

    @property
    def is_terminal(self) -> bool:
        return self.status in chart.TERMINAL_STATUSES

    @property
    def holds_slot(self) -> bool:
        return self.status == chart.PENDING and self.reason in chart.SLOT_REASONS


def evolve(state: TaskState, event: ev.Event, recorded_at: dt.datetime) -> TaskState:
    """Apply one event; raises ``chart.IllegalTransition`` when the chart forbids it.

    Replays call this once per stored event, so it copies the state's fields once and
    builds the new state without the frozen ``__init__`` (see ``_built``)."""
    type_name = type(event).__name__
    current = state.state
    target = chart.next_state(state.task_id, current, type_name)
    fields = state.__dict__.copy()
    fields["state"] = target
    fields["version"] = state.version + 1
    fields["updated_at"] = fields["last_event_at"] = recorded_at
    status = _STATUS_OF.get(target) or chart.status_of(target)
    if target != current:
        fields["phase_started_at"] = recorded_at
        if status == chart.FAILED and (
                _STATUS_OF.get(current) or chart.status_of(current)) != chart.FAILED:
            fields["failure_reason"] = event.failure()
    if status in chart.TERMINAL_STATUSES and state.finished_at is None:
        fields["finished_at"] = recorded_at
    if state.api_retries:
        _end_retried_steps(fields, state, type_name)
    note = state.note_event
    if type(note) is ev.ApiCallRetrying and type_name in STEP_OUTCOMES.get(note.step, ()):
        fields["note_event"] = state.note_before_retry
    if type_name == "ApiCallRetrying":
        _show_retry(fields, state, event, status)
    elif isinstance(event, _NOTE_EVENTS):
        fields["note_event"] = event
    elif not isinstance(event, _SILENT_EVENTS):
        fields["message_event"] = event
    fields.update(_fields_from(event, state, recorded_at))
    if current == _WAITING_FOR_NODE and target != current:
        # The nodes came (or the wait ended otherwise): the Job's own timeout counts
        # from here, not from a submit that preceded hours of waiting for capacity.
        fields["awaiting_nodes_since"] = fields["wait_extended_at"] = None
        if type(fields["note_event"]) is ev.NodeWaitExtended:
            fields["note_event"] = None
        if state.job_uid is not None and status in (chart.PENDING, chart.RUNNING):
            fields["dispatched_at"] = recorded_at
    return _built(fields)


def _end_retried_steps(fields: dict[str, Any], state: TaskState, type_name: str) -> None:
    """A step's outcome ends its series of failed calls: the attempts counted are
    those since the step last got an answer."""
    ended = [step for step in state.api_retries if type_name in STEP_OUTCOMES.get(step, ())]
    if ended:
        fields["api_retries"] = {step: retried for step, retried in state.api_retries.items()
                                 if step not in ended}


def _show_retry(fields: dict[str, Any], state: TaskState, event: ev.Event,
                status: str) -> None:
    """A retried call is the main message while the task is Pending (it is what the
    task waits on); later (a Job or pool delete while Running, Aborting or after the
    end) it is a note, so the Message keeps saying how the task went."""
    if status == chart.PENDING:
        fields["message_event"] = event
        return
    if type(state.note_event) is not ev.ApiCallRetrying:
        fields["note_before_retry"] = state.note_event
    fields["note_event"] = event


_FIELDS = dataclasses.fields(TaskState)
#: Defaults of a task the log has not mentioned yet, for ``new_state``.
_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {f.name: f.default for f in _FIELDS if f.default is not dataclasses.MISSING})
_FACTORIES: tuple[tuple[str, Any], ...] = tuple(
    (f.name, f.default_factory) for f in _FIELDS if f.default_factory is not dataclasses.MISSING)
_ONLY_TASK_ID_REQUIRED = {f.name for f in _FIELDS} == {"task_id", *_DEFAULTS, *(n for n, _ in _FACTORIES)}


def new_state(task_id: str) -> TaskState:
    """``TaskState(task_id)``, the state before a task's first event, built in a few
    dict operations: a replay starts one per task, and the frozen ``__init__`` of ~40
    fields costs about as much as folding several events."""
    if not _ONLY_TASK_ID_REQUIRED:
        return TaskState(task_id)
    fields = dict(_DEFAULTS)
    fields["task_id"] = task_id
    for name, factory in _FACTORIES:
        fields[name] = factory()
    return _built(fields)


def _built(fields: dict[str, Any]) -> TaskState:
    """A ``TaskState`` holding ``fields`` (every field, by name), made without the
    frozen ``__init__``, which sets each of its ~40 fields through
    ``object.__setattr__``."""
    new = object.__new__(TaskState)
    object.__setattr__(new, "__dict__", fields)
    return new


def _fields_from(event: ev.Event, state: TaskState, at: dt.datetime) -> dict[str, Any]:
    match event:
        case ev.TaskAccepted() | ev.TaskRejected():
            fields: dict[str, Any] = {"name": event.name, "actor": event.actor}
            if isinstance(event, ev.TaskAccepted):
                fields.update(
                    spec=event.spec, tpu_type=event.tpu_type, topology=event.topology,
                    submitted_at=event.submitted_at,
                    priority=int(event.spec.get("priority") or 0),
                )
            return fields
        case ev.ClusterChosen():
            return {"cluster_id": event.cluster_id, "cluster_name": event.cluster_name}
        case ev.TaskMoved():
            return {"cluster_id": event.to_cluster_id, "cluster_name": event.to_cluster_name,
                    "moves": event.moves}
        case ev.PriorityChanged():
            return {"priority": event.new}
        case ev.SlotYielded():
            # Back in the queue: a later pick starts its reservation checks afresh.
            return {"retry_kind": None, "retry_attempt": 0, "retry_at": None,
                    "api_retries": {}}
        case ev.TaskRequeued():
            return {"cluster_id": None, "cluster_name": None}
        case ev.NodePoolReused():
            return {"node_pool_name": event.pool_name, "supply_mode": event.supply_mode,
                    "pool_intent": "ready", "pool_from_task": event.from_task}
        case ev.NodePoolTaken():
            return {"node_pool_name": state.node_pool_name or event.pool_name,
                    "supply_mode": event.supply_mode,
                    "taken_pools": (*state.taken_pools, event.pool_name),
                    "taken_from": (*state.taken_from, event.from_task),
                    "taken_slices": (*state.taken_slices, state.slices_requested),
                    "slices_requested": state.slices_requested + 1}
        case ev.NodePoolCreateRequested():
            return {"node_pool_name": (state.node_pool_name if state.taken_pools
                                       else event.pool_name), "supply_mode": event.supply_mode,
                    "pool_intent": "create-requested", "pool_requested_at": at,
                    "pool_operation": None, "pool_request": event.to_data(),
                    "slices_requested": event.upto or event.slices}
        case ev.NodePoolCreateStarted():
            return {"pool_intent": "create-started", "pool_operation": event.operation,
                    "slice_operations": event.slice_operations}
        case ev.NodePoolNotVisible():
            streak = state.retry_kind == event.type_name and state.not_visible_since
            return {"retry_kind": event.type_name, "retry_attempt": event.attempt,
                    "retry_at": at, "not_visible_since": streak or at}
        case ev.ReservationInsufficient() | ev.NodesNotReady():
            return {"retry_kind": event.type_name, "retry_attempt": event.attempt,
                    "retry_at": at}
        case ev.NodePoolFailed():
            # A create refused outright left nothing behind; a failed operation may
            # have left a pool in ERROR that must still be deleted.
            refused = state.pool_intent in (None, "create-requested")
            return {"pool_intent": "not-created" if refused else "failed"}
        case ev.JobSubmitFailed():
            return {"job_intent": "submit-failed"}
        case ev.JobSubmitCancelled():
            return {"job_intent": "cancelled"}
        case ev.PodsPending():
            return {"pending_diagnosis": event.diagnosis, "refused_since": None,
                    "last_resource_version": event.resource_version}
        case ev.NodesAwaited():
            return {"awaiting_nodes_since": state.awaiting_nodes_since or at,
                    "pending_diagnosis": event.cause, "refused_since": None,
                    "last_resource_version": event.resource_version}
        case ev.NodeWaitExtended():
            return {"wait_extended_at": at}
        case ev.PodsRefused():
            since = None if event.transient else (state.refused_since or at)
            return {"pending_diagnosis": event.message, "refused_since": since,
                    "last_resource_version": event.resource_version}
        case ev.PodsRunning():
            return {"pods_active": event.active, "pending_diagnosis": None,
                    "refused_since": None, "last_resource_version": event.resource_version}
        case ev.JobSucceeded() | ev.JobFailed():
            return {"job_intent": "finished",
                    "last_resource_version": event.resource_version}
        case ev.NodePoolReady():
            return {"pool_intent": "ready"}
        case ev.JobSubmitRequested():
            return {"job_name": event.job_name, "job_intent": "submit-requested"}
        case ev.JobSubmitted():
            return {"job_name": event.job_name, "job_uid": event.job_uid,
                    "job_intent": "submitted", "dispatched_at": at}
        case ev.JobDeleteRequested():
            return {"job_intent": "delete-requested"}
        case ev.JobDeleted():
            return {"job_intent": "deleted"}
        case ev.AbortRequested():
            return {"aborting_at": event.requested_at or at, "abort_phase": event.phase}
        case ev.TaskAborted():
            return {"aborted_at": at}
        case ev.NodePoolRetained():
            # A multi-slice task may delete some pools and retain others: the
            # disposition follows the delete, and ``pools_retained`` the rest.
            kept = state.pool_disposition in (None, "retained")
            return {"pool_disposition": "retained" if kept else state.pool_disposition,
                    "pools_retained": {**state.pools_retained, event.pool_name: event.for_task}}
        case ev.NodePoolHandedOver():
            return {"pools_retained": {**state.pools_retained, event.pool_name: event.to_task},
                    "pools_handed_over": (*state.pools_handed_over, event.pool_name)}
        case ev.NodePoolDeleteFailed():
            return {"pool_disposition": "delete-failed", "retry_kind": event.type_name,
                    "retry_attempt": event.attempt, "retry_at": at}
        case ev.NodePoolDeleteRequested():
            deleting = (event.pool_name, *event.slice_pools)
            return {"pool_disposition": "delete-requested", "pools_deleting": deleting,
                    "pools_retained": {p: t for p, t in state.pools_retained.items()
                                       if p not in deleting}}
        case ev.ApiCallRetrying():
            due = at + dt.timedelta(seconds=event.retry_in_seconds)
            return {"api_retries": {**state.api_retries, event.step: (event.attempt, due)}}
        case ev.NodePoolDeleted():
            return {"pool_disposition": "deleted"}
    return {}


def fold(task_id: str, recorded: list[tuple[ev.Event, dt.datetime]]) -> TaskState:
    state = TaskState(task_id)
    for event, at in recorded:
        state = evolve(state, event, at)
    return state


TASK_EVENT_TYPES = frozenset(cls.__name__ for cls in ev.TASK_EVENTS)


class Change(NamedTuple):
    """One task's state before and after the events of one append (a named tuple:
    immutable, and cheap to build once per folded event)."""

    before: TaskState
    after: TaskState
    folds_abort: bool


class TaskStates:
    """Every task's current state, folded inline with each append.

    Writes are staged during the append's transaction and become visible only after
    it commits, so a rolled-back tick leaves no trace here either.
    """

    def __init__(self, states: Iterable[TaskState] = ()) -> None:
        self._states: dict[str, TaskState] = {state.task_id: state for state in states}
        self._staged: dict[str, TaskState] = {}
        self._changes: dict[str, Change] = {}
        #: Committed tasks that have not ended, kept on each commit so that "is any task
        #: still live?" does not look at every task ever seen.
        self._live: set[str] = {s.task_id for s in self._states.values() if not s.is_terminal}

    def get(self, task_id: str) -> TaskState | None:
        return self._staged.get(task_id) or self._states.get(task_id)

    def __contains__(self, task_id: str) -> bool:
        return self.get(task_id) is not None

    def all(self) -> list[TaskState]:
        return list({**self._states, **self._staged}.values())

    def live(self) -> list[TaskState]:
        return [s for s in self.all() if not s.is_terminal]

    def fold(self, recorded: Any) -> list[Change]:
        """Fold recorded events (``store.RecordedEvent``-like) into staged states."""
        changes: list[Change] = []
        staged, states, tracked = self._staged, self._states, self._changes
        for record in recorded:
            event = record.event
            if type(event).__name__ not in TASK_EVENT_TYPES:
                continue
            task_id = record.stream_id
            before = staged.get(task_id) or states.get(task_id) or new_state(task_id)
            after = evolve(before, event, record.recorded_at)
            staged[task_id] = after
            previous = tracked.get(task_id)
            if previous is None:
                change = Change(before, after, event.folds_abort)
            else:
                change = Change(previous.before, after,
                                event.folds_abort or previous.folds_abort)
            tracked[task_id] = change
            changes.append(change)
        return changes

    def apply(self, conn: Any, recorded: Any) -> None:
        self.fold(recorded)

    def changes(self) -> list[Change]:
        """Per task, the net change made by the append in progress."""
        return list(self._changes.values())

    def live_count(self) -> int:
        """How many committed tasks have not ended (staged states not included)."""
        return len(self._live)

    def committed(self) -> None:
        live = self._live
        for task_id, state in self._staged.items():
            if state.is_terminal:
                live.discard(task_id)
            else:
                live.add(task_id)
        self._states.update(self._staged)
        self._staged.clear()
        self._changes.clear()

    def discarded(self) -> None:
        self._staged.clear()
        self._changes.clear()

    def forget(self, task_ids: Any) -> None:
        """Drop cached states (after a concurrency error another writer won)."""
        for task_id in task_ids:
            self._states.pop(task_id, None)
            self._live.discard(task_id)
