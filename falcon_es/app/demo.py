"""``falcon-es demo``: the whole lifecycle on three simulated clusters in a minute.

A fresh SQLite database, three clusters that the demo registers from its world file
(v6e with a reservation, v7x with a reservation, v7x flex-start), a dozen tasks from three actors covering the cases a
newcomer should see: success, an OOM, a timeout, an abort mid-run, an invalid spec, a
reservation too small for the moment, a flex-start stockout that resolves, and a pool
handed over to the next task. Virtual time starts at a fixed moment, so every run with
the same seed prints the same thing.
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tabulate import tabulate

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from sqlalchemy.engine import Engine

from falcon_es.app import service
from falcon_es.adapters.sim import load_sim_config
from falcon_es.adapters.sim.persist import WorldStore
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.runtime import TickReport
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable

DEMO_START = dt.datetime(2026, 1, 5, 9, 0, 0)
IMAGE = "us-docker.pkg.dev/falcon-demo/tpu/jax-workloads:2026.01"

#: (task id, actor, name, spec, abort when Running).
DEMO_TASKS: tuple[tuple[str, str, str, Mapping[str, Any], bool], ...] = (
    ("t01", "alice", "profiling-v7x",
     {"tpu_type": "v7x", "topology": "2x2x1", "sim": {"duration_seconds": 900}}, False),
    ("t02", "bob", "benchmark-v6e",
     {"tpu_type": "v6e", "topology": "2x2", "sim": {"duration_seconds": 600}}, False),
    ("t03", "carol", "oom-v6e",
     {"tpu_type": "v6e", "topology": "2x2", "sim": {"duration_seconds": 300, "outcome": "oom"}}, False),
    ("t04", "alice", "long-eval-v6e",
     {"tpu_type": "v6e", "topology": "2x2", "timeout_seconds": 600,
      "sim": {"duration_seconds": 3600}}, False),
    ("t05", "bob", "abort-me-v7x",
     {"tpu_type": "v7x", "topology": "2x2x2", "sim": {"duration_seconds": 3600}}, True),
    ("t06", "carol", "bad-topology",
     {"tpu_type": "v6e", "topology": "3x3"}, False),
    ("t07", "alice", "train-4x4-a",
     {"tpu_type": "v6e", "topology": "4x4", "sim": {"duration_seconds": 1200}}, False),
    ("t08", "bob", "train-4x4-b",
     {"tpu_type": "v6e", "topology": "4x4", "sim": {"duration_seconds": 600}}, False),
    ("t09", "carol", "flex-v7x",
     {"tpu_type": "v7x", "topology": "2x2x1", "supply_mode": "flex-start",
      "sim": {"duration_seconds": 600}}, False),
    ("t10", "alice", "accuracy-v7x",
     {"tpu_type": "v7x", "topology": "2x2x1", "sim": {"duration_seconds": 450}}, False),
    ("t11", "bob", "sweep-v6e",
     {"tpu_type": "v6e", "topology": "2x2", "sim": {"duration_seconds": 300}}, False),
    ("t12", "carol", "exit-3-v7x",
     {"tpu_type": "v7x", "topology": "2x2x1",
      "sim": {"duration_seconds": 120, "outcome": "fail", "exit_code": 3}}, False),
)
COLUMNS = ("id", "name", "actor", "status", "reason", "message")
MESSAGE_WIDTH = 88


def demo_config_path() -> Path:
    return Path(str(importlib.resources.files("falcon_es.demo_data").joinpath("world.json")))


def run_demo(db_path: Path, *, seed: int | None = None, lang: str = "en",
             echo: Callable[[str], None] = print, live: bool = False) -> dict[str, Any]:
    """Run the demo into ``db_path`` (replaced); returns the summary it printed."""
    wall_start = time.perf_counter()
    for suffix in ("", "-wal", "-shm", ".controller.lock"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{db_path}"
    settings = Settings.of(db_url=url, language=lang)
    engine = db.make_engine(url)
    db.upgrade(engine)
    db.create_job_table(engine, JobTable(settings.job_mapping))
    engine.dispose()
    clock = VirtualClock(DEMO_START)
    app = open_app(settings, clock)
    view = _LiveView(echo, live, clock, app.engine, app.job)
    to_abort = {task_id for task_id, *_, abort in DEMO_TASKS if abort}

    def on_tick(report: TickReport) -> None:
        for task_id in sorted(to_abort):
            state = svc.app.tasks.get(task_id)
            if state is not None and state.status == "Running":
                job_rows.request_abort(svc.app.engine, task_id, clock.now(), job=svc.app.job)
                to_abort.discard(task_id)
        view.refresh()

    world = load_sim_config(demo_config_path())
    register_sim_clusters(app, world)  # the demo's own clusters, before it starts
    svc = build_service(app, None, RunOptions(sim_config=world, seed=seed, on_tick=on_tick))
    for offset, (task_id, actor, name, spec, _) in enumerate(DEMO_TASKS):
        job_rows.submit(svc.app.engine, task_id=task_id, name=name, actor=actor,
                        spec={"image": IMAGE, "command": ["python", "-m", "workload"], **spec},
                        now=DEMO_START + dt.timedelta(seconds=offset), job=svc.app.job)
    loop_report = svc.loop.run(until_idle=True, max_ticks=20_000)
    _keep_world(svc)
    view.final()
    summary = _summary(svc, loop_report.ticks, time.perf_counter() - wall_start, db_path)
    echo(_format_summary(summary))
    svc.close()
    return summary


def _keep_world(svc: service.Service) -> None:
    """Save the world beside the log (once, at the end), so ``falcon-es logs`` reads
    what the demo's simulated pods wrote."""
    if svc.world is None:
        return
    store = WorldStore(svc.app.engine, compact_every=1)
    store.attach(svc.world)
    with svc.app.engine.begin() as conn:
        store.save(conn)


