"""The task aggregate: a task's state folded from its stream.

``evolve`` is pure and uses the compiled chart table, so folding a million events costs
dictionary look-ups, not state-machine engine calls. Handlers decide from a
``TaskState``; projections render it into the job table.

A ``TaskState`` holds its chart state and the row's message itself, and the rest in one
frozen record per concern (``task_records``: ``Submission``, ``Placement``,
``PoolRecord``, ``JobRecord``, ``Retries``, ``Ending``): an event replaces only the
records it is about, and the values are typed as what they are (the spec a
``TaskSpec``, the pool request its event, the intents' progress their enums), so
readers need no defaults of their own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain import chart, naming
from falcon_es.domain import events as ev
from falcon_es.domain.intents import JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.spec import TaskSpec
from falcon_es.domain.tpu import SliceShape, choose_machine, shape_of
from falcon_es.domain.slot_loans import borrowed_changes
from falcon_es.domain.fold_steps import (  # noqa: F401 (STEP_OUTCOMES re-exported)
    MESSAGE, NOTE, RETRY, STEP_OUTCOMES, STEPS, UNANSWERED)
from falcon_es.domain.task_records import (
    NOTHING, Ending, JobRecord, Placement, PoolRecord, Retries, Submission)

#: The Status of each chart state, looked up once per folded event.
_STATUS_OF: Mapping[str, str] = MappingProxyType({s: chart.status_of(s) for s in chart.STATES})
#: Whether each chart state's Status is terminal: every projection asks it of every
#: task a commit changed.
_TERMINAL_OF: Mapping[str, bool] = MappingProxyType(
    {s: status in chart.TERMINAL_STATUSES for s, status in _STATUS_OF.items()})


@dataclasses.dataclass(frozen=True)
class TaskState:
    """A task's state: where it is in the chart, what its row shows, and one record per
    concern (each replaced only by the events about it, so a fold copies little)."""

    task_id: str
    state: str = chart.NEW
    version: int = 0
    updated_at: dt.datetime | None = None
    last_event_at: dt.datetime | None = None
    phase_started_at: dt.datetime | None = None
    #: Structured message: the event whose type is the catalog key and whose data are
    #: its arguments. The event itself, not its data: a fold sets it on most events and
    #: the arguments are only needed when a row is rendered.
    message_event: ev.Event | None = None
    note_event: ev.Event | None = None
    #: The note an ``ApiCallRetrying`` note replaced, shown again once the step ends.
    note_before_retry: ev.Event | None = None
    #: The message a ``ClusterApiUnanswered`` replaced, shown again once the API answers.
    before_unanswered: ev.Event | None = None
    submission: Submission = Submission()
    placement: Placement = Placement()
    pool: PoolRecord = PoolRecord()
    job: JobRecord = JobRecord()
    retries: Retries = Retries()
    ending: Ending = Ending()

    @property
    def status(self) -> str:
        # Looked up, not split: handlers ask every candidate's status each tick.
        return _STATUS_OF.get(self.state) or chart.status_of(self.state)

    @property
    def reason(self) -> str | None:
        state = self.state
        if state in chart.PENDING_REASON_OF:
            return chart.PENDING_REASON_OF[state]
        if self.status == chart.FAILED:
            return self.ending.failure_reason
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
        return self.submission.spec.slices

    @property
    def machine_type(self) -> str:
        """The machine type of the task's slices: that of the pools it asked for or
        took, else the one it would ask for without a reservation."""
        pool, submission = self.pool, self.submission
        if pool.request is not None:
            return pool.request.machine_type
        if pool.machine_type is not None:
            return pool.machine_type
        return choose_machine(submission.tpu_type, submission.topology,
                              asked=submission.spec.machine_type, multislice=self.slices > 1)

    @property
    def shape(self) -> SliceShape:
        """The task's slice: its topology on its machine type."""
        submission = self.submission
        return shape_of(submission.tpu_type, submission.topology, self.machine_type)

    @property
    def node_pools(self) -> tuple[str, ...]:
        """Every pool the task holds or asked for, in slice order: each slice's pool it
        took, or the one it creates (``pool.name`` and, for a multi-slice task, the
        pools named after it; slices taken leave their names of the group unused)."""
        pool = self.pool
        if pool.name is None:
            return ()
        if not pool.taken_pools:
            return naming.pool_group(pool.name, pool.slices_requested or self.slices)
        if pool.request is None:
            return pool.taken_pools
        group = naming.pool_group(pool.request.pool_name, pool.slices_requested)
        taken = dict(zip(pool.taken_slices, pool.taken_pools, strict=True))
        return tuple(taken.get(i, name) for i, name in enumerate(group))

    @property
    def held_pools(self) -> tuple[str, ...]:
        """The pools whose fate the task decides when it ends: those it took and those
        its create may have made (none when GKE refused the create outright)."""
        if self.pool.intent in (None, _NOT_CREATED):
            return self.pool.taken_pools
        return self.node_pools

    @property
    def retained_idle(self) -> tuple[str, ...]:
        """The task's retained pools no task took, as far as its own stream says."""
        pool = self.pool
        return tuple(p for p in pool.retained if p not in pool.handed_over)

    @property
    def took(self) -> tuple[tuple[str, str], ...]:
        """(pool, task it came from) of every pool the task took over."""
        pool = self.pool
        if not pool.taken_pools:  # most tasks: built nothing to zip
            return ((pool.name, pool.from_task),) if pool.from_task and pool.name else ()
        return tuple(zip(pool.taken_pools, pool.taken_from, strict=True))

    @property
    def is_terminal(self) -> bool:
        terminal = _TERMINAL_OF.get(self.state)
        return self.status in chart.TERMINAL_STATUSES if terminal is None else terminal

    @property
    def holds_slot(self) -> bool:
        return self.status == chart.PENDING and self.reason in chart.SLOT_REASONS


