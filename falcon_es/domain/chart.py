"""The task state chart: the single source of truth for which transitions exist.

``TaskChart`` is a strict python-statemachine ``StateChart``. Its event names are the
task-stream event type names of ``falcon_es.domain.events``. The engine is too slow to fold
millions of events (~0.2 ms per transition), so ``TRANSITIONS`` compiles the chart once
into a lookup table keyed by (state, event type); folds and replays use the table and
the tests prove table and chart agree.

A state is written ``"Pending.Waiting"`` for a Pending sub-state and ``"Running"`` for a
top-level one. Status is the part before the dot; for Pending the Reason is the part
after it; for Failed the Reason comes from the event (``Event.failure``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from statemachine import State, StateChart

# The chart's states are named by the Status and Reason values of the job table; folds
# read them as chart.PENDING, chart.PendingReason, ... (re-exported from here).
from falcon_es.domain.statuses import (
    ABORTED,
    ABORTING,
    ACQUIRING_REASONS,
    FAILED,
    NEW,
    PENDING,
    PENDING_REASONS,
    RUNNING,
    SLOT_REASONS,
    SUCCEEDED,
    TERMINAL_STATUSES,
    PendingReason,
)


class IllegalTransition(ValueError):
    """An event the chart does not allow in the task's current state."""

    def __init__(self, task_id: str, state: str, event_type: str) -> None:
        super().__init__(
            f"task {task_id}: event {event_type} is not allowed in state {state}"
        )
        self.task_id = task_id
        self.state = state
        self.event_type = event_type


