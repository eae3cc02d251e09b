"""Prometheus metrics of one Falcon-ES process.

Everything hangs off one ``Metrics`` object that the bootstrap creates, with its own
``CollectorRegistry``: two apps in one test process never share a counter, and there is
no module-level registry to reset.

Three kinds of metric, by where the number comes from:

- **state at scrape time** (tasks by status/reason, queue depth and running per
  (cluster, topology), node pools, node-pool hours): computed from the in-memory
  ``TaskStates`` and the node-pool source when Prometheus scrapes, so they can never
  drift from the log;
- **transitions** (submit->Running, submit->terminal, events appended, log head):
  observed by ``MetricsProjection`` once an append has committed, so a rolled-back tick
  is never counted;
- **calls and loop facts** (external API latency and errors, reservation remaining,
  lag, informer restarts, leader, ticks): pushed by the adapters and the run loop
  through the small methods below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import operator
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, Histogram, generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from falcon_es.domain import chart
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.observability.metered import METHOD_OF_STEP
from falcon_es.domain.task import TASK_EVENT_TYPES, TaskState

OK = "OK"
NO_CLUSTER = ""

#: Seconds from submission to Running / to the end: minutes to days.
TASK_SECONDS_BUCKETS = (
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0, 86400.0, 172800.0, 604800.0,
)
#: Seconds of one external API call: milliseconds (Kubernetes) to a minute (GKE).
CALL_SECONDS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
TICK_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

POOL_DELETED = "deleted"


@dataclasses.dataclass(frozen=True)
class PoolSample:
    """One falcon-* node pool as the node-pool view knows it."""

    cluster: str
    name: str
    topology: str
    supply_mode: str
    state: str  # creating | active | idle-retained | deleting | deleted
    owner_task: str | None = None
    created_at: dt.datetime | None = None
    deleted_at: dt.datetime | None = None


class ClusterLike(Protocol):
    """What the overview needs of a registered cluster (``falcon_es.domain.clusters.Cluster``, frozen:
    the attributes are only read)."""

    @property
    def name(self) -> str: ...
    @property
    def tpu_type(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def default_reservation(self) -> str | None: ...


TaskSource = Callable[[], Iterable[TaskState]]
PoolSource = Callable[[], Iterable[PoolSample]]


def _no_tasks() -> Iterable[TaskState]:
    return ()


def _no_pools() -> Iterable[PoolSample]:
    return ()


def error_code(error: BaseException) -> str:
    """A short, bounded label for a failed call: PortError codes, gRPC / HTTP status
    codes of the Google and Kubernetes clients, else the exception's class name."""
    for attribute in ("code", "status", "status_code"):
        value = getattr(error, attribute, None)
        if callable(value):
            with contextlib.suppress(Exception):
                value = value()
        if isinstance(value, enum.Enum):
            return str(value.name)
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value):
            return str(value)
    return type(error).__name__


@dataclasses.dataclass(frozen=True)
class QueueFigures:
    """One (cluster, topology) queue at one moment."""

    cluster: str
    topology: str
    depth: int  # Pending tasks assigned to the queue, the one acquiring included
    running: int
    acquiring_task: str | None


#: Leaf states whose task holds its queue's acquisition slot.
_SLOT_STATES = frozenset(
    state for state in chart.STATES
    if chart.status_of(state) == chart.PENDING and chart.pending_reason(state) in chart.SLOT_REASONS
)

_LABEL_FIELDS = operator.attrgetter("state", "ending.failure_reason", "placement.cluster_name",
                                    "submission.topology", "pool.supply_mode")
#: (state, failure_reason, cluster, topology, supply_mode) -> number of tasks.
Groups = Tally[tuple[str, str | None, str | None, str, str | None]]


def group_tasks(states: Iterable[TaskState]) -> tuple[Groups, dict[tuple[str, str], str]]:
    """Count tasks by their raw label fields, and find each queue's slot holder.

    One tuple per task and no property calls: a scrape walks every task the process
    knows (terminal ones included), so this loop is the cost of a scrape.
    """
    snapshot = states if isinstance(states, (list, tuple)) else list(states)
    groups: Groups = Tally(map(_LABEL_FIELDS, snapshot))
    holders = {
        (state.placement.cluster_name, state.submission.topology): state.task_id
        for state in snapshot
        if state.state in _SLOT_STATES and state.placement.cluster_name
    }
    return groups, holders


def queue_figures(states: Iterable[TaskState]) -> list[QueueFigures]:
    """Queue depth, running count and the slot holder per (cluster, topology)."""
    groups, holders = group_tasks(states)
    return _queues(groups, holders)