#: Per record of ``TaskState``, the changes one event makes to it.
Changes = dict[str, dict[str, Any]]


def evolve(state: TaskState, event: ev.Event, recorded_at: dt.datetime, *,
           in_place: bool = False) -> TaskState:
    """Apply one event; raises ``chart.IllegalTransition`` when the chart forbids it.

    Replays call this once per stored event, so what depends only on the state and
    the event's type is looked up (``fold_steps``), the state's fields are copied
    once, only the records the event changes are replaced, and the new state and
    records are built without the frozen ``__init__`` (``_built``).
    ``in_place``: update ``state`` itself and return it, for a fold whose states
    nobody else holds yet (a replay's in flight); what is read of ``state`` is read
    before this event writes it, so both ways give equal states (a property test
    folds both)."""
    cls = type(event)
    type_name = cls.__name__
    step = STEPS.get((state.state, type_name))
    if step is None:
        raise chart.IllegalTransition(state.task_id, state.state, type_name)
    target, status, moved, fails, ends, ends_node_wait, role = step
    fields = state.__dict__ if in_place else state.__dict__.copy()
    fields["state"] = target
    fields["version"] = state.version + 1
    fields["updated_at"] = fields["last_event_at"] = recorded_at
    changes_of = _CHANGES_OF.get(cls)
    changes = changes_of(event, state, recorded_at) if changes_of is not None else {}
    if moved:
        fields["phase_started_at"] = recorded_at
        if fails:
            _change_unless_set(changes, "ending", "failure_reason", event.failure())
    if ends and state.ending.finished_at is None:
        _change_unless_set(changes, "ending", "finished_at", recorded_at)
    if state.retries.api_calls:
        _end_retried_steps(changes, state, type_name)
    note = state.note_event
    if type(note) is ev.ApiCallRetrying and type_name in STEP_OUTCOMES.get(note.step, ()):
        fields["note_event"] = state.note_before_retry
    if role == MESSAGE:
        fields["message_event"] = event
    else:
        _show(fields, state, event, role, status)
    if ends_node_wait:
        _end_node_wait(fields, changes, state, status, recorded_at)
    for record, changed in changes.items():
        # ``dataclasses.replace`` without the frozen ``__init__``: most events
        # replace one record.
        old = fields[record]
        replaced = object.__new__(type(old))
        object.__setattr__(replaced, "__dict__", old.__dict__ | changed)
        fields[record] = replaced
    return state if in_place else _built(fields)


def _show(fields: dict[str, Any], state: TaskState, event: ev.Event, role: str,
          status: str) -> None:
    """Where an event that is not simply the Message shows (``fold_steps.role_of``)."""
    if role == NOTE:
        fields["note_event"] = event
    elif role == RETRY:
        _show_retry(fields, state, event, status)
    elif role == UNANSWERED:
        _show_unanswered(fields, state, event)


