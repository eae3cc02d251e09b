"""The effect executor: carries out committed intents through the ports.

Once the tick that recorded an intent has committed, ``EffectExecutor.after_commit``
finds every intent that has no outcome yet (the lifecycle index knows them; the orphan
streams hold the rest), performs it, and queues the outcome; the next tick's context
carries the queued outcomes and the ``record_outcomes`` handler appends them, after
checking the intent is still open. The executor is level-triggered: what is open is
derived from the folded task states, never from memory, so a controller that starts
after a crash re-issues whatever was left open.

Every effect is idempotent: names are deterministic (``falcon_es.domain.naming``), "already
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

With ``calls`` (``ClusterCalls``, the gcp backend) each effect runs on its cluster's
own workers and the tick does not wait for it: its outcome is queued when it lands and
is a later tick's input, as any outcome is. An effect in flight is not issued again
until it lands; what the executor remembers is then shared with the workers, under
one lock.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from falcon_es.domain import chart, naming
from falcon_es.domain import events as ev
from falcon_es.domain.intents import (
    Intent, IntentKind, Outcome, orphan_stream,
)
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.domain.ports import (
    ALREADY_EXISTS, NOT_FOUND, RETRYABLE, NodePoolSpec, Operation, PortError, Ports,
)
from falcon_es.domain.clusters import Cluster, missing_node_zone
from falcon_es.config.retry import (
    API_OF_STEP, call_failed, call_retry_due_at, failed_calls, gave_up, records_try,
    retry_due_at, scheduled_try, seeded_delay, wait_delay,
)
from falcon_es.config.settings import Settings
from falcon_es.storage.store import EventStore, RecordedEvent
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from falcon_es.engine.task_manifests import (
    POOL_TASK_LABEL, pool_labels, pool_owner, render_task_job, workload_kind,
)
from falcon_es.engine.cluster_calls import ClusterCalls
from falcon_es.engine.observed import ObservedReads


log = logging.getLogger("falcon_es.engine.effects")

#: Pause before an intent is tried again when its outcome was not recorded.
UNRECORDED_RETRY_SECONDS = 5.0
#: The retried step of a failed pool delete, as the log and the retry schedule name it.
DELETE_FAILED = "NodePoolDeleteFailed"


def _locked(method: Callable[..., None]) -> Callable[..., None]:
    """Runs the bookkeeping method under the executor's lock (workers share it)."""

    @functools.wraps(method)
    def locked(self: EffectExecutor, *args: object, **kwargs: object) -> None:
        with self._lock:
            method(self, *args, **kwargs)

    return locked


class SeesClusters(Protocol):
    """What the executor reads of a tick's context: the registered clusters."""

    @property
    def clusters(self) -> Sequence[Cluster]: ...


