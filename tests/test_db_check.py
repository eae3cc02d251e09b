"""``falcon-es db check`` on the upper layer's own job table: every missing, mistyped or
wrongly NOT NULL column is named; a usable table passes. Both dialects."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from tests.conftest import MYSQL_SERVER
from falcon_es import db
from falcon_es.cli import main

#: The upper layer's table as someone might have written it by hand: no aborted_at, no
#: job_uid, created_at stored as text, and a reason that may never be empty.
BROKEN_JOB_TABLE = """
CREATE TABLE {table} (
    id VARCHAR(64) PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    actor VARCHAR(128) NOT NULL,
    spec JSON,
    status VARCHAR(32) NOT NULL,
    reason VARCHAR(64) NOT NULL,
    message TEXT,
    created_at VARCHAR(32) NOT NULL,
    updated_at DATETIME,
    aborting_at DATETIME,
    cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64),
    dispatched_at DATETIME,
    finished_at DATETIME
)
"""

#: Different from Falcon-ES's own migration, yet usable: extra columns, ENUM status,
#: LONGTEXT message, TIMESTAMP(6) times (MySQL); TEXT spec (SQLite).
USABLE_JOB_TABLE = {
    "mysql": """
CREATE TABLE job (
    id VARCHAR(40) PRIMARY KEY,
    name VARCHAR(100) NOT NULL,
    actor VARCHAR(64) NOT NULL,
    spec JSON,
    status ENUM('Pending','Running','Succeeded','Failed','Aborting','Aborted') NOT NULL,
    reason VARCHAR(64),
    message LONGTEXT,
    created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at TIMESTAMP(6) NULL,
    aborting_at DATETIME(6) NULL,
    aborted_at DATETIME(6) NULL,
    cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64),
    job_uid VARCHAR(64),
    dispatched_at DATETIME(6) NULL,
    finished_at DATETIME(6) NULL,
    owner_team VARCHAR(64),
    priority INT NOT NULL DEFAULT 0
)""",
    "sqlite": """
CREATE TABLE job (
    id TEXT PRIMARY KEY,
    name VARCHAR(100) NOT NULL,
    actor VARCHAR(64) NOT NULL,
    spec TEXT,
    status VARCHAR(16) NOT NULL,
    reason VARCHAR(64),
    message TEXT,
    created_at DATETIME NOT NULL,
    updated_at DATETIME,
    aborting_at DATETIME,
    aborted_at DATETIME,
    cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64),
    job_uid VARCHAR(64),
    dispatched_at DATETIME,
    finished_at DATETIME,
    owner_team TEXT
)""",
}

PROBLEMS = [
    "reason: is NOT NULL, but Falcon-ES leaves it empty (NULL) in some states",
    "created_at: has type VARCHAR(32), expected DateTime",
    "aborted_at: missing (expected DateTime)",
    "job_uid: missing (expected String)",
]


@pytest.fixture(params=["sqlite", "mysql"])
def bare_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database without Falcon-ES's schema: the upper layer's own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'upper.db'}"
        return
    server = sa.create_engine(MYSQL_SERVER + "/", isolation_level="AUTOCOMMIT")
    name = f"falcon_upper_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield f"{MYSQL_SERVER}/{name}"
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        server.dispose()


def create(url: str, ddl: str) -> None:
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl)
    engine.dispose()


def check(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, "db", "check", *args])


def test_each_missing_mistyped_or_not_null_column_is_named(bare_db_url: str) -> None:
    create(bare_db_url, BROKEN_JOB_TABLE.format(table="job"))
    result = check(bare_db_url)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"job.{p}" for p in PROBLEMS]
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_another_table_name_is_named_in_each_line(bare_db_url: str) -> None:
    create(bare_db_url, BROKEN_JOB_TABLE.format(table="upper_jobs"))
    result = check(bare_db_url, "--table", "upper_jobs")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"upper_jobs.{p}" for p in PROBLEMS]


def test_the_python_api_returns_the_same_problems(bare_db_url: str) -> None:
    create(bare_db_url, BROKEN_JOB_TABLE.format(table="job"))
    engine = db.make_engine(bare_db_url)
    try:
        problems = db.check_job_table(engine)
    finally:
        engine.dispose()
    assert [str(p) for p in problems] == [f"job.{p}" for p in PROBLEMS]
    assert [p.column for p in problems] == ["reason", "created_at", "aborted_at", "job_uid"]


def test_a_usable_table_of_another_shape_passes(bare_db_url: str) -> None:
    dialect = "mysql" if bare_db_url.startswith("mysql") else "sqlite"
    create(bare_db_url, USABLE_JOB_TABLE[dialect])
    result = check(bare_db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "job: all 16 columns present with usable types"


def test_a_missing_table_is_named(bare_db_url: str) -> None:
    result = check(bare_db_url, "--table", "jobs")
    assert result.exit_code == 1
    assert result.stderr.strip() == "jobs.*: table 'jobs' does not exist"


def test_the_migrated_table_passes(db_url: str) -> None:
    result = check(db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "job: all 16 columns present with usable types"
