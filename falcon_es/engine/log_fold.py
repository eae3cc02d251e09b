"""Folding the whole log with memory bounded by the tasks in flight, not by history.

A replay (``replay --verify``, ``--rebuild``), the migration that builds the live set
and the restart benchmark need every task's final state, and a log that holds years
of tasks holds more states than memory should. The log is read in ``seq`` order (the
primary key, the cheapest scan there is), and a task's state is handed out as soon as
its last event is folded, then forgotten: for each batch the last version of every
stream first seen in it is looked up in the ``(stream_id, version)`` index (an
index-only query), so what stays in memory are the streams whose first event has been
read and whose last has not: the tasks that were running at the same time, give or
take the few that got a late event.

Everything is read as of one position (``until``, the head when the fold starts), so
an append committed meanwhile can neither add an event to a task already handed out
nor cut a task short.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql.compiler import SQLCompiler

from falcon_es.domain import events as ev
from falcon_es.domain.event_json import json_value
from falcon_es.storage.tables import log_head, task_events
from falcon_es.domain.task import TASK_EVENT_TYPES, TaskState, evolve, new_state

#: Opens a connection to read one batch with (a store's reader, or a migration's own
#: connection wrapped in ``contextlib.nullcontext``).
Connect = Callable[[], AbstractContextManager[Connection]]
#: Called with a watched event's stream, its version there, the event and (for a task
#: event) the task's state right after it, in log order.
Watcher = Callable[[str, int, ev.Event, TaskState | None], None]

BATCH = 5000


def head(connect: Connect) -> int:
    """The log's last position (what a fold reads up to unless told otherwise)."""
    with connect() as conn:
        return int(conn.execute(sa.select(log_head.c.last_seq)).scalar_one())


def final_states(connect: Connect, *, until: int | None = None,
                 watch: Collection[str] = (), on_watched: Watcher | None = None,
                 batch_size: int = BATCH) -> Iterator[TaskState]:
    """Every task's state as of ``until`` (default: the head now), each handed out once
    its last event up to there is folded, in the order of those last events.

    ``on_watched`` sees every event whose type is in ``watch`` (task events with the
    state they led to, other streams' events with None) as it is folded."""
    if until is None:
        until = head(connect)
    inflight: dict[str, TaskState] = {}
    last: dict[str, int] = {}
    readers: dict[tuple[str, int], Callable[[ev.JsonDict], ev.Event]] = {}
    position = 0
    with connect() as conn:
        page, versions = _statements(conn.dialect.name)
        compiled = cast(SQLCompiler, page.compile(dialect=conn.dialect))
    while position < until:
        with connect() as conn:
            rows = _rows_of(conn, compiled, {"position": position, "until": until,
                                             "limit": batch_size})
            if not rows:
                return
            fresh = {row[1] for row in rows if row[3] in TASK_EVENT_TYPES}.difference(last)
            if fresh:
                last.update(conn.execute(versions, {"ids": sorted(fresh), "until": until}).all())
        position = rows[-1][0]
        yield from _fold_batch(rows, inflight, last, readers, watch, on_watched)


def _rows_of(conn: Connection, compiled: SQLCompiler,
             values: dict[str, Any]) -> list[Any]:
    """A page of the log as the driver's tuples: SQLAlchemy's rows cost a replay a
    sixth of its reads (the columns need no processing: ``_statements``)."""
    params: Any = compiled.construct_params(values)
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup or ())
    result = conn.exec_driver_sql(str(compiled), params)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _fold_batch(rows: Sequence[Any], inflight: dict[str, TaskState], last: dict[str, int],
                readers: dict[tuple[str, int], Callable[[ev.JsonDict], ev.Event]],
                watch: Collection[str], on_watched: Watcher | None) -> list[TaskState]:
    """Fold one batch of rows into the tasks in flight; the states of the tasks whose
    last event it held, which leave ``inflight`` and ``last``.

    The loop a replay runs once per stored event: the names it uses are local, each
    event type's reader is worked out once (``readers``), a state in flight is the
    fold's own until handed out, so it is updated in place (a watcher gets a copy),
    and a watch is only asked about when there is one."""
    loads, parse, task_types = json_value, dt.datetime.fromisoformat, TASK_EVENT_TYPES
    watching = on_watched if watch else None
    finished: list[TaskState] = []
    for _, stream_id, version, type_name, schema_version, data, recorded_at in rows:
        if type_name in task_types:
            read = readers.get((type_name, schema_version))
            if read is None:
                read = readers[(type_name, schema_version)] = ev.reader(type_name, schema_version)
            event = read(loads(data))
            state = inflight.get(stream_id)
            if state is None:
                state = inflight[stream_id] = new_state(stream_id)
            evolve(state, event, parse(recorded_at) if type(recorded_at) is str else recorded_at,
                   in_place=True)
            if version >= last[stream_id]:
                del last[stream_id], inflight[stream_id]
                finished.append(state)
            if watching is not None and type_name in watch:
                watching(stream_id, version, event, copy.copy(state))
        elif watching is not None and type_name in watch:
            watching(stream_id, version, ev.decode(type_name, schema_version, loads(data)), None)
    return finished


def _statements(dialect: str) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """One batch of the log after a position, as the fold reads it (seq, stream,
    version, type, schema version, data as text, recorded_at as text on SQLite), and
    the last version of some streams up to a position."""
    recorded_at: Any = task_events.c.recorded_at
    if dialect == "sqlite":
        recorded_at = sa.type_coerce(recorded_at, sa.Text)
    page = (
        sa.select(task_events.c.seq, task_events.c.stream_id, task_events.c.version,
                  task_events.c.type, task_events.c.schema_version,
                  sa.type_coerce(task_events.c.data, sa.Text), recorded_at)
        .where(task_events.c.seq > sa.bindparam("position"),
               task_events.c.seq <= sa.bindparam("until"))
        .order_by(task_events.c.seq)
        .limit(sa.bindparam("limit"))
    )
    versions = (
        sa.select(task_events.c.stream_id, sa.func.max(task_events.c.version))
        .where(task_events.c.stream_id.in_(sa.bindparam("ids", expanding=True)),
               task_events.c.seq <= sa.bindparam("until"))
        .group_by(task_events.c.stream_id)
    )
    return page, versions


def batched(states: Iterator[TaskState], size: int) -> Iterator[Sequence[TaskState]]:
    """The states in lists of ``size`` (the last one shorter), for writes in bulk."""
    batch: list[TaskState] = []
    for state in states:
        batch.append(state)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
