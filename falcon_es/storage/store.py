"""The event store: an append-only ``task_events`` log with optimistic concurrency.

One ``append`` is one transaction (one controller tick): it locks the one-row log head,
inserts the events with consecutive ``seq`` values, runs the inline projections on the
same connection, and commits. Holding the head lock until commit makes ``seq`` order
equal commit order on MySQL too, so a reader following ``seq > checkpoint`` never skips
a late commit.

Expected versions are checked by the log's unique ``(stream_id, version)``: a stream's
versions are consecutive, so any writer that moved a stream past the version expected
here took the next version too, and the insert collides with it. No read of the
streams' versions goes before the insert (it was a round trip of every append); the
error names the stream once the failed append has rolled back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import batched, db, fence as fencing
from falcon_es.domain import events as ev
from falcon_es.domain.clock import Clock
from falcon_es.domain.event_json import fields_text
from falcon_es.storage.fence import Fence
from falcon_es.storage.tables import log_head, task_events


#: Streams named per query when reading several by id (an IN list on the index).
STREAMS_PER_READ = 500


class _Probed(Exception):
    """Rolls back the transaction of ``EventStore.refusal``."""


class _HeadMissed(Exception):
    """The head was not where the append expected it: nothing was written."""


class ConcurrencyError(RuntimeError):
    """A stream's version differs from the one the writer expected; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Meta:
    """Who asked for an event and what caused it (stored beside the event's data)."""

    actor: str
    causation_id: str | None = None
    correlation_id: str | None = None
    controller: str | None = None

    def to_data(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, and appends call this per event.
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclasses.dataclass(frozen=True)
class StreamAppend:
    """Events for one stream. ``expected_version`` None appends wherever the stream ends
    (for streams nobody races on, such as the cluster registry's)."""

    stream_id: str
    expected_version: int | None
    events: tuple[ev.Event, ...]
    meta: Meta
    #: Optional per-event metadata (one per event) when causes differ within a tick.
    metas: tuple[Meta, ...] | None = None

    def meta_of(self, index: int) -> Meta:
        return self.metas[index] if self.metas else self.meta


class RecordedEvent(NamedTuple):
    """An event as stored. A named tuple rather than a frozen dataclass: just as
    immutable, and several times cheaper to build, which replays do per stored event."""

    seq: int
    stream_id: str
    version: int
    event: ev.Event
    meta: Mapping[str, Any]
    recorded_at: dt.datetime

    @property
    def type_name(self) -> str:
        return self.event.type_name


class FoldRecord(NamedTuple):
    """What a fold needs of a stored event: no seq, version or meta to decode."""

    stream_id: str
    event: ev.Event
    recorded_at: dt.datetime


class InlineProjection(Protocol):
    """A view written in the append's own transaction."""

    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None: ...

    def committed(self) -> None: ...

    def discarded(self) -> None: ...


class EventStore:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        projections: Sequence[InlineProjection] = (),
        fence: Fence | None = None,
    ) -> None:
        self.engine = engine
        self.reader = db.read_only(engine)
        self.clock = clock
        self.projections = tuple(projections)
        #: The writer fence term every append is checked against (None: unchecked).
        self.fence = fence
        #: Where this store's last append left the head (None: unknown, read it).
        self._known_head: int | None = None
        #: Whether the server raises on an integer overflow (None: not asked yet).
        self._overflows: bool | None = None

    # ------------------------------------------------------------------ writing
    def append(
        self, appends: Sequence[StreamAppend], *, extra: Iterable[Any] = (),
        at: dt.datetime | None = None,
    ) -> list[RecordedEvent]:
        """Append all streams' events atomically; raise ``ConcurrencyError`` on a
        version mismatch, ``FencedOut`` when the store's fence term is over. ``extra``
        are callables run on the same connection before commit (for writes that must
        commit with the events). ``at`` stamps the events
        (``recorded_at``): a tick passes the moment its handlers decided on, so the
        fold of the log sees what the tick saw; without it the clock is read."""
        appends = [a for a in appends if a.events]
        if not appends:
            return []
        try:
            return self._write(appends, extra, at, self._known_head)
        except _HeadMissed:
            # The head was not where this store left it (another writer appended, or
            # took the fence): once more, reading the head, which says which it was.
            return self._write(appends, extra, at, None)

    def _write(self, appends: Sequence[StreamAppend], extra: Iterable[Any],
               at: dt.datetime | None, known_head: int | None) -> list[RecordedEvent]:
        """``append``'s transaction; ``known_head``: where the head is expected (None:
        read it), see ``_reserve``."""
        try:
            with self.engine.begin() as conn:
                # The writes after the head's move go in one query (``batched``), the
                # COMMIT last: nothing may run on ``conn`` after it.
                with batched.collecting(conn):
                    recorded = self._append(conn, appends, self.clock.now() if at is None else at,
                                            known_head)
                    self._project(conn, recorded)
                    for write in extra:
                        write(conn)
                    batched.end_with_commit(conn)
        except sa.exc.IntegrityError as error:
            self._discard()
            raise self._concurrency_error(appends, error) from error
        except sa.exc.DBAPIError as error:
            self._discard()
            if known_head is not None and _missed_head(error):
                raise _HeadMissed() from error
            raise
        except BaseException:
            self._discard()
            raise
        self._known_head = recorded[-1].seq
        for projection in self.projections:
            projection.committed()
        return recorded

    def refusal(self, appends: Sequence[StreamAppend]) -> BaseException | None:
        """What the database says to these appends alone, the inline projections'
        writes included, in a transaction rolled back whatever happens: None when it
        takes them, else the error (a ``ConcurrencyError`` of its own when a stream
        moved meanwhile). Finds which new row a failed append could not take."""
        try:
            with self.engine.begin() as conn, batched.collecting(conn):
                recorded = self._append(conn, [a for a in appends if a.events],
                                        self.clock.now(), None)
                self._project(conn, recorded)
                batched.flush(conn)
                raise _Probed()
        except _Probed:
            return None
        except sa.exc.IntegrityError as error:
            moved = self._moved_streams(appends)
            return ConcurrencyError(moved) if moved else error
        except Exception as error:  # noqa: BLE001 - the answer is the error itself
            return error
        finally:
            self._discard()

    def _project(self, conn: Connection, recorded: list[RecordedEvent]) -> None:
        """The inline projections, on the append's connection. The log's INSERT may
        still be queued (``batched``): when a projection refuses, the queue is sent
        first, so a stream that moved meanwhile raises as it did when the INSERT ran
        alone (the projection, folding onto a state the log no longer has, may refuse
        the same events)."""
        try:
            for projection in self.projections:
                projection.apply(conn, recorded)
        except Exception:
            batched.flush(conn)
            raise

    def _concurrency_error(self, appends: Sequence[StreamAppend],
                           error: sa.exc.IntegrityError) -> ConcurrencyError:
        return ConcurrencyError(self._moved_streams(appends)
                                or f"concurrent append detected: {error.orig}")

    def _moved_streams(self, appends: Sequence[StreamAppend]) -> str:
        """The first stream whose version is not the one expected, as of now (empty:
        every stream is where its append expected it)."""
        expected = {a.stream_id: a.expected_version for a in appends
                    if a.expected_version is not None}
        if not expected:
            return ""
        with self.reader.connect() as conn:
            found = _stream_versions(conn, sorted(expected))
        for stream_id, version in expected.items():
            if found.get(stream_id, 0) != version:
                return (f"stream {stream_id}: expected version {version}, "
                        f"found {found.get(stream_id, 0)}")
        return ""

    def _discard(self) -> None:
        """Forget what a transaction that did not commit had staged, the head's place
        with it."""
        self._known_head = None
        for projection in self.projections:
            projection.discarded()

    def _append(self, conn: Connection, appends: Sequence[StreamAppend],
                now: dt.datetime, known_head: int | None) -> list[RecordedEvent]:
        stream_ids = [a.stream_id for a in appends]
        if len(set(stream_ids)) != len(stream_ids):
            raise ValueError("each stream may appear once per append")
        count = sum(len(a.events) for a in appends)
        head = self._reserve(conn, count, known_head)
        unexpected = [a.stream_id for a in appends if a.expected_version is None]
        current = _stream_versions(conn, unexpected) if unexpected else {}
        sqlite = conn.dialect.name == "sqlite"
        # The column values as the driver takes them (JSON text; on SQLite the
        # timestamp text SQLAlchemy's DateTime writes there): per-row bind processing
        # cost more than the INSERT itself.
        stored_at: Any = now.isoformat(" ", "microseconds") if sqlite else now
        dumps = fields_text
        rows: list[tuple[Any, ...]] = []
        recorded: list[RecordedEvent] = []
        seq = head
        for a in appends:
            version = (a.expected_version if a.expected_version is not None
                       else current.get(a.stream_id, 0))
            shared_meta = None if a.metas else a.meta.to_data()
            shared_meta_text = None if shared_meta is None else dumps(shared_meta)
            for index, event in enumerate(a.events):
                if shared_meta is not None:
                    meta, meta_text = shared_meta, shared_meta_text
                else:
                    meta = a.meta_of(index).to_data()
                    meta_text = dumps(meta)
                seq += 1
                version += 1
                rows.append((seq, a.stream_id, version, event.type_name, event.schema_version,
                             event.to_json_text(), meta_text, stored_at))
                recorded.append(RecordedEvent(seq, a.stream_id, version, event, meta, now))
        batched.send_rows(conn, _INSERT_EVENTS, _EVENT_MARKS_QMARK if sqlite else _EVENT_MARKS,
                          rows)
        return recorded

    def _reserve(self, conn: Connection, count: int, known_head: int | None) -> int:
        """Reserve ``count`` seqs; the seq before the first. While the writes are
        queued (``batched``) and the head is expected at ``known_head``, the head's move
        joins the queue: it needs no answer of its own, since it moves the head only
        from there (and, fenced, only in this store's term), and otherwise raises an
        overflow that stops the query before anything else runs (``_MOVE_KNOWN_HEAD``;
        ``append`` tries again reading the head). Otherwise the move reads the head."""
        if known_head is None or not batched.queuing(conn) or not self._overflow_raises(conn):
            return _move_head(conn, count, self.fence) - count
        if self.fence is None:
            batched.send(conn, _MOVE_KNOWN_HEAD, (known_head, count))
        else:
            batched.send(conn, _MOVE_KNOWN_HEAD_FENCED, (known_head, self.fence.term, count))
        return known_head

    def _overflow_raises(self, conn: Connection) -> bool:
        """Whether the server raises on an integer overflow, as MySQL's manual says it
        does whatever the ``sql_mode``, asked once: were it to clip the value instead, a
        head move that missed would let the rest of its query write."""
        if self._overflows is None:
            try:
                conn.exec_driver_sql(_OVERFLOW_PROBE, (1,))
                self._overflows = False
            except sa.exc.DBAPIError as error:
                if db.error_code(error.orig) != _OUT_OF_RANGE:
                    raise
                self._overflows = True
        return self._overflows

    # ------------------------------------------------------------------ reading
    def head(self) -> int:
        with self.reader.connect() as conn:
            return conn.execute(sa.select(log_head.c.last_seq)).scalar_one()

    def read_stream(self, stream_id: str, *, from_version: int = 1) -> list[RecordedEvent]:
        query = (
            sa.select(*_LOG_COLUMNS)
            .where(task_events.c.stream_id == stream_id)
            .order_by(task_events.c.version)
        )
        if from_version > 1:
            query = query.where(task_events.c.version >= from_version)
        with self.reader.connect() as conn:
            rows = conn.execute(query).all()
        return [to_recorded(row) for row in rows]

    def read_streams(self, starts: Mapping[str, int], *,
                     chunk: int = STREAMS_PER_READ) -> Iterator[list[RecordedEvent]]:
        """The events of these streams, each from its start version on: a list per
        ``chunk`` streams (through the ``(stream_id, version)`` index, never a scan of
        the log), each stream's events in version order and all of them in one list."""
        ids = sorted(starts)
        for first in range(0, len(ids), chunk):
            with self.reader.connect() as conn:
                rows = conn.execute(_READ_STREAMS, {"ids": ids[first:first + chunk]}).all()
            yield [to_recorded(row) for row in rows if row[2] >= starts[row[1]]]

    def streams_known(self, stream_ids: Collection[str]) -> set[str]:
        """Those of these streams that have events in the log."""
        ids = sorted(set(stream_ids))
        known: set[str] = set()
        for first in range(0, len(ids), STREAMS_PER_READ):
            with self.reader.connect() as conn:
                known.update(conn.execute(
                    _STREAMS_KNOWN, {"ids": ids[first:first + STREAMS_PER_READ]}).scalars())
        return known

    def streams_started(self, stream_ids: Collection[str]) -> dict[str, dt.datetime]:
        """Those of these streams that have events in the log, with when each began
        (its first event's recorded_at)."""
        ids = sorted(set(stream_ids))
        started: dict[str, dt.datetime] = {}
        for first in range(0, len(ids), STREAMS_PER_READ):
            with self.reader.connect() as conn:
                started.update((row.stream_id, row.recorded_at) for row in conn.execute(
                    _STREAMS_STARTED, {"ids": ids[first:first + STREAMS_PER_READ]}))
        return started

    def read_after(
        self, position: int, *, batch_size: int = 2000, until: int | None = None
    ) -> Iterator[RecordedEvent]:
        """Every event with ``seq > position`` (and ``<= until``), read in batches."""
        for batch in self.read_batches(position, batch_size=batch_size, until=until):
            yield from batch

    def read_batches(
        self, position: int, *, batch_size: int = 2000, until: int | None = None
    ) -> Iterator[list[RecordedEvent]]:
        for rows in self._pages(_LOG_COLUMNS, position, batch_size, until):
            yield [to_recorded(row) for row in rows]

    def read_for_fold(
        self, types: Collection[str], *, batch_size: int = 5000, until: int | None = None
    ) -> Iterator[list[FoldRecord]]:
        """The whole log, in batches, as ``FoldRecord``s of the event types named (the
        others are skipped undecoded). A replay decodes every stored event, so this path
        leaves out what a fold never reads (meta) and decodes the rest itself: the JSON
        text with ``json.loads`` and, on SQLite, the timestamp text with
        ``datetime.fromisoformat``, instead of SQLAlchemy's per-value processors."""
        columns = _fold_columns(self.reader.dialect.name)
        for rows in self._pages(columns, 0, batch_size, until):
            yield _fold_records(rows, types)

    def _pages(self, columns: Sequence[Any], position: int, batch_size: int,
               until: int | None) -> Iterator[Sequence[Any]]:
        """Rows of ``columns`` (seq first) after ``position``, a batch per read, each read
        on its own connection so no transaction stays open between batches."""
        while True:
            query = sa.select(*columns).where(task_events.c.seq > position)
            if until is not None:
                query = query.where(task_events.c.seq <= until)
            query = query.order_by(task_events.c.seq).limit(batch_size)
            with self.reader.connect() as conn:
                rows = conn.execute(query).all()
            if not rows:
                return
            yield rows
            position = rows[-1][0]

    def seq_at(self, moment: dt.datetime) -> int:
        """The last seq recorded at or before ``moment`` (for time-travel views)."""
        query = sa.select(sa.func.max(task_events.c.seq)).where(
            task_events.c.recorded_at <= moment
        )
        with self.reader.connect() as conn:
            return conn.execute(query).scalar() or 0


