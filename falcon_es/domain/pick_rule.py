"""The pick rule and positions: one queue's waiting tasks as the rule sees them, who
gets a free slot, and the order the waiting would be picked in.

- Pick: each actor's earliest waiting task is a candidate; when several actors have
  one, the actor served last in this queue is skipped; the earliest submitted of the
  rest wins. With several base priorities, the band whose earliest task has the
  highest effective priority (after aging) is served first.
- Positions: the order in which the waiting tasks would be picked if nothing else
  arrived (the pick rule simulated forward), so a position means what it says.

Each queue keeps one FIFO per actor (a sorted list keyed by submit time, then id) and a
sorted list of the actors' heads, per base priority, so a pick costs O(log n). Pure
core; the ``QueueBook`` holds one ``QueueState`` per (cluster, topology) queue.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedList

from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.queue_places import Entry, Head, Order, QueueKey

#: How many actors' heads a TaskPicked event lists (the earliest ones); the event also
#: carries how many actors had a candidate.
CANDIDATES_RECORDED = 10

# Why a task was picked.
WHY_ONLY_WAITING = "only-waiting"
WHY_FIFO = "fifo"
WHY_ROUND_ROBIN = "round-robin"
WHY_PRIORITY = "priority"


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


class Band:
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


class QueueState:
    """One (cluster, topology) queue: its waiting tasks banded by base priority, the
    slot (and the task it is lent to), the running count."""

    __slots__ = ("bands", "borrowers", "holders", "key", "last_actor", "modes", "order",
                 "running", "waiting")

    def __init__(self, key: QueueKey) -> None:
        self.key = key
        self.bands: dict[int, Band] = {}  # base priority -> its tasks
        self.waiting: dict[str, Entry] = {}
        self.holders: set[str] = set()
        self.borrowers: set[str] = set()
        self.running: set[str] = set()
        #: How many waiting tasks ask for each supply mode (None: the cluster's default),
        #: so that whether anyone could borrow the slot is known without a look at each.
        self.modes: Counter[str | None] = Counter()
        self.last_actor: str | None = None
        #: The simulated pick order, cached: (entries, offset of the next one, the
        #: actor served last that the entries from the offset assume, the aging
        #: interval it was computed in; None while one band makes aging irrelevant).
        self.order: tuple[list[Entry], int, str | None, int | None] | None = None

    def add(self, entry: Entry) -> None:
        self.order = None
        band = self.bands.get(entry.priority)
        if band is None:
            band = self.bands[entry.priority] = Band()
        band.add(entry)
        self.waiting[entry.task_id] = entry
        self.modes[entry.supply_mode] += 1

    def remove(self, entry: Entry) -> None:
        self._advance_order(entry)
        band = self.bands[entry.priority]
        band.remove(entry)
        if not band.fifo:
            del self.bands[entry.priority]
        del self.waiting[entry.task_id]
        self.modes[entry.supply_mode] -= 1
        if not self.modes[entry.supply_mode]:
            del self.modes[entry.supply_mode]

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
        entries = list(simulate_picks(self, policy, now))
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
        return len(self.waiting) + len(self.holders) + len(self.borrowers)

    def is_empty(self) -> bool:
        return (not (self.waiting or self.holders or self.borrowers or self.running)
                and self.last_actor is None)


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


def choose_head(candidates: Sequence[Head], last: str | None) -> tuple[Head, bool]:
    """Today's rule on the candidates (sorted earliest first): the earliest, unless its
    actor was served last and another actor has one. Returns (winner, skipped)."""
    first = candidates[0]
    if first[2] == last:
        for head in candidates[1:]:
            if head[2] != last:
                return head, True
    return first, False


_Lane = list[tuple[Order, str, int]]  # a band's heap of (order, actor, index in FIFO)


def simulate_picks(queue: QueueState, policy: PriorityPolicy, now: dt.datetime) -> Iterator[Entry]:
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
    chosen, _ = choose_head([(o[0], o[1], a) for o, a, _ in heads], last)
    for order, actor, base in heads:
        if order[1] == chosen[1]:
            return base, lanes[base]
    raise AssertionError("the chosen head is in no lane")
