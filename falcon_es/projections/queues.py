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
- in slices, the rows of every queue whose pick order changed within the last
  ``refresh_seconds``: each waiting task belongs to one slice of the interval (the
  CRC-32 of its id modulo ``slices``, about ``SLICE_SECONDS`` each) and its row is
  rendered, compared and written (only when its text differs from what was written)
  when its slice's moment comes, once per interval. The rows of a short queue (at most
  ``WHOLE_QUEUE_ROWS``) share the queue's slice instead, so it is rewritten whole in
  one tick and wakes the loop once per interval rather than once per row.
  ``next_refresh`` tells the loop the next moment a slice holding such a row is due
  (never again for a slice that already has the queue's last change);
  ``refresh_due`` writes it in its own transaction when no append comes.

A pick shifts every position behind it, so without the interval every pick rewrote
the whole queue; with one rewrite per interval a queue of 100,000 rows was still
rewritten whole by one tick. In slices, a changed queue is rewritten over the
interval, a slice per tick, and a row changes at most once per interval: at its own
moment, which comes within one interval of any change, so no position Message is
more than one interval behind the order. The exact order is always in the book
(``queue_rows``). A row the upper layer set to ``Aborting`` is never touched
(``WHERE status = 'Pending'``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.domain.clock import Clock
from falcon_es.domain.eta import Calibration, Estimate, SlotTimes
from falcon_es.domain.queue_book import QueueBook
from falcon_es.domain.queue_places import Entry, Placement, QueueKey
from falcon_es.storage import batched
from falcon_es.storage.store import RecordedEvent
from falcon_es.storage.tables import JobTable
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import Change, TaskStates
from falcon_es.projections.position_messages import Wait, positions, positions_of, renderer
from falcon_es.projections.position_rows import waiting_messages, write_positions
from falcon_es.projections.messages import wait_reason

#: About how long one slice of the refresh interval lasts: at most one slice of each
#: changed queue's rows is rendered and compared per slice period, so the rewrite of a
#: long queue is spread evenly over the interval instead of landing on one tick.
SLICE_SECONDS = 0.1
#: A queue of at most this many waiting rows is refreshed whole, at one moment of the
#: interval (its rows share the queue's slice), instead of waking the loop for each
#: slice one of its rows holds: its whole rewrite weighs on that tick no more than one
#: slice of the queues the tick target is measured on (100,000 waiting over the default
#: interval's 300 slices: about 330 rows a slice), and it saves up to one wake-up, with
#: its transaction and reads, per row and interval.
WHOLE_QUEUE_ROWS = 300
#: Where slice periods are counted from (any fixed moment: it only has to be the same
#: for every controller, so a successor refreshes each row at the same moments).
SLICE_EPOCH = dt.datetime(2000, 1, 1)

#: Events that take a retained pool out of the idle set (as do its deletes).
_POOL_TAKEN = (ev.NodePoolReused, ev.NodePoolTaken)
#: The events whose facts the queue book keeps besides the task states.
_BOOKED = (ev.TaskPicked, ev.NodePoolRetained, ev.NodePoolDeleteRequested, ev.NodePoolDeleted,
           *_POOL_TAKEN)


#: Told (task id, when, expected start) for every position rendered to be written.
#: Told (task id, when, expected start, earliest start, latest start) per rendering.
Predictions = Callable[[str, dt.datetime, dt.datetime, dt.datetime, dt.datetime], None]


class QueueView:
    """Inline projection keeping the ``QueueBook`` and the waiting positions current.

    ``refresh_seconds`` paces each queue's rewrite on ``clock`` (0: every change is
    written with the append that made it, which needs no clock); ``predictions`` is
    told every expected start rendered (``falcon-es simulate`` measures the estimates
    with it)."""

    def __init__(self, tasks: TaskStates, lang: str = "en", book: QueueBook | None = None,
                 *, job: JobTable | None = None, clock: Clock | None = None,
                 refresh_seconds: float = 0.0, predictions: Predictions | None = None) -> None:
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
        self.calibration = Calibration()
        self._holding: dict[str, tuple[QueueKey, dt.datetime, str]] = {}
        #: When each current holder entered each state of its hold, in order (a few
        #: per holder): the expected remaining time of a holder depends on its state.
        self._phases: dict[str, list[tuple[str, dt.datetime]]] = {}
        #: Holders that took a pool a task of their queue left, and each running
        #: task's queue and since when (how fast a queue picks depends on both).
        self._reused: set[str] = set()
        self._running: dict[str, tuple[QueueKey, dt.datetime]] = {}
        self.predictions = predictions
        self._written: dict[str, str] = {}  # task id -> position Message in the row
        #: Waiting tasks whose row does not hold their position (their own change wrote
        #: it, another writer did, or nobody knows what it holds): written at once.
        self._unwritten: set[str] = set()
        #: The interval cut in slices of about ``SLICE_SECONDS``; each waiting row
        #: belongs to one and is refreshed when its slice's moment comes.
        interval_us = self.refresh_interval // dt.timedelta(microseconds=1)
        self.slices = max(1, round(interval_us / (SLICE_SECONDS * 1e6)))
        self._slice_length = dt.timedelta(microseconds=max(1, interval_us // self.slices))
        #: Rows of a queue no longer than this share one slice (``WHOLE_QUEUE_ROWS``).
        self.whole_rows = WHOLE_QUEUE_ROWS
        #: Per waiting task: the queue its slice was given in, and the slice.
        self._slice_of: dict[str, tuple[QueueKey, int]] = {}
        #: Queues whose order changed within the last interval, each with the last
        #: slice period that still owes rows their order since that change, and the
        #: slices their rows occupy.
        self._dirty: dict[QueueKey, int] = {}
        self._occupied: dict[QueueKey, set[int]] = {}
        #: Per queue: the pick order last sliced and its indexes by slice.
        self._buckets: dict[QueueKey, tuple[list[Entry], dict[int, list[int]]]] = {}
        #: The moment of the last sweep (None: the next one takes every slice).
        self._swept_to: dt.datetime | None = None
        # What the refresh in the open transaction wrote, kept once it commits.
        self._staged: dict[str, str] = {}
        self._staged_unwritten: set[str] = set()
        self._changed_now: set[QueueKey] = set()
        self._covered_now: set[QueueKey] = set()
        self._staged_at: dt.datetime | None = None
        #: Rows written by the last refresh, and by every committed one (for the
        #: benchmark and tests).
        self.last_refresh_rows = 0
        #: How long the last ``refresh`` took (``bench scheduler`` reports it).
        self.last_refresh_seconds = 0.0
        self.rows_written = 0

    # ------------------------------------------------------------ InlineProjection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        self.fold(self.tasks.changes(), recorded)
        # The append's moment (the tick's one clock reading), not a reading of our own.
        self.refresh(conn, now=recorded[-1].recorded_at if recorded else None)

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
        # One pass picks the few events the book follows out of a tick's hundreds.
        booked = [r for r in recorded if isinstance(r.event, _BOOKED)]
        if recorded:
            self._latest = max(self._latest, recorded[-1].recorded_at)
            self._reused.update(r.stream_id for r in booked if isinstance(r.event, _POOL_TAKEN))
        for change in changes:
            self._place(change.after)
        for record in booked:
            event = record.event
            if isinstance(event, ev.TaskPicked):
                state = self.tasks.get(record.stream_id)
                if state is not None:
                    book.served((event.cluster_id, event.topology), state.submission.actor)
            elif isinstance(event, ev.NodePoolRetained):
                state = self.tasks.get(record.stream_id)
                if state is not None and state.placement.cluster_id is not None:
                    book.pool_retained(event.pool_name, (state.placement.cluster_id,
                                                         state.submission.topology))
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
            self._slice_of.pop(state.task_id, None)
            self.calibration.forget(state.task_id)

    def _follow_slot(self, state: TaskState, place: tuple[str, Any] | None) -> None:
        """Time the slot holds: a holder's change of state rewrites its queue's
        Messages (they say what it is doing), and a hold that ends (its pods run, or
        it ended) is one more duration for the queue's expected starts."""
        task_id = state.task_id
        holding = self._holding.get(task_id)
        at = state.updated_at or self.now()
        self._follow_run(state, place, at)
        if place is not None and place[0] == Placement.SLOT:
            key: QueueKey = place[1]
            if holding is None:
                self.calibration.picked(task_id, at)
            if holding is None or holding[2] != state.state:
                self._holding[task_id] = (key, holding[1] if holding else at, state.state)
                self._phases.setdefault(task_id, []).append((state.state, at))
                self.book.changed.add(key)
            return
        if holding is None:
            return
        del self._holding[task_id]
        phases = self._phases.pop(task_id, [])
        reused = task_id in self._reused
        self._reused.discard(task_id)
        self.book.changed.add(holding[0])
        if state.status != chart.PENDING:  # not given back to the queue
            self.slot_times.record(holding[0], (at - holding[1]).total_seconds(),
                                   [(phase, (at - entered).total_seconds())
                                    for phase, entered in phases],
                                   reused=reused, ended_at=at)

    def _follow_run(self, state: TaskState, place: tuple[str, Any] | None,
                    at: dt.datetime) -> None:
        """Time the runs: a queue's running tasks leave it pools at the rate they end."""
        task_id = state.task_id
        if place is not None and place[0] == Placement.RUNNING:
            self._running.setdefault(task_id, (place[1], state.phase_started_at or at))
            return
        if task_id not in self._holding and (place is None or place[0] != Placement.SLOT):
            self._reused.discard(task_id)  # a take seen outside a hold counts for none
        run = self._running.pop(task_id, None)
        if run is not None:
            self.slot_times.record_run(run[0], (at - run[1]).total_seconds(), at)

    def wait(self, key: QueueKey, now: dt.datetime) -> Wait:
        """What the queue's waiting tasks wait on at ``now``."""
        holders = self.book.holders(key)
        state = self.tasks.get(holders[0]) if holders else None
        if state is None:
            return Wait(None, self._calibrated(key, self.slot_times.estimate(
                key, now, None, running=self.book.running(key),
                idle=self.book.idle_pools(key))))
        holding = self._holding.get(state.task_id)
        phases = self._phases.get(state.task_id)
        since = state.phase_started_at or now
        reservation = (state.message_args if state.message_key == "ReservationInsufficient"
                       else None)
        borrowers = self.book.borrowers(key)
        lent = self.tasks.get(borrowers[0]) if borrowers else None
        reason = wait_reason(f"{state.submission.actor}: {state.submission.name}",
                             state.reason or state.status, since, reservation, self.lang,
                             f"{lent.submission.actor}: {lent.submission.name}" if lent else None)
        return Wait(reason, self._calibrated(key, self.slot_times.estimate(
            key, now, holding[1] if holding else since, phases[-1] if phases else None,
            self.book.running(key) + 1, self.book.idle_pools(key))))

    def _calibrated(self, key: QueueKey, estimate: Estimate | None) -> Estimate | None:
        """The estimate with its range: as wide as the queue's told waits were off."""
        if estimate is None:
            return None
        return dataclasses.replace(estimate, spread=self.calibration.spread(key))

    def _tell(self, task_id: str, key: QueueKey, now: dt.datetime, estimate: Estimate,
              index: int) -> None:
        """A start rendered for a task: kept for the calibration (its first), and told
        to ``predictions`` when it is set."""
        if self.predictions is None and self.calibration.has_told(task_id):
            return  # only a task's first start counts: nothing to work out
        start = estimate.start(index)
        self.calibration.told(task_id, key, now, start)
        if self.predictions is not None:
            self.predictions(task_id, now, start, *estimate.start_range(index))

    def _rendered(self, key: QueueKey, now: dt.datetime,
                  wanted: Collection[str] | None = None) -> tuple[list[Entry], Wait]:
        """The queue's order and wait; the starts of the ``wanted`` tasks (None: all)
        are told (``_tell``)."""
        order = self.book.pick_order(key, now)
        wait = self.wait(key, now)
        if wait.estimate is not None:
            for index, entry in enumerate(order):
                if wanted is None or entry.task_id in wanted:
                    self._tell(entry.task_id, key, now, wait.estimate, index)
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
        """Place the live tasks a controller folded at start (``falcon_es.engine.live_set``)
        from their states alone, with who each queue served last as the log left it.
        A retained pool is idle when its holder (live, since it holds it) has not
        handed it over: a taker's ``NodePoolReused`` retires the holder in the same
        commit. Nothing is rewritten: the job table holds these positions already."""
        book = self.book
        for state in states:
            self._place(state)
            if state.is_terminal and state.placement.cluster_id is not None:
                for pool in state.retained_idle:
                    book.pool_retained(
                        pool, (state.placement.cluster_id, state.submission.topology))
        for key, actor in served.items():
            book.served(key, actor)
        book.commit()
        book.changed.clear()

    # ------------------------------------------------------------ positions
    def read_written(self, engine: Engine) -> None:
        """At start, after ``load``: take what the job table holds for the waiting tasks
        as written, and have every waiting queue swept whole at the first refresh. The
        previous controller may have left rows up to one interval behind (or stopped
        before their slice came), and only the rows whose text differs get written."""
        book = self.book
        queues = book.waiting_queues()
        if not queues:
            return
        with engine.connect() as conn:
            held = {str(row.id): row.message for row in conn.execute(waiting_messages(self.job))}
        self._swept_to = None
        for key in queues:
            book.changed.add(key)
            for entry in book.waiting(key):
                message = held.get(entry.task_id)
                self._unwritten.discard(entry.task_id)
                if message is not None:
                    self._written[entry.task_id] = message

    def _counter(self, moment: dt.datetime) -> int:
        """The number of the slice period ``moment`` falls in, counted from ``SLICE_EPOCH``
        (the slice of a period is the number modulo ``slices``)."""
        return (moment - SLICE_EPOCH) // self._slice_length

    def slice_of(self, task_id: str) -> int:
        """The task's slice, fixed while it waits in one queue: given when the queue is
        first sliced after the task joined it, the queue's own (the CRC-32 of its name)
        while the queue has at most ``whole_rows`` waiting tasks, so a short queue is
        rewritten whole at one moment, else the task's (the CRC-32 of its id). Both are
        the same for every controller, so a successor mostly refreshes a row at the same
        moments; and as a row keeps its slice when its queue grows or shrinks, no more
        than ``whole_rows`` rows of a queue ever share its slice."""
        key = self.waiting_in(task_id)
        if key is None:
            return zlib.crc32(task_id.encode("utf-8")) % self.slices
        return self._slice(task_id, key, self.book.waiting_count(key) <= self.whole_rows)

    def _slice(self, task_id: str, key: QueueKey, short: bool) -> int:
        found = self._slice_of.get(task_id)
        if found is not None and found[0] == key:
            return found[1]
        name = f"{key[0]}/{key[1]}" if short else task_id
        part = zlib.crc32(name.encode("utf-8")) % self.slices
        self._slice_of[task_id] = (key, part)
        return part

    def due_slices(self, now: dt.datetime) -> dict[QueueKey, frozenset[int] | None]:
        """Per queue that changed within the last interval, the slices to refresh now
        (None: every slice). A queue that was already changing gets the slices whose
        moment came since the last sweep, up to the last one that still owes its rows
        the order since that change; one that changes now the slice of this moment
        (its rows of earlier moments were exact then, and each gets the new order at its
        own moment within the interval), unless this moment's slice was swept already.
        Every slice at the first sweep or with no interval."""
        book = self.book
        keys = sorted(set(self._dirty) | book.changed)
        if self._swept_to is None or not self.refresh_interval:
            return dict.fromkeys(keys)
        first, last = self._counter(self._swept_to) + 1, self._counter(now)
        fresh = frozenset({last % self.slices} if last >= first else ())
        due: dict[QueueKey, frozenset[int] | None] = {}
        for key in keys:
            until = self._dirty.get(key)
            end = first - 1 if until is None else min(last, until)
            if end - first + 1 >= self.slices:
                due[key] = None
                continue
            owed = frozenset(n % self.slices for n in range(first, end + 1))
            due[key] = owed | fresh if key in book.changed else owed
        return due

    def next_refresh(self) -> dt.datetime | None:
        """When the next position write is due (a due source for the loop, which on a
        virtual clock jumps there): now for a row that needs its position at once or a
        queue that changed outside an append; else the start of the first slice that
        holds a row of a queue that changed within the last interval and still owes it
        that change."""
        now = self.now()
        if any(self.waiting_in(task_id) is not None for task_id in self._unwritten):
            return now
        book = self.book
        if any(book.waiting_count(key) for key in book.changed):
            return now
        if self._swept_to is None:
            return None
        after = self._counter(self._swept_to) + 1
        due: int | None = None
        for key, until in self._dirty.items():
            occupied = self._occupied.get(key)
            if not occupied or after > until:
                continue
            period = self._next_period(after, occupied)
            if period <= until and (due is None or period < due):
                due = period
        return None if due is None else SLICE_EPOCH + self._slice_length * due

    def _next_period(self, after: int, occupied: set[int]) -> int:
        """The first slice period from ``after`` on whose slice is in ``occupied``: the
        nearest of a few slices (a short queue has one), else the first found stepping
        on (a long queue's rows occupy nearly every slice)."""
        slices = self.slices
        if len(occupied) <= 32:
            return after + min((part - after) % slices for part in occupied)
        return next(after + n for n in range(slices) if (after + n) % slices in occupied)

    def pending_positions(self, due: Mapping[QueueKey, Collection[int] | None] | None = None,
                          *, now: dt.datetime | None = None) -> list[tuple[str, str]]:
        """Rows to write now: in each queue of ``due`` (default: every queue that
        changed within the last interval, every slice) the rows of its due slices
        (None: all) whose position Message differs from what the job table holds, plus
        the rows of waiting tasks elsewhere that need theirs at once."""
        if due is None:
            due = dict.fromkeys(set(self._dirty) | self.book.changed)
        rows: list[tuple[str, str]] = []
        written = self._written
        now = self.now() if now is None else now
        for key in sorted(due):
            slices = due[key]
            if slices is None:
                order, wait = self._rendered(key, now)
                short = len(order) <= self.whole_rows
                self._occupied[key] = {self._slice(e.task_id, key, short) for e in order}
                rows.extend(row for row in positions(order, self.lang, wait)
                            if written.get(row[0]) != row[1])
                continue
            rows.extend(self._sliced(key, now, slices))
        at_once: dict[QueueKey, set[str]] = {}
        for task_id in self._unwritten:
            waits_in = self.waiting_in(task_id)
            if waits_in is not None and waits_in not in due:
                at_once.setdefault(waits_in, set()).add(task_id)
        for key in sorted(at_once):
            order, wait = self._rendered(key, now, at_once[key])
            rows.extend(positions_of(order, at_once[key], self.lang, wait))
        return rows

    def _sliced(self, key: QueueKey, now: dt.datetime,
                due: Collection[int]) -> list[tuple[str, str]]:
        """The rows of one queue's ``due`` slices whose text changed and those needed at
        once (rendering those only, and telling the starts of those only), noting
        which slices the queue's rows occupy (``next_refresh``)."""
        rows: list[tuple[str, str]] = []
        order = self.book.pick_order(key, now)
        if not order:
            self._occupied.pop(key, None)
            self._buckets.pop(key, None)
            return rows
        buckets, skip = self._buckets_of(key, order)
        self._occupied[key] = {part for part, at in buckets.items() if at[-1] >= skip}
        wanted = {i + skip for i, e in enumerate(order) if e.task_id in self._unwritten} \
            if self._unwritten else set()
        for part in due:
            wanted.update(i for i in buckets.get(part, ()) if i >= skip)
        if not wanted:  # none of its rows is due (a short queue's one slice is not)
            return rows
        wait = self.wait(key, now)
        render = renderer(order, self.lang, wait)
        written = self._written
        estimate = wait.estimate
        for index in sorted(wanted):
            entry, message = order[index - skip], render(index - skip)
            if estimate is not None:
                self._tell(entry.task_id, key, now, estimate, index - skip)
            if written.get(entry.task_id) != message:
                rows.append((entry.task_id, message))
        return rows

    def _buckets_of(self, key: QueueKey, order: list[Entry]) -> tuple[dict[int, list[int]], int]:
        """The queue's indexes by slice, and how many tasks have left the head of the
        order they index since: a pick takes the first task and leaves the rest in order,
        so the buckets of a queue picked from are reused (a list comparison, done in C)
        and built again, a Python pass over the queue, only when the order changed
        otherwise."""
        cached = self._buckets.get(key)
        if cached is not None:
            before, buckets = cached
            skip = len(before) - len(order)
            if skip >= 0 and before[skip:] == order:
                return buckets, skip
        slice_of, short = self._slice, len(order) <= self.whole_rows
        buckets = {}
        for index, entry in enumerate(order):
            buckets.setdefault(slice_of(entry.task_id, key, short), []).append(index)
        self._buckets[key] = (order, buckets)
        return buckets, 0

    def refresh(self, conn: Connection, *, every_queue: bool = False,
                now: dt.datetime | None = None) -> int:
        """Write, within the open transaction, the rows needed at once and the rows of
        the slices due (``every_queue``: every slice of every queue that changed within
        the interval), as of ``now`` (None: the clock's time); kept once it commits."""
        started = time.perf_counter()
        rows = self._stage(every_queue, self.now() if now is None else now)
        write_positions(conn, rows, job=self.job)
        self.last_refresh_seconds = time.perf_counter() - started
        return len(rows)

    def refresh_due(self, engine: Engine) -> int:
        """Write what is due in a transaction of its own: after a tick that appended
        nothing, once a slice's moment came or another writer moved a row. A refresh
        whose rows all read as already written opens no transaction at all."""
        now = self.now()
        self.book.mark_aged(now)
        if not self._unwritten and not self.book.changed and all(
                slices is not None and not slices for slices in self.due_slices(now).values()):
            return 0
        try:
            rows = self._stage(False, now)
            if rows:
                # On MySQL/MariaDB the UPDATEs and the COMMIT go in one query.
                with engine.begin() as conn, batched.collecting(conn):
                    write_positions(conn, rows, job=self.job)
                    batched.end_with_commit(conn)
        except BaseException:
            self._drop_staged()
            raise
        self._keep_staged()
        return len(rows)

    def _stage(self, every_queue: bool, now: dt.datetime) -> list[tuple[str, str]]:
        """The rows to write as of ``now``, staged to be kept once they commit."""
        self.book.mark_aged(now)
        due = None if every_queue else self.due_slices(now)
        rows = self.pending_positions(due, now=now)
        self._staged.update(rows)
        self._staged_unwritten |= self._unwritten
        self._changed_now = set(self.book.changed)
        # Queues whose rows of this moment's slice got the order after their change.
        part = self._counter(now) % self.slices
        self._covered_now = {key for key in self._changed_now
                             if due is None or (slices := due.get(key, ())) is None
                             or part in slices}
        self._staged_at = now
        self.last_refresh_rows = len(rows)
        return rows

    def _keep_staged(self) -> None:
        self.rows_written += len(self._staged)
        self._written.update(self._staged)
        self._unwritten -= self._staged_unwritten
        at = self._staged_at
        if at is not None:
            self.book.changed -= self._changed_now
            counter = self._counter(at)
            # Every other slice's moment comes within the next interval; this moment's
            # slice again at its end unless it was swept after the change.
            for key in self._changed_now:
                covered = key in self._covered_now
                self._dirty[key] = counter + self.slices - (1 if covered else 0)
            self._swept_to = at
            if not self.refresh_interval:  # every change was written whole
                self._dirty.clear()
            # A queue is clean once every slice it owes the change was swept.
            for key in [k for k, until in self._dirty.items()
                        if counter >= until or not self.book.waiting_count(k)]:
                del self._dirty[key]
                self._occupied.pop(key, None)
                self._buckets.pop(key, None)
        self._drop_staged()

    def _drop_staged(self) -> None:
        self._staged = {}
        self._staged_unwritten = set()
        self._changed_now = set()
        self._covered_now = set()
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
