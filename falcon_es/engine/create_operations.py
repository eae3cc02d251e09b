"""Asking GKE how a task's pool create is going, shared by the handlers that wait on
it: provisioning (is the pool there yet?) and deprovisioning and abort (may the pool
be deleted yet? GKE refuses a delete while the create operation still runs).

It lives in the engine rather than in one handler so that handlers share it instead
of importing each other; it needs the handlers' context (ports, settings, the poll
bookkeeping).
"""

from __future__ import annotations

import datetime as dt
import logging

from falcon_es.domain.clusters import Cluster
from falcon_es.domain.intents import PoolIntent
from falcon_es.domain.ports import AWAITING, NOT_FOUND, Operation, PortError
from falcon_es.domain.task import TaskState
from falcon_es.engine.context import HandlerContext

log = logging.getLogger("falcon_es.engine.create_operations")


def ask_create_operation(state: TaskState, cluster: Cluster,
                         ctx: HandlerContext) -> Operation | None:
    """The task's running create operation (of a multi-slice task: its operations
    together, done when all are, failed with the first error), asked at most every
    ``operation_poll_seconds`` (each look is a call against the project's GKE quota,
    and a create takes minutes); None when it is not time yet or the call failed."""
    due = ctx.polls.due(state)
    operations = [o for o in (state.pool.operation or "", *state.pool.slice_operations) if o]
    if not operations or (due is not None and ctx.now < due):
        return None
    interval = dt.timedelta(seconds=ctx.settings.lifecycle.operation_poll_seconds)
    pending: Operation | None = None
    unknown = False
    for operation_id in operations:
        try:
            operation = ctx.ports.node_pools.get_operation(cluster, operation_id)
        except PortError as error:
            if error.code == AWAITING:
                return None  # asked: looked at again once the answer is in
            if error.code != NOT_FOUND:
                # Whatever the error, the next look waits a poll interval: an error
                # must not turn the poll into a call per tick.
                ctx.polls.polled(state, ctx.now + interval, ctx.now)
                log.warning("operation %s of pool %s: %s", operation_id,
                            state.pool.name, error)
                return None
            # GKE keeps operations for a limited time, and one can be unknown after a
            # long outage: the create ended one way or the other, and the pool says how.
            log.warning("create operation %s of pool %s is unknown to GKE; looking at "
                        "the pool", operation_id, state.pool.name)
            unknown = True
            continue
        if operation.done and operation.error:
            ctx.polls.polled(state, None, ctx.now)
            return operation
        if not operation.done:
            pending = pending or operation
    ctx.polls.polled(state, None if pending is None and not unknown else ctx.now + interval,
                     ctx.now)
    return pending or Operation(operations[0], done=True)


def pool_settled(state: TaskState, cluster: Cluster | None, ctx: HandlerContext) -> bool:
    """True once no create of the task's pool is in flight (a delete issued while GKE
    still runs the create operation is refused)."""
    return create_outcome(state, cluster, ctx) is not None


def create_outcome(state: TaskState, cluster: Cluster | None,
                   ctx: HandlerContext) -> Operation | None:
    """How the task's pool create ended: its finished operation (``error`` set when it
    failed), or None while it is still in flight (or not looked at yet). A task whose
    create was never started, or ended before (ready, failed), has a finished
    operation without error: there is nothing left to wait for."""
    if state.pool.intent == PoolIntent.CREATE_REQUESTED:
        return None
    if state.pool.intent != PoolIntent.CREATE_STARTED or not state.pool.operation:
        return Operation(state.pool.operation or "", done=True)
    if cluster is None:
        return None
    operation = ask_create_operation(state, cluster, ctx)
    return operation if operation is not None and operation.done else None
