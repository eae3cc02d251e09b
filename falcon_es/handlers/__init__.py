"""Handlers: small functions ``handler(tick, ctx)``, one module per concern.

``HANDLERS`` is the order in which a tick runs them: inputs first (intake, aborts, the
outcomes of effects, the edge clusters' observations), then decisions from the current
views. Inputs first lets a tick act on what just happened: a slot freed by a pod
reported Running is filled in the same tick rather than the next one.
"""

from __future__ import annotations

from falcon_es.handlers import (
    abort, deprovision, dispatch, intake, orphans, outcomes, provisioning, reservations,
    scheduling, status, timeouts, unanswered,
)
from falcon_es.engine.runtime import Handler

HANDLERS: tuple[Handler, ...] = (
    intake.accept_new_rows,
    intake.notice_abort_requests,
    intake.notice_priority_requests,
    intake.check_job_rows,
    intake.check_ended_rows,
    # Task lifecycle: outcomes of effects and the edge observations are inputs too;
    # then each phase's decisions.
    outcomes.record_outcomes,
    status.fold_observations,
    scheduling.requeue_from_inactive_clusters,
    scheduling.choose_clusters,
    scheduling.move_from_stuck_queues,
    scheduling.yield_busy_slots,
    scheduling.lend_stuck_slots,
    scheduling.fill_free_slots,
    abort.advance_aborts,
    timeouts.enforce_deadlines,
    provisioning.provision,
    dispatch.dispatch,
    deprovision.deprovision,
    orphans.sweep_orphans,
    reservations.read_reservations,
    # Last: a cluster API that does not answer leads the Messages of its tasks.
    unanswered.name_unanswered_clusters,
)
