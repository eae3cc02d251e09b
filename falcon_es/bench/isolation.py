"""``falcon-es bench isolation``: one sick cluster must not slow the others down.

The gcp backend (the real google-cloud-container, google-cloud-compute and kubernetes
clients) runs over local fake servers fronting one simulated world with two edge
clusters: ``edge-a`` (v6e) and ``edge-b`` (v5e), tasks submitted to both at once. The
run is made twice in one invocation: with every API answering (the baseline), and with
``edge-b``'s Kubernetes API hung (it reads each request and never answers). Reported:
``edge-a``'s time until all its tasks are Running and the tick p99, each as a ratio of
the sick run to the baseline (targets: 1.5 at most, and a tick p99 of at most 1 s),
and how the sick cluster's tasks said why they wait.

The fake servers are the tests' (``tests/fakes``): the command runs from a source
checkout, and the test suite runs it small (``tests/test_bench_isolation.py``). Time is
the wall clock's, as the controller's is on the gcp backend: each call's deadline is
real (``calls.read_timeout_seconds``, lowered here so a run takes seconds).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from google.oauth2 import service_account

from falcon_es.adapters.gcp.gke import CLOUD_PLATFORM_SCOPE
from falcon_es.adapters.gcp.informer import InformerSettings
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.wiring import build_cloud_clients
from falcon_es.domain.spec import SUPPLY_MODES
from falcon_es.adapters.sim import ClusterBehaviour, SimClusterConfig, SimConfig, SimWorld
from falcon_es.adapters.sim.config import JobDefaults, ReservationConfig, Span
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.app.service import Service
from falcon_es.config.retry import Backoff
from falcon_es.config.settings import Settings
from falcon_es.domain import chart
from falcon_es.domain.clock import WallClock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import BusMessage, Ports
from falcon_es.jobtable import job_rows
from falcon_es.storage import db
from falcon_es.storage.tables import JobTable

HEALTHY, SICK = "edge-a", "edge-b"
TPU_OF = MappingProxyType({HEALTHY: "v6e", SICK: "v5e"})
PROJECT = "bench-isolation"
#: A world whose pools and nodes come in fractions of a second, so a run is short.
FAST = ClusterBehaviour(
    create_latency=MappingProxyType({mode: Span(0.2, 0.2) for mode in SUPPLY_MODES}),
    delete_latency=Span(0.1, 0.1),
    visibility_delay=MappingProxyType({mode: Span(0, 0) for mode in SUPPLY_MODES}),
    node_register_delay=MappingProxyType({mode: Span(0.1, 0.1) for mode in SUPPLY_MODES}),
    node_ready_lag=Span(0.05, 0.05),
)
SPEC: Mapping[str, Any] = MappingProxyType({
    "image": "us-docker.pkg.dev/p/r/train:1", "topology": "2x2",
    "command": ["python", "train.py"], "sim": {"duration_seconds": 3600},
})
#: The informers reconnect fast: the sick cluster's watches fail at their deadline.
INFORMER_BACKOFF = Backoff(initial=0.05, maximum=0.5, multiplier=2.0, jitter=0.0, attempts=1)


class KubeServer(Protocol):
    """An edge cluster's fake API server."""

    def hang(self) -> None: ...
    def release(self) -> None: ...


class FakeCloud(Protocol):
    """The fake servers fronting one world (``tests.fakes.sim_backed.SimBackedCloud``)."""

    kube: Mapping[str, KubeServer]
    authority: Any

    def environment(self, key_file: Path) -> dict[str, str]: ...
    def step(self) -> None: ...
    def start_informer(self, cluster: Cluster, edges: KubeEdgeClusters, bus: Any,
                       settings: InformerSettings) -> None: ...
    def stop(self) -> None: ...


#: Starts the fake servers of a world.
CloudFactory = Callable[[SimWorld], FakeCloud]


