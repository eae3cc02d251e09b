"""Where each task sits in the scheduler's queues: the queue key, the entry the
scheduler keeps of a task, and the placement a task state maps to.

Shared by the queue book (``queue_book``), the pick rule (``pick_rule``) and the
views that show the queues; pure core, no database.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Any

from falcon_es.domain import chart
from falcon_es.domain.task import TaskState

QueueKey = tuple[str, str]  # (cluster_id, topology)
Order = tuple[dt.datetime, str]  # (submitted_at, task_id): FIFO order within an actor
Head = tuple[dt.datetime, str, str]  # (submitted_at, task_id, actor): an actor's earliest


class Placement(enum.StrEnum):
    """Where a task sits in the book."""

    UNPLACED = "unplaced"  # Pending/Waiting, no cluster chosen yet (keyed by TPU type)
    WAITING = "waiting"  # Pending/Waiting in a queue
    SLOT = "slot"  # holds its queue's acquisition slot
    BORROWED = "borrowed"  # acquires on the slot its stuck holder lent it
    RUNNING = "running"


_EPOCH = dt.datetime(1970, 1, 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """What the scheduler needs to know about one task."""

    task_id: str
    actor: str
    name: str
    submitted_at: dt.datetime
    tpu_type: str
    topology: str
    order: Order  # (submitted_at, task_id), kept so the hot paths build no tuples
    priority: int = 0  # the base priority (aging is worked out when picking)
    supply_mode: str | None = None  # as the spec asks (None: the cluster's default)

    @classmethod
    def of(cls, state: TaskState) -> Entry:
        submitted = state.submission.submitted_at or _EPOCH
        return cls(state.task_id, state.submission.actor, state.submission.name, submitted, state.submission.tpu_type,
                   state.submission.topology, (submitted, state.task_id), state.submission.priority,
                   state.submission.spec.supply_mode or None)


Place = tuple[str, Any]  # (kind, QueueKey or TPU type)


def place_of(state: TaskState, current: Place | None) -> Place | None:
    """Where a task in ``state`` belongs, given where the book has it now."""
    status = state.status
    if status == chart.PENDING:
        reason = state.reason
        if reason == "Waiting":
            if state.placement.cluster_id is None:
                return (Placement.UNPLACED, state.submission.tpu_type)
            return (Placement.WAITING, (state.placement.cluster_id, state.submission.topology))
        if reason in chart.SLOT_REASONS and state.placement.cluster_id is not None:
            return (_slot_kind(state), (state.placement.cluster_id, state.submission.topology))
        return None
    if status == chart.RUNNING and state.placement.cluster_id is not None:
        return (Placement.RUNNING, (state.placement.cluster_id, state.submission.topology))
    if status == chart.ABORTING:
        if current is not None and current[0] in (Placement.SLOT, Placement.BORROWED):
            return current
        if current is None and state.placement.cluster_id is not None and _aborted_in_slot(state):
            # Placed from its state alone (a controller starting from the live set): it
            # held the slot when the abort came, and keeps it until the abort ends.
            return (_slot_kind(state), (state.placement.cluster_id, state.submission.topology))
    return None


def _slot_kind(state: TaskState) -> Placement:
    """A task acquiring holds its queue's slot, or the slot a stuck holder lent it."""
    return Placement.BORROWED if state.placement.borrowed_from else Placement.SLOT


def _aborted_in_slot(state: TaskState) -> bool:
    status, _, reason = (state.ending.abort_phase or "").partition("/")
    return status == chart.PENDING and reason in chart.SLOT_REASONS