def _queues(groups: Groups, holders: dict[tuple[str, str], str]) -> list[QueueFigures]:
    depth: Tally[tuple[str, str]] = Tally()
    running: Tally[tuple[str, str]] = Tally()
    for (state, _, cluster, topology, _), count in groups.items():
        if not cluster:
            continue
        status = chart.status_of(state)
        if status == chart.PENDING:
            depth[(cluster, topology)] += count
        elif status == chart.RUNNING:
            running[(cluster, topology)] += count
    keys = sorted(set(depth) | set(running))
    return [QueueFigures(c, t, depth[(c, t)], running[(c, t)], holders.get((c, t)))
            for c, t in keys]


class StateCollector:
    """Metrics computed from the current task states and node pools at scrape time."""

    def __init__(
        self, tasks: TaskSource, pools: PoolSource, clock: Clock, *,
        min_interval: float = 0.0, monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tasks = tasks
        self._pools = pools
        self._clock = clock
        self._min_interval = min_interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cached: tuple[float, tuple[Metric, ...]] | None = None

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        """Compute the families, or reuse the last ones if computed within
        ``min_interval`` seconds: with a million tasks in memory a computation costs
        about a second of CPU, and two Prometheus replicas scrape every replica."""
        with self._lock:
            now = self._monotonic()
            if self._cached is not None and now - self._cached[0] < self._min_interval:
                return iter(self._cached[1])
            families = self._compute()
            self._cached = (now, families)
            return iter(families)

    def _compute(self) -> tuple[Metric, ...]:
        groups, holders = group_tasks(self._tasks())
        pools = list(self._pools())
        tasks, depth, running, acquiring, pool_count, pool_hours = self._families()
        by_labels: Tally[tuple[str, str, str, str, str]] = Tally()
        for (state, failure, cluster, topology, supply_mode), count in groups.items():
            status = chart.status_of(state)
            if status == chart.NEW:
                continue
            reason = (chart.pending_reason(state) if status == chart.PENDING
                      else failure if status == chart.FAILED else None)
            by_labels[(status, reason or "", cluster or NO_CLUSTER, topology,
                       supply_mode or "")] += count
        for labels, count in sorted(by_labels.items()):
            tasks.add_metric(labels, count)
        for queue in _queues(groups, holders):
            key = (queue.cluster, queue.topology)
            depth.add_metric(key, queue.depth)
            running.add_metric(key, queue.running)
            acquiring.add_metric(key, 1 if queue.acquiring_task else 0)
        now = self._clock.now()
        live: Tally[tuple[str, str, str, str]] = Tally()
        hours: dict[tuple[str, str, str], float] = {}
        for pool in pools:
            if pool.state != POOL_DELETED:
                live[(pool.cluster, pool.topology, pool.supply_mode, pool.state)] += 1
            if pool.created_at is not None:
                end = pool.deleted_at or now
                pool_key = (pool.cluster, pool.topology, pool.supply_mode)
                hours[pool_key] = hours.get(pool_key, 0.0) + max(0.0, (end - pool.created_at).total_seconds()) / 3600
        for pool_labels, count in sorted(live.items()):
            pool_count.add_metric(pool_labels, count)
        for hours_labels, value in sorted(hours.items()):
            pool_hours.add_metric(hours_labels, value)
        return (tasks, depth, running, acquiring, pool_count, pool_hours)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                             GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "falcon_tasks", "Tasks by Status and Reason (Reason is the Pending sub-state "
                "or why a task Failed).",
                labels=("status", "reason", "cluster", "topology", "supply_mode")),
            GaugeMetricFamily(
                "falcon_queue_depth", "Pending tasks in each (cluster, topology) queue, "
                "the one acquiring resources included.", labels=("cluster", "topology")),
            GaugeMetricFamily(
                "falcon_queue_running", "Running tasks per (cluster, topology).",
                labels=("cluster", "topology")),
            GaugeMetricFamily(
                "falcon_queue_acquiring", "1 when a task holds the queue's acquisition slot.",
                labels=("cluster", "topology")),
            GaugeMetricFamily(
                "falcon_node_pools", "falcon-* node pools that exist, by state.",
                labels=("cluster", "topology", "supply_mode", "state")),
            CounterMetricFamily(
                "falcon_node_pool_hours", "Hours node pools have existed (created to "
                "deleted, or to now).", labels=("cluster", "topology", "supply_mode")),
        )


