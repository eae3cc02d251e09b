"""The effect executor: carries out committed intents through the ports.

Intent before effect (DESIGN §3): a handler never calls a port to change the world; it
records an intent event (``NodePoolCreateRequested``, ``JobSubmitRequested``,
``JobDeleteRequested``, ``NodePoolDeleteRequested``, ``OrphanPoolFound``). Once the tick
that recorded it has committed, ``EffectExecutor.after_commit`` finds every intent that
has no outcome yet, performs it, and queues the outcome; the next tick's context carries
the queued outcomes and ``record_outcomes`` (the first lifecycle handler) appends them,
after checking the intent is still open. The executor is level-triggered: what is open
is derived from the folded task states (and the orphan streams), never from memory, so
a controller that starts after a crash re-issues whatever was left open.

Every effect is idempotent: names are deterministic (``falcon_es.naming``), "already
exists" means adopt after checking the ``falcon-task`` label, and "not found" on delete
means done. A submit whose task is being aborted is cancelled instead of issued (if an
earlier controller submitted it before crashing, the Job is adopted and then deleted).

Transient API errors (``RETRYABLE``) leave the intent open and are retried after the
backoff of the API called (``Settings.retry``: gke for pools, kubernetes for Jobs);
each failed attempt is recorded (``ApiCallRetrying``: the attempt, the limit, the API's
words, the delay) so the task's Message says what it waits on. A create or submit that
uses up its attempts becomes the definite failure (``NodePoolFailed`` /
``JobSubmitFailed``, "gave up after N attempts: ..."); deletes are never given up.
Definite failures become outcome events with the API's own words.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedKeyList, SortedList

from falcon_es import chart, manifests, naming
from falcon_es import events as ev
from falcon_es.ports import (
    ALREADY_EXISTS, NOT_FOUND, RETRYABLE, NodePoolSpec, Operation, PortError, Ports,
)
from falcon_es.registry import Cluster
from falcon_es.retry import COMPUTE, GKE, KUBERNETES, WAIT, Backoff, seeded_delay
from falcon_es.settings import Settings
from falcon_es.store import EventStore, RecordedEvent
from falcon_es.task import TaskState, TaskStates
from falcon_es.tpu import slice_shape

if TYPE_CHECKING:  # the context module imports this one
    from falcon_es.context import HandlerContext
    from falcon_es.runtime import Tick

log = logging.getLogger("falcon_es.effects")

POOL_CREATE = "pool-create"
JOB_SUBMIT = "job-submit"
JOB_DELETE = "job-delete"
POOL_DELETE = "pool-delete"
ORPHAN_DELETE = "orphan-delete"
#: Not an intent: the provisioning handler's read of a reservation's free capacity.
RESERVATION_CHECK = "reservation-check"

ORPHAN_STREAM_PREFIX = "orphans:"
#: Labels on every pool Falcon-ES creates (the orphan sweep lists pools by them).
POOL_MANAGED_BY = manifests.MANAGED_BY
POOL_TASK_LABEL = manifests.TASK_LABEL
POOL_TOPOLOGY_LABEL = "falcon-topology"
POOL_SUPPLY_LABEL = "falcon-supply-mode"
#: How often (wall seconds) the index is rebuilt from every task state, in case a
#: stream changed without passing through this executor. A reload after a lost race
#: (``TaskStates.forget``) rebuilds it at the next commit anyway. Wall time, not the
#: controller's clock: on a virtual clock hours pass in seconds, and a rebuild looks
#: at every task ever seen.
FULL_SCAN_SECONDS = 300.0
#: Pause before an intent is tried again when its outcome was not recorded.
UNRECORDED_RETRY_SECONDS = 5.0


def orphan_stream(cluster_id: str) -> str:
    return f"{ORPHAN_STREAM_PREFIX}{cluster_id}"


@dataclasses.dataclass(frozen=True, order=True)
class Intent:
    """An effect the log asked for: what to do, for which stream, on which object."""

    kind: str
    stream_id: str
    name: str  # pool or Job name
    cluster_id: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened when an intent was carried out: the event the next tick appends."""

    intent: Intent
    event: ev.Event


def task_intents(state: TaskState) -> tuple[Intent, ...]:
    """The intents of one task that have no outcome yet."""
    cluster_id = state.cluster_id or ""
    found: list[Intent] = []
    if state.pool_intent == "create-requested" and state.node_pool_name:
        found.append(Intent(POOL_CREATE, state.task_id, state.node_pool_name, cluster_id))
    if state.job_name and state.job_intent == "submit-requested":
        found.append(Intent(JOB_SUBMIT, state.task_id, state.job_name, cluster_id))
    if state.job_name and state.job_intent == "delete-requested":
        found.append(Intent(JOB_DELETE, state.task_id, state.job_name, cluster_id))
    if state.node_pool_name and state.pool_disposition == "delete-requested":
        found.append(Intent(POOL_DELETE, state.task_id, state.node_pool_name, cluster_id))
    return tuple(found)


