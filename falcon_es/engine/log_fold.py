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

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.domain import events as ev
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
    decode, loads, parse = ev.decode, json.loads, dt.datetime.fromisoformat
    task_types = TASK_EVENT_TYPES
    position = 0
    with connect() as conn:
        page, versions = _statements(conn.dialect.name)
    while position < until:
        with connect() as conn:
            rows = conn.execute(page, {"position": position, "until": until,
                                       "limit": batch_size}).all()
            if not rows:
                return
            fresh = {row[1] for row in rows if row[1] not in last and row[3] in task_types}
            if fresh:
                last.update(conn.execute(versions, {"ids": sorted(fresh), "until": until}).all())
        position = rows[-1][0]
        finished: list[TaskState] = []
        for _, stream_id, version, type_name, schema_version, data, recorded_at in rows:
            watched = type_name in watch
            if type_name in task_types:
                if isinstance(recorded_at, str):
                    recorded_at = parse(recorded_at)
                event = decode(type_name, schema_version, loads(data))
                before = inflight.pop(stream_id) if stream_id in inflight else None
                state = evolve(before or new_state(stream_id), event, recorded_at)
                if version >= last[stream_id]:
                    del last[stream_id]
                    finished.append(state)
                else:
                    inflight[stream_id] = state
                if watched and on_watched is not None:
                    on_watched(stream_id, version, event, state)
            elif watched and on_watched is not None:
                on_watched(stream_id, version, decode(type_name, schema_version, loads(data)),
                           None)
        yield from finished


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
