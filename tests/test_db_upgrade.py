"""``falcon-es db upgrade`` migrates Falcon-ES's own tables and leaves the upper layer's
job table alone: an existing one keeps its exact definition, a missing one is reported
with the DDL to create it (or created with ``--create-job-table``). A migration
interrupted on MariaDB, where every CREATE commits on its own, completes when run
again. Both dialects unless said otherwise."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from click.testing import CliRunner, Result

from falcon_es.storage import db
from falcon_es.cli import main

OWN_TABLES = {"task_events", "log_head", "checkpoints", "clusters", "alembic_version",
              "live_streams", "last_served", "sim_worlds", "sim_world_objects",
              "sim_world_changes"}

#: The upper layer's table: the columns Falcon-ES uses, two of its own (one NOT NULL
#: with a default), an index of its own.
UPPER_JOB_TABLE = {
    "mysql": """
CREATE TABLE job (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    actor VARCHAR(128) NOT NULL,
    spec JSON,
    status VARCHAR(32) NOT NULL DEFAULT 'Pending',
    reason VARCHAR(64),
    message TEXT,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at DATETIME(6),
    aborting_at DATETIME(6),
    aborted_at DATETIME(6),
    cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64),
    job_uid VARCHAR(64),
    dispatched_at DATETIME(6),
    finished_at DATETIME(6),
    project_code VARCHAR(32) NOT NULL DEFAULT 'none',
    budget_cents BIGINT,
    KEY ix_job_project (project_code, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "sqlite": """
CREATE TABLE job (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    actor VARCHAR(128) NOT NULL,
    spec TEXT,
    status VARCHAR(32) NOT NULL DEFAULT 'Pending',
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
    project_code VARCHAR(32) NOT NULL DEFAULT 'none',
    budget_cents BIGINT
)""",
}


