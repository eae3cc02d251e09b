"""What a handler may read during a tick: settings, the time, task states, the cluster
registry, the upper layer's inbox, the views kept beside the task states, the ports,
and the outcomes of the effects the last commit asked for."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping

from falcon_es.engine.cluster_calls import ApiHealth
from falcon_es.engine.effects import EffectExecutor
from falcon_es.jobtable.inbox import Inbox
from falcon_es.domain.intents import Outcome
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.live_set import NothingRetired, RetiredTasks
from falcon_es.engine.operation_polls import OperationPolls
from falcon_es.domain.ports import JobObservation, Ports
from falcon_es.domain.clusters import Cluster
from falcon_es.engine.reservation_reads import ReservationReads
from falcon_es.domain.queue_book import QueueBook
from falcon_es.config.retry import retry_due_at
from falcon_es.config.settings import Settings
from falcon_es.domain.spec import SpecLimits
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates


@dataclasses.dataclass
class HandlerContext:
    settings: Settings
    now: dt.datetime
    tasks: TaskStates
    clusters: list[Cluster]
    inbox: Inbox
    ports: Ports
    #: The scheduler's queue index (kept current by the queue view projection).
    queues: QueueBook
    #: Which tasks each lifecycle handler has to look at (kept current by its projection).
    index: LifecycleIndex
    #: The effect executor, and the outcomes it queued for this tick.
    executor: EffectExecutor
    outcomes: tuple[Outcome, ...] = ()
    #: Bus message ids this tick folded; acknowledged only after the tick commits.
    acks: list[str] = dataclasses.field(default_factory=list)
    #: What became of each edge observation this tick read, as (cluster, outcome):
    #: applied, stale (a duplicate or older view), unknown-task, held, malformed.
    edge_outcomes: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: Tasks that left memory (they hold nothing): the intake asks whether a row's
    #: stream is in the log already, and brings a task back to fold an abort of it.
    retired: RetiredTasks = dataclasses.field(default_factory=NothingRetired)
    #: New rows whose first append the database refused (id -> what it said): intake
    #: refuses each (``UnstorableRow``) instead of taking it in again.
    unstorable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: New rows whose refusal the database refused too: left alone (logged once).
    unwritable: frozenset[str] = frozenset()
    #: The schedule of the reservation reads (None: this controller does not read them).
    reservation_reads: ReservationReads | None = None
    #: Which cluster APIs answer and which do not (written by the clusters' workers).
    api_health: ApiHealth = dataclasses.field(default_factory=ApiHealth)
    #: Edge observations (by message id) whose folding waits for an answer of their
    #: cluster: kept from tick to tick by the controller, unacknowledged meanwhile.
    held_observations: dict[str, JobObservation] = dataclasses.field(default_factory=dict)

    @property
    def spec_limits(self) -> SpecLimits:
        return self.settings.spec_limits

    @property
    def polls(self) -> OperationPolls:
        """When each task's create is next looked at: the ticks' own bookkeeping (no
        fact of the log, so not the index's to hold; the index only reads it)."""
        return self.index.polls

    def wait_due_at(self, state: TaskState, kind: str) -> dt.datetime | None:
        """When the next try of the task's wait ``kind`` (a reservation too full, nodes
        not Ready) is due: after a try that recorded nothing, the moment it set; else
        the one after the last recorded try (None: now)."""
        tried = self.polls.tried(state)
        if tried is not None:
            return tried.next_at
        return retry_due_at(state, kind, self.settings.retry)
