"""The compiled transition table agrees with the python-statemachine chart."""

from __future__ import annotations

import pytest
from statemachine.exceptions import TransitionNotAllowed

from falcon_es.domain import chart
from falcon_es.domain import events as ev


def _chart_in(state: str) -> chart.TaskChart:
    """Drive a fresh chart to ``state`` along a shortest path through the table."""
    path = _path_to(state)
    machine = chart.TaskChart()
    for event in path:
        machine.send(event)
    assert chart.state_of(machine.configuration) == state
    return machine


def _path_to(goal: str) -> list[str]:
    frontier = [(chart.NEW, [])]
    seen = {chart.NEW}
    while frontier:
        state, path = frontier.pop(0)
        if state == goal:
            return path
        for (source, event), target in sorted(chart.TRANSITIONS.items()):
            if source == state and target not in seen:
                seen.add(target)
                frontier.append((target, [*path, event]))
    raise AssertionError(f"{goal} unreachable")


@pytest.mark.parametrize("state", chart.STATES)
@pytest.mark.parametrize("event", sorted(cls.__name__ for cls in ev.TASK_EVENTS))
def test_table_and_chart_agree(state: str, event: str) -> None:
    machine = _chart_in(state)
    expected = chart.TRANSITIONS.get((state, event))
    if expected is None:
        with pytest.raises(TransitionNotAllowed):
            machine.send(event)
    else:
        machine.send(event)
        assert chart.state_of(machine.configuration) == expected


def test_every_chart_event_is_an_event_type() -> None:
    assert {event for _, event in chart.TRANSITIONS} == {c.__name__ for c in ev.TASK_EVENTS}


def test_illegal_transition_names_task_state_and_event() -> None:
    with pytest.raises(chart.IllegalTransition, match="task t-1: event TaskAccepted is not allowed in state Running"):
        chart.next_state("t-1", "Running", "TaskAccepted")


def test_terminal_states_only_take_pool_and_late_abort_facts() -> None:
    for status in chart.TERMINAL_STATUSES:
        targets = {t for (s, _), t in chart.TRANSITIONS.items() if s == status}
        assert targets == {status}


def test_every_state_is_reachable_and_every_non_terminal_can_abort() -> None:
    for state in chart.STATES:
        _path_to(state)
        if chart.status_of(state) not in chart.TERMINAL_STATUSES | {chart.ABORTING}:
            assert chart.TRANSITIONS[(state, "AbortRequested")] == chart.ABORTING


def test_mermaid_and_dot_render() -> None:
    mermaid = chart.to_mermaid()
    assert mermaid.startswith("stateDiagram-v2") and "Pending" in mermaid
    dot = chart.to_dot()
    assert '"Pending.Waiting" -> "Pending.Provisioning" [label="TaskPicked"]' in dot
