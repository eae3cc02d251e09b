"""The job-table projection: Status / Reason / Message and scheduling fields.

Written inline, in the append's transaction. The upper layer writes ``Aborting`` into
the same rows at any moment, so every write is a compare-and-set done by the database
itself: a row whose status is ``Aborting`` keeps that status (and gets no Reason) unless
the events being written fold the abort. All other columns follow the log, so a replay
reproduces the row whatever the interleaving was.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.domain.spec import DUPLICATE_ID
from falcon_es.storage.store import RecordedEvent
from falcon_es.storage import batched
from falcon_es.storage.tables import JobSql, JobTable, MessageRoom
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import Change, TaskStates
from falcon_es.projections.messages import fit_message, render, task_message

#: Columns this projection owns (everything Falcon-ES writes back).
PROJECTED_COLUMNS = (
    "status", "reason", "message", "cluster_id", "node_pool_name", "job_uid",
    "dispatched_at", "aborted_at", "finished_at", "updated_at",
)


_ABORT_STATUSES = frozenset({chart.ABORTING, chart.ABORTED})


def row_values(state: TaskState, lang: str,
               room: MessageRoom = MessageRoom()) -> dict[str, Any]:
    """The projected column values of one task (the fold of its stream); its Message
    cut to what the table's column holds (``room``)."""
    return dict(zip(PROJECTED_COLUMNS, _projected(state, lang, room)))


def _projected(state: TaskState, lang: str, room: MessageRoom) -> tuple[Any, ...]:
    """``row_values`` in ``PROJECTED_COLUMNS`` order, without the dict: the append
    keys every changed row's parameters from these."""
    status = state.status
    job, ending = state.job, state.ending
    return (
        chart.PENDING if status == chart.NEW else status,
        state.reason,
        task_message(state, lang, room),
        state.placement.cluster_id,
        state.pool.name,
        job.uid,
        job.dispatched_at,
        ending.aborted_at,
        ending.finished_at,
        state.updated_at,
    )


def _cas_update(job: JobTable) -> sa.Update:
    """UPDATE with the abort guard evaluated on the row's current status.

    MySQL evaluates SET assignments left to right and later ones see earlier results,
    so ``status`` is assigned last: every CASE reads the status before this write.
    Under an abort not yet folded, ``updated_at`` keeps the later of the upper layer's
    abort time and the event's time, so it never moves backwards and a replay (seeded
    with the live value) reproduces it whatever the interleaving was.
    """
    c = job.c
    keep_abort = sa.and_(c.status == chart.ABORTING, sa.bindparam("b_folds_abort") == 0)
    event_time = sa.bindparam("b_updated_at", type_=c.updated_at.type)
    keep_abort_time = sa.and_(keep_abort, c.updated_at > event_time)
    assignments: list[tuple[Any, Any]] = [
        (c.reason, sa.case((keep_abort, None), else_=sa.bindparam("b_reason"))),
        (c.updated_at, sa.case((keep_abort_time, c.updated_at), else_=event_time)),
    ]
    for column in PROJECTED_COLUMNS:
        if column not in ("status", "reason", "updated_at"):
            assignments.append((c[column], sa.bindparam(f"b_{column}")))
    assignments.append(
        (c.status, sa.case((keep_abort, c.status), else_=sa.bindparam("b_status")))
    )
    return (
        job.table.update()
        .where(c.id == sa.bindparam("b_id"), _not_duplicate(job))
        .ordered_values(*assignments)
    )


def _not_duplicate(job: JobTable) -> sa.ColumnElement[bool]:
    """A row refused ``DuplicateId`` holds another submission under the same id: the
    task the log knows by that id never writes it again."""
    return sa.or_(job.c.reason.is_(None), job.c.reason != DUPLICATE_ID)


class JobTableProjection:
    """Inline projection: after ``TaskStates`` folded an append, write each changed row."""

    def __init__(self, states: TaskStates, job: JobTable, lang: str = "en") -> None:
        self.states = states
        self.job = job
        self.lang = lang
        self._update = _cas_update(job)

    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        write_rows(conn, self.states.changes(), self.lang, self._update, job=self.job)

    def committed(self) -> None:
        """Nothing staged here: the rows committed with the events."""

    def discarded(self) -> None:
        """Nothing staged here: the rows rolled back with the events."""


def write_rows(
    conn: Connection, changes: Iterable[Change], lang: str, update: sa.Update | None = None,
    *, job: JobTable,
) -> int:
    room = job.message_room
    rows = [_row_params(change, lang, room) for change in changes]
    if not rows:
        return 0
    if _joined_update_works(conn.dialect):
        # A batch's rows are counted by no one (``batched.send`` answers None).
        return sum(_write_joined(conn, job, rows[first:first + JOINED_ROWS]) or 0
                   for first in range(0, len(rows), JOINED_ROWS))
    params = [dict(zip(_JOINED_PARAMS, row)) for row in rows]
    result = conn.execute(update if update is not None else _cas_update(job), params)
    return result.rowcount


