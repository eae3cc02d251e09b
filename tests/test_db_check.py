"""``falcon-es db check`` on the upper layer's own job table: every missing, mistyped or
wrongly NOT NULL column is named (under the mapping's names); a usable table passes;
the indexes Falcon-ES's queries want are listed, with the DDL for the missing ones, and
never added. Both dialects."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from falcon_es.storage import db
from falcon_es.cli import main
from falcon_es.storage.tables import JobTable

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


def create(url: str, ddl: str) -> None:
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl)
    engine.dispose()


def check(url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--db", url, "db", "check", *args], env=env)


def indexes(url: str, table: str = "job") -> list[tuple[str, tuple[str, ...]]]:
    engine = db.make_engine(url)
    try:
        return sorted((str(i["name"]), tuple(str(c) for c in i["column_names"]))
                      for i in sa.inspect(engine).get_indexes(table))
    finally:
        engine.dispose()


def test_each_missing_mistyped_or_not_null_column_is_named(bare_db_url: str) -> None:
    create(bare_db_url, BROKEN_JOB_TABLE.format(table="job"))
    result = check(bare_db_url)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"job.{p}" for p in PROBLEMS]
    assert result.stdout.startswith("indexes Falcon-ES's queries want on job (2 missing; ")
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
        problems = db.check_job_table(engine, JobTable())
    finally:
        engine.dispose()
    assert [str(p) for p in problems] == [f"job.{p}" for p in PROBLEMS]
    assert [p.column for p in problems] == ["reason", "created_at", "aborted_at", "job_uid"]


def test_a_usable_table_of_another_shape_passes(bare_db_url: str) -> None:
    dialect = "mysql" if bare_db_url.startswith("mysql") else "sqlite"
    create(bare_db_url, USABLE_JOB_TABLE[dialect])
    result = check(bare_db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "job: all 16 columns present with usable types"


def test_a_missing_table_is_named_with_the_ddl_to_create_it(bare_db_url: str) -> None:
    result = check(bare_db_url, "--table", "jobs")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "jobs.*: table 'jobs' does not exist"
    assert result.stdout.startswith("CREATE TABLE jobs (")
    assert "CREATE INDEX ix_jobs_status_reason ON jobs (status, reason);" in result.stdout


def test_the_migrated_table_passes_with_every_wanted_index(db_url: str) -> None:
    result = check(db_url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "job: all 16 columns present with usable types"
    assert lines[1].startswith("indexes Falcon-ES's queries want on job (all present; ")
    assert [line.split(":")[0] for line in lines[2:]] == [
        "  present  (id) as PRIMARY KEY",
        "  present  (status, reason) as ix_job_status_reason",
        "  present  (created_at) as ix_job_created_at",
    ]


#: The upper layer's names for Falcon-ES's columns, and a table with no index but its key.
RENAMED = {"FALCON_JOB_TABLE": "upper_jobs",
           "FALCON_JOB_COLUMNS": "id=job_id, status=state, message=status_text, created_at=submitted"}
RENAMED_TABLE = """
CREATE TABLE upper_jobs (
    job_id VARCHAR(64) PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    actor VARCHAR(128) NOT NULL,
    spec TEXT,
    state VARCHAR(32) NOT NULL,
    reason VARCHAR(64),
    status_text TEXT,
    submitted DATETIME NOT NULL,
    updated_at DATETIME,
    aborting_at DATETIME,
    aborted_at DATETIME,
    cluster_id VARCHAR(36),
    node_pool_name VARCHAR(64),
    job_uid VARCHAR(64),
    dispatched_at DATETIME,
    finished_at DATETIME,
    team VARCHAR(64) NOT NULL DEFAULT 'research'
)"""


def test_renamed_columns_are_checked_and_the_missing_indexes_recommended_not_added(
        bare_db_url: str) -> None:
    create(bare_db_url, RENAMED_TABLE)
    before = indexes(bare_db_url, "upper_jobs")
    result = check(bare_db_url, env=RENAMED)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "upper_jobs: all 16 columns present with usable types",
        "indexes Falcon-ES's queries want on upper_jobs (2 missing; recommendations, never "
        "added by Falcon-ES):",
        "  present  (job_id) as PRIMARY KEY: every row Falcon-ES writes (Status/Reason/"
        "Message, position Messages) and every abort: WHERE id = ?",
        "  missing  (state, reason): the poll of every tick: new rows (status = 'Pending' "
        "AND reason IS NULL) and abort requests (status = 'Aborting'); the scan for "
        "unknown statuses",
        "           CREATE INDEX ix_upper_jobs_state_reason ON upper_jobs (state, reason);",
        "  missing  (submitted): the scan of recent rows Falcon-ES never took in "
        "(created_at >= ?); task list order",
        "           CREATE INDEX ix_upper_jobs_submitted ON upper_jobs (submitted);",
    ]
    assert indexes(bare_db_url, "upper_jobs") == before


def test_the_recommended_ddl_adds_indexes_that_satisfy_the_check(bare_db_url: str) -> None:
    create(bare_db_url, RENAMED_TABLE)
    advice = check(bare_db_url, env=RENAMED).stdout
    for line in advice.splitlines():
        if line.strip().startswith("CREATE INDEX"):
            create(bare_db_url, line.strip().rstrip(";"))
    again = check(bare_db_url, env=RENAMED)
    assert "(all present; " in again.stdout, again.stdout


def test_a_renamed_column_that_is_missing_names_both_names(bare_db_url: str) -> None:
    create(bare_db_url, RENAMED_TABLE.replace("status_text TEXT", "status_txt TEXT"))
    result = check(bare_db_url, env=RENAMED)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "upper_jobs.status_text (Falcon-ES's message): missing (expected Text)"]


def test_an_id_column_wider_than_the_log_is_noted(bare_db_url: str) -> None:
    create(bare_db_url, USABLE_JOB_TABLE["mysql" if bare_db_url.startswith("mysql") else "sqlite"]
           .replace("id VARCHAR(40) PRIMARY KEY", "id VARCHAR(255) PRIMARY KEY")
           .replace("id TEXT PRIMARY KEY", "id VARCHAR(255) PRIMARY KEY"))
    result = check(bare_db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == (
        "note: job.id is VARCHAR(255): ids longer than the 64 characters of Falcon-ES's log "
        "are failed at intake (Reason InvalidId)")


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("FALCON_JOB_COLUMNS", "status", "expected falcon_name=table_name pairs"),
    ("FALCON_JOB_COLUMNS", "stat=state", "'stat' is not a column Falcon-ES uses"),
    ("FALCON_JOB_COLUMNS", "status=state,status=s2", "'status' is mapped twice"),
    ("FALCON_JOB_COLUMNS", "status=st ate", "'st ate' is not a column name"),
    ("FALCON_JOB_COLUMNS", "message=reason", "reason and message would both be column 'reason'"),
    ("FALCON_JOB_COLUMNS", "status=STATE,reason=state", "would both be column"),
    ("FALCON_JOB_TABLE", "a.b.c", "expected a table name or database.table"),
    ("FALCON_JOB_TABLE", "job;drop", "expected a table name or database.table"),
])
def test_a_bad_mapping_is_one_line_naming_the_variable(tmp_path: Path, variable: str, value: str,
                                                       says: str) -> None:
    result = check(f"sqlite:///{tmp_path / 'x.db'}", env={variable: value})
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"falcon-es: {variable}={value!r}: "), line
    assert says in line
    assert not (tmp_path / "x.db").exists()


def test_a_bad_table_option_is_one_line_naming_it(tmp_path: Path) -> None:
    result = check(f"sqlite:///{tmp_path / 'x.db'}", "--table", "a b")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "falcon-es: --table 'a b': expected a table name or database.table (letters, "
        "digits, _ and $, not starting with a digit, at most 64 characters)"]
