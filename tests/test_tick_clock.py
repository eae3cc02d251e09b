"""One clock reading per tick: the handlers decide on the moment the tick's events are
stamped with, so the live state and a replay of the log agree on when a task moved."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any, cast

import pytest

from falcon_es.app.application import App, open_app
from falcon_es.config.settings import Settings
from falcon_es.domain import events as ev
from falcon_es.domain.task import fold
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.runtime import Controller, Tick

START = dt.datetime(2026, 11, 1, 8)


class ReadCountingClock:
    """A clock that moves one second on every read, so two readings in one tick can
    never agree."""

    def __init__(self, start: dt.datetime) -> None:
        self.moment = start
        self.reads = 0

    def now(self) -> dt.datetime:
        self.reads += 1
        self.moment += dt.timedelta(seconds=1)
        return self.moment


@pytest.fixture
def ticking() -> ReadCountingClock:
    return ReadCountingClock(START)


@pytest.fixture
def ticking_app(db_url: str, ticking: ReadCountingClock) -> Iterator[App]:
    application = open_app(Settings(db_url=db_url), ticking)
    yield application
    application.close()


def _context(app: App, clock: ReadCountingClock) -> HandlerContext:
    """What a handler reads; this test's handler reads only the time."""
    unused = cast(Any, None)
    return HandlerContext(app.settings, clock.now(), app.tasks, [], unused, unused,
                          queues=app.queue_view.book, index=app.index, executor=unused)


def test_a_tick_decides_and_stamps_with_one_clock_reading(
        ticking_app: App, ticking: ReadCountingClock) -> None:
    seen: list[tuple[dt.datetime, dt.datetime]] = []

    def accept(tick: Tick, ctx: HandlerContext) -> None:
        seen.append((ctx.now, tick.now))
        tick.emit("t", ev.TaskAccepted("t", "user-a", {"image": "i"}, "v6e", "2x2", ctx.now))

    controller = Controller(ticking_app.store, ticking_app.tasks, [accept],
                            lambda: _context(ticking_app, ticking))
    reads_before = ticking.reads
    assert controller.tick().appended == 1
    assert ticking.reads - reads_before == 1
    [(decided_at, tick_now)] = seen
    [record] = ticking_app.store.read_stream("t")
    assert decided_at == tick_now == record.recorded_at
    live = ticking_app.tasks.get("t")
    assert live is not None and live.updated_at == decided_at
    assert live == fold("t", [(record.event, record.recorded_at)])