class EffectExecutor:
    """Performs open intents after each commit; its outcomes feed the next tick.

    Everything it remembers (queued outcomes, retry times, deletes in progress) may be
    lost at any moment without harm: the log still says which intents are open.
    """

    def __init__(self, store: EventStore, tasks: TaskStates, settings: Settings,
                 ports: Ports, index: LifecycleIndex, *,
                 orphans_from: Callable[[str], int | None] | None = None,
                 calls: ClusterCalls | None = None,
                 reads: ObservedReads | None = None) -> None:
        self.store = store
        #: The first version of an orphan stream with an open orphan, None when none is
        #: open (the live set knows); without it every orphan stream is read whole.
        self.orphans_from = orphans_from
        self.tasks = tasks
        self.settings = settings
        self.ports = ports
        self.index = index
        self._orphans: dict[tuple[str, str], Intent] = {}
        self._orphan_streams_read: set[str] = set()
        self._queued: list[Outcome] = []
        self._queued_intents: set[Intent] = set()
        self._not_before: dict[Intent, dt.datetime] = {}
        self._failures: dict[Intent, int] = {}
        #: The error code of each failed pool delete's last try (its kind of refusal).
        self._refusals: dict[Intent, str] = {}
        self._deleting: dict[Intent, str] = {}  # delete in progress: operation id or ""
        self._next_sweep: dt.datetime | None = None
        #: Each cluster's workers (None or inline: effects run on the tick's thread).
        self.calls = calls
        #: The handlers' reads, told when an effect on a cluster has landed.
        self.reads = reads
        self._lock = threading.RLock()
        self._in_flight: set[Intent] = set()

    # ------------------------------------------------------------ tick interface
    def take_outcomes(self) -> tuple[Outcome, ...]:
        """Hand the queued outcomes to the tick about to run (they are its inputs)."""
        with self._lock:
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
        return sorted([*self.index.intents(), *self._orphans.values()])

    def open_orphans(self) -> frozenset[tuple[str, str]]:
        """(cluster id, pool name) of orphans found and not yet deleted."""
        return frozenset(self._orphans)

    def is_open(self, intent: Intent) -> bool:
        if intent.kind == IntentKind.ORPHAN_DELETE:
            return self._orphans.get((intent.cluster_id, intent.name)) == intent
        return intent in self.index.intents_of(intent.stream_id)

    def sweep_due(self, now: dt.datetime) -> bool:
        return self._next_sweep is None or now >= self._next_sweep

    def swept(self, now: dt.datetime) -> None:
        self._next_sweep = now + dt.timedelta(seconds=self.settings.lifecycle.orphan_sweep_seconds)

    def next_due(self) -> dt.datetime | None:
        """The earliest moment an open intent will be tried again (for a loop that
        jumps virtual time to the next thing to do)."""
        with self._lock:
            moments = [m for i, m in self._not_before.items()
                       if self.is_open(i) and i not in self._queued_intents
                       and i not in self._in_flight]
        if self._next_sweep is not None:
            moments.append(self._next_sweep)
        return min(moments) if moments else None

    def after_commit(self, ctx: SeesClusters, recorded: Sequence[RecordedEvent]) -> None:
        """The tick's events are durable: bring the open intents up to date and do them.
        Of the tick's context only the clusters are read (so the executor needs not
        know the context that names it)."""
        now = self.ports.clock.now()
        clusters = {c.id: c for c in ctx.clusters}
        self._load_orphan_streams(clusters)
        self._fold_orphans(recorded)
        for intent in self._due(now):
            cluster = clusters.get(intent.cluster_id)
            if cluster is None:
                log.error("intent %s names cluster %s, which is not registered", intent,
                          intent.cluster_id)
                self._later(intent, now)
                continue
            self._start(intent, cluster, now)

    def _start(self, intent: Intent, cluster: Cluster, now: dt.datetime) -> None:
        """Perform the intent: here, or on its cluster's workers."""
        if self.calls is None or self.calls.inline:
            self._perform(intent, cluster, now)
            return
        with self._lock:
            self._in_flight.add(intent)
        self.calls.submit(cluster, lambda: self._perform_on_worker(intent, cluster, now))

    def _perform_on_worker(self, intent: Intent, cluster: Cluster, now: dt.datetime) -> None:
        try:
            self._perform(intent, cluster, now)
        except Exception:
            self._later_unrecorded(intent, now, None)  # not again at once: a bug
            raise
        finally:
            with self._lock:
                self._in_flight.discard(intent)
            if self.reads is not None:
                self.reads.effect_done(cluster.id)

    # ------------------------------------------------------------- bookkeeping
    def _load_orphan_streams(self, clusters: Mapping[str, Cluster]) -> None:
        for cluster_id in clusters:
            stream_id = orphan_stream(cluster_id)
            if stream_id in self._orphan_streams_read:
                continue
            self._orphan_streams_read.add(stream_id)
            start = self.orphans_from(stream_id) if self.orphans_from is not None else 1
            if start is not None:
                self._fold_orphans(self.store.read_stream(stream_id, from_version=start))

    def _fold_orphans(self, recorded: Iterable[RecordedEvent]) -> None:
        for record in recorded:
            event = record.event
            if isinstance(event, ev.OrphanPoolFound):
                self._orphans[(event.cluster_id, event.pool_name)] = Intent(
                    IntentKind.ORPHAN_DELETE, record.stream_id, event.pool_name, event.cluster_id)
            elif isinstance(event, ev.OrphanPoolDeleted):
                self._orphans.pop((event.cluster_id, event.pool_name), None)

    def _due(self, now: dt.datetime) -> list[Intent]:
        with self._lock:
            return self._due_locked(now)

    def _due_locked(self, now: dt.datetime) -> list[Intent]:
        intents = [*self.index.intents(), *self._orphans.values()]
        live = set(intents)
        for stale in [i for i in self._not_before if i not in live]:
            del self._not_before[stale]
            self._failures.pop(stale, None)
            self._refusals.pop(stale, None)
        for stale in [i for i in self._deleting if i not in live]:
            del self._deleting[stale]
        for intent in intents:
            if intent not in self._not_before:
                self._resume_recorded_retry(intent)
        return sorted(
            i for i in intents
            if i not in self._queued_intents and i not in self._in_flight
            and self._not_before.get(i, now) <= now
        )

    def _resume_recorded_retry(self, intent: Intent) -> None:
        """A call the log says failed and is due again later (``ApiCallRetrying``, a
        failed pool delete) waits for that moment, also in a controller that has just
        started."""
        state = self.tasks.get(intent.stream_id) if intent.kind != IntentKind.ORPHAN_DELETE else None
        due = call_retry_due_at(state, intent.kind) if state is not None else None
        if state is not None and intent.kind == IntentKind.POOL_DELETE:
            due = due or retry_due_at(state, DELETE_FAILED, self.settings.retry)
        if due is not None:
            self._not_before[intent] = due

    @_locked
    def _queue(self, intent: Intent, event: ev.Event, now: dt.datetime) -> None:
        self._queued.append(Outcome(intent, event))
        self._queued_intents.add(intent)
        self._failures.pop(intent, None)
        self._deleting.pop(intent, None)
        # Should the outcome not make it into the log, try again a little later.
        self._not_before[intent] = now + dt.timedelta(seconds=UNRECORDED_RETRY_SECONDS)

    @_locked
    def _later(self, intent: Intent, now: dt.datetime, error: PortError | None = None) -> None:
        """A transient failure: the intent stays open and is tried again after the
        backoff of the API it calls. A task's failed call is recorded (so its Message
        shows the attempt) and, once a create or submit has used up its attempts,
        becomes its definite failure."""
        state = self.tasks.get(intent.stream_id) if intent.kind != IntentKind.ORPHAN_DELETE else None
        if state is None or error is None:
            self._later_unrecorded(intent, now, error)
            return
        retrying = call_failed(state, intent.kind, error.message, self.settings.retry)
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

    @_locked
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
        if intent.kind == IntentKind.POOL_CREATE:
            return ev.NodePoolFailed(intent.name, words)
        return ev.JobSubmitFailed(intent.name, words)

    # ------------------------------------------------------------------ effects
    def _perform(self, intent: Intent, cluster: Cluster, now: dt.datetime) -> None:
        if intent.kind == IntentKind.ORPHAN_DELETE:
            self._delete_pool(intent, cluster, now, None)
            return
        state = self.tasks.get(intent.stream_id)
        if state is None:
            return
        try:
            if intent.kind == IntentKind.POOL_CREATE:
                self._create_pool(intent, state, cluster, now)
            elif intent.kind == IntentKind.JOB_SUBMIT:
                self._submit_job(intent, state, cluster, now)
            elif intent.kind == IntentKind.JOB_DELETE:
                self.ports.edges.for_cluster(cluster).delete_job(intent.name,
                                                                 workload_kind(state))
                self._queue(intent, ev.JobDeleted(intent.name), now)
            elif intent.kind == IntentKind.POOL_DELETE and len(state.pool.deleting) > 1:
                self._delete_group(intent, cluster, now, state)
            elif intent.kind == IntentKind.POOL_DELETE:
                self._delete_pool(intent, cluster, now, state)
        except PortError as error:
            self._later(intent, now, error)

    def _create_pool(self, intent: Intent, state: TaskState, cluster: Cluster,
                     now: dt.datetime) -> None:
        """Create the task's pool (a multi-slice task's pools, one after another: a
        re-issued create adopts those an earlier attempt made; a partial create's
        request names the slices it creates)."""
        request = state.pool.request
        assert request is not None  # a create intent is open only once one was asked for
        supply_mode = request.supply_mode
        operations: list[str] = []
        group = naming.pool_group(intent.name, request.slices)
        zone = cluster.node_zone
        if zone is None:
            self._queue(intent, ev.NodePoolFailed(intent.name, missing_node_zone(
                cluster.name, cluster.location)), now)
            return
        for name in group[request.first_slice:request.upto or len(group)]:
            spec = NodePoolSpec(
                cluster=cluster,
                name=name,
                shape=state.shape,
                supply_mode=supply_mode,
                reservation=request.reservation,
                scale_down_unneeded_seconds=request.scale_down_unneeded_seconds,
                labels=pool_labels(state.task_id, state.submission.topology, supply_mode),
                locations=(zone,),
            )
            try:
                operations.append(self.ports.node_pools.create(spec).id)
            except PortError as error:
                if error.code == ALREADY_EXISTS:
                    if not self._adopt_pool(intent, name, state, cluster, now):
                        return
                    operations.append("")
                elif error.code == RETRYABLE:
                    self._later(intent, now, error)
                    return
                else:
                    self._queue(intent, ev.NodePoolFailed(name, error.message), now)
                    return
        self._queue(intent, ev.NodePoolCreateStarted(intent.name, operations[0],
                                                     tuple(operations[1:])), now)

    def _adopt_pool(self, intent: Intent, name: str, state: TaskState, cluster: Cluster,
                    now: dt.datetime) -> bool:
        """The pool exists: True when it is ours (an earlier controller created it);
        someone else's fails the create, and a look that failed tries again later."""
        try:
            info = self.ports.node_pools.get(cluster, name)
        except PortError as error:
            if error.code == NOT_FOUND:
                # GKE lists a just-created pool late: no failed call, only a wait.
                self._later_unrecorded(intent, now, error)
            else:
                self._later(intent, now, error)
            return False
        owner = info.labels.get(POOL_TASK_LABEL)
        if naming.owned_by(pool_owner(info.labels), state.task_id):
            return True
        self._queue(intent, ev.NodePoolFailed(
            name,
            f"a node pool named {name} already exists on {cluster.name} and is not "
            f"this task's (falcon-task={owner or 'unset'})",
        ), now)
        return False

    def _submit_job(self, intent: Intent, state: TaskState, cluster: Cluster,
                    now: dt.datetime) -> None:
        edge = self.ports.edges.for_cluster(cluster)
        kind = workload_kind(state)
        if state.status == chart.ABORTING:
            existing = edge.get_job(intent.name, kind)
            if existing is not None and naming.owned_by(existing.owner, state.task_id):
                self._queue(intent, ev.JobSubmitted(intent.name, existing.uid), now)
            else:
                self._queue(intent, ev.JobSubmitCancelled(intent.name), now)
            return
        try:
            ref = edge.submit_job(render_task_job(state, cluster, self.settings))
        except PortError as error:
            if error.code == ALREADY_EXISTS:
                existing = edge.get_job(intent.name, kind)
                if existing is None:
                    self._later(intent, now, error)
                elif naming.owned_by(existing.owner, state.task_id):
                    self._queue(intent, ev.JobSubmitted(intent.name, existing.uid), now)
                else:
                    self._queue(intent, ev.JobSubmitFailed(
                        intent.name,
                        f"a Job named {intent.name} already exists and is not this task's "
                        f"(falcon-task={existing.task_label or 'unset'})",
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
                self._in_progress(intent, "", now)
            else:
                self._delete_failed(intent, now, state, error)
            return
        self._operation_progress(intent, operation, now, state)

    def _delete_group(self, intent: Intent, cluster: Cluster, now: dt.datetime,
                      state: TaskState) -> None:
        """Delete the pools of one request (of a multi-slice task): each look asks for
        the delete of every pool still there that GKE is not deleting yet, and the
        request is done once none is left (looked at every ``operation_poll_seconds``)."""
        pools = self.ports.node_pools
        left = 0
        try:
            for name in state.pool.deleting:
                try:
                    if pools.get(cluster, name).status != "STOPPING":
                        pools.delete(cluster, name)
                except PortError as error:
                    if error.code == NOT_FOUND:
                        continue  # gone (or gone between the look and the delete)
                    raise
                left += 1
        except PortError as error:
            if error.code == RETRYABLE:
                self._in_progress(intent, "", now)
            else:
                self._delete_failed(intent, now, state, error)
            return
        if left:
            self._in_progress(intent, "", now)
        else:
            self._deleted(intent, now)

    def _follow_delete(self, intent: Intent, cluster: Cluster, now: dt.datetime,
                       state: TaskState | None) -> None:
        operation_id = self._deleting.get(intent, "")
        if operation_id:
            try:
                operation = self.ports.node_pools.get_operation(cluster, operation_id)
            except PortError as error:
                if error.code != NOT_FOUND:
                    raise
                # GKE keeps operations for a limited time, and one can be unknown after
                # a long outage: the pool itself says how the delete went.
                log.warning("delete operation %s of pool %s on %s is unknown to GKE; "
                            "looking at the pool", operation_id, intent.name,
                            intent.cluster_id)
            else:
                self._operation_progress(intent, operation, now, state)
                return
        try:
            pool = self.ports.node_pools.get(cluster, intent.name)
        except PortError as error:
            if error.code == NOT_FOUND:
                self._deleted(intent, now)
                return
            raise
        if pool.status == "STOPPING":
            self._in_progress(intent, "", now)
        else:
            # Not being deleted (the delete was lost, or the pool came back): ask again.
            with self._lock:
                self._deleting.pop(intent, None)
                self._not_before.pop(intent, None)

    def _operation_progress(self, intent: Intent, operation: Operation | None,
                            now: dt.datetime, state: TaskState | None) -> None:
        if operation is None:
            self._deleted(intent, now)
        elif not operation.done:
            self._in_progress(intent, operation.id, now)
        elif operation.error:
            self._delete_failed(intent, now, state, PortError(
                operation.error_code or "FAILED", operation.error))
        else:
            self._deleted(intent, now)

    @_locked
    def _in_progress(self, intent: Intent, operation_id: str, now: dt.datetime) -> None:
        """A delete GKE is carrying out: looked at again every ``operation_poll_seconds``
        (each look is a call against the project's GKE quota; GKE tells nobody when an
        operation ends)."""
        self._deleting[intent] = operation_id
        self._not_before[intent] = now + dt.timedelta(
            seconds=self.settings.lifecycle.operation_poll_seconds)

    def _is_stopping(self, cluster: Cluster, name: str) -> bool:
        try:
            return self.ports.node_pools.get(cluster, name).status == "STOPPING"
        except PortError:
            return False

    def _deleted(self, intent: Intent, now: dt.datetime) -> None:
        if intent.kind == IntentKind.ORPHAN_DELETE:
            self._queue(intent, ev.OrphanPoolDeleted(intent.cluster_id, intent.name), now)
        else:
            state = self.tasks.get(intent.stream_id)
            others = state.pool.deleting[1:] if state is not None else ()
            self._queue(intent, ev.NodePoolDeleted(intent.name, others), now)

    def _delete_failed(self, intent: Intent, now: dt.datetime, state: TaskState | None,
                       error: PortError) -> None:
        """A failed delete stays open and is tried again after the GKE backoff until
        the pool is gone. The try is recorded when GKE's kind of refusal (its error
        code) changed, or at a checkpoint of the count (``records_try``); otherwise it
        appends nothing (GKE's words vary from try to try: another operation's id, a
        quota or a conflict) and its number is kept here, where a restarted controller
        reconstructs it from the retry schedule (``scheduled_try``)."""
        if state is None:
            self._later(intent, now, error)
            return
        tried = self._failures.get(intent)
        attempt = tried + 1 if tried else scheduled_try(state, DELETE_FAILED,
                                                       self.settings.retry, now)
        shown = state.note_event
        same = (isinstance(shown, ev.NodePoolDeleteFailed) and shown.pool_name == intent.name
                and self._refusals.get(intent, error.code) == error.code)
        if not same or records_try(attempt):
            self._queue(intent, ev.NodePoolDeleteFailed(intent.name, error.message, attempt),
                        now)
        with self._lock:
            self._deleting.pop(intent, None)
            self._failures[intent] = attempt
            self._refusals[intent] = error.code
            self._not_before[intent] = now + wait_delay(state, DELETE_FAILED, attempt,
                                                        self.settings.retry)
