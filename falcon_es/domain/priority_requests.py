"""Priority requests: whether the upper layer's request to change a task's priority
applies, and why not when it does not. Pure core."""

from __future__ import annotations

import dataclasses

from falcon_es.domain import chart
from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.task import TaskState



@dataclasses.dataclass(frozen=True)
class PriorityChange:
    """A request that applies: the task's base priority goes from ``old`` to ``new``."""

    old: int
    new: int


@dataclasses.dataclass(frozen=True)
class PriorityRefused:
    """A request that cannot apply, and why (for the requester)."""

    why: str


def judge_priority_request(task_id: str, state: TaskState | None, requested: object,
                           policy: PriorityPolicy) -> PriorityChange | PriorityRefused | None:
    """Whether the upper layer's request for ``requested`` (an integer or a class
    name) changes the task's priority. Only a waiting task's can change: a priority
    orders the waiting, and a task that holds a slot or runs has been served. None when
    the task already has that priority (nothing to record: also a request applied
    before and read again)."""
    try:
        new = policy.resolve(requested)
    except ValueError as error:
        return PriorityRefused(f"priority {error}")
    if state is None:
        return PriorityRefused(f"Falcon-ES has no task {task_id} (not taken in yet, or its "
                               "row is not a task); only a waiting task's priority can change")
    if new == state.priority:
        return None
    where = state.status if state.reason is None else f"{state.status}/{state.reason}"
    if state.is_terminal:
        return PriorityRefused(f"task {task_id} has ended ({where}); only a waiting task's "
                               "priority can change")
    if state.status != chart.PENDING or state.reason != chart.PendingReason.WAITING:
        return PriorityRefused(f"task {task_id} is {where}, no longer waiting (it was "
                               "picked already); only a waiting task's priority can change")
    return PriorityChange(state.priority, new)
