"""The queue book: every live task's place in the scheduler's queues.

Pure core: no database, no handlers. ``QueueBook`` is the controller's in-memory index
of every live task's place in the (cluster, topology) queues. It is updated
incrementally from task states (``sync``), never rebuilt per tick, so a pick costs
O(log n) (``pick_rule``: one FIFO per actor and the actors' heads, per priority band).
The scheduling policy around it: ``cluster_choice`` (which cluster a task queues on),
``pick_rule`` (who gets a free slot, and positions), ``queue_places`` (where a task
state belongs), ``priority_requests``.

The book's own rule (the whole policy: docs/explanation/scheduling.md): one acquisition slot per queue. A task takes it when picked and
keeps it until it is Running or terminal. A slot holder being aborted keeps the slot
until the abort ends (its pool create or Job submit may still be in flight). A holder
stuck on its reservation may lend the slot (``slot_loans``): the borrower is kept
apart from the holder, at most one per queue, and the slot is free again once the
holder leaves it, whether or not its borrower still acquires.

Handlers mutate the book speculatively while a tick decides (so later decisions in
the same tick see earlier ones); every mutation is journaled, ``commit`` forgets the
journal once the tick's events are durable and ``rollback`` restores the book when
they are not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from falcon_es.domain.pick_rule import (
    CANDIDATES_RECORDED, WHY_FIFO, WHY_ONLY_WAITING, WHY_PRIORITY, WHY_ROUND_ROBIN,
    PickDecision, QueueState, choose_head, simulate_picks,
)
from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.queue_places import Entry, Place, Placement, QueueKey, place_of
from falcon_es.domain.task import TaskState


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
        self._queues: dict[QueueKey, QueueState] = {}
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
            if current[1].priority == state.submission.priority:
                return
            entry = dataclasses.replace(current[1], priority=state.submission.priority)
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
                elif kind == Placement.BORROWED:
                    queue.borrowers.discard(task_id)
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
        elif kind == Placement.BORROWED:
            queue.borrowers.add(task_id)
        else:
            queue.running.add(task_id)

    def _queue(self, key: QueueKey) -> QueueState:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = QueueState(key)
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
        slot holder (and its borrower) and the waiting tasks of its priority or higher. O(b)."""
        queue = self._queues.get(key)
        if queue is None:
            return 0
        return len(queue.holders) + len(queue.borrowers) + sum(band.count for base, band in queue.bands.items()
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

    def borrowers(self, key: QueueKey) -> tuple[str, ...]:
        """The task acquiring on the slot its queue's holder lent it (one at most)."""
        queue = self._queues.get(key)
        return tuple(sorted(queue.borrowers)) if queue else ()

    def lending_queues(self) -> list[QueueKey]:
        """Queues whose slot has a holder and no borrower, with tasks waiting."""
        return sorted(k for k, q in self._queues.items()
                      if q.holders and not q.borrowers and q.waiting)

    def asked_modes(self, key: QueueKey) -> frozenset[str | None]:
        """The supply modes the queue's waiting tasks ask for (None: the cluster's
        default), so that whether anyone could borrow is known without a look at each."""
        queue = self._queues.get(key)
        return frozenset(queue.modes) if queue else frozenset()

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
        chosen, skipped = choose_head(recorded[:2] if len(tied) == 1 else sorted(
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
            assert len(queue.borrowers) <= 1, f"queue {key} has borrowers {queue.borrowers}"
            assert sum(queue.modes.values()) == len(queue.waiting), f"queue {key}: modes"
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
            fresh = list(simulate_picks(queue, self.policy, now))
            assert queue.pick_order(self.policy, now) == fresh, (
                f"queue {key}: cached pick order is stale")
