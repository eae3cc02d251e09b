"""``falcon-es bench store``: the event store against the raw database, in one run.

On one scratch database (a scratch database on the MySQL/MariaDB server of ``--db``, or
a scratch SQLite file) it measures:

(a) ``EventStore.append``, one tick transaction at a time: ``tick`` realistic task
    events over several task streams (a few events each, tasks at every stage of their
    life), with the expected-version checks and the inline projections the application
    runs (``TaskStates`` fold, job-table compare-and-set, queue view);
(b) the same rows through raw SQLAlchemy Core: one ``INSERT`` executemany per tick
    transaction into a twin of ``task_events`` (the ceiling);
(c) replay: the streamed fold ``replay --verify`` and ``--rebuild`` run
    (``falcon_es.engine.log_fold.final_states``: decode into typed events, fold every task,
    hand each one out once its last event is folded, in memory bounded by the tasks
    in flight);
(d) a raw ``SELECT`` scan of ``task_events`` in the same batches, JSON decoded.

(a) and (b) alternate tick by tick and (c) and (d) round by round, so a busy machine
slows both sides of each ratio alike. Targets: a/b >= 0.7 and c/d >= 0.85.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.storage import db
from falcon_es.config.db_urls import DEFAULT_URL
from falcon_es.domain import events as ev
from falcon_es.app.application import open_app
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.log_fold import final_states
from falcon_es.config.settings import Settings
from falcon_es.storage.store import Meta, RecordedEvent, StreamAppend
from falcon_es.storage.tables import JobTable, task_events
from falcon_es.bench.scratch import bench_mapping, scratch_mysql_database
from falcon_es.projections import replay

START = dt.datetime(2026, 11, 1, 8, 0, 0)
#: Events each task stream gets in one tick (a tick touches tick / this many streams).
EVENTS_PER_STREAM = 5
#: Rounds of the replay-vs-scan comparison (the best of each side is compared).
SCAN_ROUNDS = 7
SCAN_BATCH = 5000
#: The targets: the append with its inline projections against raw batched INSERTs,
#: the replay's fold against a raw scan.
APPEND_TARGET, REPLAY_TARGET = 0.7, 0.85
META = Meta(actor="controller", controller="bench")
SPEC_ITEMS = (("image", "us-docker.pkg.dev/p/r/train:1"), ("tpu_type", "v6e"), ("topology", "2x2"))

EventFactory = Callable[[str, int], ev.Event]


def _pool(task_id: str) -> str:
    return f"falcon-{task_id[-12:]}"


def _ending(task_id: str, index: int) -> ev.Event:
    if index % 7 == 3:
        return ev.JobFailed("OOMKilled (exit code 137)", 137)
    return ev.JobSucceeded(4)


#: One task's life, as the controller records it (each step legal after the previous).
LIFE: tuple[EventFactory, ...] = (
    lambda t, i: ev.TaskAccepted(f"job-{i}", f"actor-{i % 50:02d}", dict(SPEC_ITEMS), "v6e", "2x2", START),
    lambda t, i: ev.ClusterChosen("c-1", "gke-a", "2x2", "queue-depth", (
        {"name": "gke-a", "queued": 3}, {"name": "gke-b", "queued": 5})),
    lambda t, i: ev.TaskPicked("c-1", "2x2", "fifo", (), f"actor-{(i + 1) % 50:02d}"),
    lambda t, i: ev.ReservationInsufficient("res-a", 0, 1, 1),
    lambda t, i: ev.NodePoolCreateRequested(_pool(t), "reservation", "ct6e-standard-4t", 1,
                                            "res-a", 300),
    lambda t, i: ev.NodePoolCreateStarted(_pool(t), f"operation-{i}"),
    lambda t, i: ev.NodePoolNotVisible(_pool(t), 1),
    lambda t, i: ev.NodesNotReady(_pool(t), 0, 1, 1),
    lambda t, i: ev.NodesNotReady(_pool(t), 0, 1, 2),
    lambda t, i: ev.NodePoolReady(_pool(t), 1),
    lambda t, i: ev.JobSubmitRequested(f"falcon-{t[-12:]}", _pool(t)),
    lambda t, i: ev.JobSubmitted(f"falcon-{t[-12:]}", str(uuid.UUID(int=i))),
    lambda t, i: ev.PodsPending("0/1 nodes available: Insufficient google.com/tpu"),
    lambda t, i: ev.PodsRunning(1, 1),
    _ending,
    lambda t, i: ev.NodePoolDeleteRequested(_pool(t)),
    lambda t, i: ev.NodePoolDeleted(_pool(t)),
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every tick's appends, built before anything is timed."""

    task_ids: tuple[str, ...]
    ticks: tuple[tuple[StreamAppend, ...], ...]

    @property
    def events(self) -> int:
        return sum(len(a.events) for tick in self.ticks for a in tick)


