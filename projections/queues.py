"""The queue view: per (cluster, topology) queue the slot holder, the waiting tasks in
pick order with their positions, the running count and the actor served last; and the
waiting tasks' position Message in the job table.

``QueueView`` is an inline projection registered after ``TaskStates`` and the job-table
projection. In each append's transaction it folds the append's task changes into the
scheduler's ``QueueBook`` (which the scheduling handlers already updated while they
decided) and writes, in bulk (``write_positions``), two kinds of position Messages:

- at once, the row of every waiting task whose own state change this append wrote
  (it just joined a queue, came back to one, or an event of its own replaced its
  Message): the job-table projection has just put the event's Message there, so the
  row must get its position with the same commit, computed from the exact order;
- at most once per ``refresh_seconds`` per queue, every row of a queue whose pick order
  changed, and of those only the rows whose text differs from what was written. A
  queue that changes after a quiet interval is written at once; one that changes
  again within the interval is written when the interval ends (``next_refresh`` tells
  the loop when, ``refresh_due`` writes in its own transaction when no append comes).

A pick shifts every position behind it, so without the interval every pick rewrote
the whole queue; with it a queue is rewritten at most once per interval however
often it is picked, and no position Message is more than one interval behind the
order. The exact order is always in the book (``queue_rows``). A row the upper layer
set to ``Aborting`` is never touched (``WHERE status = 'Pending'``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.clock import Clock
from falcon_es.eta import Estimate, SlotTimes
from falcon_es.registry import Cluster
from falcon_es.scheduling import Entry, Placement, QueueBook, QueueKey
from falcon_es.store import RecordedEvent
from falcon_es.tables import JobSql, JobTable
from falcon_es.task import Change, TaskState, TaskStates
from falcon_es.projections.messages import (
    AHEAD_NAMED,
    CATALOGS,
    EN,
    SEPARATOR,
    clock_time,
    position_message,
    wait_reason,
)

#: Events that take a retained pool out of the idle set (as do its deletes).
_POOL_TAKEN = (ev.NodePoolReused, ev.NodePoolTaken)


def _formatter(key: str, lang: str) -> Callable[..., str]:
    """The catalog template for ``key`` as a function of keyword arguments."""
    template = CATALOGS[lang].get(key) or EN[key]
    if isinstance(template, str):
        return template.format
    return lambda **args: template(args)


@dataclasses.dataclass(frozen=True)
class Wait:
    """What a queue's waiting tasks wait on: the slot holder (``reason``, the same for
    every row) and the queue's expected starts."""

    reason: str | None = None
    estimate: Estimate | None = None


def positions(order: Sequence[Entry], lang: str,
              wait: Wait | None = None) -> Iterator[tuple[str, str]]:
    """(task id, Message) for each waiting task of one queue, in pick order: exactly
    ``position_message(position, ahead)`` and what ``wait`` says, with the names of the
    queue's first tasks (the same for every row) joined once per queue instead of once
    per row."""
    if not order:
        return
    render = _renderer(order, lang, wait)
    for index, entry in enumerate(order):
        yield entry.task_id, render(index)


def positions_of(order: Sequence[Entry], wanted: Collection[str],
                 lang: str, wait: Wait | None = None) -> list[tuple[str, str]]:
    """(task id, Message) of the ``wanted`` tasks only, as ``positions`` renders them:
    a task that needs its Message now costs a scan of the order, not the rendering of
    the whole queue."""
    if not order or not wanted:
        return []
    render = _renderer(order, lang, wait)
    return [(e.task_id, render(index)) for index, e in enumerate(order) if e.task_id in wanted]


def _renderer(order: Sequence[Entry], lang: str, wait: Wait | None) -> Callable[[int], str]:
    """The Message of the task at ``index`` of ``order`` (which must not be empty):
    its position, then why the queue waits and when the task is expected to start."""
    bare = _position_renderer(order, lang)
    if wait is None or (wait.reason is None and wait.estimate is None):
        return bare
    separator = SEPARATOR[lang]
    reason = separator + wait.reason if wait.reason else ""
    estimate = wait.estimate
    if estimate is None:
        return lambda index: bare(index) + reason
    expected = _formatter("wait-expected", lang)

    def render(index: int) -> str:
        at = clock_time(estimate.start(index))
        return bare(index) + reason + separator + expected(at=at)

    return render


