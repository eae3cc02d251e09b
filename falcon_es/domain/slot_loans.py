"""Slot lending: a slot holder stuck on its reservation lends its queue's slot.

A queue has one acquisition slot. A holder in ClusterBusy (its reservation full) that
holds nothing (no pool taken or created) would keep every task behind it waiting, even
those that would never touch its reservation. With best-effort FIFO (the default; the
strict FIFO of old is a setting) it lends the slot to the first task in pick order that
needs other capacity: another supply mode than the reservation it waits on. The tasks
passed over all compete for that reservation, so none is overtaken by one that competes
with it for the same capacity.

The holder keeps trying its reservation while it lends, and the moment the reservation
has room it goes on as it would have: the loan never delays it. The borrower acquires
beside it (at most one loan per queue at a time) and its slot is its own until its pods
run. Why this reading of "gets it back first": docs/design-notes/slot-lending.md.

Pure core: the two events of a loan (one on each task's stream, so each task's history
says what happened to it), and the rule that picks the borrower.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from falcon_es.domain.event_base import Event
from falcon_es.domain.spec import FLEX_START, RESERVATION

#: Why a task could borrow: it needs another supply mode than the lender's reservation.
WHY_OTHER_SUPPLY_MODE = "other-supply-mode"
#: How many of the tasks passed over a loan records (those it skipped, in pick order).
PASSED_OVER_RECORDED = 10


@dataclasses.dataclass(frozen=True)
class SlotLent(Event):
    """The slot holder waits for room on ``reservation`` holding nothing, and lent its
    queue's slot to ``to_task``, which needs other capacity (``to_supply_mode``); it
    goes on the moment its reservation has room, the loan notwithstanding."""

    to_task: str
    to_name: str
    to_supply_mode: str
    reservation: str
    why: str


@dataclasses.dataclass(frozen=True)
class SlotBorrowed(Event):
    """The task took its queue's slot on loan from ``from_task``, stuck waiting for room
    on ``reservation``, which this task does not use (it needs ``supply_mode``). The
    tasks of the queue ahead of it in pick order, all waiting for that reservation,
    are ``passed_over`` (the first ten, with how many in all)."""

    cluster_id: str
    topology: str
    from_task: str
    from_name: str
    reservation: str
    supply_mode: str
    why: str
    passed_over: tuple[dict[str, Any], ...] = ()
    passed_over_count: int = 0


def borrowed_changes(event: SlotBorrowed, state: object,
                     at: dt.datetime) -> dict[str, dict[str, Any]]:
    """What a ``SlotBorrowed`` changes in the borrower's state: it holds the slot on
    loan (the queue book places it apart from the queue's holder)."""
    return {"placement": {"borrowed_from": event.from_task}}


def resolved_mode(asked: str | None, cluster_reservation: str | None) -> str:
    """The supply mode a task uses on a cluster: its own, else the reservation where the
    cluster has one, flex-start otherwise."""
    if asked:
        return asked
    return RESERVATION if cluster_reservation else FLEX_START


def competes(asked: str | None, cluster_reservation: str | None, lender_mode: str) -> bool:
    """Whether a task of the queue would wait for the same capacity as the lender: the
    same supply mode on the same cluster (every task of a queue that uses the
    reservation mode there uses the cluster's one reservation)."""
    return resolved_mode(asked, cluster_reservation) == lender_mode


@dataclasses.dataclass(frozen=True)
class LoanCandidate:
    """A waiting task as the lending rule sees it."""

    task_id: str
    name: str
    actor: str
    supply_mode: str | None  # as the spec asks (None: the cluster's default)


@dataclasses.dataclass(frozen=True)
class Loan:
    """Who borrows the slot, why, and whom it passes over."""

    borrower: LoanCandidate
    supply_mode: str
    why: str
    passed_over: tuple[LoanCandidate, ...]
    passed_over_count: int

    def passed_over_record(self) -> tuple[dict[str, Any], ...]:
        return tuple({"task_id": c.task_id, "actor": c.actor, "name": c.name}
                     for c in self.passed_over)


def choose_borrower(order: Iterable[LoanCandidate], cluster_reservation: str | None,
                    lender_mode: str = RESERVATION) -> Loan | None:
    """The first task in pick order that does not compete for the lender's capacity
    (None: every waiting task does, and the slot stays idle for the holder)."""
    passed: list[LoanCandidate] = []
    for candidate in order:
        if competes(candidate.supply_mode, cluster_reservation, lender_mode):
            passed.append(candidate)
            continue
        return Loan(candidate, resolved_mode(candidate.supply_mode, cluster_reservation),
                    WHY_OTHER_SUPPLY_MODE, tuple(passed[:PASSED_OVER_RECORDED]), len(passed))
    return None
