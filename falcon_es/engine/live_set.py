"""The live set: the streams a controller keeps in memory and folds when it starts.

The log keeps every task that ever ran; a controller that folded all of them at start
would take minutes and gigabytes after a year. A tick needs only the tasks that still
hold something, so a task leaves memory with the commit after which it holds nothing:
it has ended, no intent of it is open, and its pool (if it had one) is deleted, never
existed, or was taken over by another task. The ``live_streams`` table names those
streams and is written in each append's own transaction, so it is never ahead of or
behind the log, and a starting controller folds the streams it names instead of the
whole log. Orphan streams are live while one of their orphans waits for its delete,
and are read from the oldest such orphan on.

The rows of retired tasks are deleted lazily, with the append that comes once
``RETIRED_ROWS_PER_WRITE`` wait, once the oldest has waited ``LAZY_WRITE_SECONDS``,
once nothing live is left, or when the app closes: a delete was a statement of most
appends (design note ``round-trips.md``). A row of a retired task that outlives a crash
is folded at the next start and retired again at its first commit (``settle``); that is
safe because a task retires no later than a task that took its pool over (the taker
holds the pool), and all waiting rows go in one statement, so a giver's row is never
left without its taker's.

Two facts outlive the tasks they came from, because the rules of the running
controller read them:

- who each queue served last (its latest ``TaskPicked``): the pick rule makes that
  actor yield, so the ``last_served`` table keeps one row per queue. Its rows change
  with nearly every pick and are read only at start, so they are written lazily too,
  with the rows that wait for their delete, together with the seq through which they
  hold every pick (the ``last-served`` checkpoint): a starting controller reads the
  picks the log holds after it (an append moves it once a pick waited
  ``LAZY_WRITE_SECONDS`` or ``SERVED_TAIL_EVENTS`` events passed it, so that tail
  stays short). While another writer may append (``open_app``'s
  ``follow_log``), each append writes its picks itself, as its rows would otherwise
  go after that writer's;
- when a task asked for its pool: the orphan sweep spares a pool younger than the
  create-visibility grace even when its creator recorded it deleted (GKE may list a
  pool late), so a creator that holds nothing stays in memory (and in the table)
  until that grace has passed, and leaves with the first commit after it.

A task that left memory never comes back by itself; only an abort the upper layer
asks for on its finished row (``recall``) brings it back, for the commit that records
``AbortIgnored``, after which it leaves again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

import sqlalchemy as sa
from sortedcontainers import SortedKeyList
from sqlalchemy.engine import Connection

from falcon_es.domain import events as ev
from falcon_es.domain.handover import needs_disposal
from falcon_es.domain.intents import ORPHAN_STREAM_PREFIX, PoolDisposition
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.log_fold import Connect, final_states
from falcon_es.domain.queue_places import QueueKey
from falcon_es.storage import batched, checkpoints, fence as fencing
from falcon_es.storage.store import EventStore, RecordedEvent
from falcon_es.storage.tables import last_served, live_streams, log_head
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from falcon_es.domain.task_intents import task_intents

#: Dispositions under which an ended task still answers for its pool.
_POOL_OPEN = frozenset({PoolDisposition.DELETE_REQUESTED, PoolDisposition.DELETE_FAILED})
_EARLIEST = dt.datetime.min
#: An orphan: (cluster id, pool name).
OrphanKey = tuple[str, str]


class Verdict(enum.Enum):
    LIVE = "live"  # holds something
    LINGERS = "lingers"  # holds nothing, but its pool's create grace has not passed
    RETIRED = "retired"  # holds nothing: leaves memory and the table


def holds_something(state: TaskState, *, handed_on: Collection[str]) -> bool:
    """The task still needs the controller: it has not ended, an intent of it is open,
    or it answers for a pool (fate undecided, being deleted, or retained for another
    task and not taken yet). ``handed_on``: its pools another task took over."""
    if not state.is_terminal or task_intents(state) or needs_disposal(state):
        return True
    if state.pool.disposition in _POOL_OPEN:
        return True
    return any(pool not in handed_on for pool in state.retained_idle)


def verdict(state: TaskState, *, handed_on: Collection[str], now: dt.datetime,
            grace: dt.timedelta) -> tuple[Verdict, dt.datetime | None]:
    """Whether the task stays, and until when a task that holds nothing lingers (a
    pool it created may still show up: unless another task took each of them)."""
    if holds_something(state, handed_on=handed_on):
        return Verdict.LIVE, None
    created = [p for p in state.node_pools if p not in state.pool.taken_pools]
    if state.pool.requested_at is not None and not all(p in handed_on for p in created):
        until = state.pool.requested_at + grace
        if until > now:
            return Verdict.LINGERS, until
    return Verdict.RETIRED, None


class RetiredTasks(Protocol):
    """What the intake handlers ask about tasks that are not in memory."""

    def known(self, task_ids: Collection[str]) -> set[str]:
        """Those of these ids whose streams the log holds."""
        ...

    def recall(self, task_ids: Collection[str]) -> None:
        """Fold these tasks from the log into memory for the tick under way (ids the log
        does not know are ignored); they leave again with the next commit."""
        ...

    def started(self, task_ids: Collection[str]) -> dict[str, dt.datetime]:
        """Those of these ids whose streams the log holds, with when each began."""
        ...

    def final_states(self, task_ids: Collection[str]) -> dict[str, TaskState]:
        """These tasks as the log leaves them, folded apart: memory is left as it is
        (ids the log does not know are absent)."""
        ...


class NothingRetired:
    """A controller with no log behind it (a test driving handlers on bare states)."""

    def known(self, task_ids: Collection[str]) -> set[str]:
        return set()

    def recall(self, task_ids: Collection[str]) -> None:
        return None

    def started(self, task_ids: Collection[str]) -> dict[str, dt.datetime]:
        return {}

    def final_states(self, task_ids: Collection[str]) -> dict[str, TaskState]:
        return {}


#: Rows of retired tasks waiting for their delete that make the next append delete
#: them; and how long the oldest change may wait (event clock), a pick not in
#: ``last_served`` included.
RETIRED_ROWS_PER_WRITE = 200
LAZY_WRITE_SECONDS = 60.0
#: Events the log may hold past the ``last-served`` checkpoint before an append moves
#: it (a start reads them): picks are rare while every task runs, events are not.
SERVED_TAIL_EVENTS = 10_000
#: The checkpoint (``checkpoints``) through whose seq ``last_served`` holds every pick.
SERVED_CHECKPOINT = "last-served"


@dataclasses.dataclass
class _Plan:
    """What the append in progress changes in the live set (applied on commit)."""

    inserted: set[str] = dataclasses.field(default_factory=set)
    #: Tasks retired by this append whose rows are in the table.
    retired: set[str] = dataclasses.field(default_factory=set)
    #: Rows deleted by this append (every retired one waiting, when it writes them).
    deleted: set[str] = dataclasses.field(default_factory=set)
    #: Whether this append deletes the rows that waited (``deleted``).
    writes_waiting: bool = False
    #: The moment of the append (its last event's).
    at: dt.datetime = dt.datetime.min
    evicted: set[str] = dataclasses.field(default_factory=set)
    lingering: dict[str, dt.datetime | None] = dataclasses.field(default_factory=dict)
    #: Who each queue served, where this append changed it.
    served: dict[QueueKey, str] = dataclasses.field(default_factory=dict)
    #: The ``last_served`` rows this append writes, and the seq it writes as the
    #: checkpoint they hold every pick through (None: it leaves the checkpoint).
    served_rows: dict[QueueKey, str] = dataclasses.field(default_factory=dict)
    served_through: int | None = None
    orphans: dict[str, dict[OrphanKey, int]] = dataclasses.field(default_factory=dict)


def _linger_moment(entry: tuple[dt.datetime, str]) -> dt.datetime:
    return entry[0]


class LiveSet:
    """Inline projection keeping ``live_streams`` and ``last_served``; evicts from the
    task states and the lifecycle index what holds nothing once a commit is durable.

    Registered after every other inline projection: it judges the states the append
    staged, and evicts only after the others have taken the commit in."""

    def __init__(self, tasks: TaskStates, index: LifecycleIndex, *,
                 create_grace_seconds: float, served_with_each_append: bool = False) -> None:
        self.tasks = tasks
        self.index = index
        self.grace = dt.timedelta(seconds=create_grace_seconds)
        self.store: EventStore | None = None
        #: Task streams that have a row in ``live_streams``.
        self._rows: set[str] = set()
        #: Of those, the retired ones waiting for their delete; since when the oldest
        #: change waits (None: nothing waits).
        self._retiring: set[str] = set()
        self._waiting_since: dt.datetime | None = None
        self._linger_at: dict[str, dt.datetime] = {}
        self._lingering: SortedKeyList = SortedKeyList(key=_linger_moment)
        self._served: dict[QueueKey, str] = {}
        #: Who each queue served, where ``last_served`` does not say so yet; written
        #: with each append instead while another writer may append.
        self._unwritten: dict[QueueKey, str] = {}
        self._served_with_each_append = served_with_each_append
        #: The seq through which ``last_served`` holds every pick (None: no checkpoint
        #: yet: the table's rows are as the appends of older versions wrote them, each
        #: its own picks).
        self._served_through: int | None = None
        #: A pick was committed past the checkpoint (its row written or not).
        self._uncovered = False
        #: Per orphan stream, its orphans found and not deleted yet (and their version).
        self._orphans: dict[str, dict[OrphanKey, int]] = {}
        self._recalled: set[str] = set()
        self._plan: _Plan | None = None

    def attach(self, store: EventStore) -> None:
        self.store = store

    # ------------------------------------------------------------ start-up
    def load(self) -> dict[QueueKey, str]:
        """Fold the live streams into the task states (committed) and read who each
        queue served last; returns that. The lifecycle index is rebuilt afterwards from
        the states (``settle``)."""
        store = self._store()
        with store.reader.connect() as conn:
            rows = conn.execute(sa.select(live_streams.c.stream_id,
                                          live_streams.c.fold_from)).all()
            self._served = {(c, t): a for c, t, a in conn.execute(sa.select(
                last_served.c.cluster_id, last_served.c.topology, last_served.c.actor))}
            through = checkpoints.position(conn, SERVED_CHECKPOINT)
        tasks = {s: v for s, v in rows if not s.startswith(ORPHAN_STREAM_PREFIX)}
        for batch in store.read_streams(tasks):
            self.tasks.fold(batch)
            self.tasks.committed()
        self._rows = set(tasks)
        self._retiring, self._waiting_since = set(), None
        self._served_through = through
        self._unwritten = ({} if self._served_through is None
                           else self._picks_after(self._served_through))
        self._served.update(self._unwritten)
        self._uncovered = bool(self._unwritten)
        self._orphans = {}
        for stream_id, start in rows:
            if stream_id.startswith(ORPHAN_STREAM_PREFIX):
                self._orphans[stream_id] = _open_orphans(
                    {}, store.read_stream(stream_id, from_version=start))
        return dict(self._served)

    def settle(self) -> None:
        """After the index was rebuilt from the loaded states: note which of them hold
        nothing any more (a grace that passed while no controller ran, a row left by
        an older version); the next commit retires them."""
        for state in self.tasks.all():
            if not holds_something(state, handed_on=self.index.handed_on(state.task_id)):
                self._set_linger(state.task_id, _EARLIEST)

    # ------------------------------------------------------------ inline projection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        if not recorded:
            return
        now = recorded[-1].recorded_at
        plan = _Plan(at=now)
        judged: dict[str, TaskState] = {}
        handed: dict[str, set[str]] = {}
        for change in self.tasks.changes():
            after = change.after
            judged[after.task_id] = after
            took = after.took
            for pool, from_task in set(took) - set(change.before.took) if took else ():
                handed.setdefault(from_task, set()).add(pool)
        due = [task_id for _, task_id in self._lingering.irange_key(max_key=now)]
        for task_id in (*handed, *due):
            state = self.tasks.get(task_id)
            if state is not None:
                judged.setdefault(task_id, state)
        for task_id, state in judged.items():
            if task_id in self._recalled:
                plan.evicted.add(task_id)
                continue
            self._judge(plan, state, handed.get(task_id, ()), now)
        self._plan_served(plan, recorded)
        self._plan_orphans(plan, recorded)
        self._plan_waiting(plan, now, recorded[-1].seq)
        _write(conn, plan, self._orphans)
        self._plan = plan

    def _plan_waiting(self, plan: _Plan, now: dt.datetime, head: int) -> None:
        """Whether this append also writes what waits: the rows of retired tasks and who
        the queues served, with the checkpoint (module docstring). ``head``: the
        append's last seq."""
        rows = {**self._unwritten, **plan.served}
        if self._served_with_each_append:
            plan.served_rows = rows
        retiring = self._retiring | plan.retired
        picked = self._uncovered or bool(plan.served)
        through = self._served_through
        long_tail = through is not None and head - through >= SERVED_TAIL_EVENTS
        if not (retiring or picked or long_tail):
            return
        since = self._waiting_since or now
        # Retiring rows are rows of the table: none other left, none new, is nothing live.
        nothing_live = retiring and not plan.inserted and len(retiring) >= len(self._rows)
        if (len(retiring) >= RETIRED_ROWS_PER_WRITE or nothing_live or long_tail
                or (picked and through is None)  # no checkpoint yet: the first at once
                or (now - since).total_seconds() >= LAZY_WRITE_SECONDS):
            plan.deleted |= retiring
            plan.served_rows = rows
            plan.served_through = head
            plan.writes_waiting = True

    def write_waiting(self) -> None:
        """Write what waits (the retired rows' deletes, who the queues served and the
        checkpoint) in a transaction of its own (an app that closes); not once another
        controller's term has begun: that one keeps the tables then."""
        plan = _Plan(deleted=set(self._retiring), served_rows=dict(self._unwritten),
                     writes_waiting=True)
        if not (plan.deleted or self._uncovered):
            return
        store = self._store()
        with store.engine.begin() as conn:
            if store.fence is not None and fencing.current(conn).term != store.fence.term:
                return
            # This writer's appends are the log (while another may append, each of them
            # wrote its picks itself): the rows hold every pick through the head.
            plan.served_through = conn.execute(sa.select(log_head.c.last_seq)).scalar_one()
            plan.at = store.clock.now()
            _write(conn, plan, self._orphans)
        self._wrote_waiting(plan)

    def _wrote_waiting(self, plan: _Plan) -> None:
        self._rows -= plan.deleted
        self._retiring -= plan.deleted
        self._waiting_since = None
        self._unwritten.clear()
        self._uncovered = False
        self._served_through = plan.served_through

    def committed(self) -> None:
        plan, self._plan = self._plan, None
        recalled, self._recalled = self._recalled, set()
        if plan is None:
            self._evict(recalled)
            return
        self._rows |= plan.inserted
        for task_id, until in plan.lingering.items():
            self._set_linger(task_id, until)
        self._served.update(plan.served)
        self._retiring |= plan.retired
        if plan.writes_waiting:
            self._wrote_waiting(plan)
        else:
            if self._served_with_each_append:
                self._unwritten.clear()
            else:
                self._unwritten.update(plan.served)
            self._uncovered = self._uncovered or bool(plan.served)
            # Picks a start read from the log wait too, from the first append after it.
            if self._waiting_since is None and (self._retiring or self._uncovered):
                self._waiting_since = plan.at
        for stream_id, open_now in plan.orphans.items():
            if open_now:
                self._orphans[stream_id] = open_now
            else:
                self._orphans.pop(stream_id, None)
        self._evict(plan.evicted | recalled)

    def discarded(self) -> None:
        self._plan = None

    def resync(self, states: Iterable[TaskState]) -> None:
        """States folded from another writer's events (a lost race, the log follower):
        that writer kept the table; here they are only judged, and evicted when they
        hold nothing. Whom that writer served is not known here: the next pick of
        each queue writes ``last_served`` whatever it was. A lost race while the
        picks were written lazily says another writer appends: who served whom is read
        again from the picks after the checkpoint, and each append writes its picks
        from then on (the rows waiting here would go after that writer's)."""
        if self._served_with_each_append:
            self._served.clear()
        else:
            self._served_with_each_append = True
            if self._served_through is not None:
                self._unwritten = self._picks_after(self._served_through)
                self._served.update(self._unwritten)
                self._uncovered = self._uncovered or bool(self._unwritten)
        plan = _Plan()
        states = list(states)
        handed: dict[str, set[str]] = {}
        for state in states:
            for pool, from_task in state.took:
                handed.setdefault(from_task, set()).add(pool)
        for state in states:
            self._judge(plan, state, handed.get(state.task_id, ()),
                        state.updated_at or _EARLIEST)
        for task_id, pools in handed.items():
            holder = self.tasks.get(task_id)
            if holder is not None and task_id not in plan.evicted:
                self._judge(plan, holder, pools, _EARLIEST)
        self._rows -= plan.retired
        self._retiring -= plan.retired
        self._rows |= plan.inserted
        for task_id, until in plan.lingering.items():
            self._set_linger(task_id, until)
        self._evict(plan.evicted)

    # ------------------------------------------------------------ for the intake
    def known(self, task_ids: Collection[str]) -> set[str]:
        return self._store().streams_known(task_ids) if task_ids else set()

    def started(self, task_ids: Collection[str]) -> dict[str, dt.datetime]:
        return self._store().streams_started(task_ids) if task_ids else {}

    def final_states(self, task_ids: Collection[str]) -> dict[str, TaskState]:
        apart = TaskStates()
        if task_ids:
            for batch in self._store().read_streams({t: 1 for t in task_ids}):
                apart.fold(batch)
            apart.committed()
        return {t: state for t in task_ids if (state := apart.get(t)) is not None}

    def recall(self, task_ids: Collection[str]) -> None:
        missing = {t: 1 for t in task_ids if self.tasks.get(t) is None}
        if not missing:
            return
        for batch in self._store().read_streams(missing):
            self.tasks.fold(batch)
        self.tasks.committed()
        self._recalled.update(t for t in missing if self.tasks.get(t) is not None)

    # ------------------------------------------------------------ reading
    def orphan_start(self, stream_id: str) -> int | None:
        """The first version of an orphan stream with an orphan still open (None: none
        is open, nothing to read)."""
        open_now = self._orphans.get(stream_id)
        return min(open_now.values()) if open_now else None

    def served(self) -> dict[QueueKey, str]:
        return dict(self._served)

    def retiring(self) -> set[str]:
        """Retired tasks whose rows wait for their delete."""
        return set(self._retiring)

    def lingering(self) -> dict[str, dt.datetime]:
        """Tasks that hold nothing and wait out their pool's create grace."""
        return dict(self._linger_at)

    # ------------------------------------------------------------ internals
    def _store(self) -> EventStore:
        if self.store is None:
            raise RuntimeError("the live set reads the log only once attached to a store")
        return self.store

    def _judge(self, plan: _Plan, state: TaskState, handed_now: Collection[str],
               now: dt.datetime) -> None:
        task_id = state.task_id
        if state.is_terminal:
            handed_on = {*handed_now, *self.index.handed_on(task_id)}
            found, until = verdict(state, handed_on=handed_on, now=now, grace=self.grace)
        else:  # what ``verdict`` says of any task that has not ended, without its pools
            found, until = Verdict.LIVE, None
        plan.lingering[task_id] = until
        if found == Verdict.RETIRED:
            plan.evicted.add(task_id)
            if task_id in self._rows:
                plan.retired.add(task_id)
        elif task_id not in self._rows:
            plan.inserted.add(task_id)

    def _plan_served(self, plan: _Plan, recorded: Sequence[RecordedEvent]) -> None:
        for record in recorded:
            event = record.event
            if isinstance(event, ev.TaskPicked):
                state = self.tasks.get(record.stream_id)
                if state is not None:
                    plan.served[(event.cluster_id, event.topology)] = state.submission.actor
        for key, actor in list(plan.served.items()):
            if self._served.get(key) == actor:
                del plan.served[key]

    def _picks_after(self, position: int) -> dict[QueueKey, str]:
        """Who each queue served by the picks the log holds after ``position`` (those
        ``last_served`` may not hold), the tasks folded apart when they left memory."""
        picks = [(record.stream_id, record.event) for record in
                 self._store().read_after(position) if isinstance(record.event, ev.TaskPicked)]
        apart = self.final_states({s for s, _ in picks if self.tasks.get(s) is None})
        served: dict[QueueKey, str] = {}
        for stream_id, pick in picks:
            state = self.tasks.get(stream_id) or apart.get(stream_id)
            if state is not None:
                served[(pick.cluster_id, pick.topology)] = state.submission.actor
        return served

    def _plan_orphans(self, plan: _Plan, recorded: Sequence[RecordedEvent]) -> None:
        by_stream: dict[str, list[RecordedEvent]] = {}
        for record in recorded:
            if record.stream_id.startswith(ORPHAN_STREAM_PREFIX):
                by_stream.setdefault(record.stream_id, []).append(record)
        for stream_id, records in by_stream.items():
            plan.orphans[stream_id] = _open_orphans(self._orphans.get(stream_id, {}), records)

    def _set_linger(self, task_id: str, until: dt.datetime | None) -> None:
        previous = self._linger_at.pop(task_id, None)
        if previous is not None:
            self._lingering.remove((previous, task_id))
        if until is not None:
            self._linger_at[task_id] = until
            self._lingering.add((until, task_id))

    def _evict(self, task_ids: Iterable[str]) -> None:
        states = [s for t in task_ids if (s := self.tasks.get(t)) is not None]
        if not states:
            return
        self.index.forget(states)
        self.tasks.forget([s.task_id for s in states])
        for state in states:
            self._set_linger(state.task_id, None)
            self._rows.discard(state.task_id)