def _change_unless_set(changes: Changes, record: str, name: str, value: Any) -> None:
    """A change the fold makes whatever the event, unless the event's own sets it."""
    changes.setdefault(record, {}).setdefault(name, value)


def _end_node_wait(fields: dict[str, Any], changes: Changes, state: TaskState,
                   status: str, at: dt.datetime) -> None:
    """The nodes came (or the wait ended otherwise): the Job's own timeout counts from
    here, not from a submit that preceded hours of waiting for capacity."""
    job = changes.setdefault("job", {})
    job["awaiting_nodes_since"] = job["wait_extended_at"] = None
    if type(fields["note_event"]) is ev.NodeWaitExtended:
        fields["note_event"] = None
    if state.job.uid is not None and status in (chart.PENDING, chart.RUNNING):
        job["dispatched_at"] = at


def _end_retried_steps(changes: Changes, state: TaskState, type_name: str) -> None:
    """A step's outcome ends its series of failed calls: the attempts counted are
    those since the step last got an answer."""
    api_calls = state.retries.api_calls
    ended = [step for step in api_calls if type_name in STEP_OUTCOMES.get(step, ())]
    if ended:
        _change_unless_set(changes, "retries", "api_calls", {
            step: retried for step, retried in api_calls.items() if step not in ended})


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


def _show_unanswered(fields: dict[str, Any], state: TaskState, event: ev.Event) -> None:
    """A cluster API that does not answer leads the Message (it is what the task waits
    on, whatever its status); once it answers, the message it replaced comes back
    (unless a later event has replaced it already)."""
    shown = state.message_event
    if getattr(event, "since", None) is None:
        if type(shown) is ev.ClusterApiUnanswered:
            fields["message_event"] = state.before_unanswered or event
        fields["before_unanswered"] = None
        return
    if type(shown) is not ev.ClusterApiUnanswered:
        fields["before_unanswered"] = shown
    fields["message_event"] = event


def new_state(task_id: str) -> TaskState:
    """``TaskState(task_id)``, the state before a task's first event, built from one
    dict of defaults (the records' defaults are shared: they are frozen): a replay
    starts one per task, and the frozen ``__init__`` costs about as much as folding
    an event."""
    fields = dict(_DEFAULTS)
    fields["task_id"] = task_id
    return _built(fields)


def _built(fields: dict[str, Any]) -> TaskState:
    """A ``TaskState`` holding ``fields`` (every field, by name), made without the
    frozen ``__init__``, which sets each field through ``object.__setattr__``."""
    new = object.__new__(TaskState)
    object.__setattr__(new, "__dict__", fields)
    return new


#: Defaults of a task the log has not mentioned yet, for ``new_state``.
_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {f.name: f.default for f in dataclasses.fields(TaskState) if f.name != "task_id"})


#: The enum members the fold writes, bound once: an enum attribute costs more to look
#: up than a module global, and the fold runs once per stored event.
_CREATE_REQUESTED, _CREATE_STARTED, _READY = (
    PoolIntent.CREATE_REQUESTED, PoolIntent.CREATE_STARTED, PoolIntent.READY)
_NOT_CREATED, _POOL_FAILED = PoolIntent.NOT_CREATED, PoolIntent.FAILED
_SUBMIT_REQUESTED, _SUBMITTED, _SUBMIT_FAILED = (
    JobIntent.SUBMIT_REQUESTED, JobIntent.SUBMITTED, JobIntent.SUBMIT_FAILED)
_CANCELLED, _FINISHED = JobIntent.CANCELLED, JobIntent.FINISHED
_JOB_DELETE_REQUESTED, _JOB_DELETED = JobIntent.DELETE_REQUESTED, JobIntent.DELETED
_RETAINED, _DELETE_FAILED = PoolDisposition.RETAINED, PoolDisposition.DELETE_FAILED
_POOL_DELETE_REQUESTED, _POOL_DELETED = (
    PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETED)


def _on_task_accepted(event: ev.TaskAccepted, state: TaskState, at: dt.datetime) -> Changes:
    spec = TaskSpec.from_data(event.spec, event.tpu_type, event.topology)
    return {"submission": {
        "name": event.name, "actor": event.actor, "spec": spec,
        "tpu_type": event.tpu_type, "topology": event.topology,
        "submitted_at": event.submitted_at, "priority": spec.priority}}


