"""The timeline page's model, folded from the log: per cluster, each node pool as a bar
from its create to its delete, cut into who held it when (provisioning, held by a
task, idle between holders, hand-overs marked); and each task's wait and run.

A pure function of recorded events (``build``), so what the page shows is tested
without a browser; ``projections.timeline_page`` draws it. Pools live in the task
streams: a pool starts with ``NodePoolCreateRequested``, passes to another task with
that task's ``NodePoolReused``/``NodePoolTaken`` (a hand-over), and ends with
``NodePoolDeleted``. A holder holds its pool until it ended (its terminal event); the
stretch from then until the next holder takes it, or the pool is deleted, is idle.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from falcon_es.domain import events as ev
from falcon_es.domain import naming
from falcon_es.domain.task import TaskState, fold
from falcon_es.storage.store import RecordedEvent

PROVISIONING, HELD, IDLE = "provisioning", "held", "idle"


@dataclasses.dataclass(frozen=True)
class Segment:
    """A stretch of a pool's life: provisioning, held by ``task_id``, or idle."""

    kind: str
    start: dt.datetime
    end: dt.datetime
    task_id: str | None = None


@dataclasses.dataclass(frozen=True)
class PoolBar:
    cluster: str
    name: str
    supply_mode: str
    start: dt.datetime
    end: dt.datetime
    deleted: bool
    segments: tuple[Segment, ...]
    #: When the pool passed from one task to the next: (moment, from task, to task).
    handovers: tuple[tuple[dt.datetime, str, str], ...]


@dataclasses.dataclass(frozen=True)
class TaskRow:
    task_id: str
    name: str
    actor: str
    cluster: str
    topology: str
    submitted: dt.datetime
    #: When its pods first ran (None: they never did).
    started: dt.datetime | None
    #: When it ended (None: not yet).
    ended: dt.datetime | None
    outcome: str  # Status[/Reason]

    @property
    def queue(self) -> str:
        return f"{self.cluster}/{self.topology}"

    def wait_seconds(self, now: dt.datetime) -> float:
        return ((self.started or self.ended or now) - self.submitted).total_seconds()


@dataclasses.dataclass(frozen=True)
class Page:
    start: dt.datetime
    end: dt.datetime
    #: Cluster name -> its pools, by create time.
    clusters: Mapping[str, tuple[PoolBar, ...]]
    tasks: tuple[TaskRow, ...]

    @property
    def pools(self) -> list[PoolBar]:
        return [bar for bars in self.clusters.values() for bar in bars]


