"""Handlers: small functions ``handler(tick, ctx)``, one module per concern.

``HANDLERS`` is the order in which a tick runs them: inputs first (intake, aborts),
then decisions from the current views.
"""

from __future__ import annotations

from falcon_es.runtime import Handler
from handlers import intake, scheduling

HANDLERS: tuple[Handler, ...] = (
    intake.accept_new_rows,
    intake.notice_abort_requests,
    scheduling.requeue_from_inactive_clusters,
    scheduling.choose_clusters,
    scheduling.fill_free_slots,
)
