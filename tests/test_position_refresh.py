"""Position Messages under FALCON_POSITION_REFRESH_SECONDS, on a virtual clock: each
waiting row is rewritten at its own moment of the interval (its slice), at most once per
interval and only when its text changed; a task
that joins or whose own Message was replaced gets its position at once; the loop wakes
for a due refresh; no Message is ever older than one interval; ``queues`` shows the
exact order at once; a restart writes only what differs; ``replay --verify`` accepts
positions of the log's last interval and nothing else; the setting is validated."""

from __future__ import annotations

import datetime as dt
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falcon_es.storage import db, registry
from falcon_es.jobtable import job_rows
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.app.service import Service
from falcon_es.config.settings import MAX_POSITION_REFRESH_SECONDS, Settings, SettingsError
from falcon_es.storage.tables import JobTable
from tests.conftest import migrate

#: The job table under Falcon-ES's own names (what the fixtures create).
job = JobTable().table
from falcon_es.projections import replay as rp
from falcon_es.projections.queues import SLICE_EPOCH, QueueView
from tests.conftest import START
from tests.test_scheduling import SCHEDULING, add_cluster, position, run, submit

INTERVAL = Settings().scheduling.position_refresh_seconds
#: Matches the position refresh statements only (the job-table projection writes all
#: its columns in one joined UPDATE of its own).
POSITION_UPDATE = re.compile(r"UPDATE job SET (message=\S+ WHERE|job\.message = CASE)")


class PositionWrites:
    """Counts the position UPDATE statements the engine sends and the rows they carry."""

    def __init__(self, app: App) -> None:
        self.engine = app.engine
        self.statements = 0
        self.rows = 0

    def __enter__(self) -> PositionWrites:
        sa.event.listen(self.engine, "before_cursor_execute", self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._count)

    def _count(self, conn: object, cursor: object, statement: str, parameters: object,
               context: object, executemany: bool) -> None:
        if executemany:  # SQLite: an executemany of (message, id, status)
            if POSITION_UPDATE.search(statement):
                assert isinstance(parameters, (list, tuple))
                self.statements += 1
                self.rows += len(parameters)
            return
        # One statement, or MySQL's batch of several (storage.batched): the position
        # UPDATEs among them carry (id, message) pairs (and, in the CASE form, the ids
        # again), then the status.
        for part in statement.split(";\n"):
            if POSITION_UPDATE.search(part):
                self.statements += 1
                marks = part.count("%s") or 1
                self.rows += (marks - 1) // (3 if "CASE" in part else 2) or 1


def service(app: App) -> Service:
    return build_service(app, None, RunOptions(handlers=SCHEDULING))


def shown(app: App, ids: list[str]) -> list[str | None]:
    with app.engine.connect() as conn:
        found = {r.id: r.message for r in conn.execute(
            sa.select(job.c.id, job.c.message).where(job.c.id.in_(ids)))}
    return [position(found[t]) for t in ids]


def exact(app: App, ids: list[str]) -> list[str | None]:
    """Each task's position Message as the queue book has it now."""
    current = dict(app.queue_view.all_positions())
    return [position(current.get(t)) for t in ids]


@pytest.fixture
def queue(app: App) -> Iterator[tuple[Service, list[str]]]:
    """One cluster, one queue: a slot holder and five waiting tasks of one actor, all
    placed by one tick (the first write of a queue is never held back)."""
    add_cluster(app, "tpu-a")
    svc = service(app)
    ids = [submit(app, "u", f"t{i}") for i in range(6)]
    svc.controller.tick()
    assert shown(app, ids[1:]) == exact(app, ids[1:])
    assert shown(app, ids[1:2]) == ["#1, next in line"]
    yield svc, ids


# ------------------------------------------------------------------ the interval


def slice_moment(view: QueueView, task_id: str, after: dt.datetime) -> dt.datetime:
    """The first moment after ``after`` at which the task's slice is due."""
    length = view.refresh_interval / view.slices
    period = (after - SLICE_EPOCH) // length + 1
    while period % view.slices != view.slice_of(task_id):
        period += 1
    return SLICE_EPOCH + length * period