def _open_orphans(open_before: Mapping[OrphanKey, int],
                  records: Iterable[RecordedEvent]) -> dict[OrphanKey, int]:
    """The orphans still open after these records of one orphan stream."""
    open_now = dict(open_before)
    for record in records:
        event = record.event
        if isinstance(event, ev.OrphanPoolFound):
            open_now.setdefault((event.cluster_id, event.pool_name), record.version)
        elif isinstance(event, ev.OrphanPoolDeleted):
            open_now.pop((event.cluster_id, event.pool_name), None)
    return open_now


def _write(conn: Connection, plan: _Plan, orphans_before: Mapping[str, Mapping[OrphanKey, int]]) -> None:
    """The plan's rows, in as few statements as the dialect allows: most appends
    change nothing here (their streams were live and stay live)."""
    sqlite = conn.dialect.name == "sqlite"
    mark = "?" if sqlite else "%s"
    inserted = [(stream_id, 1) for stream_id in sorted(plan.inserted)]
    deleted = sorted(plan.deleted)
    for stream_id, open_now in plan.orphans.items():
        start = min(open_now.values()) if open_now else None
        before = orphans_before.get(stream_id)
        if start == (min(before.values()) if before else None):
            continue
        deleted.append(stream_id)
        if start is not None:
            inserted.append((stream_id, start))
    if deleted:
        batched.send(conn, f"DELETE FROM live_streams WHERE stream_id IN "
                           f"({', '.join([mark] * len(deleted))})", deleted)
    batched.send_rows(conn, f"{'INSERT OR IGNORE' if sqlite else 'INSERT IGNORE'} INTO "
                            "live_streams (stream_id, fold_from) VALUES",
                      f"({mark}, {mark})", inserted)
    batched.send_rows(conn, "INSERT INTO last_served (cluster_id, topology, actor) VALUES",
                      f"({mark}, {mark}, {mark})",
                      [(c, t, a) for (c, t), a in sorted(plan.served_rows.items())],
                      "ON CONFLICT (cluster_id, topology) DO UPDATE SET actor = excluded.actor"
                      if sqlite else "ON DUPLICATE KEY UPDATE actor = VALUES(actor)")
    if plan.served_through is not None:
        checkpoints.send(conn, SERVED_CHECKPOINT, plan.served_through, plan.at)


