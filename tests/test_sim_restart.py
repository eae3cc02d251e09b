"""``falcon-es run --backend sim`` killed with SIGKILL and started again goes on in the
same simulated world, on MariaDB, as real processes.

A few hundred tasks (reservation and flex-start clusters, every sim outcome but the
ones that wait out a timeout, delivery faults on) run once without a kill, with the
world in memory only, to learn how each ends. Then the same workload runs in a second database while the controller is
killed with SIGKILL at least 20 times at random points of its log (a kill lands
wherever the process happens to be: mid-tick, mid-commit, between a call and the
commit that records it) and started again each time, until it goes idle. Every task
ends with the Status and Reason of the run without kills; the world's own record of
the creates it accepted shows no pool and no Job created twice; no pool is left; and
``falcon-es replay --verify`` finds the log and its views in agreement.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.adapters.sim.persist import WorldStore
from falcon_es.domain.clock import VirtualClock
from tests.conftest import migrate, scratch_mysql

TASKS = 200
KILLS = 20
SUBMITTED = dt.datetime(2026, 11, 1, 9, 0, 0)
#: How often the test looks at the log's head while waiting for a kill point (wall).
POLL_SECONDS = 0.02
#: A controller that neither appends nor ends within this long is stuck (wall).
STUCK_SECONDS = 120
CONFIG = {
    "defaults": {"delete_failures": {"probability": 0.1}},
    "clusters": {"v6e-res": {"default_reservation": "v6e-res-r"}, "v7x-flex": {}},
    "delivery": {"late_probability": 0.1, "max_late_seconds": 20,
                 "duplicate_probability": 0.1, "reorder_probability": 0.1,
                 "reorder_max_hold_seconds": 30},
}
#: (sim outcome, share): each ends the task its own way without waiting out a timeout.
OUTCOMES = (("succeed", 14), ("fail", 2), ("oom", 2), ("image-pull-error", 1),
            ("create-denied", 1))


def workload() -> list[tuple[str, dict[str, object]]]:
    """The tasks, the same in both runs: (task id, spec)."""
    rng = random.Random(12)
    kinds = [outcome for outcome, share in OUTCOMES for _ in range(share)]
    tasks = []
    for i in range(TASKS):
        sim: dict[str, object] = {"outcome": kinds[i % len(kinds)],
                                  "duration_seconds": rng.randint(60, 1500)}
        if sim["outcome"] == "fail":
            sim["exit_code"] = 3
        tpu, topology = ("v6e", "2x2") if i % 2 else ("v7x", "2x2x1")
        tasks.append((f"task-{i:03d}", {"image": "us-docker.pkg.dev/p/r/train:1",
                                        "tpu_type": tpu, "topology": topology, "sim": sim}))
    return tasks


def cli(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "falcon_es", "--db", url, *args]


def prepare(url: str, tmp_path: Path, *, snapshot_every: int) -> list[str]:
    """The database with both clusters registered and every task submitted; returns
    the ``run`` command line (``snapshot_every`` 0: the world in memory only)."""
    migrate(url)
    for name, tpu, reservation in (("v6e-res", "v6e", ["--reservation", "v6e-res-r"]),
                                   ("v7x-flex", "v7x", [])):
        subprocess.run(cli(url, "cluster", "add", name, "--project", "proj", "--location",
                           "us-east5-b", "--tpu-type", tpu, "--gcs-bucket", "logs",
                           *reservation), check=True, capture_output=True)
    engine = db.make_engine(url)
    for task_id, spec in workload():
        job_rows.submit(engine, task_id=task_id, name=task_id, actor=f"user-{task_id[-1]}",
                        spec=spec, now=SUBMITTED)
    engine.dispose()
    config = tmp_path / "world.json"
    config.write_text(json.dumps(CONFIG))
    return cli(url, "run", "--backend", "sim", "--until-idle", "--seed", "4",
               "--sim-config", str(config), "--sim-snapshot-every", str(snapshot_every), "--no-health")


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "FALCON_LOG_FORMAT": "text"})


def last_seq(engine: sa.engine.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT last_seq FROM log_head")).scalar_one()


def wait_for(process: subprocess.Popen[bytes], engine: sa.engine.Engine,
             target: int | None) -> bool:
    """Until the log reaches ``target`` (True) or the process ends (False)."""
    progress, since = last_seq(engine), time.monotonic()
    while process.poll() is None:
        seq = last_seq(engine)
        if target is not None and seq >= target:
            return True
        if seq != progress:
            progress, since = seq, time.monotonic()
        if time.monotonic() - since > STUCK_SECONDS:
            process.kill()
            raise AssertionError(f"the controller made no progress in {STUCK_SECONDS}s at "
                                 f"seq {seq}")
        time.sleep(POLL_SECONDS)
    return False


def outcomes(engine: sa.engine.Engine) -> dict[str, tuple[str, str | None]]:
    return {row["id"]: (row["status"], row["reason"]) for row in job_rows.list_rows(engine)}


pytestmark = pytest.mark.slow  # about 90 s of real processes (CI runs slow tests too)


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    with scratch_mysql("falcon_calm") as calm, scratch_mysql("falcon_killed") as killed:
        yield calm, killed


def test_killed_and_restarted_twenty_times_every_task_ends_as_without_kills(
        databases: tuple[str, str], tmp_path: Path) -> None:
    calm_url, killed_url = databases
    log = tmp_path / "controller.log"
    calm = start(prepare(calm_url, tmp_path, snapshot_every=0), log)
    assert calm.wait(timeout=600) == 0, log.read_text()[-3000:]
    calm_engine = db.make_engine(calm_url)
    expected = outcomes(calm_engine)
    total = last_seq(calm_engine)
    calm_engine.dispose()
    assert {status for status, _ in expected.values()} >= {"Succeeded", "Failed"}
    assert {reason for _, reason in expected.values()} >= {None, "JobFailed", "JobSubmitFailed"}

    command = prepare(killed_url, tmp_path, snapshot_every=50)
    engine = db.make_engine(killed_url)
    rng = random.Random(2026)
    targets = sorted(rng.randint(total // 40, total * 9 // 10) for _ in range(KILLS))
    kills = 0
    for target in targets:
        process = start(command, log)
        if wait_for(process, engine, max(target, last_seq(engine) + 1)):
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
        else:
            break
    final = start(command, log)
    assert not wait_for(final, engine, None)
    assert final.returncode == 0, log.read_text()[-3000:]
    assert kills >= KILLS, f"only {kills} kills landed before the run ended"

    assert outcomes(engine) == expected
    world = WorldStore(engine).load(VirtualClock(SUBMITTED))
    assert world is not None
    twice = {name: n for name, n in world.creates.counts.items() if n > 1}
    assert twice == {}, f"created more than once: {twice}"
    pools = [key for key in world.creates.counts if "/NodePool/" in key]
    assert len([key for key in world.creates.counts if "/Job/" in key]) >= TASKS
    assert pools and world.pools() == [], "no pool is left behind"
    assert len(world.pools(include_deleted=True)) == len(pools)
    replay = subprocess.run(cli(killed_url, "replay", "--verify"), capture_output=True, text=True)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    engine.dispose()