def _position_renderer(order: Sequence[Entry], lang: str) -> Callable[[int], str]:
    """The position part of the Message of the task at ``index`` of ``order``."""
    named = [f"{e.actor}: {e.name}" for e in order[:AHEAD_NAMED]]
    few = [f" ({', '.join(named[:count])})" for count in range(AHEAD_NAMED + 1)]
    all_named = ", ".join(named)
    position, more = _formatter("position", lang), _formatter("more", lang)
    first = position_message(1, (), lang)

    def render(index: int) -> str:
        if index == 0:
            return first
        if index <= AHEAD_NAMED:
            names = few[index]
        else:
            names = f" ({all_named}, {more(count=index - AHEAD_NAMED)})"
        return position(position=index + 1, ahead=index, names=names)

    return render


def position_update(job: JobTable) -> sa.Update:
    """The batched refresh: never touches a row that is no longer Pending (an abort)."""
    return (
        job.table.update()
        .where(job.c.id == sa.bindparam("b_id"), job.c.status == chart.PENDING)
        .values(message=sa.bindparam("b_message"))
    )


#: Rows per statement of the MySQL/MariaDB form (PyMySQL's executemany of an UPDATE
#: is one round trip per row; a joined derived table carries many rows per trip).
MYSQL_CHUNK = 500


def _mysql_update(count: int, names: JobSql) -> str:
    """UPDATE ... JOIN (SELECT id, message UNION ALL ...) for ``count`` rows, with the
    same guard: only rows still Pending (PyMySQL ``format`` parameters: id, message per
    row, then the status)."""
    selects = " UNION ALL ".join(
        "SELECT %s AS id, %s AS message" if n == 0 else "SELECT %s, %s" for n in range(count)
    )
    table, col = names.table, names.columns
    return (f"UPDATE {table} JOIN ({selects}) AS moved ON {table}.{col['id']} = moved.id "
            f"SET {table}.{col['message']} = moved.message "
            f"WHERE {table}.{col['status']} = %s")


def write_positions(conn: Connection, rows: Sequence[tuple[str, str]],
                    update: sa.Update | None = None, *, job: JobTable) -> int:
    """Write (task id, Message) rows in bulk: one executemany UPDATE on SQLite, joined
    multi-row UPDATEs of ``MYSQL_CHUNK`` rows on MySQL/MariaDB. Returns the rows sent."""
    if not rows:
        return 0
    if conn.dialect.name in ("mysql", "mariadb"):
        # Sent to the driver as is: parsing a text() of a thousand bind names cost more
        # than the statement.
        for start in range(0, len(rows), MYSQL_CHUNK):
            chunk = rows[start:start + MYSQL_CHUNK]
            conn.exec_driver_sql(_mysql_update(len(chunk), job.sql(conn.dialect)),
                                 (*(value for row in chunk for value in row), chart.PENDING))
        return len(rows)
    if update is None and conn.dialect.name == "sqlite":
        # The driver's own executemany: the statement needs no compiling and the rows
        # (plain strings) no bind processing, which per row cost more than the UPDATE.
        conn.exec_driver_sql(_sqlite_position_update(job.sql(conn.dialect)),
                             [(message, task_id, chart.PENDING) for task_id, message in rows])
        return len(rows)
    conn.execute(update if update is not None else position_update(job),
                 [{"b_id": task_id, "b_message": m} for task_id, m in rows])
    return len(rows)


def _sqlite_position_update(names: JobSql) -> str:
    """``position_update`` as SQLite compiles it (qmark parameters: message, id, status)."""
    table, col = names.table, names.columns
    return (f"UPDATE {table} SET {col['message']}=? "
            f"WHERE {table}.{col['id']} = ? AND {table}.{col['status']} = ?")


