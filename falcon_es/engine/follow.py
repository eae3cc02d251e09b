"""Keep a controller's in-memory views on the log when someone else appends to it.

One active controller is the rule (a Lease, or the database lock). When a second one
appends anyway (two replicas with ``--leader-election none``, a lease misconfigured),
the log's optimistic concurrency still refuses every append made on a stale version
of a task stream. That alone is not enough: a controller that never reads the other's
events decides on a world it does not know, and decisions that append to streams of
their own (the orphan sweep) would delete a pool another controller's task is using.
So before each tick the controller looks at the log head; if it moved past its own
appends, it folds the other writer's events into its task states, queue book and
effect index, and says loudly that a second writer exists.

Own appends are recognised without reading them back: the follower is also an inline
projection, so it sees each commit's positions and moves its cursor over them when
they follow on directly. Events folded already (a stream reloaded after a lost race)
are told apart by the stream version and not folded twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.live_set import LiveSet
from falcon_es.domain.queue_book import QueueBook
from falcon_es.storage.store import EventStore, RecordedEvent
from falcon_es.domain.task import TASK_EVENT_TYPES
from falcon_es.domain.task_states import Change, TaskStates

log = logging.getLogger("falcon_es.engine.follow")

#: Events read per batch while catching up.
FOLLOW_BATCH = 2000


class QueueFold(Protocol):
    """The queue view as the follower feeds it (``projections.queues.QueueView``)."""

    book: QueueBook

    def fold(self, changes: Sequence[Change], recorded: Sequence[RecordedEvent]) -> None: ...


class LogFollower:
    """Folds other writers' events; ``position`` is the last seq the views include.

    Built with the task states (it is one of the store's inline projections, so it
    exists before the store); ``attach`` gives it the store and the views to keep
    current once the app is open.
    """

    def __init__(self, tasks: TaskStates) -> None:
        self.tasks = tasks
        self.store: EventStore | None = None
        self.queues: QueueFold | None = None
        self.index: LifecycleIndex | None = None
        self.live: LiveSet | None = None
        self.position = 0
        self._pending: tuple[int, int] | None = None
        #: Events other writers appended that this controller folded.
        self.foreign_events = 0

    def attach(self, store: EventStore, *, position: int, queues: QueueFold | None = None,
               index: LifecycleIndex | None = None, live: LiveSet | None = None) -> None:
        """Read ``position`` (the head) before the log is folded at start: events
        appended meanwhile are read again and told apart by version, never missed."""
        self.store, self.position, self.queues, self.index = store, position, queues, index
        self.live = live

    # ------------------------------------------------------ as an inline projection
    def apply(self, conn: Any, recorded: Sequence[RecordedEvent]) -> None:
        if recorded:
            self._pending = (recorded[0].seq, recorded[-1].seq)

    def committed(self) -> None:
        if self._pending is not None and self._pending[0] == self.position + 1:
            self.position = self._pending[1]
        self._pending = None

    def discarded(self) -> None:
        self._pending = None

    # ------------------------------------------------------ before each tick
    def catch_up(self) -> int:
        """Fold what others appended since ``position``; returns how many events."""
        if self.store is None or self.store.head() <= self.position:
            return 0
        folded = 0
        for batch in self.store.read_batches(self.position, batch_size=FOLLOW_BATCH):
            folded += self._fold(batch)
            self.position = batch[-1].seq
        if folded:
            self.foreign_events += folded
            log.warning("another controller appended %d event(s) to this log (now at %d); "
                        "folded them. Run one active controller: --leader-election lease for "
                        "several replicas", folded, self.position)
        return folded

    def _fold(self, batch: Sequence[RecordedEvent]) -> int:
        fresh: list[RecordedEvent] = []
        ahead: dict[str, int] = {}  # stream -> version the staged fresh events reach
        known: dict[str, None] = {}
        gaps: dict[str, None] = {}
        retired: set[str] = set()
        for record in batch:
            if record.type_name not in TASK_EVENT_TYPES or record.stream_id in gaps:
                continue
            stream_id = record.stream_id
            if stream_id not in ahead:
                state = self.tasks.get(stream_id)
                ahead[stream_id] = state.version if state is not None else 0
                if state is None and record.version > 1:
                    retired.add(stream_id)  # left memory here: its start is in the log
            if record.version <= ahead[stream_id]:
                known.setdefault(stream_id)
            elif record.version == ahead[stream_id] + 1:
                fresh.append(record)
                ahead[stream_id] = record.version
            else:
                gaps.setdefault(stream_id)
        changes = self.tasks.fold(fresh)
        self.tasks.committed()
        for stream_id in gaps:
            if stream_id not in retired:
                log.error("stream %s: the log has events this controller never folded "
                          "before %d; reading the stream again", stream_id, self.position)
            self.tasks.forget([stream_id])
            self.tasks.fold(self.store.read_stream(stream_id))  # type: ignore[union-attr]
            self.tasks.committed()
        touched = {change.after.task_id for change in changes}
        for stream_id in [*known, *gaps]:
            state = self.tasks.get(stream_id)
            if state is not None and stream_id not in touched:
                # Folded already (a reload after a lost race leaves the queue book out).
                changes.append(Change(state, state, False))
        if self.queues is not None:
            self.queues.fold(changes, batch)
            self.queues.book.commit()
        touched = {change.after.task_id for change in changes}
        if self.index is not None:
            for stream_id in touched:
                current = self.tasks.get(stream_id)
                if current is not None:
                    self.index.update(current)
        if self.live is not None:
            self.live.resync([s for t in touched if (s := self.tasks.get(t)) is not None])
        return len(fresh)
