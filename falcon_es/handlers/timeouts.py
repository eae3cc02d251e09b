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
  Failed/NodePoolTimeout (NodePoolTimedOut, led by what the wait showed last: the
  autoscaler's words, the node counts); a workload already submitted to it is deleted
  and the pool is deleted once its create has settled. Single-tenant retention
  (``retain_waiting_pool``, on by default): a task waiting for nodes
  (WaitingForNode) when no task of another topology waits on its cluster keeps the
  pool instead (NodeWaitExtended, recorded once), GKE keeping on trying until a node is
  Ready or the task is aborted; it is looked at again every ``RETENTION_RECHECK``,
  and a look that finds retention still holding appends nothing.

``next_due`` tells a loop running on virtual time when the next deadline or retry of
any task falls, so it can jump there when nothing else is left to do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.intents import RESERVATION_CHECK, PoolIntent
from falcon_es.engine.lifecycle_index import Group
from falcon_es.config.retry import call_retry_due_at, retry_due_at
from falcon_es.engine.runtime import Tick
from falcon_es.config.settings import Settings
from falcon_es.domain.task import TaskState

_PENDING = chart.PENDING
DISPATCHING = f"{_PENDING}.{chart.PendingReason.DISPATCHING}"
DISPATCHED = frozenset({DISPATCHING, chart.RUNNING})
WAITING_FOR_NODE = f"{_PENDING}.{chart.PendingReason.WAITING_FOR_NODE}"
PROVISIONING = frozenset({f"{_PENDING}.{chart.PendingReason.PROVISIONING}", WAITING_FOR_NODE})
#: How often a pool kept by single-tenant retention is looked at again: whether a task
#: of another topology has come to wait on its cluster since.
RETENTION_RECHECK = dt.timedelta(minutes=10)
#: Retried steps and the states in which their retry is pending.
RETRIES = (
    ("ReservationInsufficient", frozenset({f"{_PENDING}.{chart.PendingReason.CLUSTER_BUSY}"})),
    ("NodePoolNotVisible", PROVISIONING),
    ("NodesNotReady", PROVISIONING),
)


def job_deadline(state: TaskState) -> dt.datetime | None:
    if state.state not in DISPATCHED or state.job.dispatched_at is None:
        return None
    timeout = state.submission.spec.timeout_seconds
    if timeout <= 0:
        return None
    return state.job.dispatched_at + dt.timedelta(seconds=timeout)


def refusal_deadline(state: TaskState, settings: Settings) -> dt.datetime | None:
    """When a run of pod-create refusals fails the task (None: no such run)."""
    if state.state != DISPATCHING or state.job.refused_since is None:
        return None
    return state.job.refused_since + dt.timedelta(seconds=settings.lifecycle.failed_create_grace_seconds)


def provisioning_deadline(state: TaskState, settings: Settings) -> dt.datetime | None:
    """When the wait for a pool (its create, then its nodes) ends: the supply mode's
    limit from the create (or, for a workload waiting on a reused autoscaled pool, from
    the first NodesAwaited); once extended by single-tenant retention, every
    ``RETENTION_RECHECK`` after the last extension."""
    if state.state not in PROVISIONING:
        return None
    if state.job.wait_extended_at is not None:
        return state.job.wait_extended_at + RETENTION_RECHECK
    limit = dt.timedelta(seconds=settings.lifecycle.flex_start_provisioning_timeout_seconds
                         if state.pool.supply_mode == "flex-start"
                         else settings.lifecycle.provisioning_timeout_seconds)
    if state.pool.intent == PoolIntent.READY and state.job.awaiting_nodes_since is not None:
        return (state.pool.requested_at or state.job.awaiting_nodes_since) + limit
    if (state.pool.requested_at is None
            or state.pool.intent not in (PoolIntent.CREATE_REQUESTED,
                                         PoolIntent.CREATE_STARTED)):
        return None
    return state.pool.requested_at + limit


def _retains(state: TaskState, ctx: HandlerContext) -> bool:
    """Single-tenant retention: a pool whose nodes are awaited is kept past its
    deadline (GKE keeps trying) unless a task of another topology waits on the same
    cluster, which the capacity could serve instead."""
    if not ctx.settings.features.retain_waiting_pool or state.state != WAITING_FOR_NODE:
        return False
    if state.pool.intent not in (PoolIntent.READY, PoolIntent.CREATE_STARTED):
        return False
    if any(cluster == state.placement.cluster_id and topology != state.submission.topology
           for cluster, topology in ctx.queues.waiting_queues()):
        return False
    # Queues never block each other: the other topology's task may be past Waiting,
    # itself after the same capacity.
    for task_id in ctx.index.ids(Group.ACQUIRING, Group.DISPATCHING):
        other = ctx.tasks.get(task_id)
        if (other is not None and other.placement.cluster_id == state.placement.cluster_id
                and other.submission.topology != state.submission.topology
                and other.status == chart.PENDING):
            return False
    return True


def enforce_deadlines(tick: Tick, ctx: HandlerContext) -> None:
    for state in _deadline_candidates(tick, ctx):
        if state.is_terminal:
            continue
        deadline = job_deadline(state)
        if deadline is not None and ctx.now >= deadline:
            pending = (state.job.pending_diagnosis
                       if state.reason == chart.PendingReason.DISPATCHING else None)
            tick.emit(state.task_id, ev.TaskTimedOut(state.submission.spec.timeout_seconds,
                                                     pending or ""))
            if state.job.name:
                tick.emit(state.task_id, ev.JobDeleteRequested(state.job.name, "timeout"))
            continue
        deadline = refusal_deadline(state, ctx.settings)
        if deadline is not None and ctx.now >= deadline and state.job.refused_since:
            refused = int((ctx.now - state.job.refused_since).total_seconds())
            job_name = state.job.name or ""
            tick.emit(state.task_id, ev.JobSubmitFailed(job_name, state.job.pending_diagnosis or "",
                                                        refused))
            if job_name:
                tick.emit(state.task_id, ev.JobDeleteRequested(job_name, "pods refused"))
            continue
        deadline = provisioning_deadline(state, ctx.settings)
        began = state.pool.requested_at or state.job.awaiting_nodes_since
        if deadline is not None and ctx.now >= deadline and began:
            waited = int((ctx.now - began).total_seconds())
            pool = state.pool.name or ""
            if _retains(state, ctx):
                _extend(tick, ctx, state, pool, waited)
                continue
            tick.emit(state.task_id, ev.NodePoolTimedOut(pool, waited, _wait_cause(state)))
            if state.job.name and state.job.uid:
                tick.emit(state.task_id, ev.JobDeleteRequested(state.job.name,
                                                               "nodes not ready"))


def _extend(tick: Tick, ctx: HandlerContext, state: TaskState, pool: str, waited: int) -> None:
    """Keep the pool past its deadline (single-tenant retention). The first time it is
    recorded (NodeWaitExtended: what the task waits on changed, from a deadline to GKE
    trying on); each later look that finds retention still holding appends nothing,
    and the next look is kept in memory (at the latest ``RETENTION_RECHECK`` on; a
    sooner look already set for the task stands). A restarted controller looks at once."""
    if state.job.wait_extended_at is None:
        tick.emit(state.task_id, ev.NodeWaitExtended(pool, waited))
        return
    recheck = ctx.now + RETENTION_RECHECK
    sooner = ctx.polls.due(state)
    tried = ctx.polls.tried(state)
    if sooner is not None and ctx.now < sooner < recheck:
        ctx.polls.polled(state, sooner, ctx.now, tried.attempt if tried else 0)
        return
    ctx.polls.polled(state, recheck, ctx.now)


def _wait_cause(state: TaskState) -> str:
    """What the wait showed last, for the timeout's Message: the autoscaler's words
    and node counts of a NodesAwaited, the counts of a NodesNotReady."""
    shown = state.message_event
    if isinstance(shown, ev.NodesAwaited):
        return (f"{shown.cause + '; ' if shown.cause else ''}{shown.registered}/"
                f"{shown.expected} expected node(s) registered (Ready={shown.ready})")
    if isinstance(shown, ev.NodesNotReady):
        registered = "" if shown.registered is None else f"{shown.registered}/{shown.total} " \
                                                          "expected node(s) registered, "
        return f"control-plane RUNNING, {registered}Ready={shown.ready}/{shown.total}"
    return ""


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
            continue  # a failed pool delete is the executor's to try again
        for deadline in (job_deadline(state), provisioning_deadline(state, settings),
                         refusal_deadline(state, settings)):
            if deadline is not None:
                moments.append(deadline)
        for kind, states_retrying in RETRIES:
            if state.state in states_retrying and (
                    kind == "ReservationInsufficient"
                    or state.pool.intent == PoolIntent.CREATE_STARTED):
                # A pool's looks are retried while its create is followed; a
                # workload waiting for an autoscaled pool's nodes has none to retry.
                due = retry_due_at(state, kind, settings.retry)
                if due is not None:
                    moments.append(due)
        if state.retries.api_calls and state.pool.intent is None:
            due = call_retry_due_at(state, RESERVATION_CHECK)
            if due is not None:
                moments.append(due)
    return min(moments) if moments else None