class _LiveView:
    """Prints the job table whenever a Status or Reason changes: redrawn in place on a
    terminal, as change lines otherwise (so logs and CI stay readable)."""

    def __init__(self, echo: Callable[[str], None], live: bool, clock: VirtualClock,
                 engine: Engine, job: JobTable) -> None:
        self.echo = echo
        self.live = live
        self.clock = clock
        self.engine = engine
        self.job = job
        self.seen: dict[str, tuple[str, str | None, str | None]] = {}

    def rows(self) -> list[dict[str, Any]]:
        return job_rows.list_rows(self.engine, job=self.job)

    def refresh(self) -> None:
        rows = self.rows()
        changed = []
        for row in rows:
            key = (row["status"], row["reason"], row["message"])
            if self.seen.get(row["id"]) != key:
                changed.append(row)
                self.seen[row["id"]] = key
        if not changed:
            return
        stamp = self.clock.now().strftime("%H:%M:%S")
        if self.live:
            self.echo("\x1b[H\x1b[2J" + f"Falcon-ES demo  virtual time {stamp}\n\n" + _table(rows))
            return
        for row in changed:
            state = f"{row['status']}/{row['reason']}" if row["reason"] else row["status"]
            self.echo(f"{stamp}  {row['id']} {row['name']:<15} {state:<24} {_clip(row['message'])}")

    def final(self) -> None:
        self.echo("\n" + _table(self.rows()))


def _clip(message: str | None, width: int = MESSAGE_WIDTH) -> str:
    text = message or ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: list[dict[str, Any]]) -> str:
    return tabulate([[r["id"], r["name"], r["actor"], r["status"], r["reason"] or "",
                      _clip(r["message"])] for r in rows], headers=COLUMNS)


def _summary(svc: service.Service, ticks: int, wall: float, db_path: Path) -> dict[str, Any]:
    rows = job_rows.list_rows(svc.app.engine, job=svc.app.job)
    outcomes = Counter(f"{r['status']}/{r['reason']}" if r["reason"] else r["status"] for r in rows)
    events = Counter(r.type_name for r in svc.app.store.read_after(0))
    virtual = svc.loop.clock.now() - DEMO_START
    return {
        "tasks": len(rows), "outcomes": dict(sorted(outcomes.items())),
        "pools_created": events["NodePoolCreateRequested"],
        "pools_reused": events["NodePoolReused"] + events["NodePoolTaken"],
        "pools_deleted": events["NodePoolDeleted"], "events": sum(events.values()),
        "ticks": ticks, "virtual_seconds": int(virtual.total_seconds()),
        "wall_seconds": round(wall, 2), "database": str(db_path),
    }


def _format_summary(summary: dict[str, Any]) -> str:
    db_flag = f"--db sqlite:///{summary['database']}"
    lines = [
        "",
        f"{summary['tasks']} tasks in {summary['virtual_seconds'] // 60} virtual minutes "
        f"({summary['ticks']} ticks, {summary['events']} events, {summary['wall_seconds']} s wall)",
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items()),
        f"node pools: {summary['pools_created']} created, {summary['pools_reused']} reused "
        f"(handed over), {summary['pools_deleted']} deleted",
        "",
        "Look deeper:",
        f"  falcon-es {db_flag} history t08        # every step of a task, with causes",
        f"  falcon-es {db_flag} queues             # queue views",
        f"  falcon-es {db_flag} replay --verify    # rebuild the projections from the log",
        f"  falcon-es {db_flag} events --json      # the log itself",
        f"  falcon-es {db_flag} logs t03           # what the OOM-killed task's pod wrote",
        f"  falcon-es {db_flag} timeline -o timeline.html   # pools and tasks on one page",
    ]
    return "\n".join(lines)


def summary_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2)
