"""Recording the outcomes of effects: the first lifecycle handler of every tick.

The effect executor performs intents after a commit and queues what happened; this
handler appends those outcomes, so every change to the world is followed by an event
in the same log that asked for it.
"""

from __future__ import annotations

import logging

from falcon_es.domain import chart
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.intents import IntentKind
from falcon_es.domain.task_intents import task_intents
from falcon_es.engine.runtime import Tick

log = logging.getLogger("falcon_es.handlers.outcomes")


def record_outcomes(tick: Tick, ctx: HandlerContext) -> None:
    """Append the outcomes the executor queued, if their intent is still open.

    An outcome whose intent closed meanwhile (another outcome won, a restart re-issued
    it) is dropped: the log already says how that intent ended.
    """
    for outcome in ctx.outcomes:
        intent, event = outcome.intent, outcome.event
        if intent.kind == IntentKind.ORPHAN_DELETE:
            if ctx.executor.is_open(intent):
                tick.emit(intent.stream_id, event)
            continue
        state = tick.state(intent.stream_id)
        if state is None or intent not in task_intents(state):
            continue
        if (state.state, event.type_name) not in chart.TRANSITIONS:
            log.error("outcome %s of %s does not fit task %s in state %s; dropped",
                      event.type_name, intent.kind, state.task_id, state.state)
            continue
        tick.emit(intent.stream_id, event)