class MemoryBus:
    """The edge-events bus of a run: the informers publish, the controller pulls (the
    bus is not what this benchmark measures, so no Pub/Sub emulator is needed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[BusMessage] = []
        self._ids = 0

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        with self._lock:
            self._ids += 1
            message = BusMessage(str(self._ids), dict(data), dict(attributes or {}))
            self._messages.append(message)
            return message.id

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        with self._lock:
            return list(self._messages[:max_messages])

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        done = set(message_ids)
        with self._lock:
            self._messages = [m for m in self._messages if m.id not in done]


@dataclasses.dataclass(frozen=True)
class RunResult:
    sick: bool
    #: Seconds from the submits until every task of the healthy cluster was Running
    #: (None: not within the run's limit).
    healthy_to_running: float | None
    ticks: tuple[float, ...]
    #: The sick cluster's tasks' Messages at the end (task id -> Message).
    sick_messages: Mapping[str, str]
    #: What /healthz would add: the cluster APIs that did not answer.
    unanswered: tuple[str, ...]
    #: Requests the sick API server received and never answered.
    unanswered_requests: int

    @property
    def tick_p99(self) -> float:
        return percentile(self.ticks, 0.99)


def percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def world_config() -> SimConfig:
    clusters = tuple(SimClusterConfig(
        name=name, project="proj", location="us-east5-b", tpu_types=(tpu,),
        gcs_bucket="logs-bucket", default_reservation=f"{name}-r",
        reservations=(ReservationConfig(f"{name}-r", 256, 0),), behaviour=FAST)
        for name, tpu in TPU_OF.items())
    return SimConfig(seed=7, clusters=clusters, defaults=FAST,
                     jobs=JobDefaults(pod_start=Span(0.1, 0.1)))


def run_once(cloud_factory: CloudFactory, directory: Path, *, sick: bool, tasks: int,
             deadline_seconds: float, limit_seconds: float) -> RunResult:
    """One run: ``tasks`` tasks on each cluster, until the healthy cluster's are all
    Running (or ``limit_seconds``); with ``sick``, the sick cluster's API hangs first."""
    clock = WallClock()
    world = SimWorld(clock, world_config())
    cloud = cloud_factory(world)
    try:
        return _run(cloud, world, directory, sick=sick, tasks=tasks,
                    deadline_seconds=deadline_seconds, limit_seconds=limit_seconds)
    finally:
        cloud.stop()


def _run(cloud: FakeCloud, world: SimWorld, directory: Path, *, sick: bool, tasks: int,
         deadline_seconds: float, limit_seconds: float) -> RunResult:
    key = cloud.authority.service_account_file(directory, PROJECT)
    environment = cloud.environment(key)
    url = f"sqlite:///{directory / ('sick' if sick else 'baseline')}.db"
    engine = db.make_engine(url)
    db.upgrade(engine)
    settings = Settings.of(
        db_url=url, gke_endpoint=environment["FALCON_GKE_ENDPOINT"],
        gke_transport=environment["FALCON_GKE_TRANSPORT"],
        compute_endpoint=environment["FALCON_COMPUTE_ENDPOINT"], pubsub_project=PROJECT,
        read_timeout_seconds=deadline_seconds, connect_timeout_seconds=deadline_seconds,
        # Looks at the world at the pace of its fast pools, so a run takes seconds.
        operation_poll_seconds=1, wait_initial=0.2, wait_maximum=0.5, wait_jitter=0.0)
    db.create_job_table(engine, JobTable())
    engine.dispose()
    app = open_app(settings, world.clock)
    clusters = register_sim_clusters(app, world.config)
    credentials = service_account.Credentials.from_service_account_file(
        str(key), scopes=[CLOUD_PLATFORM_SCOPE])
    backend = build_cloud_clients(settings, credentials, world.clock)
    bus = MemoryBus()
    ports = Ports(node_pools=backend.node_pools, reservations=backend.reservations,
                  edges=backend.edges, bus=bus, clock=world.clock)
    svc = build_service(app, ports, RunOptions(backend="gcp", isolate_clusters=True))
    try:
        for cluster in clusters:
            cloud.start_informer(cluster, backend.edges, bus, InformerSettings(
                topic=settings.bus.edge_events_topic, resync_seconds=3600,
                backoff=INFORMER_BACKOFF))
        if sick:
            cloud.kube[SICK].hang()
        return _drive(svc, cloud, sick=sick, tasks=tasks, limit_seconds=limit_seconds)
    finally:
        if sick:
            cloud.kube[SICK].release()  # so its informer sees the stop and ends
        svc.close()
        backend.close()


