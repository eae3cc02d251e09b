"""Replay for auditors: fold the log again, rebuild projections, compare with live.

A rebuild starts from the upper layer's own columns (id, name, actor, created_at,
and an ``Aborting`` it wrote) and re-derives every column Falcon-ES owns. The spec is
not copied: the log holds what intake accepted, and the upper layer's column may hold
text that is not JSON at all.

``--verify`` and ``--rebuild`` stream: each task's row is written as soon as its last
event is folded (``falcon_es.log_fold``), rows are copied and compared a chunk at a
time, and only the tasks that have not ended stay in memory to the end (the queues'
positions are theirs), so a log of years replays in the memory of its busiest hour.
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

from falcon_es import chart, db
from falcon_es import events as ev
from falcon_es.log_fold import batched, final_states
from falcon_es.scheduling import QueueKey
from falcon_es.store import EventStore
from falcon_es.tables import job
from falcon_es.task import TASK_EVENT_TYPES, Change, TaskState, TaskStates, evolve, new_state
from falcon_es.projections.job_table import PROJECTED_COLUMNS, row_values, write_rows
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


def rebuild(conn: sa.Connection, states: TaskStates, lang: str, queues: QueueView | None = None) -> int:
    """Write every task's projected columns, keeping aborts not yet in the log; with
    ``queues``, the waiting tasks' position Messages too."""
    written = write_rows(conn, _as_changes(states.all()), lang)
    if queues is not None:
        write_positions(conn, queues.all_positions())
    return written


#: Rows written, copied or compared per statement while streaming.
ROWS_PER_BATCH = 1000


def _as_changes(states: Iterable[TaskState]) -> list[Change]:
    return [Change(state, state, folds_abort=state.status in (chart.ABORTING, chart.ABORTED))
            for state in states]


class _Unended:
    """What the queues need of a streamed fold: the tasks that have not ended (they
    are the queues' members) and who each queue served last."""

    def __init__(self) -> None:
        self.states: list[TaskState] = []
        self.served: dict[QueueKey, str] = {}

    def picked(self, stream_id: str, version: int, event: ev.Event,
               state: TaskState | None) -> None:
        if isinstance(event, ev.TaskPicked) and state is not None:
            self.served[(event.cluster_id, event.topology)] = state.actor

    def view(self, lang: str) -> QueueView:
        view = QueueView(TaskStates(self.states), lang)
        view.load_live(self.states, self.served)
        return view


def rebuild_streamed(conn: sa.Connection, store: EventStore, lang: str,
                     until: int | None = None) -> int:
    """``rebuild`` of the whole log as of ``until`` (default: the head now), each task's
    row written once its last event is folded, then the waiting tasks' positions."""
    unended = _Unended()
    written = 0
    states = final_states(store.reader.connect, until=until, watch=("TaskPicked",),
                          on_watched=unended.picked)
    for batch in batched(states, ROWS_PER_BATCH):
        written += write_rows(conn, _as_changes(batch), lang)
        unended.states.extend(s for s in batch if not s.is_terminal)
    write_positions(conn, unended.view(lang).all_positions())
    return written


@dataclasses.dataclass(frozen=True)
class Difference:
    task_id: str
    column: str
    live: Any
    replayed: Any

    def __str__(self) -> str:
        return f"{self.task_id}.{self.column}: live={self.live!r} replayed={self.replayed!r}"


def verify(live: Engine, store: EventStore, lang: str, scratch_dir: Path | None = None) -> list[Difference]:
    """Rebuild into a scratch SQLite database and diff it against the live job table,
    streaming: the log as of its head now, the rows a chunk at a time."""
    until = store.head()
    with tempfile.TemporaryDirectory(dir=scratch_dir) as tmp:
        scratch = db.make_engine(f"sqlite:///{Path(tmp) / 'scratch.db'}")
        try:
            db.upgrade(scratch)
            _copy_upper_layer_rows(live, scratch)
            with scratch.begin() as conn:
                rebuild_streamed(conn, store, lang, until=until)
            differences = list(_diff(live, scratch))
        finally:
            scratch.dispose()
    return sorted(differences, key=lambda d: d.task_id)


def _live_chunks(live: Engine, columns: Iterable[str]) -> Iterator[Sequence[Any]]:
    """The live job table's rows (these columns, ``id`` first) in chunks, by id."""
    selected = [job.c[c] for c in dict.fromkeys(("id", *columns))]
    after: str | None = None
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


def _copy_upper_layer_rows(live: Engine, scratch: Engine) -> None:
    for rows in _live_chunks(live, (*UPPER_LAYER_COLUMNS, "status")):
        seed = [
            {
                **{c: getattr(r, c) for c in UPPER_LAYER_COLUMNS},
                "status": chart.ABORTING if r.status == chart.ABORTING else chart.PENDING,
            }
            for r in rows
        ]
        with scratch.begin() as conn:
            conn.execute(job.insert(), seed)


def _diff(live: Engine, scratch: Engine) -> Iterator[Difference]:
    compared = [job.c[c] for c in ("id", *PROJECTED_COLUMNS)]
    for rows in _live_chunks(live, PROJECTED_COLUMNS):
        with scratch.connect() as conn:
            replayed = {r.id: r for r in conn.execute(
                sa.select(*compared).where(job.c.id.in_([r.id for r in rows])))}
        for row in rows:
            other = replayed[row.id]
            for column in PROJECTED_COLUMNS:
                a, b = _normal(getattr(row, column)), _normal(getattr(other, column))
                if a != b:
                    yield Difference(row.id, column, a, b)


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
