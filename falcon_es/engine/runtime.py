"""The controller loop: one tick reads inputs, runs the handlers, appends their events
in one transaction (with the inline projections), then runs the after-commit steps
(side effects the committed intents ask for).

Handlers are plain functions ``handler(tick, ctx)``: they read ``ctx`` (views, ports,
settings) and ``tick.state(...)`` and decide by calling ``tick.emit(...)``. They never
write to the database or call a port for an effect whose intent is not yet committed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.storage import db
from falcon_es.storage.store import ConcurrencyError, EventStore, Meta, RecordedEvent, StreamAppend
from falcon_es.domain.task import TASK_EVENT_TYPES, TaskState, evolve
from falcon_es.domain.task_states import TaskStates

log = logging.getLogger("falcon_es.engine.runtime")

CONTROLLER_ACTOR = "controller"


def _first_line(error: object, limit: int = 300) -> str:
    """A database error as one short line for a Message."""
    lines = str(error).splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
_EARLIEST = dt.datetime.min


class Tick:
    """The decisions of one tick: events per stream, folded as they are emitted so a
    later handler in the same tick sees an earlier one's outcome."""

    def __init__(self, tasks: TaskStates, now: dt.datetime, controller: str) -> None:
        self.tasks = tasks
        self.now = now
        self.controller = controller
        self._overlay: dict[str, TaskState] = {}
        self._streams: dict[str, list[tuple[ev.Event, Meta]]] = {}
        self._expected: dict[str, int | None] = {}
        self.writes: list[Callable[[Connection], None]] = []

    def state(self, task_id: str) -> TaskState | None:
        return self._overlay.get(task_id) or self.tasks.get(task_id)

    def emit(
        self, stream_id: str, event: ev.Event, *, actor: str = CONTROLLER_ACTOR,
        causation_id: str | None = None, correlation_id: str | None = None,
    ) -> TaskState | None:
        """Record an event; for a task stream, check it against the chart right away."""
        meta = Meta(actor=actor, causation_id=causation_id,
                    correlation_id=correlation_id or stream_id, controller=self.controller)
        new_state = None
        if event.type_name in TASK_EVENT_TYPES:
            before = self.state(stream_id) or TaskState(stream_id)
            if stream_id not in self._expected:
                self._expected[stream_id] = before.version
            new_state = evolve(before, event, self.now)
            self._overlay[stream_id] = new_state
        else:
            self._expected.setdefault(stream_id, None)
        self._streams.setdefault(stream_id, []).append((event, meta))
        return new_state

    def write(self, statement: Callable[[Connection], None]) -> None:
        """A database write that must commit together with this tick's events."""
        self.writes.append(statement)

    @property
    def emitted(self) -> list[tuple[str, ev.Event]]:
        return [(s, e) for s, pairs in self._streams.items() for e, _ in pairs]

    def touched(self) -> list[TaskState]:
        return list(self._overlay.values())

    def candidates(self, ids: Iterable[str]) -> list[TaskState]:
        """These tasks plus those this tick already changed, as the tick sees them,
        earliest submitted first (so when tasks compete for reservation capacity in one
        tick, the older one wins)."""
        wanted = {*ids, *self._overlay}
        states = [s for task_id in wanted if (s := self.state(task_id)) is not None]
        states.sort(key=lambda s: (s.submission.submitted_at or _EARLIEST, s.task_id))
        return states

    def handed_over_now(self) -> set[tuple[str, str]]:
        """(task id, pool) of the pools another task took over earlier in this tick."""
        return {(from_task, pool) for s in self._overlay.values() for pool, from_task in s.took}

    def appends(self) -> list[StreamAppend]:
        out = []
        for stream_id, pairs in self._streams.items():
            events = tuple(e for e, _ in pairs)
            metas = tuple(m for _, m in pairs)
            out.append(StreamAppend(stream_id, self._expected[stream_id], events, metas[0], metas))
        return out


Handler = Callable[[Tick, HandlerContext], None]
#: A step run once a tick's events are durable (the effect executor, the bus acks).
AfterCommit = Callable[[HandlerContext, Sequence[RecordedEvent]], None]
#: A view kept from task states, told which states a reload replaced.
Resync = Callable[[Sequence[TaskState]], None]


@dataclasses.dataclass
class TickReport:
    appended: int
    conflicts: int = 0
    #: Wall seconds the tick took (for the tick-duration metric).
    seconds: float = 0.0