#: The head move of every append, as the driver takes it: built, cache-keyed and bound
#: by SQLAlchemy per append, the one-row UPDATE cost more than running it on SQLite.
#: SQLite hands the new head back with RETURNING; MySQL/MariaDB have no UPDATE ...
#: RETURNING, and LAST_INSERT_ID(expr) hands it back in the statement's own reply.
_MOVE_HEAD_SQLITE = "UPDATE log_head SET last_seq = last_seq + ? WHERE id = 1"
_MOVE_HEAD_FORMAT = "UPDATE log_head SET last_seq = LAST_INSERT_ID(last_seq + %s) WHERE id = 1"
#: The same, for a fenced writer: the head moves only while the term is its own.
_FENCED_SQLITE = " AND fence_term = ?"
_FENCED_FORMAT = " AND fence_term = %s"
#: The head's move when the store knows where the head is (MySQL/MariaDB, queued with
#: the append's writes): from there, and only from there (and in this store's term), or
#: an integer overflow, which the server raises as an error whatever the ``sql_mode``
#: (ER_DATA_OUT_OF_RANGE) and which stops the multi-statement query before the INSERT.
#: The overflowing sum names the head's column, so it is computed only when chosen.
_MOVE_KNOWN_HEAD_AS = ("UPDATE log_head SET last_seq = IF(last_seq = %s{fenced}, "
                       "last_seq + %s, 9223372036854775807 + last_seq + 1) WHERE id = 1")
