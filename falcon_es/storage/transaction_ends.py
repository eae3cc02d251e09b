"""MySQL/MariaDB connections that send COMMIT or ROLLBACK only when a transaction may
be open.

With autocommit off, InnoDB opens a transaction at the first statement after the last
COMMIT or ROLLBACK; with no statement since, an end is a round trip the server answers
with "nothing to do". The writer sent one after every write transaction: SQLAlchemy's
pool rolls each connection it gets back, even one whose transaction just committed,
and an append whose writes end in their own COMMIT (``batched.end_with_commit``) would
have had SQLAlchemy send a second one. ``Connection`` notes whether a query went out
since its last end and sends neither when none did.

The driver cannot tell: a result set's last packet carries the server's transaction
flag, but PyMySQL keeps the flag of OK packets only, so after a SELECT it still says
what the statement before it left.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine

from falcon_es.storage import literals


class Connection(literals.Connection):  # type: ignore[misc]
    """A PyMySQL connection that knows whether a transaction may be open (and makes
    its literals fast: ``literals``)."""

    #: No query went out since the last COMMIT or ROLLBACK this side saw answered.
    #: False at first: what ran while connecting is not followed.
    ended = False

    def query(self, sql: Any, unbuffered: bool = False) -> int:
        self.ended = False
        return int(super().query(sql, unbuffered))

    def commit(self) -> None:
        if not self.ended:
            super().commit()
            self.ended = True

    def rollback(self) -> None:
        if not self.ended:
            super().rollback()
            self.ended = True


def use_on(engine: Engine) -> None:
    """Make the engine's connections ``Connection``s (after every listener that sets
    their arguments: register this one last)."""

    @sa.event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Connection:
        return Connection(*cargs, **cparams)


def ended_by_query(dbapi_connection: Any) -> None:
    """The query just answered ended the transaction (it ran COMMIT last)."""
    if isinstance(dbapi_connection, Connection):
        dbapi_connection.ended = True


def ending_sends(dialect: Dialect, dbapi_connection: Any, *, rollback: bool) -> bool:
    """Whether ending this connection's transaction sends anything to the database:
    not from an autocommit reader whose dialect skips the rollback there (``db.read_only``),
    not from SQLite outside a transaction, not from a ``Connection`` with no query since
    its last end."""
    if dbapi_connection is None:
        return False
    if rollback and dialect.skip_autocommit_rollback and dialect.detect_autocommit_setting(
            dbapi_connection):
        return False
    if isinstance(dbapi_connection, sqlite3.Connection):
        return dbapi_connection.in_transaction
    return not getattr(dbapi_connection, "ended", False)