class Controller:
    """Runs ticks. ``make_context`` builds the handlers' read context fresh each tick
    (clusters, views, ports); ``after_commit`` steps run once the events are durable.

    A tick reads the clock once: the context's ``now`` (read when ``make_context``
    builds it) is the moment the handlers decide on, the moment the tick folds its
    events with, and the ``recorded_at`` of every event it appends. Two readings would
    let the live state and a replay of the log disagree on when a task last moved.
    """

    def __init__(
        self,
        store: EventStore,
        tasks: TaskStates,
        handlers: Sequence[Handler],
        make_context: Callable[[], HandlerContext],
        *,
        after_commit: Sequence[AfterCommit] = (),
        before_commit: Sequence[Handler] = (),
        reloaded: Sequence[Resync] = (),
        controller_id: str = "falcon-controller",
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.handlers = tuple(handlers)
        self.before_commit = tuple(before_commit)
        self.after_commit = tuple(after_commit)
        #: Views kept from task states (the queue book, the lifecycle index) told which
        #: states a reload replaced, so they follow the other writer's moves too.
        self.reloaded = tuple(reloaded)
        self.make_context = make_context
        self.controller_id = controller_id
        #: New rows whose first append the database refused, for the next tick's
        #: intake to refuse (emptied once a tick commits).
        self.unstorable: dict[str, str] = {}
        #: Of those, the rows whose refusal failed as well: never read as new again
        #: by this process (logged once).
        self.unwritable: set[str] = set()

    def tick(self) -> TickReport:
        started = time.perf_counter()
        ctx = self.make_context()
        refusing = dict(self.unstorable)
        if refusing:
            ctx.unstorable = refusing
        if self.unwritable:
            ctx.unwritable = frozenset(self.unwritable)
        tick = Tick(self.tasks, ctx.now, self.controller_id)
        for handler in self.handlers:
            handler(tick, ctx)
        for fence in self.before_commit:
            fence(tick, ctx)
        try:
            recorded = self.store.append(tick.appends(), extra=tick.writes, at=tick.now)
        except (ConcurrencyError, sa.exc.DBAPIError) as error:
            if db.is_transient(error):
                raise  # the database blinked: the loop runs the tick again from the log
            if refusing:  # the refusals themselves failed: leave those rows alone
                log.warning("the database refused the refusal of new row(s) %s too; "
                            "they are left as they are: %s", ", ".join(sorted(refusing)), error)
                self.unwritable.update(refusing)
                self.unstorable.clear()
                self.reload([a.stream_id for a in tick.appends()])
                return TickReport(0, conflicts=1, seconds=time.perf_counter() - started)
            found = self._unstorable_rows(tick)
            if not found and not isinstance(error, ConcurrencyError):
                raise
            if found:
                log.warning("the database refused what new row(s) %s lead to; each is "
                            "refused at the next tick: %s", ", ".join(sorted(found)), error)
            else:
                log.warning("tick lost a race, reloading the streams involved: %s", error)
            self.reload([a.stream_id for a in tick.appends()])
            return TickReport(0, conflicts=1, seconds=time.perf_counter() - started)
        self.unstorable.clear()
        for step in self.after_commit:
            step(ctx, recorded)
        return TickReport(len(recorded), seconds=time.perf_counter() - started)

    def _unstorable_rows(self, tick: Tick) -> dict[str, str]:
        """After a failed append: each stream the tick began (a new row taken in)
        appended alone, rolled back; those the database refuses by themselves are
        the rows whose trouble it was (a stream another writer moved meanwhile is
        no row's fault). Only a tick that began streams pays for this."""
        for append in tick.appends():
            if append.expected_version != 0:
                continue
            refusal = self.store.refusal([append])
            if isinstance(refusal, sa.exc.DBAPIError):
                self.unstorable[append.stream_id] = _first_line(refusal.orig or refusal)
        return {k: v for k, v in self.unstorable.items()}

    def reload(self, stream_ids: Sequence[str]) -> None:
        """Another writer moved these streams: fold them again from the log."""
        self.tasks.forget(stream_ids)
        for stream_id in stream_ids:
            records = self.store.read_stream(stream_id)
            if records:
                self.tasks.fold(records)
        self.tasks.committed()
        states = [s for stream_id in stream_ids if (s := self.tasks.get(stream_id)) is not None]
        for follow in self.reloaded:
            follow(states)