#: The API each effect calls (and whose backoff paces its retries).
API_OF_STEP = MappingProxyType({
    POOL_CREATE: GKE, POOL_DELETE: GKE, ORPHAN_DELETE: GKE,
    JOB_SUBMIT: KUBERNETES, JOB_DELETE: KUBERNETES,
    RESERVATION_CHECK: COMPUTE,
})
#: Steps retried until they succeed, whatever the policy's attempts: a pool or Job
#: left behind costs money and blocks nothing else.
NEVER_GIVEN_UP = frozenset({POOL_DELETE, JOB_DELETE, ORPHAN_DELETE})
#: Steps retried through the log whose pace is not an API's: waits on the world.
WAIT_KINDS = frozenset({"ReservationInsufficient", "NodePoolNotVisible", "NodesNotReady"})


def retry_backoff(settings: Settings, kind: str) -> Backoff:
    """The backoff of a step retried through the log: the ``wait`` policy for waits on
    the world (reservation capacity, pool visibility, node readiness), the GKE policy
    for a failed pool delete (``NodePoolDeleteFailed``, never given up)."""
    return settings.retry.for_api(WAIT if kind in WAIT_KINDS else GKE)


def retry_due_at(state: TaskState, kind: str, settings: Settings) -> dt.datetime | None:
    """When the next attempt of ``kind`` is due for this task (None: try now).

    The jitter is drawn from a generator seeded by the task and attempt, so every
    controller (and every replay) computes the same moment.
    """
    if state.retry_kind != kind or state.retry_at is None or state.retry_attempt < 1:
        return None
    delay = seeded_delay(retry_backoff(settings, kind), state.retry_attempt,
                         f"{state.task_id}:{kind}:{state.retry_attempt}")
    return state.retry_at + dt.timedelta(seconds=delay)


def call_retry_due_at(state: TaskState, step: str) -> dt.datetime | None:
    """When the call of ``step`` that last failed with a transient error is due again
    (recorded by ``ApiCallRetrying``; None when it never failed)."""
    retried = state.api_retries.get(step)
    return retried[1] if retried is not None else None


def call_failed(state: TaskState, step: str, error: str,
                settings: Settings) -> ev.ApiCallRetrying | None:
    """The record of a failed call of ``step`` for this task: the attempt it was, the
    limit and when the next is due; None when the attempts are used up.

    The attempt counts every failed call of the step in the task's log, so a restarted
    controller goes on counting where the last one stopped; the delay is seeded by the
    task, the step and the attempt."""
    attempt = failed_calls(state, step) + 1
    backoff = settings.retry.for_api(API_OF_STEP[step])
    never = step in NEVER_GIVEN_UP
    if not never and backoff.exhausted(attempt):
        return None
    delay = seeded_delay(backoff, attempt, f"{state.task_id}:{step}:{attempt}")
    return ev.ApiCallRetrying(
        api=API_OF_STEP[step], step=step, attempt=attempt,
        attempts=None if never else backoff.attempts, error=error,
        retry_in_seconds=max(1, math.ceil(delay)))


def failed_calls(state: TaskState, step: str) -> int:
    """How many calls of ``step`` failed with a transient error, as the log says."""
    retried = state.api_retries.get(step)
    return retried[0] if retried is not None else 0


def gave_up(attempts: int, error: str) -> str:
    """The definite failure's words once a step used up its attempts."""
    return f"gave up after {attempts} attempts: {error}"


def next_attempt(state: TaskState, kind: str) -> int:
    return state.retry_attempt + 1 if state.retry_kind == kind else 1


def pool_labels(task_id: str, topology: str, supply_mode: str) -> dict[str, str]:
    return {
        POOL_MANAGED_BY: manifests.MANAGED_BY_VALUE,
        POOL_TASK_LABEL: naming.task_label(task_id),
        POOL_TOPOLOGY_LABEL: topology,
        POOL_SUPPLY_LABEL: supply_mode,
    }


def job_placement(settings: Settings, cluster: Cluster) -> manifests.JobPlacement:
    return manifests.JobPlacement(
        namespace=settings.job_namespace,
        service_account=settings.job_service_account,
        bucket=cluster.gcs_bucket,
        ttl_seconds_after_finished=settings.job_ttl_seconds_after_finished,
    )


def render_task_job(state: TaskState, cluster: Cluster, settings: Settings) -> dict[str, Any]:
    """The Job manifest for a task on its pool (the submit intent's payload)."""
    return manifests.render_job(
        task_id=state.task_id,
        spec=state.spec,
        shape=slice_shape(state.tpu_type, state.topology),
        pool_name=state.node_pool_name or "",
        placement=job_placement(settings, cluster),
    )


QueueKey = tuple[str, str]  # (cluster id, topology)
PoolKey = tuple[str, str]  # (cluster id, pool name)