def _on_task_rejected(event: ev.TaskRejected, state: TaskState, at: dt.datetime) -> Changes:
    return {"submission": {"name": event.name, "actor": event.actor}}


def _on_cluster_chosen(event: ev.ClusterChosen, state: TaskState,
                       at: dt.datetime) -> Changes:
    return {"placement": {"cluster_id": event.cluster_id,
                          "cluster_name": event.cluster_name}}


def _on_task_moved(event: ev.TaskMoved, state: TaskState, at: dt.datetime) -> Changes:
    changes: Changes = {"placement": {"cluster_id": event.to_cluster_id,
                                      "cluster_name": event.to_cluster_name,
                                      "moves": event.moves, "borrowed_from": None}}
    if state.retries.kind is not None or state.retries.api_calls:
        # A slot holder that moved tries afresh where it goes (as after SlotYielded).
        changes["retries"] = {"kind": None, "attempt": 0, "at": None, "api_calls": NOTHING}
    return changes


def _on_priority_changed(event: ev.PriorityChanged, state: TaskState,
                         at: dt.datetime) -> Changes:
    return {"submission": {"priority": event.new}}


def _on_slot_yielded(event: ev.SlotYielded, state: TaskState, at: dt.datetime) -> Changes:
    # Back in the queue: a later pick starts its reservation checks afresh.
    return {"retries": {"kind": None, "attempt": 0, "at": None, "api_calls": NOTHING}}


def _on_task_requeued(event: ev.TaskRequeued, state: TaskState, at: dt.datetime) -> Changes:
    return {"placement": {"cluster_id": None, "cluster_name": None}}


def _on_node_pool_reused(event: ev.NodePoolReused, state: TaskState,
                         at: dt.datetime) -> Changes:
    return {"pool": {"name": event.pool_name, "supply_mode": event.supply_mode,
                     "intent": _READY, "from_task": event.from_task,
                     "machine_type": event.machine_type}}


def _on_node_pool_taken(event: ev.NodePoolTaken, state: TaskState,
                        at: dt.datetime) -> Changes:
    pool = state.pool
    return {"pool": {"name": pool.name or event.pool_name,
                     "supply_mode": event.supply_mode,
                     "taken_pools": (*pool.taken_pools, event.pool_name),
                     "taken_from": (*pool.taken_from, event.from_task),
                     "taken_slices": (*pool.taken_slices, pool.slices_requested),
                     "slices_requested": pool.slices_requested + 1}}


def _on_node_pool_create_requested(event: ev.NodePoolCreateRequested, state: TaskState,
                                   at: dt.datetime) -> Changes:
    pool = state.pool
    return {"pool": {"name": pool.name if pool.taken_pools else event.pool_name,
                     "supply_mode": event.supply_mode, "intent": _CREATE_REQUESTED,
                     "requested_at": at, "operation": None, "request": event,
                     "slices_requested": event.upto or event.slices}}


def _on_node_pool_create_started(event: ev.NodePoolCreateStarted, state: TaskState,
                                 at: dt.datetime) -> Changes:
    return {"pool": {"intent": _CREATE_STARTED, "operation": event.operation,
                     "slice_operations": event.slice_operations}}


def _on_node_pool_not_visible(event: ev.NodePoolNotVisible, state: TaskState,
                              at: dt.datetime) -> Changes:
    retries = state.retries
    streak = retries.kind == "NodePoolNotVisible" and retries.not_visible_since
    return {"retries": {"kind": "NodePoolNotVisible", "attempt": event.attempt,
                        "at": at, "not_visible_since": streak or at}}


def _on_polled_again(event: ev.ReservationInsufficient | ev.NodesNotReady,
                     state: TaskState, at: dt.datetime) -> Changes:
    return {"retries": {"kind": type(event).__name__, "attempt": event.attempt, "at": at}}


def _on_node_pool_failed(event: ev.NodePoolFailed, state: TaskState,
                         at: dt.datetime) -> Changes:
    # A create refused outright left nothing behind; a failed operation may
    # have left a pool in ERROR that must still be deleted.
    refused = state.pool.intent in (None, _CREATE_REQUESTED)
    return {"pool": {"intent": _NOT_CREATED if refused else _POOL_FAILED}}


def _on_job_submit_failed(event: ev.JobSubmitFailed, state: TaskState,
                          at: dt.datetime) -> Changes:
    return {"job": {"intent": _SUBMIT_FAILED}}


