"""How good the Waiting message's expected starts were: every expected start the queue
view rendered for a waiting task, at submit and at each refresh, against the moment
the task was really picked. ``falcon-es simulate`` always measures it, ``falcon-es
bench e2e --eta`` on request (it holds every estimate until the run ends)."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from falcon_es.storage.store import RecordedEvent

#: A remaining wait shorter than this counts as this long when an expected start's error
#: is taken relative to it (a start expected 'now' that comes 10 s later is not 'off by
#: 100%' in any sense a person waiting cares about).
ETA_MIN_WAIT = dt.timedelta(minutes=1)


class EtaLog:
    """Every expected start the queue view rendered for a waiting task (at submit and
    at each refresh), to be compared with the moment the task was really picked."""

    def __init__(self) -> None:
        self.told: dict[str, dict[dt.datetime, dt.datetime]] = defaultdict(dict)
        #: Per task, when it was first told and the range (earliest, latest start) told then.
        self.first_range: dict[str, tuple[dt.datetime, dt.datetime, dt.datetime]] = {}

    def record(self, task_id: str, at: dt.datetime, expected: dt.datetime,
               earliest: dt.datetime, latest: dt.datetime) -> None:
        self.told[task_id][at] = expected  # the last rendering of one moment counts
        self.first_range.setdefault(task_id, (at, earliest, latest))

    def report(self, picked: Mapping[str, dt.datetime]) -> dict[str, Any]:
        """Median and p90 of |expected - picked| / max(picked - told at, ETA_MIN_WAIT),
        for the first expected start of each task (at submit) and for all of them; the
        share of picks within the first range told, and how wide those ranges were."""
        first: list[float] = []
        every: list[float] = []
        for task_id, told in self.told.items():
            at_pick = picked.get(task_id)
            if at_pick is None:
                continue
            moments = sorted(m for m in told if m <= at_pick)
            for index, moment in enumerate(moments):
                error = abs((told[moment] - at_pick).total_seconds()) / max(
                    at_pick - moment, ETA_MIN_WAIT).total_seconds()
                every.append(error)
                if index == 0:
                    first.append(error)
        ranges = [(picked[t], told) for t, told in self.first_range.items() if t in picked]
        inside = [low <= pick <= high for pick, (_, low, high) in ranges]
        widths = [range_width(*told) for _, told in ranges]
        return {"tasks_with_estimate": len(first), "tasks_picked": len(picked),
                "at_submit": _relative(first), "at_every_refresh": _relative(every),
                "in_range_at_submit": round(sum(inside) / len(inside), 3) if inside else None,
                "range_width_at_submit": (round(statistics.median(widths), 1)
                                          if widths else None)}


def range_width(at: dt.datetime, earliest: dt.datetime, latest: dt.datetime) -> float:
    """How wide a range told at ``at`` is: its latest wait over its earliest, each at
    least ``ETA_MIN_WAIT`` (a factor, as the range's ends are factors of the told wait:
    2 means 'from 10 to 20 minutes' as much as 'from one to two hours')."""
    return max(latest - at, ETA_MIN_WAIT) / max(earliest - at, ETA_MIN_WAIT)


def _relative(errors: list[float]) -> dict[str, float]:
    if not errors:
        return {}
    ordered = sorted(errors)
    return {"median": round(statistics.median(ordered), 3),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
            "count": len(ordered)}


def first_picks(records: Iterator[RecordedEvent]) -> dict[str, dt.datetime]:
    """When each task first took its queue's slot."""
    picked: dict[str, dt.datetime] = {}
    for record in records:
        if record.type_name == "TaskPicked":
            picked.setdefault(record.stream_id, record.recorded_at)
    return picked


def eta_lines(report: Mapping[str, Any] | None) -> list[str]:
    """The report's lines on the expected starts (none when nothing was measured)."""
    if not report:
        return []
    lines = [f"expected start vs pick, relative error ({report['tasks_with_estimate']} of "
             f"{report['tasks_picked']} picked tasks had one):"]
    for label, key in (("at submit", "at_submit"), ("at every refresh", "at_every_refresh")):
        figures = report[key]
        if figures:
            lines.append(f"  {label:<17} median {figures['median']:.1%}  "
                         f"p90 {figures['p90']:.1%}  ({figures['count']} estimates)")
    if report.get("in_range_at_submit") is not None:
        lines.append(f"  real start within the range told at submit: "
                     f"{report['in_range_at_submit']:.1%} of tasks (the range's latest "
                     f"wait {report['range_width_at_submit']:.1f}x its earliest, median)")
    return lines
