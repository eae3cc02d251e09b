"""No row of the job table can stop the controller, and no submission is silently
lost (README, 'The job table'). Every case runs on SQLite and MariaDB against an upper layer's own job
table (a binary-collated id and a wider actor column where the case needs them),
written with plain SQL through the upper layer's own driver connection.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from falcon_es.storage import db
from falcon_es.storage.tables import MessageRoom
from falcon_es.domain import events as ev
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.jobtable.ended_rows import ENDED_ROW_CHECK_SECONDS
from falcon_es.jobtable.inbox import ROW_CHECK_SECONDS
from falcon_es.projections import replay
from falcon_es.projections.explain import explain, render
from falcon_es.projections.messages import CUT_MARK, MESSAGE_BYTES, fit_message
from tests.test_upper_layer import (  # noqa: F401 - fixtures
    TASK_SPEC, TYPES, Controller, UpperLayer, any_url, clock, controller, create_table,
    message_of, statuses, upper, when,
)

#: Ids compared as bytes by the upper layer's table (SQLite compares text as bytes).
BINARY_ID = {"mysql": "VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
             "sqlite": "VARCHAR(64)"}
#: A spec column that keeps any bytes (the upper layer's BLOB), for non-UTF-8 text.
BYTES_SPEC = {"mysql": "LONGBLOB", "sqlite": "BLOB"}
LONG_TASK = json.dumps({**json.loads(TASK_SPEC), "sim": {"duration_seconds": 3600}})


def kind(layer: UpperLayer) -> str:
    return "mysql" if layer.mysql else "sqlite"


def table(layer: UpperLayer, **types: str) -> None:
    """The upper layer's table: a binary-collated id and an actor wider than the log's."""
    create_table(layer, **{"id": BINARY_ID[kind(layer)], "actor": "VARCHAR(300)", **types})


def put(layer: UpperLayer, task_id: str, created_at: str, *, spec: object = TASK_SPEC,
        actor: str = "user-a", name: str = "job") -> None:
    layer.execute("INSERT INTO job (id, name, actor, spec, created_at) VALUES (%s, %s, %s, %s, %s)",
                  task_id, name, actor, spec, created_at)


def status_of(layer: UpperLayer, task_id: str) -> tuple[Any, Any]:
    return statuses(layer)[task_id]


def stream_types(running: Controller, task_id: str) -> list[str]:
    return [r.type_name for r in running.app.store.read_stream(task_id)]


def findings(running: Controller, task_id: str) -> list[str]:
    return [r.event.found for r in running.app.store.read_stream(ev.ROW_CHECKS_STREAM)
            if r.event.task_id == task_id]


def diverged(running: Controller, found: str) -> float:
    value = running.metrics.registry.get_sample_value(
        "falcon_job_rows_diverged_total", {"found": found})
    return value or 0.0


class Warned(logging.Handler):
    """The warnings of Falcon-ES's intake, caught on its own logger (not through the
    root logger's handlers, which other tests of a session configure)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warned() -> Iterator[Warned]:
    logger = logging.getLogger("falcon_es.intake")
    handler, was = Warned(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(was)


def verified(running: Controller) -> list[replay.Difference]:
    return replay.verify(running.app.engine, running.app.store, "en", job=running.app.job)


# ----------------------------------------------------------------- one row's trouble


def test_spec_text_no_reader_agrees_on_fails_its_row_alone(any_url: str, upper: UpperLayer,
                                                          clock: VirtualClock) -> None:
    """A 4,301-digit number (the 4.4 KB row MariaDB's JSON_VALID accepts), NaN, a key
    given twice and bytes that are not UTF-8: each row fails with a Reason and a
    Message naming the field; the good row beside them runs to its end."""
    table(upper, spec=BYTES_SPEC[kind(upper)])
    good = json.loads(TASK_SPEC)
    huge = TASK_SPEC[:-1] + ', "timeout_seconds": ' + "7" * 4301 + "}"
    put(upper, "huge", when(clock), spec=huge.encode())
    put(upper, "nan", when(clock), spec=json.dumps({**good, "sim": {"duration_seconds": float("nan")}}).encode())
    put(upper, "twice", when(clock), spec=('{"image": "evil.example/x:1", ' + TASK_SPEC[1:]).encode())
    put(upper, "latin1", when(clock), spec=json.dumps({**good, "env": {"NAME": "Zoé"}},
                                                      ensure_ascii=False).encode("latin-1"))
    put(upper, "good", when(clock, 1), spec=TASK_SPEC.encode())
    running = controller(any_url, clock)
    try:
        running.run()
        assert verified(running) == []
    finally:
        running.close()
    assert statuses(upper) == {"huge": ("Failed", "InvalidSpec"), "nan": ("Failed", "InvalidSpec"),
                               "twice": ("Failed", "InvalidSpec"),
                               "latin1": ("Failed", "InvalidSpec"), "good": ("Succeeded", None)}
    assert message_of(upper, "huge") == (
        "invalid task spec: timeout_seconds: a number of 4301 digits, at most 30")
    assert message_of(upper, "nan") == (
        "invalid task spec: sim.duration_seconds: NaN is not a number a spec may hold")
    assert message_of(upper, "twice").startswith("invalid task spec: spec: names image twice")
    assert message_of(upper, "latin1") == (
        "invalid task spec: env.NAME: is not UTF-8 text (bytes no character encodes)")


def test_task_submit_refuses_a_huge_number_without_a_traceback(tmp_path: Any) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(TASK_SPEC[:-1] + ', "timeout_seconds": ' + "7" * 4400 + "}")
    url = f"sqlite:///{tmp_path / 'f.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    result = CliRunner().invoke(main, ["--db", url, "task", "submit", "--name", "x",
                                       "--actor", "a", "--spec-file", str(spec)])
    assert "Traceback" not in result.output
    assert result.exit_code != 0