_MOVE_KNOWN_HEAD = _MOVE_KNOWN_HEAD_AS.format(fenced="")
_MOVE_KNOWN_HEAD_FENCED = _MOVE_KNOWN_HEAD_AS.format(fenced=" AND fence_term = %s")
#: MySQL/MariaDB's ER_DATA_OUT_OF_RANGE, and the table its message names.
_OUT_OF_RANGE, _MISSED_HEAD = 1690, "log_head"
#: An overflow the server must refuse for ``_MOVE_KNOWN_HEAD`` to be used.
_OVERFLOW_PROBE = "SELECT 9223372036854775807 + %s"
_EVENT_COLUMNS = "seq, stream_id, version, type, schema_version, data, meta, recorded_at"
#: The driver-level INSERT: its head and one row's marks (qmark for sqlite3, an
#: executemany there; format for PyMySQL, one multi-row INSERT), ``batched.send_rows``.
_INSERT_EVENTS = f"INSERT INTO task_events ({_EVENT_COLUMNS}) VALUES"
_EVENT_MARKS_QMARK = f"({', '.join('?' * 8)})"
_EVENT_MARKS = f"({', '.join(['%s'] * 8)})"
_STREAM_VERSIONS = (
    sa.select(task_events.c.stream_id, sa.func.max(task_events.c.version))
    .where(task_events.c.stream_id.in_(sa.bindparam("stream_ids", expanding=True)))
    .group_by(task_events.c.stream_id)
)