def _drive(svc: Service, cloud: FakeCloud, *, sick: bool, tasks: int,
           limit_seconds: float) -> RunResult:
    app = svc.app
    ids = {name: [f"{name}-{i}" for i in range(tasks)] for name in TPU_OF}
    for name, tpu in TPU_OF.items():
        for task_id in ids[name]:
            job_rows.submit(app.engine, name=task_id, actor="bench",
                            spec={**SPEC, "tpu_type": tpu}, now=app.clock.now(),
                            task_id=task_id, job=app.job)
    started = time.monotonic()
    ticks: list[float] = []
    to_running: float | None = None
    landed = svc.calls.landed if svc.calls is not None else threading.Event()
    while time.monotonic() - started < limit_seconds:
        cloud.step()
        report = svc.loop.step()
        if report is not None:
            ticks.append(report.seconds)
        if all(_status(svc, t) == chart.RUNNING for t in ids[HEALTHY]):
            to_running = time.monotonic() - started
            break
        if report is None or not (report.appended or svc.executor.has_outcomes):
            landed.wait(0.02)
    messages = {t: _message(svc, t) for t in ids[SICK]}
    spells = tuple(f"{s.cluster} {s.api} since {s.since.isoformat()}"
                   for s in svc.api_health.unanswered())
    hung = len(getattr(cloud.kube[SICK], "unanswered", ()))
    return RunResult(sick, to_running, tuple(ticks), messages, spells, hung)


def _status(svc: Service, task_id: str) -> str | None:
    state = svc.app.tasks.get(task_id)
    return state.status if state is not None else None


def _message(svc: Service, task_id: str) -> str:
    from falcon_es.projections.messages import task_message

    state = svc.app.tasks.get(task_id)
    return (task_message(state) or "") if state is not None else ""


def isolation_benchmark(cloud_factory: CloudFactory, *, tasks: int = 4,
                        deadline_seconds: float = 2.0,
                        limit_seconds: float = 20.0) -> dict[str, Any]:
    """The baseline run, then the run with the sick cluster, in one invocation."""
    with tempfile.TemporaryDirectory(prefix="falcon-bench-isolation-") as tmp:
        runs = {}
        for sick in (False, True):
            directory = Path(tmp) / ("sick" if sick else "baseline")
            directory.mkdir()
            runs[sick] = run_once(cloud_factory, directory, sick=sick, tasks=tasks,
                                  deadline_seconds=deadline_seconds,
                                  limit_seconds=limit_seconds)
    base, ill = runs[False], runs[True]
    return {
        "tasks_per_cluster": tasks, "deadline_seconds": deadline_seconds,
        "baseline": _figures(base), "sick": _figures(ill),
        "to_running_ratio": _ratio(ill.healthy_to_running, base.healthy_to_running),
        "tick_p99_ratio": _ratio(ill.tick_p99, base.tick_p99),
        "tick_p99_seconds": ill.tick_p99,
        "sick_messages": dict(ill.sick_messages),
        "unanswered": list(ill.unanswered),
        "unanswered_requests": ill.unanswered_requests,
    }


#: The targets: the healthy cluster at most this much slower, and the tick p99.
MAX_RATIO, MAX_TICK_P99_SECONDS = 1.5, 1.0


def on_target(report: Mapping[str, Any]) -> bool:
    ratio = report["to_running_ratio"]
    return (ratio is not None and ratio <= MAX_RATIO
            and report["tick_p99_seconds"] <= MAX_TICK_P99_SECONDS)


def _figures(run: RunResult) -> dict[str, Any]:
    return {"healthy_to_running_seconds": run.healthy_to_running, "ticks": len(run.ticks),
            "tick_p50_seconds": statistics.median(run.ticks) if run.ticks else 0.0,
            "tick_p99_seconds": run.tick_p99,
            "tick_max_seconds": max(run.ticks, default=0.0)}


def _ratio(sick: float | None, baseline: float | None) -> float | None:
    if sick is None or baseline is None or baseline <= 0:
        return None
    return sick / baseline


def format_report(report: Mapping[str, Any]) -> str:
    base, sick = report["baseline"], report["sick"]

    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.2f}s"

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"isolation: {report['tasks_per_cluster']} tasks per cluster, {SICK}'s Kubernetes "
        f"API hung, call deadline {report['deadline_seconds']}s",
        f"  {HEALTHY} all Running: baseline {seconds(base['healthy_to_running_seconds'])}, "
        f"sick {seconds(sick['healthy_to_running_seconds'])} "
        f"(ratio {ratio(report['to_running_ratio'])}, target <= 1.5)",
        f"  tick p99: baseline {base['tick_p99_seconds'] * 1000:.1f} ms, sick "
        f"{sick['tick_p99_seconds'] * 1000:.1f} ms (ratio {ratio(report['tick_p99_ratio'])}, "
        f"target p99 <= 1 s); ticks {base['ticks']} / {sick['ticks']}",
        f"  requests {SICK}'s API server never answered: {report['unanswered_requests']}",
    ]
    lines += [f"  unanswered: {line}" for line in report["unanswered"]]
    first = next(iter(sorted(report["sick_messages"].items())), None)
    if first is not None:
        lines.append(f"  {first[0]}: {first[1]}")
    return "\n".join(lines)
