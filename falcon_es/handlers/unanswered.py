"""Unanswered clusters: a task whose cluster's API does not answer says so first.

When calls on behalf of a cluster get no answer (no connection, nothing within their
deadline: ``engine/cluster_calls.py`` keeps the score), every task that holds
something on that cluster (provisioning, dispatching, running, being aborted) gets
``ClusterApiUnanswered``, which leads its Message: "edge cluster X's Kubernetes API has
not answered since T: ...". Otherwise the Message would go on saying what the task
did last ("creating node pool ..."), and only a log line would name the cause. Once
the API answers again the task gets ``ClusterApiUnanswered`` without a ``since``, and
the Message it replaced comes back.

The handler looks at tasks only once some cluster API has failed to answer in this
process, so a healthy controller pays nothing for it.
"""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.engine.cluster_calls import Unanswered
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.lifecycle_index import Group
from falcon_es.engine.runtime import Tick

#: The states ``ClusterApiUnanswered`` may be recorded in (the chart's).
NOTED_STATES = frozenset({"Pending.Provisioning", "Pending.ClusterBusy",
                          "Pending.WaitingForNode", "Pending.Dispatching", "Running",
                          "Aborting"})
#: The API named when several of one cluster's are silent: the edge cluster's own first.
_API_ORDER = ("kubernetes", "gke", "compute")


def name_unanswered_clusters(tick: Tick, ctx: HandlerContext) -> None:
    """Record, once per silent spell, which API of its cluster a task waits on."""
    health = ctx.api_health
    if not health.ever_unanswered:
        return
    silent: dict[str, Unanswered] = {}
    for unanswered in sorted(health.unanswered(), key=_api_rank):
        silent.setdefault(unanswered.cluster_id, unanswered)
    ids = ctx.index.ids(Group.ACQUIRING, Group.DISPATCHING, Group.RUNNING, Group.ABORTING)
    for state in tick.candidates(ids):
        if state.state not in NOTED_STATES:
            continue
        found = silent.get(state.placement.cluster_id or "")
        shown = state.message_event
        noted = shown if isinstance(shown, ev.ClusterApiUnanswered) and shown.since else None
        if found is not None:
            if noted is None or (noted.api, noted.since) != (found.api, found.since):
                tick.emit(state.task_id, ev.ClusterApiUnanswered(
                    found.cluster, found.api, found.since, found.error))
        elif noted is not None:
            tick.emit(state.task_id, ev.ClusterApiUnanswered(noted.cluster, noted.api, None))


def _api_rank(spell: Unanswered) -> int:
    return _API_ORDER.index(spell.api) if spell.api in _API_ORDER else len(_API_ORDER)
