"""The job-table projection: what each event does to Status / Reason / Message and the
scheduling columns, and the compare-and-set that never loses an upper-layer abort."""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.domain import events as ev
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.store import EventStore, Meta, StreamAppend
from falcon_es.storage.tables import JobTable
from falcon_es.handlers import intake
from falcon_es.projections import replay

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

SUBMITTED = dt.datetime(2026, 11, 1, 8)
SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}
META = Meta(actor="controller")

ACCEPTED = ev.TaskAccepted("train", "user-a", SPEC, "v6e", "2x2", SUBMITTED)
CHOSEN = ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ())
PICKED = ev.TaskPicked("c-1", "2x2", "only-waiting", (), None)
CREATE = ev.NodePoolCreateRequested("falcon-p1", "flex-start", "ct6e-standard-4t", 1, None, 600)
STARTED = ev.NodePoolCreateStarted("falcon-p1", "op-1")
READY = ev.NodePoolReady("falcon-p1", 1)
SUBMIT = ev.JobSubmitRequested("falcon-job-1", "falcon-p1")
SUBMITTED_JOB = ev.JobSubmitted("falcon-job-1", "uid-1")
RUNNING = ev.PodsRunning(1, 1)

TO_WAITING = (ACCEPTED, CHOSEN)
TO_PROVISIONING = (*TO_WAITING, PICKED, CREATE, STARTED)
TO_DISPATCHING = (*TO_PROVISIONING, READY)
TO_RUNNING = (*TO_DISPATCHING, SUBMIT, SUBMITTED_JOB, RUNNING)


def new_row(app: App, task_id: str) -> None:
    job_rows.submit(app.engine, name="train", actor="user-a", spec=SPEC, now=SUBMITTED,
                    task_id=task_id)


def drive(app: App, clock: VirtualClock, task_id: str, events: Sequence[ev.Event]) -> dict[str, Any]:
    """Append each event in its own tick, one minute apart; return the job row."""
    for event in events:
        clock.advance(60)
        state = app.tasks.get(task_id)
        app.store.append([StreamAppend(task_id, state.version if state else 0, (event,), META)])
    return job_rows.get_row(app.engine, task_id)


def times_of(app: App, task_id: str) -> dict[str, dt.datetime]:
    return {r.type_name: r.recorded_at for r in app.store.read_stream(task_id)}


# ------------------------------------------------------------------ Status and Reason


@pytest.mark.parametrize(("events", "reason"), [
    (TO_WAITING, "Waiting"),
    (TO_PROVISIONING, "Provisioning"),
    ((*TO_PROVISIONING, ev.ReservationInsufficient("r-1", 0, 1, 1)), "ClusterBusy"),
    ((*TO_PROVISIONING, ev.NodesNotReady("falcon-p1", 0, 1, 1)), "WaitingForNode"),
    (TO_DISPATCHING, "Dispatching"),
])
def test_pending_reason_is_the_sub_state(app: App, clock: VirtualClock,
                                         events: tuple[ev.Event, ...], reason: str) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", events)
    assert (row["status"], row["reason"]) == ("Pending", reason)
    assert row["message"]


@pytest.mark.parametrize(("events", "status"), [
    (TO_RUNNING, "Running"),
    ((*TO_RUNNING, ev.JobSucceeded(1)), "Succeeded"),
    ((*TO_RUNNING, ev.AbortRequested(None, "Running")), "Aborting"),
    ((*TO_RUNNING, ev.AbortRequested(None, "Running"), ev.TaskAborted("Running")), "Aborted"),
    ((ev.AbortRequested(None, "New"),), "Aborting"),
])
def test_reason_is_empty_outside_pending_and_failed(app: App, clock: VirtualClock,
                                                    events: tuple[ev.Event, ...], status: str) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", events)
    assert row["status"] == status
    assert row["reason"] is None


