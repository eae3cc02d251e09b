"""Inputs from the upper layer, read from the ``job`` table by indexed queries."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es import chart, db
from falcon_es.tables import job


@dataclasses.dataclass(frozen=True)
class NewRow:
    id: str
    name: str
    actor: str
    spec_raw: Any  # text as stored: decoding it is validation's job
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class AbortRow:
    id: str
    aborting_at: dt.datetime | None


class Inbox(Protocol):
    """What the intake handlers read: new rows (oldest first) and abort requests."""

    def new_rows(self, limit: int = 1000) -> list[NewRow]: ...

    def abort_rows(self) -> list[AbortRow]: ...


_NEW_COLUMNS = (job.c.id, job.c.name, job.c.actor,
                sa.type_coerce(job.c.spec, sa.Text).label("spec_raw"), job.c.created_at)
_IS_NEW = sa.and_(job.c.status == chart.PENDING, job.c.reason.is_(None))
_NEW_ROWS = (
    sa.select(*_NEW_COLUMNS).where(_IS_NEW)
    .order_by(job.c.created_at, job.c.id)
    .limit(sa.bindparam("limit"))
)
_ABORT_ROWS = sa.select(job.c.id, job.c.aborting_at).where(job.c.status == chart.ABORTING)
_NEW_ROWS_FIRST = _NEW_ROWS.subquery("new_rows")
#: Both inputs in one statement: new rows (their own LIMIT, in a derived table) and
#: every abort request, told apart by ``is_abort`` and ordered as ``_NEW_ROWS`` orders.
#: Each half fills the other's columns with typed NULLs so every column keeps its
#: result processing.
_POLL = sa.union_all(
    sa.select(
        _NEW_ROWS_FIRST.c.id, _NEW_ROWS_FIRST.c.name, _NEW_ROWS_FIRST.c.actor,
        _NEW_ROWS_FIRST.c.spec_raw, _NEW_ROWS_FIRST.c.created_at,
        sa.type_coerce(sa.null(), job.c.aborting_at.type).label("aborting_at"),
        sa.literal(0).label("is_abort"),
    ),
    sa.select(
        job.c.id, sa.type_coerce(sa.null(), job.c.name.type).label("name"),
        sa.type_coerce(sa.null(), job.c.actor.type).label("actor"),
        sa.type_coerce(sa.null(), sa.Text).label("spec_raw"),
        sa.type_coerce(sa.null(), job.c.created_at.type).label("created_at"),
        job.c.aborting_at, sa.literal(1).label("is_abort"),
    ).where(job.c.status == chart.ABORTING),
).order_by(sa.literal_column("is_abort"), sa.literal_column("created_at"),
           sa.literal_column("id"))


class JobInbox:
    """New rows are ``Pending`` with no Reason yet (the projection sets one on intake);
    abort requests are rows in ``Aborting``. Both use the (status, reason) index.

    Reads begin deferred (``db.read_only``): on SQLite a poll must not take the write
    lock the controller's own appends need."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.reader = db.read_only(engine)
        self._compiled_poll: tuple[str, tuple[str, ...], dict[str, Any]] | None = None

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        with self.reader.connect() as conn:
            return [NewRow(r.id, r.name, r.actor, r.spec_raw, r.created_at)
                    for r in conn.execute(_NEW_ROWS, {"limit": limit})]

    def abort_rows(self) -> list[AbortRow]:
        with self.reader.connect() as conn:
            return [AbortRow(r.id, r.aborting_at) for r in conn.execute(_ABORT_ROWS)]

    def poll(self, limit: int = 1000) -> InboxPoll:
        """Both inputs as of now, in one statement: what a tick reads (each tick polls
        once instead of once per input). Sent as the driver's SQL, compiled once: every
        tick polls, and compiling, caching and result processing cost more than the
        query when there is nothing new."""
        sql, names, fixed = self._poll_statement()
        values = {**fixed, "limit": limit}
        params: Any = tuple(values[name] for name in names) if names else values
        new: list[NewRow] = []
        aborts: list[AbortRow] = []
        with self.reader.connect() as conn:
            rows = conn.exec_driver_sql(sql, params).all()
        for row_id, name, actor, spec_raw, created_at, aborting_at, is_abort in rows:
            if is_abort:
                aborts.append(AbortRow(row_id, _timestamp(aborting_at)))
            else:  # created_at is NOT NULL
                new.append(NewRow(row_id, name, actor, spec_raw, _timestamp(created_at)))  # type: ignore[arg-type]
        return InboxPoll(self, limit, new, aborts)

    def _poll_statement(self) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        """The poll as this dialect's SQL text, the names of its positional parameters
        (empty for named ones) and the values of those that never change."""
        if self._compiled_poll is None:
            compiled = _POLL.compile(dialect=self.engine.dialect)
            names = tuple(compiled.positiontup or ()) if compiled.positional else ()
            self._compiled_poll = (str(compiled), names, dict(compiled.params))
        return self._compiled_poll


def _timestamp(value: Any) -> dt.datetime | None:
    """A DATETIME as the driver returns it: text on SQLite (SQLAlchemy's storage
    format, which ``fromisoformat`` reads), a datetime from PyMySQL."""
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value)
    return value


class InboxPoll:
    """One poll's rows, answering like the inbox it came from; asked for more new rows
    than a full poll holds, it reads them from the inbox."""

    def __init__(self, inbox: JobInbox, limit: int, new: list[NewRow],
                 aborts: list[AbortRow]) -> None:
        self.inbox = inbox
        self.limit = limit
        self._new = new
        self._aborts = aborts

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        if limit > self.limit and len(self._new) >= self.limit:
            return self.inbox.new_rows(limit)
        return self._new[:limit]

    def abort_rows(self) -> list[AbortRow]:
        return list(self._aborts)