@dataclasses.dataclass
class _Pool:
    """A pool while the log is folded: who held it from when, and when it ended."""

    cluster: str
    supply_mode: str
    created: dt.datetime
    ready: dt.datetime | None = None
    holders: list[tuple[str, dt.datetime, str]] = dataclasses.field(default_factory=list)
    deleted: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class Window:
    """What the page covers: a time range (either end open) and one cluster or all."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    cluster: str | None = None


def build(records: Iterable[RecordedEvent], window: Window = Window(),
          now: dt.datetime | None = None) -> Page:
    """The page of ``records`` (the whole log, in order) within ``window``; an open
    end is drawn at ``now`` (default: the last event's moment)."""
    streams: dict[str, list[tuple[ev.Event, dt.datetime]]] = defaultdict(list)
    pools: dict[tuple[str, str], _Pool] = {}
    cluster_of: dict[str, str] = {}
    last = None
    for record in records:
        event, at, task = record.event, record.recorded_at, record.stream_id
        last = at
        if isinstance(event, ev.TaskAccepted) or task in streams:
            streams[task].append((event, at))
        _fold_pool_event(pools, cluster_of, task, event, at)
    end = window.until or now or last or dt.datetime.min
    states = {task: fold(task, events) for task, events in streams.items()}
    tasks = [row for task, events in streams.items()
             if (row := _task_row(states[task], events, cluster_of.get(task, ""))) is not None]
    ended = {row.task_id: row.ended for row in tasks}
    bars = [_bar(cluster, name, pool, ended, end) for (cluster, name), pool in pools.items()]
    return _windowed(bars, tasks, window, end)


def _fold_pool_event(pools: dict[tuple[str, str], _Pool], cluster_of: dict[str, str],
                     task: str, event: ev.Event, at: dt.datetime) -> None:
    match event:
        case ev.ClusterChosen():
            cluster_of[task] = event.cluster_name
        case ev.TaskMoved():
            cluster_of[task] = event.to_cluster_name
        case ev.NodePoolCreateRequested():
            cluster = cluster_of.get(task, "")
            group = naming.pool_group(event.pool_name, event.slices)
            for name in group[event.first_slice:event.upto or None]:
                if (cluster, name) not in pools:
                    pool = pools[(cluster, name)] = _Pool(cluster, event.supply_mode, at)
                    pool.holders.append((task, at, ""))
        case ev.NodePoolReady():
            for (cluster, name), pool in pools.items():
                if (cluster == cluster_of.get(task) and pool.ready is None
                        and naming.group_first(name) == event.pool_name):
                    pool.ready = at
        case ev.NodePoolReused() | ev.NodePoolTaken():
            taken = pools.get((cluster_of.get(task, ""), event.pool_name))
            if taken is not None:
                taken.holders.append((task, at, event.from_task or ""))
        case ev.NodePoolDeleted():
            for name in (event.pool_name, *event.slice_pools):
                gone = pools.get((cluster_of.get(task, ""), name))
                if gone is not None and gone.deleted is None:
                    gone.deleted = at


def _bar(cluster: str, name: str, pool: _Pool, ended: Mapping[str, dt.datetime | None],
         end: dt.datetime) -> PoolBar:
    """The pool's segments: provisioning until ready, then each holder until it ended
    (or the next took the pool), idle until the next holder or the delete."""
    last = pool.deleted or end
    segments: list[Segment] = []
    handovers = []
    ready = min(pool.ready or last, last)
    if ready > pool.created:
        segments.append(Segment(PROVISIONING, pool.created, ready, pool.holders[0][0]))
    for position, (task, took, from_task) in enumerate(pool.holders):
        following = pool.holders[position + 1][1] if position + 1 < len(pool.holders) else last
        begin = max(took, ready)
        done = min(ended.get(task) or following, following)
        if done > begin:
            segments.append(Segment(HELD, begin, done, task))
        if following > max(done, begin):
            segments.append(Segment(IDLE, max(done, begin), following))
        if from_task:
            handovers.append((took, from_task, task))
    return PoolBar(cluster, name, pool.supply_mode, pool.created, last, pool.deleted is not None,
                   tuple(segments), tuple(handovers))


def _task_row(state: TaskState, events: Sequence[tuple[ev.Event, dt.datetime]],
              cluster: str) -> TaskRow | None:
    accepted = next((e for e, _ in events if isinstance(e, ev.TaskAccepted)), None)
    if accepted is None:
        return None
    started = next((at for e, at in events if isinstance(e, ev.PodsRunning)), None)
    ended = state.ending.finished_at if state.is_terminal else None
    outcome = state.status + (f"/{state.reason}" if state.reason else "")
    return TaskRow(state.task_id, accepted.name, accepted.actor, cluster, accepted.topology,
                   accepted.submitted_at, started, ended or (events[-1][1] if state.is_terminal
                                                             else None), outcome)


def _windowed(bars: list[PoolBar], tasks: list[TaskRow], window: Window,
              end: dt.datetime) -> Page:
    """What falls in the window, each span clipped to it."""
    since = window.since or min([b.start for b in bars] + [t.submitted for t in tasks],
                                default=end)

    def inside(first: dt.datetime, last: dt.datetime) -> bool:
        return last >= since and first <= end

    clusters: dict[str, list[PoolBar]] = defaultdict(list)
    for bar in sorted(bars, key=lambda b: (b.cluster, b.start, b.name)):
        if (window.cluster in (None, bar.cluster)) and inside(bar.start, bar.end):
            clusters[bar.cluster].append(_clip(bar, since, end))
    rows = tuple(t for t in sorted(tasks, key=lambda t: (t.submitted, t.task_id))
                 if window.cluster in (None, t.cluster)
                 and inside(t.submitted, t.ended or end))
    return Page(since, end, {c: tuple(b) for c, b in sorted(clusters.items())}, rows)


def _clip(bar: PoolBar, since: dt.datetime, until: dt.datetime) -> PoolBar:
    segments = tuple(dataclasses.replace(s, start=max(s.start, since), end=min(s.end, until))
                     for s in bar.segments if s.end >= since and s.start <= until)
    return dataclasses.replace(bar, segments=segments,
                               handovers=tuple(h for h in bar.handovers if since <= h[0] <= until))


def wait_distribution(tasks: Sequence[TaskRow], now: dt.datetime,
                      key: str) -> dict[str, dict[str, float]]:
    """Wait to Running (seconds) per actor or per queue (``key``: "actor" | "queue"):
    percentiles of the tasks that ran."""
    waits: dict[str, list[float]] = defaultdict(list)
    for task in tasks:
        if task.started is not None:
            waits[getattr(task, key)].append(task.wait_seconds(now))
    return {name: _percentiles(values) for name, values in sorted(waits.items())}


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"count": len(ordered), "p50": pick(0.5), "p90": pick(0.9),
            "max": round(ordered[-1], 1)}
