"""``falcon-es bench e2e``: tasks through their whole lifecycle on the sim backend.

The real controller (``bootstrap.build_service``: handlers, event store, inline projections,
effect executor, loop) runs against the simulated world of ``e2e_world.json`` on a
virtual clock: five clusters, which the bench registers from that file before it
starts (v6e, v7x and v5p; three with reservations, two flex-start with stockouts), four topologies each (20 queues), delete failures and
late, duplicated and reordered edge events. The upper layer writes the tasks into the
job table in bursts (``DEFAULT_BURST`` every ``DEFAULT_BURST_EVERY`` virtual seconds;
``--burst`` at least ``--tasks`` puts them all in up front) and asks to abort some of
each burst ten minutes later. Task specs are drawn from a seed: most succeed, some
fail (exit codes, OOM, image pull errors), some time out, a few are invalid, and some
are multi-slice (two slices of their type's smallest multi-host topology: two pools and a
JobSet), a third of those failing once with an OOM and restarting (``max_restarts`` 1);
the report counts their endings apart (``multi_slice``).

The loop jumps virtual time in steps of ``resolution`` (1 s by default: what the
production loop, polling every ``--tick`` second on the wall clock, would see; 0 jumps
to each exact moment), so whatever falls due within a second is one tick's work.

Measured over the run, from the first tick until every task has ended and every pool
is settled: wall time and process CPU time (the upper layer's own inserts and aborts
excluded), tasks per second, position Messages written (the rows the queue view
wrote; a task's own state changes are the job-table projection's), database round
trips per task (SQLAlchemy event
listeners on the engine: ``before_cursor_execute`` once per statement sent, so an
executemany counts once; ``commit`` and ``rollback`` once per transaction end; and,
each ping the MySQL pool sends before handing out a connection that sat idle; the upper
layer's statements are not counted), peak memory (the process's peak resident set,
``ru_maxrss``, and its growth during the run), ticks, and the final Status/Reason of
every task, which must all be terminal.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import resource
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.domain import chart
from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.adapters.sim import load_sim_config
from falcon_es.bench.round_trips import StatementCounter, label_sites
from falcon_es.bench.scratch import ScratchDatabaseError, bench_mapping, scratch_mysql_database
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.tpu import multi_host_machine
from falcon_es.engine.eta_error import EtaLog, eta_lines, first_picks
from falcon_es.engine.runtime import TickReport
from falcon_es.config.settings import Settings
from falcon_es.config.job_mapping import JobMapping
from falcon_es.storage.tables import JobTable

DEFAULT_TASKS = 10_000
DEFAULT_SEED = 1
WORLD_RESOURCE = "e2e_world.json"
START = dt.datetime(2026, 3, 2, 8, 0, 0)
#: Virtual time after a burst at which its abort requests arrive.
ABORT_AFTER = dt.timedelta(minutes=10)
#: Tasks the upper layer submits at once, and the virtual seconds between bursts
#: (3,000 tasks an hour, about what the bench world gets through).
DEFAULT_BURST = 100
DEFAULT_BURST_EVERY = 120.0
#: The loop's virtual-time step: it looks at the world once a second, as ``run`` does
#: on the wall clock with its default ``--tick 1``.
DEFAULT_RESOLUTION = 1.0
#: The wall-time target for 10,000 tasks on SQLite (see docs/benchmarks/index.md).
TARGET_SECONDS_10K_SQLITE = 60.0
ACTORS = 20
#: Slices of a multi-slice task of the plan.
MULTI_SLICES = 2
IMAGE = "us-docker.pkg.dev/falcon-bench/tpu/workload:1"
#: Topologies drawn per TPU type of the bench world, four per type (so 5 clusters make
#: 20 queues), smaller slices more often. Only shapes on 4-chip VMs, the machine type
#: the world's reservations hold.
TOPOLOGIES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "v6e": ("2x2", "2x2", "2x2", "2x2", "4x4", "4x4", "4x4", "4x8", "4x8", "8x8"),
    "v7x": ("2x2x1", "2x2x1", "2x2x1", "2x2x1", "2x2x2", "2x2x2", "2x2x2", "2x2x4", "2x2x4",
            "2x4x4"),
    "v5p": ("2x2x1", "2x2x1", "2x2x1", "2x2x1", "2x2x2", "2x2x2", "2x2x2", "2x2x4", "2x2x4",
            "2x4x4"),
})
TPU_WEIGHTS = (("v6e", 0.4), ("v7x", 0.4), ("v5p", 0.2))


def _multislice_topology(tpu_type: str) -> str:
    """The smallest topology of the type's draw that is a multi-host slice: GKE
    Multislice runs on nothing else (the spec refuses slices > 1 on one VM)."""
    return next(t for t in TOPOLOGIES[tpu_type] if multi_host_machine(tpu_type, t))
DURATIONS = (60, 120, 180, 300, 600)
#: (kind, weight): what a task is meant to do.
KINDS = (
    ("succeed", 0.85), ("multislice", 0.03), ("fail", 0.04), ("oom", 0.03), ("image-pull-error", 0.01),
    ("timeout", 0.02), ("abort", 0.01), ("invalid", 0.01),
)


class BenchError(RuntimeError):
    """The run did not end as a lifecycle benchmark must (says what was left)."""


class BenchInputError(BenchError, ValueError):
    """The benchmark cannot run as asked (a bad option, a database that is not fresh)."""


@dataclasses.dataclass(frozen=True)
class PlannedTask:
    task_id: str
    actor: str
    kind: str
    spec: Mapping[str, Any]


def plan_tasks(count: int, seed: int) -> list[PlannedTask]:
    """The tasks of a run, drawn from ``seed`` (the same seed, the same tasks)."""
    rng = random.Random(seed)
    kinds = [k for k, _ in KINDS]
    kind_weights = [w for _, w in KINDS]
    tpu_types = [t for t, _ in TPU_WEIGHTS]
    tpu_weights = [w for _, w in TPU_WEIGHTS]
    planned = []
    for index in range(count):
        kind = rng.choices(kinds, kind_weights)[0]
        tpu_type = rng.choices(tpu_types, tpu_weights)[0]
        duration = rng.choice(DURATIONS)
        sim: dict[str, Any] = {"duration_seconds": duration, "outcome": "succeed"}
        spec: dict[str, Any] = {"image": IMAGE, "tpu_type": tpu_type,
                                "topology": rng.choice(TOPOLOGIES[tpu_type]), "sim": sim}
        if kind in ("fail", "oom", "image-pull-error"):
            sim["outcome"] = kind
        if kind == "fail":
            sim["exit_code"] = rng.choice((1, 2, 3))
        elif kind == "timeout":
            sim["duration_seconds"] = 1800
            spec["timeout_seconds"] = 120
        elif kind == "invalid":
            spec["topology"] = "3x3"
        elif kind == "multislice":
            spec.update(topology=_multislice_topology(tpu_type), slices=MULTI_SLICES,
                        max_restarts=1)
            if rng.random() < 1 / 3:
                sim["outcome"] = "oom"  # restarts once, then fails: ReachedMaxRestarts
        actor = f"actor-{rng.randrange(ACTORS) + 1:02d}"
        planned.append(PlannedTask(f"e2e-{index:06d}", actor, kind, spec))
    return planned


@contextmanager
def scratch_database(url: str | None, job: JobTable) -> Iterator[str]:
    """A fresh, migrated database with a job table: a temporary SQLite file by
    default, a new SQLite file at ``url``, or a new database on the MySQL/MariaDB server
    ``url`` names (dropped afterwards; any database in the URL is ignored)."""
    if url is None:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = f"sqlite:///{Path(tmp) / 'e2e.db'}"
            _migrate(fresh, job)
            yield fresh
        return
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and Path(parsed.database).exists():
            raise BenchInputError(f"--db {url}: the file exists; the benchmark needs a fresh one")
        _migrate(url, job)
        yield url
        return
    with ExitStack() as stack:
        try:
            fresh_url = stack.enter_context(scratch_mysql_database(parsed, "falcon_e2e"))
        except ScratchDatabaseError as error:
            raise BenchInputError(f"--db {error}") from None
        _migrate(fresh_url, job)
        yield fresh_url


def _migrate(url: str, job: JobTable) -> None:
    engine = db.make_engine(url)
    try:
        db.upgrade(engine)
        db.create_job_table(engine, job)
    finally:
        engine.dispose()


def e2e_benchmark(*, tasks: int = DEFAULT_TASKS, db_url: str | None = None,
                  seed: int = DEFAULT_SEED, world: str | Path | None = None,
                  burst: int = DEFAULT_BURST, burst_every: float = DEFAULT_BURST_EVERY,
                  resolution: float = DEFAULT_RESOLUTION,
                  progress: Callable[[str], None] | None = None,
                  job_mapping: JobMapping = JobMapping(), eta: bool = False) -> dict[str, Any]:
    """Run ``tasks`` through their lifecycle and return the figures (``format_report``).

    ``world`` is a sim config file (default: the packaged bench world); the upper layer
    submits ``burst`` tasks every ``burst_every`` virtual seconds (``burst >= tasks``:
    all up front); ``resolution`` is the loop's virtual-time step (0: exact jumps);
    ``job_mapping`` names the job table and its columns (in the scratch database);
    ``eta``: also measure the Waiting message's expected starts against the picks
    (``falcon_es.engine.eta_error``; every estimate is held until the run ends, so the memory
    figures grow with it). Raises ``BenchError`` when a task did not end."""
    if tasks <= 0:
        raise BenchInputError(f"--tasks {tasks}: expected a positive number of tasks")
    if burst <= 0:
        raise BenchInputError(f"--burst {burst}: expected a positive number of tasks")
    if burst_every <= 0 or resolution < 0:
        raise BenchInputError("--burst-every must be positive and --resolution not negative")
    plan = UpperLayerPlan(plan_tasks(tasks, seed), burst, dt.timedelta(seconds=burst_every))
    mapping = bench_mapping(job_mapping)
    with scratch_database(db_url, JobTable(mapping)) as url, resources.as_file(
            resources.files(__package__).joinpath(WORLD_RESOURCE)) as packaged:
        settings = Settings.of(db_url=url, job_mapping=mapping)
        return _run(settings, Path(world) if world else packaged, plan, seed, resolution,
                    progress, EtaLog() if eta else None)


class UpperLayerPlan:
    """What the upper layer does during the run, at set virtual moments: insert each
    burst's Pending rows, and abort that burst's abort-kind tasks ``ABORT_AFTER`` later."""

    def __init__(self, planned: list[PlannedTask], burst: int, every: dt.timedelta) -> None:
        self.planned = planned
        self.actions: list[tuple[dt.datetime, str, list[PlannedTask]]] = []
        for number, first in enumerate(range(0, len(planned), burst)):
            at = START + every * number
            group = planned[first:first + burst]
            self.actions.append((at, "submit", group))
            aborts = [p for p in group if p.kind == "abort"]
            if aborts:
                self.actions.append((at + ABORT_AFTER, "abort", aborts))
        self.actions.sort(key=lambda action: (action[0], action[1] == "abort"))
        self.bursts = -(-len(planned) // burst)

    def next_due(self) -> dt.datetime | None:
        return self.actions[0][0] if self.actions else None

    def pending(self) -> bool:
        return bool(self.actions)

    def play(self, engine: Engine, job: JobTable, now: dt.datetime) -> None:
        """Carry out every action due by ``now``."""
        while self.actions and self.actions[0][0] <= now:
            at, kind, group = self.actions.pop(0)
            if kind == "submit":
                _submit(engine, job, group, at)
                continue
            for planned in group:
                try:
                    job_rows.request_abort(engine, planned.task_id, now, job=job)
                except job_rows.JobRowError:
                    pass  # ended before the abort arrived: nothing to abort


class _ScriptedUpperLayer:
    """The plan as the loop's script; the time the upper layer's own writes take is
    kept apart (and its statements are not counted), so the figures are the
    controller's."""

    def __init__(self, plan: UpperLayerPlan, clock: VirtualClock, job: JobTable,
                 engine: Engine) -> None:
        self.plan = plan
        self.clock = clock
        self.job = job
        self.engine: Engine | None = engine
        self.counter: StatementCounter | None = None
        self.seconds = 0.0

    def next_due(self) -> dt.datetime | None:
        return self.plan.next_due()

    def pending(self) -> bool:
        return self.plan.pending()

    def on_tick(self, report: TickReport) -> None:
        self.play()

    def play(self) -> None:
        due = self.plan.next_due()
        if due is None or due > self.clock.now() or self.engine is None:
            return
        started = time.perf_counter()
        if self.counter is not None:
            with self.counter.paused():
                self.plan.play(self.engine, self.job, self.clock.now())
        else:
            self.plan.play(self.engine, self.job, self.clock.now())
        self.seconds += time.perf_counter() - started


