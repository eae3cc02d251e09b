"""Shared fixtures: every store/projection test runs on SQLite and on MariaDB.

MariaDB is required, never skipped: a test session that cannot reach it fails with a
message saying how to start it. Each session works in its own scratch database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import freezegun
import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.app.application import App, open_app
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable, metadata
from tests.support.harness import Harnesses

# pydantic builds a model's schema on first use; under a frozen clock it would meet
# freezegun's FakeDatetime (the kubernetes client's models are pydantic's), so whether
# a test passed would depend on which test used a model first.
freezegun.configure(extend_ignore_list=["pydantic", "pydantic_core", "kubernetes"])

MYSQL_SERVER = os.environ.get("FALCON_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
START = dt.datetime(2026, 11, 1, 9, 0, 0)


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    """A fresh MariaDB database for this test session (dropped afterwards)."""
    server = sa.create_engine(MYSQL_SERVER + "/", isolation_level="AUTOCOMMIT")
    name = f"falcon_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with server.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    except sa.exc.OperationalError as error:
        pytest.fail(
            f"MariaDB/MySQL is required for these tests and is unreachable at {MYSQL_SERVER} "
            f"({error.orig}). Start it (start-stop-daemon --start --oknodo --background "
            "--exec /usr/sbin/mariadbd) or set FALCON_TEST_MYSQL_URL.",
            pytrace=False,
        )
    url = f"{MYSQL_SERVER}/{name}?charset=utf8mb4"
    migrate(url)
    yield url
    with server.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    server.dispose()


@contextlib.contextmanager
def scratch_mysql(prefix: str) -> Iterator[str]:
    """A new, empty utf8mb4 database on the test server, dropped afterwards."""
    server = sa.create_engine(MYSQL_SERVER + "/", isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    try:
        yield f"{MYSQL_SERVER}/{name}?charset=utf8mb4"
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        server.dispose()


@pytest.fixture(params=["sqlite", "mysql"])
def bare_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it yet, on each dialect: no Falcon-ES schema, no job
    table (the upper layer's, which a test creates as the upper layer would)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'bare.db'}"
        return
    with scratch_mysql("falcon_bare") as url:
        yield url


def migrate(url: str, job: JobTable | None = None) -> None:
    """Falcon-ES's tables and a job table (the upper layer's, which the tests play)."""
    engine = db.make_engine(url)
    try:
        db.upgrade(engine)
        db.create_job_table(engine, job or JobTable())
    finally:
        engine.dispose()


def _empty_mysql(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(JobTable().table.delete())
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
        conn.exec_driver_sql("INSERT INTO log_head (id, last_seq) VALUES (1, 0)")
    engine.dispose()


@pytest.fixture(params=["sqlite", "mysql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database on each dialect."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'falcon.db'}"
        migrate(url)
        return url
    url = request.getfixturevalue("mysql_url")
    _empty_mysql(url)
    return url


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def app(db_url: str, clock: VirtualClock) -> Iterator[App]:
    application = open_app(Settings(db_url=db_url), clock)
    yield application
    application.close()


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Harnesses]:
    """Controllers on the sim world (``tests.support.harness``), closed at the end; a
    test module with a ``make`` of its own uses that one."""
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()
