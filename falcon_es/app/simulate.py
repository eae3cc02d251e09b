"""``falcon-es simulate``: a what-if run at scale in virtual time.

Registers the clusters of its world file (``--config``, by default the packaged
``demo_data/simulate_world.json``: v6e with a reservation, v7x with a reservation, v7x
flex-start), generates a seeded arrival stream of tasks for them, runs the real
handlers, store and projections against the simulated backend, and reports what a
capacity planner asks: throughput, wait-time percentiles per actor and per queue, how
often pools were reused, node-pool hours by supply mode, and final Status/Reason; and
how good the Waiting message's expected starts were (``falcon_es.engine.eta_error``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.resources
import random
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy.engine import Engine

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.adapters.sim import load_sim_config
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.eta_error import EtaLog, eta_lines, first_picks
from falcon_es.engine.runtime import TickReport
from falcon_es.projections import timeline, timeline_page
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable
from falcon_es.storage.store import RecordedEvent

SIM_START = dt.datetime(2026, 1, 5, 0, 0, 0)
#: Topologies drawn per TPU type (single-host shapes more often, as in practice).
#: Only shapes on 4-chip VMs, the machine type the simulated reservations hold.
TOPOLOGIES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "v5e": ("2x2", "2x2", "4x4"),
    "v5p": ("2x2x1", "2x2x1", "2x2x2"),
    "v6e": ("2x2", "2x2", "2x2", "4x4"),
    "v7x": ("2x2x1", "2x2x1", "2x2x1", "2x2x2"),
})
OUTCOMES = (("succeed", 0.9), ("fail", 0.05), ("oom", 0.05))
WORLD_RESOURCE = "simulate_world.json"


def simulate_world_path() -> Path:
    """The packaged world ``simulate`` runs in when no ``--config`` is given."""
    return Path(str(importlib.resources.files("falcon_es.demo_data").joinpath(WORLD_RESOURCE)))


@dataclasses.dataclass(frozen=True)
class Arrival:
    task_id: str
    actor: str
    name: str
    spec: dict[str, Any]
    at: dt.datetime


def arrivals(tpu_types: list[str], count: int, seed: int, *, actors: int = 5,
             mean_gap_seconds: float = 60.0) -> list[Arrival]:
    rng = random.Random(seed)
    moment = SIM_START
    out = []
    for index in range(count):
        moment += dt.timedelta(seconds=round(rng.expovariate(1 / mean_gap_seconds), 3))
        tpu_type = rng.choice(tpu_types)
        outcome = rng.choices([o for o, _ in OUTCOMES], [w for _, w in OUTCOMES])[0]
        sim: dict[str, Any] = {"duration_seconds": round(rng.uniform(300, 3600)), "outcome": outcome}
        if outcome == "fail":
            sim["exit_code"] = rng.choice((1, 2, 3))
        spec = {"image": "us-docker.pkg.dev/falcon-sim/tpu/workload:1",
                "tpu_type": tpu_type, "topology": rng.choice(TOPOLOGIES[tpu_type]), "sim": sim}
        actor = f"actor-{rng.randrange(actors) + 1}"
        out.append(Arrival(f"sim{index:06d}", actor, f"{tpu_type}-{index}", spec, moment))
    return out


class _Arrivals:
    """The upper layer of a simulation: submits each arrival when its moment comes, and
    stops the run once the horizon after the last arrival has passed."""

    def __init__(self, clock: VirtualClock, stop: threading.Event) -> None:
        self.clock = clock
        self.stop = stop
        self.engine: Engine | None = None
        self.job = JobTable()
        self.waiting: list[Arrival] = []  # latest first, so the next one pops off the end
        self.horizon = SIM_START

    def plan(self, engine: Engine, job: JobTable, planned: list[Arrival],
             horizon_hours: float) -> None:
        self.engine = engine
        self.job = job
        self.waiting = list(reversed(planned))
        last_arrival = self.waiting[0].at if self.waiting else SIM_START
        self.horizon = last_arrival + dt.timedelta(hours=horizon_hours)

    def next_due(self) -> dt.datetime | None:
        return self.waiting[-1].at if self.waiting else None

    def pending(self) -> bool:
        return bool(self.waiting)

    def on_tick(self, report: TickReport) -> None:
        self.admit()

    def admit(self) -> None:
        if self.clock.now() > self.horizon:
            self.stop.set()
        while self.waiting and self.waiting[-1].at <= self.clock.now() and self.engine:
            a = self.waiting.pop()
            job_rows.submit(self.engine, task_id=a.task_id, name=a.name, actor=a.actor,
                            spec=a.spec, now=a.at, job=self.job)


def run_simulation(*, config: str | Path | None = None, tasks: int = 200, seed: int = 1,
                   db_url: str | None = None, mean_gap_seconds: float = 60.0,
                   horizon_hours: float = 168.0, html: Path | None = None) -> dict[str, Any]:
    """Run ``tasks`` arrivals to completion, or until ``horizon_hours`` of virtual time
    after the last arrival (tasks still open then are reported as unfinished); with
    ``html``, write the run's timeline page there (with the waits per actor and queue)."""
    wall_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'simulate.db'}"
        settings = Settings.of(db_url=url)
        engine = db.make_engine(url)
        db.upgrade(engine)
        db.create_job_table(engine, JobTable(settings.job_mapping))
        engine.dispose()
        clock = VirtualClock(SIM_START)
        stop = threading.Event()
        script = _Arrivals(clock, stop)
        world = load_sim_config(config or simulate_world_path())
        etas = EtaLog()
        app = open_app(settings, clock, predictions=etas.record)
        register_sim_clusters(app, world)  # the world's clusters, before it starts
        svc = build_service(app, None, RunOptions(sim_config=world, seed=seed, script=script))
        tpu_types = sorted({c.tpu_type for c in app.cluster_cache.clusters()})
        script.plan(svc.app.engine, svc.app.job, arrivals(tpu_types, tasks, seed,
                                             mean_gap_seconds=mean_gap_seconds), horizon_hours)
        script.admit()
        loop_report = svc.loop.run(until_idle=True, stop=stop)
        report = _report(svc.app.store.read_after(0), clock.now())
        report["eta_relative_error"] = etas.report(first_picks(svc.app.store.read_after(0)))
        report["unfinished"] = sum(1 for s in svc.app.tasks.all() if not s.is_terminal)
        if html is not None:
            page = timeline.build(svc.app.store.read_after(0), now=clock.now())
            html.write_text(timeline_page.render(
                page, title=f"Falcon-ES simulate: {tasks} tasks, seed {seed}", waits=True),
                encoding="utf-8")
        report.update(ticks=loop_report.ticks, stopped_by=loop_report.stopped_by, wall_seconds=round(time.perf_counter() - wall_start, 2),
                      seed=seed, tasks=tasks)
        svc.close()
    return report


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5), 1), "p90": round(pick(0.9), 1), "p99": round(pick(0.99), 1),
            "mean": round(statistics.fmean(ordered), 1)}


