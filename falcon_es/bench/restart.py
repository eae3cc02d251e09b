"""``falcon-es bench restart``: start-up time and memory against the history in the log.

Two scratch databases of the configured kind hold the same live work (``--live``
tasks: most waiting in their queues, one acquiring per queue, the rest running), one
of them also ``--history`` finished tasks before it. The history is written with
batched INSERTs of the streams a controller really writes (the shapes of the
lifecycle tests' streams: success with the pool deleted, an OOM, a pool handed over
to the next task, a rejected spec, an abort while waiting; interleaved as concurrent
tasks are), with the job rows the projection writes for them, so ``replay --verify``
finds the database consistent. The live work is appended through the event store
with every inline projection, as the controller would have.

Each case is measured in a process of its own, so one's peak memory never shows in
the other's: from building the controller (open the app, fold what start-up folds)
through re-issuing the open intents to the end of its first tick; the peak resident
set of that process. After one start of each that is not counted (the first after
writing finds the caches cold), the cases alternate, ``ROUNDS`` each, and the best of
each is compared, so a busy machine slows both alike. Targets at 1,000,000 finished tasks:
both ratios (with history / without) at most 1.2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import db, registry
from falcon_es.domain import events as ev
from falcon_es.bench.store import scratch_database
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.domain.spec import parse_spec
from falcon_es.storage.store import Meta, StreamAppend
from falcon_es.storage.tables import JobTable, last_served, log_head
from falcon_es.domain.task import TaskState, evolve, new_state
from falcon_es.projections.job_table import row_values

DEFAULT_HISTORY = 1_000_000
DEFAULT_LIVE = 1000
ROUNDS = 3
#: The history spans the year before NOW; the live work is from NOW's last hours.
NOW = dt.datetime(2026, 11, 1, 12, 0, 0)
HISTORY_START = NOW - dt.timedelta(days=365)
#: Finished tasks running at the same time while the history was written.
CONCURRENT = 200
#: Events per INSERT batch (one transaction each).
INSERT_BATCH = 20_000
#: The clusters of the sim backend's packaged world, registered as a user would.
CLUSTERS = (("v6e-reserved", "v6e", "v6e-res"), ("v7x-reserved", "v7x", "v7x-res"),
            ("v7x-flex", "v7x", None))
TOPOLOGIES = MappingProxyType({"v6e": ("1x1", "2x2", "2x4", "4x4"),
                               "v7x": ("1x1x1", "2x2x1", "2x2x2", "2x2x4")})
ACTORS = tuple(f"team-{n:02d}" for n in range(20))
#: Of every 20 finished tasks: kind -> how many (a handover is two tasks).
MIX = (("succeeded", 14), ("oom", 2), ("handover", 1), ("rejected", 1), ("aborted", 1))
#: Where the template streams put the placeholders a task's own values replace.
ID, FROM, UID, T0 = "@id@", "@from@", "@uid@", dt.datetime(2000, 1, 1)
CONTROLLER_META = json.dumps({"actor": "controller", "correlation_id": ID,
                              "controller": "falcon-controller"})

Steps = list[tuple[float, str, ev.Event]]  # (seconds after the task started, stream, event)


@dataclasses.dataclass(frozen=True)
class Queue:
    cluster_id: str
    cluster_name: str
    tpu_type: str
    topology: str
    reservation: str | None


# --------------------------------------------------------------------- the streams


def _spec(queue: Queue) -> dict[str, Any]:
    raw = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": queue.tpu_type,
           "topology": queue.topology, "command": ["python", "train.py"],
           "sim": {"duration_seconds": 3600}}
    return parse_spec(raw).to_data()


def _intake(queue: Queue, actor: str, stream: str = ID) -> Steps:
    return [
        (0, stream, ev.TaskAccepted(f"train-{queue.topology}", actor, _spec(queue),
                                    queue.tpu_type, queue.topology, T0)),
        (0, stream, ev.ClusterChosen(queue.cluster_id, queue.cluster_name, queue.topology,
                                     "queue-depth", (
                                         {"cluster_id": queue.cluster_id,
                                          "name": queue.cluster_name, "queued": 3,
                                          "idle_pool": False},))),
    ]


def _picked(queue: Queue, actor: str, at: float, stream: str = ID) -> Steps:
    return [(at, stream, ev.TaskPicked(
        queue.cluster_id, queue.topology, "fifo",
        ({"task_id": stream, "actor": actor, "name": f"train-{queue.topology}",
          "submitted_at": T0.isoformat()},), None, 1))]


def _provisioned(queue: Queue, at: float, stream: str = ID) -> Steps:
    pool = f"falcon-{stream}-{queue.topology}"
    supply = "reservation" if queue.reservation else "flex-start"
    return [
        (at, stream, ev.NodePoolCreateRequested(pool, supply, "ct6e-standard-4t", 1,
                                                queue.reservation, 600)),
        (at, stream, ev.NodePoolCreateStarted(pool, f"operation-{stream}")),
        (at + 60, stream, ev.NodesNotReady(pool, 0, 1, 1)),
        (at + 74, stream, ev.NodesNotReady(pool, 0, 1, 2)),
        (at + 101, stream, ev.NodePoolReady(pool, 1)),
    ]


def _ran(pool: str, at: float, stream: str = ID) -> Steps:
    job_name = f"falcon-{stream}"
    return [
        (at, stream, ev.JobSubmitRequested(job_name, pool)),
        (at, stream, ev.JobSubmitted(job_name, UID)),
        (at, stream, ev.PodsPending("0/1 nodes available: node(s) not ready", 1)),
        (at + 10, stream, ev.PodsRunning(1, 1, 2)),
    ]


def _deleted(pool: str, at: float, stream: str = ID) -> Steps:
    return [(at, stream, ev.NodePoolDeleteRequested(pool)),
            (at + 30, stream, ev.NodePoolDeleted(pool))]


def finished_streams(kind: str, queue: Queue, actor: str) -> Steps:
    """One finished task (two for a handover: ``FROM`` hands its pool to ``ID``), as the
    controller records it."""
    pool = f"falcon-{ID}-{queue.topology}"
    if kind == "rejected":
        return [(0, ID, ev.TaskRejected(f"train-{queue.topology}", actor, "UnknownField",
                                        "gpus", "unknown field 'gpus'"))]
    if kind == "aborted":
        return [*_intake(queue, actor), (120, ID, ev.AbortRequested(T0, "Pending/Waiting")),
                (120, ID, ev.TaskAborted("Pending/Waiting"))]
    if kind in ("succeeded", "oom"):
        end = (ev.JobSucceeded(1, 3) if kind == "succeeded"
               else ev.JobFailed("OOMKilled (exit code 137)", 137, 3))
        return [*_intake(queue, actor), *_picked(queue, actor, 30),
                *_provisioned(queue, 30), *_ran(pool, 131),
                (1941, ID, end), *_deleted(pool, 1941)]
    giver_pool = f"falcon-{FROM}-{queue.topology}"
    giver = [*_intake(queue, actor, FROM), *_picked(queue, actor, 30, FROM),
             *_provisioned(queue, 30, FROM), *_ran(giver_pool, 131, FROM),
             (1941, FROM, ev.JobSucceeded(1, 3)),
             (1941, FROM, ev.NodePoolRetained(giver_pool, ID))]
    taker = [*_intake(queue, actor), *_picked(queue, actor, 60),
             (60, ID, ev.ReservationInsufficient(queue.reservation or "none", 0, 1, 1)),
             (1941, ID, ev.NodePoolReused(giver_pool, FROM, "reservation")),
             *_ran(giver_pool, 1941), (3751, ID, ev.JobSucceeded(1, 3)),
             *_deleted(giver_pool, 3751)]
    return giver + taker


@dataclasses.dataclass(frozen=True)
class _Template:
    """A kind of finished task in one queue by one actor, rendered once: its events as
    stored (placeholders in the text) and each stream's job row as projected."""

    events: tuple[tuple[float, str, str, int, str, str], ...]  # offset, stream, type, v, data, meta
    rows: tuple[tuple[str, dict[str, Any]], ...]  # stream placeholder, job row values


