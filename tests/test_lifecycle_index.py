"""The lifecycle index's retained-pool takers (who is offered a retained pool first) and
its holders of retained pools, per pool."""

from __future__ import annotations

import dataclasses
import datetime as dt

import hypothesis
from hypothesis import strategies as st

from falcon_es.engine.lifecycle_index import Group, LifecycleIndex
from falcon_es.domain import events as ev
from falcon_es.domain.spec import TaskSpec
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from tests.support.task_states import replaced

T0 = dt.datetime(2026, 11, 1, 9)


def waiting(task_id: str, minute: int, reason: str = "Waiting") -> TaskState:
    return replaced(
        TaskState(task_id), state=f"Pending.{reason}", cluster_id="c-1", topology="2x2",
        submitted_at=T0 + dt.timedelta(minutes=minute))


def test_takers_come_slot_holders_first_then_in_submit_order_and_follow_changes() -> None:
    states = [waiting("late", 9), waiting("early", 1), waiting("holder", 5, "ClusterBusy"),
              waiting("other-queue", 0)]
    states[3] = replaced(states[3], topology="4x4")
    index = LifecycleIndex(TaskStates(states))
    index.rebuild()
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["holder", "early", "late"]

    index.update(replaced(states[2], pool_intent="create-requested"))  # has a pool now
    index.update(replaced(states[1], state="Pending.ClusterBusy"))  # took the slot
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["early", "late"]
    assert index.takers(("c-1", "2x2")) == {"early", "late"}
    index.update(replaced(states[1], state="Running"))
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["late"]
    assert list(index.takers_in_order(("c-1", "4x4"))) == ["other-queue"]


def ended_two_slice(**changes: object) -> TaskState:
    """An ended two-slice task that retained both its pools, for "s1" and "s2"."""
    return replaced(
        TaskState("ms"), state="Succeeded", cluster_id="c-1", topology="2x2",
        spec=TaskSpec("", "v6e", "2x2", slices=2), node_pool_name="falcon-ms-2x2",
        pool_intent="ready",
        slices_requested=2, pool_disposition="retained",
        pools_retained={"falcon-ms-2x2": "s1", "falcon-ms-2x2-s1": "s2"}, **changes)


def test_each_retained_pool_of_a_group_is_held_and_handed_on_alone() -> None:
    """s1 took one pool: the other is still the holder's and retained, in the index
    the taker's state built and in one rebuilt from the holder alone (a restart after
    s1 left memory), where the holder's own NodePoolHandedOver says so."""
    taker = replaced(
        waiting("s1", 1), state="Running", node_pool_name="falcon-ms-2x2",
        pool_intent="ready", pool_from_task="ms")
    index = LifecycleIndex(TaskStates([ended_two_slice(), taker, waiting("s2", 2)]))
    index.rebuild()
    assert index.retained(("c-1", "2x2")) == {("ms", "falcon-ms-2x2-s1")}
    assert index.holder(("c-1", "falcon-ms-2x2")) == "s1"
    assert index.holder(("c-1", "falcon-ms-2x2-s1")) == "ms"
    assert index.handed_on("ms") == {"falcon-ms-2x2"}
    assert index.ids(Group.POOL_WATCH) == {"ms"}
    assert index.pool_watch() == set()  # s2 can still take the other one: nothing to do

    alone = ended_two_slice(pools_handed_over=("falcon-ms-2x2",))
    index = LifecycleIndex(TaskStates([alone, waiting("s2", 2)]))
    index.rebuild()
    assert index.retained(("c-1", "2x2")) == {("ms", "falcon-ms-2x2-s1")}
    assert index.holder(("c-1", "falcon-ms-2x2")) is None
    assert index.pool_watch() == set()

    index.update(replaced(waiting("s2", 2), state="Pending.Provisioning",
                                     node_pool_name="falcon-ms-2x2-s1", pool_intent="ready",
                                     pool_from_task="ms"))
    assert index.retained(("c-1", "2x2")) == set()
    assert index.holder(("c-1", "falcon-ms-2x2-s1")) == "s2"
    assert index.ids(Group.POOL_WATCH) == set()  # the holder answers for nothing now


