"""The queue view and the waiting positions in the job table: bulk refresh of changed
queues only, the abort guard, replay reproducing positions, and the CLI."""

from __future__ import annotations

import json
import re

import sqlalchemy as sa
from click.testing import CliRunner

from falcon_es.domain import events as ev
from falcon_es.jobtable import job_rows
from falcon_es.app.application import App, open_app
from falcon_es.cli import main
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable
from falcon_es.projections import replay as rp
from falcon_es.projections.messages import position_message
from falcon_es.projections.queue_listing import queue_rows
from tests.test_scheduling import add_cluster, append, controller, position, row, run, submit

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table


def messages(app: App, ids: list[str]) -> list[str]:
    return [position(row(app, t)["message"]) for t in ids]


def test_position_messages_in_chinese(db_url: str, clock) -> None:
    app = open_app(Settings(db_url=db_url, language="zh"), clock)
    try:
        add_cluster(app, "tpu-a")
        ctl = controller(app)
        submit(app, "user-a", "first")
        a = submit(app, "user-a", "profiling-v7x")
        b = submit(app, "user-b", "benchmark-v7x")
        c = submit(app, "user-c", "third")
        ctl.tick()
        assert messages(app, [b, a, c]) == [
            "队列位置 #1，下一个",
            "队列位置 #2，前面有 1 个任务 (user-b: benchmark-v7x)",
            "队列位置 #3，前面有 2 个任务 (user-b: benchmark-v7x, user-a: profiling-v7x)",
        ]
    finally:
        app.close()