def _report(records: Iterator[RecordedEvent], end: dt.datetime) -> dict[str, Any]:
    submitted: dict[str, dt.datetime] = {}
    actor_of: dict[str, str] = {}
    queue_of: dict[str, str] = {}
    started: dict[str, dt.datetime] = {}
    finished: dict[str, tuple[dt.datetime, str]] = {}
    pool_start: dict[str, tuple[dt.datetime, str, int]] = {}
    pool_end: dict[str, dt.datetime] = {}
    created = reused = 0
    events_of: Counter[str] = Counter()
    for record in records:
        event, task = record.event, record.stream_id
        kind = record.type_name
        events_of[task] += 1
        if kind == "TaskAccepted":
            submitted[task] = event.submitted_at  # type: ignore[attr-defined]
            actor_of[task] = event.actor  # type: ignore[attr-defined]
        elif kind == "ClusterChosen":
            queue_of[task] = f"{event.cluster_name}/{event.topology}"  # type: ignore[attr-defined]
        elif kind == "PodsRunning" and task not in started:
            started[task] = record.recorded_at
        elif kind == "NodePoolCreateRequested":
            created += 1
            pool_start.setdefault(event.pool_name, (record.recorded_at, event.supply_mode,  # type: ignore[attr-defined]
                                                    event.node_count))  # type: ignore[attr-defined]
        elif kind in ("NodePoolReused", "NodePoolTaken"):
            reused += 1  # a pool taken over, by a single-slice task or for one slice
        elif kind in ("NodePoolDeleted", "OrphanPoolDeleted"):
            pool_end[event.pool_name] = record.recorded_at  # type: ignore[attr-defined]
        if kind in ("JobSucceeded", "JobFailed", "TaskTimedOut", "TaskAborted", "TaskRejected",
                    "NodePoolFailed", "NodePoolTimedOut", "JobSubmitFailed", "NoMatchingCluster"):
            reason = event.failure() or kind
            status = {"JobSucceeded": "Succeeded", "TaskAborted": "Aborted"}.get(kind, "Failed")
            finished[task] = (record.recorded_at, status if status != "Failed" else f"Failed/{reason}")
    waits_by_actor: dict[str, list[float]] = defaultdict(list)
    waits_by_queue: dict[str, list[float]] = defaultdict(list)
    for task, at in started.items():
        wait = (at - submitted[task]).total_seconds()
        waits_by_actor[actor_of[task]].append(wait)
        waits_by_queue[queue_of.get(task, "?")].append(wait)
    pool_hours: dict[str, float] = defaultdict(float)
    node_hours: dict[str, float] = defaultdict(float)
    for name, (start, mode, nodes) in pool_start.items():
        hours = ((pool_end.get(name) or end) - start).total_seconds() / 3600
        pool_hours[mode] += hours
        node_hours[mode] += hours * nodes
    span_hours = (end - SIM_START).total_seconds() / 3600
    return {
        "virtual_hours": round(span_hours, 2),
        "throughput_tasks_per_hour": round(len(finished) / span_hours, 2) if span_hours else 0.0,
        "wait_seconds_by_actor": {a: _percentiles(w) for a, w in sorted(waits_by_actor.items())},
        "wait_seconds_by_queue": {q: _percentiles(w) for q, w in sorted(waits_by_queue.items())},
        "pool_reuse_ratio": round(reused / (reused + created), 3) if created + reused else 0.0,
        "pools_created": created, "pools_reused": reused,
        "node_pool_hours_by_supply_mode": {k: round(v, 2) for k, v in sorted(pool_hours.items())},
        "node_hours_by_supply_mode": {k: round(v, 2) for k, v in sorted(node_hours.items())},
        "final_status": dict(sorted(Counter(s for _, s in finished.values()).items())),
        "events_per_task": _events_per_task(events_of, submitted),
    }