def _run(settings: Settings, world_path: Path, plan: UpperLayerPlan, seed: int,
         resolution: float, progress: Callable[[str], None] | None,
         etas: EtaLog | None) -> dict[str, Any]:
    clock = VirtualClock(START)
    world = load_sim_config(world_path)
    app = open_app(settings, clock, predictions=etas.record if etas is not None else None)
    upper_layer = _ScriptedUpperLayer(plan, clock, app.job, app.engine)
    register_sim_clusters(app, world)  # the bench world's clusters, before it starts
    svc = build_service(app, None, RunOptions(sim_config=world, seed=seed, script=upper_layer,
                                              resolution=resolution))
    count = len(plan.planned)
    try:
        backend = svc.app.engine.dialect.name
        if progress:
            progress(f"{count} tasks on {backend} ...")
        with StatementCounter(svc.app.engine) as counter:
            label_sites(svc, counter)
            upper_layer.counter = counter
            rss_before = _max_rss_kib()
            started = time.perf_counter()
            cpu_started = time.process_time()
            upper_layer.play()
            report = svc.loop.run(until_idle=True, stop=threading.Event())
            wall = time.perf_counter() - started - upper_layer.seconds
            cpu = time.process_time() - cpu_started
            rss_after = _max_rss_kib()
        outcomes = _final_counts(svc.app.engine, svc.app.job)
        multi_slice = _final_counts(svc.app.engine, svc.app.job, name_prefix="multislice-")
        open_tasks = {k: v for k, v in outcomes.items()
                      if k.split("/")[0] not in chart.TERMINAL_STATUSES}
        if open_tasks or report.stopped_by != "idle" or sum(outcomes.values()) != count:
            raise BenchError(
                f"{sum(open_tasks.values())} of {count} tasks did not end "
                f"(loop stopped: {report.stopped_by}; open: "
                f"{', '.join(f'{k} {v}' for k, v in sorted(open_tasks.items())) or 'none'})")
        return {
            "backend": backend,
            "tasks": count,
            "seed": seed,
            "bursts": plan.bursts,
            "resolution_seconds": resolution,
            "wall_seconds": round(wall, 2),
            "tasks_per_second": round(count / wall, 1) if wall else 0.0,
            "cpu_seconds": round(cpu, 2),
            "ticks": report.ticks,
            "events": report.appended,
            "conflicts": report.conflicts,
            "ms_per_tick": round(wall * 1000 / report.ticks, 3) if report.ticks else 0.0,
            "position_rows": svc.app.queue_view.rows_written,
            "position_refresh_seconds": svc.app.settings.scheduling.position_refresh_seconds,
            "statements": counter.statements,
            "statements_per_task": round(counter.statements / count, 2),
            "executemany_statements": counter.executemany,
            "commits": counter.commits,
            "commits_per_task": round(counter.commits / count, 2),
            "rollbacks": counter.rollbacks,
            "pool_checkouts": counter.checkouts,
            "pool_pings": counter.pings,
            "round_trips": counter.round_trips,
            "round_trips_per_task": round(counter.round_trips / count, 2),
            "round_trips_per_task_by_site": counter.per_task(count),
            "batched_statements_per_task_by_site": counter.per_task_batched(count),
            "peak_rss_mib": round(rss_after / 1024, 1),
            "rss_growth_mib": round((rss_after - rss_before) / 1024, 1),
            "memory_measure": "ru_maxrss (peak resident set of the process; growth = "
                              "peak after the run minus peak before it)",
            "virtual_hours": round((clock.now() - START).total_seconds() / 3600, 2),
            "upper_layer_seconds": round(upper_layer.seconds, 2),
            "final": dict(sorted(outcomes.items())),
            "multi_slice": dict(sorted(multi_slice.items())),
            "all_terminal": True,
            "eta_relative_error": (etas.report(first_picks(svc.app.store.read_after(0)))
                                   if etas is not None else None),
            "target": {"seconds_for_10k_sqlite": TARGET_SECONDS_10K_SQLITE,
                       "met": (wall <= TARGET_SECONDS_10K_SQLITE
                               if backend == "sqlite" and count >= DEFAULT_TASKS else None)},
        }
    finally:
        svc.close()