def _render(kind: str, queue: Queue, actor: str) -> _Template:
    steps = sorted(finished_streams(kind, queue, actor), key=lambda step: step[0])
    events = []
    states: dict[str, TaskState] = {}
    for offset, stream, event in steps:
        intake = isinstance(event, (ev.TaskAccepted, ev.TaskRejected))
        meta = (json.dumps({"actor": f"upper-layer:{actor}", "correlation_id": stream,
                            "controller": "falcon-controller"}) if intake
                else CONTROLLER_META.replace(ID, stream))
        events.append((offset, stream, event.type_name, event.schema_version,
                       json.dumps(event.to_data()), meta))
        before = states.get(stream) or new_state(stream)
        states[stream] = evolve(before, event, T0 + dt.timedelta(seconds=offset))
    rows = []
    for stream, state in states.items():
        values = row_values(state, "en")
        rows.append((stream, {"name": state.submission.name, "actor": state.submission.actor,
                              "spec": json.dumps(_spec(queue)), **values}))
    return _Template(tuple(events), tuple(rows))


# --------------------------------------------------------------------- writing them


def _iso(moment: dt.datetime, sqlite: bool) -> str:
    return moment.isoformat(" " if sqlite else "T", "microseconds")


def _kinds(count: int) -> Iterator[str]:
    """Finished task kinds in the mix's proportions, ``count`` tasks in all."""
    cycle = [kind for kind, times in MIX for _ in range(times)]
    made = 0
    while made < count:
        for kind in cycle:
            size = 2 if kind == "handover" else 1
            if made + size > count:
                kind, size = "succeeded", 1
            made += size
            yield kind
            if made >= count:
                return


