"""The upper layer as it really is: its own job table (columns of its own, NOT NULL
columns with defaults, indexes of its own, renamed columns through the mapping), and
tasks and aborts written with plain SQL through its own driver connection, never
through Falcon-ES code. A controller runs the tasks to their end; the table's
definition is the same afterwards.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from falcon_es import db
from falcon_es.clock import VirtualClock
from falcon_es.job_mapping import JobMapping
from falcon_es.projections import replay
from falcon_es.settings import Settings
from tests.conftest import scratch_mysql
from tests.support.harness import SPEC, Harness, reserved_cluster, sim_config

START = dt.datetime(2026, 11, 1, 9, 0, 0)
TASK_SPEC = json.dumps({**SPEC, "command": list(SPEC["command"]), "sim": dict(SPEC["sim"])})


class UpperLayer:
    """The upper layer's own connection (PyMySQL or sqlite3) and its own SQL, written
    with ``%s`` parameters."""

    def __init__(self, url: str) -> None:
        parsed = sa.engine.make_url(url)
        self.mysql = parsed.get_backend_name() == "mysql"
        self.connection: Any
        if self.mysql:
            self.connection = pymysql.connect(
                host=parsed.host, port=parsed.port or 3306, user=parsed.username,
                password=parsed.password or "", database=parsed.database, autocommit=True,
                charset="utf8mb4", init_command="SET time_zone = '+00:00'")
        else:
            self.connection = sqlite3.connect(str(parsed.database), isolation_level=None)

    def execute(self, sql: str, *params: object) -> None:
        cursor = self.connection.cursor()
        cursor.execute(sql if self.mysql else sql.replace("%s", "?"), params)
        cursor.close()

    def rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        cursor = self.connection.cursor()
        cursor.execute(sql if self.mysql else sql.replace("%s", "?"), params)
        found = [tuple(row) for row in cursor.fetchall()]
        cursor.close()
        return found

    def definition(self, table: str) -> str:
        if self.mysql:
            return str(self.rows(f"SHOW CREATE TABLE {table}")[0][1])
        return str(self.rows("SELECT sql FROM sqlite_master WHERE tbl_name = %s ORDER BY name",
                             table))

    def close(self) -> None:
        self.connection.close()


def _migrated(url: str) -> str:
    """Falcon-ES's own tables only: the job table is the upper layer's to create."""
    engine = db.make_engine(url)
    try:
        db.upgrade(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def mariadb_url() -> Iterator[str]:
    """A MariaDB database holding Falcon-ES's tables and no job table yet."""
    with scratch_mysql("falcon_upper") as url:
        yield _migrated(url)


@pytest.fixture
def upper(mariadb_url: str) -> Iterator[UpperLayer]:
    """The upper layer's connection to that database."""
    layer = UpperLayer(mariadb_url)
    yield layer
    layer.close()


class Controller(Harness):
    """A controller on the simulated world with one reserved cluster."""

    def __init__(self, url: str, clock: VirtualClock, settings: Settings) -> None:
        super().__init__(url, clock, sim_config(reserved_cluster()), settings)
        self.add_cluster(reserved_cluster())


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def controller(url: str, clock: VirtualClock, mapping: JobMapping = JobMapping()) -> Controller:
    return Controller(url, clock, Settings(db_url=url, job_mapping=mapping))