def _submit(engine: Engine, job: JobTable, planned: list[PlannedTask], at: dt.datetime) -> None:
    """A burst's Pending rows, in one transaction (one millisecond apart, so the
    submission order is the plan's order)."""
    rows = [{
        "id": p.task_id, "name": f"{p.kind}-{p.task_id}", "actor": p.actor,
        "spec": dict(p.spec), "status": chart.PENDING, "reason": None, "message": None,
        "created_at": at + dt.timedelta(milliseconds=index), "updated_at": at,
    } for index, p in enumerate(planned)]
    with engine.begin() as conn:
        for first in range(0, len(rows), 5000):
            conn.execute(job.table.insert(), rows[first:first + 5000])


def _final_counts(engine: Engine, job: JobTable, *, name_prefix: str = "") -> dict[str, int]:
    """Tasks by final ``Status`` or ``Status/Reason``, as the job table shows them (those
    whose name starts with ``name_prefix``)."""
    query = sa.select(job.c.status, job.c.reason, sa.func.count()).group_by(
        job.c.status, job.c.reason)
    if name_prefix:
        query = query.where(job.c.name.like(f"{name_prefix}%"))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    counts: Counter[str] = Counter()
    for status, reason, count in rows:
        counts[f"{status}/{reason}" if reason else str(status)] += int(count)
    return dict(counts)