def test_long_queues_name_three_ahead_and_count_the_rest(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    ids = [submit(app, "solo", f"t{i}") for i in range(7)]
    ctl.tick()
    assert position(row(app, ids[6])["message"]) == "#6, 5 ahead (solo: t1, solo: t2, solo: t3, 2 more)"
    assert position_message(6, [("solo", f"t{i}") for i in range(1, 6)]) == position(row(app, ids[6])["message"])


def test_only_rows_whose_text_changed_are_rewritten(app: App, clock) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    small = [submit(app, "u", f"s{i}") for i in range(3)]
    wide = [submit(app, "u", f"w{i}", topology="2x4") for i in range(4)]
    ctl.tick()
    view = app.queue_view
    assert view is not None
    assert view.last_refresh_rows == 2 + 3
    run(app, small[0])  # frees the 2x2 slot; nothing moves in 2x4
    ctl.tick()
    assert view.last_refresh_rows == 0, "s2 moved up within the interval: not yet"
    assert position(row(app, small[2])["message"]) == "#2, 1 ahead (u: s1)"
    clock.advance(app.settings.scheduling.position_refresh_seconds)
    assert ctl.tick().appended == 0
    assert view.last_refresh_rows == 1, "only s2 moved up (s1 was picked)"
    assert position(row(app, small[2])["message"]) == "#1, next in line"
    # A new arrival at the tail of 2x4 writes its own row only.
    late = submit(app, "u", "w4", topology="2x4")
    ctl.tick()
    assert view.last_refresh_rows == 1
    assert position(row(app, late)["message"]) == "#4, 3 ahead (u: w1, u: w2, u: w3)"
    assert ctl.tick().appended == 0, "nothing changed: no events, no writes"
    assert messages(app, wide[1:]) == ["#1, next in line", "#2, 1 ahead (u: w1)",
                                       "#3, 2 ahead (u: w1, u: w2)"]


def test_a_row_the_upper_layer_set_aborting_is_never_overwritten(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    holder, first, second = (submit(app, "u", f"t{i}") for i in range(3))
    ctl.tick()
    job_rows.request_abort(app.engine, second, app.clock.now())
    before = row(app, second)
    # The holder runs (appended outside the controller): the queue's order changes
    # and the refresh runs before the controller has folded the abort.
    run(app, holder)
    after = row(app, second)
    assert (after["status"], after["message"]) == ("Aborting", before["message"])
    assert position(row(app, first)["message"]) == "#1, next in line"
    ctl.tick()
    assert row(app, second)["status"] == "Aborting"


def test_replay_reproduces_positions_and_rebuild_restores_them(app: App, db_url: str) -> None:
    add_cluster(app, "tpu-a")
    add_cluster(app, "tpu-b")
    ctl = controller(app)
    ids = [submit(app, actor, f"{actor}-{i}", topology=topology)
           for i in range(3) for actor in ("ann", "bob") for topology in ("2x2", "2x4")]
    ctl.tick()
    holders = [t for t in ids if row(app, t)["reason"] == "Provisioning"]
    run(app, holders[0])
    append(app, holders[1], ev.NodePoolFailed("falcon-x", "quota"))
    ctl.tick()
    interval = app.settings.scheduling.position_refresh_seconds
    assert rp.verify(app.engine, app.store, "en", job=app.job, refresh_seconds=interval) == []
    with app.engine.begin() as conn:
        conn.execute(job.update().where(job.c.reason == "Waiting").values(message="stale"))
    assert {d.column for d in rp.verify(app.engine, app.store, "en", job=app.job,
                                        refresh_seconds=interval)} == {"message"}
    states, queues = rp.fold_views(app.store, "en")
    with app.engine.begin() as conn:
        rp.rebuild(conn, states, "en", queues, job=app.job)
    assert rp.verify(app.engine, app.store, "en", job=app.job) == []
    waiting = [t for t in ids if row(app, t)["reason"] == "Waiting"]
    assert all(row(app, t)["message"].startswith("#") for t in waiting)


def untimed(queues: list[dict]) -> list[dict]:
    """The queue view without what depends on the moment it is read at (aging, the
    expected starts and the Messages' wait notes)."""
    timed = ("effective_priority", "expected_start")
    return [{**q, "waiting": [{k: (position(v) if k == "message" else v)
                               for k, v in w.items() if k not in timed}
                              for w in q["waiting"]]} for q in queues]


def test_queue_view_and_cli(app: App, db_url: str) -> None:
    cluster = add_cluster(app, "tpu-a")
    add_cluster(app, "tpu-z", tpu_type="v7x", status="maintenance")
    ctl = controller(app)
    a1, a2 = submit(app, "user-a", "a1"), submit(app, "user-a", "a2")
    b1 = submit(app, "user-b", "b1")
    running = submit(app, "user-c", "c1", topology="2x4")
    stuck = submit(app, "user-d", "d1", topology="2x2x1", tpu_type="v7x")
    ctl.tick()
    run(app, running)
    ctl.tick()
    assert app.queue_view is not None
    live = queue_rows(app.queue_view, {cluster.id: cluster})
    runner = CliRunner()
    result = runner.invoke(main, ["--db", db_url, "queues", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert untimed(shown["queues"]) == untimed(live), "folding the log gives the live view"
    (queue,) = [q for q in shown["queues"] if q["topology"] == "2x2"]
    assert [(w["priority"], w["reason"]) for w in queue["waiting"]] == [
        (0, "slot held by user-a: a1 (Provisioning since "
            f"{row(app, a1)['updated_at']:%Y-%m-%d %H:%M} UTC)")] * 2
    assert all("effective_priority" in w and "expected_start" in w for w in queue["waiting"])
    q2x2 = next(q for q in shown["queues"] if q["topology"] == "2x2")
    assert q2x2["slot_holder"]["task_id"] == a1
    assert q2x2["slot_holder"]["reason"] == "Provisioning"
    assert [(w["position"], w["task_id"]) for w in q2x2["waiting"]] == [(1, b1), (2, a2)]
    assert q2x2["last_actor"] == "user-a" and q2x2["running"] == 0
    q2x4 = next(q for q in shown["queues"] if q["topology"] == "2x4")
    assert (q2x4["running"], q2x4["slot_holder"], q2x4["waiting"]) == (1, None, [])
    assert [u["task_id"] for u in shown["unplaced"]] == [stuck]
    table = runner.invoke(main, ["--db", db_url, "queues"])
    assert table.exit_code == 0, table.output
    assert "user-a: a1 (Provisioning)" in table.output and "#1 user-b: b1" in table.output
    assert "waiting for an active cluster: user-d: d1 (v7x)" in table.output
    history = runner.invoke(main, ["--db", db_url, "history", b1, "--json"])
    steps = json.loads(history.output)
    assert [s["type"] for s in steps] == ["TaskAccepted", "ClusterChosen"]
    assert steps[1]["data"]["why"] == "only-candidate"
    until = runner.invoke(main, ["--db", db_url, "replay", "--until", str(app.store.head()), "--json"])
    as_of = {r["id"]: r["message"] for r in json.loads(until.output)}
    assert position(as_of[b1]) == "#1, next in line"
    assert position(as_of[a2]) == "#2, 1 ahead (user-b: b1)"
    verify = runner.invoke(main, ["--db", db_url, "replay", "--verify"])
    assert verify.exit_code == 0, verify.output


def test_positions_are_refreshed_in_one_batched_statement(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    ids = [submit(app, f"user-{i % 5}", f"t{i}") for i in range(60)]
    statements: list[tuple[bool, int]] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        # Only the position refresh (the job-table projection writes all its columns);
        # on MySQL/MariaDB it travels in the append's batch (storage.batched), one
        # statement of several: its marks are counted.
        if re.match(r"UPDATE job SET message=\S+ WHERE", statement.strip()):
            statements.append((executemany, len(parameters)))
        for part in statement.split(";\n"):
            if "SET job.message = CASE" in part:
                statements.append((executemany, part.count("%s")))

    sa.event.listen(app.engine, "before_cursor_execute", count)
    try:
        ctl.tick()
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", count)
    waiting = [t for t in ids if row(app, t)["reason"] == "Waiting"]
    assert len(waiting) == 59
    if app.engine.dialect.name == "sqlite":
        assert statements == [(True, 59)], "one executemany carrying every moved row"
    else:
        # (id, message) per row, the ids again, the status.
        assert statements == [(False, 3 * 59 + 1)], "one UPDATE carrying every row"


def test_bulk_position_rendering_equals_position_message() -> None:
    import datetime as dt

    from falcon_es.domain.queue_places import Entry
    from falcon_es.projections.position_messages import positions

    at = dt.datetime(2026, 1, 1)
    order = [Entry(f"t{i}", f"user-{i % 3}", f"job-{i}", at, "v6e", "2x2", (at, f"t{i}"))
             for i in range(9)]
    for lang in ("en", "zh"):
        expected = [(e.task_id, position_message(i + 1, [(a.actor, a.name) for a in order[:i]], lang))
                    for i, e in enumerate(order)]
        assert list(positions(order, lang)) == expected
    assert list(positions([], "en")) == []
