"""The scheduling policy: cluster choice, the queue book, the pick rule, positions.

Pure core: no database, no handlers. ``QueueBook`` is the controller's in-memory index
of every live task's place in the (cluster, topology) queues. It is updated
incrementally from task states (``sync``), never rebuilt per tick, so a pick costs
O(log n): each queue keeps one FIFO per actor (a sorted list keyed by submit time,
then id) and a sorted list of the actors' heads.

The rules (see docs/explanation/scheduling.md):

- Cluster choice: candidates are the active clusters of the task's TPU type. A cluster
  holding an idle, retained pool of the task's topology wins; otherwise the one where
  the fewest would be ahead of it (the slot holder and the waiting tasks of its
  priority or higher); ties go to the cluster name, then its id.
- One acquisition slot per queue. A task takes it when picked and keeps it until it is
  Running or terminal. A slot holder being aborted keeps the slot until the abort ends
  (its pool create or Job submit may still be in flight).
- Pick: each actor's earliest waiting task is a candidate; when several actors have
  one, the actor served last in this queue is skipped; the earliest submitted of the
  rest wins.
- Positions: the order in which the waiting tasks would be picked if nothing else
  arrived (the pick rule simulated forward), so a position means what it says.

Handlers mutate the book speculatively while a tick decides (so later decisions in
the same tick see earlier ones); every mutation is journaled, ``commit`` forgets the
journal once the tick's events are durable and ``rollback`` restores the book when
they are not.
"""

from __future__ import annotations

import dataclasses
import enum
import datetime as dt
import heapq
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedList

from falcon_es.domain import chart
from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.spec import RESERVATION
from falcon_es.domain.task import TaskState

QueueKey = tuple[str, str]  # (cluster_id, topology)
Order = tuple[dt.datetime, str]  # (submitted_at, task_id): FIFO order within an actor

ACTIVE = "active"
#: How many actors' heads a TaskPicked event lists (the earliest ones); the event also
#: carries how many actors had a candidate.
CANDIDATES_RECORDED = 10

# Why a cluster won.
WHY_IDLE_POOL = "idle-pool"
WHY_QUEUE_DEPTH = "queue-depth"
WHY_ONLY_CANDIDATE = "only-candidate"
WHY_TIE_BREAK = "tie-break"
# Why a task was picked.
WHY_ONLY_WAITING = "only-waiting"
WHY_FIFO = "fifo"
WHY_ROUND_ROBIN = "round-robin"
WHY_PRIORITY = "priority"



class Placement(enum.StrEnum):
    """Where a task sits in the book."""

    UNPLACED = "unplaced"  # Pending/Waiting, no cluster chosen yet (keyed by TPU type)
    WAITING = "waiting"  # Pending/Waiting in a queue
    SLOT = "slot"  # holds its queue's acquisition slot
    RUNNING = "running"


