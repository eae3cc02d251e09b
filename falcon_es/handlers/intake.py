"""Intake: new ``job`` rows enter the log (accepted or rejected); abort requests and
priority change requests the upper layer wrote are folded into the log."""

from __future__ import annotations

import datetime as dt
import logging

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.runtime import Tick
from falcon_es.domain.priority_requests import (
    PriorityChange, PriorityRefused, judge_priority_request,
)
from falcon_es.jobtable.inbox import NewRow, SeenRow
from falcon_es.domain.spec import (
    DUPLICATE_ID, INVALID_ID, UNSTORABLE_ROW, SpecError, TaskSpec, parse_spec,
)
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_records import NO_SPEC

log = logging.getLogger("falcon_es.intake")

INTAKE_BATCH = 5000


def _short(text: str, limit: int = 200) -> str:
    """Bound what an unexpected error can put into a Message."""
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def accept_new_rows(tick: Tick, ctx: HandlerContext) -> None:
    """Validate each new row's spec; a bad spec fails that task alone, and so does a
    row with a column Falcon-ES cannot read. A row whose id cannot name a stream is
    refused in a stream of refusals (the row is failed all the same). A row whose stream
    the log holds already is never taken in twice, also when that task has left memory
    (it ended and holds nothing): the log is asked about the rows memory does not know,
    which are the new ones; each such row is judged (``judge_known_row``) and written,
    so it stops looking new and never hides the rows behind it."""
    bad_rows = ctx.inbox.bad_rows()
    rows = ctx.inbox.new_rows(limit=INTAKE_BATCH)
    unknown = [row.id for row in rows if tick.state(row.id) is None]
    unknown += [bad.id for bad in bad_rows
                if bad.problem.reason != INVALID_ID and tick.state(bad.id) is None]
    in_log = ctx.retired.started(unknown) if unknown else {}
    for bad in bad_rows:
        problem = bad.problem
        if problem.reason == INVALID_ID:
            tick.emit(ev.REFUSED_ROWS_STREAM, ev.RowRefused(
                bad.id, problem.reason, problem.column, problem.detail), actor="upper-layer")
        elif bad.id in ctx.unstorable:
            refuse_unstorable(tick, bad.id, ctx.unstorable[bad.id])
        elif bad.id in ctx.unwritable:
            continue  # neither it nor its refusal can be written (logged by the controller)
        elif tick.state(bad.id) is None and bad.id not in in_log:
            tick.emit(bad.id, ev.TaskRejected(bad.name, bad.actor, problem.reason,
                                              problem.column, problem.detail),
                      actor=f"upper-layer:{bad.actor}")
    for row in rows:
        if tick.state(row.id) is not None or row.id in in_log:
            judge_known_row(tick, ctx, row, in_log.get(row.id))
        elif row.id in ctx.unstorable:
            refuse_unstorable(tick, row.id, ctx.unstorable[row.id])
        elif row.id in ctx.unwritable:
            continue  # neither it nor its refusal can be written (logged by the controller)
        else:
            take_in(tick, ctx, row)


def refuse_unstorable(tick: Tick, row_id: str, said: str) -> None:
    """A row whose first append (and the writes it led to) the database refused
    last tick: refused as a whole (``UnstorableRow``, in the refusals' stream, which
    holds nothing of the row but its id), so no other row waits on it."""
    detail = f"the database refused what taking it in writes ({said})"
    log.warning("job row %s refused (UnstorableRow): %s", row_id, detail,
                extra={"task_id": row_id})
    tick.emit(ev.REFUSED_ROWS_STREAM, ev.RowRefused(row_id, UNSTORABLE_ROW, "row", detail),
              actor="upper-layer")


def judge_known_row(tick: Tick, ctx: HandlerContext, row: NewRow,
                    started: dt.datetime | None) -> None:
    """A row that looks new (Pending, no Reason) under an id the log knows. Its task
    still running and the same created_at: the upper layer set the row back, and it is
    written again from the log. Otherwise the id names another submission (the old
    task ended, or the row was created anew): the row is failed ``DuplicateId`` with
    when the id was used before, and the old task's history is left as it is (a task
    still running goes on without its row: ``falcon-es task abort`` stops it)."""
    state = tick.state(row.id)
    if state is not None and not state.is_terminal and state.submission.submitted_at == row.created_at:
        shown = f"{state.status}/{state.reason}" if state.reason else state.status
        detail = f"found Pending with no Reason (set back to new); the log says {shown}"
        log.warning("job row %s %s: written again from the log", row.id, detail,
                    extra={"task_id": row.id})
        tick.emit(ev.ROW_CHECKS_STREAM, ev.JobRowDiverged(row.id, ev.ROW_REWRITTEN, detail))
        return
    refuse_duplicate(tick, ctx, row.id, row.actor, state, started)


