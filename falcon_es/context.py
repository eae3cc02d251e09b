"""What a handler may read during a tick: settings, the time, task states, the cluster
registry, the upper layer's inbox, and the ports (None where a backend is not wired)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from falcon_es.effects import EffectExecutor, Outcome
from falcon_es.inbox import Inbox
from falcon_es.registry import Cluster
from falcon_es.scheduling import QueueBook
from falcon_es.settings import Settings
from falcon_es.spec import SpecLimits
from falcon_es.task import TaskStates


@dataclasses.dataclass
class HandlerContext:
    settings: Settings
    now: dt.datetime
    tasks: TaskStates
    clusters: list[Cluster]
    inbox: Inbox
    ports: Any = None
    #: The scheduler's queue index (kept current by the queue view projection).
    queues: QueueBook | None = None
    #: The effect executor (None without ports) and the outcomes it queued for this tick.
    effects: EffectExecutor | None = None
    outcomes: tuple[Outcome, ...] = ()
    #: Bus message ids this tick folded; acknowledged only after the tick commits.
    acks: list[str] = dataclasses.field(default_factory=list)
    #: What became of each edge observation this tick read, as (cluster, outcome):
    #: applied, stale (a duplicate or older view), unknown-task, held, malformed.
    edge_outcomes: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def spec_limits(self) -> SpecLimits:
        return SpecLimits(self.settings.default_timeout_seconds, self.settings.max_timeout_seconds)