class _HistoryWriter:
    """Batched INSERTs of finished tasks' events and job rows, straight to the driver."""

    def __init__(self, engine: Engine, queues: Sequence[Queue], first_seq: int) -> None:
        self.engine = engine
        self.queues = queues
        self.sqlite = engine.dialect.name == "sqlite"
        mark = "?" if self.sqlite else "%s"
        self.insert_events = (f"INSERT INTO task_events (seq, stream_id, version, type, "
                              f"schema_version, data, meta, recorded_at) VALUES "
                              f"({', '.join([mark] * 8)})")
        columns = ("id", "name", "actor", "spec", "status", "reason", "message", "created_at",
                   "updated_at", "aborted_at", "cluster_id", "node_pool_name", "job_uid",
                   "dispatched_at", "finished_at")
        self.row_columns = columns
        self.insert_rows = (f"INSERT INTO job ({', '.join(columns)}) VALUES "
                            f"({', '.join([mark] * len(columns))})")
        self.templates: dict[tuple[str, int, str], _Template] = {}
        self.first_seq = self.seq = first_seq
        self.tasks = 0
        self.events: list[tuple[Any, ...]] = []
        self.rows: list[tuple[Any, ...]] = []
        self.last_actor: dict[tuple[str, str], str] = {}

    def write(self, count: int, progress: Callable[[str], None] | None) -> None:
        span = (NOW - dt.timedelta(hours=12) - HISTORY_START).total_seconds()
        wave: list[tuple[Any, ...]] = []
        reported = 0
        for number, kind in enumerate(_kinds(count)):
            queue_index = number % len(self.queues)
            actor = ACTORS[(number // len(self.queues)) % len(ACTORS)]
            start = HISTORY_START + dt.timedelta(seconds=span * number / max(count, 1))
            wave.extend(self._task(kind, queue_index, actor, start))
            if len(wave) >= CONCURRENT * 12:
                self._flush_wave(wave)
                wave = []
                if progress is not None and self.tasks >= reported + 100_000:
                    reported = self.tasks
                    progress(f"history: {self.tasks:,} of {count:,} tasks written")
        self._flush_wave(wave)
        self._insert(final=True)

    def _task(self, kind: str, queue_index: int, actor: str,
              start: dt.datetime) -> list[tuple[Any, ...]]:
        key = (kind, queue_index, actor)
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = _render(kind, self.queues[queue_index], actor)
        ids = {ID: f"h{self.tasks:08d}"}
        if kind == "handover":
            ids[FROM] = ids[ID]
            ids[ID] = f"h{self.tasks + 1:08d}"
        self.tasks += len(ids)
        uid = f"{self.tasks:032x}"  # the Job's uid, as Kubernetes makes them unique
        shift = start - T0
        submitted = (T0.isoformat(), start.isoformat())
        out = []
        for offset, stream, type_name, version, data, meta in template.events:
            stream_id = ids[stream]
            for placeholder, value in ids.items():
                data = data.replace(placeholder, value)
                meta = meta.replace(placeholder, value)
            data = data.replace(UID, uid).replace(*submitted)
            out.append((start + dt.timedelta(seconds=offset), stream_id, type_name, version,
                        data, meta))
        for stream, values in template.rows:
            self.rows.append(self._row(ids[stream], values, ids, uid, shift, start))
        queue = self.queues[queue_index]
        if kind not in ("rejected", "aborted"):
            self.last_actor[(queue.cluster_id, queue.topology)] = actor
        return out

    def _row(self, task_id: str, values: dict[str, Any], ids: dict[str, str], uid: str,
             shift: dt.timedelta, start: dt.datetime) -> tuple[Any, ...]:
        """The template's projected row with this task's id, uid and times (the
        template's times are T0 plus the step's offset)."""
        row: list[Any] = []
        for column in self.row_columns:
            value = task_id if column == "id" else start if column == "created_at" else (
                values.get(column))
            if isinstance(value, str):
                for placeholder, real in ids.items():
                    value = value.replace(placeholder, real)
                value = value.replace(UID, uid)
            elif isinstance(value, dt.datetime):
                value = _iso(value if column == "created_at" else value + shift, self.sqlite)
            row.append(value)
        return tuple(row)

    def _flush_wave(self, wave: list[tuple[Any, ...]]) -> None:
        """A wave's events in the order they happened (tasks interleave), with versions
        per stream and consecutive seqs."""
        wave.sort(key=lambda event: event[0])
        versions: dict[str, int] = {}
        sqlite = self.sqlite
        for moment, stream_id, type_name, schema_version, data, meta in wave:
            version = versions[stream_id] = versions.get(stream_id, 0) + 1
            self.seq += 1
            self.events.append((self.seq, stream_id, version, type_name, schema_version, data,
                                meta, _iso(moment, sqlite)))
        if len(self.events) >= INSERT_BATCH:
            self._insert()

    def _insert(self, final: bool = False) -> None:
        with self.engine.begin() as conn:
            if self.events:
                conn.exec_driver_sql(self.insert_events, self.events)
            if self.rows:
                conn.exec_driver_sql(self.insert_rows, self.rows)
            if final:
                conn.execute(log_head.update().values(last_seq=self.seq))
                if self.last_actor:
                    conn.execute(last_served.insert(), [
                        {"cluster_id": c, "topology": t, "actor": a}
                        for (c, t), a in sorted(self.last_actor.items())])
        self.events, self.rows = [], []


def _queues(app: App) -> list[Queue]:
    clusters = [registry.add_cluster(
        app.store, name=name, project="falcon-bench", location="us-central1-a",
        tpu_type=tpu_type, gcs_bucket="falcon-bench-logs", default_reservation=reservation)
        for name, tpu_type, reservation in CLUSTERS]
    return [Queue(c.id, c.name, c.tpu_type, topology, c.default_reservation)
            for c in clusters for topology in TOPOLOGIES[c.tpu_type]]


def _live(app: App, queues: Sequence[Queue], count: int, clock: VirtualClock) -> None:
    """The live work, appended tick by tick through the store and its projections: per
    queue one task acquiring (its pool create under way), a share running, the rest
    waiting; rows inserted first, as the upper layer does."""
    started = NOW - dt.timedelta(hours=6)
    ids = [f"live-{n:05d}" for n in range(count)]
    placed = [(task_id, queues[n % len(queues)], ACTORS[n % len(ACTORS)])
              for n, task_id in enumerate(ids)]
    with app.engine.begin() as conn:
        conn.execute(app.job.table.insert(), [
            {"id": t, "name": f"train-{q.topology}", "actor": a, "spec": _spec(q),
             "status": "Pending", "created_at": started, "updated_at": started}
            for t, q, a in placed])
    clock.advance_to(started)
    _append(app, [(t, _intake(q, a, t)) for t, q, a in placed])
    by_queue: dict[Queue, list[tuple[str, str]]] = {}
    for task_id, queue, actor in placed:
        by_queue.setdefault(queue, []).append((task_id, actor))
    for queue, members in by_queue.items():
        running = members[:len(members) * 2 // 5]
        for task_id, actor in running:
            clock.advance(60)
            pool = f"falcon-{task_id}-{queue.topology}"
            _append(app, [(task_id, [*_picked(queue, actor, 0, task_id),
                                     *_provisioned(queue, 0, task_id), *_ran(pool, 0, task_id)])])
        if len(members) > len(running):
            task_id, actor = members[len(running)]
            clock.advance(60)
            _append(app, [(task_id, [*_picked(queue, actor, 0, task_id),
                                     *_provisioned(queue, 0, task_id)[:2]])])
    clock.advance_to(NOW)


def _append(app: App, streams: Sequence[tuple[str, Steps]]) -> None:
    appends = []
    for task_id, steps in streams:
        state = app.tasks.get(task_id)
        events = tuple(_placed(event, task_id) for _, _, event in steps)
        appends.append(StreamAppend(task_id, state.version if state else 0, events,
                                    Meta(actor="controller", correlation_id=task_id)))
    app.store.append(appends)


def _placed(event: ev.Event, task_id: str) -> ev.Event:
    """A template event with the live task's own id and times."""
    data = json.loads(json.dumps(event.to_data()).replace(ID, task_id).replace(
        T0.isoformat(), (NOW - dt.timedelta(hours=6)).isoformat()).replace(UID, task_id))
    return ev.decode(event.type_name, event.schema_version, data)


def populate(url: str, *, history: int, live: int,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fill a migrated, empty database: clusters, ``history`` finished tasks, ``live``
    live ones. Returns what was written and how long it took."""
    started = time.perf_counter()
    engine = db.make_engine(url)
    clock = VirtualClock(HISTORY_START)
    app = open_app(Settings.of(db_url=url), clock, engine=engine)
    try:
        queues = _queues(app)
        writer = _HistoryWriter(engine, queues, app.store.head())
        writer.write(history, progress)
        history_seconds = time.perf_counter() - started
        _live(app, queues, live, clock)
        return {"history_tasks": writer.tasks, "history_events": writer.seq - writer.first_seq,
                "events": app.store.head(), "generate_seconds": time.perf_counter() - started,
                "history_seconds": history_seconds}
    finally:
        app.close()


# --------------------------------------------------------------------- measuring


def measure(url: str) -> dict[str, Any]:
    """In this process: build the controller on ``url`` (sim backend, virtual clock at
    NOW), re-issue its open intents, run one tick; the seconds that took and the
    process's peak resident set."""
    started = time.perf_counter()
    svc = build_service(open_app(Settings.of(db_url=url), VirtualClock(NOW)))
    folded = time.perf_counter()
    svc.catch_up()
    svc.loop.run(max_ticks=1)
    ticked = time.perf_counter()
    in_memory = len(svc.app.tasks.all())
    svc.close()
    return {"first_tick_seconds": ticked - started, "fold_seconds": folded - started,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "tasks_in_memory": in_memory}


def _measure_apart(url: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "falcon_es.bench.restart", url],
                          capture_output=True, text=True, check=False)
    # Its log (the sim world does not know the operations of the pools being created
    # when the history was written, and the provisioning handler says so) is dropped.
    if done.returncode != 0:
        raise RuntimeError(f"the measured controller failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def _migrated(db_url: str) -> Iterator[str]:
    with scratch_database(db_url) as url:
        engine = db.make_engine(url)
        try:
            db.upgrade(engine)
            db.create_job_table(engine, JobTable())  # the scratch database's own
        finally:
            engine.dispose()
        yield url


def restart_benchmark(settings: Settings, *, history: int = DEFAULT_HISTORY,
                      live: int = DEFAULT_LIVE, rounds: int = ROUNDS,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both cases on scratch databases of the configured kind; see ``format_report``."""
    if history < 0 or live < 1 or rounds < 1:
        raise ValueError(f"history ({history}) must not be negative, live ({live}) and "
                         f"rounds ({rounds}) at least 1")
    with _migrated(settings.database.db_url) as empty_url, _migrated(settings.database.db_url) as full_url:
        written = {"without": populate(empty_url, history=0, live=live),
                   "with": populate(full_url, history=history, live=live, progress=progress)}
        runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
        for url in (empty_url, full_url):
            _measure_apart(url)  # not counted: the first start after writing finds cold caches
        for number in range(rounds):
            for case, url in (("without", empty_url), ("with", full_url)):
                runs[case].append(_measure_apart(url))
            if progress is not None:
                progress(f"round {number + 1} of {rounds} measured")
        engine = db.make_engine(full_url)
        backend = engine.dialect.name
        with engine.connect() as conn:
            server = ".".join(map(str, conn.dialect.server_version_info or ()))
        engine.dispose()
    best = {case: {"first_tick_seconds": min(r["first_tick_seconds"] for r in measured),
                   "fold_seconds": min(r["fold_seconds"] for r in measured),
                   "peak_rss_mib": min(r["peak_rss_mib"] for r in measured),
                   "tasks_in_memory": measured[0]["tasks_in_memory"]}
            for case, measured in runs.items()}
    time_ratio = best["with"]["first_tick_seconds"] / best["without"]["first_tick_seconds"]
    rss_ratio = best["with"]["peak_rss_mib"] / best["without"]["peak_rss_mib"]
    return {
        "backend": backend, "server_version": server, "history_tasks": history,
        "live_tasks": live, "rounds": rounds, "written": written, "best": best, "runs": runs,
        "first_tick_ratio": time_ratio, "peak_rss_ratio": rss_ratio,
        "targets": {"first_tick_ratio <= 1.2": time_ratio <= 1.2,
                    "peak_rss_ratio <= 1.2": rss_ratio <= 1.2},
    }


def format_report(report: dict[str, Any]) -> str:
    backend = report["backend"] + (f" {report['server_version']}" if report["server_version"] else "")
    best, written = report["best"], report["written"]
    lines = [
        (f"restart benchmark on {backend}: {report['live_tasks']:,} live tasks, with and "
         f"without {report['history_tasks']:,} finished tasks before them "
         f"({written['with']['events']:,} vs {written['without']['events']:,} events in the "
         f"log; history written in {written['with']['history_seconds']:,.0f} s); best of "
         f"{report['rounds']} runs, each in a process of its own"),
        "",
        "                         first tick   (of it: fold)   peak RSS   tasks in memory",
    ]
    for case in ("without", "with"):
        figures = best[case]
        lines.append(f"  {case + ' history':<22} {figures['first_tick_seconds']:>8.2f} s "
                     f"{figures['fold_seconds']:>10.2f} s {figures['peak_rss_mib']:>10.1f} MiB "
                     f"{figures['tasks_in_memory']:>10,}")
    lines += [
        "",
        f"  ratios (with / without): first tick {report['first_tick_ratio']:.2f}, "
        f"peak RSS {report['peak_rss_ratio']:.2f}",
        "targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}"
                                for k, v in report["targets"].items()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