class Metrics:
    """The process's metrics and the calls that feed them.

    ``tasks`` and ``pools`` are read at scrape time (from the HTTP server's thread):
    pass callables that return a snapshot, such as ``app.tasks.all``.
    """

    def __init__(
        self,
        *,
        tasks: TaskSource = _no_tasks,
        pools: PoolSource = _no_pools,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        process_collectors: bool = True,
        state_min_interval: float = 5.0,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock or WallClock()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._reservations: dict[tuple[str, str, str], tuple[int, dt.datetime]] = {}
        self._head = 0
        self._pools = pools
        self._tasks = tasks
        registry = self.registry
        if process_collectors:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        registry.register(StateCollector(tasks, pools, self._clock,
                                         min_interval=state_min_interval, monotonic=monotonic))

        self.submit_to_running = Histogram(
            "falcon_task_submit_to_running_seconds",
            "Seconds from a task's submission to its pods Running.",
            ("cluster", "topology", "supply_mode"), buckets=TASK_SECONDS_BUCKETS,
            registry=registry)
        self.submit_to_terminal = Histogram(
            "falcon_task_submit_to_terminal_seconds",
            "Seconds from a task's submission to Succeeded, Failed or Aborted.",
            ("status", "reason", "topology"), buckets=TASK_SECONDS_BUCKETS, registry=registry)
        self.events_appended_total = Counter(
            "falcon_events_appended", "Events committed to the log, by type.",
            ("type",), registry=registry)
        self.log_head = Gauge(
            "falcon_log_head_seq", "Highest seq this process has committed or seen.",
            registry=registry)
        self.lag = Gauge(
            "falcon_lag_events", "Events a consumer (projection, outbox publisher) is "
            "behind the log head.", ("consumer",), registry=registry)
        self.call_seconds = Histogram(
            "falcon_external_call_seconds", "Latency of GKE, Compute, Kubernetes and "
            "Pub/Sub calls.", ("api", "method", "code"), buckets=CALL_SECONDS_BUCKETS,
            registry=registry)
        self.call_errors = Counter(
            "falcon_external_call_errors", "External calls that failed, by API, method "
            "and error code.", ("api", "method", "code"), registry=registry)
        self.call_retries = Counter(
            "falcon_external_call_retries", "Retries scheduled after a failed external "
            "call.", ("api", "method"), registry=registry)
        self.reservation_remaining = Gauge(
            "falcon_reservation_remaining_slices", "Slices of a topology a reservation "
            "can still hold, as last read from Compute.",
            ("cluster", "reservation", "topology"), registry=registry)
        self.informer_restarts = Counter(
            "falcon_informer_watch_restarts", "Informer watches restarted (410 Gone "
            "relist, dropped connection, expired token, resync).",
            ("cluster", "reason"), registry=registry)
        self.edge_observations = Counter(
            "falcon_edge_observations", "Edge Job observations received from the bus, "
            "by what became of them.", ("cluster", "outcome"), registry=registry)
        self.job_rows_ignored = Counter(
            "falcon_job_rows_ignored", "Job rows Falcon-ES will not take, each counted once "
            "per process: a status it does not know, a status it writes on a row it never "
            "took in, an abort on an id longer than the log's stream_id, a priority "
            "request it refused.", ("reason",),
            registry=registry)
        self.job_rows_diverged = Counter(
            "falcon_job_rows_diverged", "Job rows found to differ from the log, each "
            "finding of a task counted once: found deleted (gone while the task runs), "
            "replaced (the "
            "id reused by another submission), spec-changed (the accepted spec runs).",
            ("found",), registry=registry)
        self.leader = Gauge(
            "falcon_leader", "1 while this replica holds the lease and runs the loop, "
            "0 on standby.", registry=registry)
        self.ticks = Counter("falcon_ticks", "Controller ticks run.", registry=registry)
        self.tick_conflicts = Counter(
            "falcon_tick_conflicts", "Ticks whose append lost a race (optimistic "
            "concurrency) and were dropped.", registry=registry)
        self.tick_seconds = Histogram(
            "falcon_tick_duration_seconds", "Duration of one controller tick.",
            buckets=TICK_SECONDS_BUCKETS, registry=registry)
        self.last_tick = Gauge(
            "falcon_last_tick_timestamp_seconds", "Unix time of the last completed tick.",
            registry=registry)
        self.api_unanswered = Gauge(
            "falcon_cluster_api_unanswered", "1 while a cluster's API (kubernetes, gke, "
            "compute) has not answered its last call (no connection, nothing within the "
            "deadline), else 0.", ("cluster", "api"), registry=registry)
        self.api_last_answer = Gauge(
            "falcon_cluster_api_last_answer_timestamp_seconds", "Unix time a cluster's "
            "API last answered a call.", ("cluster", "api"), registry=registry)

    # ------------------------------------------------------------ external calls
    def observe_call(self, api: str, method: str, code: str, seconds: float) -> None:
        """One call to an external API; ``code`` is ``OK`` or the error's code."""
        self.call_seconds.labels(api, method, code).observe(max(0.0, seconds))
        if code != OK:
            self.call_errors.labels(api, method, code).inc()

    @contextlib.contextmanager
    def timed_call(self, api: str, method: str) -> Iterator[None]:
        """Time the body as a call to ``api.method``; an exception is counted with its
        code and re-raised."""
        started = self._monotonic()
        try:
            yield
        except BaseException as error:
            self.observe_call(api, method, error_code(error), self._monotonic() - started)
            raise
        self.observe_call(api, method, OK, self._monotonic() - started)

    def retry_scheduled(self, api: str, method: str) -> None:
        self.call_retries.labels(api, method).inc()

    # ------------------------------------------------------------ world facts
    def set_reservation_remaining(
        self, cluster: str, reservation: str, topology: str, slices: int,
        observed_at: dt.datetime | None = None,
    ) -> None:
        self.reservation_remaining.labels(cluster, reservation, topology).set(slices)
        with self._lock:
            self._reservations[(cluster, reservation, topology)] = (
                slices, observed_at or self._clock.now())

    def informer_restarted(self, cluster: str, reason: str) -> None:
        self.informer_restarts.labels(cluster, reason).inc()

    def edge_observation(self, cluster: str, outcome: str) -> None:
        """``outcome``: applied, stale, unknown-task, held, malformed."""
        self.edge_observations.labels(cluster, outcome).inc()

    def job_row_ignored(self, reason: str) -> None:
        """``reason``: unknown-status, not-taken-in, id-too-long (the inbox's)."""
        self.job_rows_ignored.labels(reason).inc()

    def job_row_diverged(self, found: str) -> None:
        """``found``: a ``JobRowDiverged.found`` (the row check's)."""
        self.job_rows_diverged.labels(found).inc()

    def edge_observations_folded(self, ctx: Any, recorded: Sequence[Any]) -> None:
        """After-commit step: count what became of the tick's edge observations."""
        for cluster, outcome in ctx.edge_outcomes:
            self.edge_observation(cluster, outcome)

    # ------------------------------------------------------------ the loop
    def observe_cluster_apis(self, last_answers: Mapping[tuple[str, str], dt.datetime],
                             unanswered: Iterable[tuple[str, str]]) -> None:
        """Each cluster API's last answer, and which of them answer nothing now."""
        silent = set(unanswered)
        for (cluster, api), at in last_answers.items():
            self.api_last_answer.labels(cluster, api).set(at.replace(tzinfo=dt.UTC).timestamp())
        for key in {*last_answers, *silent}:
            self.api_unanswered.labels(*key).set(1 if key in silent else 0)

    def set_leader(self, is_leader: bool) -> None:
        self.leader.set(1 if is_leader else 0)

    def set_lag(self, consumer: str, events_behind: int) -> None:
        self.lag.labels(consumer).set(max(0, events_behind))

    def observe_tick(self, seconds: float, *, conflicts: int = 0) -> None:
        self.ticks.inc()
        self.tick_seconds.observe(max(0.0, seconds))
        if conflicts:
            self.tick_conflicts.inc(conflicts)
        self.last_tick.set(time.time())

    def observe_head(self, seq: int) -> None:
        """Record the log head seen (catch-up reads, another writer's appends)."""
        with self._lock:
            if seq <= self._head:
                return
            self._head = seq
        self.log_head.set(seq)

    # ------------------------------------------------------------ committed appends
    def committed(self, records: Sequence[Any], transitions: Iterable[Transition]) -> None:
        """An append committed: count its events and observe its task transitions."""
        by_type: Tally[str] = Tally(record.type_name for record in records)
        for type_name, count in by_type.items():
            self.events_appended_total.labels(type_name).inc(count)
        for record in records:
            if record.type_name == "ApiCallRetrying":
                event = record.event
                self.retry_scheduled(event.api, METHOD_OF_STEP.get(event.step, event.step))
            elif record.type_name == "ReservationRead":
                read = record.event
                self.set_reservation_remaining(read.cluster, read.reservation, read.topology,
                                               read.slices, observed_at=record.recorded_at)
        if records:
            self.observe_head(max(record.seq for record in records))
        for transition in transitions:
            transition.observe(self)

    def projection(self, tasks: Any) -> MetricsProjection:
        """The inline projection to add to the ``EventStore`` (after the TaskStates)."""
        return MetricsProjection(self, tasks)

    # ------------------------------------------------------------ reading
    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)

    def cluster_overview(self, clusters: Iterable[ClusterLike]) -> list[dict[str, Any]]:
        """Per registered cluster: reservation remaining, active pools with topology,
        queue depths and running counts (``falcon-es clusters`` and ``/clusters``)."""
        queues = queue_figures(self._tasks())
        pools = [p for p in self._pools() if p.state != POOL_DELETED]
        with self._lock:
            reservations = dict(self._reservations)
        overview = []
        for cluster in clusters:
            overview.append({
                "name": cluster.name,
                "tpu_type": cluster.tpu_type,
                "status": cluster.status,
                "default_reservation": cluster.default_reservation,
                "reservation_remaining": [
                    {"reservation": reservation, "topology": topology, "slices": slices,
                     "observed_at": observed_at.isoformat()}
                    for (name, reservation, topology), (slices, observed_at)
                    in sorted(reservations.items()) if name == cluster.name
                ],
                "pools": [
                    {"name": p.name, "topology": p.topology, "supply_mode": p.supply_mode,
                     "state": p.state, "owner_task": p.owner_task}
                    for p in sorted(pools, key=lambda p: p.name) if p.cluster == cluster.name
                ],
                "queues": [
                    {"topology": q.topology, "depth": q.depth, "running": q.running,
                     "acquiring_task": q.acquiring_task}
                    for q in queues if q.cluster == cluster.name
                ],
            })
        return overview


