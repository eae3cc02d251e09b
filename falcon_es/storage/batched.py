"""Writes of one transaction sent to MySQL/MariaDB together, in one round trip.

An append's writes after it has reserved its seqs (the log's INSERT, the job-table
rows, the live set, who each queue served last, position Messages) need no answer but
success, yet each was a round trip of its own. Inside ``collecting(conn)`` they are
queued, and ``flush`` (run when ``collecting`` ends, or earlier by a caller about to
run a statement of its own) sends them as one multi-statement query: PyMySQL with
``CLIENT.MULTI_STATEMENTS`` (``allow_on``). The server runs them in order and stops at
the first error; the driver raises it when it reads that statement's answer, which
``_read_every_answer`` does within the execute, so the error is wrapped by SQLAlchemy
as the statement's own would have been (an ``IntegrityError`` stays one) and the
transaction rolls back.

A statement run on the connection past the queue (a read, a Core statement) sends the
queue first, so the transaction's statements keep their order whoever sends them.
Anywhere else (SQLite, where a statement is a function call; a connection without
the flag; no ``collecting`` under way) a write runs at once, so callers need not know.
A queued statement must use ``%s`` marks and no other ``%``: the queue is formatted as
one string. An append's queue ends with its COMMIT (``end_with_commit``), which then
costs no round trip of its own.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from pymysql.constants import CLIENT
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import transaction_ends

#: ``Connection.info`` key of the queue ``collecting`` opened.
_QUEUE = "falcon_batched_writes"
#: Execution option marking the statement whose every answer must be read.
MANY_ANSWERS = "falcon_many_answers"
#: Execution option of an engine whose queued statements someone counts: a callable
#: taking each statement as it is queued (``bench.round_trips``).
ON_QUEUED = "falcon_on_queued"
#: The statement ``end_with_commit`` queues last.
COMMIT = "COMMIT"
#: A queue this long (characters of SQL and values) is sent at once: one packet stays
#: far below the server's ``max_allowed_packet`` (16 MiB by default, 4 MiB at least).
FLUSH_CHARACTERS = 1 << 20


@dataclasses.dataclass
class _Queue:
    statements: list[str] = dataclasses.field(default_factory=list)
    values: list[Any] = dataclasses.field(default_factory=list)
    characters: int = 0
    #: The last statement is the transaction's COMMIT (``end_with_commit``).
    commits: bool = False


def allow_on(engine: Engine) -> None:
    """Let the engine's MySQL/MariaDB connections take several statements per query,
    and read every answer of a batch (``flush``)."""

    @sa.event.listens_for(engine, "do_connect")
    def _with_multi_statements(_dialect: Any, _record: Any, _cargs: Any,
                               cparams: dict[str, Any]) -> None:
        cparams["client_flag"] = cparams.get("client_flag", 0) | CLIENT.MULTI_STATEMENTS

    sa.event.listen(engine, "do_execute", _read_every_answer)
    sa.event.listen(engine, "before_cursor_execute", _queue_first)


def _queue_first(conn: Connection, _cursor: Any, _statement: str, _parameters: Any,
                 context: Any, _executemany: bool) -> None:
    """A statement run past the queue (a read, a Core statement) goes after what waits
    there: the queue is sent first, so the transaction's writes keep their order."""
    if context is not None and context.execution_options.get(MANY_ANSWERS):
        return
    queue: _Queue | None = conn.info.get(_QUEUE)
    if queue is not None and queue.statements:
        flush(conn)


def _read_every_answer(cursor: Any, statement: str, parameters: Any, context: Any) -> bool | None:
    if context is None or not context.execution_options.get(MANY_ANSWERS):
        return None
    cursor.execute(statement, parameters)
    # ``nextset`` reads the next statement's answer, raising its error; None: none left.
    collections.deque(iter(cursor.nextset, None), maxlen=0)
    return True


