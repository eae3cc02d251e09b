"""Abort: take an Aborting task down in whatever phase the abort found it.

The abort table, applied each tick until the task is Aborted:

| phase when the abort arrived         | what happens                                         |
|--------------------------------------|------------------------------------------------------|
| not yet accepted / Waiting           | leaves the queue: TaskAborted right away             |
| ClusterBusy, Provisioning, no pool   | TaskAborted right away (nothing was created)         |
| pool create requested / in progress  | follow the create to its end, then deprovision: a    |
|                                      | pool created goes through the reuse check like any   |
|                                      | ended task's (a failed create is recorded and goes)  |
| Dispatching, submit requested        | the executor cancels the submit (JobSubmitCancelled) |
|                                      | or adopts a Job an earlier controller submitted      |
| Dispatching / Running, Job submitted | JobDeleteRequested, wait for JobDeleted              |
| then, holding a pool                 | deprovision: hand over or delete (NodePoolRetained / |
|                                      | NodePoolDeleteRequested)                             |
| finally                              | TaskAborted: Aborted with aborted_at                 |

Steps already in flight when the abort arrived (a pool create, a submit, a Job
delete) are never abandoned: their outcomes are allowed while Aborting (see the chart)
and the task becomes Aborted only once none is left open. A pool whose delete fails
keeps being retried after the task is Aborted; the Status stays Aborted.
"""

from __future__ import annotations

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.create_operations import create_outcome
from falcon_es.engine.pool_handover import PoolDecider
from falcon_es.domain.handover import needs_disposal
from falcon_es.domain.intents import JOB_GONE, JobIntent
from falcon_es.engine.lifecycle_index import Group
from falcon_es.engine.runtime import Tick
from falcon_es.domain.task import TaskState

#: Job intents the abort waits out (an effect is open).
JOB_IN_FLIGHT = frozenset({JobIntent.SUBMIT_REQUESTED, JobIntent.DELETE_REQUESTED})


def advance_aborts(tick: Tick, ctx: HandlerContext) -> None:
    aborting = [s for s in tick.candidates(ctx.index.ids(Group.ABORTING))
                if s.status == chart.ABORTING]
    if not aborting:
        return
    clusters = {c.id: c for c in ctx.clusters}
    decider = PoolDecider(tick, ctx.index)
    for state in aborting:
        state = _stop_job(tick, state)
        if state.job.intent not in JOB_GONE:
            continue
        if needs_disposal(state):
            created = create_outcome(state, clusters.get(state.placement.cluster_id or ""), ctx)
            if created is None:
                continue
            if created.error:
                state = tick.emit(state.task_id, ev.NodePoolFailed(
                    state.pool.name or "", created.error)) or state
            decider.dispose(state, created=True)
            state = tick.state(state.task_id) or state
            if needs_disposal(state):
                continue
        tick.emit(state.task_id, ev.TaskAborted(state.ending.abort_phase or "New"))


def _stop_job(tick: Tick, state: TaskState) -> TaskState:
    """Ask for the Job to be deleted when one was submitted."""
    if state.job.intent == JobIntent.SUBMITTED and state.job.name:
        return tick.emit(state.task_id, ev.JobDeleteRequested(state.job.name, "abort")) or state
    return state