def upgrade(url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--db", url, "db", "upgrade", *args], env=env)


def execute(url: str, *statements: str) -> None:
    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def definition(url: str, table: str = "job") -> str:
    """The table's definition as the database keeps it."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                return str(conn.exec_driver_sql(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = ? ORDER BY name",
                    (table,)).scalars().all())
            return str(conn.exec_driver_sql(f"SHOW CREATE TABLE {table}").one()[1])
    finally:
        engine.dispose()


def dialect(url: str) -> str:
    return "mysql" if url.startswith("mysql") else "sqlite"


def test_an_existing_job_table_is_left_exactly_as_it_was(bare_db_url: str) -> None:
    execute(bare_db_url, UPPER_JOB_TABLE[dialect(bare_db_url)])
    before = definition(bare_db_url)
    for _ in range(2):
        result = upgrade(bare_db_url)
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == [
            "database at revision 0006",
            "job table job: present, left as it is (falcon-es db check checks its columns "
            "and indexes)"]
    assert definition(bare_db_url) == before
    assert OWN_TABLES | {"job"} == tables(bare_db_url)


def test_without_a_job_table_it_says_so_and_shows_the_ddl(bare_db_url: str) -> None:
    result = upgrade(bare_db_url)
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("falcon-es: no job table 'job': Falcon-ES's own tables are "
                           "migrated, but it never creates the upper layer's table unasked")
    assert line.endswith("or run: falcon-es db upgrade --create-job-table")
    stdout = result.stdout.splitlines()
    assert stdout[0] == "database at revision 0006"
    assert stdout[1] == "CREATE TABLE job ("
    assert tables(bare_db_url) == OWN_TABLES
    # The DDL shown is the dialect's and makes a table db check passes.
    ddl = "\n".join(stdout[1:])
    execute(bare_db_url, *(s for s in ddl.split(";") if s.strip()))
    checked = CliRunner().invoke(main, ["--db", bare_db_url, "db", "check"])
    assert checked.exit_code == 0, checked.output
    assert "(all present; " in checked.stdout


def test_create_job_table_creates_it_once_under_the_mapped_names(bare_db_url: str) -> None:
    env = {"FALCON_JOB_TABLE": "upper_jobs", "FALCON_JOB_COLUMNS": "status=state,id=job_id"}
    result = upgrade(bare_db_url, "--create-job-table", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "job table upper_jobs: created"
    assert tables(bare_db_url) == OWN_TABLES | {"upper_jobs"}
    engine = db.make_engine(bare_db_url)
    try:
        columns = {c["name"] for c in sa.inspect(engine).get_columns("upper_jobs")}
    finally:
        engine.dispose()
    assert {"job_id", "state", "message"} <= columns and not {"id", "status"} & columns
    before = definition(bare_db_url, "upper_jobs")
    again = upgrade(bare_db_url, "--create-job-table", env=env)
    assert again.stdout.splitlines()[-1].startswith("job table upper_jobs: present")
    assert definition(bare_db_url, "upper_jobs") == before


def test_a_migration_interrupted_after_some_tables_completes_when_run_again(
        bare_db_url: str) -> None:
    """What a run killed after its first steps leaves on MariaDB: the log, its index and
    the head table, but not the head row, and no revision recorded (made here by
    migrating and taking the later steps' work away again)."""
    engine = db.make_engine(bare_db_url)
    try:
        db.upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM log_head")
            conn.exec_driver_sql("DELETE FROM alembic_version")
            for table in ("clusters", "checkpoints"):
                conn.exec_driver_sql(f"DROP TABLE {table}")
    finally:
        engine.dispose()
    assert db_revision(bare_db_url) is None
    result = upgrade(bare_db_url, "--create-job-table")
    assert result.exit_code == 0, result.output
    assert db_revision(bare_db_url) == "0006"
    assert tables(bare_db_url) == OWN_TABLES | {"job"}
    assert rows(bare_db_url, "SELECT id, last_seq FROM log_head") == [(1, 0)]


def test_a_migration_that_fails_midway_on_mariadb_is_rerun_once_the_cause_is_gone(
        bare_db_url: str) -> None:
    """A table named as one the migration creates, but not that table, stops the run
    at that step with one line; on MariaDB the tables created before it stay (each
    CREATE committed), on SQLite the run rolled back. Once the table is out of the way
    the same command completes."""
    execute(bare_db_url, "CREATE TABLE clusters (id VARCHAR(36) PRIMARY KEY, owner TEXT)")
    failed = upgrade(bare_db_url)
    assert failed.exit_code == 3
    (line,) = failed.stderr.splitlines()
    assert line == ("falcon-es: db upgrade stopped: table clusters exists without column(s) "
                    "name, project, location, tpu_type, gcs_bucket, default_reservation, "
                    "status, created_at: it is not the table this migration creates; rename "
                    "or drop it, then run db upgrade again")
    assert db_revision(bare_db_url) is None
    left = tables(bare_db_url)
    if dialect(bare_db_url) == "mysql":
        assert {"task_events", "log_head", "checkpoints"} <= left
    execute(bare_db_url, "DROP TABLE clusters")
    result = upgrade(bare_db_url, "--create-job-table")
    assert result.exit_code == 0, result.output
    assert db_revision(bare_db_url) == "0006"
    assert rows(bare_db_url, "SELECT id, last_seq FROM log_head") == [(1, 0)]
    assert tables(bare_db_url) == OWN_TABLES | {"job"}


def test_a_downgrade_drops_falcons_tables_and_keeps_the_job_table(bare_db_url: str) -> None:
    execute(bare_db_url, UPPER_JOB_TABLE[dialect(bare_db_url)])
    before = definition(bare_db_url)
    assert upgrade(bare_db_url).exit_code == 0
    engine = db.make_engine(bare_db_url)
    try:
        command.downgrade(db.alembic_config(engine), "base")
    finally:
        engine.dispose()
    assert tables(bare_db_url) == {"job", "alembic_version"}
    assert definition(bare_db_url) == before


def db_revision(url: str) -> str | None:
    engine = db.make_engine(url)
    try:
        return db.current_revision(engine)
    finally:
        engine.dispose()


def rows(url: str, query: str) -> list[tuple[object, ...]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(query)]
    finally:
        engine.dispose()