def test_each_row_is_rewritten_at_its_own_moment_at_most_once_per_interval(
        app: App, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    view = app.queue_view
    picked = clock.now()
    with PositionWrites(app) as writes:
        run(app, ids[0])
        svc.controller.tick()  # t1 is picked: everybody behind it moves up
    assert writes.rows == 0, "the pick's moment was swept already"
    moved = ids[2:]
    due = {t: slice_moment(view, t, picked) for t in moved}
    assert svc.loop.next_due() == min(due.values())
    before = dict(zip(moved, shown(app, moved)))
    changed: dict[str, dt.datetime] = {}
    with PositionWrites(app) as writes:
        while (moment := svc.loop.next_due()) is not None:
            clock.advance_to(moment)
            svc.loop.step()
            for task_id, message in zip(moved, shown(app, moved)):
                if message != before[task_id]:
                    assert task_id not in changed, "changed twice"
                    changed[task_id] = clock.now()
                    before[task_id] = message
    assert changed == due, "each row when its slice came, all within one interval"
    assert max(due.values()) <= picked + dt.timedelta(seconds=INTERVAL)
    assert writes.rows == len(moved), "one write per moved row, none of the others"
    assert shown(app, moved) == exact(app, moved) == [
        "#1, next in line", "#2, 1 ahead (u: t2)", "#3, 2 ahead (u: t2, u: t3)",
        "#4, 3 ahead (u: t2, u: t3, u: t4)"]
    with PositionWrites(app) as writes:
        clock.advance(INTERVAL)
        svc.controller.tick()
    assert writes.statements == 0, "nothing changed since: nothing is written"


def test_a_long_queue_is_rewritten_a_slice_at_a_time(db_url: str, clock: VirtualClock) -> None:
    """Forty waiting tasks (a queue longer than those refreshed whole here) and a pick:
    no tick writes more than a few rows, every row gets the new order within the
    interval."""
    app = open_app(Settings(db_url=db_url, position_refresh_seconds=5), clock)
    app.queue_view.whole_rows = 10
    try:
        add_cluster(app, "tpu-a")
        svc = service(app)
        ids = [submit(app, "u", f"t{i}") for i in range(41)]
        svc.controller.tick()
        run(app, ids[0])
        svc.controller.tick()
        picked = clock.now()
        per_tick, last_write = [], picked
        while (moment := svc.loop.next_due()) is not None:
            clock.advance_to(moment)
            with PositionWrites(app) as writes:
                svc.loop.step()
            if writes.rows:
                per_tick.append(writes.rows)
                last_write = clock.now()
        assert last_write <= picked + dt.timedelta(seconds=5)
        assert sum(per_tick) == 39 and len(per_tick) > 5 and max(per_tick) < 39 / 2
        assert shown(app, ids[2:]) == exact(app, ids[2:])
    finally:
        app.close()


def test_a_short_queue_is_rewritten_whole_at_one_moment(
        app: App, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    """Five waiting rows share their queue's slice: after a pick the loop wakes once for
    them, and only once within the interval, which writes the four that moved."""
    svc, ids = queue
    view = app.queue_view
    assert len({view.slice_of(t) for t in ids[1:]}) == 1
    picked = clock.now()
    run(app, ids[0])
    svc.controller.tick()
    wakes, per_tick = 0, []
    while (moment := svc.loop.next_due()) is not None:
        clock.advance_to(moment)
        with PositionWrites(app) as writes:
            svc.loop.step()
        wakes += 1
        per_tick.append(writes.rows)
    assert (wakes, per_tick) == (1, [4])
    assert clock.now() <= picked + dt.timedelta(seconds=INTERVAL)
    assert shown(app, ids[2:]) == exact(app, ids[2:])


def test_rows_whose_text_did_not_change_are_not_written(
        app: App, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    job_rows.request_abort(app.engine, ids[3], clock.now())  # t3: #3 of 5 waiting
    job_rows.request_abort(app.engine, ids[5], clock.now())  # t5: the last
    svc.controller.tick()
    assert shown(app, [ids[3], ids[5]]) == ["abort requested while Pending/Waiting"] * 2
    clock.advance(INTERVAL)
    with PositionWrites(app) as writes:
        svc.controller.tick()
    # t1 and t2 ahead of the aborted tasks read the same; only t4 moved up.
    assert (writes.statements, writes.rows) == (1, 1)
    assert shown(app, ids[1:3] + ids[4:5]) == [
        "#1, next in line", "#2, 1 ahead (u: t1)", "#3, 2 ahead (u: t1, u: t2)"]


def test_the_loop_jumps_to_a_due_refresh_on_a_virtual_clock(
        app: App, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    picked = clock.now()
    run(app, ids[0])
    svc.controller.tick()  # the pick: positions held back
    clock.advance(0.1)
    svc.loop.run(max_ticks=1)  # nothing to do: the loop waits for what is due next
    first = min(ids[2:], key=lambda t: slice_moment(app.queue_view, t, picked))
    assert clock.now() == slice_moment(app.queue_view, first, picked)
    assert shown(app, [first]) != exact(app, [first])
    svc.loop.step()
    assert shown(app, [first]) == exact(app, [first])


# ------------------------------------------------------------------ at once


def test_a_task_that_joins_gets_its_position_at_once(
        app: App, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    run(app, ids[0])
    svc.controller.tick()  # held back: t2..t5 show the order before t1 was picked
    before = shown(app, ids[2:])
    late = submit(app, "v", "late")  # (submitting moves the clock on a little)
    with PositionWrites(app) as writes:
        svc.controller.tick()
    # Another actor's task goes first (u was served last): its own Message is exact at
    # once; of the others only those whose slice came meanwhile moved, the rest catch
    # up at their own moments.
    assert shown(app, [late]) == exact(app, [late]) == ["#1, next in line"]
    moved = [t for t, b, a in zip(ids[2:], before, shown(app, ids[2:])) if a != b]
    assert writes.rows == 1 + len(moved), "the newcomer's row, and no row that did not move"
    assert shown(app, moved) == exact(app, moved)


def test_a_task_whose_message_was_replaced_gets_its_position_at_once(
        app: App, clock: VirtualClock) -> None:
    add_cluster(app, "tpu-a")
    b = add_cluster(app, "tpu-b")
    svc = service(app)
    t0, t1, t2, t3 = (submit(app, "u", f"t{i}") for i in range(4))
    svc.controller.tick()  # the shorter queue in turn: t0, t2 on a; t1, t3 on b
    assert [job_rows.get_row(app.engine, t)["reason"] for t in (t0, t1, t2, t3)] == [
        "Provisioning", "Provisioning", "Waiting", "Waiting"]
    # a goes into maintenance within the interval: t2 is re-queued onto b, whose
    # positions were written just now; its Message is its place there at once (ahead
    # of t3, submitted later), t3's catches up when the interval ends.
    registry.set_status(app.store, "tpu-a", "maintenance")
    svc.controller.tick()
    assert job_rows.get_row(app.engine, t2)["cluster_id"] == b.id
    assert shown(app, [t2]) == exact(app, [t2]) == ["#1, next in line"]
    assert shown(app, [t3]) == ["#1, next in line"] != exact(app, [t3])
    # A picked task's own Message replaces its position with the pick.
    run(app, t1)
    svc.controller.tick()
    assert (job_rows.get_row(app.engine, t2)["reason"], shown(app, [t2])) == (
        "Provisioning", ["provisioning on 2x2"])


# ------------------------------------------------------------------ never older than one interval


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(("ann", "bob", "cid")),
              st.sampled_from(("2x2", "2x4"))),
    st.tuples(st.just("free"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.integers(1, 25)),
), min_size=1, max_size=30))
def test_no_position_message_is_ever_older_than_one_interval(
        steps: list[tuple[object, ...]]) -> None:
    """Random arrivals, picks, aborts and waits, the loop's own jumps to due refreshes in
    between: after every tick each waiting row's Message is its exact position as of
    some tick of the last interval, and a row changes at most once per interval (a
    task's own write when it joins aside)."""
    interval = dt.timedelta(seconds=10)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'falcon.db'}"
        migrate(url)
        clock = VirtualClock(START)
        app = open_app(Settings(db_url=url, position_refresh_seconds=interval.total_seconds()),
                       clock)
        # Queues both shorter and longer than those refreshed whole, and crossing over.
        app.queue_view.whole_rows = 4
        try:
            add_cluster(app, "tpu-a")
            add_cluster(app, "tpu-b")
            # Queues worth the name from the start: a dozen tasks each way.
            start = [("submit", actor, topology) for actor in ("ann", "bob", "cid")
                     for topology in ("2x2", "2x4", "2x2", "2x4")]
            _drive(app, clock, service(app), [*start, *steps], interval)
        finally:
            app.close()


def _drive(app: App, clock: VirtualClock, svc: Service, steps: list[tuple[object, ...]],
           interval: dt.timedelta) -> None:
    history: list[tuple[dt.datetime, dict[str, str]]] = []
    changes: dict[str, list[dt.datetime]] = {}
    seen: dict[str, str | None] = {}

    def tick() -> None:
        svc.loop.step()
        now = clock.now()
        history.append((now, dict(app.queue_view.all_positions())))
        window = [h for h in history if h[0] > now - interval]
        older = [h for h in history if h[0] <= now - interval]
        allowed = window + older[-1:]
        with app.engine.connect() as conn:
            rows = {r.id: r.message for r in conn.execute(
                sa.select(job.c.id, job.c.message).where(job.c.reason == "Waiting"))}
        for task_id in history[-1][1]:
            message = position(rows[task_id])
            assert any(position(positions.get(task_id)) == message
                       for _, positions in allowed), (
                task_id, message, now)
            if task_id in seen and seen[task_id] != message:
                changes.setdefault(task_id, []).append(now)
            seen[task_id] = message
        for moments in changes.values():
            for earlier, later in zip(moments, moments[1:]):
                assert later - earlier >= interval, moments

    for kind, *args in steps:
        if kind == "submit":
            # Inserted at this moment (``submit`` would move the clock a second on
            # behind the loop's back): only waits take time, and the loop goes through
            # every moment due in them, so no slice is swept late here.
            job_rows.submit(app.engine, name="job", actor=str(args[0]), now=clock.now(),
                            spec={"image": "us-docker.pkg.dev/p/r/train:1",
                                  "tpu_type": "v6e", "topology": str(args[1])})
        elif kind == "free":  # up to n slot holders run, so the next tick picks again
            holders = sorted(s.task_id for s in app.tasks.all() if s.holds_slot)
            for holder in holders[:int(args[0])]:  # type: ignore[call-overload]
                run(app, holder)
        elif kind == "abort":
            waiting = sorted(seen)
            if waiting:
                task_id = waiting[int(args[0]) % len(waiting)]
                if job_rows.get_row(app.engine, task_id)["reason"] == "Waiting":
                    job_rows.request_abort(app.engine, task_id, clock.now())
        else:
            target = clock.now() + dt.timedelta(seconds=int(args[0]))  # type: ignore[call-overload]
            for _ in range(100):  # as the loop does: jump to what is due, tick there
                due = svc.loop.next_due()
                if due is None or due > target:
                    break
                clock.advance_to(max(due, clock.now() + dt.timedelta(microseconds=1)))
                tick()
            else:
                raise AssertionError(f"still due at {clock.now()} after 100 ticks: {due}")
            clock.advance_to(target)
        tick()


# ------------------------------------------------------------------ readers


def test_the_queues_command_shows_the_exact_order_at_once(
        app: App, db_url: str, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    run(app, ids[0])
    svc.controller.tick()  # t1 picked; the rows behind it still count it
    assert shown(app, ids[2:4]) == ["#2, 1 ahead (u: t1)", "#3, 2 ahead (u: t1, u: t2)"]
    result = CliRunner().invoke(main, ["--db", db_url, "queues", "--json"])
    assert result.exit_code == 0, result.output
    (q,) = json.loads(result.output)["queues"]
    assert q["slot_holder"]["task_id"] == ids[1]
    assert [(w["position"], w["task_id"], position(w["message"])) for w in q["waiting"]] == [
        (1, ids[2], "#1, next in line"), (2, ids[3], "#2, 1 ahead (u: t2)"),
        (3, ids[4], "#3, 2 ahead (u: t2, u: t3)"), (4, ids[5], "#4, 3 ahead (u: t2, u: t3, u: t4)"),
    ]


def test_a_restart_writes_only_the_rows_that_differ(
        app: App, db_url: str, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    run(app, ids[0])
    svc.controller.tick()  # held back, then the controller stops
    clock.advance(1)
    fresh = open_app(app.settings, clock)
    try:
        with PositionWrites(fresh) as writes:
            restarted = service(fresh)
            restarted.catch_up()
        # t1 left the queue (its own row says so); t2..t5 moved up: no more, no less.
        assert writes.rows == 4
        assert shown(fresh, ids[2:]) == exact(fresh, ids[2:])
        with PositionWrites(fresh) as writes:
            restarted.controller.tick()
        assert writes.statements == 0
    finally:
        fresh.close()


def test_verify_accepts_positions_of_the_last_interval_and_nothing_else(
        app: App, db_url: str, clock: VirtualClock, queue: tuple[Service, list[str]]) -> None:
    svc, ids = queue
    run(app, ids[0])
    svc.controller.tick()  # t1 picked; t2..t5 show the order before
    result = CliRunner().invoke(main, ["--db", db_url, "replay", "--verify"])
    assert result.exit_code == 0, result.output
    lagging = rp.verify(app.engine, app.store, "en", job=app.job)  # as of the end of the log only
    assert {(d.task_id, d.column) for d in lagging} == {(t, "message") for t in ids[2:]}
    # A position the task never held is reported, within the interval or not.
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.id == ids[3]).values(message="#1, next in line"))
    assert [(d.task_id, d.live) for d in rp.verify(
        app.engine, app.store, "en", job=app.job, refresh_seconds=INTERVAL)] == [(ids[3], "#1, next in line")]
    # Once the refresh has come and gone, the old positions are no longer accepted.
    clock.advance(INTERVAL)
    svc.controller.tick()
    run(app, ids[1])
    svc.controller.tick()
    clock.advance(INTERVAL + 1)
    svc.controller.tick()
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.id == ids[4]).values(
            message="#3, 2 ahead (u: t1, u: t2)"))  # what it showed two intervals ago
    assert [(d.task_id, d.column) for d in rp.verify(
        app.engine, app.store, "en", job=app.job, refresh_seconds=INTERVAL)] == [(ids[4], "message")]


