"""The queue view: per (cluster, topology) queue the slot holder, the waiting tasks in
pick order with their positions, the running count and the actor served last; and the
waiting tasks' position Message in the job table.

``QueueView`` is an inline projection registered after ``TaskStates`` and the job-table
projection. In each append's transaction it folds the append's task changes into the
scheduler's ``QueueBook`` (which the scheduling handlers already updated while they
decided) and rewrites, in bulk (``write_positions``), the Message of the waiting tasks
whose position text changed, only in queues whose pick order changed. Running in the append's
own transaction, after the job-table rows were written, it commits with the tick's
events and covers events from every handler. A row the upper layer set to
``Aborting`` is never touched (``WHERE status = 'Pending'``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.intents import PoolDisposition
from falcon_es.registry import Cluster
from falcon_es.scheduling import Entry, Placement, QueueBook, QueueKey
from falcon_es.store import RecordedEvent
from falcon_es.tables import JobSql, JobTable
from falcon_es.task import Change, TaskState, TaskStates
from falcon_es.projections.messages import AHEAD_NAMED, CATALOGS, EN, position_message

#: Events that take a retained pool out of the idle set.
_POOL_GONE = (ev.NodePoolReused, ev.NodePoolDeleteRequested, ev.NodePoolDeleted)


def _formatter(key: str, lang: str) -> Callable[..., str]:
    """The catalog template for ``key`` as a function of keyword arguments."""
    template = CATALOGS[lang].get(key) or EN[key]
    if isinstance(template, str):
        return template.format
    return lambda **args: template(args)


def positions(order: Sequence[Entry], lang: str) -> Iterator[tuple[str, str]]:
    """(task id, Message) for each waiting task of one queue, in pick order: exactly
    ``position_message(position, ahead)``, with the names of the queue's first tasks
    (the same for every row) joined once per queue instead of once per row."""
    if not order:
        return
    named = [f"{e.actor}: {e.name}" for e in order[:AHEAD_NAMED]]
    few = [f" ({', '.join(named[:count])})" for count in range(AHEAD_NAMED + 1)]
    all_named = ", ".join(named)
    position, more = _formatter("position", lang), _formatter("more", lang)
    yield order[0].task_id, position_message(1, (), lang)
    for index in range(1, len(order)):
        if index <= AHEAD_NAMED:
            names = few[index]
        else:
            names = f" ({all_named}, {more(count=index - AHEAD_NAMED)})"
        yield order[index].task_id, position(position=index + 1, ahead=index, names=names)


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


class QueueView:
    """Inline projection keeping the ``QueueBook`` and the waiting positions current."""

    def __init__(self, tasks: TaskStates, lang: str = "en", book: QueueBook | None = None,
                 *, job: JobTable | None = None) -> None:
        self.tasks = tasks
        self.lang = lang
        self.book = book if book is not None else QueueBook()
        #: The job table the positions are written to (the default names when the
        #: view only folds, as a replay's does).
        self.job = job if job is not None else JobTable()
        self._written: dict[str, str] = {}  # task id -> position Message in the row
        self._staged: dict[str, str] = {}
        self._refreshed: set[QueueKey] = set()
        #: Rows written by the last refresh (for the benchmark and tests).
        self.last_refresh_rows = 0

    # ------------------------------------------------------------ InlineProjection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        self.fold(self.tasks.changes(), recorded)
        self.refresh(conn)

    def committed(self) -> None:
        self.book.commit()
        self._written.update(self._staged)
        self._staged.clear()
        self.book.changed -= self._refreshed
        self._refreshed.clear()

    def discarded(self) -> None:
        self.book.rollback()
        self._staged.clear()
        self._refreshed.clear()

    # ------------------------------------------------------------ folding
    def fold(self, changes: Iterable[Change], recorded: Sequence[RecordedEvent]) -> None:
        """Fold task changes (in log order) and the decisions they record."""
        book = self.book
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
            elif isinstance(event, _POOL_GONE):
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
        joined); its row's Message was just rewritten, so a waiting task's queue gets its
        positions written again too."""
        self._written.pop(state.task_id, None)
        self.book.sync(state)
        place = self.book.place(state.task_id)
        if place is not None and place[0] == Placement.WAITING:
            self.book.changed.add(place[1])

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
            if (state.is_terminal and state.pool_disposition == PoolDisposition.RETAINED
                    and state.cluster_id is not None and state.node_pool_name is not None):
                book.pool_retained(state.node_pool_name, (state.cluster_id, state.topology))
        for key, actor in served.items():
            book.served(key, actor)
        book.commit()
        book.changed.clear()

    # ------------------------------------------------------------ positions
    def pending_positions(self) -> list[tuple[str, str]]:
        """Rows whose position Message differs from what the job table holds, for the
        queues whose order changed."""
        rows: list[tuple[str, str]] = []
        written = self._written
        for key in sorted(self.book.changed):
            order = self.book.pick_order(key)
            for task_id, message in positions(order, self.lang):
                if written.get(task_id) != message:
                    rows.append((task_id, message))
        return rows

    def refresh(self, conn: Connection) -> int:
        """Write the changed positions in bulk (within the append)."""
        if not self.book.changed:
            self.last_refresh_rows = 0
            return 0
        rows = self.pending_positions()
        write_positions(conn, rows, job=self.job)
        self._staged.update(rows)
        self._refreshed = set(self.book.changed)
        self.last_refresh_rows = len(rows)
        return len(rows)

    def all_positions(self) -> list[tuple[str, str]]:
        """Every waiting task's position Message (what a rebuild writes)."""
        rows: list[tuple[str, str]] = []
        for key in self.book.waiting_queues():
            rows.extend(positions(self.book.pick_order(key), self.lang))
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
        order = book.pick_order(key)
        waiting = [
            {"position": index + 1, "task_id": e.task_id, "actor": e.actor, "name": e.name,
             "submitted_at": e.submitted_at.isoformat(),
             "message": message}
            for index, (e, (_, message)) in enumerate(zip(order, positions(order, view.lang)))
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