class TaskChart(StateChart):
    """Lifecycle of one task (see docs/explanation/chart.md)."""

    allow_event_without_transition = False
    catch_errors_as_events = False

    new = State("New", initial=True)

    class pending(State.Compound, name="Pending"):
        waiting = State("Waiting", initial=True)
        provisioning = State("Provisioning")
        cluster_busy = State("ClusterBusy")
        waiting_for_node = State("WaitingForNode")
        dispatching = State("Dispatching")

        NoActiveCluster = waiting.to.itself()
        ClusterChosen = waiting.to.itself()
        TaskRequeued = waiting.to.itself()
        # A waiting task moves; so does a ClusterBusy slot holder that holds nothing
        # (back to Waiting, on the cluster where its capacity is).
        TaskMoved = waiting.to.itself() | cluster_busy.to(waiting)
        PriorityChanged = waiting.to.itself()
        TaskPicked = waiting.to(provisioning)
        SlotYielded = cluster_busy.to(waiting)
        # Slot lending: the stuck holder stays in ClusterBusy, the borrower acquires.
        SlotLent = cluster_busy.to.itself()
        SlotBorrowed = waiting.to(provisioning)
        ReservationInsufficient = provisioning.to(cluster_busy) | cluster_busy.to.itself()
        NodePoolReused = provisioning.to(dispatching) | cluster_busy.to(dispatching)
        # A multi-slice task took a retained pool: it provisions the rest.
        NodePoolTaken = provisioning.to.itself() | cluster_busy.to(provisioning)
        NodePoolCreateRequested = (
            provisioning.to.itself() | cluster_busy.to(provisioning)
        )
        NodePoolCreateStarted = provisioning.to.itself() | waiting_for_node.to.itself()
        NodePoolNotVisible = provisioning.to.itself() | waiting_for_node.to.itself()
        NodesNotReady = provisioning.to(waiting_for_node) | waiting_for_node.to.itself()
        NodePoolReady = provisioning.to(dispatching) | waiting_for_node.to(dispatching)
        JobSubmitRequested = dispatching.to.itself()
        JobSubmitted = dispatching.to.itself()
        # An autoscaled pool's workload is submitted first: its pods then wait for the
        # nodes the autoscaler brings (WaitingForNode); pending for another cause, or
        # refused, they are Dispatching's again.
        NodesAwaited = dispatching.to(waiting_for_node) | waiting_for_node.to.itself()
        NodeWaitExtended = waiting_for_node.to.itself()
        PodsPending = dispatching.to.itself() | waiting_for_node.to(dispatching)
        PodsRefused = dispatching.to.itself() | waiting_for_node.to(dispatching)
        WorkloadDisrupted = dispatching.to.itself() | waiting_for_node.to.itself()

    running = State("Running")
    succeeded = State("Succeeded")
    failed = State("Failed")
    aborting = State("Aborting")
    aborted = State("Aborted")

    TaskAccepted = new.to(pending)
    TaskRejected = new.to(failed)
    NoMatchingCluster = pending.waiting.to(failed)
    NodePoolFailed = (
        pending.provisioning.to(failed)
        | pending.waiting_for_node.to(failed)
        | pending.cluster_busy.to(failed)
        | aborting.to.itself()
        | failed.to.itself()
    )
    NodePoolTimedOut = pending.provisioning.to(failed) | pending.waiting_for_node.to(failed)
    JobSubmitFailed = pending.dispatching.to(failed) | aborting.to.itself()
    PodsRunning = (pending.dispatching.to(running) | pending.waiting_for_node.to(running)
                   | running.to.itself())
    JobSucceeded = (pending.dispatching.to(succeeded) | pending.waiting_for_node.to(succeeded)
                    | running.to(succeeded))
    JobFailed = (pending.dispatching.to(failed) | pending.waiting_for_node.to(failed)
                 | running.to(failed))
    TaskTimedOut = pending.dispatching.to(failed) | running.to(failed)
    # A disruption kills pods the Job recreates: the task keeps its state.
    WorkloadDisrupted = running.to.itself()
    JobDeleteRequested = (
        running.to.itself() | failed.to.itself() | aborting.to.itself()
    )
    JobDeleted = failed.to.itself() | aborting.to.itself() | aborted.to.itself()

    AbortRequested = new.to(aborting) | pending.to(aborting) | running.to(aborting)
    AbortIgnored = succeeded.to.itself() | failed.to.itself() | aborted.to.itself()
    TaskAborted = aborting.to(aborted)
    # Outcomes of effects issued before an abort or a provisioning timeout still arrive:
    # they are recorded (the effect happened) and the task keeps its status.
    NodePoolCreateStarted = aborting.to.itself() | failed.to.itself()
    JobSubmitted = aborting.to.itself()
    JobSubmitCancelled = aborting.to.itself()

    NodePoolRetained = (
        succeeded.to.itself() | failed.to.itself() | aborting.to.itself()
        | aborted.to.itself()
    )
    NodePoolHandedOver = (
        succeeded.to.itself() | failed.to.itself() | aborting.to.itself()
        | aborted.to.itself()
    )
    NodePoolDeleteRequested = (
        succeeded.to.itself() | failed.to.itself() | aborting.to.itself()
        | aborted.to.itself()
    )
    NodePoolDeleted = (
        succeeded.to.itself() | failed.to.itself() | aborting.to.itself()
        | aborted.to.itself()
    )
    NodePoolDeleteFailed = (
        succeeded.to.itself() | failed.to.itself() | aborting.to.itself()
        | aborted.to.itself()
    )
    # A call that failed with a transient error is made again later: the task stays
    # where it is. Wherever an effect can be open (or, in ClusterBusy, a reservation
    # read is retried).
    ApiCallRetrying = (
        pending.provisioning.to.itself() | pending.cluster_busy.to.itself()
        | pending.dispatching.to.itself() | running.to.itself()
        | aborting.to.itself() | succeeded.to.itself() | failed.to.itself()
        | aborted.to.itself()
    )
    # The task's cluster's API does not answer (or answers again): the Message says so,
    # the task stays where it is. Wherever the task holds something on its cluster.
    ClusterApiUnanswered = (
        pending.provisioning.to.itself() | pending.cluster_busy.to.itself()
        | pending.waiting_for_node.to.itself() | pending.dispatching.to.itself()
        | running.to.itself() | aborting.to.itself()
    )


def state_of(configuration: object) -> str:
    """The table's state key for a running chart instance's configuration."""
    names = [s.name for s in configuration]  # type: ignore[attr-defined]
    if PENDING in names:
        sub = next(n for n in names if n != PENDING)
        return f"{PENDING}.{sub}"
    return names[0]