def _move_head(conn: Connection, count: int, fence: Fence | None) -> int:
    """Reserve ``count`` seqs and return the new head, in one statement that also locks
    the head row until commit: concurrent appends queue here, so seq order is commit
    order (an UPDATE locks like SELECT ... FOR UPDATE and reads the latest commit).
    With a fence the same statement checks the term: it matches no row once another
    writer has taken the fence, and the append raises ``FencedOut``."""
    mysql = conn.dialect.name in ("mysql", "mariadb")
    sql = _MOVE_HEAD_FORMAT if mysql else _MOVE_HEAD_SQLITE
    values: tuple[int, ...] = (count,)
    if fence is not None:
        sql += _FENCED_FORMAT if mysql else _FENCED_SQLITE
        values = (count, fence.term)
    if mysql:
        # The dialect counts matched rows (CLIENT.FOUND_ROWS): 0 is the fence's refusal.
        result = conn.exec_driver_sql(sql, values)
        head = int(result.lastrowid) if result.rowcount == 1 else None
    else:
        head = conn.exec_driver_sql(sql + " RETURNING last_seq", values).scalar_one_or_none()
    if head is None:
        if fence is None:
            raise RuntimeError("the log has no head row: the database was not upgraded")
        raise fencing.refusal(conn, fence)
    return int(head)


