"""The lifecycle index's retained-pool takers: who is offered a retained pool first."""

from __future__ import annotations

import dataclasses
import datetime as dt

from falcon_es.lifecycle_index import LifecycleIndex
from falcon_es.task import TaskState, TaskStates

T0 = dt.datetime(2026, 11, 1, 9)


def waiting(task_id: str, minute: int, reason: str = "Waiting") -> TaskState:
    return dataclasses.replace(
        TaskState(task_id), state=f"Pending.{reason}", cluster_id="c-1", topology="2x2",
        submitted_at=T0 + dt.timedelta(minutes=minute))


def test_takers_come_slot_holders_first_then_in_submit_order_and_follow_changes() -> None:
    states = [waiting("late", 9), waiting("early", 1), waiting("holder", 5, "ClusterBusy"),
              waiting("other-queue", 0)]
    states[3] = dataclasses.replace(states[3], topology="4x4")
    index = LifecycleIndex(TaskStates(states))
    index.rebuild()
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["holder", "early", "late"]

    index.update(dataclasses.replace(states[2], pool_intent="create-requested"))  # has a pool now
    index.update(dataclasses.replace(states[1], state="Pending.ClusterBusy"))  # took the slot
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["early", "late"]
    assert index.takers(("c-1", "2x2")) == {"early", "late"}
    index.update(dataclasses.replace(states[1], state="Running"))
    assert list(index.takers_in_order(("c-1", "2x2"))) == ["late"]
    assert list(index.takers_in_order(("c-1", "4x4"))) == ["other-queue"]
