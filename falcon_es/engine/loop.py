"""The controller's main loop: tick, then wait for the next thing to do.

On a virtual clock (the sim backend's default) waiting is a jump: when a tick left
nothing to do now, the clock moves straight to the next due moment (a world change, a
deadline, a retry). With nothing due at all it waits for new input in wall time and
lets the virtual clock catch up with the wall clock, so timestamps written by
``task submit`` and by the controller stay comparable. On the wall clock it sleeps
until the next due moment or the tick interval, whichever comes first.

A stop request (SIGINT/SIGTERM) is honoured between ticks: the current tick always
finishes and commits.

With several replicas, ``leadership`` (a lease elector, the database lock) fences the
loop: it ticks only while ``may_append()`` holds, checked before each tick and again
right before each commit (``leadership_fence``), and stops as soon as the lease is
lost or the database's writer fence refuses an append (``FencedOut``). A replica that
regains the lease starts over from a fresh fold of the log rather than resuming on
states another leader has moved on since.

A database that blinks (a lost connection, a hang past the read timeout, a lock wait
timeout, a deadlock: ``db.is_transient``) ends the loop too, with
``DATABASE_UNAVAILABLE``: nothing of the failed tick was applied in memory, and the
caller (``service.serve_elected``) runs the ticks again from a fresh fold once the
database answers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from falcon_es.domain.clock import Clock, VirtualClock, utcnow
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.runtime import Controller, Handler, Tick, TickReport
from falcon_es.storage import db
from falcon_es.storage.fence import FencedOut

DueSource = Callable[[], dt.datetime | None]

#: ``LoopReport.stopped_by`` when the lease was lost (the replica goes back to standby).
LOST_LEADERSHIP = "lost-leadership"
#: ``LoopReport.stopped_by`` when the database's writer fence refused an append.
FENCED_OUT = "fenced-out"
#: ``LoopReport.stopped_by`` when the database blinked (the caller retries with backoff).
DATABASE_UNAVAILABLE = "database-unavailable"


class Leadership(Protocol):
    """Whether this replica may append now (a lease elector's fence)."""

    def may_append(self) -> bool: ...


class Script(Protocol):
    """The upper layer of a run that ends when its script does (the demo, ``simulate``,
    the benchmarks): it submits and aborts tasks at moments of its own, so the loop
    jumps to those moments too and is settled only once nothing is left to play."""

    def next_due(self) -> dt.datetime | None:
        """When the script acts next (None: it has nothing more planned)."""

    def pending(self) -> bool:
        """True while the script still has something to submit or abort."""

    def on_tick(self, report: TickReport) -> None:
        """After each tick: submit or abort what is due by now."""


class LeadershipLost(RuntimeError):
    """The lease ended during a tick: the tick's events were not appended."""


def leadership_fence(leadership: Leadership) -> Handler:
    """A controller ``before_commit`` step that refuses to commit without the lease, so
    a tick that outlived the lease appends nothing (the log's optimistic concurrency
    stays the fence behind this one)."""

    def fence(tick: Tick, ctx: HandlerContext) -> None:
        if not leadership.may_append():
            raise LeadershipLost("the lease was lost during the tick; nothing was appended")

    return fence


@dataclasses.dataclass
class LoopReport:
    ticks: int = 0
    appended: int = 0
    conflicts: int = 0
    stopped_by: str = ""
    #: What ended the loop when the database did (its first line, for logs and /readyz).
    error: str = ""


@dataclasses.dataclass
class Loop:
    controller: Controller
    clock: Clock
    due_sources: Sequence[DueSource]
    #: True while work is queued for the next tick (effect outcomes, bus messages).
    has_work: Callable[[], bool]
    #: True when every task is terminal and nothing is left open (for --until-idle).
    settled: Callable[[], bool]
    #: Called after each tick (health marks, metrics, live tables).
    on_tick: Callable[[TickReport], None] | None = None
    #: Wall seconds between ticks when nothing is due (realtime) or when waiting for input.
    tick_seconds: float = 1.0
    #: Applies the world's own changes up to the clock's now (the sim world's step).
    advance_world: Callable[[], object] | None = None
    #: False when no input can arrive from outside (demo, simulate): a loop with nothing
    #: due and work unfinished is then stuck, and stops instead of waiting forever.
    external_input: bool = True
    #: The lease fence when several replicas run (None: this process is the only writer).
    leadership: Leadership | None = None
    #: Folds what another writer appended before each tick (``follow.LogFollower``).
    follow_log: Callable[[], int] | None = None
    #: The upper layer of a scripted run (no input arrives from outside then).
    script: Script | None = None
    #: On a virtual clock, the finest step of a jump (seconds; 0: jump to the exact due
    #: moment). A due moment rounds up to the next multiple, as a wall-clock loop that
    #: looks at the world every ``resolution`` seconds would see it; what falls due in
    #: between is handled by one tick.
    resolution: float = 0.0
    #: Set when a call on a cluster's workers has landed (its outcome or answer is a
    #: next tick's input): a waiting loop ticks again at once (None: calls are inline).
    wake: threading.Event | None = None
    #: Told before each tick whether it follows the last at once (to carry what that
    #: tick appended or set off) rather than after a wait: such ticks need not read
    #: the upper layer's inputs again (``JobInbox.following_up``).
    follow_up: Callable[[bool], None] | None = None

    def __post_init__(self) -> None:
        if self.script is not None:
            self.external_input = False
        #: Whether the script played something after the last tick (it wrote rows the
        #: next tick must read, follow-up or not).
        self._script_played = False

    def next_due(self) -> dt.datetime | None:
        moments = [m for m in (source() for source in self.due_sources) if m is not None]
        if self.script is not None and (scripted := self.script.next_due()) is not None:
            moments.append(scripted)
        return min(moments) if moments else None

    def is_settled(self) -> bool:
        """Every task ended and nothing left open, nor anything left in the script."""
        if self.script is not None and self.script.pending():
            return False
        return self.settled()

    def step(self, on_tick: Callable[[TickReport], None] | None = None) -> TickReport | None:
        """One tick as ``run`` makes it: the lease fence, the world's own changes, the
        log's head, then the tick; None when the lease is gone and nothing was appended.
        ``FencedOut`` when the database refused the append: another controller's term
        has begun."""
        if self.leadership is not None and not self.leadership.may_append():
            return None
        if self.advance_world is not None:
            self.advance_world()
        if self.follow_log is not None:
            self.follow_log()
        if self.wake is not None:
            self.wake.clear()  # what lands from now on asks for another tick
        try:
            tick = self.controller.tick()
        except LeadershipLost:
            return None
        if self.script is not None:
            before = self.script.next_due()
            self.script.on_tick(tick)
            self._script_played = self.script.next_due() != before
        if self.on_tick is not None:
            self.on_tick(tick)
        if on_tick is not None:
            on_tick(tick)
        return tick

    def run(self, *, until_idle: bool = False, stop: threading.Event | None = None,
            max_ticks: int | None = None,
            on_tick: Callable[[TickReport], None] | None = None) -> LoopReport:
        """Tick until stopped (or idle, with ``until_idle``); ``on_tick`` is called after
        each tick besides the loop's own (the service's health marks and metrics)."""
        stop = stop or threading.Event()
        report = LoopReport()
        following = False
        while True:
            if stop.is_set():
                report.stopped_by = "signal"
                return report
            if max_ticks is not None and report.ticks >= max_ticks:
                report.stopped_by = "max-ticks"
                return report
            if self.follow_up is not None:
                self.follow_up(following and not self._script_played)
            try:
                tick = self.step(on_tick)
            except FencedOut as error:
                report.stopped_by, report.error = FENCED_OUT, str(error)
                return report
            except Exception as error:
                if not db.is_transient(error):
                    raise
                report.stopped_by, report.error = DATABASE_UNAVAILABLE, db.first_line(error)
                return report
            if tick is None:
                report.stopped_by = LOST_LEADERSHIP
                return report
            report.ticks += 1
            report.appended += tick.appended
            report.conflicts += tick.conflicts
            following = bool(tick.appended or tick.conflicts or self.has_work())
            if following:
                continue
            due = self.next_due()
            settled = self.is_settled()
            if until_idle and settled:
                report.stopped_by = "idle"
                return report
            if settled and self.external_input:
                # Only housekeeping is due: wait for input in wall time rather than
                # racing a virtual clock ahead of the timestamps the upper layer writes.
                due = None
            if due is None and not self.external_input:
                report.stopped_by = "stuck"
                return report
            self._wait(due, stop)

    def _wait(self, due: dt.datetime | None, stop: threading.Event) -> None:
        now = self.clock.now()
        if isinstance(self.clock, VirtualClock):
            if due is not None:
                target = max(due, now + dt.timedelta(microseconds=1))
                self.clock.advance_to(_round_up(target, self.resolution))
                return
            stop.wait(self.tick_seconds)
            self.clock.advance_to(utcnow())
            return
        pause = self.tick_seconds
        if due is not None:
            pause = min(pause, max((due - now).total_seconds(), 0.0))
        if self.wake is None:
            stop.wait(pause)
            return
        until = time.monotonic() + pause
        while not stop.is_set() and not self.wake.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            self.wake.wait(min(left, WAKE_POLL_SECONDS))


#: How often a loop waiting for a landed call also looks at its stop request.
WAKE_POLL_SECONDS = 0.05
_EPOCH = dt.datetime(1970, 1, 1)


def _round_up(moment: dt.datetime, seconds: float) -> dt.datetime:
    """``moment`` rounded up to a whole multiple of ``seconds`` since the epoch."""
    step = round(seconds * 1_000_000)
    if step <= 0:
        return moment
    micros = (moment - _EPOCH) // dt.timedelta(microseconds=1)
    return _EPOCH + dt.timedelta(microseconds=-(-micros // step) * step)
