"""Expected starts of waiting tasks, from how long each queue's slot was recently held.

A queue's slot passes from task to task: a task takes it when picked and gives it up
when its pods run (or it ends). So the task at index i of a queue's pick order (0 is
next) starts after the current holder gives the slot up and the i tasks ahead of it
have each held it once: ``now + remaining(holder) + i * typical``, where ``typical`` is
the mean of the queue's last ``WINDOW`` slot holds (what is summed is a number of
holds, so the mean: the median of skewed holds told waits half as long as they were
in ``falcon-es simulate``). The holder's remaining time depends on its state: a holder
Dispatching is seconds from running, one in ClusterBusy may wait for a reservation's
room for an hour. So each hold also records, for every state it passed through, the
time from entering that state to giving the slot up, and the remaining time of a holder
is the queue's mean of those for its current state minus what it has spent in that
state (at least ``FLOOR`` of that mean: a holder past the usual is expected to end
soon, not at once); with no such record yet, the same from the whole hold. A queue
without a slot hold yet has no estimate. What a task waits on past its slot (a reservation's room
freed by running tasks ending) is inside the slot holds it is measured from. The count
assumes nobody else arrives: a newcomer of another actor that round-robin puts ahead,
or one of higher priority, makes the real wait longer than the first estimate (the
estimates at later refreshes see them).

Memory is ``WINDOW`` durations per queue and per holder state, whatever the history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections import deque
from collections.abc import Hashable, Sequence
from typing import TypeVar

#: Slot holds remembered per queue: recent enough to follow a change of the world
#: (a reservation filling up, a stockout), enough for a stable median.
WINDOW = 15
#: A holder already past the typical hold is expected to need this share of it more.
FLOOR = 0.25


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A queue's expected starts as of ``now``: the first waiting task's, and the
    typical slot hold each task ahead adds."""

    now: dt.datetime
    first: dt.datetime
    step: dt.timedelta

    def start(self, index: int) -> dt.datetime:
        """Expected start of the task at ``index`` of the pick order."""
        return self.first + self.step * index


class SlotTimes:
    """The recent slot holds of every queue (seconds from pick to giving it up)."""

    def __init__(self) -> None:
        self._holds: dict[Hashable, deque[float]] = {}
        #: (queue, holder state) -> seconds from entering that state to the hold's end.
        self._rest: dict[tuple[Hashable, str], deque[float]] = {}

    def record(self, key: Hashable, seconds: float,
               phases: Sequence[tuple[str, float]] = ()) -> None:
        """One hold that ended: its length, and for each state the holder passed
        through, the seconds from entering it to the end."""
        _append(self._holds, key, seconds)
        for phase, rest in phases:
            _append(self._rest, (key, phase), rest)

    def typical(self, key: Hashable) -> float | None:
        holds = self._holds.get(key)
        return statistics.fmean(holds) if holds else None

    def estimate(self, key: Hashable, now: dt.datetime, held_since: dt.datetime | None,
                 phase: tuple[str, dt.datetime] | None = None) -> Estimate | None:
        """The queue's expected starts; ``held_since`` is when the current holder took
        the slot (None: the slot is free, the next pick is this tick), ``phase`` its
        state and since when."""
        typical = self.typical(key)
        if typical is None:
            return None
        step = dt.timedelta(seconds=typical)
        if held_since is None:
            return Estimate(now, now, step)
        usual, since = typical, held_since
        rests = self._rest.get((key, phase[0])) if phase is not None else None
        if phase is not None and rests:
            usual, since = statistics.fmean(rests), phase[1]
        spent = (now - since).total_seconds()
        remaining = max(usual - spent, FLOOR * usual)
        return Estimate(now, now + dt.timedelta(seconds=remaining), step)


_Key = TypeVar("_Key", bound=Hashable)


def _append(windows: dict[_Key, deque[float]], key: _Key, seconds: float) -> None:
    window = windows.get(key)
    if window is None:
        window = windows[key] = deque(maxlen=WINDOW)
    window.append(max(0.0, seconds))
