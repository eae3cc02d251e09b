"""Replay for auditors: fold the log again, rebuild projections, compare with live.

A rebuild starts from the upper layer's own columns (id, name, actor, created_at,
and an ``Aborting`` it wrote) and re-derives every column Falcon-ES owns. The spec is
not copied: the log holds what intake accepted, and the upper layer's column may hold
text that is not JSON at all.

A rebuild writes every waiting task's position as of the end of the log. The live
controller rewrites a queue's positions at most once per refresh interval, so a live
position Message may show the order as of any moment in the last interval; ``verify``
given that interval accepts such a Message when it is exactly the task's position
after some event of the log's last interval (or just before it), and reports any
other.
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
from falcon_es.scheduling import Placement, QueueKey
from falcon_es.store import EventStore
from falcon_es.tables import job
from falcon_es.task import TASK_EVENT_TYPES, Change, TaskState, TaskStates, evolve, new_state
from falcon_es.projections.job_table import PROJECTED_COLUMNS, row_values, write_rows
from falcon_es.projections.queues import QueueView, positions_of, write_positions

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


def rebuild(conn: sa.Connection, states: TaskStates, lang: str, queues: QueueView | None = None) -> int:
    """Write every task's projected columns, keeping aborts not yet in the log; with
    ``queues``, the waiting tasks' position Messages too."""
    changes = [
        Change(state, state, folds_abort=state.status in (chart.ABORTING, chart.ABORTED))
        for state in states.all()
    ]
    written = write_rows(conn, changes, lang)
    if queues is not None:
        write_positions(conn, queues.all_positions())
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
           *, refresh_seconds: float = 0.0) -> list[Difference]:
    """Rebuild into a scratch SQLite database and diff it against the live job table;
    ``refresh_seconds`` is the live controller's position refresh interval (0: every
    position must be the one at the end of the log)."""
    states, queues = fold_views(store, lang)
    with tempfile.TemporaryDirectory(dir=scratch_dir) as tmp:
        scratch = db.make_engine(f"sqlite:///{Path(tmp) / 'scratch.db'}")
        try:
            db.upgrade(scratch)
            live_rows = _copy_upper_layer_rows(live, scratch)
            with scratch.begin() as conn:
                rebuild(conn, states, lang, queues)
            with scratch.connect() as conn:
                replayed = {r.id: r for r in conn.execute(sa.select(job))}
        finally:
            scratch.dispose()
    differences = list(_diff(live_rows, replayed))
    if refresh_seconds > 0:
        differences = _without_recent_positions(differences, store, lang, queues,
                                                dt.timedelta(seconds=refresh_seconds))
    return differences


def _without_recent_positions(differences: list[Difference], store: EventStore, lang: str,
                              queues: QueueView, interval: dt.timedelta) -> list[Difference]:
    """Drop the Message differences of tasks waiting at the end of the log whose live
    Message is a position they held within the last ``interval`` of the log."""
    lagging = {d.task_id for d in differences if d.column == "message"
               and isinstance(d.live, str) and queues.waiting_in(d.task_id) is not None}
    if not lagging:
        return differences
    held = recent_positions(store, lang, interval, lagging)
    return [d for d in differences
            if not (d.column == "message" and d.live in held.get(d.task_id, ()))]


def recent_positions(store: EventStore, lang: str, interval: dt.timedelta,
                     task_ids: set[str]) -> dict[str, set[str]]:
    """Every position Message each of ``task_ids`` had after any event recorded within
    ``interval`` of the log's last event, and just before the first of them. Folded one
    event at a time, so the state after every append is among them; only the queues an
    event touched are rendered again, and only for the tasks asked about."""
    head = store.head()
    last = next(iter(store.read_after(head - 1, batch_size=1)), None) if head else None
    if last is None:
        return {}
    start = store.seq_at(last.recorded_at - interval)
    _, queues = fold_views(store, lang, until=start)
    book = queues.book
    held: dict[str, set[str]] = {task_id: set() for task_id in task_ids}
    where = {task_id: queues.waiting_in(task_id) for task_id in task_ids}
    members: dict[QueueKey, set[str]] = {}
    for task_id, key in where.items():
        if key is not None:
            members.setdefault(key, set()).add(task_id)
    for key in members:
        _collect(queues, key, members[key], held, lang)
    for record in store.read_after(start):
        touched = {book.place(record.stream_id)}
        queues.load([[record]])
        touched.add(book.place(record.stream_id))
        if record.stream_id in where:
            task_id = record.stream_id
            was, now = where[task_id], queues.waiting_in(task_id)
            if was is not None:
                members[was].discard(task_id)
            if now is not None:
                members.setdefault(now, set()).add(task_id)
            where[task_id] = now
        for place in touched:
            if place is not None and place[0] != Placement.UNPLACED and members.get(place[1]):
                _collect(queues, place[1], members[place[1]], held, lang)
    return held


def _collect(queues: QueueView, key: QueueKey, wanted: set[str], held: dict[str, set[str]],
             lang: str) -> None:
    for task_id, message in positions_of(queues.book.pick_order(key), wanted, lang):
        held[task_id].add(message)


def _copy_upper_layer_rows(live: Engine, scratch: Engine) -> dict[str, Any]:
    compared = [job.c[c] for c in dict.fromkeys((*UPPER_LAYER_COLUMNS, *PROJECTED_COLUMNS))]
    with db.read_only(live).connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(*compared))}
    seed = [
        {
            **{c: getattr(r, c) for c in UPPER_LAYER_COLUMNS},
            "status": chart.ABORTING if r.status == chart.ABORTING else chart.PENDING,
        }
        for r in rows.values()
    ]
    if seed:
        with scratch.begin() as conn:
            conn.execute(job.insert(), seed)
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
