"""Inputs from the upper layer, read from its job table by indexed queries (every
statement through the ``JobTable`` of the settings' mapping)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es import chart, db
from falcon_es.tables import JobTable


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


@dataclasses.dataclass(frozen=True)
class _Statements:
    new_rows: sa.Select[Any]
    abort_rows: sa.Select[Any]
    poll: sa.CompoundSelect


def _statements(job: JobTable) -> _Statements:
    """The inbox's statements on the mapped table, its columns labelled with
    Falcon-ES's names."""
    c = job.c
    new_columns = (c.id.label("id"), c.name.label("name"), c.actor.label("actor"),
                   sa.type_coerce(c.spec, sa.Text).label("spec_raw"),
                   c.created_at.label("created_at"))
    is_new = sa.and_(c.status == chart.PENDING, c.reason.is_(None))
    new_rows = (sa.select(*new_columns).where(is_new).order_by(c.created_at, c.id)
                .limit(sa.bindparam("limit")))
    abort_rows = (sa.select(c.id.label("id"), c.aborting_at.label("aborting_at"))
                  .where(c.status == chart.ABORTING))
    first = new_rows.subquery("new_rows")
    # Both inputs in one statement: new rows (their own LIMIT, in a derived table) and
    # every abort request, told apart by ``is_abort`` and ordered as the new rows are.
    # Each half fills the other's columns with typed NULLs so every column keeps its
    # result processing.
    poll = sa.union_all(
        sa.select(
            first.c.id, first.c.name, first.c.actor, first.c.spec_raw, first.c.created_at,
            sa.type_coerce(sa.null(), c.aborting_at.type).label("aborting_at"),
            sa.literal(0).label("is_abort"),
        ),
        sa.select(
            c.id.label("id"), sa.type_coerce(sa.null(), c.name.type).label("name"),
            sa.type_coerce(sa.null(), c.actor.type).label("actor"),
            sa.type_coerce(sa.null(), sa.Text).label("spec_raw"),
            sa.type_coerce(sa.null(), c.created_at.type).label("created_at"),
            c.aborting_at.label("aborting_at"), sa.literal(1).label("is_abort"),
        ).where(c.status == chart.ABORTING),
    ).order_by(sa.literal_column("is_abort"), sa.literal_column("created_at"),
               sa.literal_column("id"))
    return _Statements(new_rows, abort_rows, poll)


class JobInbox:
    """New rows are ``Pending`` with no Reason yet (the projection sets one on intake);
    abort requests are rows in ``Aborting``. Both use the (status, reason) index.

    Reads begin deferred (``db.read_only``): on SQLite a poll must not take the write
    lock the controller's own appends need."""

    def __init__(self, engine: Engine, job: JobTable) -> None:
        self.engine = engine
        self.job = job
        self.reader = db.read_only(engine)
        self._statements = _statements(job)
        self._compiled_poll: tuple[str, tuple[str, ...], dict[str, Any]] | None = None

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        with self.reader.connect() as conn:
            return [NewRow(r.id, r.name, r.actor, r.spec_raw, r.created_at)
                    for r in conn.execute(self._statements.new_rows, {"limit": limit})]

    def abort_rows(self) -> list[AbortRow]:
        with self.reader.connect() as conn:
            return [AbortRow(r.id, r.aborting_at)
                    for r in conn.execute(self._statements.abort_rows)]

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
            compiled = self._statements.poll.compile(dialect=self.engine.dialect)
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