@dataclasses.dataclass(frozen=True)
class Transition:
    """A task reached Running or a terminal status in a committed append."""

    state: TaskState  # the task after the append (labels, submitted_at)
    status: str
    at: dt.datetime

    def observe(self, metrics: Metrics) -> None:
        submitted = self.state.submission.submitted_at
        if submitted is None:
            return
        seconds = max(0.0, (self.at - submitted).total_seconds())
        if self.status == chart.RUNNING:
            metrics.submit_to_running.labels(
                self.state.placement.cluster_name or NO_CLUSTER, self.state.submission.topology,
                self.state.pool.supply_mode or "").observe(seconds)
        else:
            reason = (self.state.ending.failure_reason or "") if self.status == chart.FAILED else ""
            metrics.submit_to_terminal.labels(
                self.status, reason, self.state.submission.topology).observe(seconds)


class MetricsProjection:
    """Observes transitions at commit time, as an inline projection of the store.

    Reads each task's state before the append from the ``TaskStates`` (its staged
    change when that projection ran first, the committed state otherwise) and walks
    the appended events through the compiled chart, so a task that goes Pending ->
    Running -> Succeeded within one tick is observed at both steps.
    """

    def __init__(self, metrics: Metrics, tasks: Any) -> None:
        self._metrics = metrics
        self._tasks = tasks
        self._records: list[Any] = []
        self._crossings: list[tuple[str, str, dt.datetime]] = []

    def apply(self, conn: Any, recorded: Sequence[Any]) -> None:
        self._records.extend(recorded)
        before = {change.after.task_id: change.before for change in self._tasks.changes()}
        current: dict[str, str] = {}
        for record in recorded:
            if record.type_name not in TASK_EVENT_TYPES:
                continue
            stream = record.stream_id
            if stream not in current:
                start = before.get(stream) or self._tasks.get(stream) or TaskState(stream)
                current[stream] = start.state
            previous = chart.status_of(current[stream])
            target = chart.next_state(stream, current[stream], record.type_name)
            status = chart.status_of(target)
            current[stream] = target
            if status != previous and (status == chart.RUNNING or status in chart.TERMINAL_STATUSES):
                self._crossings.append((stream, status, record.recorded_at))

    def committed(self) -> None:
        # Resolved here, not in apply: whichever order the projections ran in, every
        # one has applied by now, so the TaskStates holds each task's state after the
        # append (labels, submitted_at).
        transitions = [
            Transition(state, status, at)
            for stream, status, at in self._crossings
            if (state := self._tasks.get(stream)) is not None
        ]
        records = self._records
        self._records, self._crossings = [], []
        self._metrics.committed(records, transitions)

    def discarded(self) -> None:
        self._records, self._crossings = [], []