def refuse_duplicate(tick: Tick, ctx: HandlerContext, row_id: str, actor: str,
                     state: TaskState | None, started: dt.datetime | None) -> None:
    """Fail a row whose id names an earlier submission (Reason ``DuplicateId``), logged
    once (the row is failed, so it is judged again only if the upper layer sets it
    back); a task still running is recorded as having lost its row."""
    used = (state.submission.submitted_at if state is not None and state.submission.submitted_at
            else started)
    when = f" at {used:%Y-%m-%d %H:%M:%S} UTC" if used is not None else ""
    fate = (f"; that task is {state.status}" if state is not None
            else "; that task has ended")
    detail = (f"already used by the submission{when}{fate}. Nothing of this row was run: "
              "a task id names one submission for good, so submit again under a new id")
    log.warning("job row %s refused (DuplicateId): %s", row_id, detail,
                extra={"task_id": row_id})
    tick.emit(ev.REFUSED_ROWS_STREAM, ev.RowRefused(row_id, DUPLICATE_ID, "id", detail),
              actor=f"upper-layer:{actor}")
    if state is not None and not state.is_terminal and \
            ctx.inbox.first_finding(row_id, ev.ROW_REPLACED):
        tick.emit(ev.ROW_CHECKS_STREAM, ev.JobRowDiverged(
            row_id, ev.ROW_REPLACED, f"its row now holds another submission; the task "
                                     f"runs on ({state.status}) without a row"))


def take_in(tick: Tick, ctx: HandlerContext, row: NewRow) -> None:
    """One new row into the log, accepted or rejected. Whatever goes wrong while
    judging it (a decoder or validator raising something it was never meant to) fails
    this row alone: its Reason and a Message naming what raised, logged once (the row
    is failed, so it is never read as new again)."""
    actor = f"upper-layer:{row.actor}"
    try:
        spec = parse_spec(row.spec_raw, ctx.spec_limits)
        accepted = ev.TaskAccepted(
            name=row.name, actor=row.actor, spec=spec.to_data(), tpu_type=spec.tpu_type,
            topology=spec.topology, submitted_at=row.created_at,
        )
    except SpecError as error:
        tick.emit(row.id, ev.TaskRejected(row.name, row.actor, error.reason, error.field,
                                          error.detail), actor=actor)
        return
    except Exception as error:  # noqa: BLE001 - one row's trouble stays that row's
        detail = f"could not be read ({type(error).__name__}: {_short(str(error))})"
        log.warning("job row %s failed at intake: spec: %s", row.id, detail,
                    extra={"task_id": row.id})
        tick.emit(row.id, ev.TaskRejected(row.name, row.actor, "InvalidSpec", "spec", detail),
                  actor=actor)
        return
    tick.emit(row.id, accepted, actor=actor)


def notice_abort_requests(tick: Tick, ctx: HandlerContext) -> None:
    """Rows the upper layer set to ``Aborting`` that the log has not folded yet. A row
    of a task that left memory (it ended and holds nothing) brings it back for this
    tick, so the abort is ignored on its real state and version."""
    rows = ctx.inbox.abort_rows()
    unknown = [row.id for row in rows if tick.state(row.id) is None]
    if unknown:
        ctx.retired.recall(unknown)
    for row in rows:
        state = tick.state(row.id)
        if state is not None and state.status in (chart.ABORTING,):
            continue
        if state is not None and state.is_terminal:
            tick.emit(row.id, ev.AbortIgnored(state.status), actor="upper-layer")
            continue
        phase = "New" if state is None or state.status == chart.NEW else (
            f"{state.status}/{state.reason}" if state.reason else state.status)
        tick.emit(row.id, ev.AbortRequested(row.aborting_at, phase), actor="upper-layer")


def notice_priority_requests(tick: Tick, ctx: HandlerContext) -> None:
    """Priority requests from the job table's optional priority columns (written by
    the upper layer or ``falcon-es task set-priority``): a waiting task's base priority
    changes (PriorityChanged, with who asked); any other request is refused and logged
    once with why. Runs before the scheduling handlers, which bring the queue book up
    to date with it, so the same tick's picks and positions already follow it. A
    request of a task that left memory (it ended) brings it back for this tick, so a
    request applied before it ended is told from one that came too late."""
    rows = ctx.inbox.priority_rows()
    unknown = [row.id for row in rows if tick.state(row.id) is None]
    if unknown:
        ctx.retired.recall(unknown)
    for row in rows:
        verdict = judge_priority_request(row.id, tick.state(row.id), row.priority,
                                         ctx.settings.scheduling.priorities)
        if isinstance(verdict, PriorityChange):
            tick.emit(row.id, ev.PriorityChanged(verdict.old, verdict.new, row.requested_by,
                                                 row.requested_at),
                      actor=f"upper-layer:{row.requested_by}")
        elif isinstance(verdict, PriorityRefused):
            ctx.inbox.priority_refused(row, verdict.why)


