"""Time, injectable: the wall clock in production, a virtual clock in the simulator.

All times are naive UTC datetimes (the database columns carry no zone).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class WallClock:
    """Reads the system time (freezegun freezes it in tests)."""

    def now(self) -> dt.datetime:
        return utcnow()


class VirtualClock:
    """A clock that only moves when told to: reproducible simulations."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or utcnow()

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds}s")
        self._now += dt.timedelta(seconds=seconds)

    def advance_to(self, moment: dt.datetime) -> None:
        if moment > self._now:
            self._now = moment