@pytest.mark.parametrize(("events", "reason", "message"), [
    ((ev.TaskRejected("train", "user-a", "InvalidSpec", "image", "required"),),
     "InvalidSpec", "invalid task spec: image: required"),
    ((ACCEPTED, ev.NoMatchingCluster("v9", ("v5p", "v6e"))), "NoMatchingCluster",
     "no cluster serves TPU type v9; registered TPU types: v5p, v6e"),
    ((*TO_PROVISIONING, ev.NodePoolFailed("falcon-p1", "QUOTA_EXCEEDED")), "NodePoolFailed",
     "node pool falcon-p1 failed: QUOTA_EXCEEDED"),
    ((*TO_PROVISIONING, ev.ReservationInsufficient("r-1", 0, 1, 1),
      ev.NodePoolFailed("falcon-p1", "reservation r-1 not found")), "NodePoolFailed",
     "node pool falcon-p1 failed: reservation r-1 not found"),
    ((*TO_PROVISIONING, ev.NodePoolTimedOut("falcon-p1", 1800)), "NodePoolTimeout",
     "node pool falcon-p1 not ready after 1800s"),
    ((*TO_DISPATCHING, ev.JobSubmitFailed("falcon-job-1", "admission webhook denied")),
     "JobSubmitFailed", "Job falcon-job-1 could not be submitted: admission webhook denied"),
    ((*TO_RUNNING, ev.JobFailed("OOMKilled (exit code 137)", 137)), "JobFailed",
     "OOMKilled (exit code 137)"),
    ((*TO_RUNNING, ev.TaskTimedOut(3600)), "Timeout", "timed out after 3600s; Job deleted"),
    ((*TO_DISPATCHING, SUBMIT, SUBMITTED_JOB, ev.TaskTimedOut(60)), "Timeout",
     "timed out after 60s; Job deleted"),
])
def test_failed_reason_and_message_come_from_the_failing_event(
    app: App, clock: VirtualClock, events: tuple[ev.Event, ...], reason: str, message: str,
) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", events)
    assert (row["status"], row["reason"], row["message"]) == ("Failed", reason, message)
    assert row["finished_at"] == times_of(app, "t")[events[-1].type_name]


def test_a_late_job_delete_keeps_the_failure_reason_and_message(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", (*TO_RUNNING, ev.TaskTimedOut(3600),
                                  ev.JobDeleteRequested("falcon-job-1", "timeout"),
                                  ev.JobDeleted("falcon-job-1")))
    assert (row["status"], row["reason"]) == ("Failed", "Timeout")
    assert row["message"] == "timed out after 3600s; Job deleted"


# ------------------------------------------------------------------ times and columns


