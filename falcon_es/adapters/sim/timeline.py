"""The world's agenda: what changes when, in virtual time.

Actions due at the same moment run in the order they were scheduled, so a run is a
pure function of the seed, the configuration and the calls made. An action that no
longer applies (its pool was deleted, its Job replaced) checks that itself and does
nothing, which is cheaper than removing entries from the heap.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections.abc import Callable

Action = Callable[[dt.datetime], None]


class Timeline:
    def __init__(self) -> None:
        self._heap: list[tuple[dt.datetime, int, Action]] = []
        self._order = itertools.count()

    def at(self, moment: dt.datetime, action: Action) -> None:
        heapq.heappush(self._heap, (moment, next(self._order), action))

    def next_moment(self) -> dt.datetime | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, until: dt.datetime) -> tuple[dt.datetime, Action] | None:
        if not self._heap or self._heap[0][0] > until:
            return None
        moment, _, action = heapq.heappop(self._heap)
        return moment, action

    def __len__(self) -> int:
        return len(self._heap)