def check_job_rows(tick: Tick, ctx: HandlerContext) -> None:
    """Compare the job rows of the tasks in memory with the log, a page a tick, a pass
    every ``ROW_CHECK_SECONDS``, five minutes (``falcon_es.jobtable.inbox``). What the upper layer did to a
    row is recorded in the log (``JobRowDiverged``) and logged: a Status or Reason that
    differs (set back, forged, rewritten) is written again from the log at once; a row
    deleted while its task runs, or re-created as another submission (a reused id:
    failed ``DuplicateId``), and a spec changed after acceptance are recorded once (the
    task runs on, with the spec it was accepted with)."""
    page = ctx.inbox.rows_to_check(lambda: [s.task_id for s in ctx.tasks.all()])
    if not page:
        return
    seen = ctx.inbox.rows_of(page)
    for task_id in page:
        state = tick.state(task_id)
        if state is not None and state.status != chart.NEW:
            check_row(tick, ctx, state, seen.get(task_id))


def check_ended_rows(tick: Tick, ctx: HandlerContext) -> None:
    """The rows of tasks that left memory, a page a tick in a pass over the whole
    table every day (``falcon_es.jobtable.ended_rows``). Each such task is folded
    apart from the log and compared; only one whose row differs is brought back
    (``recall``) for the tick that records the finding and writes its row again."""
    page = [row for row in ctx.inbox.ended_rows_to_check() if tick.state(row.id) is None]
    if not page:
        return
    final = ctx.retired.final_states([row.id for row in page])
    wrong = [row for row in page if (state := final.get(row.id)) is not None
             and (row.status, row.reason) != (state.status, state.reason)]
    if not wrong:
        return
    ctx.retired.recall([row.id for row in wrong])
    for row in wrong:
        state = tick.state(row.id)
        if state is not None:
            check_row(tick, ctx, state, row)


def check_row(tick: Tick, ctx: HandlerContext, state: TaskState, row: SeenRow | None) -> None:
    """One task's row against its state (see ``check_job_rows``)."""
    task_id = state.task_id
    if row is None:
        if not state.is_terminal and ctx.inbox.first_finding(task_id, ev.ROW_DELETED):
            detail = f"its job row was deleted while the task is {state.status}; it runs on"
            log.warning("task %s: %s (falcon-es task abort stops it)", task_id, detail,
                        extra={"task_id": task_id})
            tick.emit(ev.ROW_CHECKS_STREAM, ev.JobRowDiverged(task_id, ev.ROW_DELETED, detail))
        return
    if row.reason == DUPLICATE_ID or row.status == chart.ABORTING or \
            (row.status == chart.PENDING and row.reason is None):
        return  # another submission's, judged already; an abort request; or new (intake's)
    if row.created_at is not None and state.submission.submitted_at is not None \
            and row.created_at != state.submission.submitted_at:
        refuse_duplicate(tick, ctx, task_id, state.submission.actor, state, None)
        return
    expected = (chart.PENDING if state.status == chart.NEW else state.status, state.reason)
    if (row.status, row.reason) != expected:
        detail = (f"found {_shown(row.status, row.reason)}; the log says "
                  f"{_shown(*expected)}")
        log.warning("job row %s %s: written again from the log", task_id, detail,
                    extra={"task_id": task_id})
        tick.emit(ev.ROW_CHECKS_STREAM, ev.JobRowDiverged(task_id, ev.ROW_REWRITTEN, detail))
    if state.submission.spec is not NO_SPEC and not state.is_terminal and \
            spec_changed(task_id, row.spec_raw, state.submission.spec, ctx) and \
            ctx.inbox.first_finding(task_id, ev.SPEC_CHANGED):
        detail = "the row's spec was changed after acceptance; the accepted spec runs"
        log.warning("task %s: %s", task_id, detail, extra={"task_id": task_id})
        tick.emit(ev.ROW_CHECKS_STREAM, ev.JobRowDiverged(task_id, ev.SPEC_CHANGED, detail))


def spec_changed(task_id: str, raw: object, accepted: TaskSpec,
                 ctx: HandlerContext) -> bool:
    """Whether the row's spec now reads as another spec than the one accepted (one
    that no longer parses is another); text read as the accepted spec before is not
    parsed again."""
    if ctx.inbox.spec_unchanged(task_id, raw):
        return False
    try:
        changed = parse_spec(raw, ctx.spec_limits).to_data() != accepted.to_data()
    except Exception:  # noqa: BLE001 - any unreadable spec differs from the accepted one
        return True
    if not changed:
        ctx.inbox.spec_seen(task_id, raw)
    return changed


def _shown(status: object, reason: object) -> str:
    return f"{status}/{reason}" if reason else str(status)