def _events_per_task(events_of: Counter[str], tasks: Mapping[str, object]) -> dict[str, float]:
    """How much the log grows per task (mean and most), counting the task streams only:
    a wait must cost the log nothing per unit of time, so a long wait shows here."""
    counts = [events_of[task] for task in tasks]
    if not counts:
        return {}
    return {"mean": round(statistics.fmean(counts), 2), "max": max(counts)}


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['tasks']} tasks, seed {report['seed']}: {report['virtual_hours']} virtual hours "
        f"in {report['wall_seconds']} s wall ({report['ticks']} ticks)",
        f"throughput: {report['throughput_tasks_per_hour']} tasks/hour",
        f"pool reuse: {report['pool_reuse_ratio']:.1%} ({report['pools_reused']} reused, "
        f"{report['pools_created']} created)",
        "node-pool hours: " + ", ".join(f"{k} {v}" for k, v in report["node_pool_hours_by_supply_mode"].items()),
        "node hours: " + ", ".join(f"{k} {v}" for k, v in report["node_hours_by_supply_mode"].items()),
        "events per task: " + ", ".join(
            f"{k} {v}" for k, v in report.get("events_per_task", {}).items()),
        "final: " + ", ".join(f"{k} {v}" for k, v in report["final_status"].items())
        + (f"; unfinished {report['unfinished']} (stopped: {report['stopped_by']})"
           if report["unfinished"] else ""),
        "wait to Running (s) by actor:",
    ]
    for actor, p in report["wait_seconds_by_actor"].items():
        lines.append(f"  {actor:<12} p50 {p['p50']:>8}  p90 {p['p90']:>8}  p99 {p['p99']:>8}")
    lines.append("wait to Running (s) by queue:")
    for queue, p in report["wait_seconds_by_queue"].items():
        lines.append(f"  {queue:<24} p50 {p['p50']:>8}  p90 {p['p90']:>8}  p99 {p['p99']:>8}")
    lines += eta_lines(report.get("eta_relative_error"))
    return "\n".join(lines)