def _row_params(change: Change, lang: str, room: MessageRoom) -> tuple[Any, ...]:
    """One changed row's parameters, in ``_JOINED_PARAMS`` order: the statements take
    them by position, so no dict is built per row only to be read back by name."""
    after = change.after
    values = _projected(after, lang, room)  # the status first
    abort_folded = change.folds_abort or values[0] in _ABORT_STATUSES
    return (after.task_id, 1 if abort_folded else 0, *values)


#: Rows per statement of the joined update.
JOINED_ROWS = 500
_JOINED_PARAMS = ("b_id", "b_folds_abort", *(f"b_{c}" for c in PROJECTED_COLUMNS))
#: SQLite learned UPDATE ... FROM in 3.33.
_SQLITE_UPDATE_FROM = (3, 33, 0)


def _joined_update_works(dialect: sa.Dialect) -> bool:
    if dialect.name in ("mysql", "mariadb"):
        return True
    if dialect.name != "sqlite":
        return False
    if dialect.dbapi is None:
        raise ValueError("the SQLite dialect has no DBAPI module to ask for its version")
    return dialect.dbapi.sqlite_version_info >= _SQLITE_UPDATE_FROM


def _guarded_values(names: JobSql, bound: Callable[[str], str]) -> list[tuple[str, str]]:
    """(column, new value) of the compare-and-set write, in assignment order, a
    parameter's value given by ``bound`` (its name -> its SQL). ``status`` comes last:
    where assignments run left to right, each seeing the ones before (a single-table
    UPDATE on MySQL/MariaDB), every CASE still reads the status before this write."""
    table, col = names.table, names.columns
    status, updated_at = f"{table}.{col['status']}", f"{table}.{col['updated_at']}"
    keep_abort = f"{status} = '{chart.ABORTING}' AND {bound('b_folds_abort')} = 0"
    event_time = bound("b_updated_at")
    return [
        (col["reason"], f"CASE WHEN {keep_abort} THEN NULL ELSE {bound('b_reason')} END"),
        (col["updated_at"], f"CASE WHEN {keep_abort} AND {updated_at} > {event_time} "
                            f"THEN {updated_at} ELSE {event_time} END"),
        *((col[c], bound(f"b_{c}")) for c in PROJECTED_COLUMNS
          if c not in ("status", "reason", "updated_at")),
        (col["status"], f"CASE WHEN {keep_abort} THEN {status} ELSE {bound('b_status')} END"),
    ]


@functools.lru_cache(maxsize=64)
def _joined_update_sql(rows: int, dialect_name: str, names: JobSql) -> str:
    """One UPDATE for many rows, joined to a derived table of the new values: on
    MySQL/MariaDB PyMySQL runs an executemany UPDATE as one round trip per row (most of
    an append's time there), and on SQLite one statement beats per-row executions.
    Built once per row count, dialect and names: building it took about a fifth of
    the time that running it takes on SQLite.

    A multiple-table UPDATE does not promise left-to-right assignment, so no CASE may
    depend on another column's new value: the abort guard reads ``status``, which it
    only changes when the guard is off, and then to a value for which the guard stays
    off (``b_folds_abort`` is 1 whenever ``b_status`` is Aborting or Aborted).
    """
    mysql = dialect_name in ("mysql", "mariadb")
    table, col = names.table, names.columns
    target = f"{table}." if mysql else ""  # SQLite names SET columns unqualified
    mark = "%s" if mysql else "?"
    assignments = [f"{target}{column} = {value}"
                   for column, value in _guarded_values(names, lambda name: f"v.{name}")]
    first = "SELECT " + ", ".join(f"{mark} AS {name}" for name in _JOINED_PARAMS)
    values = f"{first}{(' UNION ALL SELECT ' + ', '.join(mark for _ in _JOINED_PARAMS)) * (rows - 1)}"
    row_id = f"{table}.{col['id']}"
    if mysql:
        return (f"UPDATE {table} JOIN ({values}) AS v ON {row_id} = v.b_id "
                f"SET {', '.join(assignments)} WHERE {_not_duplicate_sql(names)}")
    return (f"UPDATE {table} SET {', '.join(assignments)} FROM ({values}) AS v "
            f"WHERE {row_id} = v.b_id AND {_not_duplicate_sql(names)}")


def _not_duplicate_sql(names: JobSql) -> str:
    """``_not_duplicate`` as SQL text."""
    reason = f"{names.table}.{names.columns['reason']}"
    return f"({reason} IS NULL OR {reason} <> '{DUPLICATE_ID}')"


