"""The database can blink: a controller rides out an outage and a hang of its database
in the process (no exit), /readyz fails meanwhile, and every task ends as it does
without them, with nothing created twice and the log replaying clean.

On MariaDB a TCP proxy started by the test (``tests.support.db_proxy``) sits in front
of the server: it drops every connection (an outage), then later accepts and forwards
nothing (a hang). Each lasts ``FALCON_TEST_OUTAGE_SECONDS`` (default 4: longer than
every timeout of the test's settings, so it proves what a 30 s one does; set 30 for
the issue's figures). On SQLite the blink is another writer holding the write lock
past the busy timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from falcon_es.app import service
from falcon_es.cli import main
from falcon_es.config.settings import Settings
from falcon_es.domain.clock import VirtualClock, utcnow
from falcon_es.engine.runtime import TickReport
from falcon_es.observability.health import HealthServer
from falcon_es.storage import db
from tests.conftest import migrate, scratch_mysql
from tests.support.db_proxy import DatabaseProxy
from tests.support.replicas import (
    Effects, Replica, outcomes, shared_world, submit_tasks, verify_replay,
)

OUTAGE_SECONDS = float(os.environ.get("FALCON_TEST_OUTAGE_SECONDS", "4"))
TASKS = int(os.environ.get("FALCON_TEST_BLINK_TASKS", "40"))
#: Every wait bounded within seconds, and an outage limit far beyond the test's.
QUICK = {"connect_timeout": 2, "lock_wait_timeout": 1, "read_timeout": 2,
         "idle_transaction_timeout": 2, "lock_timeout": 3, "outage_limit": 120}


@contextlib.contextmanager
def fresh_mariadb(prefix: str = "falcon_blink") -> Iterator[str]:
    with scratch_mysql(prefix) as url:
        migrate(url)
        yield url


@pytest.fixture
def mariadb() -> Iterator[str]:
    with fresh_mariadb() as url:
        yield url


def run_to_the_end(url: str, settings: Settings, clock: VirtualClock, world: Any, *,
                   on_tick: Any = None, health: HealthServer | None = None) -> Replica:
    replica = Replica("a", url, world, clock, settings, until_idle=True, on_tick=on_tick,
                      health=health).start()
    replica.join(600)
    assert replica.error is None, f"the controller ended with {replica.error!r}"
    assert replica.report is not None and replica.report.stopped_by == "idle"
    return replica


def baseline(database: contextlib.AbstractContextManager[str],
             count: int) -> dict[str, tuple[str, str | None]]:
    """How ``count`` tasks end when the database never blinks."""
    with database as url:
        clock = VirtualClock(utcnow())
        world = shared_world(clock, url)
        submit_tasks(url, count, clock)
        run_to_the_end(url, Settings(db_url=url, **QUICK), clock, world)
        return outcomes(url)


class Blinks:
    """Called after each tick of the controller: after 20 ticks the proxy drops every
    connection for ``OUTAGE_SECONDS``; 20 ticks after that it hangs as long. Before
    each ends, /readyz is asked what it says."""

    def __init__(self, proxy: DatabaseProxy, health: HealthServer) -> None:
        self.proxy, self.health = proxy, health
        self.ticks = 0
        self.started: dict[str, float] = {}
        self.readiness: dict[str, dict[str, Any]] = {}
        self.timers: list[threading.Timer] = []

    def __call__(self, report: TickReport) -> None:
        self.ticks += 1
        if self.ticks == 20:
            self._begin("outage", self.proxy.drop)
        elif self.ticks == 40:
            self._begin("hang", self.proxy.hang)

    def _begin(self, kind: str, blink: Any) -> None:
        self.started[kind] = time.time()
        blink()
        timer = threading.Timer(OUTAGE_SECONDS, self._end, args=(kind,))
        self.timers.append(timer)
        timer.start()

    def _end(self, kind: str) -> None:
        self.readiness[kind] = json.loads(self.health.readyz().body)
        self.proxy.resume()


def test_a_controller_rides_out_an_outage_and_a_hang_of_mariadb(
        mariadb: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")
    base = baseline(fresh_mariadb("falcon_blink_base"), TASKS)
    proxy = DatabaseProxy()
    through = proxy.url(mariadb)
    settings = Settings(db_url=through, **QUICK)
    probe = db.make_engine(through, settings.database)

    def database_check() -> None:
        with probe.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    health = HealthServer(database_check=database_check)
    blinks = Blinks(proxy, health)
    clock = VirtualClock(utcnow())
    world = shared_world(clock, mariadb)
    effects = Effects(world, monkeypatch)
    submit_tasks(mariadb, TASKS, clock)
    try:
        run_to_the_end(through, settings, clock, world, on_tick=blinks, health=health)
    finally:
        for timer in blinks.timers:
            timer.join(OUTAGE_SECONDS + 10)
        proxy.close()
        probe.dispose()
    assert set(blinks.readiness) == {"outage", "hang"}
    for kind, said in blinks.readiness.items():
        assert said["ready"] is False, (kind, said)
        assert said["database"].startswith("unreachable"), (kind, said)
    # Whichever reads first sees the hang: the tick (its reads have a pool of their
    # own) or the controller lock's check, on the lock's connection.
    hang_seen = [r.created - blinks.started["hang"] for r in caplog.records
                 if ("database unavailable" in r.getMessage()
                     or "its database connection failed" in r.getMessage())
                 and r.created >= blinks.started["hang"]]
    assert hang_seen and hang_seen[0] < settings.database.read_timeout + 2, hang_seen
    assert outcomes(mariadb) == base
    assert effects.created_twice() == {}
    assert verify_replay(mariadb) == []


def test_a_controller_rides_out_a_sqlite_write_lock_held_past_the_busy_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")

    @contextlib.contextmanager
    def fresh_sqlite(name: str) -> Iterator[str]:
        url = f"sqlite:///{tmp_path / name}"
        migrate(url)
        yield url

    base = baseline(fresh_sqlite("base.db"), 12)
    with fresh_sqlite("blink.db") as url:
        holder = sqlite3.connect(str(tmp_path / "blink.db"), isolation_level=None,
                                 check_same_thread=False)
        ticks, released = 0, threading.Event()

        def hold_the_write_lock(report: TickReport) -> None:
            nonlocal ticks
            ticks += 1
            if ticks == 10:
                holder.execute("BEGIN IMMEDIATE")
                threading.Timer(3.0, lambda: (holder.execute("ROLLBACK"), released.set())).start()

        clock = VirtualClock(utcnow())
        world = shared_world(clock, url)
        effects = Effects(world, monkeypatch)
        submit_tasks(url, 12, clock)
        run_to_the_end(url, Settings(db_url=url, **QUICK), clock, world,
                       on_tick=hold_the_write_lock)
        assert released.wait(10)
        holder.close()
        assert any("database unavailable" in r.getMessage() and "database is locked"
                   in r.getMessage() for r in caplog.records)
        assert outcomes(url) == base
        assert effects.created_twice() == {}
        assert verify_replay(url) == []


def test_the_controller_exits_only_after_an_outage_longer_than_the_limit(
        mariadb: str) -> None:
    """An outage that does not end: the controller retries for FALCON_DB_OUTAGE_LIMIT
    seconds (here 4), standing by once the lock went with its connection, then gives
    up with the database's words (``falcon-es run`` exits rc 3 on it)."""
    proxy = DatabaseProxy()
    through = proxy.url(mariadb)
    settings = Settings(db_url=through, **{**QUICK, "outage_limit": 4})
    clock = VirtualClock(utcnow())
    world = shared_world(clock, mariadb)
    submit_tasks(mariadb, 8, clock)
    dropped: list[float] = []

    def drop_for_good(report: TickReport) -> None:
        if not dropped:
            dropped.append(time.monotonic())
            proxy.drop()

    replica = Replica("a", through, world, clock, settings, on_tick=drop_for_good).start()
    try:
        replica.join(60)
    finally:
        replica.halt()
        proxy.close()
    lasted = time.monotonic() - dropped[0]
    assert isinstance(replica.error, service.DatabaseOutage), replica.error
    assert "has not answered for" in str(replica.error)
    assert settings.database.outage_limit < lasted < settings.database.outage_limit + 8


def test_run_exits_rc_3_naming_the_database_once_the_outage_limit_has_passed() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"mysql+pymysql://root@127.0.0.1:{port}/nowhere"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["--db", url, "run", "--leader-election", "db"],
                                env={"FALCON_DB_OUTAGE_LIMIT": "2"})
    assert result.exit_code == 3, result.output
    assert "the database has not answered for" in result.output
    assert "Can't connect to MySQL server" in result.output
    assert 2 < time.monotonic() - started < 15
