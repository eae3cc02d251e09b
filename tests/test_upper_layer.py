"""The upper layer as it really is: its own job table (columns of its own, NOT NULL
columns with defaults, indexes of its own, renamed columns through the mapping), and
tasks and aborts written with plain SQL through its own driver connection, never
through Falcon-ES code. A controller runs the tasks to their end; the table's
definition is the same afterwards. Rows Falcon-ES cannot use get a clear outcome and
never stop the controller.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.job_mapping import JobMapping
from falcon_es.observability.metrics import Metrics
from falcon_es.projections import replay
from falcon_es.app.service import Service
from falcon_es.config.settings import Settings
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
def any_url(bare_db_url: str) -> str:
    """The same on each dialect."""
    return _migrated(bare_db_url)


@pytest.fixture
def upper(request: pytest.FixtureRequest) -> Iterator[UpperLayer]:
    url = request.getfixturevalue("mariadb_url" if "mariadb_url" in request.fixturenames
                                  else "any_url")
    layer = UpperLayer(url)
    yield layer
    layer.close()


class Controller(Harness):
    """A controller on the simulated world, with its metrics (the harness's, plus the
    Metrics object a deployment has)."""

    def __init__(self, url: str, clock: VirtualClock, settings: Settings) -> None:
        self.metrics = Metrics(clock=clock, process_collectors=False)
        super().__init__(url, clock, sim_config(reserved_cluster()), settings)
        self.add_cluster(reserved_cluster())

    def _open_app(self) -> App:
        return open_app(self.settings, self.clock, metrics=self.metrics)

    def _service(self) -> Service:
        return build_service(self.app, self.ports, RunOptions(world=self.world))

    def ignored(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "falcon_job_rows_ignored_total", {"reason": reason})
        return value or 0.0


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
        # The scans for rows it cannot take found none: it took in every row.
        assert running.ignored("not-taken-in") == running.ignored("unknown-status") == 0
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
    finally:
        running.close()
    assert upper.definition("job") == before


def test_a_priority_change_in_plain_sql_reorders_the_queue(
        mariadb_url: str, upper: UpperLayer, caplog: pytest.LogCaptureFixture) -> None:
    """The upper layer adds the optional request columns to its table (its own
    ``priority`` column is the one Falcon-ES reads) and asks with one UPDATE: the
    controller records PriorityChanged with who asked, and serves the task next."""
    from falcon_es.domain import events as ev

    upper.execute(UPPER_JOB)
    upper.execute("ALTER TABLE job ADD COLUMN priority_requested_at DATETIME(6) NULL, "
                  "ADD COLUMN priority_requested_by VARCHAR(64) NULL, "
                  "ADD INDEX ix_job_priority_requested_at (priority_requested_at)")
    clock = VirtualClock(dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
    for task in ("train-1", "train-2", "train-3"):
        upper.execute("INSERT INTO job (id, name, actor, spec) VALUES (%s, %s, %s, %s)",
                      task, task, "user-a", TASK_SPEC)
    running = controller(mariadb_url, clock, JobMapping(priority_requests=True))
    try:
        running.run(lambda: statuses(upper)["train-1"][1] not in (None, "Waiting"))
        upper.execute("UPDATE job SET priority = 100, priority_requested_at = "
                      "UTC_TIMESTAMP(6), priority_requested_by = 'ops-alice' WHERE id = %s",
                      "train-3")
        running.run()
        records = list(running.app.store.read_after(0))
        picks = [r.stream_id for r in records if isinstance(r.event, ev.TaskPicked)]
        assert picks == ["train-1", "train-3", "train-2"]
        (changed,) = [r.event for r in records if isinstance(r.event, ev.PriorityChanged)]
        assert (changed.old, changed.new, changed.requester) == (0, 100, "ops-alice")
        assert set(statuses(upper).values()) == {("Succeeded", None)}
        # Read again after train-3 ended (the minute's look back): applied, not refused.
        assert not [r for r in caplog.records if "refused" in r.getMessage()]
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
    finally:
        running.close()


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
        assert running.ignored("not-taken-in") == running.ignored("unknown-status") == 0
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


# ------------------------------------------------------------------ rows it cannot use

#: A job table of the upper layer's on each dialect; ``{created_at}``, ``{name}``,
#: ``{actor}``, ``{id}`` and ``{spec}`` are the column types a test varies.
BAD_ROWS_TABLE = {
    "mysql": """
