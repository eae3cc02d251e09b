"""Database engines and the schema lifecycle (Alembic migrations shipped in ``schema``).

The migrations create and migrate Falcon-ES's own tables only. The job table is the
upper layer's: ``check_job_table`` and ``index_advice`` look at it (under the settings'
names) without changing it, and ``create_job_table`` creates Falcon-ES's definition of
it only when asked (the demo, the tests, the benchmarks, ``db upgrade
--create-job-table``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Mapping
from types import MappingProxyType
import time
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Engine

from falcon_es.config.job_mapping import JobMapping
from falcon_es.storage import batched, transaction_ends
from falcon_es.storage.tables import (
    ACTOR_LENGTH, STREAM_ID_LENGTH, JobTable, MessageRoom, WantedIndex,
)

#: The job columns whose values Falcon-ES keeps in columns of a fixed width: what a
#: note calls their values, how many characters it keeps, the Reason a longer value
#: gets, and where it is kept.
KEPT_WIDTHS: Mapping[str, tuple[str, int, str, str]] = MappingProxyType({
    "id": ("ids", STREAM_ID_LENGTH, "InvalidId", "Falcon-ES's log"),
    "actor": ("actors", ACTOR_LENGTH, "InvalidColumn", "Falcon-ES's last_served.actor"),
})

#: Execution option marking a connection that only reads (see ``read_only``).
READ_ONLY_OPTION = "falcon_read_only"


if TYPE_CHECKING:
    from falcon_es.config.settings import DatabaseSettings


class DatabaseUrlError(ValueError):
    """The database URL cannot be used (bad syntax or an unsupported dialect)."""


class MigrationConflict(RuntimeError):
    """A migration step found an object of the name it creates, with another shape
    (raised by ``falcon_es.migrations.steps``; the message says what to do)."""


def make_engine(url: str, limits: DatabaseSettings | None = None, **kwargs: Any) -> Engine:
    """An engine tuned per dialect: SQLite in WAL with immediate write transactions,
    MySQL/MariaDB through PyMySQL in READ COMMITTED, taking batches of writes
    (``falcon_es.storage.batched``). ``limits`` (a controller's) bound
    every wait of every connection: connecting, each read and write, each lock wait,
    and how long the server keeps a write transaction that went quiet; without them
    (migrations, one-off commands) only connecting is bounded, by the driver. The
    writer's MySQL/MariaDB connections end a transaction only when one may be open
    (``falcon_es.storage.transaction_ends``).

    Beside it, with a pool of its own, the engine ``read_only`` returns: see there."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as error:
        raise DatabaseUrlError(f"database URL {url!r} is not a valid URL") from error
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        busy = 30.0 if limits is None else float(limits.lock_wait_timeout)
        if parsed.database in (None, "", ":memory:"):
            # A second pool would open a second, empty database: reads share the pool.
            engine = sa.create_engine(parsed, **kwargs)
            _make_sqlite_transactions_immediate(engine, busy)
            return engine
        reader = sa.create_engine(parsed, **_reading(kwargs))
        _set_sqlite_pragmas(reader, busy)
        engine = sa.create_engine(parsed, **_writing(kwargs, reader))
        _make_sqlite_transactions_immediate(engine, busy)
        return _disposed_together(engine, reader)
    if backend in ("mysql", "mariadb"):
        if parsed.get_driver_name() != "pymysql":
            raise DatabaseUrlError(
                f"database URL {url!r}: use the PyMySQL driver (mysql+pymysql://...)"
            )
        if limits is not None:
            kwargs["connect_args"] = {
                "connect_timeout": limits.connect_timeout, "read_timeout": limits.read_timeout,
                "write_timeout": limits.write_timeout, **kwargs.get("connect_args", {})}
        reader = sa.create_engine(parsed, pool_recycle=3600, **_reading(kwargs))
        engine = sa.create_engine(parsed, isolation_level="READ COMMITTED", pool_recycle=3600,
                                  **_writing(kwargs, reader))
        if limits is None or limits.batch_writes:
            batched.allow_on(engine)
        transaction_ends.use_on(engine)
        for each in (engine, reader):
            _ping_idle_connections(each)
            if limits is not None:
                _bound_session_waits(each, limits)
        return _disposed_together(engine, reader)
    raise DatabaseUrlError(
        f"database URL {url!r}: unsupported dialect {backend!r} (use sqlite or mysql+pymysql)"
    )


def read_only(engine: Engine) -> Engine:
    """The engine for reads that need no transaction of their own: each statement sees
    the latest commit, as under READ COMMITTED, and nothing is left to end.

    An engine from ``make_engine`` has a second pool whose connections are in
    autocommit and whose dialect skips the DBAPI rollback there
    (``skip_autocommit_rollback``): a read ends without a ROLLBACK round trip, which
    was one of every two the controller's polls cost. It must be a pool of its own:
    switching a shared connection into autocommit and back costs two round trips a
    checkout. Any other engine (a test's, an in-memory SQLite) gets its own pool
    marked read-only, so SQLite begins its reads deferred: a reader that took the
    write lock would queue behind a busy writer and stall it in turn."""
    reader = engine.get_execution_options().get(READER_OPTION)
    if reader is not None:
        return cast(Engine, reader)
    return engine.execution_options(**{READ_ONLY_OPTION: True})


#: Execution option carrying an engine's autocommit reader (see ``read_only``).
READER_OPTION = "falcon_reader"


def _reading(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {**kwargs, "isolation_level": "AUTOCOMMIT", "skip_autocommit_rollback": True,
            "execution_options": {**kwargs.get("execution_options", {}),
                                  READ_ONLY_OPTION: True}}


def _writing(kwargs: Mapping[str, Any], reader: Engine) -> dict[str, Any]:
    return {**kwargs, "execution_options": {**kwargs.get("execution_options", {}),
                                            READER_OPTION: reader}}


def _disposed_together(engine: Engine, reader: Engine) -> Engine:
    sa.event.listen(engine, "engine_disposed", lambda _engine: reader.dispose())
    return engine


#: A pooled MySQL connection idle longer than this is pinged before use.
IDLE_PING_SECONDS = 30.0
#: Set on a pool record's ``info`` at each checkout: whether that checkout pinged.
PINGED = "falcon_pinged"
_CHECKED_IN_AT = "falcon_checked_in_at"


def _ping_idle_connections(engine: Engine) -> None:
    """Pessimistic disconnect handling, but only for connections that sat idle: a
    server, proxy or failover may have dropped them. ``pool_pre_ping`` pings on every
    checkout, a round trip of its own; the controller checks connections out several
    times per tick, seconds apart at most, so nearly all of those pings were waste.
    A failed ping raises ``DisconnectionError``: the pool discards the connection and
    checks out a fresh one (SQLAlchemy's documented custom pre-ping)."""

    @sa.event.listens_for(engine.pool, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @sa.event.listens_for(engine.pool, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN_AT)
        record.info[PINGED] = since is None or time.monotonic() - since >= IDLE_PING_SECONDS
        if not record.info[PINGED]:
            return
        try:
            dbapi_connection.ping(reconnect=False)
        except Exception as error:  # whatever the driver raises for a dead socket
            raise sa.exc.DisconnectionError(f"database connection lost: {error}") from error


def _bound_session_waits(engine: Engine, limits: DatabaseSettings) -> None:
    """Per session: a row lock is waited for ``lock_wait_timeout`` seconds (not the
    server's 50), and on MariaDB a write transaction whose client went quiet for
    ``idle_transaction_timeout`` seconds is ended with its connection, so a frozen
    writer holding the log head cannot block its successor for longer."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(limits.lock_wait_timeout)}")
        if "mariadb" in dbapi_connection.get_server_info().lower():
            cursor.execute("SET SESSION idle_write_transaction_timeout = "
                           f"{int(limits.idle_transaction_timeout)}")
        cursor.close()


#: MySQL/MariaDB error codes of a database that blinked (the statement may succeed
#: when run again): lock wait timeout, deadlock, too many connections, server
#: shutting down, connection killed, can't connect, gone away, lost connection,
#: connection ended by the idle transaction timeout.
TRANSIENT_CODES = frozenset({1205, 1213, 1040, 1053, 1927, 2003, 2006, 2013, 2055, 4031})
#: SQLite's words for a write lock it could not get within the busy timeout.
_SQLITE_BUSY = ("database is locked", "database table is locked", "database is busy")


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is the database blinking (lost or refused connection, a hang
    past the read timeout, a lock wait timeout or deadlock) rather than an answer
    about what was sent: a tick that met it is simply run again from the log. Driver
    errors raised outside SQLAlchemy's wrapping (SQLite's BEGIN, issued straight to
    the driver) count as well."""
    if isinstance(error, (sa.exc.TimeoutError, sa.exc.DisconnectionError)):
        return True
    if isinstance(error, sa.exc.DBAPIError):
        if error.connection_invalidated or isinstance(error, sa.exc.InterfaceError):
            return True  # PyMySQL's InterfaceError: the connection is closed
        orig: BaseException | None = error.orig
    elif type(error).__module__.startswith(("pymysql", "sqlite3")):
        orig = error
    else:
        return False
    if error_code(orig) in TRANSIENT_CODES:
        return True
    if type(orig).__name__ == "InterfaceError":
        return True
    text = str(orig).lower()
    return type(orig).__name__ == "OperationalError" and any(
        words in text for words in _SQLITE_BUSY)


def error_code(error: BaseException | None) -> int | None:
    """The server's error number of a driver error (PyMySQL: its first argument), or
    None (SQLite's errors, and anything else, carry none)."""
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def first_line(error: BaseException) -> str:
    """A database error as one line, in the database's (the driver's) own words."""
    text = str(getattr(error, "orig", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _set_sqlite_pragmas(engine: Engine, busy_seconds: float) -> None:
    """WAL, so reads and the one writer proceed side by side; BEGIN is ours to send
    (the driver's own transaction handling is off)."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()


def _make_sqlite_transactions_immediate(engine: Engine, busy_seconds: float) -> None:
    """pysqlite defers BEGIN; take the write lock at BEGIN so appends serialize cleanly."""

    _set_sqlite_pragmas(engine, busy_seconds)

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        reading = conn.get_execution_options().get(READ_ONLY_OPTION, False)
        # Straight to the driver: through SQLAlchemy's execute path a BEGIN cost
        # several times the statement (tens of microseconds, on every transaction).
        conn.connection.dbapi_connection.execute("BEGIN" if reading else "BEGIN IMMEDIATE")


def alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(importlib.resources.files("falcon_es.migrations")))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


#: Job columns Falcon-ES writes NULL into: no Reason outside Pending and Failed, no
#: cluster, pool, Job or times before the task gets that far.
WRITTEN_AS_NULL = frozenset({
    "reason", "message", "cluster_id", "node_pool_name", "job_uid", "dispatched_at",
    "aborted_at", "finished_at",
})


def has_job_table(engine: Engine, job: JobTable) -> bool:
    return sa.inspect(engine).has_table(job.mapping.table, schema=job.mapping.schema)


def create_job_table(engine: Engine, job: JobTable) -> bool:
    """Create the job table from Falcon-ES's definition (with the indexes its queries
    want) unless a table of that name exists; True when it was created. An existing
    table is never altered."""
    if has_job_table(engine, job):
        return False
    job.table.create(engine)
    return True


def job_table_ddl(job: JobTable, dialect: sa.Dialect) -> str:
    """The statements that create the job table in ``dialect``, for an upper layer to
    create it (adding columns of its own as it likes)."""
    statements = [str(sa.schema.CreateTable(job.table).compile(dialect=dialect)).strip()]
    statements += [str(sa.schema.CreateIndex(index).compile(dialect=dialect)).strip()
                   for index in sorted(job.table.indexes, key=lambda i: str(i.name))]
    text = ";\n".join(statements) + ";"
    return "\n".join(line.rstrip() for line in text.splitlines())


@dataclasses.dataclass(frozen=True)
class ColumnProblem:
    """What is wrong with one column Falcon-ES uses: ``column`` is Falcon-ES's name,
    ``name`` the table's (the same unless the mapping renames it)."""

    column: str
    problem: str
    table: str = "job"
    name: str | None = None

    def __str__(self) -> str:
        name = self.name or self.column
        renamed = f" (Falcon-ES's {self.column})" if name != self.column else ""
        return f"{self.table}.{name}{renamed}: {self.problem}"


def check_job_table(engine: Engine, job: JobTable) -> list[ColumnProblem]:
    """Compare an existing job table (the upper layer's) with what Falcon-ES needs,
    under the mapping's names."""
    mapping = job.mapping
    table = mapping.qualified
    inspector = sa.inspect(engine)
    if not inspector.has_table(mapping.table, schema=mapping.schema):
        return [ColumnProblem("*", f"table {table!r} does not exist", table)]
    columns = {c["name"].lower(): c
               for c in inspector.get_columns(mapping.table, schema=mapping.schema)}
    problems: list[ColumnProblem] = []
    for name, kind in job.column_kinds.items():
        theirs = mapping.column(name)
        column = columns.get(theirs.lower())
        if column is None:
            problems.append(ColumnProblem(
                name, f"missing (expected {kind.__name__})", table, theirs))
        elif not _compatible(column["type"], kind):
            problems.append(ColumnProblem(
                name, f"has type {column['type']}, expected {kind.__name__}", table, theirs))
        elif name in WRITTEN_AS_NULL and not column["nullable"]:
            problems.append(ColumnProblem(
                name, "is NOT NULL, but Falcon-ES leaves it empty (NULL) in some states",
                table, theirs))
    return problems


def width_notes(engine: Engine, job: JobTable) -> list[str]:
    """One warning per column of the upper layer's table that can hold values longer
    than Falcon-ES keeps (``KEPT_WIDTHS``): such a row is failed at intake with its
    Reason instead of being taken in, so the upper layer should know before it writes
    one."""
    mapping = job.mapping
    wanted = {mapping.column(name).lower(): name for name in KEPT_WIDTHS}
    notes = []
    for column in sa.inspect(engine).get_columns(mapping.table, schema=mapping.schema):
        name = wanted.get(column["name"].lower())
        kind = column["type"]
        if name is None or not isinstance(kind, sa.String):
            continue
        noun, kept, reason, where = KEPT_WIDTHS[name]
        if kind.length is None or kind.length > kept:
            notes.append(f"{mapping.qualified}.{mapping.column(name)} is {kind}: {noun} longer "
                         f"than the {kept} characters of {where} are failed at intake "
                         f"(Reason {reason})")
    room = message_room(engine, mapping)
    if room.chars is not None or room.octets < MessageRoom().octets:
        held = f"{room.chars} characters" if room.chars is not None else f"{room.octets} bytes"
        notes.append(f"{mapping.qualified}.{mapping.column('message')} holds {held}: longer "
                     "Messages are cut to fit, ending with ' …[cut]' (a TEXT holds 65,535 bytes)")
    return sorted(notes, key=lambda note: not note.startswith(
        f"{mapping.qualified}.{mapping.column('id')} "))


#: Bytes of MySQL's text types (a ``TEXT(n)`` is made the smallest of them that holds n).
_TEXT_OCTETS: Mapping[type[sa.types.TypeEngine], int] = MappingProxyType({
    mysql.TINYTEXT: 255, mysql.MEDIUMTEXT: 16_777_215, mysql.LONGTEXT: 4_294_967_295,
})


def message_room(engine: Engine, mapping: JobMapping) -> MessageRoom:
    """What the upper layer's ``message`` column holds, read from the table: a
    ``VARCHAR(n)`` holds n characters, each text type its bytes. SQLite keeps any length
    and a missing table or column is Falcon-ES's own (a ``TEXT``): the default room."""
    if engine.dialect.name not in ("mysql", "mariadb"):
        return MessageRoom()
    inspector = sa.inspect(engine)
    if not inspector.has_table(mapping.table, schema=mapping.schema):
        return MessageRoom()
    theirs = mapping.column("message").lower()
    for column in inspector.get_columns(mapping.table, schema=mapping.schema):
        if column["name"].lower() == theirs:
            return _room_of(column["type"])
    return MessageRoom()


def _room_of(kind: sa.types.TypeEngine) -> MessageRoom:
    octets = next((n for t, n in _TEXT_OCTETS.items() if isinstance(kind, t)), None)
    if octets is not None:
        return MessageRoom(octets=octets)
    if isinstance(kind, sa.String) and not isinstance(kind, sa.Text) and kind.length:
        return MessageRoom(chars=kind.length, octets=min(4 * kind.length, 65_535))
    return MessageRoom()


@dataclasses.dataclass(frozen=True)
class IndexAdvice:
    """One index Falcon-ES's queries want on the job table: the index (or key) that
    serves it, or the statement that would add it."""

    wanted: WantedIndex
    columns: tuple[str, ...]  # the table's names
    served_by: str | None
    ddl: str | None


def index_advice(engine: Engine, job: JobTable) -> list[IndexAdvice]:
    """Each index the table's queries want (``JobTable.wanted_indexes``) with what
    serves it: an index, unique constraint or primary key whose leading columns are
    the wanted ones. Never adds any."""
    mapping = job.mapping
    inspector = sa.inspect(engine)
    existing: list[tuple[str, tuple[str, ...]]] = []
    primary = inspector.get_pk_constraint(mapping.table, schema=mapping.schema)
    if primary and primary.get("constrained_columns"):
        existing.append(("PRIMARY KEY", tuple(primary["constrained_columns"])))
    for unique in inspector.get_unique_constraints(mapping.table, schema=mapping.schema):
        existing.append((str(unique["name"]), tuple(unique["column_names"])))
    for index in inspector.get_indexes(mapping.table, schema=mapping.schema):
        names = tuple(c for c in index["column_names"] if c is not None)
        existing.append((str(index["name"]), names))
    advice = []
    for wanted in job.wanted_indexes:
        columns = tuple(mapping.column(c) for c in wanted.columns)
        lowered = tuple(c.lower() for c in columns)
        served = next((name for name, cols in existing
                       if tuple(c.lower() for c in cols[:len(lowered)]) == lowered), None)
        ddl = None if served is not None else _index_ddl(mapping, wanted, engine.dialect)
        advice.append(IndexAdvice(wanted, columns, served, ddl))
    return advice


def _index_ddl(mapping: JobMapping, wanted: WantedIndex, dialect: sa.Dialect) -> str:
    """CREATE INDEX for one wanted index, on a table description of its own (an index
    attaches itself to its table, and the app's must stay as it is): the indexes the
    definition has, or a unique one on the id."""
    fresh = JobTable(mapping)
    name = fresh.index_name(wanted)
    index = next((i for i in fresh.table.indexes if i.name == name), None)
    if index is None:
        index = sa.Index(name, *(fresh.c[c] for c in wanted.columns), unique=True)
    return str(sa.schema.CreateIndex(index).compile(dialect=dialect)).strip() + ";"


def _compatible(actual: sa.types.TypeEngine, kind: type[sa.types.TypeEngine]) -> bool:
    if kind is sa.JSON:
        # MariaDB reports JSON columns as LONGTEXT; SQLite as JSON or TEXT.
        return isinstance(actual, (sa.JSON, sa.String))
    if kind is sa.Text:
        # MySQL's larger text types are not sa.Text subclasses (TINYTEXT is too small).
        return isinstance(actual, (sa.Text, mysql.MEDIUMTEXT, mysql.LONGTEXT))
    return isinstance(actual, kind)