# Groups of the lifecycle index: which tasks a lifecycle handler has to look at.
ACQUIRING = "acquiring"  # Pending/Provisioning, ClusterBusy, WaitingForNode
DISPATCHING = "dispatching"  # Pending/Dispatching
RUNNING = "running"
ABORTING = "aborting"
POOL_WATCH = "pool-watch"  # ended, holding a pool whose fate is open or retained
GROUPS = (ACQUIRING, DISPATCHING, RUNNING, ABORTING, POOL_WATCH)
ACQUIRING_REASONS = frozenset({"Provisioning", "ClusterBusy", "WaitingForNode"})
#: Pending reasons in which a task may still take a retained pool.
TAKER_REASONS = frozenset({"Waiting", "Provisioning", "ClusterBusy"})


def can_take_pool(state: TaskState | None, cluster_id: str, topology: str) -> bool:
    """A task that could start on a retained pool of this (cluster, topology) queue."""
    return (
        state is not None
        and state.pool_intent is None
        and state.cluster_id == cluster_id
        and state.topology == topology
        and state.state.startswith("Pending.")
        and state.state[8:] in TAKER_REASONS
    )


def taker_rank(state: TaskState) -> tuple[bool, dt.datetime, str]:
    """Who gets a retained pool first: a slot holder still without a pool (it is
    provisioning now), then waiting tasks, each in submit order."""
    return (state.reason == "Waiting", state.submitted_at or dt.datetime.min, state.task_id)


def needs_disposal(state: TaskState) -> bool:
    """The task holds a pool whose fate (hand over or delete) is not decided yet."""
    return (state.node_pool_name is not None
            and state.pool_intent not in (None, "not-created")
            and state.pool_disposition is None)


def _moment(wake: tuple[dt.datetime, str]) -> dt.datetime:
    return wake[0]