_EPOCH = dt.datetime(1970, 1, 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """What the scheduler needs to know about one task."""

    task_id: str
    actor: str
    name: str
    submitted_at: dt.datetime
    tpu_type: str
    topology: str
    order: Order  # (submitted_at, task_id), kept so the hot paths build no tuples
    priority: int = 0  # the base priority (aging is worked out when picking)

    @classmethod
    def of(cls, state: TaskState) -> Entry:
        submitted = state.submitted_at or _EPOCH
        return cls(state.task_id, state.actor, state.name, submitted, state.tpu_type,
                   state.topology, (submitted, state.task_id), state.priority)


Place = tuple[str, Any]  # (kind, QueueKey or TPU type)


def place_of(state: TaskState, current: Place | None) -> Place | None:
    """Where a task in ``state`` belongs, given where the book has it now."""
    status = state.status
    if status == chart.PENDING:
        reason = state.reason
        if reason == "Waiting":
            if state.cluster_id is None:
                return (Placement.UNPLACED, state.tpu_type)
            return (Placement.WAITING, (state.cluster_id, state.topology))
        if reason in chart.SLOT_REASONS and state.cluster_id is not None:
            return (Placement.SLOT, (state.cluster_id, state.topology))
        return None
    if status == chart.RUNNING and state.cluster_id is not None:
        return (Placement.RUNNING, (state.cluster_id, state.topology))
    if status == chart.ABORTING:
        if current is not None and current[0] == Placement.SLOT:
            return current
        if current is None and state.cluster_id is not None and _aborted_in_slot(state):
            # Placed from its state alone (a controller starting from the live set): it
            # held the slot when the abort came, and keeps it until the abort ends.
            return (Placement.SLOT, (state.cluster_id, state.topology))
    return None


def _aborted_in_slot(state: TaskState) -> bool:
    status, _, reason = (state.abort_phase or "").partition("/")
    return status == chart.PENDING and reason in chart.SLOT_REASONS


# --------------------------------------------------------------------- decisions


@dataclasses.dataclass(frozen=True)
class PickDecision:
    """The winner of a free slot and why; ``candidates()`` writes the record of the
    heads considered (for TaskPicked), kept out of the decision itself."""

    queue: QueueKey
    winner: Entry
    why: str
    actors_waiting: int
    last_actor: str | None
    heads: tuple[Head, ...]  # the earliest heads of the bands served, at most 10
    names: tuple[str, ...]
    #: The effective priority served and every band compared: (base, effective,
    #: waiting) per base priority waiting in the queue, highest base first.
    effective: int = 0
    bands: tuple[tuple[int, int, int], ...] = ()

    def candidates(self) -> tuple[dict[str, Any], ...]:
        skip = self.actors_waiting > 1
        return tuple(
            {"task_id": task_id, "actor": actor, "name": name,
             "submitted_at": submitted.isoformat(),
             **({"skipped": "served last"} if skip and actor == self.last_actor else {})}
            for (submitted, task_id, actor), name in zip(self.heads, self.names)
        )

    def priorities(self) -> tuple[dict[str, int], ...]:
        """The bands compared, for the TaskPicked record."""
        return tuple({"priority": base, "effective": level, "waiting": count}
                     for base, level, count in self.bands)


@dataclasses.dataclass(frozen=True)
class ClusterChoice:
    cluster: Cluster
    why: str
    candidates: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class NoMatch:
    """No cluster can take the task, which fails: none of the TPU type is registered,
    or the task asked for a reservation and no cluster of its type has one
    (``without_reservation`` names the clusters of the type then)."""

    registered_tpu_types: tuple[str, ...]
    supply_mode: str | None = None
    without_reservation: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NoneActive:
    """Clusters of the TPU type exist but none is active: the task keeps waiting."""

    clusters: tuple[dict[str, Any], ...]


def choose_cluster(
    tpu_type: str,
    topology: str,
    clusters: Sequence[Cluster],
    depth: Callable[[QueueKey], int],
    idle_pools: Collection[QueueKey],
    supply_mode: str | None = None,
) -> ClusterChoice | NoMatch | NoneActive:
    """Pick the cluster for a task; ``depth(key)`` is the number of tasks that would be
    ahead of it in a (cluster, topology) queue (``QueueBook.ahead``); ``idle_pools`` holds the queues where an
    idle, retained pool of that topology sits. A task that asks for the reservation
    supply mode goes only to clusters with a default reservation: elsewhere its pool
    could never be created. It waits while those are all inactive, and fails when its
    TPU type has none."""
    of_type = [c for c in clusters if c.tpu_type == tpu_type]
    if not of_type:
        return NoMatch(tuple(sorted({c.tpu_type for c in clusters})))
    if supply_mode == RESERVATION:
        reserved = [c for c in of_type if c.default_reservation]
        if not reserved:
            return NoMatch(tuple(sorted({c.tpu_type for c in clusters})), supply_mode,
                           tuple(sorted(c.name for c in of_type)))
        of_type = reserved
    active = [c for c in of_type if c.status == ACTIVE]
    if not active:
        return NoneActive(tuple({"name": c.name, "status": c.status}
                                for c in sorted(of_type, key=lambda c: (c.name, c.id))))
    rows = []
    for cluster in sorted(active, key=lambda c: (c.name, c.id)):
        key = (cluster.id, topology)
        rows.append((cluster, depth(key), key in idle_pools))
    candidates = tuple({"cluster_id": c.id, "name": c.name, "queued": queued, "idle_pool": idle}
                       for c, queued, idle in rows)
    if len(rows) == 1:
        return ClusterChoice(rows[0][0], WHY_ONLY_CANDIDATE, candidates)
    with_pool = [r for r in rows if r[2]]
    if with_pool:
        best = min(with_pool, key=lambda r: (r[1], r[0].name, r[0].id))
        return ClusterChoice(best[0], WHY_IDLE_POOL, candidates)
    fewest = min(r[1] for r in rows)
    best_rows = [r for r in rows if r[1] == fewest]
    why = WHY_QUEUE_DEPTH if len(best_rows) == 1 else WHY_TIE_BREAK
    return ClusterChoice(best_rows[0][0], why, candidates)


#: A slot holder in one of these states that long makes its queue's waiting tasks
#: candidates to move (the world, not the queue, is what holds them up).
STUCK_REASONS = (chart.PendingReason.CLUSTER_BUSY, chart.PendingReason.WAITING_FOR_NODE)


def move_target(tpu_type: str, topology: str, from_cluster: str, clusters: Sequence[Cluster],
                book: QueueBook, supply_mode: str | None) -> Cluster | None:
    """Where a waiting task of a stuck queue would start at once: another active
    cluster of its TPU type (with a reservation when the task asks for one) whose queue
    for its topology has nobody waiting and the slot free; the first by name."""
    for cluster in sorted(clusters, key=lambda c: (c.name, c.id)):
        if (cluster.id == from_cluster or cluster.tpu_type != tpu_type
                or cluster.status != ACTIVE
                or (supply_mode == RESERVATION and not cluster.default_reservation)):
            continue
        key = (cluster.id, topology)
        if not book.holders(key) and not book.waiting_count(key):
            return cluster
    return None


# --------------------------------------------------------------------- priority requests


@dataclasses.dataclass(frozen=True)
class PriorityChange:
    """A request that applies: the task's base priority goes from ``old`` to ``new``."""

    old: int
    new: int


@dataclasses.dataclass(frozen=True)
class PriorityRefused:
    """A request that cannot apply, and why (for the requester)."""

    why: str


def judge_priority_request(task_id: str, state: TaskState | None, requested: object,
                           policy: PriorityPolicy) -> PriorityChange | PriorityRefused | None:
    """Whether the upper layer's request for ``requested`` (an integer or a class
    name) changes the task's priority. Only a waiting task's can change: a priority
    orders the waiting, and a task that holds a slot or runs has been served. None when
    the task already has that priority (nothing to record: also a request applied
    before and read again)."""
    try:
        new = policy.resolve(requested)
    except ValueError as error:
        return PriorityRefused(f"priority {error}")
    if state is None:
        return PriorityRefused(f"Falcon-ES has no task {task_id} (not taken in yet, or its "
                               "row is not a task); only a waiting task's priority can change")
    if new == state.priority:
        return None
    where = state.status if state.reason is None else f"{state.status}/{state.reason}"
    if state.is_terminal:
        return PriorityRefused(f"task {task_id} has ended ({where}); only a waiting task's "
                               "priority can change")
    if state.status != chart.PENDING or state.reason != chart.PendingReason.WAITING:
        return PriorityRefused(f"task {task_id} is {where}, no longer waiting (it was "
                               "picked already); only a waiting task's priority can change")
    return PriorityChange(state.priority, new)


# --------------------------------------------------------------------- the queues

Head = tuple[dt.datetime, str, str]  # (submitted_at, task_id, actor): an actor's earliest


class _Band:
    """The waiting tasks of one base priority in one queue: per-actor FIFOs and the
    sorted list of their heads (today's rule works on these)."""

    __slots__ = ("count", "fifo", "heads")

    def __init__(self) -> None:
        self.fifo: dict[str, SortedList] = {}  # actor -> SortedList[Order]
        self.heads: SortedList = SortedList()  # Head
        self.count = 0

    def add(self, entry: Entry) -> None:
        self.count += 1
        fifo = self.fifo.get(entry.actor)
        order = entry.order
        if fifo is None:
            fifo = self.fifo[entry.actor] = SortedList()
        elif order < fifo[0]:
            self.heads.remove((*fifo[0], entry.actor))
        else:
            fifo.add(order)
            return
        fifo.add(order)
        self.heads.add((*order, entry.actor))

    def remove(self, entry: Entry) -> None:
        self.count -= 1
        fifo = self.fifo[entry.actor]
        order = entry.order
        was_head = fifo[0] == order
        fifo.remove(order)
        if not was_head:
            return
        self.heads.remove((*order, entry.actor))
        if fifo:
            self.heads.add((*fifo[0], entry.actor))
        else:
            del self.fifo[entry.actor]


class _Queue:
    """One (cluster, topology) queue: its waiting tasks banded by base priority, the
    slot, the running count."""

    __slots__ = ("bands", "holders", "key", "last_actor", "order", "running", "waiting")

    def __init__(self, key: QueueKey) -> None:
        self.key = key
        self.bands: dict[int, _Band] = {}  # base priority -> its tasks
        self.waiting: dict[str, Entry] = {}
        self.holders: set[str] = set()
        self.running: set[str] = set()
        self.last_actor: str | None = None
        #: The simulated pick order, cached: (entries, offset of the next one, the
        #: actor served last that the entries from the offset assume, the aging
        #: interval it was computed in; None while one band makes aging irrelevant).
        self.order: tuple[list[Entry], int, str | None, int | None] | None = None

    def add(self, entry: Entry) -> None:
        self.order = None
        band = self.bands.get(entry.priority)
        if band is None:
            band = self.bands[entry.priority] = _Band()
        band.add(entry)
        self.waiting[entry.task_id] = entry

    def remove(self, entry: Entry) -> None:
        self._advance_order(entry)
        band = self.bands[entry.priority]
        band.remove(entry)
        if not band.fifo:
            del self.bands[entry.priority]
        del self.waiting[entry.task_id]

    def _advance_order(self, entry: Entry) -> None:
        """Removing the task the simulation takes next leaves exactly the state after
        that pick (same waiting tasks, that task's actor served last), so the rest of
        the cached order stays valid; any other removal invalidates it."""
        cached = self.order
        if cached is not None:
            entries, offset, _, epoch = cached
            if offset < len(entries) and entries[offset] is entry:
                self.order = (entries, offset + 1, entry.actor, epoch)
                return
        self.order = None

    def pick_order(self, policy: PriorityPolicy, now: dt.datetime) -> list[Entry]:
        epoch = policy.epoch(now) if len(self.bands) > 1 else None
        cached = self.order
        if cached is not None and cached[2] == self.last_actor and cached[3] == epoch:
            entries, offset, _, _ = cached
            return entries[offset:]
        entries = list(_simulate(self, policy, now))
        self.order = (entries, 0, self.last_actor, epoch)
        return entries[:]

    def tied(self, policy: PriorityPolicy, now: dt.datetime) -> tuple[int, list[int]]:
        """The highest effective priority among the bands (a band ages as its earliest
        task) and the bands that have it, highest base first."""
        bands = self.bands
        if len(bands) == 1:
            (base,) = bands
            return policy.effective(base, bands[base].heads[0][0], now), [base]
        return _highest((base, policy.effective(base, bands[base].heads[0][0], now))
                        for base in sorted(bands, reverse=True))

    @property
    def depth(self) -> int:
        return len(self.waiting) + len(self.holders)

    def is_empty(self) -> bool:
        return not (self.waiting or self.holders or self.running) and self.last_actor is None


def _highest(levels: Iterable[tuple[int, int]]) -> tuple[int, list[int]]:
    """Of (base, effective) pairs, the highest effective and the bases that have it."""
    best = 0
    tied: list[int] = []
    for base, level in levels:
        if not tied or level > best:
            best, tied = level, [base]
        elif level == best:
            tied.append(base)
    return best, tied


def _choose(candidates: Sequence[Head], last: str | None) -> tuple[Head, bool]:
    """Today's rule on the candidates (sorted earliest first): the earliest, unless its
    actor was served last and another actor has one. Returns (winner, skipped)."""
    first = candidates[0]
    if first[2] == last:
        for head in candidates[1:]:
            if head[2] != last:
                return head, True
    return first, False


@dataclasses.dataclass(frozen=True)
class QueueSnapshot:
    """One queue as the view shows it."""

    key: QueueKey
    holders: tuple[str, ...]
    waiting: tuple[Entry, ...]  # in pick order
    running: int
    last_actor: str | None


class QueueBook:
    """Every live task's place in the queues, with an undo journal per tick."""

    def __init__(self, policy: PriorityPolicy = PriorityPolicy()) -> None:
        self.policy = policy
        self._where: dict[str, tuple[Place, Entry]] = {}
        self._queues: dict[QueueKey, _Queue] = {}
        self._unplaced: dict[str, dict[str, Entry]] = {}
        self._idle_pools: dict[str, QueueKey] = {}  # pool name -> queue
        self._undo_tasks: dict[str, tuple[Place, Entry] | None] = {}
        self._undo_last: dict[QueueKey, str | None] = {}
        self._undo_pools: dict[str, QueueKey | None] = {}
        self._owner: object = None
        #: Queues whose pick order changed since their positions were last written.
        self.changed: set[QueueKey] = set()

    # ---------------------------------------------------------------- journal
    def begin(self, owner: object) -> None:
        """Start deciding for ``owner`` (a tick); leftovers of an earlier owner whose
        events never reached the log are rolled back first."""
        if self._owner is not owner:
            self.rollback()
            self._owner = owner

    def commit(self) -> None:
        self._undo_tasks.clear()
        self._undo_last.clear()
        self._undo_pools.clear()
        self._owner = None

    def rollback(self) -> None:
        for task_id, previous in self._undo_tasks.items():
            self._move(task_id, previous)
        for key, actor in self._undo_last.items():
            self._queue(key).last_actor = actor
            self.changed.add(key)
        for pool, pool_key in self._undo_pools.items():
            if pool_key is None:
                self._idle_pools.pop(pool, None)
            else:
                self._idle_pools[pool] = pool_key
        self.commit()

    # ---------------------------------------------------------------- updates
    def sync(self, state: TaskState) -> None:
        """Put the task where its state says it belongs (idempotent)."""
        current = self._where.get(state.task_id)
        target = place_of(state, current[0] if current else None)
        if target is None:
            if current is not None:
                self._journal(state.task_id, current)
                self._move(state.task_id, None)
            return
        if current is not None and current[0] == target:
            if current[1].priority == state.priority:
                return
            entry = dataclasses.replace(current[1], priority=state.priority)
            self._journal(state.task_id, current)
            self._move(state.task_id, None)
            self._move(state.task_id, (target, entry))
            return
        entry = current[1] if current is not None else Entry.of(state)
        self._journal(state.task_id, current)
        self._move(state.task_id, (target, entry))

    def mark_aged(self, now: dt.datetime) -> None:
        """Mark changed the queues whose order aging may have changed: those with more
        than one base priority whose order was computed in an earlier interval."""
        epoch = self.policy.epoch(now)
        for key, queue in self._queues.items():
            cached = queue.order
            if len(queue.bands) > 1 and (cached is None or cached[3] != epoch):
                self.changed.add(key)

    def served(self, key: QueueKey, actor: str) -> None:
        queue = self._queue(key)
        if queue.last_actor == actor:
            return
        self._undo_last.setdefault(key, queue.last_actor)
        queue.last_actor = actor
        self.changed.add(key)

    def pool_retained(self, pool_name: str, key: QueueKey) -> None:
        self._undo_pools.setdefault(pool_name, self._idle_pools.get(pool_name))
        self._idle_pools[pool_name] = key

    def pool_gone(self, pool_name: str) -> None:
        if pool_name in self._idle_pools:
            self._undo_pools.setdefault(pool_name, self._idle_pools[pool_name])
            del self._idle_pools[pool_name]

    def _journal(self, task_id: str, current: tuple[Place, Entry] | None) -> None:
        if task_id not in self._undo_tasks:
            self._undo_tasks[task_id] = current

    def _move(self, task_id: str, target: tuple[Place, Entry] | None) -> None:
        current = self._where.pop(task_id, None)
        if current is not None:
            (kind, key), entry = current
            if kind == Placement.UNPLACED:
                group = self._unplaced[key]
                del group[task_id]
                if not group:
                    del self._unplaced[key]
            else:
                queue = self._queues[key]
                if kind == Placement.WAITING:
                    queue.remove(entry)
                    self.changed.add(key)
                elif kind == Placement.SLOT:
                    queue.holders.discard(task_id)
                else:
                    queue.running.discard(task_id)
                if queue.is_empty():
                    del self._queues[key]
        if target is None:
            return
        (kind, key), entry = target
        self._where[task_id] = target
        if kind == Placement.UNPLACED:
            self._unplaced.setdefault(key, {})[task_id] = entry
            return
        queue = self._queue(key)
        if kind == Placement.WAITING:
            queue.add(entry)
            self.changed.add(key)
        elif kind == Placement.SLOT:
            queue.holders.add(task_id)
        else:
            queue.running.add(task_id)

    def _queue(self, key: QueueKey) -> _Queue:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue(key)
        return queue

    # ---------------------------------------------------------------- reading
    def place(self, task_id: str) -> Place | None:
        found = self._where.get(task_id)
        return found[0] if found else None

    def depth(self, key: QueueKey) -> int:
        queue = self._queues.get(key)
        return queue.depth if queue else 0

    def ahead(self, key: QueueKey, priority: int) -> int:
        """How many a newcomer of ``priority`` would find ahead of it in the queue: the
        slot holder and the waiting tasks of its priority or higher. O(b)."""
        queue = self._queues.get(key)
        if queue is None:
            return 0
        return len(queue.holders) + sum(band.count for base, band in queue.bands.items()
                                        if base >= priority)

    def idle_pools(self, key: QueueKey) -> int:
        """Retained pools of the queue that no task took yet."""
        return sum(1 for owner in self._idle_pools.values() if owner == key)

    def idle_pool_queues(self) -> frozenset[QueueKey]:
        return frozenset(self._idle_pools.values())

    def queue_keys(self) -> list[QueueKey]:
        return sorted(self._queues)

    def free_queues(self) -> list[QueueKey]:
        """Queues with waiting tasks and nobody holding the slot, in a stable order."""
        return sorted(k for k, q in self._queues.items() if q.waiting and not q.holders)

    def waiting_queues(self) -> list[QueueKey]:
        return sorted(k for k, q in self._queues.items() if q.waiting)

    def waiting(self, key: QueueKey) -> list[Entry]:
        """The queue's waiting tasks in submit order."""
        queue = self._queues.get(key)
        return sorted(queue.waiting.values(), key=lambda e: e.order) if queue else []

    def waiting_count(self, key: QueueKey) -> int:
        queue = self._queues.get(key)
        return len(queue.waiting) if queue else 0

    def holders(self, key: QueueKey) -> tuple[str, ...]:
        queue = self._queues.get(key)
        return tuple(sorted(queue.holders)) if queue else ()

    def running(self, key: QueueKey) -> int:
        queue = self._queues.get(key)
        return len(queue.running) if queue else 0

    def last_actor(self, key: QueueKey) -> str | None:
        queue = self._queues.get(key)
        return queue.last_actor if queue else None

    def unplaced(self) -> dict[str, list[Entry]]:
        """Tasks with no cluster yet, per TPU type, in submit order."""
        return {t: sorted(g.values(), key=lambda e: e.order)
                for t, g in sorted(self._unplaced.items())}

    def waiting_total(self) -> int:
        return sum(len(q.waiting) for q in self._queues.values())

    # ---------------------------------------------------------------- the rule
    def decide(self, key: QueueKey, now: dt.datetime) -> PickDecision | None:
        """Who gets this queue's slot at ``now``: the band (base priority) whose
        earliest task has the highest effective priority, and within it (or across
        the bands tied with it) today's rule. O(b log n) for b bands, no mutation."""
        queue = self._queues.get(key)
        if queue is None or not queue.waiting:
            return None
        level, tied = queue.tied(self.policy, now)
        bands = queue.bands
        if len(tied) == 1:
            heads = bands[tied[0]].heads
            recorded = tuple(heads.islice(0, CANDIDATES_RECORDED))
            actors = len(heads)
        else:
            recorded = tuple(sorted(h for b in tied
                                    for h in bands[b].heads.islice(0, CANDIDATES_RECORDED))
                             )[:CANDIDATES_RECORDED]
            actors = len({h[2] for b in tied for h in bands[b].heads})
        # The earliest head of another actor than the last served is a band's first
        # or second (one head per actor in a band).
        chosen, skipped = _choose(recorded[:2] if len(tied) == 1 else sorted(
            h for b in tied for h in bands[b].heads.islice(0, 2)), queue.last_actor)
        if skipped:
            why = WHY_ROUND_ROBIN
        elif len(tied) < len(bands):
            why = WHY_PRIORITY
        else:
            why = WHY_ONLY_WAITING if len(queue.waiting) == 1 else WHY_FIFO
        waiting = queue.waiting
        compared = tuple(
            (base, self.policy.effective(base, bands[base].heads[0][0], now), bands[base].count)
            for base in sorted(bands, reverse=True))
        return PickDecision(key, waiting[chosen[1]], why, actors, queue.last_actor,
                            recorded, tuple(waiting[h[1]].name for h in recorded),
                            level, compared)

    def pick_order(self, key: QueueKey, now: dt.datetime) -> list[Entry]:
        """The waiting tasks in the order the pick rule would take them at ``now`` if
        nothing else arrived: O(n (b + log a)) for n tasks of a actors in b bands, and a
        list copy after a pick (a pick takes the order's first task, the rest stays
        valid until the aging grid's next interval)."""
        queue = self._queues.get(key)
        if queue is None:
            return []
        return queue.pick_order(self.policy, now)

    def snapshot(self, key: QueueKey, now: dt.datetime) -> QueueSnapshot:
        return QueueSnapshot(key, self.holders(key), tuple(self.pick_order(key, now)),
                             self.running(key), self.last_actor(key))

    def check(self, now: dt.datetime) -> None:
        """Raise AssertionError if an internal invariant is broken (tests use it)."""
        for key, queue in self._queues.items():
            assert len(queue.holders) <= 1, f"queue {key} has holders {queue.holders}"
            count = 0
            for base, band in queue.bands.items():
                assert band.fifo, f"queue {key}: band {base} is empty"
                assert len(band.heads) == len(band.fifo), f"queue {key}: heads and FIFOs differ"
                for actor, fifo in band.fifo.items():
                    assert (*fifo[0], actor) in band.heads
                    assert all(queue.waiting[o[1]].priority == base for o in fifo)
                    count += len(fifo)
                assert band.count == sum(len(f) for f in band.fifo.values())
            assert count == len(queue.waiting)
            fresh = list(_simulate(queue, self.policy, now))
            assert queue.pick_order(self.policy, now) == fresh, (
                f"queue {key}: cached pick order is stale")


_Lane = list[tuple[Order, str, int]]  # a band's heap of (order, actor, index in FIFO)


def _simulate(queue: _Queue, policy: PriorityPolicy, now: dt.datetime) -> Iterator[Entry]:
    """Run the pick rule forward at ``now`` (effective priorities as they stand then).
    One band is the rule of old on a heap of the actors' heads, O(n log a); with more,
    each step first finds the bands whose earliest task has the highest effective
    priority, O(n (b + log a)). An actor's FIFO is copied to a list only when the
    simulation reaches its second task."""
    waiting = queue.waiting
    last = queue.last_actor
    lanes: dict[int, _Lane] = {
        base: [((submitted, task_id), actor, 0) for submitted, task_id, actor in band.heads]
        for base, band in queue.bands.items()}
    copies: dict[tuple[int, str], list[Order]] = {}
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    single = len(lanes) == 1
    while lanes:
        if single:
            (base, heap), = lanes.items()
        else:
            base, heap = _served_lane(lanes, policy, now, last)
        if heap[0][1] == last and len(heap) > 1:
            skipped = pop(heap)
            order, actor, index = replace(heap, skipped)
        else:
            order, actor, index = pop(heap)
        yield waiting[order[1]]
        last = actor
        index += 1
        fifo = queue.bands[base].fifo[actor]
        if index < len(fifo):
            copy = copies.get((base, actor))
            if copy is None:
                copy = copies[(base, actor)] = list(fifo)
            push(heap, (copy[index], actor, index))
        if not heap:
            del lanes[base]


def _served_lane(lanes: dict[int, _Lane], policy: PriorityPolicy, now: dt.datetime,
                 last: str | None) -> tuple[int, _Lane]:
    """The band the next pick serves: of those whose earliest task has the highest
    effective priority, the one holding today's rule's winner among their heads."""
    _, tied = _highest((base, policy.effective(base, heap[0][0][0], now))
                       for base, heap in lanes.items())
    if len(tied) == 1:
        return tied[0], lanes[tied[0]]
    # Each lane's earliest head, and its second when the earliest is the last actor's
    # (the second smallest of a heap is one of its first three entries).
    heads: list[tuple[Order, str, int]] = []
    for base in tied:
        heap = lanes[base]
        heads.append((heap[0][0], heap[0][1], base))
        if heap[0][1] == last and len(heap) > 1:
            second = min(heap[1:3])
            heads.append((second[0], second[1], base))
    heads.sort()
    chosen, _ = _choose([(o[0], o[1], a) for o, a, _ in heads], last)
    for order, actor, base in heads:
        if order[1] == chosen[1]:
            return base, lanes[base]
    raise AssertionError("the chosen head is in no lane")