def waiting_messages(job: JobTable) -> sa.Select[Any]:
    """The Messages the job table holds for waiting tasks (read once at start)."""
    return sa.select(job.c.id.label("id"), job.c.message.label("message")).where(
        job.c.status == chart.PENDING, job.c.reason == chart.PendingReason.WAITING)


class QueueView:
    """Inline projection keeping the ``QueueBook`` and the waiting positions current.

    ``refresh_seconds`` paces each queue's rewrite on ``clock`` (0: every change is
    written with the append that made it, which needs no clock)."""

    def __init__(self, tasks: TaskStates, lang: str = "en", book: QueueBook | None = None,
                 *, job: JobTable | None = None, clock: Clock | None = None,
                 refresh_seconds: float = 0.0) -> None:
        if refresh_seconds < 0:
            raise ValueError(f"refresh_seconds={refresh_seconds}: must not be negative")
        if refresh_seconds and clock is None:
            raise ValueError("a position refresh interval needs the clock to measure it on")
        self.tasks = tasks
        self.lang = lang
        self.book = book if book is not None else QueueBook()
        #: The job table the positions are written to (the default names when the
        #: view only folds, as a replay's does).
        self.job = job if job is not None else JobTable()
        self.clock = clock
        self.refresh_interval = dt.timedelta(seconds=refresh_seconds)
        self._latest = dt.datetime.min  # the latest event folded (``now`` without a clock)
        #: Recent slot holds per queue (the expected starts), and each current holder's
        #: (queue, when it took the slot, its state then).
        self.slot_times = SlotTimes()
        self._holding: dict[str, tuple[QueueKey, dt.datetime, str]] = {}
        #: When each current holder entered each state of its hold, in order (a few
        #: per holder): the expected remaining time of a holder depends on its state.
        self._phases: dict[str, list[tuple[str, dt.datetime]]] = {}
        #: Told (task id, when, expected start) for every position rendered to be
        #: written, when set: ``falcon-es simulate`` measures the estimates with it.
        self.predictions: Callable[[str, dt.datetime, dt.datetime], None] | None = None
        self._written: dict[str, str] = {}  # task id -> position Message in the row
        #: Waiting tasks whose row does not hold their position (their own change wrote
        #: it, another writer did, or nobody knows what it holds): written at once.
        self._unwritten: set[str] = set()
        #: When each queue's rows were last all brought up to date.
        self._refreshed_at: dict[QueueKey, dt.datetime] = {}
        # What the refresh in the open transaction wrote, kept once it commits.
        self._staged: dict[str, str] = {}
        self._staged_unwritten: set[str] = set()
        self._refreshed: set[QueueKey] = set()
        self._staged_at: dt.datetime | None = None
        #: Rows written by the last refresh, and by every committed one (for the
        #: benchmark and tests).
        self.last_refresh_rows = 0
        self.rows_written = 0

    # ------------------------------------------------------------ InlineProjection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        self.fold(self.tasks.changes(), recorded)
        self.refresh(conn)

    def committed(self) -> None:
        self.book.commit()
        self._keep_staged()

    def discarded(self) -> None:
        self.book.rollback()
        self._drop_staged()

    # ------------------------------------------------------------ folding
    def fold(self, changes: Iterable[Change], recorded: Sequence[RecordedEvent]) -> None:
        """Fold task changes (in log order) and the decisions they record."""
        book = self.book
        if recorded:
            self._latest = max(self._latest, recorded[-1].recorded_at)
        for change in changes:
            self._place(change.after)
        for record in recorded:
            event = record.event
            if isinstance(event, ev.TaskPicked):
                state = self.tasks.get(record.stream_id)
                if state is not None:
                    book.served((event.cluster_id, event.topology), state.actor)
            elif isinstance(event, ev.NodePoolRetained):
                state = self.tasks.get(record.stream_id)
                if state is not None and state.cluster_id is not None:
                    book.pool_retained(event.pool_name, (state.cluster_id, state.topology))
            elif isinstance(event, (ev.NodePoolDeleteRequested, ev.NodePoolDeleted)):
                for pool in (event.pool_name, *event.slice_pools):
                    book.pool_gone(pool)
            elif isinstance(event, _POOL_TAKEN):
                book.pool_gone(event.pool_name)

    def resync(self, states: Iterable[TaskState]) -> None:
        """Put tasks whose states were folded again from the log (another writer won a
        race) where those states say; their queues' positions are rewritten with the
        next append. Who a queue served last is not replayed from their history."""
        for state in states:
            self._place(state)
        self.book.commit()

    def _place(self, state: TaskState) -> None:
        """Put the task where its state says (the book marks the queues it left or
        joined); its row's Message was just rewritten, so a waiting task's own row needs
        its position again, at once."""
        self._written.pop(state.task_id, None)
        self.book.sync(state)
        place = self.book.place(state.task_id)
        self._follow_slot(state, place)
        if place is not None and place[0] == Placement.WAITING:
            self._unwritten.add(state.task_id)
        else:  # a row that left its queue has its own Message, not a position
            self._unwritten.discard(state.task_id)

    def _follow_slot(self, state: TaskState, place: tuple[str, Any] | None) -> None:
        """Time the slot holds: a holder's change of state rewrites its queue's
        Messages (they say what it is doing), and a hold that ends (its pods run, or
        it ended) is one more duration for the queue's expected starts."""
        task_id = state.task_id
        holding = self._holding.get(task_id)
        at = state.updated_at or self.now()
        if place is not None and place[0] == Placement.SLOT:
            key: QueueKey = place[1]
            if holding is None or holding[2] != state.state:
                self._holding[task_id] = (key, holding[1] if holding else at, state.state)
                self._phases.setdefault(task_id, []).append((state.state, at))
                self.book.changed.add(key)
            return
        if holding is None:
            return
        del self._holding[task_id]
        phases = self._phases.pop(task_id, [])
        self.book.changed.add(holding[0])
        if state.status != chart.PENDING:  # not given back to the queue
            self.slot_times.record(holding[0], (at - holding[1]).total_seconds(),
                                   [(phase, (at - entered).total_seconds())
                                    for phase, entered in phases])

    def wait(self, key: QueueKey, now: dt.datetime) -> Wait:
        """What the queue's waiting tasks wait on at ``now``."""
        holders = self.book.holders(key)
        state = self.tasks.get(holders[0]) if holders else None
        if state is None:
            return Wait(None, self.slot_times.estimate(key, now, None))
        holding = self._holding.get(state.task_id)
        phases = self._phases.get(state.task_id)
        since = state.phase_started_at or now
        reservation = (state.message_args if state.message_key == "ReservationInsufficient"
                       else None)
        reason = wait_reason(f"{state.actor}: {state.name}", state.reason or state.status,
                             since, reservation, self.lang)
        return Wait(reason, self.slot_times.estimate(key, now, holding[1] if holding else since,
                                                     phases[-1] if phases else None))

    def _rendered(self, key: QueueKey, now: dt.datetime) -> tuple[list[Entry], Wait]:
        """The queue's order and wait, told to ``predictions`` when it is set."""
        order = self.book.pick_order(key, now)
        wait = self.wait(key, now)
        if self.predictions is not None and wait.estimate is not None:
            for index, entry in enumerate(order):
                self.predictions(entry.task_id, now, wait.estimate.start(index))
        return order, wait

    def load(self, batches: Iterable[Sequence[RecordedEvent]]) -> None:
        """Fold a whole log (at start or for a replay): ``TaskStates`` folds each batch
        first and hands over its per-event changes, so slot and last-actor history is
        replayed in order."""
        for batch in batches:
            changes = self.tasks.fold(batch)
            self.fold(changes, batch)
            self.tasks.committed()
            self.book.commit()
        # The job table already holds the positions of the folded log (they commit
        # with the events), so nothing needs rewriting until a queue changes again.
        self.book.changed.clear()

    def load_live(self, states: Iterable[TaskState], served: Mapping[QueueKey, str]) -> None:
        """Place the live tasks a controller folded at start (``falcon_es.live_set``)
        from their states alone, with who each queue served last as the log left it.
        A retained pool is idle when its holder (live, since it holds it) has not
        handed it over: a taker's ``NodePoolReused`` retires the holder in the same
        commit. Nothing is rewritten: the job table holds these positions already."""
        book = self.book
        for state in states:
            self._place(state)
            if state.is_terminal and state.cluster_id is not None:
                for pool in state.retained_idle:
                    book.pool_retained(pool, (state.cluster_id, state.topology))
        for key, actor in served.items():
            book.served(key, actor)
        book.commit()
        book.changed.clear()

    # ------------------------------------------------------------ positions
    def read_written(self, engine: Engine) -> None:
        """At start, after ``load``: take what the job table holds for the waiting tasks
        as written, and have every waiting queue refreshed at the first tick. The
        previous controller may have left a queue up to one interval behind (or stopped
        before its refresh), and only the rows whose text differs get written."""
        book = self.book
        queues = book.waiting_queues()
        if not queues:
            return
        with engine.connect() as conn:
            held = {str(row.id): row.message for row in conn.execute(waiting_messages(self.job))}
        for key in queues:
            book.changed.add(key)
            self._refreshed_at.pop(key, None)
            for entry in book.waiting(key):
                message = held.get(entry.task_id)
                self._unwritten.discard(entry.task_id)
                if message is not None:
                    self._written[entry.task_id] = message

    def due_queues(self, now: dt.datetime) -> list[QueueKey]:
        """Changed queues whose interval has run out (or that have nobody waiting left
        to write, so they are merely forgotten)."""
        book, interval, refreshed = self.book, self.refresh_interval, self._refreshed_at
        due = []
        for key in book.changed:
            last = refreshed.get(key)
            if last is None or now - last >= interval or not book.waiting_count(key):
                due.append(key)
        return sorted(due)

    def next_refresh(self) -> dt.datetime | None:
        """When the next position write is due (a due source for the loop, which on a
        virtual clock jumps there): now for a row that needs its position at once, else
        the end of the interval of the queue that changed first."""
        now = self.now()
        if any(self.waiting_in(task_id) is not None for task_id in self._unwritten):
            return now
        book, moments = self.book, []
        for key in book.changed:
            if book.waiting_count(key):
                last = self._refreshed_at.get(key)
                moments.append(now if last is None else last + self.refresh_interval)
        return min(moments, default=None)

    def pending_positions(self, queues: Iterable[QueueKey] | None = None) -> list[tuple[str, str]]:
        """Rows to write now: in ``queues`` (default: every queue whose order changed)
        those whose position Message differs from what the job table holds, plus the
        rows of waiting tasks elsewhere that need theirs at once."""
        keys = set(self.book.changed if queues is None else queues)
        rows: list[tuple[str, str]] = []
        written = self._written
        now = self.now()
        for key in sorted(keys):
            order, wait = self._rendered(key, now)
            for task_id, message in positions(order, self.lang, wait):
                if written.get(task_id) != message:
                    rows.append((task_id, message))
        at_once: dict[QueueKey, set[str]] = {}
        for task_id in self._unwritten:
            waits_in = self.waiting_in(task_id)
            if waits_in is not None and waits_in not in keys:
                at_once.setdefault(waits_in, set()).add(task_id)
        for key in sorted(at_once):
            order, wait = self._rendered(key, now)
            rows.extend(positions_of(order, at_once[key], self.lang, wait))
        return rows

    def refresh(self, conn: Connection, *, every_queue: bool = False) -> int:
        """Write, within the open transaction, the rows needed at once and the queues
        due (``every_queue``: every changed queue, due or not); kept once it commits."""
        now = self.now()
        self.book.mark_aged(now)
        due = sorted(self.book.changed) if every_queue else self.due_queues(now)
        rows = self.pending_positions(due)
        write_positions(conn, rows, job=self.job)
        self._staged.update(rows)
        self._staged_unwritten |= self._unwritten
        self._refreshed.update(due)
        self._staged_at = now
        self.last_refresh_rows = len(rows)
        return len(rows)

    def refresh_due(self, engine: Engine) -> int:
        """Write what is due in a transaction of its own: after a tick that appended
        nothing, once a queue's interval ran out or another writer moved a row."""
        now = self.now()
        self.book.mark_aged(now)
        if not self._unwritten and not self.due_queues(now):
            return 0
        try:
            with engine.begin() as conn:
                rows = self.refresh(conn)
        except BaseException:
            self._drop_staged()
            raise
        self._keep_staged()
        return rows

    def _keep_staged(self) -> None:
        self.rows_written += len(self._staged)
        self._written.update(self._staged)
        self._unwritten -= self._staged_unwritten
        self.book.changed -= self._refreshed
        for key in self._refreshed:
            if self.book.waiting_count(key) and self._staged_at is not None:
                self._refreshed_at[key] = self._staged_at
            else:
                self._refreshed_at.pop(key, None)
        self._drop_staged()

    def _drop_staged(self) -> None:
        self._staged = {}
        self._staged_unwritten = set()
        self._refreshed = set()
        self._staged_at = None

    def waiting_in(self, task_id: str) -> QueueKey | None:
        """The queue the task waits in (None: it is not waiting in one)."""
        place = self.book.place(task_id)
        if place is not None and place[0] == Placement.WAITING:
            key: QueueKey = place[1]
            return key
        return None

    def now(self) -> dt.datetime:
        """The clock's time; without a clock (a replay) the latest event's, which is
        what aging and the expected starts are measured against."""
        return self.clock.now() if self.clock is not None else self._latest

    def all_positions(self) -> list[tuple[str, str]]:
        """Every waiting task's position Message (what a rebuild writes)."""
        rows: list[tuple[str, str]] = []
        now = self.now()
        for key in self.book.waiting_queues():
            order = self.book.pick_order(key, now)
            rows.extend(positions(order, self.lang, self.wait(key, now)))
        return rows