class LifecycleIndex:
    """Which tasks each lifecycle handler must look at, and who holds each pool.

    Kept current from the streams each commit changed (and rebuilt from every task
    now and then), so a tick costs what changed, not the number of tasks ever seen.
    Memberships are hints: handlers re-read each candidate's state before deciding.
    """

    def __init__(self, tasks: TaskStates) -> None:
        self.tasks = tasks
        self._groups: dict[str, set[str]] = {g: set() for g in GROUPS}
        self._takers: dict[QueueKey, set[str]] = {}
        #: The same takers by ``taker_rank``: the first of a queue that is not promised
        #: yet is usually the one, where a scan of every waiting task cost O(queue).
        self._taker_order: dict[QueueKey, SortedList] = {}
        self._retained: dict[QueueKey, set[str]] = {}
        self._member: dict[str, tuple[tuple[str, ...], QueueKey | None, QueueKey | None]] = {}
        self._ranks: dict[str, tuple[bool, dt.datetime, str]] = {}
        self._intents: dict[str, tuple[Intent, ...]] = {}
        self._holders: dict[PoolKey, str] = {}
        self._created_at: dict[PoolKey, dt.datetime] = {}
        self._superseded: set[str] = set()
        #: ``falcon-task`` label -> task id, for the ids that are not valid label values
        #: themselves (informers report the label).
        self._by_label: dict[str, str] = {}
        #: When each task next needs a look by time alone (a deadline or a retry), as
        #: ``wake_of`` computes it (the timeouts handler supplies it: the core does not
        #: know the deadlines), so loops and handlers find what is due without looking
        #: at every task.
        self.wake_of: Callable[[TaskState], dt.datetime | None] | None = None
        self._wake_at: dict[str, dt.datetime] = {}
        #: When each task's running create operation is to be asked again (``polled``),
        #: valid only for the task version it was decided on: any event (this
        #: controller's or another's) means looking afresh.
        self._next_poll: dict[str, tuple[int, dt.datetime]] = {}
        self._wakes: SortedKeyList = SortedKeyList(key=_moment)  # (moment, task id)
        #: Retained pools and the task each is promised to (holder -> taker, and taker
        #: -> holders), and the holders whose taker could take the pool as of the last
        #: commit: those need no look from deprovisioning until one of the two changes.
        self._promised_to: dict[str, str] = {}
        self._promised_by: dict[str, set[str]] = {}
        self._kept: set[str] = set()
        self.built = False

    def rebuild(self) -> None:
        for group in self._groups.values():
            group.clear()
        for index in (self._takers, self._taker_order, self._ranks, self._retained,
                      self._member, self._intents, self._next_poll,
                      self._holders, self._created_at, self._by_label, self._wake_at,
                      self._promised_to, self._promised_by):
            index.clear()
        self._wakes.clear()
        self._kept.clear()
        self._superseded.clear()
        for state in self.tasks.all():
            self.update(state)
        self.built = True

    def ensure(self) -> None:
        if not self.built:
            self.rebuild()

    def update(self, state: TaskState) -> None:
        task_id = state.task_id
        previous = self._member.pop(task_id, None)
        if previous is not None:
            groups, taker, retained = previous
            for group in groups:
                self._groups[group].discard(task_id)
            if taker is not None:
                self._takers[taker].discard(task_id)
                self._taker_order[taker].discard(self._ranks.pop(task_id))
            if retained is not None:
                self._retained[retained].discard(task_id)
        self._track_pool(state)
        handed_on = task_id in self._superseded  # its pool belongs to a later task now
        groups = () if handed_on else self._groups_of(state)
        for group in groups:
            self._groups[group].add(task_id)
        taker = retained = None
        if state.cluster_id and can_take_pool(state, state.cluster_id, state.topology):
            taker = (state.cluster_id, state.topology)
            self._takers.setdefault(taker, set()).add(task_id)
            rank = self._ranks[task_id] = taker_rank(state)
            self._taker_order.setdefault(taker, SortedList()).add(rank)
        if (state.cluster_id and state.pool_disposition == "retained" and state.is_terminal
                and not handed_on):
            retained = (state.cluster_id, state.topology)
            self._retained.setdefault(retained, set()).add(task_id)
        self._member[task_id] = (groups, taker, retained)
        self._track_promise(state, retained is not None)
        for holder_id in self._promised_by.get(task_id, ()):
            holder = self.tasks.get(holder_id)
            if holder is not None:
                self._judge_promise(holder)
        intents = task_intents(state)
        if intents:
            self._intents[task_id] = intents
        else:
            self._intents.pop(task_id, None)
        if state.job_name:
            label = naming.task_label(task_id)
            if label != task_id:
                self._by_label[label] = task_id
        if self.wake_of is not None:
            self._set_wake(task_id, self._wake_moment(state))

    def _track_promise(self, state: TaskState, holds_retained: bool) -> None:
        self._drop_promise(state.task_id)
        if holds_retained and state.retained_for:
            self._promised_to[state.task_id] = state.retained_for
            self._promised_by.setdefault(state.retained_for, set()).add(state.task_id)
            self._judge_promise(state)

    def _drop_promise(self, holder_id: str) -> None:
        self._kept.discard(holder_id)
        taker_id = self._promised_to.pop(holder_id, None)
        if taker_id is not None:
            holders = self._promised_by[taker_id]
            holders.discard(holder_id)
            if not holders:
                del self._promised_by[taker_id]

    def _judge_promise(self, holder: TaskState) -> None:
        taker = self.tasks.get(holder.retained_for) if holder.retained_for else None
        if holder.cluster_id and can_take_pool(taker, holder.cluster_id, holder.topology):
            self._kept.add(holder.task_id)
        else:
            self._kept.discard(holder.task_id)

    def _set_wake(self, task_id: str, moment: dt.datetime | None) -> None:
        previous = self._wake_at.get(task_id)
        if previous == moment:
            return
        if previous is not None:
            self._wakes.remove((previous, task_id))
            del self._wake_at[task_id]
        if moment is not None:
            self._wake_at[task_id] = moment
            self._wakes.add((moment, task_id))

    def _groups_of(self, state: TaskState) -> tuple[str, ...]:
        status, _, reason = state.state.partition(".")
        if status == chart.PENDING:
            if reason in ACQUIRING_REASONS:
                return (ACQUIRING,)
            return (DISPATCHING,) if reason == "Dispatching" else ()
        if status == chart.RUNNING:
            return (RUNNING,)
        if status == chart.ABORTING:
            return (ABORTING,)
        if status in chart.TERMINAL_STATUSES and state.node_pool_name and (
                needs_disposal(state)
                or state.pool_disposition in ("retained", "delete-failed")):
            return (POOL_WATCH,)
        return ()

    def _track_pool(self, state: TaskState) -> None:
        """The holder of a pool is the task that last took it: its creator, then each
        task it was handed over to (``NodePoolReused.from_task`` names the previous one)."""
        if not (state.node_pool_name and state.cluster_id
                and state.pool_intent not in (None, "not-created")):
            return
        key = (state.cluster_id, state.node_pool_name)
        if state.pool_from_task and state.pool_from_task not in self._superseded:
            self._superseded.add(state.pool_from_task)
            self._forget_pool_duties(state.pool_from_task)
        if state.pool_requested_at is not None:
            known = self._created_at.get(key)
            if known is None or state.pool_requested_at < known:
                self._created_at[key] = state.pool_requested_at
        if state.task_id in self._superseded:
            return
        current = self._holders.get(key)
        if current is None or current in self._superseded or current == state.task_id:
            self._holders[key] = state.task_id

    def _forget_pool_duties(self, task_id: str) -> None:
        """The task handed its pool on: nothing about that pool is its business now."""
        member = self._member.get(task_id)
        if member is None:
            return
        groups, taker, retained = member
        self._groups[POOL_WATCH].discard(task_id)
        if retained is not None:
            self._retained[retained].discard(task_id)
        self._drop_promise(task_id)
        self._member[task_id] = (tuple(g for g in groups if g != POOL_WATCH), taker, None)

    # ------------------------------------------------------------------ reading
    def ids(self, *groups: str) -> set[str]:
        found: set[str] = set()
        for group in groups:
            found |= self._groups[group]
        return found

    def pool_watch(self, changed: Iterable[str] = ()) -> set[str]:
        """The ``POOL_WATCH`` tasks whose pool may need a decision: all but the holders
        of a retained pool whose taker could still take it at the last commit, unless
        that taker is among ``changed`` (states a tick has moved since)."""
        watch = self._groups[POOL_WATCH]
        found = watch - self._kept
        for task_id in changed:
            found.update(h for h in self._promised_by.get(task_id, ()) if h in watch)
        return found

    def takers(self, key: QueueKey) -> set[str]:
        return set(self._takers.get(key, ()))

    def takers_in_order(self, key: QueueKey) -> Iterator[str]:
        """This queue's takers as of the last commit, best ``taker_rank`` first."""
        return (rank[2] for rank in self._taker_order.get(key, ()))

    def retained(self, key: QueueKey) -> set[str]:
        return set(self._retained.get(key, ()))

    def holder(self, key: PoolKey) -> str | None:
        return self._holders.get(key)

    def pools(self) -> dict[PoolKey, str]:
        return dict(self._holders)

    def created_at(self, key: PoolKey) -> dt.datetime | None:
        return self._created_at.get(key)

    def task_for_label(self, label: str) -> str:
        """The task id a ``falcon-task`` label value stands for."""
        return self._by_label.get(label, label)

    def intents(self) -> list[Intent]:
        return [i for group in self._intents.values() for i in group]

    def intents_of(self, task_id: str) -> tuple[Intent, ...]:
        return self._intents.get(task_id, ())

    def polled(self, state: TaskState, next_at: dt.datetime | None) -> None:
        """The task's create operation was asked: still running, ask again at
        ``next_at`` and wake a loop then (a loop that jumps virtual time would not
        come back for it otherwise); done (None), never again."""
        if next_at is not None and state.pool_operation:
            self._next_poll[state.task_id] = (state.version, next_at)
        else:
            self._next_poll.pop(state.task_id, None)
        self._set_wake(state.task_id, self._wake_moment(state))

    def poll_due(self, state: TaskState) -> dt.datetime | None:
        """When the task's running create operation is to be asked again (None: now)."""
        poll = self._next_poll.get(state.task_id)
        return poll[1] if poll is not None and poll[0] == state.version else None

    def _wake_moment(self, state: TaskState) -> dt.datetime | None:
        """The earlier of ``wake_of`` (deadlines, retries) and the next operation poll;
        a poll decided on an earlier version of the task is forgotten."""
        deadline = self.wake_of(state) if self.wake_of is not None else None
        poll = self._next_poll.get(state.task_id)
        if poll is None:
            return deadline
        if poll[0] != state.version:
            del self._next_poll[state.task_id]
            return deadline
        return min(poll[1], deadline) if deadline is not None else poll[1]

    def wake_at(self, task_id: str) -> dt.datetime | None:
        """The task's ``wake_of`` moment as of the last commit (or its next operation
        poll, when that comes first)."""
        return self._wake_at.get(task_id)

    def next_wake(self) -> dt.datetime | None:
        """The earliest moment a task needs a look by time alone (``wake_of``, polls)."""
        return self._wakes[0][0] if self._wakes else None

    def waking(self, now: dt.datetime) -> list[str]:
        """Tasks whose ``wake_of`` moment has come, earliest first."""
        return [task_id for _, task_id in self._wakes.irange_key(max_key=now)]


