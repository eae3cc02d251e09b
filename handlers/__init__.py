"""Handlers: small functions ``handler(tick, ctx)``, one module per concern.

``HANDLERS`` is the order in which a tick runs them: inputs first (intake, aborts),
then decisions from the current views.
"""

from __future__ import annotations

from falcon_es.runtime import Handler
from falcon_es.effects import record_outcomes
from handlers import abort, deprovision, dispatch, intake, orphans, provisioning, scheduling
from handlers import status, timeouts

HANDLERS: tuple[Handler, ...] = (
    intake.accept_new_rows,
    intake.notice_abort_requests,
    scheduling.requeue_from_inactive_clusters,
    scheduling.choose_clusters,
    scheduling.fill_free_slots,
    # Task lifecycle (issue 4): outcomes of effects first, then each phase's decisions.
    record_outcomes,
    abort.advance_aborts,
    status.fold_observations,
    timeouts.enforce_deadlines,
    provisioning.provision,
    dispatch.dispatch,
    deprovision.deprovision,
    orphans.sweep_orphans,
)
