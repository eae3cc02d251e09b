"""``task list`` and ``task show`` through the driver alone read the same rows as
through SQLAlchemy, on SQLite and MariaDB, under a renamed mapping too; the URLs the
driver path takes and those it leaves to SQLAlchemy."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.jobtable import job_reads, job_rows
from falcon_es.config.db_urls import MysqlTarget, SqliteTarget, driver_target
from falcon_es.config.job_mapping import JobMapping
from falcon_es.storage.tables import JobTable

SPEC = {"image": "img:1", "tpu_type": "v6e", "topology": "2x2"}
AT = dt.datetime(2026, 11, 1, 8, 0, 0, 123456)


def _rows(url: str, job: JobTable) -> list[str]:
    engine = db.make_engine(url)
    try:
        ids = job_rows.submit_many(engine, [job_rows.NewTask(f"n{i}", f"u{i % 2}", SPEC)
                                            for i in range(4)], AT, job=job)
        with engine.begin() as conn:  # one row as the upper layer may leave it
            conn.execute(job.table.update().where(job.c.id == ids[1]).values(
                status="Running", reason="Running", message="1/1 active",
                dispatched_at=AT + dt.timedelta(seconds=5)))
            if conn.dialect.name == "sqlite":  # MariaDB's JSON column refuses it
                conn.execute(sa.text(f"UPDATE {job.sql(conn.dialect).table} SET "
                                     f"{job.sql(conn.dialect).columns['spec']} = 'not json' "
                                     f"WHERE {job.sql(conn.dialect).columns['id']} = :i"),
                             {"i": ids[2]})
    finally:
        engine.dispose()
    return ids


def _same(url: str, job: JobTable, mapping: JobMapping, ids: list[str]) -> None:
    target = driver_target(url)
    assert target is not None
    engine = db.make_engine(url)
    try:
        for status, limit in ((None, None), ("Pending", None), ("Pending", 2), (None, 1)):
            assert job_reads.list_rows(target, mapping, status=status, limit=limit) == \
                job_rows.list_rows(engine, status=status, limit=limit, job=job)
        for task_id in ids:
            assert job_reads.get_row(target, mapping, task_id) == \
                job_rows.get_row(engine, task_id, job=job)
    finally:
        engine.dispose()
    row = job_reads.get_row(target, mapping, ids[1])
    assert (row["status"], row["dispatched_at"]) == ("Running", AT + dt.timedelta(seconds=5))
    if url.startswith("sqlite"):
        assert job_reads.get_row(target, mapping, ids[2])["spec"] == "not json"
    with pytest.raises(job_reads.TaskMissing, match="'nope' does not exist"):
        job_reads.get_row(target, mapping, "nope")


def test_the_driver_reads_what_sqlalchemy_reads(db_url: str) -> None:
    job = JobTable()
    _same(db_url, job, JobMapping(), _rows(db_url, job))


def test_the_driver_reads_a_renamed_table(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/mapped.db"
    mapping = JobMapping(table="tasks", renamed=(("status", "state"), ("message", "msg")))
    job = JobTable(mapping)
    engine = db.make_engine(url)
    db.create_job_table(engine, job)
    engine.dispose()
    _same(url, job, mapping, _rows(url, job))


def test_a_missing_table_is_the_drivers_words(tmp_path: object) -> None:
    target = SqliteTarget(f"{tmp_path}/empty.db")
    with pytest.raises(job_reads.JobReadError, match="no such table: job"):
        job_reads.list_rows(target, JobMapping())


def test_which_urls_the_driver_path_takes() -> None:
    assert driver_target("sqlite:///falcon.db") == SqliteTarget("falcon.db")
    assert driver_target("sqlite:////var/x.db") == SqliteTarget("/var/x.db")
    assert driver_target("sqlite://") is None
    assert driver_target("mysql+pymysql://root@127.0.0.1:3306/f?charset=utf8mb4") == \
        MysqlTarget("127.0.0.1", 3306, "root", None, "f", "utf8mb4")
    assert driver_target("mysql+pymysql://u%40x:p%2Fw@db/f") == \
        MysqlTarget("db", 3306, "u@x", "p/w", "f")
    for other in ("sqlite:///x.db?timeout=5", "mysql+mysqldb://u@h/f",
                  "mysql+pymysql://u@h/f?ssl_ca=/ca.pem", "postgresql://h/f"):
        assert driver_target(other) is None, other