def _missed_head(error: sa.exc.DBAPIError) -> bool:
    """Whether ``error`` is the overflow of a head move that did not find the head
    where it was expected (``_MOVE_KNOWN_HEAD``)."""
    return db.error_code(error.orig) == _OUT_OF_RANGE and _MISSED_HEAD in str(error.orig)


def _stream_versions(conn: Connection, stream_ids: Sequence[str]) -> dict[str, int]:
    rows = conn.execute(_STREAM_VERSIONS, {"stream_ids": list(stream_ids)}).all()
    return {stream_id: version for stream_id, version in rows}


#: The columns ``to_recorded`` reads, in the order it unpacks them.
_LOG_COLUMNS = (
    task_events.c.seq, task_events.c.stream_id, task_events.c.version, task_events.c.type,
    task_events.c.schema_version, task_events.c.data, task_events.c.meta,
    task_events.c.recorded_at,
)


_READ_STREAMS = (
    sa.select(*_LOG_COLUMNS)
    .where(task_events.c.stream_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(task_events.c.stream_id, task_events.c.version)
)
_STREAMS_KNOWN = sa.select(task_events.c.stream_id).where(
    task_events.c.stream_id.in_(sa.bindparam("ids", expanding=True)),
    task_events.c.version == 1)
_STREAMS_STARTED = sa.select(task_events.c.stream_id, task_events.c.recorded_at).where(
    task_events.c.stream_id.in_(sa.bindparam("ids", expanding=True)),
    task_events.c.version == 1)


def _fold_columns(dialect: str) -> tuple[Any, ...]:
    """seq, stream_id, type, schema_version, data as text, recorded_at (text on SQLite,
    which stores it so; the MySQL driver already returns a datetime)."""
    recorded_at: Any = task_events.c.recorded_at
    if dialect == "sqlite":
        recorded_at = sa.type_coerce(recorded_at, sa.Text)
    return (task_events.c.seq, task_events.c.stream_id, task_events.c.type,
            task_events.c.schema_version, sa.type_coerce(task_events.c.data, sa.Text),
            recorded_at)


def _fold_records(rows: Sequence[Any], types: Collection[str]) -> list[FoldRecord]:
    decode, loads, parse = ev.decode, json.loads, dt.datetime.fromisoformat
    records = []
    for _, stream_id, type_name, schema_version, data, recorded_at in rows:
        if type_name in types:
            if isinstance(recorded_at, str):
                recorded_at = parse(recorded_at)
            records.append(FoldRecord(stream_id, decode(type_name, schema_version, loads(data)),
                                      recorded_at))
    return records


def to_recorded(row: Any) -> RecordedEvent:
    """A row of ``select(*_LOG_COLUMNS)`` as a typed event. Unpacked by position: a
    Row's attribute access costs about a microsecond per column, per stored event."""
    seq, stream_id, version, type_name, schema_version, data, meta, recorded_at = row
    event = ev.decode(type_name, schema_version, data)
    return RecordedEvent(seq, stream_id, version, event, meta, recorded_at)