CREATE TABLE job (
    id {id} NOT NULL PRIMARY KEY, name {name} NOT NULL, actor {actor} NOT NULL,
    spec {spec}, status VARCHAR(32) NOT NULL DEFAULT 'Pending', reason VARCHAR(64),
    message {message}, created_at {created_at} NOT NULL, updated_at DATETIME(6),
    aborting_at DATETIME(6), aborted_at DATETIME(6), cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64), job_uid VARCHAR(64), dispatched_at DATETIME(6),
    finished_at DATETIME(6), KEY ix_job_status_reason (status, reason),
    KEY ix_job_created_at (created_at)
) DEFAULT CHARSET=utf8mb4""",
    "sqlite": """
CREATE TABLE job (
    id {id} NOT NULL PRIMARY KEY, name {name} NOT NULL, actor {actor} NOT NULL,
    spec {spec}, status VARCHAR(32) NOT NULL DEFAULT 'Pending', reason VARCHAR(64),
    message {message}, created_at {created_at} NOT NULL, updated_at DATETIME,
    aborting_at DATETIME, aborted_at DATETIME, cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64), job_uid VARCHAR(64), dispatched_at DATETIME,
    finished_at DATETIME)""",
}
TYPES = {"id": "VARCHAR(64)", "name": "VARCHAR(255)", "actor": "VARCHAR(128)", "spec": "TEXT",
         "message": "TEXT",
         "created_at": {"mysql": "DATETIME(6)", "sqlite": "DATETIME"}}


def create_table(layer: UpperLayer, **types: str) -> None:
    kind = "mysql" if layer.mysql else "sqlite"
    chosen = {k: (v[kind] if isinstance(v, dict) else v) for k, v in TYPES.items()}
    chosen.update(types)
    layer.execute(BAD_ROWS_TABLE[kind].format(**chosen))


def insert(layer: UpperLayer, task_id: object, created_at: object, *, name: object = "job",
           spec: object = TASK_SPEC, status: str | None = None) -> None:
    columns, values = ["id", "name", "actor", "spec", "created_at"], [task_id, name, "user-a",
                                                                        spec, created_at]
    if status is not None:
        columns.append("status")
        values.append(status)
    marks = ", ".join("%s" for _ in values)
    layer.execute(f"INSERT INTO job ({', '.join(columns)}) VALUES ({marks})", *values)


def run_to_the_end(url: str, clock: VirtualClock) -> Controller:
    running = controller(url, clock)
    running.run()
    return running


def message_of(layer: UpperLayer, task_id: str) -> str:
    return str(layer.rows("SELECT message FROM job WHERE id = %s", task_id)[0][0])


def test_a_column_of_the_wrong_type_fails_its_row_alone(any_url: str, upper: UpperLayer,
                                                       clock: VirtualClock) -> None:
    """created_at kept as text: a row whose text is an ISO time is read and runs; a row
    in the upper layer's own format is failed, the column and the value named."""
    create_table(upper, created_at="VARCHAR(40)")
    insert(upper, "good", when(clock))
    insert(upper, "bad-time", "01/11/2026 9:00")
    running = run_to_the_end(any_url, clock)
    running.close()
    assert statuses(upper) == {"good": ("Succeeded", None),
                               "bad-time": ("Failed", "InvalidColumn")}
    assert message_of(upper, "bad-time") == (
        "unreadable job row: column created_at: expected a date and time, found "
        "'01/11/2026 9:00'")


