"""Replay for auditors: fold the log again, rebuild projections, compare with live.

A rebuild starts from the upper layer's own columns (id, name, actor, created_at,
and an ``Aborting`` it wrote) and re-derives every column Falcon-ES owns. The spec is
not copied: the log holds what intake accepted, and the upper layer's column may hold
text that is not JSON at all.

``--verify`` and ``--rebuild`` stream: each task's row is written as soon as its last
event is folded (``falcon_es.engine.log_fold``), rows are copied and compared a chunk at a
time, and only the tasks that have not ended stay in memory to the end (the queues'
positions are theirs), so a log of years replays in the memory of its busiest hour.

A rebuild writes every waiting task's position as of the end of the log. The live
controller rewrites each waiting row once per refresh interval, at its own slice's
moment (``falcon_es.projections.queues``), so a live position Message may show the
order as of any moment in the last interval; a replay does not follow the slices (the
moments of the ticks are not in the log, only those of the events), and ``verify``
given that interval accepts such a Message when it is exactly the task's position
after some event of the log's last interval (or just before it), and reports any
other.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.domain import chart
from falcon_es.storage import db
from falcon_es.domain import events as ev
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.engine.log_fold import batched, final_states
from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.queue_book import QueueBook
from falcon_es.domain.queue_places import Placement, QueueKey
from falcon_es.storage.store import EventStore, RecordedEvent
from falcon_es.storage.tables import JobTable
from falcon_es.domain.task import TASK_EVENT_TYPES, TaskState, evolve, new_state
from falcon_es.domain.task_states import Change, TaskStates
from falcon_es.projections.job_table import (
    PROJECTED_COLUMNS, duplicate_update, refusal_update, row_values, write_refusals, write_rows,
)
from falcon_es.projections.messages import position_part
from falcon_es.projections.position_messages import positions_of
from falcon_es.projections.position_rows import write_positions
from falcon_es.projections.queues import QueueView

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


def fold_views(store: EventStore, lang: str = "en", until: int | None = None, *,
               policy: PriorityPolicy = PriorityPolicy()) -> tuple[TaskStates, QueueView]:
    """Task states and the queue view as of ``until``, in one pass over the log (the
    queues need the log's order: who was served last, who held a slot). ``policy`` is
    the configured one (``Settings.priorities``): the pick order depends on it."""
    states = TaskStates()
    queues = QueueView(states, lang, QueueBook(policy))
    queues.load(store.read_batches(0, batch_size=5000, until=until))
    return states, queues


def refused_rows(store: EventStore) -> list[RecordedEvent]:
    """The rows refused as a whole (ids the log cannot hold), in log order."""
    return store.read_stream(ev.REFUSED_ROWS_STREAM)


def rebuild(conn: sa.Connection, states: TaskStates, lang: str, queues: QueueView | None = None,
            *, job: JobTable, refused: list[RecordedEvent] | None = None) -> int:
    """Write every task's projected columns, keeping aborts not yet in the log; with
    ``queues``, the waiting tasks' position Messages too; with ``refused``, the rows
    refused as a whole (first: a row refused ``DuplicateId`` is never the task's)."""
    if refused:
        write_refusals(conn, refused, lang, refusal_update(job), duplicate_update(job))
    written = write_rows(conn, _as_changes(states.all()), lang, job=job)
    if queues is not None:
        write_positions(conn, queues.all_positions(), job=job)
    return written


#: Rows written, copied or compared per statement while streaming.
ROWS_PER_BATCH = 1000


def _as_changes(states: Iterable[TaskState]) -> list[Change]:
    return [Change(state, state, folds_abort=state.status in (chart.ABORTING, chart.ABORTED))
            for state in states]


class _Unended:
    """What the queues need of a streamed fold: the tasks that have not ended (they
    are the queues' members) and who each queue served last."""

    def __init__(self, policy: PriorityPolicy) -> None:
        self.policy = policy
        self.states: list[TaskState] = []
        self.served: dict[QueueKey, str] = {}

    def picked(self, stream_id: str, version: int, event: ev.Event,
               state: TaskState | None) -> None:
        if isinstance(event, ev.TaskPicked) and state is not None:
            self.served[(event.cluster_id, event.topology)] = state.submission.actor

    def view(self, lang: str) -> QueueView:
        view = QueueView(TaskStates(self.states), lang, QueueBook(self.policy))
        view.load_live(self.states, self.served)
        return view


def rebuild_streamed(conn: sa.Connection, store: EventStore, lang: str,
                     until: int | None = None, *, job: JobTable,
                     refused: list[RecordedEvent] | None = None,
                     policy: PriorityPolicy = PriorityPolicy()) -> int:
    """``rebuild`` of the whole log as of ``until`` (default: the head now), each task's
    row written once its last event is folded, then the waiting tasks' positions."""
    return _rebuild_streamed(conn, store, lang, until, job, refused, policy)[0]


def _rebuild_streamed(conn: sa.Connection, store: EventStore, lang: str, until: int | None,
                      job: JobTable, refused: list[RecordedEvent] | None,
                      policy: PriorityPolicy) -> tuple[int, QueueView]:
    """The rows written, and the queues of the tasks that had not ended."""
    unended = _Unended(policy)
    written = 0
    if refused:  # first: a row refused DuplicateId is never the task's
        write_refusals(conn, refused, lang, refusal_update(job), duplicate_update(job))
    states = final_states(store.reader.connect, until=until, watch=("TaskPicked",),
                          on_watched=unended.picked)
    for batch in batched(states, ROWS_PER_BATCH):
        written += write_rows(conn, _as_changes(batch), lang, job=job)
        unended.states.extend(s for s in batch if not s.is_terminal)
    view = unended.view(lang)
    write_positions(conn, view.all_positions(), job=job)
    return written, view


@dataclasses.dataclass(frozen=True)
class Difference:
    task_id: str
    column: str
    live: Any
    replayed: Any

    def __str__(self) -> str:
        return f"{self.task_id}.{self.column}: live={self.live!r} replayed={self.replayed!r}"


def verify(live: Engine, store: EventStore, lang: str, scratch_dir: Path | None = None,
           *, job: JobTable, refresh_seconds: float = 0.0,
           policy: PriorityPolicy = PriorityPolicy()) -> list[Difference]:
    """Rebuild into a scratch SQLite database (a job table of Falcon-ES's own names
    there) and diff it against the live job table (``job``, the settings' mapping),
    streaming: the log as of its head now, the rows a chunk at a time.
    ``refresh_seconds`` is the live controller's position refresh interval (0: every
    position must be the one at the end of the log). ``policy``: the configured one."""
    until = store.head()
    refused = refused_rows(store)
    scratch_job = JobTable()
    with tempfile.TemporaryDirectory(dir=scratch_dir) as tmp:
        scratch = db.make_engine(f"sqlite:///{Path(tmp) / 'scratch.db'}")
        try:
            scratch_job.table.create(scratch)
            _copy_upper_layer_rows(live, job, scratch, scratch_job)
            with scratch.begin() as conn:
                _, waiting = _rebuild_streamed(conn, store, lang, until, scratch_job, refused,
                                               policy)
            differences = list(_diff(live, job, scratch, scratch_job))
        finally:
            scratch.dispose()
    differences = _without_wait_notes(differences, waiting, lang)
    if refresh_seconds > 0:
        differences = _without_recent_positions(differences, store, lang, waiting,
                                                dt.timedelta(seconds=refresh_seconds), policy)
    return sorted(differences, key=lambda d: d.task_id)


def _without_wait_notes(differences: list[Difference], waiting: QueueView,
                        lang: str) -> list[Difference]:
    """Drop the Message differences of waiting tasks whose positions agree: what
    follows a position (the slot holder's state, the expected start) was true when the
    live row was written, and a replay renders it as of the end of the log."""
    return [d for d in differences
            if not (d.column == "message" and isinstance(d.live, str)
                    and isinstance(d.replayed, str) and waiting.waiting_in(d.task_id) is not None
                    and position_part(d.live, lang) == position_part(d.replayed, lang))]


def _without_recent_positions(differences: list[Difference], store: EventStore, lang: str,
                              waiting: QueueView, interval: dt.timedelta,
                              policy: PriorityPolicy) -> list[Difference]:
    """Drop the Message differences of tasks waiting at the end of the log whose live
    Message is a position they held within the last ``interval`` of the log."""
    lagging = {d.task_id for d in differences if d.column == "message"
               and isinstance(d.live, str) and waiting.waiting_in(d.task_id) is not None}
    if not lagging:
        return differences
    held = recent_positions(store, lang, interval, lagging, policy=policy)
    return [d for d in differences
            if not (d.column == "message" and isinstance(d.live, str)
                    and position_part(d.live, lang) in held.get(d.task_id, ()))]


def recent_positions(store: EventStore, lang: str, interval: dt.timedelta,
                     task_ids: set[str], *,
                     policy: PriorityPolicy = PriorityPolicy()) -> dict[str, set[str]]:
    """Every position (without its wait note) each of ``task_ids`` had after any event recorded within
    ``interval`` of the log's last event, and just before the first of them. Folded one
    event at a time, so the state after every append is among them; only the queues an
    event touched are rendered again, and only for the tasks asked about."""
    head = store.head()
    last = next(iter(store.read_after(head - 1, batch_size=1)), None) if head else None
    if last is None:
        return {}
    start = store.seq_at(last.recorded_at - interval)
    _, queues = fold_views(store, lang, until=start, policy=policy)
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
    for task_id, message in positions_of(queues.book.pick_order(key, queues.now()), wanted, lang):
        held[task_id].add(position_part(message, lang))


#: Read as the driver gives them (no type processing), so a value of the wrong type
#: in the upper layer's own columns (a row intake failed for it) cannot stop a verify.
_SEEDED_AS_IS = ("name", "actor", "created_at", "aborting_at")


def _live_chunks(live: Engine, job: JobTable, columns: Iterable[str]) -> Iterator[Sequence[Any]]:
    """The live job table's rows (these columns, ``id`` first) in chunks, by id."""
    selected = [
        (sa.type_coerce(job.c[c], sa.Text) if c in _SEEDED_AS_IS else job.c[c]).label(c)
        for c in dict.fromkeys(("id", *columns))
    ]
    after: Any = None
    while True:
        query = sa.select(*selected).order_by(job.c.id).limit(ROWS_PER_BATCH)
        if after is not None:
            query = query.where(job.c.id > after)
        with db.read_only(live).connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return
        yield rows
        after = rows[-1].id


def _copy_upper_layer_rows(live: Engine, job: JobTable, scratch: Engine,
                           scratch_job: JobTable) -> None:
    for rows in _live_chunks(live, job, (*UPPER_LAYER_COLUMNS, "status")):
        seed = [
            {
                # An integer id (the upper layer's) is the text the log knows it by.
                "id": str(r.id), "name": str(r.name or ""), "actor": str(r.actor or ""),
                "created_at": as_timestamp(r.created_at) or dt.datetime.min,
                "updated_at": r.updated_at, "aborting_at": as_timestamp(r.aborting_at),
                "status": chart.ABORTING if r.status == chart.ABORTING else chart.PENDING,
            }
            for r in rows
        ]
        with scratch.begin() as conn:
            conn.execute(scratch_job.table.insert(), seed)


def _diff(live: Engine, job: JobTable, scratch: Engine,
          scratch_job: JobTable) -> Iterator[Difference]:
    compared = [scratch_job.c[c] for c in ("id", *PROJECTED_COLUMNS)]
    for rows in _live_chunks(live, job, PROJECTED_COLUMNS):
        ids = [str(r.id) for r in rows]
        with scratch.connect() as conn:
            replayed = {r.id: r for r in conn.execute(
                sa.select(*compared).where(scratch_job.c.id.in_(ids)))}
        for task_id, row in zip(ids, rows):
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
    for state in sorted(states.all(), key=lambda s: (
            s.submission.submitted_at or dt.datetime.min, s.task_id)):
        values = row_values(state, lang)
        if state.task_id in positions:
            values["message"] = positions[state.task_id]
        rows.append({"id": state.task_id, "name": state.submission.name,
                     "actor": state.submission.actor, **values})
    return rows