# ------------------------------------------------------------------ the setting


def test_the_refresh_setting_is_read_and_checked() -> None:
    assert Settings.from_env({}).scheduling.position_refresh_seconds == 30
    assert Settings.from_env({"FALCON_POSITION_REFRESH_SECONDS": ""}).scheduling.position_refresh_seconds == 30
    assert Settings.from_env({"FALCON_POSITION_REFRESH_SECONDS": "0"}).scheduling.position_refresh_seconds == 0
    assert Settings.from_env({"FALCON_POSITION_REFRESH_SECONDS": "2.5"}).scheduling.position_refresh_seconds == 2.5
    for raw, why in (("soon", "expected a number of seconds"), ("-1", "must be 0 or more"),
                     ("nan", "must be 0 or more"), ("inf", "must be 0 or more"),
                     (str(MAX_POSITION_REFRESH_SECONDS + 1), "at most 3600 seconds")):
        with pytest.raises(SettingsError, match=f"FALCON_POSITION_REFRESH_SECONDS='{raw}': {why}"):
            Settings.from_env({"FALCON_POSITION_REFRESH_SECONDS": raw})


def test_a_bad_refresh_setting_is_one_line_from_the_cli(db_url: str) -> None:
    result = CliRunner().invoke(main, ["--db", db_url, "queues"],
                                env={"FALCON_POSITION_REFRESH_SECONDS": "-5"})
    assert result.exit_code == 2
    assert "falcon-es: FALCON_POSITION_REFRESH_SECONDS='-5': must be 0 or more" in result.output
    assert "Traceback" not in result.output


def test_zero_writes_every_change_with_its_append(db_url: str, clock: VirtualClock) -> None:
    app = open_app(Settings(db_url=db_url, position_refresh_seconds=0), clock)
    try:
        add_cluster(app, "tpu-a")
        svc = service(app)
        ids = [submit(app, "u", f"t{i}") for i in range(4)]
        svc.controller.tick()
        run(app, ids[0])
        svc.controller.tick()
        assert shown(app, ids[2:]) == ["#1, next in line", "#2, 1 ahead (u: t2)"]
        assert svc.loop.next_due() != clock.now()
    finally:
        app.close()


def test_an_interval_needs_a_clock_and_cannot_be_negative() -> None:
    from falcon_es.domain.task_states import TaskStates

    with pytest.raises(ValueError, match="needs the clock"):
        QueueView(TaskStates(), refresh_seconds=5)
    with pytest.raises(ValueError, match="must not be negative"):
        QueueView(TaskStates(), clock=VirtualClock(START), refresh_seconds=-1)
