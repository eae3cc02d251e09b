"""The main job for a newcomer (`demo`), the what-if run (`simulate`), and the
controller loop (`run`): reproducible, complete, and stoppable between ticks."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from click.testing import CliRunner

from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.storage import db, registry
from falcon_es.jobtable import job_rows
from falcon_es.app import service
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.adapters.sim import load_sim_config
from falcon_es.app.demo import demo_config_path, run_demo
from falcon_es.domain.ports import TASK_EVENTS_TOPIC
from falcon_es.config.settings import Settings
from falcon_es.app.simulate import run_simulation
from falcon_es.engine import outbox
from tests.conftest import migrate

SPEC = {"image": "us-docker.pkg.dev/p/r/w:1", "tpu_type": "v7x", "topology": "2x2x1",
        "sim": {"duration_seconds": 300}}


def _rows(db_path: Path) -> list[tuple]:
    engine = db.make_engine(f"sqlite:///{db_path}")
    rows = job_rows.list_rows(engine)
    engine.dispose()
    return [(r["id"], r["status"], r["reason"], r["message"], r["finished_at"]) for r in rows]


def test_demo_covers_every_outcome_and_is_identical_on_every_run(tmp_path: Path) -> None:
    lines_a: list[str] = []
    lines_b: list[str] = []
    first = run_demo(tmp_path / "a.db", echo=lines_a.append)
    second = run_demo(tmp_path / "b.db", echo=lines_b.append)
    assert first["outcomes"] == {
        "Aborted": 1, "Failed/InvalidTopology": 1, "Failed/JobFailed": 2,
        "Failed/Timeout": 1, "Succeeded": 7,
    }
    assert first["pools_reused"] >= 1 and first["pools_created"] == first["pools_deleted"]
    assert _rows(tmp_path / "a.db") == _rows(tmp_path / "b.db")
    assert lines_a[:-1] == lines_b[:-1]  # the last block names the database file
    text = "\n".join(lines_a)
    for expected in ("OOMKilled (exit code 137)", "timed out after 600s", "aborted while Running",
                     "reservation v6e-res has 0 slice(s) free", "0/1 expected node(s) registered",
                     "handed over to", "invalid task spec: topology"):
        assert expected in text
    assert {k: v for k, v in first.items() if k not in ("wall_seconds", "database")} == {
        k: v for k, v in second.items() if k not in ("wall_seconds", "database")}
    # the demo registered the clusters of its world file itself, as they are described
    engine = db.make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.connect() as conn:
        clusters = {c.name: c for c in registry.list_clusters(conn)}
    engine.dispose()
    world = {c.name: c for c in load_sim_config(demo_config_path()).clusters}
    assert set(clusters) == set(world) == {"v6e-reserved", "v7x-reserved", "v7x-flex"}
    for name, entry in world.items():
        row = clusters[name]
        assert (row.project, row.location, row.tpu_type, row.gcs_bucket,
                row.default_reservation) == (entry.project, entry.location, entry.tpu_type,
                                             entry.gcs_bucket, entry.default_reservation)
    # its flex-start cluster is regional: addressed by its region, pools in its zone
    flex = clusters["v7x-flex"]
    assert (flex.kind, flex.location, flex.node_zone) == ("regional", "us-central1",
                                                          "us-central1-c")


def test_demo_database_replays_identically(tmp_path: Path) -> None:
    run_demo(tmp_path / "d.db", echo=lambda _: None)
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 'd.db'}", "replay", "--verify"])
    assert result.exit_code == 0, result.output
    assert "matches the live projections" in result.output


def test_simulate_reports_and_is_reproducible() -> None:
    first = run_simulation(tasks=25, seed=5)
    second = run_simulation(tasks=25, seed=5)
    drop = ("wall_seconds",)
    assert {k: v for k, v in first.items() if k not in drop} == {
        k: v for k, v in second.items() if k not in drop}
    assert sum(first["final_status"].values()) == 25 and first["unfinished"] == 0
    assert 0.0 <= first["pool_reuse_ratio"] <= 1.0
    assert set(first["wait_seconds_by_actor"]) <= {f"actor-{i}" for i in range(1, 6)}
    # the clusters simulate registered from its world file, and only those
    assert {q.split("/")[0] for q in first["wait_seconds_by_queue"]} <= {
        "v6e-reserved", "v7x-reserved", "v7x-flex"}
    assert first["node_pool_hours_by_supply_mode"]


def _fresh(tmp_path: Path) -> str:
    """A migrated database whose registry has one v7x cluster (the sim backend simulates
    the registry's clusters and registers none)."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    migrate(url)
    added = CliRunner().invoke(main, ["--db", url, "cluster", "add", "v7x-a", "--project", "p",
                                      "--location", "us-central1-c", "--tpu-type", "v7x",
                                      "--gcs-bucket", "logs", "--reservation", "v7x-a-r"])
    assert added.exit_code == 0, added.output
    return url


def test_run_until_idle_finishes_submitted_tasks_on_the_virtual_clock(tmp_path: Path) -> None:
    url = _fresh(tmp_path)
    engine = db.make_engine(url)
    for i in range(3):
        job_rows.submit(engine, task_id=f"r{i}", name=f"r{i}", actor="a", spec=SPEC,
                        now=dt.datetime(2026, 11, 1))
    result = CliRunner().invoke(main, ["--db", url, "run", "--until-idle", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert "stopped (idle)" in result.output
    assert {r["status"] for r in job_rows.list_rows(engine)} == {"Succeeded"}
    engine.dispose()


def test_stop_request_finishes_the_current_tick_then_returns(tmp_path: Path) -> None:
    url = _fresh(tmp_path)
    svc = build_service(open_app(Settings(db_url=url), VirtualClock(dt.datetime(2026, 11, 1))))
    job_rows.submit(svc.app.engine, task_id="s1", name="s1", actor="a", spec=SPEC,
                    now=dt.datetime(2026, 11, 1))
    stop = threading.Event()
    svc.loop.on_tick = lambda _report: stop.set()
    report = svc.loop.run(stop=stop)
    assert (report.ticks, report.stopped_by) == (1, "signal")
    assert job_rows.get_row(svc.app.engine, "s1")["reason"] is not None  # the tick committed
    svc.close()


def test_outbox_publishes_every_event_in_seq_order_once_with_a_cursor(tmp_path: Path) -> None:
    url = _fresh(tmp_path)
    svc = build_service(open_app(Settings(db_url=url), VirtualClock(dt.datetime(2026, 11, 1))))
    job_rows.submit(svc.app.engine, task_id="o1", name="o1", actor="a", spec=SPEC,
                    now=dt.datetime(2026, 11, 1))
    svc.loop.run(until_idle=True)
    bus = svc.ports.bus
    subscription = "ops-test"
    bus.subscribe(TASK_EVENTS_TOPIC, subscription)  # type: ignore[attr-defined]
    head = svc.app.store.head()
    assert outbox.publish_pending(svc.app.store, bus, batch_size=7) == head
    assert outbox.publish_pending(svc.app.store, bus) == 0
    assert outbox.lag(svc.app.store) == 0
    messages = []
    while batch := bus.pull(subscription):
        messages.extend(batch)
        bus.ack(subscription, [m.id for m in batch])
    seqs = [m.data["seq"] for m in messages]
    assert sorted(set(seqs)) == list(range(1, head + 1))
    task_msgs = [m for m in messages if m.attributes["stream_id"] == "o1"]
    assert [int(m.attributes["version"]) for m in task_msgs] == sorted(
        int(m.attributes["version"]) for m in task_msgs)
    svc.close()