def test_times_kept_as_numbers_fail_their_rows_and_numbers_for_names_are_read(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """created_at as epoch seconds (a BIGINT) is no time Falcon-ES can take; a number
    where a name belongs reads as its digits. The controller carries on after each."""
    create_table(upper, created_at="BIGINT", name="INT")
    epoch = int((clock.now() - dt.datetime(1970, 1, 1)).total_seconds())
    insert(upper, "epoch-1", epoch, name=9)
    running = run_to_the_end(any_url, clock)
    insert(upper, "epoch-2", epoch + 1, name=10)
    running.run()
    try:
        assert [r.event.to_data()["name"] for r in running.app.store.read_stream("epoch-1")] == ["9"]
    finally:
        running.close()
    assert statuses(upper) == {"epoch-1": ("Failed", "InvalidColumn"),
                               "epoch-2": ("Failed", "InvalidColumn")}
    assert message_of(upper, "epoch-1") == (
        f"unreadable job row: column created_at: expected a date and time, found {epoch} (int)")


def test_a_spec_that_is_not_json_fails_its_row_alone(any_url: str, upper: UpperLayer,
                                                    clock: VirtualClock) -> None:
    """A TEXT spec column can hold anything (MariaDB's JSON columns refuse bad JSON)."""
    create_table(upper)
    insert(upper, "broken", when(clock), spec='{"image": "us-docker.pkg.dev/p/r/t:1",')
    insert(upper, "good", when(clock, 1))
    running = run_to_the_end(any_url, clock)
    try:
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
    finally:
        running.close()
    assert statuses(upper) == {"broken": ("Failed", "InvalidSpec"),
                               "good": ("Succeeded", None)}
    assert message_of(upper, "broken").startswith("invalid task spec: spec: not valid JSON (")


def test_an_id_longer_than_the_log_holds_is_refused_and_its_row_failed(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    create_table(upper, id="VARCHAR(100)")
    long_id = "batch-2026-11-01/" + "x" * 63
    insert(upper, long_id, when(clock))
    insert(upper, "good", when(clock, 1))
    running = run_to_the_end(any_url, clock)
    try:
        assert [(r.type_name, r.event.to_data()["row_id"])
                for r in running.app.store.read_stream("intake:refused")] == [
            ("RowRefused", long_id)]
        assert replay.verify(running.app.engine, running.app.store, "en",
                             job=running.app.job) == []
        # An abort the upper layer writes on it afterwards is ignored, once.
        upper.execute("UPDATE job SET status = 'Aborting' WHERE id = %s", long_id)
        for _ in range(3):
            running.tick()
        assert running.ignored("id-too-long") == 1
    finally:
        running.close()
    assert statuses(upper)["good"] == ("Succeeded", None)
    assert message_of(upper, long_id) == (
        "job row not taken in: id: 80 characters, longer than the 64 of Falcon-ES's log")


def test_rows_in_a_status_it_does_not_read_are_logged_once_and_counted(
        any_url: str, upper: UpperLayer, clock: VirtualClock,
        caplog: pytest.LogCaptureFixture) -> None:
    """``Queued`` is no status Falcon-ES knows; ``Running`` is one it writes, on a row it
    never took in. Neither is taken in or written; each is logged and counted once,
    however many ticks and scans see it, and the controller runs the rest."""
    create_table(upper)
    insert(upper, "queued", when(clock), status="Queued")
    insert(upper, "sneaked-in", when(clock), status="Running")
    insert(upper, "good", when(clock, 1))
    caplog.set_level(logging.WARNING, logger="falcon_es.jobtable.inbox")
    running = controller(any_url, clock)
    try:
        running.run(lambda: statuses(upper)["good"] == ("Succeeded", None))
        for _ in range(60):  # an hour of scans more
            clock.advance(60)
            running.tick()
        assert running.ignored("unknown-status") == 1
        assert running.ignored("not-taken-in") == 1
    finally:
        running.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "falcon_es.jobtable.inbox"]
    assert warned == [
        "job row queued ignored: status 'Queued' is not one Falcon-ES knows (new rows are "
        "Pending, aborts Aborting)",
        "job row sneaked-in ignored: it is Running but Falcon-ES never took it in (a new "
        "row is Pending with no Reason)",
    ]
    assert statuses(upper) == {"queued": ("Queued", None), "sneaked-in": ("Running", None),
                               "good": ("Succeeded", None)}