def _on_job_submit_cancelled(event: ev.JobSubmitCancelled, state: TaskState,
                             at: dt.datetime) -> Changes:
    return {"job": {"intent": _CANCELLED}}


def _on_pods_pending(event: ev.PodsPending, state: TaskState, at: dt.datetime) -> Changes:
    return {"job": {"pending_diagnosis": event.diagnosis, "refused_since": None,
                    "last_resource_version": event.resource_version}}


def _on_nodes_awaited(event: ev.NodesAwaited, state: TaskState, at: dt.datetime) -> Changes:
    return {"job": {"awaiting_nodes_since": state.job.awaiting_nodes_since or at,
                    "pending_diagnosis": event.cause, "refused_since": None,
                    "last_resource_version": event.resource_version}}


def _on_node_wait_extended(event: ev.NodeWaitExtended, state: TaskState,
                           at: dt.datetime) -> Changes:
    return {"job": {"wait_extended_at": at}}


def _on_pods_refused(event: ev.PodsRefused, state: TaskState, at: dt.datetime) -> Changes:
    since = None if event.transient else (state.job.refused_since or at)
    return {"job": {"pending_diagnosis": event.message, "refused_since": since,
                    "last_resource_version": event.resource_version}}


def _on_pods_running(event: ev.PodsRunning, state: TaskState, at: dt.datetime) -> Changes:
    return {"job": {"pods_active": event.active, "pending_diagnosis": None,
                    "refused_since": None,
                    "last_resource_version": event.resource_version}}


def _on_workload_disrupted(event: ev.WorkloadDisrupted, state: TaskState,
                           at: dt.datetime) -> Changes:
    return {"job": {"disruptions": event.disruptions, "pods_active": 0,
                    "disrupted_pods": state.job.disrupted_pods | frozenset(event.pods),
                    "last_resource_version": event.resource_version}}


def _on_job_ended(event: ev.JobSucceeded | ev.JobFailed, state: TaskState,
                  at: dt.datetime) -> Changes:
    return {"job": {"intent": _FINISHED,
                    "last_resource_version": event.resource_version}}


def _on_node_pool_ready(event: ev.NodePoolReady, state: TaskState,
                        at: dt.datetime) -> Changes:
    return {"pool": {"intent": _READY}}


def _on_job_submit_requested(event: ev.JobSubmitRequested, state: TaskState,
                             at: dt.datetime) -> Changes:
    return {"job": {"name": event.job_name, "intent": _SUBMIT_REQUESTED}}


def _on_job_submitted(event: ev.JobSubmitted, state: TaskState, at: dt.datetime) -> Changes:
    return {"job": {"name": event.job_name, "uid": event.job_uid,
                    "intent": _SUBMITTED, "dispatched_at": at}}


def _on_job_delete_requested(event: ev.JobDeleteRequested, state: TaskState,
                             at: dt.datetime) -> Changes:
    return {"job": {"intent": _JOB_DELETE_REQUESTED}}


def _on_job_deleted(event: ev.JobDeleted, state: TaskState, at: dt.datetime) -> Changes:
    return {"job": {"intent": _JOB_DELETED}}


def _on_abort_requested(event: ev.AbortRequested, state: TaskState,
                        at: dt.datetime) -> Changes:
    return {"ending": {"aborting_at": event.requested_at or at,
                       "abort_phase": event.phase}}


def _on_task_aborted(event: ev.TaskAborted, state: TaskState, at: dt.datetime) -> Changes:
    return {"ending": {"aborted_at": at}}


def _on_node_pool_retained(event: ev.NodePoolRetained, state: TaskState,
                           at: dt.datetime) -> Changes:
    # A multi-slice task may delete some pools and retain others: the
    # disposition follows the delete, and ``retained`` the rest.
    pool = state.pool
    kept = pool.disposition in (None, _RETAINED)
    return {"pool": {"disposition": _RETAINED if kept else pool.disposition,
                     "retained": {**pool.retained, event.pool_name: event.for_task}}}


def _on_node_pool_handed_over(event: ev.NodePoolHandedOver, state: TaskState,
                              at: dt.datetime) -> Changes:
    pool = state.pool
    return {"pool": {"retained": {**pool.retained, event.pool_name: event.to_task},
                     "handed_over": (*pool.handed_over, event.pool_name)}}


