"""Intake: new ``job`` rows enter the log (accepted or rejected); abort requests and
priority change requests the upper layer wrote are folded into the log."""

from __future__ import annotations

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.runtime import Tick
from falcon_es.domain.priority_requests import (
    PriorityChange, PriorityRefused, judge_priority_request,
)
from falcon_es.domain.spec import INVALID_ID, SpecError, parse_spec

INTAKE_BATCH = 5000


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
        actor = f"upper-layer:{row.actor}"
        try:
            spec = parse_spec(row.spec_raw, ctx.spec_limits)
        except SpecError as error:
            tick.emit(row.id, ev.TaskRejected(row.name, row.actor, error.reason, error.field,
                                              error.detail), actor=actor)
            continue
        tick.emit(row.id, ev.TaskAccepted(
            name=row.name, actor=row.actor, spec=spec.to_data(), tpu_type=spec.tpu_type,
            topology=spec.topology, submitted_at=row.created_at,
        ), actor=actor)


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
