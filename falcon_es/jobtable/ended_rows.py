"""The row check's second half: the job rows of tasks no longer in memory.

A task leaves memory once it holds nothing (``falcon_es.engine.live_set``), so the row
check of the tasks in memory never looks at its row again; an upper layer that forges
such a row afterwards (a Succeeded set to Failed, a finished task set back to Running)
would leave it wrong for good. So the whole table is read again, a page of rows a tick,
ordered by id (a keyset, so a page costs the same wherever it is in a table of
millions), a pass every ``ENDED_ROW_CHECK_SECONDS`` (a day). New rows (Pending, no Reason) are
intake's, rows in Aborting are abort requests (the abort handler's) and rows refused
``DuplicateId`` are no task's: none of them is read.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.domain import statuses
from falcon_es.domain.clock import Clock
from falcon_es.domain.spec import DUPLICATE_ID
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.jobtable.rows import SeenRow, cell_text
from falcon_es.storage.tables import JobTable

#: How often (clock seconds) a pass over the whole job table starts, and how many rows
#: one tick reads. A pass over N rows takes ceil(N / ENDED_ROW_CHECK_PAGE) ticks; each
#: page folds the log of those of its rows whose tasks are not in memory (a page of 200
#: ended tasks is a few milliseconds of folding), and that is the cost: a pass an hour
#: was 7 % of ``bench e2e``'s CPU at 2,000 tasks, so a forged row of an ended task is
#: put right within a day instead.
ENDED_ROW_CHECK_SECONDS = 86_400.0
ENDED_ROW_CHECK_PAGE = 200


class EndedRowPages:
    """Pages of the job table for the row check of tasks outside memory, in id order;
    a pass starts at most every ``ENDED_ROW_CHECK_SECONDS`` of ``clock`` and ends with
    the first page shorter than ``ENDED_ROW_CHECK_PAGE``."""

    def __init__(self, reader: Engine, job: JobTable, clock: Clock | None,
                 page: int = ENDED_ROW_CHECK_PAGE) -> None:
        self.reader = reader
        self.clock = clock
        self.page = page
        self._first, self._next = _pages(job, page)
        #: The pass under way: the id of the last row it read (None: none yet, or no
        #: pass under way) and when the next pass may start.
        self._after: Any = None
        self._in_pass = False
        self._next_pass: dt.datetime | None = None

    def next_page(self) -> list[SeenRow]:
        """The next page of the pass under way, or of a new pass when one is due;
        empty when none is."""
        if not self._in_pass and not self._pass_due():
            return []
        self._in_pass = True
        with self.reader.connect() as conn:
            if self._after is None:
                rows = conn.execute(self._first).all()
            else:
                rows = conn.execute(self._next, {"after": self._after}).all()
        if len(rows) < self.page:
            self._in_pass, self._after = False, None
        else:
            self._after = rows[-1].id
        return [SeenRow(text, row.status, row.reason, as_timestamp(row.created_at), None)
                for row in rows if (text := cell_text(row.id)) is not None]

    def _pass_due(self) -> bool:
        now = self.clock.now() if self.clock is not None else None
        if now is None or (self._next_pass is not None and now < self._next_pass):
            return False
        self._next_pass = now + dt.timedelta(seconds=ENDED_ROW_CHECK_SECONDS)
        return True


def _pages(job: JobTable, page: int) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """The first page of a pass, and each page after an id."""
    c = job.c
    read = sa.and_(
        sa.not_(sa.and_(c.status == statuses.PENDING, c.reason.is_(None))),
        c.status != statuses.ABORTING, sa.or_(c.reason.is_(None), c.reason != DUPLICATE_ID))
    first = (sa.select(c.id.label("id"), c.status.label("status"), c.reason.label("reason"),
                       c.created_at.label("created_at"))
             .where(read).order_by(c.id).limit(page))
    return first, first.where(c.id > sa.bindparam("after"))
