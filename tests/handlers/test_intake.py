"""The intake handlers: ``accept_new_rows`` turns each new ``job`` row into
TaskAccepted or TaskRejected; ``notice_abort_requests`` folds the rows the upper layer
set to Aborting into the log. Both read the job table, so they run on both dialects."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from falcon_es.domain import events as ev
from falcon_es.handlers import intake
from tests.support.bench import HandlerBenches, reserved_cluster

SPEC = MappingProxyType(
    {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "4x4"})


def test_a_valid_row_is_accepted_with_its_parsed_spec(make_bench: HandlerBenches) -> None:
    """The spec is stored as parsed, defaults filled in (the timeout from the
    settings), so every later decision reads the same spec."""
    bench = make_bench(intake.accept_new_rows, default_timeout_seconds=3600)
    submitted_at = bench.clock.now()
    bench.submit("t1", SPEC, actor="user-a")

    ((task, accepted),) = bench.run()

    assert task == "t1" and isinstance(accepted, ev.TaskAccepted)
    assert (accepted.name, accepted.actor, accepted.tpu_type, accepted.topology,
            accepted.submitted_at) == ("t1", "user-a", "v6e", "4x4", submitted_at)
    assert accepted.spec["image"] == SPEC["image"]
    assert (accepted.spec["timeout_seconds"], accepted.spec["supply_mode"]) == (3600, None)
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == ("Pending", "Waiting")
    assert bench.run() == []  # the row is no longer new


@pytest.mark.parametrize(("changes", "reason", "field"), [
    ({"privileged": True}, "ForbiddenField", "privileged"),
    ({"tpu_type": None}, "MissingField", "tpu_type"),
    ({"timeout_seconds": 8 * 24 * 3600}, "InvalidField", "timeout_seconds"),
])
def test_a_bad_spec_rejects_that_task_alone_naming_the_field(
        make_bench: HandlerBenches, changes: dict[str, Any], reason: str, field: str) -> None:
    bench = make_bench(intake.accept_new_rows)
    bench.submit("bad", {k: v for k, v in {**SPEC, **changes}.items() if v is not None})
    bench.advance(1)
    bench.submit("good", SPEC)

    emitted = bench.run()

    assert [(task, type(e)) for task, e in emitted] == [
        ("bad", ev.TaskRejected), ("good", ev.TaskAccepted)]
    rejected = emitted[0][1]
    assert isinstance(rejected, ev.TaskRejected)
    assert (rejected.name, rejected.actor, rejected.reason, rejected.field) == (
        "bad", "user-a", reason, field)
    row = bench.row("bad")
    assert (row["status"], row["reason"]) == ("Failed", reason)
    assert row["message"].startswith(f"invalid task spec: {field}: ")


def test_a_row_whose_task_the_log_holds_already_is_not_accepted_again(
        make_bench: HandlerBenches) -> None:
    """The log, not the row, says whether a task entered: a row showing no Reason
    although the log holds its task (the table restored from an older backup, say)
    must not start the task a second time. The row is written again from the log
    instead (the table converges on the log)."""
    bench = make_bench(intake.accept_new_rows)
    bench.given("t1", ev.TaskAccepted("t1", "user-a", dict(SPEC), "v6e", "4x4",
                                      bench.clock.now()))
    bench.submit("t1", SPEC)  # the row, as it was before its task was accepted
    bench.submit("t2", SPEC)
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == ("Pending", None)

    emitted = bench.run()
    assert [(task, type(e)) for task, e in emitted] == [
        (ev.ROW_CHECKS_STREAM, ev.JobRowDiverged), ("t2", ev.TaskAccepted)]
    assert (emitted[0][1].task_id, emitted[0][1].found) == ("t1", ev.ROW_REWRITTEN)
    assert len(bench.log("t1")) == 1


def test_an_abort_is_folded_with_the_phase_it_found_the_task_in(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(intake.notice_abort_requests, reserved_cluster())
    bench.bring("queued", "waiting")
    bench.submit("unread", SPEC)  # not accepted yet
    aborting_at = bench.clock.now()
    bench.request_abort("queued")
    bench.request_abort("unread")

    assert sorted(bench.run(), key=lambda pair: pair[0]) == [
        ("queued", ev.AbortRequested(aborting_at, "Pending/Waiting")),
        ("unread", ev.AbortRequested(aborting_at, "New"))]
    assert bench.run() == []  # folded once


def test_an_abort_that_lost_the_race_with_the_end_is_ignored(make_bench: HandlerBenches) -> None:
    """The upper layer set Aborting while the row still said Running; the Job ended
    before the abort was folded: the task keeps its result and the row shows it."""
    bench = make_bench(intake.notice_abort_requests, reserved_cluster())
    bench.bring("t1", "running")
    bench.request_abort("t1")
    bench.given("t1", ev.JobSucceeded(1, 2))
    assert bench.row("t1")["status"] == "Aborting"

    assert bench.run() == [("t1", ev.AbortIgnored("Succeeded"))]
    row = bench.row("t1")
    assert (row["status"], row["message"]) == (
        "Succeeded", "succeeded (1 pod(s)); abort ignored: the task had already Succeeded")