def takes_batches(conn: Connection) -> bool:
    """Whether this connection's driver takes several statements in one query."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return False
    dbapi_connection = conn.connection.dbapi_connection
    return bool(getattr(dbapi_connection, "client_flag", 0) & CLIENT.MULTI_STATEMENTS)


@contextmanager
def collecting(conn: Connection) -> Iterator[None]:
    """Queue the writes ``send`` gets on ``conn`` until the block ends, then send them
    (nothing is sent when the block raises: the transaction is rolled back anyway)."""
    if not takes_batches(conn) or _QUEUE in conn.info:
        yield
        return
    conn.info[_QUEUE] = _Queue()
    try:
        yield
        flush(conn)
    finally:
        # A connection lost meanwhile took its ``info`` with it (and asking for it
        # would raise: the transaction must be rolled back first).
        if not conn.invalidated:
            conn.info.pop(_QUEUE, None)


def queuing(conn: Connection) -> bool:
    """Whether writes ``send`` gets on ``conn`` are queued now (``collecting``)."""
    return _QUEUE in conn.info


def send(conn: Connection, sql: str, values: Sequence[Any] = ()) -> int | None:
    """Run ``sql`` with ``values`` (the driver's marks), or queue it while ``collecting``:
    the rows it matched when run at once, None when queued."""
    queue: _Queue | None = conn.info.get(_QUEUE)
    if queue is None:
        return conn.exec_driver_sql(sql, tuple(values)).rowcount
    _queue(conn, queue, sql, values, _characters(values))
    return None


def send_rows(conn: Connection, insert: str, marks: str, rows: Sequence[Sequence[Any]],
              suffix: str = "") -> None:
    """``insert`` (``INSERT ... VALUES``) of every row, ``marks`` being one row's
    ``(%s, ...)``, then ``suffix`` (``ON DUPLICATE KEY UPDATE ...``): multi-row
    statements, as PyMySQL's executemany would send them, queued while ``collecting``
    (run at once otherwise, as the driver's executemany, on any dialect)."""
    if not rows:
        return
    queue: _Queue | None = conn.info.get(_QUEUE)
    if queue is None:
        conn.exec_driver_sql(f"{insert} {marks} {suffix}".rstrip(), list(rows))
        return
    chunk: list[Any] = []
    count = characters = 0
    for row in rows:
        chunk.extend(row)
        count += 1
        characters += _characters(row)
        if characters >= FLUSH_CHARACTERS // 2:
            _queue(conn, queue, f"{insert} {', '.join([marks] * count)} {suffix}", chunk,
                   characters)
            chunk, count, characters = [], 0, 0
    if count:
        _queue(conn, queue, f"{insert} {', '.join([marks] * count)} {suffix}", chunk,
               characters)


def end_with_commit(conn: Connection) -> None:
    """Commit the transaction as the last statement of the queue, sent when
    ``collecting`` ends; the connection then sends no COMMIT of its own for SQLAlchemy's
    (``transaction_ends``). Nothing but that commit may follow on ``conn``. Outside
    ``collecting`` (SQLite, batches off) nothing is queued: the transaction commits as
    it would have."""
    queue: _Queue | None = conn.info.get(_QUEUE)
    if queue is not None:
        queue.commits = True  # set first: a queue sent at once knows it ends there
        _queue(conn, queue, COMMIT, (), 0)


def _characters(values: Sequence[Any]) -> int:
    """About how much of a query ``values`` take (a string its length, else 8)."""
    return sum(len(v) if isinstance(v, str) else 8 for v in values)


def _queue(conn: Connection, queue: _Queue, sql: str, values: Sequence[Any],
           characters: int) -> None:
    """Queue one statement (``characters``: its values' share of the query), telling a
    counter that asked (``ON_QUEUED``); send the queue once it outgrew one packet."""
    queue.statements.append(sql)
    queue.values.extend(values)
    on_queued = conn.get_execution_options().get(ON_QUEUED)
    if on_queued is not None:
        on_queued(sql)
    queue.characters += len(sql) + characters
    if queue.characters >= FLUSH_CHARACTERS:
        flush(conn)


def flush(conn: Connection) -> None:
    """Send what is queued, as one query; each statement's error raises here."""
    queue: _Queue | None = conn.info.get(_QUEUE)
    if queue is None or not queue.statements:
        return
    sql, values = ";\n".join(queue.statements), tuple(queue.values)
    commits, queue.commits = queue.commits, False
    queue.statements, queue.values, queue.characters = [], [], 0
    conn.exec_driver_sql(sql, values, execution_options={MANY_ANSWERS: True})
    if commits:  # every answer was read: the COMMIT's too
        transaction_ends.ended_by_query(conn.connection.dbapi_connection)
