"""Expected starts of waiting tasks, from how long each queue's slot was recently held.

A queue's slot passes from task to task: a task takes it when picked and gives it up
when its pods run (or it ends). So the task at index i of a queue's pick order (0 is
next) starts after the current holder gives the slot up and the i tasks ahead of it
have each held it once: ``now + remaining(holder) + i * step``, less for the first
picks when pools the queue's ended tasks left are idle now (each of those is taken in a
short hold).

``step`` is not the plain mean of the last holds: holds come in two kinds, a pick that
takes a pool a task of the queue left when it ended (seconds) and one that waits for a
reservation's room or a pool's creation (many minutes), and how many of the next picks
are of the first kind depends on how many of the queue's tasks run now, not on the mix
of the last hour (in ``falcon-es simulate`` a flex-start queue whose running tasks grew
was told waits two to three times too long by the plain mean); a hold still in
progress that is already longer than the queue's usual long hold counts as one more
hold, since the queue has slowed down. What is summed is a
number of holds, so means, not medians (the median of skewed holds told waits half as
long as they were). The holder's remaining time depends on its state: a holder
Dispatching is seconds from running, one in ClusterBusy may wait for a reservation's
room for an hour. So each hold also records, for every state it passed through, the
time from entering that state to giving the slot up, and the remaining time of a holder
is, of the queue's records for its current state that lasted longer than it has spent
there, the median of what they lasted beyond that (one hold, not a sum: the median is
off by less, and a holder an hour into a wait is not told the queue's typical hour
again); past every record, ``FLOOR`` of their mean (it is expected to end soon, not at
once). With no record of its state yet, the same from the whole hold. A queue
without a slot hold yet has no estimate. The count assumes nobody else arrives: a
newcomer of another actor that round-robin puts ahead, or one of higher priority, makes
the real wait longer than the first estimate (the estimates at later refreshes see
them).

Memory is ``WINDOW`` holds per queue and per holder state and ``RUN_WINDOW`` runs per
queue, whatever the history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections import deque
from collections.abc import Hashable, Sequence

#: Slot holds remembered per queue (and per holder state): recent enough to follow a
#: change of the world (a reservation filling up, a stockout), enough that one long
#: hold does not set the queue's estimates (15 told waits off by 2.5 points more in
#: ``falcon-es simulate``).
WINDOW = 40
#: A holder already past the typical hold is expected to need this share of it more.
FLOOR = 0.25
#: Runs remembered per queue: more than ``WINDOW``, since several runs may end within
#: the span of the holds remembered.
RUN_WINDOW = 4 * WINDOW


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A queue's expected starts as of ``now``: the first waiting task's, and the
    typical slot hold each task ahead adds."""

    now: dt.datetime
    first: dt.datetime
    step: dt.timedelta
    #: The first ``quick`` tasks after the first take pools idle now, each in ``short``.
    quick: int = 0
    short: dt.timedelta = dt.timedelta(0)

    #: How far real waits fell from what was told (``Calibration``): the told wait is
    #: multiplied by these for the earliest and the latest start of the range.
    spread: tuple[float, float] = (1.0, 1.0)

    def start(self, index: int) -> dt.datetime:
        """Expected start of the task at ``index`` of the pick order."""
        quick = min(index, self.quick)
        return self.first + self.short * quick + self.step * (index - quick)

    def start_range(self, index: int) -> tuple[dt.datetime, dt.datetime]:
        """The earliest and latest start of the task at ``index``: its expected wait
        scaled by ``spread`` (a wait shorter than ``MIN_WAIT`` counts as that long for
        the latest, as it does in the calibration)."""
        return self.range_around(self.start(index))

    def range_around(self, start: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        """``start_range`` of the task whose expected start is ``start``."""
        wait = start - self.now
        low, high = self.spread
        return self.now + wait * low, self.now + max(wait, MIN_WAIT) * high


class SlotTimes:
    """The recent slot holds of every queue (seconds from pick to giving it up)."""

    def __init__(self) -> None:
        #: Per queue, the recent holds as (seconds, took a pool a run left, ended at).
        self._holds: dict[Hashable, deque[tuple[float, bool, dt.datetime | None]]] = {}
        #: (queue, holder state) -> seconds from entering that state to the hold's end.
        self._rest: dict[tuple[Hashable, str], deque[float]] = {}
        #: Per queue, the recent runs as (seconds from pods running to the end, ended at).
        self._runs: dict[Hashable, deque[tuple[float, dt.datetime]]] = {}

    def record(self, key: Hashable, seconds: float,
               phases: Sequence[tuple[str, float]] = (), *, reused: bool = False,
               ended_at: dt.datetime | None = None) -> None:
        """One hold that ended: its length, and for each state the holder passed
        through, the seconds from entering it to the end; ``reused``: the holder took
        a pool another task of its queue left (no room or creation waited for)."""
        holds = self._holds.setdefault(key, deque(maxlen=WINDOW))
        holds.append((max(0.0, seconds), reused, ended_at))
        for phase, rest in phases:
            self._rest.setdefault((key, phase), deque(maxlen=WINDOW)).append(max(0.0, rest))

    def record_run(self, key: Hashable, seconds: float, ended_at: dt.datetime) -> None:
        """One task of the queue that ran (pods running) and ended."""
        window = self._runs.setdefault(key, deque(maxlen=RUN_WINDOW))
        window.append((max(0.0, seconds), ended_at))

    def step(self, key: Hashable, running: int | None) -> float | None:
        """Seconds each task ahead adds (``_Mix``); the mean hold while the queue's
        runs or both kinds of hold are not measured yet."""
        typical = self.typical(key)
        mix = self._mix(key, running)
        return mix.step if mix is not None else typical

    def _mix(self, key: Hashable, running: int | None) -> _Mix | None:
        runs = self._runs.get(key)
        if running is None or not runs:
            return None
        dated = [(s, reused, at) for s, reused, at in self._holds.get(key, ()) if at is not None]
        long_holds = [s for s, reused, _ in dated if not reused]
        short_holds = [s for s, reused, _ in dated if reused]
        per_run = statistics.fmean(s for s, _ in runs)
        if not long_holds or not per_run:
            return None
        seconds, _, ended_at = dated[0]
        since = ended_at - dt.timedelta(seconds=seconds)
        ended = sum(1 for _, at in runs if at >= since)
        share = min(1.0, len(short_holds) / ended) if ended else 0.0
        return _Mix(share * running / per_run,
                    statistics.fmean(short_holds) if short_holds else 0.0,
                    statistics.fmean(long_holds))

    def typical(self, key: Hashable) -> float | None:
        holds = self._holds.get(key)
        return statistics.fmean(s for s, _, _ in holds) if holds else None

    def estimate(self, key: Hashable, now: dt.datetime, held_since: dt.datetime | None,
                 phase: tuple[str, dt.datetime] | None = None,
                 running: int | None = None, idle: int = 0) -> Estimate | None:
        """The queue's expected starts; ``held_since`` is when the current holder took
        the slot (None: the slot is free, the next pick is this tick), ``phase`` its
        state and since when, ``running`` the queue's running tasks, ``idle`` the
        pools its ended tasks left that nobody took yet (the first picks after the
        holder take them). Pools the runs leave while the holder still holds are not
        counted in: in ``falcon-es simulate`` that told waits too short more often
        than it mended those told too long."""
        typical = self.typical(key)
        if typical is None:
            return None
        mix = self._mix(key, running)
        seconds = mix.step if mix is not None else typical
        remaining = 0.0
        if held_since is not None:
            # A hold in progress already longer than the usual long hold (a creation
            # or a wait for room; the mean step, mostly pool takes, is no measure of
            # one) says the queue slowed down: it counts as one more hold, at least as
            # long as it has lasted.
            held = (now - held_since).total_seconds()
            holds = [s for s, _, _ in self._holds[key]]
            if held > (mix.long if mix is not None else seconds):
                seconds = (seconds * len(holds) + held) / (len(holds) + 1)
            rests: Sequence[float] = holds
            since = held_since
            by_phase = self._rest.get((key, phase[0])) if phase is not None else None
            if phase is not None and by_phase:
                rests, since = by_phase, phase[1]
            spent = (now - since).total_seconds()
            longer = [rest - spent for rest in rests if rest > spent]
            remaining = (statistics.median(longer) if longer
                         else FLOOR * statistics.fmean(rests))
        step = dt.timedelta(seconds=seconds)
        first = now + dt.timedelta(seconds=remaining)
        if mix is None or not mix.short:
            return Estimate(now, first, step)
        return Estimate(now, first, step, idle, dt.timedelta(seconds=mix.short))


#: A wait shorter than this counts as this long when a told wait and a real one are
#: compared (a start told 'now' that comes 10 s later is not 'ten times off').
MIN_WAIT = dt.timedelta(minutes=1)
#: The share of real starts the range is meant to hold: its ends are the factor by which
#: that share of recent real waits were off from the told ones, either way.
RANGE_SHARE = 0.95
#: Real waits compared per queue before its own count: a queue with fewer is new.
CALIBRATED = 8
#: The range while fewer than ``CALIBRATED`` real waits of new queues were compared;
#: its earliest is also how far down a new queue's range reaches at least.
UNCALIBRATED = (0.25, 4.0)


class Calibration:
    """How far real waits fell from the first wait each task was told: the ratio real /
    told of each picked task (both at least ``MIN_WAIT``). An estimate's range is its
    wait divided and multiplied by the factor that held ``RANGE_SHARE`` of the last
    ``WINDOW`` ratios, so the range is as wide as the estimates have recently been
    wrong: a split-conformal interval in the statistician's words.

    The ratios are kept apart by whether the task's queue was new when it was told
    (fewer than ``CALIBRATED`` of its own): a new queue's estimates rest on its first
    holds (pool creations, waits for room: the longest it will have), so its told waits
    err long, by more than other queues' are off. A new queue takes the factor of all
    queues' tasks told while theirs was new, reaching down at least to
    ``UNCALIBRATED``'s earliest (the tasks told the longest waits are picked last, so
    their ratios come in late); another, the wider of its own and that of all queues'
    other tasks (waits drift). Why, and what else was tried: the design note on
    expected starts.

    Memory: one told wait per waiting task, ``WINDOW`` ratios per queue and twice that
    for all queues."""

    def __init__(self) -> None:
        #: Per waiting task: its queue, when it was first told, the start told then, and
        #: whether its queue was new then.
        self._told: dict[str, tuple[Hashable, dt.datetime, dt.datetime, bool]] = {}
        self._ratios: dict[Hashable, deque[float]] = {}
        #: All queues' ratios of tasks told while their queue was new, and the others.
        self._of_new: deque[float] = deque(maxlen=WINDOW)
        self._of_known: deque[float] = deque(maxlen=WINDOW)

    def told(self, task_id: str, key: Hashable, at: dt.datetime, start: dt.datetime) -> None:
        """A start was told to a waiting task; only its first counts."""
        if task_id not in self._told:
            self._told[task_id] = (key, at, start, self._is_new(key))

    def has_told(self, task_id: str) -> bool:
        """Whether the task was told a start already (later ones do not count)."""
        return task_id in self._told

    def picked(self, task_id: str, at: dt.datetime) -> None:
        """The task took its queue's slot at ``at``: how far that fell from its first
        told start is recorded."""
        told = self._told.pop(task_id, None)
        if told is None:
            return
        key, told_at, start, new = told
        real = max(at - told_at, MIN_WAIT)
        expected = max(start - told_at, MIN_WAIT)
        ratio = real / expected
        self._ratios.setdefault(key, deque(maxlen=WINDOW)).append(ratio)
        (self._of_new if new else self._of_known).append(ratio)

    def forget(self, task_id: str) -> None:
        """The task left its queue without a pick (aborted, moved, failed)."""
        self._told.pop(task_id, None)

    def spread(self, key: Hashable) -> tuple[float, float]:
        """The multipliers of a told wait for the range's two ends."""
        if self._is_new(key):
            if len(self._of_new) < CALIBRATED:
                return UNCALIBRATED
            low, high = _quantiles(self._of_new)
            return min(low, UNCALIBRATED[0]), high
        spreads = [_quantiles(ratios) for ratios in (self._ratios[key], self._of_known)
                   if len(ratios) >= CALIBRATED]
        return min(low for low, _ in spreads), max(high for _, high in spreads)

    def _is_new(self, key: Hashable) -> bool:
        return len(self._ratios.get(key, ())) < CALIBRATED


def _quantiles(ratios: Sequence[float]) -> tuple[float, float]:
    """The multipliers that held ``RANGE_SHARE`` of ``ratios``, as far below 1 as above
    (a told wait is off by a factor, and an estimate that was too short lately is as
    likely to be too long next: the queue that slowed down speeds up again)."""
    factors = sorted(max(r, 1 / r) for r in ratios)
    factor = factors[min(len(factors) - 1, int(RANGE_SHARE * len(factors)))]
    return 1 / factor, factor


@dataclasses.dataclass(frozen=True)
class _Mix:
    """How a queue picks: a pick either takes a pool a task of the queue left when it
    ended (a short hold, ``short`` seconds on average) or waits for room or a creation
    (a long one, ``long``). Pools are left at ``reuse_rate`` a second (the share of
    recent run ends whose pool was taken, times the running tasks, over the mean run),
    so the queue picks ``reuse_rate + (1 - reuse_rate x short) / long`` tasks a second:
    the mix of the last holds alone lags a queue whose running tasks grew or shrank."""

    reuse_rate: float
    short: float
    long: float

    @property
    def step(self) -> float:
        busy = self.reuse_rate * self.short
        if busy >= 1.0:
            return self.short
        return 1.0 / (self.reuse_rate + (1.0 - busy) / self.long)