def _on_node_pool_delete_failed(event: ev.NodePoolDeleteFailed, state: TaskState,
                                at: dt.datetime) -> Changes:
    since = state.retries.failing_since if state.retries.kind == "NodePoolDeleteFailed" else None
    return {"pool": {"disposition": _DELETE_FAILED},
            "retries": {"kind": "NodePoolDeleteFailed", "attempt": event.attempt, "at": at,
                        "failing_since": since or at}}


def _on_node_pool_delete_requested(event: ev.NodePoolDeleteRequested, state: TaskState,
                                   at: dt.datetime) -> Changes:
    deleting = (event.pool_name, *event.slice_pools)
    return {"pool": {"disposition": _POOL_DELETE_REQUESTED, "deleting": deleting,
                     "retained": {p: t for p, t in state.pool.retained.items()
                                  if p not in deleting}}}


def _on_api_call_retrying(event: ev.ApiCallRetrying, state: TaskState,
                          at: dt.datetime) -> Changes:
    due = at + dt.timedelta(seconds=event.retry_in_seconds)
    return {"retries": {"api_calls": {**state.retries.api_calls,
                                      event.step: (event.attempt, due)}}}


def _on_node_pool_deleted(event: ev.NodePoolDeleted, state: TaskState,
                          at: dt.datetime) -> Changes:
    return {"pool": {"disposition": _POOL_DELETED}}


#: A function of ``TaskState``'s record changes per event type (one look-up per folded
#: event, where a ``match`` tries the types one after another), each returning a new
#: dict: ``evolve`` adds its own changes to it. Event types absent change no record.
_CHANGES_OF: Mapping[type[ev.Event], Callable[[Any, TaskState, dt.datetime], Changes]] = (
    MappingProxyType({
        ev.TaskAccepted: _on_task_accepted,
        ev.TaskRejected: _on_task_rejected,
        ev.ClusterChosen: _on_cluster_chosen,
        ev.TaskMoved: _on_task_moved,
        ev.PriorityChanged: _on_priority_changed,
        ev.SlotYielded: _on_slot_yielded,
        ev.SlotBorrowed: borrowed_changes,
        ev.TaskRequeued: _on_task_requeued,
        ev.NodePoolReused: _on_node_pool_reused,
        ev.NodePoolTaken: _on_node_pool_taken,
        ev.NodePoolCreateRequested: _on_node_pool_create_requested,
        ev.NodePoolCreateStarted: _on_node_pool_create_started,
        ev.NodePoolNotVisible: _on_node_pool_not_visible,
        ev.ReservationInsufficient: _on_polled_again,
        ev.NodesNotReady: _on_polled_again,
        ev.NodePoolFailed: _on_node_pool_failed,
        ev.JobSubmitFailed: _on_job_submit_failed,
        ev.JobSubmitCancelled: _on_job_submit_cancelled,
        ev.PodsPending: _on_pods_pending,
        ev.NodesAwaited: _on_nodes_awaited,
        ev.NodeWaitExtended: _on_node_wait_extended,
        ev.PodsRefused: _on_pods_refused,
        ev.PodsRunning: _on_pods_running,
        ev.WorkloadDisrupted: _on_workload_disrupted,
        ev.JobSucceeded: _on_job_ended,
        ev.JobFailed: _on_job_ended,
        ev.NodePoolReady: _on_node_pool_ready,
        ev.JobSubmitRequested: _on_job_submit_requested,
        ev.JobSubmitted: _on_job_submitted,
        ev.JobDeleteRequested: _on_job_delete_requested,
        ev.JobDeleted: _on_job_deleted,
        ev.AbortRequested: _on_abort_requested,
        ev.TaskAborted: _on_task_aborted,
        ev.NodePoolRetained: _on_node_pool_retained,
        ev.NodePoolHandedOver: _on_node_pool_handed_over,
        ev.NodePoolDeleteFailed: _on_node_pool_delete_failed,
        ev.NodePoolDeleteRequested: _on_node_pool_delete_requested,
        ev.ApiCallRetrying: _on_api_call_retrying,
        ev.NodePoolDeleted: _on_node_pool_deleted,
    }))


def fold(task_id: str, recorded: list[tuple[ev.Event, dt.datetime]]) -> TaskState:
    state = TaskState(task_id)
    for event, at in recorded:
        state = evolve(state, event, at)
    return state


TASK_EVENT_TYPES = frozenset(cls.__name__ for cls in ev.TASK_EVENTS)
