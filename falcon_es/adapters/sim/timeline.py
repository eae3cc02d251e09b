"""The world's agenda: what changes when, in virtual time.

Actions due at the same moment run in the order they were scheduled, so a run is a
pure function of the seed, the configuration and the calls made. An action that no
longer applies (its pool was deleted, its Job replaced) checks that itself and does
nothing, which is cheaper than removing entries from the heap.

An entry is data, not code: ``at(moment, method, *args)`` names a method of one of the
world's own objects and its arguments, and plays as ``method(*args, moment)``. That is
what lets the world be saved beside the database and taken up again after a restart
(``persist``): a lambda or a closure could not be written down, so it is refused here,
where it is scheduled, rather than when the world is next saved.
"""

from __future__ import annotations

import datetime as dt
import heapq
import inspect
from collections.abc import Callable

#: A scheduled method of a world object; called with its arguments, then the moment.
Method = Callable[..., None]


class Timeline:
    def __init__(self) -> None:
        self._heap: list[tuple[dt.datetime, int]] = []
        #: order -> (method, arguments) of each entry in the heap.
        self._entries: dict[int, tuple[Method, tuple[object, ...]]] = {}
        self._order = 0

    def at(self, moment: dt.datetime, method: Method, *args: object) -> None:
        """Play ``method(*args, moment)`` at ``moment``; ``method`` is a bound method."""
        if not inspect.ismethod(method) or inspect.isclass(method.__self__):
            raise TypeError(f"timeline entries name a method of a world object, not "
                            f"{method!r}: the world is saved as data")
        heapq.heappush(self._heap, (moment, self._order))
        self._entries[self._order] = (method, args)
        self._order += 1

    def next_moment(self) -> dt.datetime | None:
        return self._heap[0][0] if self._heap else None

    def play_due(self, until: dt.datetime) -> dt.datetime | None:
        """Play the first entry due by ``until``; its moment, or None when none is due."""
        if not self._heap or self._heap[0][0] > until:
            return None
        moment, order = heapq.heappop(self._heap)
        method, args = self._entries.pop(order)
        method(*args, moment)
        return moment

    def __len__(self) -> int:
        return len(self._heap)
