"""What folding one event does that depends only on the task's chart state and the
event's type, worked out once from the chart: a replay folds every stored event, and
one look-up per event replaces finding the target, its status, what the move implies
(a new phase, a failure, an end, a wait for nodes over) and where the event shows in
the Message each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.domain.intents import RESERVATION_CHECK, IntentKind

_WAITING_FOR_NODE = f"{chart.PENDING}.{chart.PendingReason.WAITING_FOR_NODE}"

#: How an event shows in a task's Message (see ``role_of``).
MESSAGE, NOTE, SILENT, RETRY, UNANSWERED = "message", "note", "silent", "retry", "unanswered"
#: Events that describe a pool after the task ended (or that its wait for nodes goes
#: on, or that it lent its slot while it waits): they add a note to the Message and
#: leave the main message (the task's result, the wait's cause) alone.
NOTE_EVENTS = (
    ev.NodePoolRetained, ev.NodePoolDeleteRequested, ev.NodePoolDeleted,
    ev.NodePoolDeleteFailed, ev.AbortIgnored, ev.NodeWaitExtended, ev.SlotLent,
)
#: Events that change no field shown to users besides the log itself.
SILENT_EVENTS = (ev.JobDeleted, ev.JobDeleteRequested, ev.NodePoolHandedOver)


def role_of(cls: type[ev.Event]) -> str:
    """Whether an event of ``cls`` becomes the Message, a note beside it, neither, or
    one of the two whose place depends on the task (a retried call, an unanswering
    cluster API)."""
    if cls.__name__ == "ApiCallRetrying":
        return RETRY
    if cls.__name__ == "ClusterApiUnanswered":
        return UNANSWERED
    if issubclass(cls, NOTE_EVENTS):
        return NOTE
    if issubclass(cls, SILENT_EVENTS):
        return SILENT
    return MESSAGE


class Step(NamedTuple):
    """One transition of the chart, with what a fold derives from it."""

    target: str
    #: The target's Status.
    status: str
    #: The state changes: a new phase starts.
    moved: bool
    #: The task enters Failed from another status: it gets the event's failure reason.
    fails: bool
    #: The target's Status is terminal: the task has finished, if it had not yet.
    ends: bool
    #: The task leaves WaitingForNode: its wait for nodes is over.
    ends_node_wait: bool
    #: How the event shows in the Message (``role_of``).
    role: str


def step_of(state: str, event_type: str, target: str) -> Step:
    """The transition from ``state`` to ``target`` on ``event_type`` as a fold uses it."""
    status = chart.status_of(target)
    moved = target != state
    return Step(target, status, moved,
                moved and status == chart.FAILED and chart.status_of(state) != chart.FAILED,
                status in chart.TERMINAL_STATUSES,
                moved and state == _WAITING_FOR_NODE, role_of(ev.REGISTRY[event_type]))


#: The outcomes that end each retried step (``ApiCallRetrying.step``, the effect
#: executor's intent kinds): once one is folded, a note saying the step is being
#: retried is stale and the note it replaced comes back.
STEP_OUTCOMES: Mapping[str, frozenset[str]] = MappingProxyType({
    IntentKind.POOL_CREATE: frozenset({"NodePoolCreateStarted", "NodePoolFailed"}),
    IntentKind.JOB_SUBMIT: frozenset({"JobSubmitted", "JobSubmitFailed", "JobSubmitCancelled"}),
    IntentKind.JOB_DELETE: frozenset({"JobDeleted"}),
    IntentKind.POOL_DELETE: frozenset({"NodePoolDeleted", "NodePoolDeleteFailed"}),
    RESERVATION_CHECK: frozenset({"NodePoolCreateRequested", "ReservationInsufficient",
                                    "NodePoolFailed"}),
})

#: (chart state, event type) -> the step, for every transition of the chart.
STEPS: Mapping[tuple[str, str], Step] = MappingProxyType(
    {(state, event_type): step_of(state, event_type, target)
     for (state, event_type), target in chart.TRANSITIONS.items()})
