"""Timeouts: deadlines computed from the folded state against the injectable clock.

- A dispatched task whose ``dispatched_at + timeout_seconds`` has passed fails with
  Failed/Timeout (TaskTimedOut) and its Job is deleted (JobDeleteRequested, carried out
  by the effect executor); the pool then goes through deprovisioning.
- A Job whose pods the Job controller has been refused creating (PodsRefused, not
  transient) for ``failed_create_grace_seconds`` fails the task with
  Failed/JobSubmitFailed in the refusal's words, and its Job is deleted; the pool then
  goes through deprovisioning. The grace counts from the first refusal of the run as
  the log recorded it, so a restarted controller keeps the same deadline.
- A pool that is not ready within the provisioning deadline of its supply mode
  (flex-start may queue for capacity much longer) fails the task with
  Failed/NodePoolTimeout (NodePoolTimedOut); the pool is deleted once its create has
  settled.

``next_due`` tells a loop running on virtual time when the next deadline or retry of
any task falls, so it can jump there when nothing else is left to do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.context import HandlerContext
from falcon_es.intents import RESERVATION_CHECK, PoolDisposition, PoolIntent
from falcon_es.retry import call_retry_due_at, retry_due_at
from falcon_es.runtime import Tick
from falcon_es.settings import Settings
from falcon_es.task import TaskState

_PENDING = chart.PENDING
DISPATCHING = f"{_PENDING}.{chart.PendingReason.DISPATCHING}"
DISPATCHED = frozenset({DISPATCHING, chart.RUNNING})
PROVISIONING = frozenset({f"{_PENDING}.{chart.PendingReason.PROVISIONING}",
                          f"{_PENDING}.{chart.PendingReason.WAITING_FOR_NODE}"})
#: Retried steps and the states in which their retry is pending.
RETRIES = (
    ("ReservationInsufficient", frozenset({f"{_PENDING}.{chart.PendingReason.CLUSTER_BUSY}"})),
    ("NodePoolNotVisible", PROVISIONING),
    ("NodesNotReady", PROVISIONING),
)


def job_deadline(state: TaskState) -> dt.datetime | None:
    if state.state not in DISPATCHED or state.dispatched_at is None:
        return None
    timeout = state.spec.get("timeout_seconds")
    if not isinstance(timeout, int) or timeout <= 0:
        return None
    return state.dispatched_at + dt.timedelta(seconds=timeout)


def refusal_deadline(state: TaskState, settings: Settings) -> dt.datetime | None:
    """When a run of pod-create refusals fails the task (None: no such run)."""
    if state.state != DISPATCHING or state.refused_since is None:
        return None
    return state.refused_since + dt.timedelta(seconds=settings.failed_create_grace_seconds)


def provisioning_deadline(state: TaskState, settings: Settings) -> dt.datetime | None:
    if (state.state not in PROVISIONING or state.pool_requested_at is None
            or state.pool_intent not in (PoolIntent.CREATE_REQUESTED,
                                         PoolIntent.CREATE_STARTED)):
        return None
    limit = (settings.flex_start_provisioning_timeout_seconds
             if state.supply_mode == "flex-start" else settings.provisioning_timeout_seconds)
    return state.pool_requested_at + dt.timedelta(seconds=limit)


def enforce_deadlines(tick: Tick, ctx: HandlerContext) -> None:
    for state in _deadline_candidates(tick, ctx):
        if state.is_terminal:
            continue
        deadline = job_deadline(state)
        if deadline is not None and ctx.now >= deadline:
            pending = (state.pending_diagnosis
                       if state.reason == chart.PendingReason.DISPATCHING else None)
            tick.emit(state.task_id, ev.TaskTimedOut(int(state.spec["timeout_seconds"]),
                                                     pending or ""))
            if state.job_name:
                tick.emit(state.task_id, ev.JobDeleteRequested(state.job_name, "timeout"))
            continue
        deadline = refusal_deadline(state, ctx.settings)
        if deadline is not None and ctx.now >= deadline and state.refused_since:
            refused = int((ctx.now - state.refused_since).total_seconds())
            job_name = state.job_name or ""
            tick.emit(state.task_id, ev.JobSubmitFailed(job_name, state.pending_diagnosis or "",
                                                        refused))
            if job_name:
                tick.emit(state.task_id, ev.JobDeleteRequested(job_name, "pods refused"))
            continue
        deadline = provisioning_deadline(state, ctx.settings)
        if deadline is not None and ctx.now >= deadline and state.pool_requested_at:
            waited = int((ctx.now - state.pool_requested_at).total_seconds())
            tick.emit(state.task_id, ev.NodePoolTimedOut(state.node_pool_name or "", waited))


def _deadline_candidates(tick: Tick, ctx: HandlerContext) -> list[TaskState]:
    """The tasks whose deadline may have passed: those the lifecycle index says are
    due by now (``wake_of`` is its wake moment) plus those this tick changed."""
    return tick.candidates(ctx.index.waking(ctx.now))


def wake_of(settings: Settings) -> Callable[[TaskState], dt.datetime | None]:
    """One task's next deadline or retry (``next_due`` of that task alone), for the
    executor's wake index: whatever the moment, no deadline comes before it."""
    return lambda state: next_due((state,), settings)


def next_due(states: Iterable[TaskState], settings: Settings) -> dt.datetime | None:
    """The earliest deadline or retry among these tasks (None when there is none)."""
    moments: list[dt.datetime] = []
    for state in states:
        if state.is_terminal:
            if state.pool_disposition == PoolDisposition.DELETE_FAILED:
                due = retry_due_at(state, "NodePoolDeleteFailed", settings)
                if due is not None:
                    moments.append(due)
            continue
        for deadline in (job_deadline(state), provisioning_deadline(state, settings),
                         refusal_deadline(state, settings)):
            if deadline is not None:
                moments.append(deadline)
        for kind, states_retrying in RETRIES:
            if state.state in states_retrying:
                due = retry_due_at(state, kind, settings)
                if due is not None:
                    moments.append(due)
        if state.api_retries and state.pool_intent is None:
            due = call_retry_due_at(state, RESERVATION_CHECK)
            if due is not None:
                moments.append(due)
    return min(moments) if moments else None