def test_a_multi_slice_holder_waiting_for_room_is_a_taker_only_while_it_holds_slices() -> None:
    """A two-slice holder in ClusterBusy holding nothing is promised no pool (it could
    not use one before the rest fits); one holding the slice its partial create made is
    a taker for the slice it lacks, ahead of the waiting tasks, and none once both of
    its slices are asked for."""
    holding_nothing = replaced(waiting("ms", 5, "ClusterBusy"),
                                          spec=TaskSpec("", "v6e", "2x2", slices=2))
    index = LifecycleIndex(TaskStates([holding_nothing, waiting("w", 1)]))
    index.rebuild()
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["w"]

    partial = replaced(
        holding_nothing, node_pool_name="falcon-ms-2x2", pool_intent="create-started",
        slices_requested=1, pool_request=ev.NodePoolCreateRequested(
            "falcon-ms-2x2", "flex-start", "ct6e-standard-4t", 1, None, 600,
            slices=2, first_slice=0, upto=1))
    index.update(partial)
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["ms", "w"]
    index.update(replaced(partial, state="Pending.Provisioning", slices_requested=2))
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["w"]


def test_a_poll_lives_beside_the_index_and_spends_a_retry_already_due() -> None:
    """The handlers' operation polls are no part of the projection: the index reads
    them to tell when a task needs a look, a retry moment due when the poll was
    decided no longer holds the wake in the past, and a new version drops the poll."""
    retry_at = T0 + dt.timedelta(minutes=1)
    state = dataclasses.replace(waiting("p", 0, "Provisioning"), version=3)
    index = LifecycleIndex(TaskStates([state]), wake_of=lambda s: retry_at)
    index.rebuild()
    assert index.next_wake() == retry_at and index.waking(retry_at) == ["p"]

    later = T0 + dt.timedelta(minutes=2)
    index.polls.polled(state, later + dt.timedelta(seconds=30), later)  # the retry's look
    assert index.wake_at("p") == index.next_wake() == later + dt.timedelta(seconds=30)
    assert index.waking(later) == [] and index.polls.due(state) == index.next_wake()

    index.update(dataclasses.replace(state, version=4))  # the task moved on: look afresh
    assert index.polls.of("p") is None and index.next_wake() == retry_at


# ---------------------------------------------------------------- pool watch, kept per task
def _took(task_id: str, minute: int, state: str = "Running") -> TaskState:
    return replaced(waiting(task_id, minute), state=state, node_pool_name="falcon-ms-2x2",
                    pool_intent="ready", pool_from_task="ms")


HOLDER_LIFE = (ended_two_slice(),
               replaced(ended_two_slice(), pool_disposition="delete-requested"),
               replaced(ended_two_slice(), pool_disposition="deleted", pools_retained={}))
#: Lives a taker of the holder's pools may lead, each state a later one of the last.
TAKER_LIVES = (
    (lambda t, m: waiting(t, m), lambda t, m: waiting(t, m, "ClusterBusy"),
     lambda t, m: waiting(t, m), _took, lambda t, m: _took(t, m, state="Succeeded")),
    (lambda t, m: replaced(waiting(t, m), cluster_id="c-2"), lambda t, m: waiting(t, m),
     lambda t, m: replaced(waiting(t, m), state="Failed")),
    (lambda t, m: waiting(t, m, "ClusterBusy"),
     lambda t, m: replaced(waiting(t, m), state="Succeeded")),
)


class _Known:
    """The committed states the index reads (``get``, ``all``), set by the test."""

    def __init__(self, states: dict[str, TaskState] | None = None) -> None:
        self.states = dict(states or {})

    def get(self, task_id: str) -> TaskState | None:
        return self.states.get(task_id)

    def all(self) -> list[TaskState]:
        return list(self.states.values())


@st.composite
def _histories(draw: st.DrawFn) -> list[TaskState]:
    """The holder's and two takers' lives, each cut short somewhere, interleaved."""
    lives = {"ms": [lambda t, m, state=state: state for state in HOLDER_LIFE]}
    for taker in ("s1", "s2"):
        lives[taker] = list(draw(st.sampled_from(TAKER_LIVES)))
    steps = {t: draw(st.integers(1, len(life))) for t, life in lives.items()}
    order = draw(st.permutations([t for t, n in steps.items() for _ in range(n)]))
    made = dict.fromkeys(lives, 0)
    history = []
    for task_id in order:
        history.append(lives[task_id][made[task_id]](task_id, int(task_id[1:]) if task_id != "ms" else 0))
        made[task_id] += 1
    return history


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_histories())
def test_the_pool_watch_kept_as_tasks_change_is_the_one_built_from_scratch(
        history: list[TaskState]) -> None:
    """Whatever order the holder and its takers move in, the pool watch names the tasks
    an index built from scratch on the same states names."""
    known = _Known()
    index = LifecycleIndex(known)  # type: ignore[arg-type]
    for state in history:
        known.states[state.task_id] = state
        index.update(state)
        rebuilt = LifecycleIndex(_Known(known.states))  # type: ignore[arg-type]
        rebuilt.rebuild()
        assert index.pool_watch() == rebuilt.pool_watch()
        assert index.ids(Group.POOL_WATCH) == rebuilt.ids(Group.POOL_WATCH)
