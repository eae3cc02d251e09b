"""Expected starts of waiting tasks, from how long each queue's slot was recently held.

A queue's slot passes from task to task: a task takes it when picked and gives it up
when its pods run (or it ends). So the task at index i of a queue's pick order (0 is
next) starts after the current holder gives the slot up and the i tasks ahead of it
have each held it once: ``now + remaining(holder) + i * typical``, where ``typical`` is
the mean of the queue's last ``WINDOW`` slot holds (what is summed is a number of
holds, so the mean: the median of skewed holds told waits half as long as they were
in ``falcon-es simulate``) and the holder's remaining time
is ``typical`` minus what it has held so far (at least ``FLOOR`` of ``typical``: a
holder past the usual is expected to end soon, not at once). A queue without a slot
hold yet has no estimate. What a task waits on past its slot (a reservation's room
freed by running tasks ending) is inside the slot holds it is measured from. The count
assumes nobody else arrives: a newcomer of another actor that round-robin puts ahead,
or one of higher priority, makes the real wait longer than the first estimate (the
estimates at later refreshes see them).

Memory is ``WINDOW`` durations per queue, whatever the history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections import deque
from collections.abc import Hashable

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

    def record(self, key: Hashable, seconds: float) -> None:
        holds = self._holds.get(key)
        if holds is None:
            holds = self._holds[key] = deque(maxlen=WINDOW)
        holds.append(max(0.0, seconds))

    def typical(self, key: Hashable) -> float | None:
        holds = self._holds.get(key)
        return statistics.fmean(holds) if holds else None

    def estimate(self, key: Hashable, now: dt.datetime,
                 held_since: dt.datetime | None) -> Estimate | None:
        """The queue's expected starts; ``held_since`` is when the current holder took
        the slot (None: the slot is free, the next pick is this tick)."""
        typical = self.typical(key)
        if typical is None:
            return None
        step = dt.timedelta(seconds=typical)
        if held_since is None:
            return Estimate(now, now, step)
        held = (now - held_since).total_seconds()
        remaining = max(typical - held, FLOOR * typical)
        return Estimate(now, now + dt.timedelta(seconds=remaining), step)