#: Rows up to which the MySQL/MariaDB write is ``_by_id_update_sql``: its CASEs grow
#: with rows times rows, the joined form's cost with rows only (at 10 rows the CASEs
#: cost the server 0.6 of the join, at 100 twice it).
BY_ID_ROWS = 10


#: A named PyMySQL mark, ``%(name)s``.
_NAMED_MARK = re.compile(r"%\((\w+)\)s")


def _row_mark(row: int) -> Callable[[str], str]:
    """A parameter's PyMySQL ``pyformat`` mark in row ``row``."""
    return lambda name: f"%({name}_{row})s"


@functools.cache
def _by_id_update_sql(rows: int, names: JobSql) -> tuple[str, tuple[int, ...]]:
    """One single-table UPDATE for a few rows, each column's new value chosen by the
    row's id (one row: the value itself), with ``%s`` marks (a batch, ``storage.batched``,
    is one string with positional marks), and the value each mark takes, in order, as
    its index in the rows' values one after another (``_bound_flat``). The joined form
    costs MySQL/MariaDB a derived table to build and each of its SELECTs to plan:
    several times the update itself for the one or few rows of most appends. Built
    once per row count and names (at most ``BY_ID_ROWS`` a table): building it cost the
    client more than sending it. Written with named marks, which the CASEs repeat, then
    made positional."""
    table, col = names.table, names.columns
    row_id = f"{table}.{col['id']}"
    per_row = [_guarded_values(names, _row_mark(n)) for n in range(rows)]

    def chosen(index: int) -> str:
        if rows == 1:
            return per_row[0][index][1]
        whens = " ".join(f"WHEN %(b_id_{n})s THEN {per_row[n][index][1]}" for n in range(rows))
        return f"CASE {row_id} {whens} END"

    assignments = [f"{table}.{column} = {chosen(index)}"
                   for index, (column, _) in enumerate(per_row[0])]
    ids = ", ".join(f"%(b_id_{n})s" for n in range(rows))
    named = (f"UPDATE {table} SET {', '.join(assignments)} "
             f"WHERE {row_id} IN ({ids}) AND {_not_duplicate_sql(names)}")
    width = len(_JOINED_PARAMS)
    flat_index = {f"{name}_{n}": n * width + index
                  for n in range(rows) for index, name in enumerate(_JOINED_PARAMS)}
    return (_NAMED_MARK.sub("%s", named),
            tuple(flat_index[mark] for mark in _NAMED_MARK.findall(named)))


def _write_joined(conn: Connection, job: JobTable, rows: Sequence[tuple[Any, ...]]) -> int | None:
    """The statement goes to the driver as is, so each value first gets the column
    type's own bind processing (SQLite stores datetimes as text in SQLAlchemy's format,
    which the time comparisons rely on). On MySQL/MariaDB, up to ``BY_ID_ROWS`` rows
    go as ``_by_id_update_sql``. ``rows``: ``_row_params``."""
    dialect = conn.dialect
    flat = _bound_flat(rows, _bind_processors(job, dialect))
    if dialect.name in ("mysql", "mariadb") and len(rows) <= BY_ID_ROWS:
        sql, order = _by_id_update_sql(len(rows), job.sql(dialect))
        return batched.send(conn, sql, [flat[index] for index in order])
    sql = _joined_update_sql(len(rows), dialect.name, job.sql(dialect))
    return batched.send(conn, sql, flat)


def _bound_flat(rows: Sequence[tuple[Any, ...]],
                processors: tuple[Callable[[Any], Any] | None, ...]) -> list[Any]:
    """The rows' values one after another, each bound by its column's processor (a
    None value as is): a column at a time, over the columns that have one."""
    flat = [value for row in rows for value in row]
    width = len(processors)
    for column, process in enumerate(processors):
        if process is not None:
            for index in range(column, len(flat), width):
                value = flat[index]
                if value is not None:
                    flat[index] = process(value)
    return flat


@functools.lru_cache(maxsize=16)
def _bind_processors(job: JobTable, dialect: sa.Dialect) -> tuple[Callable[[Any], Any] | None, ...]:
    """Each of ``_JOINED_PARAMS``'s bind processor (None: taken as is), worked out once
    per job table and dialect instead of once per write."""
    return tuple(
        None if name == "b_folds_abort"
        else _iso_text_where_same(job.c[name[2:]].type.dialect_impl(dialect).bind_processor(dialect))
        for name in _JOINED_PARAMS
    )


#: A moment whose every field has its own digits: a processor that writes it as
#: ``isoformat(" ", "microseconds")`` writes every naive datetime so.
_PROBE = dt.datetime(2026, 11, 2, 3, 4, 5, 60708)


