"""``notice_priority_requests``: the upper layer asks for a waiting task's priority to
change through the job table's optional priority columns, written here in plain SQL as
that layer would; the controller records PriorityChanged with who asked, and the queue
order (positions, who is ahead) follows in the same append. Requests that cannot apply
are refused and logged once with why. Runs on both dialects (it reads the job table)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from falcon_es.storage import db
from falcon_es.domain import events as ev
from falcon_es.app.application import App
from falcon_es.handlers import intake
from falcon_es.jobtable.inbox import PRIORITY_REFUSED, JobInbox, PriorityRow
from falcon_es.config.job_mapping import JobMapping
from falcon_es.storage.tables import JobTable
from tests.support.bench import HandlerBench, HandlerBenches, reserved_cluster

#: A job table of its own with the priority columns (the default one has none).
MAPPING = JobMapping(table="job_prio", priority_requests=True)


def empty_priority_table(db_url: str) -> None:
    """The job table with the priority columns, created once per database, empty."""
    engine = sa.create_engine(db_url)
    job = JobTable(MAPPING)
    db.create_job_table(engine, job)
    with engine.begin() as conn:
        conn.execute(job.table.delete())
    engine.dispose()


@pytest.fixture
def bench(make_bench: HandlerBenches) -> Iterator[HandlerBench]:
    empty_priority_table(make_bench.db_url)
    yield make_bench(intake.notice_priority_requests, reserved_cluster(),
                     job_mapping=MAPPING, position_refresh_seconds=0)


def ask(bench: HandlerBench, task_id: str, priority: object, by: str | None = "ops-alice",
        at: dt.datetime | None = None) -> None:
    """What the upper layer writes: a plain UPDATE of the three columns."""
    engine = sa.create_engine(bench.settings.database.db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE job_prio SET priority = :p, priority_requested_at = :at, "
            "priority_requested_by = :by WHERE id = :id"),
            {"p": priority, "at": at or bench.clock.now(), "by": by, "id": task_id})
    engine.dispose()


def test_a_waiting_tasks_priority_changes_with_the_requester_and_the_order_follows(
        bench: HandlerBench) -> None:
    bench.bring("holder", "picked", actor="user-a")
    bench.bring("first", "waiting", actor="user-a")
    bench.clock.advance(1)
    bench.bring("second", "waiting", actor="user-a")
    assert bench.row("second")["message"].startswith("#2, 1 ahead (user-a: first)")
    bench.clock.advance(1)

    ask(bench, "second", 50)
    ((task, changed),) = bench.run()

    assert task == "second" and isinstance(changed, ev.PriorityChanged)
    assert (changed.old, changed.new, changed.requester) == (0, 50, "ops-alice")
    assert changed.requested_at == bench.clock.now()
    assert bench.state("second").submission.priority == 50
    assert bench.row("second")["message"].startswith("#1, next in line")
    assert bench.row("first")["message"].startswith("#2, 1 ahead (user-a: second)")
    # Read again inside the margin: applied already, nothing more is recorded.
    bench.clock.advance(5)
    assert bench.run() == []


def test_a_request_that_names_nobody_is_the_upper_layers(bench: HandlerBench) -> None:
    bench.bring("t1", "waiting")
    ask(bench, "t1", -100, by=None)
    ((_, changed),) = bench.run()
    assert isinstance(changed, ev.PriorityChanged)
    assert (changed.new, changed.requester) == (-100, "upper-layer")


@pytest.mark.parametrize(("step", "priority", "why"), [
    ("picked", 50, "is Pending/Provisioning, no longer waiting"),
    ("running", 50, "is Running, no longer waiting"),
    ("waiting", 500, "priority 500 is outside the range -100 to 100"),
])
def test_a_request_that_cannot_apply_is_refused_and_logged_once_with_why(
        bench: HandlerBench, caplog: pytest.LogCaptureFixture, step: str, priority: int,
        why: str) -> None:
    bench.bring("t1", step)
    ask(bench, "t1", priority)
    with caplog.at_level(logging.WARNING, logger="falcon_es.jobtable.inbox"):
        assert bench.run() == []
        bench.clock.advance(1)
        assert bench.run() == []
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and why in refusals[0] and "ops-alice" in refusals[0]


def test_only_requests_since_the_latest_less_the_margin_are_read_again(
        bench: HandlerBench) -> None:
    bench.bring("t1", "waiting")
    bench.bring("t2", "waiting")
    ask(bench, "t1", 10)
    assert [type(e) for _, e in bench.run()] == [ev.PriorityChanged]
    bench.clock.advance(3600)
    ask(bench, "t2", 20)
    ((task, changed),) = bench.run()
    assert task == "t2" and isinstance(changed, ev.PriorityChanged)


def test_the_same_ticks_pick_serves_the_new_priority(make_bench: HandlerBenches) -> None:
    """The request is folded before the scheduling handlers run, so a free slot is
    given by the new order in the same tick."""
    from falcon_es.engine.context import HandlerContext
    from falcon_es.handlers import scheduling
    from falcon_es.engine.runtime import Tick

    def requests_then_picks(tick: Tick, ctx: HandlerContext) -> None:
        intake.notice_priority_requests(tick, ctx)
        scheduling.fill_free_slots(tick, ctx)

    empty_priority_table(make_bench.db_url)
    bench = make_bench(requests_then_picks, reserved_cluster(), job_mapping=MAPPING)
    bench.bring("early", "waiting", actor="user-a")
    bench.clock.advance(1)
    bench.bring("late", "waiting", actor="user-b")
    ask(bench, "late", "100")

    emitted = bench.run()

    assert [(task, type(event)) for task, event in emitted] == [
        ("late", ev.PriorityChanged), ("late", ev.TaskPicked)]
    picked = emitted[1][1]
    assert isinstance(picked, ev.TaskPicked) and picked.why == "priority"


def test_a_request_that_commits_late_is_read_at_the_next_rescan(bench: HandlerBench) -> None:
    """Each tick reads the requests after the latest one read; every minute it looks
    ten minutes further back, for an update that committed after a later one."""
    bench.bring("t1", "waiting")
    bench.bring("t2", "waiting")
    ask(bench, "t1", 10)
    assert [task for task, _ in bench.run()] == ["t1"]
    bench.clock.advance(5)
    ask(bench, "t2", 20, at=bench.clock.now() - dt.timedelta(minutes=2))
    assert bench.run() == []
    bench.clock.advance(60)
    ((task, changed),) = bench.run()
    assert task == "t2" and isinstance(changed, ev.PriorityChanged) and changed.new == 20


def test_a_request_dated_in_the_future_hides_none_after_it(bench: HandlerBench) -> None:
    bench.bring("t1", "waiting")
    bench.bring("t2", "waiting")
    ask(bench, "t1", 10, at=bench.clock.now() + dt.timedelta(days=1))
    assert [task for task, _ in bench.run()] == ["t1"]
    bench.clock.advance(1)
    ask(bench, "t2", 20)
    assert [task for task, _ in bench.run()] == ["t2"]


def test_a_refused_request_is_counted_once_in_the_ignored_rows_metric(app: App) -> None:
    seen: list[str] = []
    inbox = JobInbox(app.engine, app.job, clock=app.clock, ignored=seen.append)
    row = PriorityRow("t1", 500, app.clock.now(), "ops-alice")
    inbox.priority_refused(row, "priority 500 is outside the range -100 to 100")
    inbox.priority_refused(row, "priority 500 is outside the range -100 to 100")
    assert seen == [PRIORITY_REFUSED]
