"""A fold that updates its states in place (``evolve(..., in_place=True)``, what a
replay of the whole log runs) gives the states the copying fold gives, over legal walks
of the chart with events of every task type."""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.domain.fold_steps import STEP_OUTCOMES, STEPS
from falcon_es.domain.intents import Intent, IntentKind, JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.naming import pool_group
from falcon_es.domain.task import TaskState, evolve, new_state
from falcon_es.domain.task_intents import task_intents
from falcon_es.domain.task_states import TaskStates

AT = dt.datetime(2026, 11, 1, 9)
TEXTS = ("a", "b", *sorted(STEP_OUTCOMES))


def _value(hint: Any) -> st.SearchStrategy[Any]:
    """Values for an event field, from its type annotation (None where it may be)."""
    text = str(hint)
    values: st.SearchStrategy[Any]
    if "datetime" in text:
        values = st.integers(0, 600).map(lambda s: AT + dt.timedelta(seconds=s))
    elif text.startswith("tuple[dict"):
        values = st.just(({"name": "gke-a", "cluster_id": "c-1", "queued": 0},))
    elif text.startswith("tuple"):
        values = st.lists(st.sampled_from(("p-1", "p-2")), max_size=2).map(tuple)
    elif text.startswith("dict"):
        values = st.just({"image": "i"})
    elif "bool" in text:
        values = st.booleans()
    elif "int" in text and "str" not in text:
        values = st.integers(0, 3)
    else:
        values = st.sampled_from(TEXTS)
    return st.one_of(st.none(), values) if "None" in text else values


def _event(cls: type[ev.Event]) -> st.SearchStrategy[ev.Event]:
    hints = typing.get_type_hints(cls)
    return st.fixed_dictionaries(
        {f.name: _value(hints[f.name]) for f in dataclasses.fields(cls)}).map(lambda d: cls(**d))


EVENTS = {cls.__name__: _event(cls) for cls in ev.TASK_EVENTS}
NEXT = {state: sorted(t for s, t in STEPS if s == state) for state in (chart.NEW, *chart.STATES)}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_in_place_fold_gives_the_copying_folds_states(data: st.DataObject) -> None:
    copied, own = new_state("t-1"), new_state("t-1")
    for second in range(data.draw(st.integers(1, 25))):
        choices = NEXT[copied.state]
        if not choices:
            break
        event = data.draw(EVENTS[data.draw(st.sampled_from(choices))])
        at = AT + dt.timedelta(seconds=second)
        before = copied
        copied = evolve(copied, event, at)
        assert evolve(own, event, at, in_place=True) is own
        assert own == copied
        assert before.version == copied.version - 1


class _Record(typing.NamedTuple):
    stream_id: str
    event: ev.Event
    recorded_at: dt.datetime


def _walks(data: st.DataObject, streams: int) -> list[_Record]:
    """Legal walks of a few tasks, their events interleaved in a drawn order."""
    states = {f"t-{n}": new_state(f"t-{n}") for n in range(streams)}
    records: list[_Record] = []
    for second in range(data.draw(st.integers(1, 40))):
        task_id = data.draw(st.sampled_from(sorted(states)))
        choices = NEXT[states[task_id].state]
        if not choices:
            continue
        event = data.draw(EVENTS[data.draw(st.sampled_from(choices))])
        at = AT + dt.timedelta(seconds=second)
        states[task_id] = evolve(states[task_id], event, at)
        records.append(_Record(task_id, event, at))
    return records


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_an_appends_fold_gives_the_per_event_folds_states_and_changes(
        data: st.DataObject) -> None:
    """``TaskStates.apply`` (an append's fold: one copy per task, then in place) stages
    the states and net changes ``TaskStates.fold`` stages, append after append, and
    leaves the states it started from untouched."""
    records = _walks(data, data.draw(st.integers(1, 3)))
    per_event, in_place = TaskStates(), TaskStates()
    while records:
        size = data.draw(st.integers(1, len(records)))
        append, records = records[:size], records[size:]
        held = {r.stream_id: (s, dict(s.__dict__)) for r in append
                if (s := in_place.get(r.stream_id)) is not None}
        per_event.fold(append)
        in_place.apply(None, append)
        assert in_place.changes() == per_event.changes()
        assert in_place.all() == per_event.all()
        for state, fields in held.values():
            assert state.__dict__ == fields
        per_event.committed()
        in_place.committed()


def _plain_took(state: TaskState) -> tuple[tuple[str, str], ...]:
    pool = state.pool
    if pool.from_task and pool.name and not pool.taken_pools:
        return ((pool.name, pool.from_task),)
    return tuple(zip(pool.taken_pools, pool.taken_from, strict=True))


def _plain_intents(state: TaskState) -> tuple[Intent, ...]:
    """``task_intents`` as first written: every check in turn, no shortcut."""
    cluster_id = state.placement.cluster_id or ""
    found = []
    if state.pool.intent == PoolIntent.CREATE_REQUESTED and state.pool.name:
        request = state.pool.request
        own = request.pool_name if request is not None else state.pool.name
        found.append(Intent(IntentKind.POOL_CREATE, state.task_id, own, cluster_id))
    if state.job.name and state.job.intent == JobIntent.SUBMIT_REQUESTED:
        found.append(Intent(IntentKind.JOB_SUBMIT, state.task_id, state.job.name, cluster_id))
    if state.job.name and state.job.intent == JobIntent.DELETE_REQUESTED:
        found.append(Intent(IntentKind.JOB_DELETE, state.task_id, state.job.name, cluster_id))
    deleting = state.pool.deleting or state.node_pools[:1]
    if deleting and state.pool.disposition in (PoolDisposition.DELETE_REQUESTED,
                                               PoolDisposition.DELETE_FAILED):
        found.append(Intent(IntentKind.POOL_DELETE, state.task_id, deleting[0], cluster_id))
    return tuple(found)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_the_reads_of_every_commit_give_their_plain_definitions(data: st.DataObject) -> None:
    """What the projections read of each changed state (pools taken, the intents
    open, whether it ended) is what the plain definitions give, on every state of
    legal walks."""
    state = new_state("t-1")
    for record in _walks(data, 1):
        state = evolve(state, record.event, record.recorded_at)
        assert state.took == _plain_took(state)
        assert task_intents(state) == _plain_intents(state)
        assert state.is_terminal == (state.status in chart.TERMINAL_STATUSES)


@pytest.mark.parametrize("slices", [0, 1, 2, 3])
def test_a_pool_group_names_one_pool_per_slice(slices: int) -> None:
    assert pool_group("falcon-a-2x2", slices) == (
        "falcon-a-2x2", *(f"falcon-a-2x2-s{i}" for i in range(1, slices)))
