"""Replay for auditors: --verify, --rebuild and --until, through the CLI and the Python API."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from falcon_es.jobtable import job_rows
from falcon_es.domain import events as ev
from falcon_es.app.application import App, open_app
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.store import Meta, StreamAppend
from falcon_es.storage.tables import JobTable
from falcon_es.projections import replay
from tests.conftest import migrate

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}
SUBMITTED = dt.datetime(2026, 11, 1, 8)
META = Meta(actor="controller")

ACCEPTED = ev.TaskAccepted("train", "user-a", SPEC, "v6e", "2x2", SUBMITTED)
TO_RUNNING = (
    ACCEPTED,
    ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ()),
    ev.TaskPicked("c-1", "2x2", "only-waiting", (), None),
    ev.NodePoolCreateRequested("falcon-p1", "flex-start", "ct6e-standard-4t", 1, None, 600),
    ev.NodePoolReady("falcon-p1", 1),
    ev.JobSubmitRequested("falcon-j1", "falcon-p1"),
    ev.JobSubmitted("falcon-j1", "uid-1"),
    ev.PodsRunning(1, 1),
)


def cli(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", db_url, *args])


def drive(app: App, clock: VirtualClock, task_id: str, events: Sequence[ev.Event]) -> int:
    """Append each event in its own tick, one minute apart; returns the last seq."""
    seq = 0
    for event in events:
        clock.advance(60)
        state = app.tasks.get(task_id)
        (*_, last) = app.store.append([StreamAppend(task_id, state.version if state else 0, (event,), META)])
        seq = last.seq
    return seq


def submit(app: App, task_id: str, actor: str = "user-a") -> None:
    job_rows.submit(app.engine, name=f"name-{task_id}", actor=actor, spec=SPEC, now=SUBMITTED,
                    task_id=task_id)


@pytest.fixture
def history(app: App, clock: VirtualClock) -> Iterator[App]:
    """Three tasks: one succeeded, one running, one waiting; plus one row not yet taken in."""
    for task_id in ("done", "running", "waiting", "untouched"):
        submit(app, task_id)
    drive(app, clock, "done", (*TO_RUNNING, ev.JobSucceeded(1), ev.NodePoolDeleteRequested("falcon-p1")))
    drive(app, clock, "running", TO_RUNNING)
    drive(app, clock, "waiting", (ACCEPTED,))
    yield app


def tamper(app: App, task_id: str, **values: object) -> None:
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.id == task_id).values(**values))


# ------------------------------------------------------------------ verify


def test_verify_exits_0_when_the_projections_match(db_url: str, history: App) -> None:
    result = cli(db_url, "replay", "--verify")
    assert result.exit_code == 0, result.output
    assert "matches the live projections" in result.stdout
    assert replay.verify(history.engine, history.store, "en", job=history.job) == []


def test_verify_reports_a_tampered_row_with_a_readable_diff(db_url: str, history: App) -> None:
    tamper(history, "running", message="all good, trust me", reason="Waiting")
    result = cli(db_url, "replay", "--verify")
    assert result.exit_code == 1
    lines = result.stdout.strip().splitlines()
    assert "running.message: live='all good, trust me' replayed='1/1 active'" in lines
    assert "running.reason: live='Waiting' replayed=None" in lines
    assert len(lines) == 2
    assert "differs from the live projections in 2 value(s)" in result.stderr
    assert "Traceback" not in result.output


def test_verify_json_lists_each_difference(db_url: str, history: App) -> None:
    tamper(history, "done", finished_at=dt.datetime(2030, 1, 1), status="Failed")
    result = cli(db_url, "replay", "--verify", "--json")
    assert result.exit_code == 1
    differences = json.loads(result.stdout)
    assert {(d["task_id"], d["column"]) for d in differences} == {("done", "finished_at"), ("done", "status")}
    (status,) = [d for d in differences if d["column"] == "status"]
    assert (status["live"], status["replayed"]) == ("Failed", "Succeeded")


def test_the_python_api_names_the_same_differences(history: App) -> None:
    tamper(history, "waiting", status="Running", reason=None)
    differences = replay.verify(history.engine, history.store, "en", job=history.job)
    assert [(d.task_id, d.column, d.live, d.replayed) for d in differences] == [
        ("waiting", "status", "Running", "Pending"), ("waiting", "reason", None, "Waiting"),
    ]
    assert str(differences[1]) == "waiting.reason: live=None replayed='Waiting'"


# ------------------------------------------------------------------ rebuild


def test_rebuild_repairs_tampered_rows(db_url: str, history: App) -> None:
    before = job_rows.get_row(history.engine, "done")
    tamper(history, "done", status="Running", message="x", finished_at=None, job_uid="forged")
    tamper(history, "waiting", message=None, cluster_id="c-9")
    assert cli(db_url, "replay", "--verify").exit_code == 1
    result = cli(db_url, "replay", "--rebuild")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("rebuilt 3 job rows from")
    assert cli(db_url, "replay", "--verify").exit_code == 0
    assert job_rows.get_row(history.engine, "done") == before


def test_rebuild_through_the_python_api(history: App) -> None:
    tamper(history, "running", status="Succeeded", reason="x")
    states = replay.fold_log(history.store)
    with history.engine.begin() as conn:
        assert replay.rebuild(conn, states, "en", job=history.job) == 3
    row = job_rows.get_row(history.engine, "running")
    assert (row["status"], row["reason"], row["message"]) == ("Running", None, "1/1 active")


def test_an_abort_not_yet_folded_survives_rebuild_and_is_no_difference(db_url: str, history: App) -> None:
    job_rows.request_abort(history.engine, "running", history.clock.now())
    job_rows.request_abort(history.engine, "untouched", history.clock.now())
    with history.engine.begin() as conn:  # a blind upper-layer UPDATE on a finished task
        conn.execute(sa.text("UPDATE job SET status = 'Aborting' WHERE id = 'done'"))
    aborting = {t: job_rows.get_row(history.engine, t) for t in ("running", "untouched", "done")}
    result = cli(db_url, "replay", "--verify")
    assert result.exit_code == 0, result.output
    assert cli(db_url, "replay", "--rebuild").exit_code == 0
    for task_id, row in aborting.items():
        after = job_rows.get_row(history.engine, task_id)
        assert after["status"] == "Aborting", task_id
        assert after["aborting_at"] == row["aborting_at"]
        assert after["reason"] is None
    assert cli(db_url, "replay", "--verify").exit_code == 0


def test_a_folded_abort_is_rebuilt_from_the_log(db_url: str, history: App, clock: VirtualClock) -> None:
    job_rows.request_abort(history.engine, "running", clock.now())
    requested = job_rows.get_row(history.engine, "running")["aborting_at"]
    drive(history, clock, "running", (ev.AbortRequested(requested, "Running"), ev.TaskAborted("Running")))
    tamper(history, "running", status="Aborting", aborted_at=None)
    assert {d.column for d in replay.verify(history.engine, history.store, "en", job=history.job)} == {"status", "aborted_at"}
    assert cli(db_url, "replay", "--rebuild").exit_code == 0
    row = job_rows.get_row(history.engine, "running")
    assert (row["status"], row["message"]) == ("Aborted", "aborted while Running")
    assert row["aborted_at"] == history.store.read_stream("running")[-1].recorded_at


def test_verify_copes_with_a_spec_that_is_not_json(tmp_path: Path, clock: VirtualClock) -> None:
    """The upper layer's spec column is its own business; a replay must not choke on it.
    (Only SQLite can hold such text: MariaDB's JSON columns refuse it.)"""
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    app = open_app(Settings(db_url=url), clock)
    try:
        migrate(url)
        submit(app, "t")
        drive(app, clock, "t", (ACCEPTED,))
        with app.engine.begin() as conn:
            conn.execute(sa.text("UPDATE job SET spec = '{not json' WHERE id = 't'"))
        result = cli(url, "replay", "--verify")
        assert result.exit_code == 0, result.output
        assert replay.verify(app.engine, app.store, "en", job=app.job) == []
    finally:
        app.close()


# ------------------------------------------------------------------ time travel


@pytest.fixture
def timeline(app: App, clock: VirtualClock) -> dict[str, object]:
    """One task's life with the seq and time of each step."""
    submit(app, "t")
    accepted = drive(app, clock, "t", (ACCEPTED,))
    accepted_at = clock.now()
    running = drive(app, clock, "t", TO_RUNNING[1:])
    running_at = clock.now()
    clock.advance(3600)
    succeeded = drive(app, clock, "t", (ev.JobSucceeded(1),))
    return {"accepted": accepted, "accepted_at": accepted_at, "running": running,
            "running_at": running_at, "succeeded": succeeded}


def _until(db_url: str, point: str) -> dict[str, object]:
    result = cli(db_url, "replay", "--until", point, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    return {r["id"]: r for r in rows}


def test_until_seq_shows_the_state_at_that_position(db_url: str, timeline: dict[str, object]) -> None:
    assert _until(db_url, "0") == {}
    first = _until(db_url, str(timeline["accepted"]))["t"]
    assert (first["status"], first["reason"]) == ("Pending", "Waiting")
    running = _until(db_url, str(timeline["running"]))["t"]
    assert (running["status"], running["reason"], running["message"]) == ("Running", None, "1/1 active")
    assert running["finished_at"] is None
    done = _until(db_url, str(timeline["succeeded"]))["t"]
    assert (done["status"], done["message"]) == ("Succeeded", "succeeded (1 pod(s))")
    assert _until(db_url, "999999")["t"] == done


def test_until_iso_time_shows_the_state_at_that_moment(db_url: str, timeline: dict[str, object]) -> None:
    running_at: dt.datetime = timeline["running_at"]  # type: ignore[assignment]
    half_way = (running_at + dt.timedelta(minutes=30)).isoformat()
    assert _until(db_url, half_way)["t"]["status"] == "Running"
    assert _until(db_url, running_at.isoformat())["t"]["status"] == "Running"
    just_before = (running_at - dt.timedelta(microseconds=1)).isoformat()
    assert _until(db_url, just_before)["t"]["reason"] == "Dispatching"
    zoned = (running_at + dt.timedelta(minutes=30)).replace(tzinfo=dt.timezone.utc).astimezone(
        dt.timezone(dt.timedelta(hours=8)))
    assert _until(db_url, zoned.isoformat())["t"]["status"] == "Running"
    assert _until(db_url, "2000-01-01T00:00:00") == {}


def test_until_prints_a_table_and_the_position(db_url: str, timeline: dict[str, object]) -> None:
    result = cli(db_url, "replay", "--until", str(timeline["running"]))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"state as of seq {timeline['running']}")
    assert "Running" in result.stdout and "1/1 active" in result.stdout


def test_until_through_the_python_api(app: App, timeline: dict[str, object]) -> None:
    states = replay.fold_log(app.store, until=int(timeline["accepted"]))  # type: ignore[arg-type]
    (state,) = states.all()
    assert (state.status, state.reason) == ("Pending", "Waiting")
    (row,) = replay.state_rows(states, "zh")
    assert row["message"] == "已接收，正在为 v6e 2x2 选择集群"
    seq = app.store.seq_at(timeline["running_at"])  # type: ignore[arg-type]
    assert seq == timeline["running"]


def test_until_rejects_what_is_neither_a_seq_nor_a_time(db_url: str) -> None:
    result = cli(db_url, "replay", "--until", "yesterday")
    assert result.exit_code == 2
    assert result.stderr.startswith("falcon-es: --until 'yesterday': expected a seq number or an ISO time")
    assert "Traceback" not in result.output


def test_replay_without_a_mode_says_what_to_choose(db_url: str) -> None:
    result = cli(db_url, "replay")
    assert result.exit_code == 2
    assert result.stderr.strip() == "falcon-es: replay: choose --verify, --rebuild or --until SEQ|ISO-TIME"


def test_replay_orders_the_queues_by_the_configured_aging_rule(app: App, clock: VirtualClock,
                                                               db_url: str) -> None:
    """A low-priority task waiting two hours has aged past a newcomer of normal
    priority under the default rule (10 points per 5 minutes), and not with aging off
    (FALCON_AGING_POINTS=0): ``replay --until`` shows the configured order."""
    chosen = ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ())
    for task_id, priority in (("old-low", -100), ("new-normal", 0)):
        submit(app, task_id)
        accepted = ev.TaskAccepted(task_id, "user-a", {**SPEC, "priority": priority}, "v6e",
                                   "2x2", clock.now())
        drive(app, clock, task_id, (accepted, chosen))
        clock.advance(7200)
    head = str(app.store.head())

    def order(env: dict[str, str]) -> list[str]:
        result = CliRunner(env=env).invoke(main, ["--db", db_url, "replay", "--until", head,
                                                  "--json"])
        assert result.exit_code == 0, result.output
        rows = sorted((r for r in json.loads(result.stdout) if r["reason"] == "Waiting"),
                      key=lambda r: r["message"])
        return [r["id"] for r in rows]

    assert order({}) == ["old-low", "new-normal"]
    assert order({"FALCON_AGING_POINTS": "0"}) == ["new-normal", "old-low"]
