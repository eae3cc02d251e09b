"""Intake: new ``job`` rows enter the log (accepted or rejected); abort requests and
priority change requests the upper layer wrote are folded into the log."""

from __future__ import annotations

import logging

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.context import HandlerContext
from falcon_es.runtime import Tick
from falcon_es.scheduling import PriorityChange, PriorityRefused, judge_priority_request
from falcon_es.inbox import NewRow
from falcon_es.spec import INVALID_ID, SpecError, parse_spec

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
    which are the new ones."""
    bad_rows = ctx.inbox.bad_rows()
    rows = ctx.inbox.new_rows(limit=INTAKE_BATCH)
    unknown = [row.id for row in rows if tick.state(row.id) is None]
    unknown += [bad.id for bad in bad_rows
                if bad.problem.reason != INVALID_ID and tick.state(bad.id) is None]
    in_log = ctx.retired.known(unknown) if unknown else set()
    for bad in bad_rows:
        problem = bad.problem
        if problem.reason == INVALID_ID:
            tick.emit(ev.REFUSED_ROWS_STREAM, ev.RowRefused(
                bad.id, problem.reason, problem.column, problem.detail), actor="upper-layer")
        elif tick.state(bad.id) is None and bad.id not in in_log:
            tick.emit(bad.id, ev.TaskRejected(bad.name, bad.actor, problem.reason,
                                              problem.column, problem.detail),
                      actor=f"upper-layer:{bad.actor}")
    for row in rows:
        if tick.state(row.id) is not None or row.id in in_log:
            continue
        take_in(tick, ctx, row)


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
                                         ctx.settings.priorities)
        if isinstance(verdict, PriorityChange):
            tick.emit(row.id, ev.PriorityChanged(verdict.old, verdict.new, row.requested_by,
                                                 row.requested_at),
                      actor=f"upper-layer:{row.requested_by}")
        elif isinstance(verdict, PriorityRefused):
            ctx.inbox.priority_refused(row, verdict.why)