def test_dispatch_and_finish_times_and_scheduling_columns(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", TO_DISPATCHING)
    assert row["cluster_id"] == "c-1" and row["node_pool_name"] == "falcon-p1"
    assert row["dispatched_at"] is None and row["finished_at"] is None and row["job_uid"] is None
    row = drive(app, clock, "t", (SUBMIT, SUBMITTED_JOB))
    times = times_of(app, "t")
    assert row["dispatched_at"] == times["JobSubmitted"]
    assert row["job_uid"] == "uid-1"
    assert row["finished_at"] is None
    row = drive(app, clock, "t", (RUNNING, ev.JobSucceeded(4)))
    times = times_of(app, "t")
    assert row["status"] == "Succeeded"
    assert row["dispatched_at"] == times["JobSubmitted"]
    assert row["finished_at"] == times["JobSucceeded"]
    assert row["updated_at"] == times["JobSucceeded"]
    assert row["aborted_at"] is None
    assert row["message"] == "succeeded (4 pod(s))"
    assert (row["name"], row["actor"], row["created_at"]) == ("train", "user-a", SUBMITTED)


def test_abort_times_come_from_the_abort_events(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    clock.advance(30)
    job_rows.request_abort(app.engine, "t", clock.now())
    requested = job_rows.get_row(app.engine, "t")["aborting_at"]
    row = drive(app, clock, "t", (*TO_RUNNING, ev.AbortRequested(requested, "Running")))
    assert row["status"] == "Aborting"
    assert row["aborting_at"] == requested, "aborting_at is the upper layer's own column"
    assert row["aborted_at"] is None and row["finished_at"] is None
    assert row["message"] == ("abort requested while Running; waiting for Job falcon-job-1 to "
                              "be deleted and node pool falcon-p1 to be handed over or deleted")
    row = drive(app, clock, "t", (ev.TaskAborted("Running"),))
    aborted = times_of(app, "t")["TaskAborted"]
    assert (row["status"], row["reason"]) == ("Aborted", None)
    assert row["aborted_at"] == aborted and row["finished_at"] == aborted
    assert row["dispatched_at"] == times_of(app, "t")["JobSubmitted"]
    assert row["message"] == "aborted while Running"


def test_pool_events_after_the_end_append_a_note_to_the_result(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", (*TO_RUNNING, ev.JobSucceeded(1), ev.NodePoolDeleteRequested("falcon-p1")))
    finished = row["finished_at"]
    assert row["message"] == "succeeded (1 pod(s)); deleting node pool falcon-p1"
    row = drive(app, clock, "t", (ev.NodePoolDeleteFailed("falcon-p1", "503 backend error", 1),))
    assert row["status"] == "Succeeded" and row["reason"] is None
    assert row["message"] == ("succeeded (1 pod(s)); deleting node pool falcon-p1 failed "
                              "(attempt 1): 503 backend error, failing since 2026-11-01 09:12 UTC")
    row = drive(app, clock, "t", (ev.NodePoolDeleted("falcon-p1"),))
    assert row["message"] == "succeeded (1 pod(s)); node pool falcon-p1 deleted"
    assert row["finished_at"] == finished, "pool notes do not move the finish time"


def test_a_retained_pool_note_follows_a_failure(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    row = drive(app, clock, "t", (*TO_RUNNING, ev.JobFailed("exit code 1", 1),
                                  ev.NodePoolRetained("falcon-p1", "t-next")))
    assert (row["status"], row["reason"]) == ("Failed", "JobFailed")
    assert row["message"] == "exit code 1; node pool falcon-p1 handed over to t-next"


# ------------------------------------------------------------------ compare-and-set


def test_a_projection_write_keeps_an_abort_it_has_not_folded(app: App, clock: VirtualClock) -> None:
    new_row(app, "t")
    drive(app, clock, "t", TO_WAITING)
    job_rows.request_abort(app.engine, "t", clock.now())
    row = drive(app, clock, "t", (PICKED,))
    assert (row["status"], row["reason"]) == ("Aborting", None)
    assert row["message"] == "provisioning on 2x2", "the other columns still follow the log"
    row = drive(app, clock, "t", (ev.AbortRequested(row["aborting_at"], "Pending/Provisioning"),))
    assert (row["status"], row["reason"]) == ("Aborting", None)
    row = drive(app, clock, "t", (ev.TaskAborted("Pending/Provisioning"),))
    assert row["status"] == "Aborted"


def test_a_projection_write_never_moves_an_unfolded_abort_time_backwards(
    app: App, clock: VirtualClock,
) -> None:
    """The upper layer's clock may run ahead of the controller's: its ``updated_at``
    stays until the abort is folded, then the column follows the log again."""
    new_row(app, "t")
    drive(app, clock, "t", TO_WAITING)
    upper_layer_time = clock.now() + dt.timedelta(minutes=10)
    job_rows.request_abort(app.engine, "t", upper_layer_time)
    row = drive(app, clock, "t", (PICKED,))
    assert (row["status"], row["updated_at"]) == ("Aborting", upper_layer_time)
    clock.advance(3600)
    row = drive(app, clock, "t", (CREATE,))
    assert row["updated_at"] == times_of(app, "t")["NodePoolCreateRequested"]
    row = drive(app, clock, "t", (ev.AbortRequested(upper_layer_time, "Pending/Provisioning"),))
    assert row["updated_at"] == times_of(app, "t")["AbortRequested"]


def test_an_abort_on_an_ended_task_is_undone_only_by_folding_it(app: App, clock: VirtualClock) -> None:
    """A blind upper-layer UPDATE may hit a row that just succeeded; AbortIgnored puts the
    result back, and no other write does."""
    new_row(app, "t")
    drive(app, clock, "t", (*TO_RUNNING, ev.JobSucceeded(1)))
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.id == "t").values(status="Aborting",
                                                                aborting_at=clock.now()))
    row = drive(app, clock, "t", (ev.NodePoolDeleteRequested("falcon-p1"),))
    assert row["status"] == "Aborting"
    row = drive(app, clock, "t", (ev.AbortIgnored("Succeeded"),))
    assert (row["status"], row["reason"]) == ("Succeeded", None)
    assert row["message"].startswith("succeeded (1 pod(s)); ")
    assert "abort ignored: the task had already Succeeded" in row["message"]


# ------------------------------------------------------------------ the race


TASKS = 200
TASKS_PER_TICK = 10
ROUNDS = 6
ABORTED = 120


def _script(round_no: int, task_id: str) -> ev.Event:
    """The projection writer's event for a task in a given round (legal in sequence)."""
    opening = (ACCEPTED, CHOSEN, PICKED, CREATE, STARTED)
    if round_no < len(opening):
        return opening[round_no]
    return ev.NodesNotReady(f"falcon-{task_id}", round_no % 4, 4, round_no)


class TickCounter:
    """How many ticks the projection writer has committed; the upper layer waits on it
    to aim each abort at the tick that is about to write the same row."""

    def __init__(self) -> None:
        self._done = 0
        self._changed = threading.Condition()

    def advance(self) -> None:
        with self._changed:
            self._done += 1
            self._changed.notify_all()

    def wait_for(self, ticks: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._done >= ticks, timeout=60)


@dataclass
class AbortLog:
    #: task id -> log head just after its abort committed
    head_after: dict[str, int] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)


def _abort_many(url: str, clock: VirtualClock, plan: list[tuple[int, str]],
                ticks: TickCounter, log: AbortLog) -> None:
    """The upper layer, on its own connection: half its aborts as job_rows does
    (SELECT ... FOR UPDATE, then UPDATE), half as one blind UPDATE."""
    engine = db.make_engine(url)
    store = EventStore(engine, clock)
    try:
        for index, (tick_no, task_id) in enumerate(plan):
            ticks.wait_for(tick_no)
            if index % 2:
                job_rows.request_abort(engine, task_id, clock.now())
            else:
                with engine.begin() as conn:
                    conn.execute(sa.text(
                        "UPDATE job SET status = 'Aborting', aborting_at = :now, updated_at = :now "
                        "WHERE id = :id"), {"now": clock.now(), "id": task_id})
            log.head_after[task_id] = store.head()
    except BaseException as error:  # reported to the test thread, which fails on it
        log.errors.append(error)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_racing_aborts_against_projection_writes_loses_none(db_url: str, clock: VirtualClock) -> None:
    """Each abort is issued while the tick that writes the same row is in flight (just
    before, during or just after its UPDATE), then more blind writes follow."""
    app = open_app(Settings(db_url=db_url), clock)
    rng = random.Random(7)
    task_ids = [f"race-{i:03d}" for i in range(TASKS)]
    ticks_plan: list[list[str]] = []
    for _ in range(ROUNDS):
        order = task_ids[:]
        rng.shuffle(order)
        ticks_plan += [order[i:i + TASKS_PER_TICK] for i in range(0, TASKS, TASKS_PER_TICK)]
    ticks_per_round = TASKS // TASKS_PER_TICK
    doomed = rng.sample(task_ids, ABORTED)
    plan = sorted(
        (rng.choice([n for n in range(ticks_per_round * (ROUNDS - 1)) if t in ticks_plan[n]]), t)
        for t in doomed
    )
    try:
        with app.engine.begin() as conn:
            conn.execute(job.insert(), [
                {"id": t, "name": t, "actor": "user-a", "spec": SPEC, "status": "Pending",
                 "created_at": SUBMITTED, "updated_at": SUBMITTED} for t in task_ids])
        ticks = TickCounter()
        abort_log = AbortLog()
        aborter = threading.Thread(target=_abort_many, daemon=True,
                                   args=(db_url, clock, plan, ticks, abort_log))
        aborter.start()
        for tick_no, batch in enumerate(ticks_plan):
            round_no = tick_no // ticks_per_round
            app.store.append([StreamAppend(t, round_no, (_script(round_no, t),), META) for t in batch])
            ticks.advance()
        aborter.join()
        assert abort_log.errors == []
        # Aborts the upper layer made late still meet a projection write afterwards.
        app.store.append([StreamAppend(t, ROUNDS, (_script(ROUNDS, t),), META) for t in task_ids])

        rows = {r["id"]: r for r in job_rows.list_rows(app.engine)}
        for task_id in doomed:
            assert (rows[task_id]["status"], rows[task_id]["reason"]) == ("Aborting", None), task_id
            assert rows[task_id]["aborting_at"] is not None
            later = [r for r in app.store.read_stream(task_id) if r.seq > abort_log.head_after[task_id]]
            assert later, f"{task_id}: no projection write after its abort"
        for task_id in set(task_ids) - set(doomed):
            assert (rows[task_id]["status"], rows[task_id]["reason"]) == ("Pending", "WaitingForNode")
        assert replay.verify(app.engine, app.store, "en", job=app.job) == []
    finally:
        app.close()

    folding = open_app(Settings(db_url=db_url), clock)
    try:
        controller = build_service(folding, None, RunOptions(handlers=(intake.notice_abort_requests,))).controller
        controller.tick()
        for task_id in doomed:
            assert folding.store.read_stream(task_id)[-1].type_name == "AbortRequested"
        rows = {r["id"]: r for r in job_rows.list_rows(folding.engine)}
        assert {rows[t]["status"] for t in doomed} == {"Aborting"}
        assert {rows[t]["status"] for t in set(task_ids) - set(doomed)} == {"Pending"}
        assert replay.verify(folding.engine, folding.store, "en", job=folding.job) == []
        assert controller.tick().appended == 0, "a folded abort is not folded twice"
    finally:
        folding.close()


@pytest.mark.parametrize(("by_id_rows", "batches"), [
    (0, (("a1", "a2"),)),  # the joined form
    (10, (("a1", "a2"),)),  # MySQL/MariaDB: the values chosen by id
    (10, (("a1",), ("a2",))),  # MySQL/MariaDB: the one-row form
], ids=["joined", "by-id", "one-row"])
def test_the_per_row_and_the_batched_update_write_the_same_rows(
        app: App, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch, by_id_rows: int,
        batches: tuple[tuple[str, ...], ...]) -> None:
    """SQLite before 3.33 has no UPDATE ... FROM and gets the per-row compare-and-set;
    every batched form must leave the same rows, an unfolded abort included."""
    from falcon_es.projections import job_table
    from falcon_es.domain.task import fold
    from falcon_es.domain.task_states import Change

    monkeypatch.setattr(job_table, "BY_ID_ROWS", by_id_rows)

    for task_id in ("a1", "a2", "b1", "b2"):
        new_row(app, task_id)
    job_rows.request_abort(app.engine, "a2", clock.now())
    job_rows.request_abort(app.engine, "b2", clock.now())
    states = {t: fold(t, [(e, clock.now() + dt.timedelta(seconds=i)) for i, e in enumerate(TO_RUNNING)])
              for t in ("a1", "a2", "b1", "b2")}
    params = []
    for task_id in ("b1", "b2"):
        row = {f"b_{k}": v for k, v in job_table.row_values(states[task_id], "en").items()}
        params.append({**row, "b_id": task_id, "b_folds_abort": 0})
    with app.engine.begin() as conn:
        batched = sum(job_table.write_rows(conn, [Change(states[t], states[t], False) for t in batch],
                                           "en", job=JobTable()) for batch in batches)
        per_row = conn.execute(job_table._cas_update(JobTable()), params).rowcount
    assert batched == per_row == 2
    rows = {r["id"]: r for r in job_rows.list_rows(app.engine)}
    for first, second in (("a1", "b1"), ("a2", "b2")):
        same = {k: v for k, v in rows[first].items() if k != "id"}
        assert same == {k: v for k, v in rows[second].items() if k != "id"}
    assert (rows["a2"]["status"], rows["a2"]["reason"]) == ("Aborting", None)
    assert (rows["a1"]["status"], rows["a1"]["message"]) == ("Running", "1/1 active")


def test_the_joined_update_binds_datetimes_as_sqlalchemy_writes_them() -> None:
    """The job-table write binds SQLite's datetimes as ISO text itself: the same text
    as SQLAlchemy's DateTime (the time comparisons in SQL compare that text)."""
    from sqlalchemy.dialects import sqlite

    from falcon_es.projections.job_table import _bind_processors

    dialect = sqlite.dialect()
    core = sa.DateTime().dialect_impl(dialect).bind_processor(dialect)
    processors = [p for p in _bind_processors(JobTable(), dialect) if p is not None]
    assert len(processors) == 4  # dispatched_at, aborted_at, finished_at, updated_at
    moments = [dt.datetime(2026, 11, 1, 8), dt.datetime(2026, 11, 1, 8, 0, 0, 5),
               dt.datetime(999, 1, 2, 3, 4, 5, 999999), dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc),
               dt.date(2026, 11, 1)]
    for process in processors:
        assert [process(m) for m in moments] == [core(m) for m in moments]
