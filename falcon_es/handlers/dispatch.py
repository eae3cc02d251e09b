"""Dispatch: once a task's pool is ready, ask for its Job to be submitted.

``JobSubmitRequested`` is the intent; the effect executor renders the Job
(``falcon_es.domain.manifests``) and submits it through the edge cluster's port, and its
outcome comes back as ``JobSubmitted`` (the Job's uid; ``dispatched_at`` starts the
task's timeout), ``JobSubmitFailed`` with the API's words (Failed/JobSubmitFailed, and
the pool goes through deprovisioning), or, for a Job of the same deterministic name
that exists already, adoption when its ``falcon-task`` label is this task's.
"""

from __future__ import annotations

from falcon_es.domain import chart, naming
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.intents import PoolIntent
from falcon_es.engine.lifecycle_index import Group
from falcon_es.engine.runtime import Tick


def dispatch(tick: Tick, ctx: HandlerContext) -> None:
    for state in tick.candidates(ctx.index.ids(Group.DISPATCHING)):
        if (state.status == chart.PENDING and state.reason == chart.PendingReason.DISPATCHING
                and state.job_intent is None and state.pool_intent == PoolIntent.READY
                and state.node_pool_name):
            tick.emit(state.task_id, ev.JobSubmitRequested(naming.job_name(state.task_id),
                                                           state.node_pool_name))