def when(clock: VirtualClock, seconds: float = 0) -> str:
    """A time as the upper layer writes it (UTC, microseconds)."""
    return (clock.now() + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S.%f")


def statuses(layer: UpperLayer, table: str = "job", id_column: str = "id",
             status: str = "status", reason: str = "reason") -> dict[str, tuple[Any, Any]]:
    return {str(row[0]): (row[1], row[2]) for row in
            layer.rows(f"SELECT {id_column}, {status}, {reason} FROM {table}")}


# ------------------------------------------------------------------ the upper layer's table

#: Columns of the upper layer's own (one NOT NULL with a default, one filled on every
#: update), status and created_at NOT NULL with defaults, indexes of its own, a
#: collation other than the server's default.
UPPER_JOB = """
CREATE TABLE job (
    id VARCHAR(64) NOT NULL,
    name VARCHAR(255) NOT NULL,
    actor VARCHAR(128) NOT NULL,
    spec JSON,
    status VARCHAR(32) NOT NULL DEFAULT 'Pending',
    reason VARCHAR(64) DEFAULT NULL,
    message TEXT,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at DATETIME(6) DEFAULT NULL,
    aborting_at DATETIME(6) DEFAULT NULL,
    aborted_at DATETIME(6) DEFAULT NULL,
    cluster_id VARCHAR(36) DEFAULT NULL,
    node_pool_name VARCHAR(64) DEFAULT NULL,
    job_uid VARCHAR(64) DEFAULT NULL,
    dispatched_at DATETIME(6) DEFAULT NULL,
    finished_at DATETIME(6) DEFAULT NULL,
    project_code VARCHAR(32) NOT NULL DEFAULT 'unassigned',
    priority INT NOT NULL DEFAULT 0,
    row_modified TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
        ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uq_job_actor_name (actor, name),
    KEY ix_job_project (project_code, created_at),
    KEY ix_job_status_reason (status, reason),
    KEY ix_job_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
"""


def test_tasks_and_aborts_in_plain_sql_run_to_their_end_and_the_table_keeps_its_definition(
        mariadb_url: str, upper: UpperLayer) -> None:
    upper.execute(UPPER_JOB)
    before = upper.definition("job")
    clock = VirtualClock(dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
    # status and created_at from the table's defaults, as the upper layer relies on.
    for task in ("train-1", "train-2", "train-3"):
        upper.execute("INSERT INTO job (id, name, actor, spec, project_code) "
                      "VALUES (%s, %s, %s, %s, %s)", task, task, "user-a", TASK_SPEC, "p-7")
    running = controller(mariadb_url, clock)
    try:
        running.run(lambda: statuses(upper)["train-2"][0] == "Running")
        upper.execute("UPDATE job SET status = 'Aborting', aborting_at = UTC_TIMESTAMP(6) "
                      "WHERE id = %s AND status NOT IN ('Succeeded', 'Failed', 'Aborted')",
                      "train-2")
        running.run()
        assert statuses(upper) == {"train-1": ("Succeeded", None),
                                   "train-2": ("Aborted", None),
                                   "train-3": ("Succeeded", None)}
        assert upper.rows("SELECT DISTINCT project_code, priority FROM job") == [("p-7", 0)]
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
    finally:
        running.close()
    assert upper.definition("job") == before


#: The same table as another upper layer named it: other table and column names.
RENAMED_JOB = """
CREATE TABLE upper_tasks (
    task_uuid VARCHAR(64) NOT NULL,
    title VARCHAR(255) NOT NULL,
    owner VARCHAR(128) NOT NULL,
    payload LONGTEXT,
    state VARCHAR(32) NOT NULL DEFAULT 'Pending',
    state_reason VARCHAR(64) DEFAULT NULL,
    state_message MEDIUMTEXT,
    submitted_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at DATETIME(6) DEFAULT NULL,
    aborting_at DATETIME(6) DEFAULT NULL,
    aborted_at DATETIME(6) DEFAULT NULL,
    cluster_id VARCHAR(36) DEFAULT NULL,
    node_pool_name VARCHAR(64) DEFAULT NULL,
    job_uid VARCHAR(64) DEFAULT NULL,
    dispatched_at DATETIME(6) DEFAULT NULL,
    finished_at DATETIME(6) DEFAULT NULL,
    cost_center VARCHAR(16) NOT NULL DEFAULT 'cc-0',
    PRIMARY KEY (task_uuid),
    KEY ix_tasks_state (state, state_reason),
    KEY ix_tasks_submitted (submitted_at),
    KEY ix_tasks_cost (cost_center)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""
RENAMED = JobMapping.parse(
    "upper_tasks", "id=task_uuid, name=title, actor=owner, spec=payload, status=state, "
                   "reason=state_reason, message=state_message, created_at=submitted_at")


def test_renamed_columns_through_the_mapping(mariadb_url: str, upper: UpperLayer,
                                             clock: VirtualClock) -> None:
    upper.execute(RENAMED_JOB)
    before = upper.definition("upper_tasks")
    for index, task in enumerate(("a", "b", "c")):
        upper.execute("INSERT INTO upper_tasks (task_uuid, title, owner, payload, submitted_at) "
                      "VALUES (%s, %s, %s, %s, %s)", task, f"job {task}", "user-b", TASK_SPEC,
                      when(clock, index))
    running = controller(mariadb_url, clock, RENAMED)
    try:
        running.run(lambda: statuses(upper, "upper_tasks", "task_uuid", "state",
                                     "state_reason")["c"] == ("Pending", "Waiting"))
        # While c waits behind a and b, its Message says where it stands.
        (message,) = upper.rows("SELECT state_message FROM upper_tasks WHERE task_uuid = 'c'")[0]
        assert message.startswith("#")
        upper.execute("UPDATE upper_tasks SET state = 'Aborting', aborting_at = %s "
                      "WHERE task_uuid = 'c'", when(clock))
        running.run()
        assert statuses(upper, "upper_tasks", "task_uuid", "state", "state_reason") == {
            "a": ("Succeeded", None), "b": ("Succeeded", None), "c": ("Aborted", None)}
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
    finally:
        running.close()
    assert upper.definition("upper_tasks") == before


def test_a_job_table_in_the_upper_layers_own_database(mariadb_url: str,
                                                     clock: VirtualClock) -> None:
    """FALCON_JOB_TABLE=database.table: the upper layer's table stays in its database,
    Falcon-ES's tables in Falcon-ES's, both written in one transaction."""
    with scratch_mysql("falcon_upper_db") as upper_url:
        database = sa.engine.make_url(upper_url).database
        layer = UpperLayer(upper_url)
        try:
            layer.execute(UPPER_JOB)
            before = layer.definition("job")
            for index, task in enumerate(("x", "y")):
                layer.execute("INSERT INTO job (id, name, actor, spec, created_at) "
                              "VALUES (%s, %s, %s, %s, %s)", task, task, "user-c", TASK_SPEC,
                              when(clock, index))
            running = controller(mariadb_url, clock, JobMapping.parse(f"{database}.job", None))
            try:
                running.run()
                assert replay.verify(running.app.engine, running.app.store, "en",
                                     job=running.app.job) == []
            finally:
                running.close()
            assert statuses(layer) == {"x": ("Succeeded", None), "y": ("Succeeded", None)}
            assert layer.definition("job") == before
        finally:
            layer.close()
    falcon = UpperLayer(mariadb_url)
    try:
        assert ("job",) not in falcon.rows("SHOW TABLES")
    finally:
        falcon.close()