class EffectExecutor:
    """Performs open intents after each commit; its outcomes feed the next tick.

    Everything it remembers (queued outcomes, retry times, deletes in progress) may be
    lost at any moment without harm: the log still says which intents are open.
    """

    def __init__(self, store: EventStore, tasks: TaskStates, settings: Settings,
                 ports: Ports) -> None:
        self.store = store
        self.tasks = tasks
        self.settings = settings
        self.ports = ports
        self.index = LifecycleIndex(tasks)
        self._orphans: dict[tuple[str, str], Intent] = {}
        self._orphan_streams_read: set[str] = set()
        self._queued: list[Outcome] = []
        self._queued_intents: set[Intent] = set()
        self._not_before: dict[Intent, dt.datetime] = {}
        self._failures: dict[Intent, int] = {}
        self._deleting: dict[Intent, str] = {}  # delete in progress: operation id or ""
        self._next_full_scan: float | None = None  # time.monotonic()
        self._forgets_seen = tasks.forgets
        self._next_sweep: dt.datetime | None = None

    # ------------------------------------------------------------ tick interface
    def take_outcomes(self) -> tuple[Outcome, ...]:
        """Hand the queued outcomes to the tick about to run (they are its inputs)."""
        taken = tuple(self._queued)
        self._queued.clear()
        self._queued_intents.clear()
        return taken

    @property
    def has_outcomes(self) -> bool:
        """True when outcomes wait for the next tick (so that tick has work to do)."""
        return bool(self._queued)

    def open_intents(self) -> list[Intent]:
        """Every intent known to be open (as of the last commit)."""
        self.index.ensure()
        return sorted([*self.index.intents(), *self._orphans.values()])

    def open_orphans(self) -> frozenset[tuple[str, str]]:
        """(cluster id, pool name) of orphans found and not yet deleted."""
        return frozenset(self._orphans)

    def is_open(self, intent: Intent) -> bool:
        if intent.kind == ORPHAN_DELETE:
            return self._orphans.get((intent.cluster_id, intent.name)) == intent
        return intent in self.index.intents_of(intent.stream_id)

    def sweep_due(self, now: dt.datetime) -> bool:
        return self._next_sweep is None or now >= self._next_sweep

    def swept(self, now: dt.datetime) -> None:
        self._next_sweep = now + dt.timedelta(seconds=self.settings.orphan_sweep_seconds)

    def next_due(self) -> dt.datetime | None:
        """The earliest moment an open intent will be tried again (for a loop that
        jumps virtual time to the next thing to do)."""
        moments = [m for i, m in self._not_before.items()
                   if self.is_open(i) and i not in self._queued_intents
                   and i not in self._deleting]
        if self._next_sweep is not None:
            moments.append(self._next_sweep)
        return min(moments) if moments else None

    def after_commit(self, ctx: HandlerContext, recorded: Sequence[RecordedEvent]) -> None:
        """The tick's events are durable: bring the open intents up to date and do them."""
        now = self.ports.clock.now()
        clusters = {c.id: c for c in ctx.clusters}
        self._load_orphan_streams(clusters)
        wall = time.monotonic()
        if (self._next_full_scan is None or wall >= self._next_full_scan
                or self.tasks.forgets != self._forgets_seen):
            self.index.rebuild()
            self._next_full_scan = wall + FULL_SCAN_SECONDS
            self._forgets_seen = self.tasks.forgets
        else:
            self._refresh(recorded)
        self._fold_orphans(recorded)
        for intent in self._due(now):
            cluster = clusters.get(intent.cluster_id)
            if cluster is None:
                log.error("intent %s names cluster %s, which is not registered", intent,
                          intent.cluster_id)
                self._later(intent, now)
                continue
            self._perform(intent, cluster, now)

    # ------------------------------------------------------------- bookkeeping
    def _refresh(self, recorded: Iterable[RecordedEvent]) -> None:
        self.index.ensure()
        for stream_id in {r.stream_id for r in recorded}:
            state = self.tasks.get(stream_id)
            if state is not None:
                self.index.update(state)

    def _load_orphan_streams(self, clusters: Mapping[str, Cluster]) -> None:
        for cluster_id in clusters:
            stream_id = orphan_stream(cluster_id)
            if stream_id in self._orphan_streams_read:
                continue
            self._orphan_streams_read.add(stream_id)
            self._fold_orphans(self.store.read_stream(stream_id))

    def _fold_orphans(self, recorded: Iterable[RecordedEvent]) -> None:
        for record in recorded:
            event = record.event
            if isinstance(event, ev.OrphanPoolFound):
                self._orphans[(event.cluster_id, event.pool_name)] = Intent(
                    ORPHAN_DELETE, record.stream_id, event.pool_name, event.cluster_id)
            elif isinstance(event, ev.OrphanPoolDeleted):
                self._orphans.pop((event.cluster_id, event.pool_name), None)

    def _due(self, now: dt.datetime) -> list[Intent]:
        intents = [*self.index.intents(), *self._orphans.values()]
        live = set(intents)
        for stale in [i for i in self._not_before if i not in live]:
            del self._not_before[stale]
            self._failures.pop(stale, None)
        for stale in [i for i in self._deleting if i not in live]:
            del self._deleting[stale]
        for intent in intents:
            if intent not in self._not_before:
                self._resume_recorded_retry(intent)
        return sorted(
            i for i in intents
            if i not in self._queued_intents and self._not_before.get(i, now) <= now
        )

    def _resume_recorded_retry(self, intent: Intent) -> None:
        """A call the log says failed and is due again later (``ApiCallRetrying``) waits
        for that moment, also in a controller that has just started."""
        state = self.tasks.get(intent.stream_id) if intent.kind != ORPHAN_DELETE else None
        due = call_retry_due_at(state, intent.kind) if state is not None else None
        if due is not None:
            self._not_before[intent] = due

    def _queue(self, intent: Intent, event: ev.Event, now: dt.datetime) -> None:
        self._queued.append(Outcome(intent, event))
        self._queued_intents.add(intent)
        self._failures.pop(intent, None)
        self._deleting.pop(intent, None)
        # Should the outcome not make it into the log, try again a little later.
        self._not_before[intent] = now + dt.timedelta(seconds=UNRECORDED_RETRY_SECONDS)

    def _later(self, intent: Intent, now: dt.datetime, error: PortError | None = None) -> None:
        """A transient failure: the intent stays open and is tried again after the
        backoff of the API it calls. A task's failed call is recorded (so its Message
        shows the attempt) and, once a create or submit has used up its attempts,
        becomes its definite failure."""
        state = self.tasks.get(intent.stream_id) if intent.kind != ORPHAN_DELETE else None
        if state is None or error is None:
            self._later_unrecorded(intent, now, error)
            return
        retrying = call_failed(state, intent.kind, error.message, self.settings)
        if retrying is None:
            attempts = failed_calls(state, intent.kind) + 1
            log.warning("%s %s on %s: %s; gave up after %d attempts", intent.kind,
                        intent.name, intent.cluster_id, error, attempts)
            self._queue(intent, self._given_up(intent, gave_up(attempts, error.message)), now)
            return
        log.warning("%s %s on %s: %s; attempt %d, next in %ds", intent.kind, intent.name,
                    intent.cluster_id, error, retrying.attempt, retrying.retry_in_seconds)
        self._queued.append(Outcome(intent, retrying))
        self._queued_intents.add(intent)
        self._not_before[intent] = now + dt.timedelta(seconds=retrying.retry_in_seconds)

    def _later_unrecorded(self, intent: Intent, now: dt.datetime,
                          error: PortError | None) -> None:
        """A retry no task's log records (an orphan's delete, a cluster not registered):
        counted in memory, never given up."""
        failures = self._failures.get(intent, 0) + 1
        self._failures[intent] = failures
        backoff = self.settings.retry.for_api(API_OF_STEP[intent.kind])
        delay = seeded_delay(backoff, failures, f"{intent}:{failures}")
        self._not_before[intent] = now + dt.timedelta(seconds=delay)
        if error is not None:
            log.warning("%s %s on %s: %s; retry %d in %.0fs", intent.kind, intent.name,
                        intent.cluster_id, error, failures, delay)

    @staticmethod
    def _given_up(intent: Intent, words: str) -> ev.Event:
        if intent.kind == POOL_CREATE:
            return ev.NodePoolFailed(intent.name, words)
        return ev.JobSubmitFailed(intent.name, words)

    # ------------------------------------------------------------------ effects
    def _perform(self, intent: Intent, cluster: Cluster, now: dt.datetime) -> None:
        if intent.kind == ORPHAN_DELETE:
            self._delete_pool(intent, cluster, now, None)
            return
        state = self.tasks.get(intent.stream_id)
        if state is None:
            return
        try:
            if intent.kind == POOL_CREATE:
                self._create_pool(intent, state, cluster, now)
            elif intent.kind == JOB_SUBMIT:
                self._submit_job(intent, state, cluster, now)
            elif intent.kind == JOB_DELETE:
                self.ports.edges.for_cluster(cluster).delete_job(intent.name)
                self._queue(intent, ev.JobDeleted(intent.name), now)
            elif intent.kind == POOL_DELETE:
                self._delete_pool(intent, cluster, now, state)
        except PortError as error:
            self._later(intent, now, error)

    def _create_pool(self, intent: Intent, state: TaskState, cluster: Cluster,
                     now: dt.datetime) -> None:
        request = state.pool_request
        supply_mode = str(request.get("supply_mode") or state.supply_mode or "")
        spec = NodePoolSpec(
            cluster=cluster,
            name=intent.name,
            shape=slice_shape(state.tpu_type, state.topology),
            supply_mode=supply_mode,
            reservation=request.get("reservation"),
            scale_down_unneeded_seconds=int(request.get("scale_down_unneeded_seconds") or 0),
            labels=pool_labels(state.task_id, state.topology, supply_mode),
        )
        try:
            operation = self.ports.node_pools.create(spec)
        except PortError as error:
            if error.code == ALREADY_EXISTS:
                self._adopt_pool(intent, state, cluster, now)
            elif error.code == RETRYABLE:
                self._later(intent, now, error)
            else:
                self._queue(intent, ev.NodePoolFailed(intent.name, error.message), now)
            return
        self._queue(intent, ev.NodePoolCreateStarted(intent.name, operation.id), now)

    def _adopt_pool(self, intent: Intent, state: TaskState, cluster: Cluster,
                    now: dt.datetime) -> None:
        """The pool exists: ours (an earlier controller created it) or someone else's."""
        try:
            info = self.ports.node_pools.get(cluster, intent.name)
        except PortError as error:
            if error.code == NOT_FOUND:
                # GKE lists a just-created pool late: no failed call, only a wait.
                self._later_unrecorded(intent, now, error)
            else:
                self._later(intent, now, error)
            return
        owner = info.labels.get(POOL_TASK_LABEL)
        if owner == naming.task_label(state.task_id):
            self._queue(intent, ev.NodePoolCreateStarted(intent.name, ""), now)
            return
        self._queue(intent, ev.NodePoolFailed(
            intent.name,
            f"a node pool named {intent.name} already exists on {cluster.name} and is not "
            f"this task's (falcon-task={owner or 'unset'})",
        ), now)

    def _submit_job(self, intent: Intent, state: TaskState, cluster: Cluster,
                    now: dt.datetime) -> None:
        edge = self.ports.edges.for_cluster(cluster)
        label = naming.task_label(state.task_id)
        if state.status == chart.ABORTING:
            existing = edge.get_job(intent.name)
            if existing is not None and existing.task_id == label:
                self._queue(intent, ev.JobSubmitted(intent.name, existing.uid), now)
            else:
                self._queue(intent, ev.JobSubmitCancelled(intent.name), now)
            return
        try:
            ref = edge.submit_job(render_task_job(state, cluster, self.settings))
        except PortError as error:
            if error.code == ALREADY_EXISTS:
                existing = edge.get_job(intent.name)
                if existing is None:
                    self._later(intent, now, error)
                elif existing.task_id == label:
                    self._queue(intent, ev.JobSubmitted(intent.name, existing.uid), now)
                else:
                    self._queue(intent, ev.JobSubmitFailed(
                        intent.name,
                        f"a Job named {intent.name} already exists and is not this task's "
                        f"(falcon-task={existing.task_id or 'unset'})",
                    ), now)
            elif error.code == RETRYABLE:
                self._later(intent, now, error)
            else:
                self._queue(intent, ev.JobSubmitFailed(intent.name, error.message), now)
            return
        self._queue(intent, ev.JobSubmitted(intent.name, ref.uid), now)

    def _delete_pool(self, intent: Intent, cluster: Cluster, now: dt.datetime,
                     state: TaskState | None) -> None:
        """Delete, then follow the operation (or the pool's STOPPING status after a
        restart) until the pool is gone. ``state`` is None for an orphan."""
        pools = self.ports.node_pools
        try:
            if intent in self._deleting:
                self._follow_delete(intent, cluster, now, state)
                return
            operation = pools.delete(cluster, intent.name)
        except PortError as error:
            if error.code == NOT_FOUND:
                self._deleted(intent, now)
            elif error.code == RETRYABLE and self._is_stopping(cluster, intent.name):
                self._in_progress(intent, "")
            else:
                self._delete_failed(intent, now, state, error)
            return
        self._operation_progress(intent, operation, now, state)

    def _follow_delete(self, intent: Intent, cluster: Cluster, now: dt.datetime,
                       state: TaskState | None) -> None:
        operation_id = self._deleting[intent]
        if operation_id:
            self._operation_progress(
                intent, self.ports.node_pools.get_operation(cluster, operation_id), now, state)
            return
        try:
            self.ports.node_pools.get(cluster, intent.name)
        except PortError as error:
            if error.code == NOT_FOUND:
                self._deleted(intent, now)
                return
            raise

    def _operation_progress(self, intent: Intent, operation: Operation | None,
                            now: dt.datetime, state: TaskState | None) -> None:
        if operation is None:
            self._deleted(intent, now)
        elif not operation.done:
            self._in_progress(intent, operation.id)
        elif operation.error:
            self._delete_failed(intent, now, state, PortError(
                operation.error_code or "FAILED", operation.error))
        else:
            self._deleted(intent, now)

    def _in_progress(self, intent: Intent, operation_id: str) -> None:
        """A delete GKE is carrying out: looked at again after every commit (the world
        changing is what moves it, not a retry timer)."""
        self._deleting[intent] = operation_id
        self._not_before.pop(intent, None)

    def _is_stopping(self, cluster: Cluster, name: str) -> bool:
        try:
            return self.ports.node_pools.get(cluster, name).status == "STOPPING"
        except PortError:
            return False

    def _deleted(self, intent: Intent, now: dt.datetime) -> None:
        if intent.kind == ORPHAN_DELETE:
            self._queue(intent, ev.OrphanPoolDeleted(intent.cluster_id, intent.name), now)
        else:
            self._queue(intent, ev.NodePoolDeleted(intent.name), now)

    def _delete_failed(self, intent: Intent, now: dt.datetime, state: TaskState | None,
                       error: PortError) -> None:
        if state is None:
            self._later(intent, now, error)
            return
        attempt = next_attempt(state, "NodePoolDeleteFailed")
        self._queue(intent, ev.NodePoolDeleteFailed(intent.name, error.message, attempt), now)


def record_outcomes(tick: Tick, ctx: HandlerContext) -> None:
    """Handler: append the outcomes the executor queued, if their intent is still open.

    An outcome whose intent closed meanwhile (another outcome won, a restart re-issued
    it) is dropped: the log already says how that intent ended.
    """
    effects: EffectExecutor | None = ctx.effects
    for outcome in ctx.outcomes:
        intent, event = outcome.intent, outcome.event
        if intent.kind == ORPHAN_DELETE:
            if effects is not None and effects.is_open(intent):
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