def _iso_text_where_same(process: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """``process``, or where it writes a naive datetime as its ISO text (SQLite's
    DateTime, in SQLAlchemy's default format) the same text from ``isoformat``, in C:
    SQLAlchemy's formatting cost more than the row's other columns together."""
    if process is None or process(_PROBE) != _PROBE.isoformat(" ", "microseconds"):
        return process

    def iso_text(value: Any) -> Any:
        if type(value) is dt.datetime and value.tzinfo is None:
            return value.isoformat(" ", "microseconds")
        return process(value)
    return iso_text


class RefusedRowsProjection:
    """Inline projection: a row refused as a whole (``RowRefused``: its id does not fit
    the log, or names an earlier submission) is failed with the refusal's Reason and
    Message. A row refused for its id's length is written only while still new
    (Pending, no Reason): the upper layer may have moved it meanwhile. A ``DuplicateId``
    row is written whatever the task the log knows by that id wrote there (runs before
    the job-table projection, which then leaves it alone)."""

    def __init__(self, job: JobTable, lang: str = "en") -> None:
        self.job = job
        self.lang = lang
        self._update = refusal_update(job)
        self._duplicate = duplicate_update(job)

    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        refused = [r for r in recorded if type(r.event) is ev.RowRefused]
        if refused:
            write_refusals(conn, refused, self.lang, self._update, self._duplicate,
                           self.job.message_room)

    def committed(self) -> None:
        """Nothing staged here: the rows committed with the events."""

    def discarded(self) -> None:
        """Nothing staged here: the rows rolled back with the events."""


class RowCheckProjection:
    """Inline projection: a task whose row was found to differ from the log
    (``JobRowDiverged``, ``rewritten``) gets its row written again from its state as
    this append leaves it (the compare-and-set write of every projection write)."""

    def __init__(self, states: TaskStates, job: JobTable, lang: str = "en") -> None:
        self.states = states
        self.job = job
        self.lang = lang
        self._update = _cas_update(job)

    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        ids = {r.event.task_id for r in recorded if type(r.event) is ev.JobRowDiverged
               and r.event.found == ev.ROW_REWRITTEN}
        states = [s for task_id in sorted(ids) if (s := self.states.get(task_id)) is not None]
        if states:
            changes = [Change(s, s, folds_abort=s.status in _ABORT_STATUSES) for s in states]
            write_rows(conn, changes, self.lang, self._update, job=self.job)

    def committed(self) -> None:
        """Nothing staged here: the rows committed with the events."""

    def discarded(self) -> None:
        """Nothing staged here: the rows rolled back with the events."""


def refusal_update(job: JobTable) -> sa.Update:
    c = job.c
    return (
        job.table.update()
        .where(c.id == sa.bindparam("b_id"), c.status == chart.PENDING, c.reason.is_(None))
        .values(status=chart.FAILED, reason=sa.bindparam("b_reason"),
                message=sa.bindparam("b_message"), updated_at=sa.bindparam("b_at"),
                finished_at=sa.bindparam("b_at"))
    )


def duplicate_update(job: JobTable) -> sa.Update:
    """Fail a row whose id names an earlier submission, whatever it holds (the old
    task's columns too are cleared: none of them is this row's)."""
    c = job.c
    return (
        job.table.update()
        .where(c.id == sa.bindparam("b_id"), _not_duplicate(job))
        .values(status=chart.FAILED, reason=sa.bindparam("b_reason"),
                message=sa.bindparam("b_message"), updated_at=sa.bindparam("b_at"),
                finished_at=sa.bindparam("b_at"), cluster_id=None, node_pool_name=None,
                job_uid=None, dispatched_at=None, aborted_at=None)
    )


def write_refusals(conn: Connection, refused: Sequence[RecordedEvent], lang: str,
                   update: sa.Update, duplicate: sa.Update,
                   room: MessageRoom = MessageRoom()) -> int:
    """Fail each refused row (its event's Reason, a Message rendered from its data);
    a row refused more than once gets its latest refusal."""
    latest: dict[tuple[bool, str], dict[str, Any]] = {}
    for record in refused:
        event = record.event
        if not isinstance(event, ev.RowRefused):
            continue
        latest.pop((event.reason == DUPLICATE_ID, event.row_id), None)
        latest[(event.reason == DUPLICATE_ID, event.row_id)] = {
            "b_id": event.row_id, "b_reason": event.reason,
            "b_message": fit_message(render("RowRefused", event.to_data(), lang), room),
            "b_at": record.recorded_at}
    written = 0
    for is_duplicate, statement in ((False, update), (True, duplicate)):
        params = [p for (dup, _), p in latest.items() if dup is is_duplicate]
        if params:
            written += conn.execute(statement, params).rowcount
    return written

