"""What the inbox reads from the job table, as handlers see it: the rows (new, bad,
abort and priority requests, a task's row as the row check reads it) and the
``Inbox`` protocol the intake handlers read them through."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class NewRow:
    id: str
    name: str
    actor: str
    spec_raw: Any  # text as stored: decoding it is validation's job
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class RowProblem:
    """Why a row cannot become a task as it stands: the job Reason it gets
    (``InvalidColumn`` or ``InvalidId``), Falcon-ES's name of the column, what is wrong."""

    reason: str
    column: str
    detail: str


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A new row with a value Falcon-ES cannot use; ``name`` and ``actor`` are as much
    of them as could be read."""

    id: str
    name: str
    actor: str
    problem: RowProblem


@dataclasses.dataclass(frozen=True)
class SeenRow:
    """A task's job row as the row check reads it: Status and Reason, the created_at
    (None when unreadable) and the spec as stored."""

    id: str
    status: Any
    reason: Any
    created_at: dt.datetime | None
    spec_raw: Any


@dataclasses.dataclass(frozen=True)
class AbortRow:
    id: str
    aborting_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class PriorityRow:
    """A request for a task's priority to change (the optional priority columns):
    ``priority`` as stored, a whole number or a class name (the handler resolves it)."""

    id: str
    priority: int | str | None
    requested_at: dt.datetime
    requested_by: str


class Inbox(Protocol):
    """What the intake handlers read: new rows (oldest first), the new rows that cannot
    become tasks as they stand, abort requests, and recent priority change requests
    (none when the table has no priority columns)."""

    def new_rows(self, limit: int = 1000) -> list[NewRow]: ...

    def bad_rows(self) -> list[BadRow]: ...

    def abort_rows(self) -> list[AbortRow]: ...

    def priority_rows(self) -> list[PriorityRow]: ...

    def priority_refused(self, row: PriorityRow, why: str) -> None: ...

    def rows_to_check(self, task_ids: Callable[[], Collection[str]]) -> list[str]: ...

    def rows_of(self, task_ids: Collection[str]) -> dict[str, SeenRow]: ...

    def ended_rows_to_check(self) -> list[SeenRow]: ...

    def first_finding(self, task_id: str, found: str) -> bool: ...

    def spec_unchanged(self, task_id: str, raw: Any) -> bool: ...

    def spec_seen(self, task_id: str, raw: Any) -> None: ...


#: Called once per finding of the row check (``JobRowDiverged.found``): the metric.
Diverged = Callable[[str], None]
#: Called once per ignored row with why (``UNKNOWN_STATUS``, ``NOT_TAKEN_IN``,
#: ``ID_TOO_LONG``, ``PRIORITY_REFUSED``): the metric.
Ignored = Callable[[str], None]


def cell_text(value: Any) -> str | None:
    """Text as a text column gives it; a whole number (an integer id) as its digits;
    bytes (a binary column) when they are UTF-8; None for anything else."""
    if type(value) is str:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None
