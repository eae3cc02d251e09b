"""Database round trips counted, and told where they came from.

A round trip is a statement sent, a transaction ended (commit or rollback, the pool's
rollback of a connection given back included) or a ping the pool sends first; an end
that sends nothing (``storage.transaction_ends``) is none. Totals say that a change cost
round trips; the sites say which handler, projection or read path did: each round trip
is put down to the handler or inline projection under way (labelled by ``label_sites``,
one attribute set per call), or else to the innermost Falcon-ES function outside the
database plumbing that sent it (the log's own insert, the append's commit, the loop's
reads).
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from falcon_es.storage import batched, db, transaction_ends
from falcon_es.storage.store import RecordedEvent

if TYPE_CHECKING:
    from falcon_es.app.service import Service
    from falcon_es.engine.context import HandlerContext
    from falcon_es.engine.runtime import Handler, Tick

#: The site of a batch's one round trip (its statements are counted by their senders
#: in ``batched_sites``).
BATCH_SITE = "storage.batched:flush"
#: Modules whose frames are plumbing, never a site: the database helpers and this one.
_PLUMBING = ("falcon_es.storage.db", "falcon_es.storage.batched",
             "falcon_es.storage.transaction_ends", "falcon_es.bench.round_trips")


class StatementCounter:
    """Statements sent and transactions ended on an engine, while ``counting``, in all
    and by site (``sites``: round trips per label)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.statements = 0
        self.executemany = 0
        self.commits = 0
        self.rollbacks = 0
        #: Connections taken from the pool, and those the pool pinged first (MySQL,
        #: idle connections: ``db.PINGED``), a round trip of its own each.
        self.checkouts = 0
        self.pings = 0
        self.counting = True
        self.sites: Counter[str] = Counter()
        #: Statements queued into batches (``storage.batched``) by site: carried by the
        #: batch's one round trip, not round trips of their own.
        self.batched_sites: Counter[str] = Counter()
        #: The handler or projection under way (innermost last), set by ``label_sites``.
        self.under_way: list[str] = []
        #: The pool-reset listener of each engine counted (to remove it again).
        self._resets: dict[Engine, Callable[..., None]] = {}

    def __enter__(self) -> StatementCounter:
        for engine in self._engines():
            sa.event.listen(engine, "before_cursor_execute", self._statement)
            sa.event.listen(engine, "commit", self._commit)
            sa.event.listen(engine, "rollback", self._rollback)
            sa.event.listen(engine.pool, "checkout", self._checkout)
            sa.event.listen(engine.pool, "reset", self._resets.setdefault(
                engine, functools.partial(self._reset, engine.dialect)))
        self.engine.update_execution_options(**{batched.ON_QUEUED: self._queued})
        return self

    def __exit__(self, *_exc: object) -> None:
        for engine in self._engines():
            sa.event.remove(engine, "before_cursor_execute", self._statement)
            sa.event.remove(engine, "commit", self._commit)
            sa.event.remove(engine, "rollback", self._rollback)
            sa.event.remove(engine.pool, "checkout", self._checkout)
            sa.event.remove(engine.pool, "reset", self._resets.pop(engine))
        self.engine.update_execution_options(**{batched.ON_QUEUED: None})

    def _engines(self) -> tuple[Engine, ...]:
        """The engine and, where it has a pool of its own, its reader."""
        reader = db.read_only(self.engine)
        return (self.engine,) if reader.pool is self.engine.pool else (self.engine, reader)

    @property
    def round_trips(self) -> int:
        """Statements, transaction ends, and pings (where the pool pings)."""
        return (self.statements + self.commits + self.rollbacks
                + self.pings)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

    @contextmanager
    def site(self, label: str) -> Iterator[None]:
        """Round trips sent meanwhile are ``label``'s."""
        self.under_way.append(label)
        try:
            yield
        finally:
            self.under_way.pop()

    def per_task(self, tasks: int) -> dict[str, float]:
        """Every site's round trips per task, most first."""
        return {label: round(count / tasks, 2) for label, count in self.sites.most_common()}

    def per_task_batched(self, tasks: int) -> dict[str, float]:
        """Every site's statements carried in batches per task, most first."""
        return {label: round(count / tasks, 2) for label, count in self.batched_sites.most_common()}

    def _queued(self, statement: str) -> None:
        if self.counting:
            label = self.under_way[-1] if self.under_way else _sender(sys._getframe(2))
            self.batched_sites[f"{label} (commit)" if statement == batched.COMMIT else label] += 1

    def _count_site(self, kind: str) -> None:
        label = self.under_way[-1] if self.under_way else _sender(sys._getframe(2))
        self.sites[f"{label} ({kind})" if kind != "statement" else label] += 1

    def _statement(self, _conn: Any, _cursor: Any, _statement: str, _parameters: Any,
                   context: Any, executemany: bool) -> None:
        if self.counting:
            self.statements += 1
            self.executemany += executemany
            if context is not None and context.execution_options.get(batched.MANY_ANSWERS):
                self.sites[BATCH_SITE] += 1
            else:
                self._count_site("statement")

    def _commit(self, conn: Connection) -> None:
        if self.counting and transaction_ends.ending_sends(
                conn.dialect, conn.connection.dbapi_connection, rollback=False):
            self.commits += 1
            self._count_site("commit")

    def _rollback(self, conn: Connection) -> None:
        if self.counting and transaction_ends.ending_sends(
                conn.dialect, conn.connection.dbapi_connection, rollback=True):
            self.rollbacks += 1
            self._count_site("rollback")

    def _reset(self, dialect: Dialect, dbapi_connection: Any, _record: Any,
               state: Any) -> None:
        """The pool's rollback of a connection given back (none after ``close`` ended
        the transaction, nor when the connection is only being closed)."""
        if (self.counting and not state.terminate_only and not state.transaction_was_reset
                and transaction_ends.ending_sends(dialect, dbapi_connection, rollback=True)):
            self.rollbacks += 1
            self._count_site("pool reset")

    def _checkout(self, _dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if self.counting:
            self.checkouts += 1
            if record.info.get(db.PINGED):
                self.pings += 1
                self._count_site("ping")


def _sender(frame: FrameType | None) -> str:
    """The innermost Falcon-ES function outside the plumbing on the stack."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("falcon_es.") and not module.startswith(_PLUMBING):
            return f"{module.removeprefix('falcon_es.')}:{frame.f_code.co_qualname}"
        frame = frame.f_back
    return "outside falcon_es"


class _LabelledProjection:
    """An inline projection whose ``apply`` is a site of its own."""

    def __init__(self, inner: Any, counter: StatementCounter) -> None:
        self._inner = inner
        self._counter = counter
        self._label = f"projection {type(inner).__name__}"

    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        under_way = self._counter.under_way
        under_way.append(self._label)  # not ``site``: a context manager costs more here
        try:
            self._inner.apply(conn, recorded)
        finally:
            under_way.pop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _labelled_handler(handler: Handler, counter: StatementCounter) -> Handler:
    label = f"handler {handler.__module__.removeprefix('falcon_es.handlers.')}.{handler.__name__}"

    under_way = counter.under_way

    def labelled(tick: Tick, ctx: HandlerContext) -> None:
        under_way.append(label)  # not ``site``: twenty handlers a tick, every tick
        try:
            handler(tick, ctx)
        finally:
            under_way.pop()
    return labelled


def label_sites(service: Service, counter: StatementCounter) -> None:
    """Make each handler of ``service``'s controller and each inline projection of its
    store a site of ``counter``. Instruments this one bench's service only (the
    controller's handlers and the store's projections are replaced by labelled ones)."""
    controller, store = service.controller, service.app.store
    controller.handlers = tuple(_labelled_handler(h, counter) for h in controller.handlers)
    store.projections = tuple(_LabelledProjection(p, counter) for p in store.projections)