def plan(events: int, tick: int) -> Plan:
    """``events`` task events in ticks of ``tick``, ``EVENTS_PER_STREAM`` per stream; a
    task whose life is over makes room for a new one."""
    active: deque[tuple[str, int, int]] = deque()  # (task id, task index, next step)
    started = 0
    task_ids: list[str] = []
    ticks: list[tuple[StreamAppend, ...]] = []
    left = events

    def new_task() -> tuple[str, int, int]:
        nonlocal started
        task_id = f"bench-{started:08d}-{uuid.UUID(int=started).hex[-8:]}"
        task_ids.append(task_id)
        started += 1
        return task_id, started - 1, 0

    while left:
        budget = min(tick, left)
        appends: list[StreamAppend] = []
        carried_on: list[tuple[str, int, int]] = []  # a stream appears once per tick
        while budget:
            task_id, index, step = active.popleft() if active else new_task()
            count = min(EVENTS_PER_STREAM, budget, len(LIFE) - step)
            batch = tuple(factory(task_id, index) for factory in LIFE[step:step + count])
            appends.append(StreamAppend(task_id, step, batch, META))
            budget -= count
            if step + count < len(LIFE):
                carried_on.append((task_id, index, step + count))
        active.extend(carried_on)
        ticks.append(tuple(appends))
        left -= sum(len(a.events) for a in appends)
    return Plan(tuple(task_ids), tuple(ticks))


@contextlib.contextmanager
def scratch_database(db_url: str) -> Iterator[str]:
    """A database of the same kind as ``db_url`` that nobody else uses, removed after:
    a scratch database on the same MySQL/MariaDB server, or a scratch SQLite file next
    to the configured one (the same disk), or in a temporary directory by default."""
    url = sa.engine.make_url(db_url)
    backend = url.get_backend_name()
    if backend in ("mysql", "mariadb"):
        with scratch_mysql_database(url, "falcon_bench_store") as scratch:
            yield scratch
        return
    given = url.database if url.database and db_url != DEFAULT_URL else None
    with tempfile.TemporaryDirectory(dir=Path(given).resolve().parent if given else None,
                                     prefix=".falcon-bench-") as tmp:
        yield f"sqlite:///{Path(tmp) / 'bench.db'}"


def _twin_of_the_log(engine: Engine) -> sa.Table:
    """A table shaped exactly like ``task_events`` (keys, unique pair, time index)."""
    metadata = sa.MetaData()
    twin = task_events.to_metadata(metadata, name="bench_raw_events")
    sa.Index("ix_bench_raw_events_recorded_at", twin.c.recorded_at)
    metadata.create_all(engine)
    return twin


def _insert_job_rows(engine: Engine, job: JobTable, task_ids: Sequence[str]) -> None:
    rows = [{"id": t, "name": f"job-{i}", "actor": f"actor-{i % 50:02d}", "spec": dict(SPEC_ITEMS),
             "status": "Pending", "created_at": START, "updated_at": START}
            for i, t in enumerate(task_ids)]
    with engine.begin() as conn:
        for first in range(0, len(rows), 1000):
            conn.execute(job.table.insert(), rows[first:first + 1000])


def _raw_rows(recorded: Sequence[RecordedEvent]) -> list[dict[str, Any]]:
    return [{"seq": r.seq, "stream_id": r.stream_id, "version": r.version, "type": r.type_name,
             "schema_version": r.event.schema_version, "data": r.event.to_data(),
             "meta": dict(r.meta), "recorded_at": r.recorded_at} for r in recorded]


def _raw_scan(engine: Engine) -> int:
    """The ceiling of a replay: read the log in the same keyset batches, JSON decoded."""
    reader = db.read_only(engine)
    position, count = 0, 0
    while True:
        query = (sa.select(task_events).where(task_events.c.seq > position)
                 .order_by(task_events.c.seq).limit(SCAN_BATCH))
        with reader.connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return count
        count += len(rows)
        position = rows[-1].seq


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def store_benchmark(settings: Settings, events: int = 20_000, tick: int = 100) -> dict[str, Any]:
    """Run (a)-(d) on a scratch database of the configured kind; see ``format_report``."""
    if events < 1 or tick < 1:
        raise ValueError(f"events ({events}) and tick ({tick}) must be at least 1")
    work = plan(events, tick)
    with scratch_database(settings.database.db_url) as url:
        engine = db.make_engine(url)
        try:
            bench_settings = Settings.of(**{
                **dict(settings), "db_url": url, "job_mapping": bench_mapping(settings.job_mapping)})
            return _measure(engine, work, tick, bench_settings)
        finally:
            engine.dispose()


