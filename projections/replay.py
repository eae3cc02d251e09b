"""Replay for auditors: fold the log again, rebuild projections, compare with live.

A rebuild starts from the upper layer's own columns (id, name, actor, created_at,
and an ``Aborting`` it wrote) and re-derives every column Falcon-ES owns. The spec is
not copied: the log holds what intake accepted, and the upper layer's column may hold
text that is not JSON at all.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es import chart, db
from falcon_es import events as ev
from falcon_es.inbox import as_timestamp
from falcon_es.store import EventStore, RecordedEvent
from falcon_es.tables import JobTable
from falcon_es.task import TASK_EVENT_TYPES, Change, TaskState, TaskStates, evolve, new_state
from falcon_es.projections.job_table import (
    PROJECTED_COLUMNS, refusal_update, row_values, write_refusals, write_rows,
)
from falcon_es.projections.queues import QueueView, write_positions

#: Seeded from the live row; ``updated_at`` stays the upper layer's until the log
#: knows the task.
UPPER_LAYER_COLUMNS = ("id", "name", "actor", "created_at", "updated_at", "aborting_at")


def fold_log(store: EventStore, until: int | None = None) -> TaskStates:
    """Every task's state as of ``until`` (a seq), or now. Folds with ``evolve`` directly:
    a replay needs the end states, not the per-append changes ``TaskStates.fold``
    tracks for the inline projections."""
    latest: dict[str, TaskState] = {}
    for batch in store.read_for_fold(TASK_EVENT_TYPES, until=until):
        for task_id, event, recorded_at in batch:
            before = latest.get(task_id) or new_state(task_id)
            latest[task_id] = evolve(before, event, recorded_at)
    return TaskStates(latest.values())


def fold_views(store: EventStore, lang: str = "en", until: int | None = None) -> tuple[TaskStates, QueueView]:
    """Task states and the queue view as of ``until``, in one pass over the log (the
    queues need the log's order: who was served last, who held a slot)."""
    states = TaskStates()
    queues = QueueView(states, lang)
    queues.load(store.read_batches(0, batch_size=5000, until=until))
    return states, queues


def refused_rows(store: EventStore) -> list[RecordedEvent]:
    """The rows refused as a whole (ids the log cannot hold), in log order."""
    return store.read_stream(ev.REFUSED_ROWS_STREAM)


def rebuild(conn: sa.Connection, states: TaskStates, lang: str, queues: QueueView | None = None,
            *, job: JobTable, refused: list[RecordedEvent] | None = None) -> int:
    """Write every task's projected columns, keeping aborts not yet in the log; with
    ``queues``, the waiting tasks' position Messages too; with ``refused``, the rows
    refused as a whole."""
    changes = [
        Change(state, state, folds_abort=state.status in (chart.ABORTING, chart.ABORTED))
        for state in states.all()
    ]
    written = write_rows(conn, changes, lang, job=job)
    if queues is not None:
        write_positions(conn, queues.all_positions(), job=job)
    if refused:
        write_refusals(conn, refused, lang, refusal_update(job))
    return written


@dataclasses.dataclass(frozen=True)
class Difference:
    task_id: str
    column: str
    live: Any
    replayed: Any

    def __str__(self) -> str:
        return f"{self.task_id}.{self.column}: live={self.live!r} replayed={self.replayed!r}"


def verify(live: Engine, store: EventStore, lang: str, scratch_dir: Path | None = None,
           *, job: JobTable) -> list[Difference]:
    """Rebuild into a scratch SQLite database (a job table of Falcon-ES's own names
    there) and diff it against the live job table (``job``, the settings' mapping)."""
    states, queues = fold_views(store, lang)
    refused = refused_rows(store)
    scratch_job = JobTable()
    with tempfile.TemporaryDirectory(dir=scratch_dir) as tmp:
        scratch = db.make_engine(f"sqlite:///{Path(tmp) / 'scratch.db'}")
        try:
            scratch_job.table.create(scratch)
            live_rows = _copy_upper_layer_rows(live, job, scratch, scratch_job)
            with scratch.begin() as conn:
                rebuild(conn, states, lang, queues, job=scratch_job, refused=refused)
            with scratch.connect() as conn:
                replayed = {r.id: r for r in conn.execute(sa.select(scratch_job.table))}
        finally:
            scratch.dispose()
    return list(_diff(live_rows, replayed))


#: Read as the driver gives them (no type processing), so a value of the wrong type
#: in the upper layer's own columns (a row intake failed for it) cannot stop a verify.
_SEEDED_AS_IS = ("name", "actor", "created_at", "aborting_at")


def _copy_upper_layer_rows(live: Engine, job: JobTable, scratch: Engine,
                           scratch_job: JobTable) -> dict[str, Any]:
    compared = [
        (sa.type_coerce(job.c[c], sa.Text) if c in _SEEDED_AS_IS else job.c[c]).label(c)
        for c in dict.fromkeys((*UPPER_LAYER_COLUMNS, *PROJECTED_COLUMNS))
    ]
    with db.read_only(live).connect() as conn:
        # An integer id (the upper layer's) is the text the log knows it by.
        rows = {str(r.id): r for r in conn.execute(sa.select(*compared))}
    seed = [
        {
            "id": row_id, "name": str(r.name or ""), "actor": str(r.actor or ""),
            "created_at": as_timestamp(r.created_at) or dt.datetime.min,
            "updated_at": r.updated_at, "aborting_at": as_timestamp(r.aborting_at),
            "status": chart.ABORTING if r.status == chart.ABORTING else chart.PENDING,
        }
        for row_id, r in rows.items()
    ]
    if seed:
        with scratch.begin() as conn:
            conn.execute(scratch_job.table.insert(), seed)
    return rows


def _diff(live: dict[str, Any], replayed: dict[str, Any]) -> Iterator[Difference]:
    for task_id, row in sorted(live.items()):
        other = replayed[task_id]
        for column in PROJECTED_COLUMNS:
            a, b = _normal(getattr(row, column)), _normal(getattr(other, column))
            if a != b:
                yield Difference(task_id, column, a, b)


def _normal(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    return value


def state_rows(states: TaskStates, lang: str, queues: QueueView | None = None) -> list[dict[str, Any]]:
    """The time-travel view: each task's projected columns as of the fold (with
    ``queues``, waiting tasks show their position then)."""
    positions = dict(queues.all_positions()) if queues is not None else {}
    rows = []
    for state in sorted(states.all(), key=lambda s: (s.submitted_at or dt.datetime.min, s.task_id)):
        values = row_values(state, lang)
        if state.task_id in positions:
            values["message"] = positions[state.task_id]
        rows.append({"id": state.task_id, "name": state.name, "actor": state.actor, **values})
    return rows
