"""Intake: new rows are accepted or rejected into the log; aborts are folded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from falcon_es.jobtable import job_rows
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable
from falcon_es.handlers import intake
from tests.conftest import migrate

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

#: Intake alone: with the scheduling handlers a task with no cluster of its TPU type
#: would fail NoMatchingCluster in the same tick (tests/test_scheduling.py covers that).
INTAKE_ONLY = (intake.accept_new_rows, intake.notice_abort_requests)

SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}


def row(app: App, task_id: str) -> dict:
    return job_rows.get_row(app.engine, task_id)


def test_valid_row_is_accepted_and_projected(app: App) -> None:
    task_id = job_rows.submit(app.engine, name="bench", actor="user-a", spec=SPEC, now=app.clock.now())
    build_service(app, None, RunOptions(handlers=INTAKE_ONLY)).controller.tick()
    assert (row(app, task_id)["status"], row(app, task_id)["reason"]) == ("Pending", "Waiting")
    (record,) = app.store.read_stream(task_id)
    assert record.type_name == "TaskAccepted"
    assert record.meta["actor"] == "upper-layer:user-a"


def test_malformed_json_fails_only_that_task(app: App) -> None:
    good = job_rows.submit(app.engine, name="ok", actor="a", spec=SPEC, now=app.clock.now())
    with app.engine.begin() as conn:
        conn.execute(job.insert().values(id="bad", name="bad", actor="a", status="Pending",
                                         created_at=app.clock.now()))
        conn.execute(sa.text("UPDATE job SET spec = :s WHERE id = 'bad'"), {"s": json.dumps("{not json")})
    build_service(app, None, RunOptions(handlers=INTAKE_ONLY)).controller.tick()
    bad = row(app, "bad")
    assert (bad["status"], bad["reason"]) == ("Failed", "InvalidSpec")
    assert "spec" in bad["message"]
    assert row(app, good)["reason"] == "Waiting"


def test_forbidden_field_is_rejected_with_its_name(app: App) -> None:
    task_id = job_rows.submit(app.engine, name="x", actor="a", spec={**SPEC, "privileged": True},
                              now=app.clock.now())
    build_service(app).controller.tick()
    assert row(app, task_id)["reason"] == "ForbiddenField"
    assert row(app, task_id)["message"].startswith("invalid task spec: privileged: not allowed")


def test_abort_before_intake_and_after_the_end(app: App) -> None:
    controller = build_service(app).controller
    early = job_rows.submit(app.engine, name="e", actor="a", spec=SPEC, now=app.clock.now())
    job_rows.request_abort(app.engine, early, app.clock.now())
    controller.tick()
    assert row(app, early)["status"] == "Aborted"
    assert [r.type_name for r in app.store.read_stream(early)] == ["AbortRequested", "TaskAborted"]
    assert row(app, early)["aborted_at"] is not None
    done = job_rows.submit(app.engine, name="d", actor="a", spec={"image": 1}, now=app.clock.now())
    controller.tick()
    assert row(app, done)["status"] == "Failed"
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.id == done).values(status="Aborting"))
    controller.tick()
    assert (row(app, done)["status"], row(app, done)["reason"]) == ("Failed", "InvalidField")
    assert row(app, done)["message"].startswith("invalid task spec: image")
    assert row(app, done)["message"].endswith("abort ignored: the task had already Failed")


@pytest.fixture
def sqlite_app(tmp_path: Path, clock: VirtualClock) -> Iterator[App]:
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    application = open_app(Settings(db_url=url), clock)
    yield application
    application.close()


def _store_raw_spec(app: App, text: str) -> None:
    with app.engine.begin() as conn:
        conn.execute(job.insert().values(id="raw", name="raw", actor="a", status="Pending",
                                         created_at=app.clock.now()))
        conn.execute(sa.text("UPDATE job SET spec = :s WHERE id = 'raw'"), {"s": text})


def test_mariadb_refuses_a_spec_that_is_not_json(mysql_url: str, clock: VirtualClock) -> None:
    """Why the listing test below runs on SQLite only: MariaDB's JSON column carries a
    CHECK (json_valid) that refuses such text at the door."""
    application = open_app(Settings(db_url=mysql_url), clock)
    try:
        with pytest.raises(sa.exc.DBAPIError, match="CONSTRAINT|constraint"):
            _store_raw_spec(application, '"{oops')
    finally:
        application.close()


def test_rows_with_a_spec_that_is_not_json_can_still_be_listed(sqlite_app: App) -> None:
    """SQLite stores any text in a JSON column (MariaDB's CHECK refuses it, above)."""
    app = sqlite_app
    _store_raw_spec(app, '"{oops')
    (listed,) = [r for r in job_rows.list_rows(app.engine) if r["id"] == "raw"]
    assert listed["spec"] == '"{oops'
    assert job_rows.get_row(app.engine, "raw")["spec"] == '"{oops'