def _measure(engine: Engine, work: Plan, tick: int, settings: Settings) -> dict[str, Any]:
    """On the settings' job-table names (in the scratch database), so a renamed mapping
    is measured as it runs."""
    lang = settings.job_table.language
    job = JobTable(settings.job_mapping)
    db.upgrade(engine)
    db.create_job_table(engine, job)
    raw = _twin_of_the_log(engine)
    _insert_job_rows(engine, job, work.task_ids)
    clock = VirtualClock(START)
    app = open_app(settings, clock, engine=engine)
    store = app.store

    append_seconds = raw_seconds = 0.0
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for appends in work.ticks:
            clock.advance(1)
            started = time.perf_counter()
            recorded = store.append(appends)
            append_seconds += time.perf_counter() - started
            rows = _raw_rows(recorded)
            started = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(raw.insert(), rows)
            raw_seconds += time.perf_counter() - started

        replay_best = scan_best = float("inf")
        for _ in range(SCAN_ROUNDS):
            started = time.perf_counter()
            folded = sum(1 for _ in final_states(store.reader.connect))
            replay_best = min(replay_best, time.perf_counter() - started)
            started = time.perf_counter()
            scanned = _raw_scan(engine)
            scan_best = min(scan_best, time.perf_counter() - started)
    finally:
        if gc_was_enabled:
            gc.enable()

    count = work.events
    differences = replay.verify(engine, store, lang, job=app.job)
    append_rate, raw_rate = _rate(count, append_seconds), _rate(count, raw_seconds)
    replay_rate, scan_rate = _rate(count, replay_best), _rate(scanned, scan_best)
    return {
        "backend": engine.dialect.name,
        "server_version": ".".join(map(str, engine.dialect.server_version_info or ())),
        "events": count,
        "tick": tick,
        "ticks": len(work.ticks),
        "streams_per_tick": max(1, tick // EVENTS_PER_STREAM),
        "tasks": len(work.task_ids),
        "append_events_per_s": append_rate,
        "raw_insert_events_per_s": raw_rate,
        "append_ratio": append_rate / raw_rate if raw_rate else 0.0,
        "replay_events_per_s": replay_rate,
        "raw_scan_events_per_s": scan_rate,
        "replay_ratio": replay_rate / scan_rate if scan_rate else 0.0,
        "replayed_tasks": folded,
        "replay_matches_live": not differences,
        "targets": {
            f"append_ratio >= {APPEND_TARGET}": append_rate >= APPEND_TARGET * raw_rate,
            f"replay_ratio >= {REPLAY_TARGET}": replay_rate >= REPLAY_TARGET * scan_rate,
        },
    }


def format_report(report: dict[str, Any]) -> str:
    backend = report["backend"] + (f" {report['server_version']}" if report["server_version"] else "")
    lines = [
        (f"store benchmark on {backend}: {report['events']:,} events in {report['ticks']:,} "
         f"ticks of {report['tick']} ({report['streams_per_tick']} task streams each), "
         f"{report['tasks']:,} tasks"),
        "",
        f"(a) append, tick transactions, inline projection  {report['append_events_per_s']:>12,.0f} events/s",
        f"(b) raw INSERT executemany per tick (ceiling)     {report['raw_insert_events_per_s']:>12,.0f} events/s",
        f"    a/b = {report['append_ratio']:.2f}",
        f"(c) replay: streamed fold of the whole log        {report['replay_events_per_s']:>12,.0f} events/s",
        f"(d) raw SELECT scan with JSON decode (ceiling)    {report['raw_scan_events_per_s']:>12,.0f} events/s",
        f"    c/d = {report['replay_ratio']:.2f}",
        "",
        (f"replay of {report['replayed_tasks']:,} tasks "
         f"{'matches' if report['replay_matches_live'] else 'DIFFERS FROM'} the live job table"),
        "targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}"
                                for k, v in report["targets"].items()),
    ]
    return "\n".join(lines)