def test_an_error_nobody_foresaw_fails_that_row_alone(any_url: str, upper: UpperLayer,
                                                     clock: VirtualClock,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     warned: Warned) -> None:
    """Whatever judging one row raises fails that row, named and logged once."""
    from falcon_es.handlers import intake

    table(upper)
    put(upper, "cursed", when(clock), name="cursed")
    put(upper, "good", when(clock, 1))
    real = intake.parse_spec
    calls: list[str] = []

    def flaky(raw: Any, limits: Any) -> Any:
        calls.append("x")
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(raw, limits)

    monkeypatch.setattr(intake, "parse_spec", flaky)
    running = controller(any_url, clock)
    try:
        running.run()
    finally:
        running.close()
    assert statuses(upper) == {"cursed": ("Failed", "InvalidSpec"), "good": ("Succeeded", None)}
    assert message_of(upper, "cursed") == (
        "invalid task spec: spec: could not be read (RuntimeError: boom)")
    assert warned.messages == ["job row cursed failed at intake: spec: could not be read "
                      "(RuntimeError: boom)"]


# ----------------------------------------------------------------- ids are exact


def test_ids_told_apart_by_case_or_accents_are_tasks_of_their_own(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    table(upper)
    ids = ["Task-A", "task-a", "resume", "résumé"]
    for offset, task_id in enumerate(ids):
        put(upper, task_id, when(clock, offset))
    running = controller(any_url, clock)
    try:
        running.run()
        for task_id in ids:
            assert stream_types(running, task_id)[0] == "TaskAccepted", task_id
        assert verified(running) == []
    finally:
        running.close()
    assert statuses(upper) == {task_id: ("Succeeded", None) for task_id in ids}


def test_the_migration_makes_an_existing_log_exact(bare_db_url: str) -> None:
    """A log written before 0004 keeps its events; afterwards it holds ids that differ
    only by case as two streams."""
    engine = db.make_engine(bare_db_url)
    row = ("INSERT INTO task_events (seq, stream_id, version, type, schema_version, data, "
           "meta, recorded_at) VALUES ({seq}, '{id}', 1, 'RowRefused', 1, '{{}}', '{{}}', "
           "'2026-11-01 09:00:00')")
    try:
        db.upgrade(engine, "0003")
        with engine.begin() as conn:
            conn.exec_driver_sql(row.format(seq=1, id="Task-A"))
        db.upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(row.format(seq=2, id="task-a"))
            conn.exec_driver_sql(row.format(seq=3, id="résumé"))
            conn.exec_driver_sql(row.format(seq=4, id="resume"))
            found = conn.exec_driver_sql(
                "SELECT stream_id FROM task_events WHERE stream_id = 'task-a'").scalars().all()
            assert found == ["task-a"]
            if engine.dialect.name != "sqlite":
                collations = conn.exec_driver_sql(
                    "SELECT table_name, collation_name FROM information_schema.columns "
                    "WHERE table_schema = DATABASE() AND column_name = 'stream_id' "
                    "ORDER BY table_name").all()
                assert collations == [("live_streams", "utf8mb4_nopad_bin"),
                                      ("task_events", "utf8mb4_nopad_bin")]
        assert db.current_revision(engine) == "0006"
    finally:
        engine.dispose()


# ------------------------------------------------------------- values wider than the log


def test_an_actor_longer_than_the_log_keeps_fails_its_row_and_db_check_names_the_column(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    table(upper)
    put(upper, "wide", when(clock), actor="a" * 200)
    put(upper, "good", when(clock, 1), actor="b" * 128)
    running = controller(any_url, clock)
    try:
        running.run()
    finally:
        running.close()
    assert statuses(upper) == {"wide": ("Failed", "InvalidColumn"), "good": ("Succeeded", None)}
    assert message_of(upper, "wide") == (
        "unreadable job row: column actor: 200 characters, longer than the 128 Falcon-ES keeps")
    checked = CliRunner().invoke(main, ["--db", any_url, "db", "check"])
    assert ("note: job.actor is VARCHAR(300): actors longer than the 128 characters of "
            "Falcon-ES's last_served.actor are failed at intake (Reason InvalidColumn)"
            ) in checked.stdout


# ------------------------------------------------------------------------ reused ids


def test_an_id_reused_after_its_task_ended_is_refused_and_the_old_history_kept(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    table(upper)
    first = when(clock)
    put(upper, "r1", first)
    running = controller(any_url, clock)
    try:
        running.run()
        before = stream_types(running, "r1")
        upper.execute("DELETE FROM job WHERE id = %s", "r1")
        put(upper, "r1", when(clock))
        running.tick()
        assert status_of(upper, "r1") == ("Failed", "DuplicateId")
        assert stream_types(running, "r1") == before
        assert verified(running) == []
        # Set back to Pending as a "retry": refused again, never run.
        upper.execute("UPDATE job SET status = 'Pending', reason = NULL WHERE id = %s", "r1")
        running.tick()
        assert status_of(upper, "r1") == ("Failed", "DuplicateId")
        assert stream_types(running, "r1") == before
    finally:
        running.close()
    assert message_of(upper, "r1") == (
        f"job row not taken in: id: already used by the submission at {first[:19]} UTC; "
        "that task has ended. Nothing of this row was run: a task id names one submission "
        "for good, so submit again under a new id")


def test_an_id_reused_while_its_task_runs_is_refused_and_the_task_runs_on(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    table(upper)
    put(upper, "r2", when(clock), spec=LONG_TASK)
    running = controller(any_url, clock)
    try:
        running.run(lambda: status_of(upper, "r2")[0] == "Running")
        upper.execute("DELETE FROM job WHERE id = %s", "r2")
        put(upper, "r2", when(clock))
        running.tick()
        assert status_of(upper, "r2") == ("Failed", "DuplicateId")
        assert "that task is Running" in message_of(upper, "r2")
        assert findings(running, "r2") == ["replaced"]
        assert diverged(running, "replaced") == 1
        running.run(lambda: running.app.tasks.get("r2") is None
                    or running.app.tasks.get("r2").is_terminal)
        assert stream_types(running, "r2")[-1] != "TaskRejected"
        # The old task ended Succeeded in the log; the row stays the refused one's.
        assert status_of(upper, "r2") == ("Failed", "DuplicateId")
        assert verified(running) == []
    finally:
        running.close()


def test_a_reused_row_the_old_task_already_wrote_over_is_found_by_the_row_check(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """The old task's write reached the new row before intake read it: the row check
    tells the two submissions apart by created_at."""
    table(upper)
    put(upper, "r3", when(clock), spec=LONG_TASK)
    running = controller(any_url, clock)
    try:
        running.run(lambda: status_of(upper, "r3")[0] == "Running")
        upper.execute("UPDATE job SET created_at = %s WHERE id = %s", when(clock, 5), "r3")
        clock.advance(ROW_CHECK_SECONDS)
        running.tick()
        assert status_of(upper, "r3") == ("Failed", "DuplicateId")
        assert findings(running, "r3") == ["replaced"]
    finally:
        running.close()


# ------------------------------------------------------------------------ starvation


def test_a_new_row_is_taken_in_at_the_next_tick_behind_100000_known_rows(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """100,000 rows set back to Pending whose ids the log knows (their tasks ended
    long ago, here written straight into the log) do not hide a new submission."""
    table(upper)
    count = int(os.environ.get("FALCON_TEST_KNOWN_ROWS", "100000"))
    old = (clock.now() - dt.timedelta(days=30)).strftime("%Y-%m-%d %H:%M:%S.%f")
    ids = [f"old-{n:06d}" for n in range(count)]
    cursor = upper.connection.cursor()
    mark = "%s" if upper.mysql else "?"
    rejected = json.dumps(ev.TaskRejected("old", "user-a", "InvalidSpec", "spec", "x").to_data())
    meta = json.dumps({"actor": "upper-layer"})
    cursor.execute("BEGIN")  # one transaction (and multi-row INSERTs on PyMySQL): seconds
    cursor.executemany(
        f"INSERT INTO job (id, name, actor, spec, created_at) VALUES ({', '.join([mark] * 5)})",
        [(i, "old", "user-a", TASK_SPEC, old) for i in ids])
    cursor.executemany(
        "INSERT INTO task_events (seq, stream_id, version, type, schema_version, data, meta, "
        f"recorded_at) VALUES ({', '.join([mark] * 8)})",
        [(n + 1, i, 1, "TaskRejected", 1, rejected, meta, old) for n, i in enumerate(ids)])
    cursor.execute(f"UPDATE log_head SET last_seq = {mark} WHERE id = 1", (count,))
    cursor.execute("COMMIT")
    cursor.close()
    running = controller(any_url, clock)
    try:
        put(upper, "fresh", when(clock))
        running.tick()
        assert stream_types(running, "fresh")[0] == "TaskAccepted"
        assert status_of(upper, "fresh") == ("Pending", "Provisioning")
        assert status_of(upper, "old-000000") == ("Failed", "DuplicateId")
    finally:
        running.close()


# ------------------------------------------------------------- the table converges


def test_a_row_set_back_forged_or_rewritten_is_put_right_and_logged_once(
        any_url: str, upper: UpperLayer, clock: VirtualClock,
        warned: Warned) -> None:
    table(upper)
    put(upper, "t1", when(clock), spec=LONG_TASK)
    running = controller(any_url, clock)
    try:
        running.run(lambda: status_of(upper, "t1")[0] == "Running")
        # Set back to new: read as new at the next tick, written again at once.
        upper.execute("UPDATE job SET status = 'Pending', reason = NULL WHERE id = %s", "t1")
        running.tick()
        assert status_of(upper, "t1") == ("Running", None)
        # Forged: put right within ROW_CHECK_SECONDS (and a tick per 500 tasks).
        upper.execute("UPDATE job SET status = 'Succeeded' WHERE id = %s", "t1")
        clock.advance(ROW_CHECK_SECONDS)
        running.tick()
        assert status_of(upper, "t1") == ("Running", None)
        for _ in range(3):
            clock.advance(ROW_CHECK_SECONDS)
            running.tick()
    finally:
        running.close()
    assert warned.messages == [
        "job row t1 found Pending with no Reason (set back to new); the log says Running: "
        "written again from the log",
        "job row t1 found Succeeded; the log says Running: written again from the log",
    ]


def test_rows_of_ended_tasks_out_of_memory_are_put_right_within_a_pass(
        any_url: str, upper: UpperLayer, clock: VirtualClock, warned: Warned) -> None:
    """A task that ended and left memory is no longer in the row check of the tasks
    in memory: the pass over the whole table finds its forged row, puts it right from
    the log, and the task leaves memory again with that commit."""
    table(upper)
    put(upper, "e1", when(clock))
    put(upper, "e2", when(clock, 1))
    running = controller(any_url, clock)
    try:
        running.run(lambda: all(status_of(upper, t)[0] == "Succeeded"
                                and running.app.tasks.get(t) is None for t in ("e1", "e2")))
        ended = {t: status_of(upper, t) for t in ("e1", "e2")}
        assert ended == {"e1": ("Succeeded", None), "e2": ("Succeeded", None)}
        upper.execute("UPDATE job SET status = 'Failed', reason = 'Forged' WHERE id = %s", "e1")
        upper.execute("UPDATE job SET status = 'Running', reason = NULL WHERE id = %s", "e2")
        clock.advance(ENDED_ROW_CHECK_SECONDS)
        running.tick()
        assert {t: status_of(upper, t) for t in ("e1", "e2")} == ended
        assert findings(running, "e1") == ["rewritten"] and findings(running, "e2") == ["rewritten"]
        assert running.app.tasks.get("e1") is None and running.app.tasks.get("e2") is None
        for _ in range(2):  # a pass a day: nothing more is found, nothing written
            clock.advance(ENDED_ROW_CHECK_SECONDS)
            running.tick()
        assert findings(running, "e1") == ["rewritten"]
        assert verified(running) == []
    finally:
        running.close()
    assert warned.messages == [
        "job row e1 found Failed/Forged; the log says Succeeded: written again from the log",
        "job row e2 found Running; the log says Succeeded: written again from the log",
    ]


def test_a_pass_over_ended_rows_reads_the_table_a_page_a_tick(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """A pass reads ``page`` rows a tick in id order, skips new rows and abort
    requests, and starts again only when the next pass is due."""
    from falcon_es.jobtable.ended_rows import EndedRowPages
    from falcon_es.storage.tables import JobTable
    table(upper)
    for n in range(5):
        put(upper, f"p{n}", when(clock))
    upper.execute("UPDATE job SET status = 'Succeeded' WHERE id <> %s", "p2")
    upper.execute("UPDATE job SET status = 'Aborting' WHERE id = %s", "p4")
    engine = db.make_engine(any_url)
    try:
        pages = EndedRowPages(engine, JobTable(), clock, page=2)
        assert [[r.id for r in pages.next_page()] for _ in range(3)] == [["p0", "p1"], ["p3"], []]
        clock.advance(ENDED_ROW_CHECK_SECONDS)
        assert [r.id for r in pages.next_page()] == ["p0", "p1"]
    finally:
        engine.dispose()


def test_a_row_deleted_while_its_task_runs_is_logged_counted_and_explained(
        any_url: str, upper: UpperLayer, clock: VirtualClock,
        warned: Warned) -> None:
    table(upper)
    put(upper, "gone", when(clock), spec=LONG_TASK)
    running = controller(any_url, clock)
    try:
        running.run(lambda: status_of(upper, "gone")[0] == "Running")
        upper.execute("DELETE FROM job WHERE id = %s", "gone")
        for _ in range(4):
            clock.advance(ROW_CHECK_SECONDS)
            running.tick()
        assert diverged(running, "deleted") == 1
        tree = "\n".join(render(explain("gone", running.app.store.read_stream("gone"), None, None,
                                        running.app.store.read_stream(ev.ROW_CHECKS_STREAM))))
        assert "job row deleted: its job row was deleted while the task is Running; it runs on" in tree
        running.restart()
        for _ in range(2):
            clock.advance(ROW_CHECK_SECONDS)
            running.tick()
        assert findings(running, "gone") == ["deleted"]
    finally:
        running.close()
    assert warned.messages == ["task gone: its job row was deleted while the task is Running; it runs "
                      "on (falcon-es task abort stops it)"]


def test_a_spec_changed_after_acceptance_is_logged_once_and_task_show_says_the_accepted_runs(
        any_url: str, upper: UpperLayer, clock: VirtualClock,
        warned: Warned) -> None:
    table(upper)
    put(upper, "sw", when(clock), spec=LONG_TASK)
    running = controller(any_url, clock)
    try:
        running.run(lambda: status_of(upper, "sw")[0] == "Running")
        changed = json.dumps({**json.loads(LONG_TASK), "image": "evil.example/miner:1"})
        upper.execute("UPDATE job SET spec = %s WHERE id = %s", changed, "sw")
        for _ in range(3):
            clock.advance(ROW_CHECK_SECONDS)
            running.tick()
        accepted = running.app.store.read_stream("sw")[0].event
        assert accepted.spec["image"] == json.loads(LONG_TASK)["image"]
        assert diverged(running, "spec-changed") == 1
    finally:
        running.close()
    assert warned.messages == ["task sw: the row's spec was changed after acceptance; the accepted "
                      "spec runs"]
    shown = CliRunner().invoke(main, ["--db", any_url, "task", "show", "sw"])
    assert shown.exit_code == 0, shown.output
    assert "the row's spec was changed after acceptance; the accepted spec runs" in shown.stdout


# ------------------------------------------------------------------------ Messages


def test_a_message_longer_than_the_column_is_cut_at_a_character_with_a_mark(
        any_url: str, upper: UpperLayer) -> None:
    table(upper)
    long_text = "é" * 40_000  # 80,000 bytes
    cut = fit_message(long_text)
    assert cut is not None and cut.endswith(CUT_MARK)
    assert len(cut.encode()) <= MESSAGE_BYTES
    assert set(cut[: -len(CUT_MARK)]) == {"é"}
    assert fit_message("short") == "short"
    upper.execute("INSERT INTO job (id, name, actor, created_at, message) VALUES "
                  "('m', 'm', 'a', '2026-11-01 09:00:00', %s)", cut)
    assert message_of(upper, "m") == cut


def test_a_narrow_message_column_gets_messages_cut_to_its_width(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """An upper layer whose ``message`` is a VARCHAR(60): on MariaDB, where the width
    holds, every Message written fits it (cut ones end with the mark) and the task
    runs to its end; ``db check`` says so. SQLite keeps any length."""
    table(upper, message="VARCHAR(60)")
    put(upper, "narrow", when(clock))
    running = controller(any_url, clock)
    seen: set[str] = set()
    try:
        room = running.app.job.message_room
        assert room == (MessageRoom(chars=60, octets=240) if upper.mysql else MessageRoom())
        running.run(lambda: seen.add(message_of(upper, "narrow"))
                    or status_of(upper, "narrow")[0] == "Succeeded")
    finally:
        running.close()
    if upper.mysql:
        assert seen and all(len(m) <= 60 for m in seen)
        assert any(m.endswith(CUT_MARK) for m in seen)
        assert fit_message("x" * 100, room) == "x" * (60 - len(CUT_MARK)) + CUT_MARK
        checked = CliRunner().invoke(main, ["--db", any_url, "db", "check"])
        assert "job.message holds 60 characters: longer Messages are cut to fit" in checked.output
    else:
        assert any(len(m) > 60 for m in seen)


def test_engine_sees_binary_ids(any_url: str) -> None:
    """The log's stream_id, as the migrations leave it, keeps case apart."""
    engine = sa.create_engine(any_url)
    try:
        with engine.begin() as conn:
            for seq, stream in enumerate(("Ab", "ab"), start=1):
                conn.exec_driver_sql(
                    "INSERT INTO task_events (seq, stream_id, version, type, schema_version, "
                    f"data, meta, recorded_at) VALUES ({seq}, '{stream}', 1, 'X', 1, '{{}}', "
                    "'{}', '2026-11-01 09:00:00')")
    finally:
        engine.dispose()


# ------------------------------------------------------------------ property-based

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GOOD_SPEC = json.loads(TASK_SPEC)
#: The upper layer's table for raw rows: ids longer than the log's, compared as bytes,
#: names and actors wider than Falcon-ES keeps, a spec column that takes any text.
RAW_TYPES = {"mysql": {"id": "VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                       "name": "VARCHAR(300)", "actor": "VARCHAR(300)", "spec": "LONGTEXT"},
             "sqlite": {"id": "VARCHAR(100)", "name": "VARCHAR(300)", "actor": "VARCHAR(300)",
                        "spec": "TEXT"}}
odd_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), odd_text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(odd_text, inner, max_size=3)), max_leaves=8)


def _huge(field: str, digits: int) -> str:
    return json.dumps({**GOOD_SPEC, field: 0}).replace('"' + field + '": 0',
                                                         f'"{field}": {"9" * digits}')


raw_specs = st.one_of(
    st.just(TASK_SPEC),
    values.map(json.dumps),
    st.tuples(st.sampled_from(sorted(GOOD_SPEC)), values).map(
        lambda kv: json.dumps({**GOOD_SPEC, kv[0]: kv[1]})),
    st.builds(_huge, st.sampled_from(["timeout_seconds", "priority", "slices", "x"]),
              st.integers(31, 5000)),
    st.sampled_from(['{"image": 1, "image": 2}', TASK_SPEC[:-1] + ', "tpu_type": "v5e"}',
                     '{"sim": {"duration_seconds": NaN}}', '[Infinity]', "-Infinity"]),
    st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
    odd_text,
)
raw_rows = st.lists(st.tuples(
    st.one_of(st.text("aAéÉ-_09", min_size=1, max_size=8), odd_text.filter(bool),
              st.text("x", min_size=60, max_size=80)),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=300),
    st.one_of(odd_text, odd_text, st.text("a", min_size=120, max_size=200)),
    raw_specs,
), min_size=1, max_size=5, unique_by=lambda r: r[0])


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(rows=raw_rows)
def test_raw_rows_never_stop_the_controller(any_url: str, upper: UpperLayer,
                                            clock: VirtualClock, one: dict[str, Controller],
                                            rows: list[tuple[str, str, str, str]]) -> None:
    """Arbitrary raw rows beside a good one, written by the upper layer's own driver:
    the controller keeps ticking, the good row succeeds, every raw row the database
    stored gets a Reason (or is taken in and moves on). One controller serves every
    example (hypothesis reuses the fixtures)."""
    if "running" not in one:
        create_table(upper, **RAW_TYPES[kind(upper)])
        one["running"] = controller(any_url, clock)
    running = one["running"]
    example = len(statuses(upper))
    stored = []
    for task_id, name, actor, spec in rows:
        row_id = f"e{example}-{task_id}"
        try:
            put(upper, row_id, when(clock), spec=spec, actor=actor, name=name)
        except Exception:  # noqa: BLE001 - the database refused it: no upper layer wrote it
            continue
        stored.append(row_id)
    good = f"e{example}-good"
    put(upper, good, when(clock, 1))
    running.run(lambda: status_of(upper, good) == ("Succeeded", None), max_steps=400)
    running.tick()
    now = statuses(upper)
    for row_id in stored:
        assert now[row_id] != ("Pending", None), row_id
        if now[row_id][0] == "Failed":
            assert now[row_id][1], row_id


@pytest.fixture
def one() -> Iterator[dict[str, Controller]]:
    """Where the property test keeps its controller, closed after the last example."""
    holder: dict[str, Controller] = {}
    yield holder
    if "running" in holder:
        holder["running"].close()


def test_a_row_whose_writes_the_database_refuses_is_refused_alone(
        any_url: str, upper: UpperLayer, clock: VirtualClock) -> None:
    """The upper layer's own CHECK refuses what taking one row in writes (any Reason
    but the refusal's): the append is retried without it, and the row is refused UnstorableRow
    while the row beside it runs."""
    check = "CHECK (name <> 'cursed' OR reason IS NULL OR reason = 'UnstorableRow')"
    upper.execute(
        "CREATE TABLE job (id VARCHAR(64) NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, "
        "actor VARCHAR(300) NOT NULL, spec TEXT, status VARCHAR(32) NOT NULL DEFAULT 'Pending', "
        "reason VARCHAR(64), message TEXT, created_at DATETIME(6) NOT NULL, "
        "updated_at DATETIME(6), aborting_at DATETIME(6), aborted_at DATETIME(6), "
        "cluster_id VARCHAR(36), node_pool_name VARCHAR(64), job_uid VARCHAR(64), "
        f"dispatched_at DATETIME(6), finished_at DATETIME(6), {check})")
    put(upper, "cursed", when(clock), name="cursed")
    put(upper, "good", when(clock, 1))
    running = controller(any_url, clock)
    try:
        running.run()
        assert stream_types(running, "cursed") == []
    finally:
        running.close()
    assert statuses(upper) == {"cursed": ("Failed", "UnstorableRow"), "good": ("Succeeded", None)}
    assert message_of(upper, "cursed").startswith(
        "job row not taken in: row: the database refused what taking it in writes (")


def test_task_show_reads_the_stream_the_row_check_writes() -> None:
    from falcon_es.jobtable import job_reads

    assert job_reads.ROW_CHECKS_STREAM == ev.ROW_CHECKS_STREAM
