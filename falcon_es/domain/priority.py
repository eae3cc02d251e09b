"""Task priorities: the named classes, the bounded range, and aging.

A task's priority is an integer (higher is served first) or the name of a class from
``FALCON_PRIORITY_CLASSES`` (default ``low=-100,normal=0,high=100``). The range is
bounded by the classes: no task can be given more than the highest class, so aging,
which raises a waiting task's effective priority by ``points`` per ``interval`` up to
the highest class, reaches every task a stream of newcomers could be ahead of it with.

Aging is counted in whole intervals on one grid (interval boundaries since the Unix
epoch), not from each task's own submit time: every effective priority in a queue
changes at the same moments, so the pick order computed between two boundaries stays
valid until the next one. A task ages at most one interval less than its exact wait.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

Classes = tuple[tuple[str, int], ...]  # (name, value), as configured

DEFAULT_CLASSES: Classes = (("low", -100), ("normal", 0), ("high", 100))
_EPOCH = dt.datetime(1970, 1, 1)


class PriorityError(ValueError):
    """A priority that is neither a known class nor an integer within the range."""


@dataclasses.dataclass(frozen=True)
class PriorityPolicy:
    """The classes and the aging rule (``points`` 0: no aging)."""

    classes: Classes = DEFAULT_CLASSES
    points: int = 10
    interval_seconds: int = 300

    def __post_init__(self) -> None:
        if not self.classes:
            raise PriorityError("at least one priority class is needed")
        if self.points < 0:
            raise PriorityError(f"aging points {self.points}: must not be negative")
        if self.interval_seconds <= 0:
            raise PriorityError(f"aging interval {self.interval_seconds}: must be positive")

    @property
    def lowest(self) -> int:
        return min(value for _, value in self.classes)

    @property
    def highest(self) -> int:
        return max(value for _, value in self.classes)

    def resolve(self, value: object) -> int:
        """The integer priority of a spec's or a request's ``priority``."""
        for name, number in self.classes:
            if value == name:
                return number
        if isinstance(value, bool) or not isinstance(value, int):
            names = ", ".join(f"{n} ({v})" for n, v in sorted(self.classes, key=lambda c: c[1]))
            raise PriorityError(f"{value!r}; expected a whole number from {self.lowest} to "
                                f"{self.highest} or a class: {names}")
        if not self.lowest <= value <= self.highest:
            raise PriorityError(f"{value} is outside the range {self.lowest} to {self.highest}")
        return value

    def epoch(self, now: dt.datetime) -> int:
        """The aging grid's interval that holds ``now``."""
        return int((now - _EPOCH).total_seconds() // self.interval_seconds)

    def effective(self, base: int, submitted: dt.datetime, now: dt.datetime) -> int:
        """``base`` raised by the whole intervals waited since ``submitted``, capped at
        the highest class (a task already at or above it keeps its own)."""
        if not self.points or base >= self.highest:
            return base
        steps = self.epoch(now) - self.epoch(submitted)
        if steps <= 0:
            return base
        return min(self.highest, base + self.points * steps)

    def time_to_top(self, base: int) -> dt.timedelta:
        """The longest a task of ``base`` waits before it ages to the highest class:
        the bound behind 'no starvation' (one interval more for the grid)."""
        if base >= self.highest or not self.points:
            return dt.timedelta(0) if base >= self.highest else dt.timedelta.max
        steps = -(-(self.highest - base) // self.points)
        return dt.timedelta(seconds=(steps + 1) * self.interval_seconds)


def parse_classes(raw: str) -> Classes:
    """``low=-100,normal=0,high=100`` as a mapping (names unique, values integers)."""
    classes: dict[str, int] = {}
    for part in raw.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise PriorityError(f"{part.strip()!r}: expected name=integer")
        try:
            number = int(value.strip())
        except ValueError:
            raise PriorityError(f"{part.strip()!r}: {value.strip()!r} is not a whole number") from None
        if name in classes:
            raise PriorityError(f"class {name!r} is named twice")
        classes[name] = number
    return tuple(classes.items())