def _leaf_states(states: object, prefix: str = "") -> Iterator[tuple[str, State, list[State]]]:
    """Yield (key, leaf, ancestors) for every leaf state of the chart."""
    for state in states:  # type: ignore[attr-defined]
        children = list(state.states)
        key = f"{prefix}{state.name}"
        if children:
            for child_key, leaf, ancestors in _leaf_states(children, f"{key}."):
                yield child_key, leaf, [state, *ancestors]
        else:
            yield key, state, []


def _initial_leaf_key(state: State, key: str) -> str:
    children = list(state.states)
    if not children:
        return key
    initial = next(c for c in children if c.initial)
    return _initial_leaf_key(initial, f"{key}.{initial.name}")


def compile_transitions(chart: type[StateChart] = TaskChart) -> Mapping[tuple[str, str], str]:
    """(state key, event type) -> target state key, for every transition of the chart."""
    keys_by_state = {id(leaf): key for key, leaf, _ in _leaf_states(chart.states)}
    top_keys = {id(s): s.name for s in chart.states}
    table: dict[tuple[str, str], str] = {}
    for key, leaf, ancestors in _leaf_states(chart.states):
        # Inner transitions win over those inherited from the enclosing compound.
        for holder in [leaf, *reversed(ancestors)]:
            for transition in holder.transitions:
                target = transition.target
                target_key = keys_by_state.get(id(target)) or _initial_leaf_key(
                    target, top_keys[id(target)]
                )
                for event in transition.events:
                    table.setdefault((key, str(event)), target_key)
    return MappingProxyType(table)


TRANSITIONS: Mapping[tuple[str, str], str] = compile_transitions()
STATES: tuple[str, ...] = tuple(key for key, _, _ in _leaf_states(TaskChart.states))


def next_state(task_id: str, state: str, event_type: str) -> str:
    """The state after ``event_type``; raises ``IllegalTransition`` if not allowed."""
    try:
        return TRANSITIONS[(state, event_type)]
    except KeyError:
        raise IllegalTransition(task_id, state, event_type) from None


def status_of(state: str) -> str:
    return state.split(".", 1)[0]


def pending_reason(state: str) -> str | None:
    return state.split(".", 1)[1] if "." in state else None


#: The Reason of each Pending state, looked up: handlers ask it of every candidate
#: each tick.
PENDING_REASON_OF: Mapping[str, str | None] = MappingProxyType(
    {s: pending_reason(s) for s in STATES if status_of(s) == PENDING})


def _edges(include_self: bool) -> dict[tuple[str, str], list[str]]:
    """Edges between states with the events that take them, from the compiled table."""
    edges: dict[tuple[str, str], list[str]] = {}
    for (source, event), target in sorted(TRANSITIONS.items()):
        if source == target and not include_self:
            continue
        edges.setdefault((source, target), []).append(event)
    return edges


def _mermaid_id(state: str) -> str:
    return state.split(".")[-1]


def to_mermaid(include_self: bool = True) -> str:
    """Mermaid stateDiagram written from the compiled table (so it shows exactly what
    folds enforce), with Pending drawn as the compound state it is."""
    lines = ["stateDiagram-v2", "    direction LR", "    [*] --> New"]
    lines.append("    state Pending {")
    lines.append("        [*] --> Waiting")
    for (source, target), names in _edges(include_self).items():
        if source.startswith("Pending.") and target.startswith("Pending."):
            lines.append(f"        {_mermaid_id(source)} --> {_mermaid_id(target)}: {', '.join(names)}")
    lines.append("    }")
    for (source, target), names in _edges(include_self).items():
        if source.startswith("Pending.") and target.startswith("Pending."):
            continue
        lines.append(f"    {_mermaid_id(source)} --> {_mermaid_id(target)}: {', '.join(names)}")
    for status in sorted(TERMINAL_STATUSES):
        lines.append(f"    {status} --> [*]")
    return "\n".join(lines)


def to_dot() -> str:
    """DOT text written from the compiled table, so it needs no Graphviz install."""
    lines = ["digraph TaskChart {", "  rankdir=LR;", '  node [shape=box, style=rounded];']
    for (source, event), target in sorted(TRANSITIONS.items()):
        lines.append(f'  "{source}" -> "{target}" [label="{event}"];')
    lines.append("}")
    return "\n".join(lines)