class _FromLog:
    """What ``from_log`` gathers while the log is folded: the live streams and their
    first version, who each queue served last, the orphans still open."""

    def __init__(self, now: dt.datetime, grace: dt.timedelta) -> None:
        self.now = now
        self.grace = grace
        self.live: dict[str, int] = {}
        self.served: dict[QueueKey, str] = {}
        self.orphans: dict[str, dict[OrphanKey, int]] = {}
        #: Holders whose pool a task took over while they were still being folded (a
        #: log from before the live set holds no multi-slice hand-over: one pool each).
        self.handed: dict[str, set[str]] = {}

    def watched(self, stream_id: str, version: int, event: ev.Event,
                state: TaskState | None) -> None:
        if isinstance(event, ev.TaskPicked) and state is not None:
            self.served[(event.cluster_id, event.topology)] = state.submission.actor
        elif isinstance(event, ev.NodePoolReused) and event.from_task:
            # The holder's last event (NodePoolRetained) usually came before: it was
            # judged live then, and is not; otherwise it is judged when it ends.
            if self.live.pop(event.from_task, None) is None:
                self.handed.setdefault(event.from_task, set()).add(event.pool_name)
        elif isinstance(event, (ev.OrphanPoolFound, ev.OrphanPoolDeleted)):
            self.orphans[stream_id] = _open_orphans(
                self.orphans.get(stream_id, {}),
                (RecordedEvent(0, stream_id, version, event, {}, self.now),))

    def finished(self, state: TaskState) -> None:
        handed_on = self.handed.pop(state.task_id, set())
        found, _ = verdict(state, handed_on=handed_on, now=self.now, grace=self.grace)
        if found != Verdict.RETIRED:
            self.live[state.task_id] = 1


def from_log(connect: Connect, *, now: dt.datetime,
             create_grace_seconds: float) -> tuple[dict[str, int], dict[QueueKey, str]]:
    """The live set of a log nobody kept one for (a database upgraded from before the
    live set): the live streams with the version to fold them from, and who each
    queue served last. One fold of the whole log, in memory bounded by the tasks in
    flight (``falcon_es.engine.log_fold``), plus the holders whose pool was taken over before
    their own stream ended."""
    gathered = _FromLog(now, dt.timedelta(seconds=create_grace_seconds))
    watch = ("TaskPicked", "NodePoolReused", "OrphanPoolFound", "OrphanPoolDeleted")
    for state in final_states(connect, watch=watch, on_watched=gathered.watched):
        gathered.finished(state)
    live = dict(gathered.live)
    for stream_id, open_now in gathered.orphans.items():
        if open_now:
            live[stream_id] = min(open_now.values())
    return live, gathered.served