def _max_rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def format_report(report: Mapping[str, Any]) -> str:
    target = report["target"]
    verdict = ("" if target["met"] is None else
               f" (target <= {target['seconds_for_10k_sqlite']:.0f} s: "
               f"{'met' if target['met'] else 'missed'})")
    lines = [
        f"e2e lifecycle bench on {report['backend']}: {report['tasks']} tasks, seed "
        f"{report['seed']}, {report['virtual_hours']} virtual hours",
        f"wall: {report['wall_seconds']} s{verdict} (process CPU {report['cpu_seconds']} s); "
        f"{report['tasks_per_second']} tasks/s; "
        f"{report['ticks']} ticks ({report['ms_per_tick']} ms/tick), {report['events']} events",
        f"positions: {report['position_rows']} position Messages written (each queue "
        f"rewritten at most every {report['position_refresh_seconds']:g} s)",
        f"database: {report['round_trips_per_task']} round trips/task = "
        f"{report['statements_per_task']} statements + "
        f"{report['commits_per_task']} commits + "
        f"{round(report['rollbacks'] / report['tasks'], 2)} rollbacks"
        + (f" + {round(report['pool_pings'] / report['tasks'], 2)} pool pings"
           if report["pool_pings"] else "") + " per task",
        "  where (round trips/task, the 12 most): " + ", ".join(
            f"{site} {n}" for site, n in list(report["round_trips_per_task_by_site"].items())[:12]),
        *(["  statements sent in batches (one round trip each batch; statements/task): "
           + ", ".join(f"{site} {n}" for site, n in
                       report["batched_statements_per_task_by_site"].items())]
          if report["batched_statements_per_task_by_site"] else []),
        f"memory: peak RSS {report['peak_rss_mib']} MiB (grew {report['rss_growth_mib']} MiB "
        f"during the run; ru_maxrss)",
        "multi-slice tasks: " + (", ".join(f"{k} {v}" for k, v in report["multi_slice"].items())
                                 or "none"),
        "final: " + ", ".join(f"{k} {v}" for k, v in report["final"].items()),
        *eta_lines(report.get("eta_relative_error")),
    ]
    return "\n".join(lines)


def report_json(reports: list[dict[str, Any]]) -> str:
    return json.dumps(reports if len(reports) != 1 else reports[0], indent=2)