# ------------------------------------------------------------------ the view


def queue_rows(
    view: QueueView, clusters: Mapping[str, Cluster], tasks: TaskStates | None = None,
) -> list[dict[str, Any]]:
    """The queue view for people and scripts: one dict per queue."""
    book = view.book
    tasks = tasks if tasks is not None else view.tasks
    rows = []
    for key in book.queue_keys():
        cluster_id, topology = key
        cluster = clusters.get(cluster_id)
        holders = []
        for task_id in book.holders(key):
            state = tasks.get(task_id)
            holders.append({
                "task_id": task_id,
                "actor": state.actor if state else None,
                "name": state.name if state else None,
                "status": state.status if state else None,
                "reason": state.reason if state else None,
            })
        now = view.now()
        order = book.pick_order(key, now)
        wait = view.wait(key, now)
        estimate = wait.estimate
        policy = book.policy
        waiting = [
            {"position": index + 1, "task_id": e.task_id, "actor": e.actor, "name": e.name,
             "submitted_at": e.submitted_at.isoformat(), "priority": e.priority,
             "effective_priority": policy.effective(e.priority, e.submitted_at, now),
             "reason": wait.reason if wait.reason else ("next in line" if index == 0
                                                        else "tasks ahead"),
             "expected_start": estimate.start(index).isoformat() if estimate else None,
             "message": message}
            for index, (e, (_, message)) in enumerate(zip(order, positions(order, view.lang,
                                                                           wait)))
        ]
        rows.append({
            "cluster_id": cluster_id,
            "cluster": cluster.name if cluster else None,
            "cluster_status": cluster.status if cluster else None,
            "tpu_type": cluster.tpu_type if cluster else None,
            "topology": topology,
            "slot_holder": holders[0] if holders else None,
            "waiting_count": len(waiting),
            "waiting": waiting,
            "running": book.running(key),
            "last_actor": book.last_actor(key),
        })
    return rows


def unplaced_rows(view: QueueView) -> list[dict[str, Any]]:
    """Tasks still waiting for a cluster (none active for their TPU type)."""
    return [
        {"tpu_type": tpu_type, "task_id": e.task_id, "actor": e.actor, "name": e.name,
         "submitted_at": e.submitted_at.isoformat()}
        for tpu_type, entries in view.book.unplaced().items() for e in entries
    ]
