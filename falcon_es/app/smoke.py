"""``falcon-es smoke``: one tiny task end to end on a real edge cluster, and the model
checked against what GCP did.

A first deployment's first task should also test everything the simulated world
assumes about GKE, Kubernetes, Pub/Sub and Cloud Storage. The run goes through the
gcp backend's own adapters, each call as the controller makes it: ``doctor``'s checks,
the cluster's queue and reservation, a node pool created as the effect executor
creates one (or a pool kept by an earlier ``--keep`` run), the Job rendered as a
task's Job (with its log file in the cluster's bucket), the real informer publishing
to Pub/Sub, the log read back as ``falcon-es logs`` reads it, then the Job and pool
deleted. It drives the calls itself rather than through the controller's tick, so
each observation (how long the pool was missing, the operation's words, when nodes
registered) is timed where it happens; ``smoke_model`` compares them with the model.

Safe on a shared project: every name it creates starts with ``smoke-`` (the
controller's orphan sweep takes only ``falcon-*`` pools); its pool carries
``falcon-smoke-run`` and its Job ``managed-by=falcon-smoke`` (so the controller's
informer never publishes it as a task's), it refuses a cluster whose queue for the shape is held by a
task, and whatever it created is deleted when a step fails or the run is interrupted;
what it could not delete is listed in the report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from falcon_es.adapters.gcp.doctor import Check
from falcon_es.adapters.gcp.gke import GkeNodePools
from falcon_es.adapters.gcp.informer import InformerSettings
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.app.smoke_model import (
    COMPLETE_CONDITION, FLEX_START, JOB_CONDITIONS, ON_DEMAND, RESERVATION, Model,
    Observations, RowCheck, compare,
)
from falcon_es.config.settings import Settings
from falcon_es.domain import manifests, naming
from falcon_es.domain.clock import Clock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import (
    NOT_FOUND, RETRYABLE, BusMessage, LogFiles, NodePoolInfo, NodePoolSpec, Operation,
    PortError, Reservations,
)
from falcon_es.domain.tpu import TPU_TYPES, SliceShape, machine_types, slice_shape
from falcon_es.engine.task_manifests import POOL_SUPPLY_LABEL, POOL_TOPOLOGY_LABEL, job_placement
from falcon_es.handlers.provisioning import scale_down_seconds

T = TypeVar("T")

PREFIX = "smoke-"
#: The owner mark of smoke's Job: not ``falcon``, so the controller's informer does not
#: publish it as a task's.
MANAGED_BY_SMOKE = "falcon-smoke"
SELECTOR = f"{manifests.MANAGED_BY}={MANAGED_BY_SMOKE}"
#: The mark of smoke's pools (the gcp adapter labels every pool ``managed-by=falcon``).
RUN_LABEL = "falcon-smoke-run"
DEFAULT_IMAGE = "busybox:1.36"
MODE_TAGS = MappingProxyType({RESERVATION: "res", ON_DEMAND: "od", FLEX_START: "flex"})
#: A short watch, so the informer sees the run's end (and stops) within seconds.
INFORMER_WATCH_SECONDS = 15
PASSED, FAILED, INTERRUPTED, REFUSED = "passed", "failed", "interrupted", "refused"


class StepFailed(Exception):
    """A step could not do its part: the run stops and cleans up."""


class Refused(StepFailed):
    """The run would get in the way of the cluster's tasks: nothing was created."""


class SmokeBus(Protocol):
    """Pub/Sub as smoke uses it: its own topic and subscription, made and removed."""

    def publish(self, topic: str, data: Any, *, ordering_key: str = "",
                attributes: Any = None) -> str: ...
    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]: ...
    def ack(self, subscription: str, message_ids: Sequence[str]) -> None: ...
    def create_topic(self, topic: str) -> str: ...
    def create_subscription(self, subscription: str, topic: str, *,
                            message_ordering: bool = True,
                            ack_deadline_seconds: int = 60) -> str: ...
    def delete_subscription(self, subscription: str) -> None: ...
    def delete_topic(self, topic: str) -> None: ...


@dataclasses.dataclass
class SmokeTools:
    """The clients a run talks to and the passing of time (virtual in tests)."""

    settings: Settings
    node_pools: GkeNodePools
    reservations: Reservations
    edges: KubeEdgeClusters
    bus: SmokeBus
    log_files: LogFiles
    clock: Clock
    wait: Callable[[float], None]
    doctor: Callable[[Cluster], list[Check]]
    #: Runs the informer of the cluster until the event is set (on its own thread).
    informer: Callable[[Cluster, InformerSettings, threading.Event], object]
    #: The tasks holding the slot of the cluster's queue for a topology.
    slot_holders: Callable[[Cluster, str], list[str]]


@dataclasses.dataclass(frozen=True)
class SmokeOptions:
    supply_mode: str
    topology: str
    #: Seconds between two looks at a pool, an operation, the nodes or the Job: the
    #: resolution of every time measured (and the tolerance of every comparison).
    poll_seconds: float
    keep: bool = False
    image: str = DEFAULT_IMAGE
    run_id: str = ""
    pool_deadline_seconds: float = 3600.0
    job_deadline_seconds: float = 1800.0
    cleanup_deadline_seconds: float = 900.0


@dataclasses.dataclass(frozen=True)
class StepReport:
    name: str
    seconds: float
    outcome: str  # ok | failed | interrupted
    observed: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SmokeReport:
    cluster: str
    supply_mode: str
    topology: str
    run_id: str
    outcome: str = PASSED
    steps: list[StepReport] = dataclasses.field(default_factory=list)
    checks: list[RowCheck] = dataclasses.field(default_factory=list)
    #: What the run created and could not delete, one line each with why.
    left: list[str] = dataclasses.field(default_factory=list)
    #: What ``--keep`` kept on purpose.
    kept: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "supply_mode": self.supply_mode,
                "topology": self.topology, "run_id": self.run_id, "outcome": self.outcome,
                "steps": [s.as_dict() for s in self.steps],
                "checks": [c.as_dict() for c in self.checks],
                "left": self.left, "kept": self.kept}


def default_supply_mode(cluster: Cluster) -> str:
    return RESERVATION if cluster.default_reservation else FLEX_START


def default_topology(tpu_type: str, machine_type: str | None) -> str:
    """The smallest shape of the type, or the smallest one the reservation's machine
    type makes (a reservation of 4-chip VMs cannot serve a 1-chip slice)."""
    for topology in TPU_TYPES[tpu_type].topologies:
        if machine_type is None or machine_type in machine_types(tpu_type, topology):
            return topology
    raise StepFailed(f"no {tpu_type} topology runs on {machine_type} VMs")


def pool_name(topology: str, supply_mode: str) -> str:
    """One name per shape and supply mode, so a pool kept by ``--keep`` is found again."""
    return f"{PREFIX}{topology}-{MODE_TAGS.get(supply_mode, supply_mode)}"


class SmokeRun:
    """One run: ``run()`` returns the report, having cleaned up after itself."""

    def __init__(self, cluster: Cluster, tools: SmokeTools, options: SmokeOptions,
                 model: Model | None = None,
                 on_step: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.tools = tools
        self.options = options
        self.model = model or Model.packaged()
        self._on_step = on_step or (lambda name: None)
        self.run_id = options.run_id or tools.clock.now().strftime("%Y%m%d-%H%M%S")
        self.task_id = f"{PREFIX}{self.run_id}"
        self.line = f"falcon-es smoke {self.run_id}: hello from the TPU node"
        self.topic = f"{PREFIX}{self.run_id}-edge-events"
        self.subscription = f"{PREFIX}{self.run_id}-edge-events"
        self.shape: SliceShape = slice_shape(cluster.tpu_type, options.topology)
        self.pool = pool_name(options.topology, options.supply_mode)
        self.job_name = self.task_id
        self.report = SmokeReport(cluster.name, options.supply_mode, options.topology,
                                  self.run_id)
        self.obs = Observations(options.supply_mode)
        #: What this run made, in the order made: ("pool"|"job"|"subscription"|"topic", name).
        self.created: list[tuple[str, str]] = []
        self._create_op: Operation | None = None
        self._create_done: dt.datetime | None = None
        self._pool_running: dt.datetime | None = None
        self._submitted: dt.datetime | None = None
        self._ended: dt.datetime | None = None
        self._reused = False
        self._stop_informer = threading.Event()
        self._informer_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the run

    def run(self) -> SmokeReport:
        try:
            self._steps()
        except Refused as refusal:
            self.report.outcome = REFUSED
            self._note_failure(str(refusal))
        except StepFailed as failure:
            self.report.outcome = FAILED
            self._note_failure(str(failure))
        except KeyboardInterrupt:
            self.report.outcome = INTERRUPTED
        finally:
            self._clean_up()
            self.report.checks = compare(self.obs, self.model, self.options.poll_seconds)
        return self.report

    def _steps(self) -> None:
        self._step("doctor", self._doctor)
        self._step("queue", self._queue)
        # Pub/Sub first: a refused topic costs nothing, a pool made before it would.
        self._step("informer", self._informer)
        self._step("node pool", self._node_pool)
        if self.options.supply_mode != FLEX_START:
            self._step("nodes", self._nodes)
        self._step("job submitted", self._submit)
        if self.options.supply_mode == FLEX_START:
            self._step("nodes", self._nodes)
        self._step("job ended", self._job_end)
        self._step("log read back", self._log)
        self._step("job deleted", self._delete_job)
        if self.options.keep:
            self.report.kept.append(f"node pool {self.pool} (--keep: a later run reuses it)")
            self.created = [c for c in self.created if c != ("pool", self.pool)]
        else:
            self._step("node pool deleted", self._delete_pool)
        self._step("operation kept", self._retention)

    def _step(self, name: str, action: Callable[[], str]) -> None:
        self._on_step(name)
        start = self.tools.clock.now()
        outcome, observed = "failed", ""
        try:
            observed = action()
            outcome = "ok"
        except KeyboardInterrupt:
            outcome, observed = "interrupted", "interrupted (SIGINT)"
            raise
        except PortError as error:
            observed = error.message
            raise StepFailed(f"{name}: {error.message}") from error
        except StepFailed as failure:
            observed = str(failure)
            raise
        except Exception as error:  # an unforeseen answer must still end in the clean-up
            observed = f"{type(error).__name__}: {error}"
            raise StepFailed(f"{name}: {observed}") from error
        finally:
            taken = (self.tools.clock.now() - start).total_seconds()
            self.report.steps.append(StepReport(name, taken, outcome, observed))

    def _note_failure(self, words: str) -> None:
        if self.report.steps and self.report.steps[-1].outcome == "failed":
            return
        self.report.steps.append(StepReport("(run)", 0.0, "failed", words))

    def _now(self) -> dt.datetime:
        return self.tools.clock.now()

    def _since(self, moment: dt.datetime) -> float:
        return (self._now() - moment).total_seconds()

    def _until(self, what: str, deadline_seconds: float, look: Callable[[], T | None]) -> T:
        """Look every ``poll_seconds`` until ``look`` answers; a transient refusal is
        looked past (the next look is the retry)."""
        start = self._now()
        while True:
            try:
                found = look()
            except PortError as error:
                if error.code != RETRYABLE:
                    raise
                found = None
            if found is not None:
                return found
            if self._since(start) > deadline_seconds:
                raise StepFailed(f"{what}: not within {deadline_seconds:.0f} s")
            self.tools.wait(self.options.poll_seconds)

    # ------------------------------------------------------------------ steps

    def _doctor(self) -> str:
        checks = self.tools.doctor(self.cluster)
        failed = [check for check in checks if check.failed]
        if failed:
            raise Refused("doctor: " + "; ".join(check.line() for check in failed))
        return f"{len(checks)} checks passed"

    def _queue(self) -> str:
        holders = self.tools.slot_holders(self.cluster, self.options.topology)
        if holders:
            raise Refused(f"the queue {self.cluster.name} {self.options.topology} is held by "
                          f"task(s) {', '.join(holders)}: a smoke run now would take capacity "
                          "from them; try again when the slot is free")
        said = "the queue's slot is free"
        if self.options.supply_mode == RESERVATION:
            free = self._free_slices()
            if free < self.obs.slices and not self._existing_pool():
                raise Refused(f"reservation {self.cluster.default_reservation} has {free} free "
                              f"{self.options.topology} slice(s): the cluster's tasks use it")
            self.obs.free_slices_before = free
            said += f"; reservation {self.cluster.default_reservation}: {free} free slice(s)"
        return said

    def _free_slices(self) -> int:
        return self.tools.reservations.remaining_slices(
            self.cluster, self.cluster.default_reservation or "", self.shape)

    def _existing_pool(self) -> NodePoolInfo | None:
        try:
            return self.tools.node_pools.get(self.cluster, self.pool)
        except PortError as error:
            if error.code == NOT_FOUND:
                return None
            raise

    def _node_pool(self) -> str:
        existing = self._existing_pool()
        if existing is not None:
            return self._reuse(existing)
        spec = NodePoolSpec(
            cluster=self.cluster, name=self.pool, shape=self.shape,
            supply_mode=self.options.supply_mode,
            reservation=(self.cluster.default_reservation
                         if self.options.supply_mode == RESERVATION else None),
            scale_down_unneeded_seconds=scale_down_seconds(self.options.supply_mode,
                                                           self.tools.settings),
            labels={RUN_LABEL: self.run_id,
                    POOL_TOPOLOGY_LABEL: self.options.topology,
                    POOL_SUPPLY_LABEL: self.options.supply_mode},
            locations=(self.cluster.node_zone,) if self.cluster.node_zone else ())
        operation = self.tools.node_pools.create(spec)
        self.created.append(("pool", self.pool))
        created = self._now()
        self._create_op = operation
        self.obs.operation_words.append(operation.status)
        visible = self._until("the pool to be visible", self.options.pool_deadline_seconds,
                              lambda: self._existing_pool())
        self.obs.visibility_seconds = self._since(created)
        self._note_running(visible)
        done = self._until("the create operation", self.options.pool_deadline_seconds,
                           self._operation_done)
        if done.error:
            raise StepFailed(f"node pool {self.pool}: {done.error}")
        self._create_done = self._now()
        self._until("the pool to be RUNNING", self.options.pool_deadline_seconds,
                    lambda: self._note_running(self.tools.node_pools.get(self.cluster,
                                                                         self.pool)))
        return (f"created {self.pool}; visible after {self.obs.visibility_seconds:.1f} s; "
                f"operation {' -> '.join(dict.fromkeys(self.obs.operation_words))}")

    def _reuse(self, existing: NodePoolInfo) -> str:
        if RUN_LABEL not in existing.labels:
            raise Refused(f"a pool named {self.pool} exists and is not smoke's: choose "
                          "another topology or supply mode")
        if existing.status != "RUNNING":
            raise StepFailed(f"the kept pool {self.pool} is {existing.status}, not RUNNING")
        self._reused = True
        self.obs.free_slices_before = None
        if not self.options.keep:  # this run deletes it, interrupted or not
            self.created.append(("pool", self.pool))
        return f"reused {self.pool} (kept by an earlier --keep run)"

    def _operation_done(self) -> Operation | None:
        assert self._create_op is not None
        operation = self.tools.node_pools.get_operation(self.cluster, self._create_op.id)
        self.obs.operation_words.append(operation.status)
        return operation if operation.done else None

    def _note_running(self, info: NodePoolInfo) -> NodePoolInfo | None:
        if info.status == "RUNNING":
            self._pool_running = self._pool_running or self._now()
            return info
        return None

    def _nodes(self) -> str:
        edge = self.tools.edges.for_cluster(self.cluster)
        hosts = self.shape.hosts
        since = self._pool_running if self.options.supply_mode != FLEX_START else self._submitted
        from_start = not self._reused and since is not None

        def registered() -> bool | None:
            if self.options.supply_mode == FLEX_START:
                self._note_events()
            return True if edge.node_counts(self.pool).registered >= hosts else None

        self._until("the nodes to register", self.options.pool_deadline_seconds, registered)
        at_registration = self._now()
        self._until("the nodes to be Ready", self.options.pool_deadline_seconds,
                    lambda: True if edge.node_counts(self.pool).ready >= hosts else None)
        if from_start and since is not None:
            self.obs.register_seconds = (at_registration - since).total_seconds()
            self.obs.ready_lag_seconds = self._since(at_registration)
        said = f"{hosts} node(s) registered and Ready"
        if self.options.supply_mode == RESERVATION and not self._reused:
            self.obs.free_slices_during = self._free_slices()
            said += f"; reservation: {self.obs.free_slices_during} free slice(s)"
        return said

    def _note_events(self) -> None:
        edge = self.tools.edges.for_cluster(self.cluster)
        for event in edge.pod_events(self.job_name):
            if event not in self.obs.autoscaler_events:
                self.obs.autoscaler_events.append(event)

    def _informer(self) -> str:
        bus = self.tools.bus
        bus.create_topic(self.topic)
        self.created.append(("topic", self.topic))
        bus.create_subscription(self.subscription, self.topic, message_ordering=False)
        self.created.append(("subscription", self.subscription))
        settings = InformerSettings(topic=self.topic, job_selector=SELECTOR,
                                    pod_selector=SELECTOR, jobsets=False,
                                    watch_timeout_seconds=INFORMER_WATCH_SECONDS)
        self._informer_thread = threading.Thread(
            target=self.tools.informer, args=(self.cluster, settings, self._stop_informer),
            name=f"smoke-informer-{self.cluster.name}", daemon=True)
        self._informer_thread.start()
        return f"informer publishing to {self.topic}, read from {self.subscription}"

    def _manifest(self) -> dict[str, Any]:
        job = manifests.render_job(
            task_id=self.task_id,
            spec={"image": self.options.image, "command": ["echo", self.line]},
            shape=self.shape, pool_name=self.pool,
            placement=job_placement(self.tools.settings, self.cluster))
        job["metadata"]["name"] = self.job_name
        for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
            labels[manifests.MANAGED_BY] = MANAGED_BY_SMOKE
        return job

    def _submit(self) -> str:
        edge = self.tools.edges.for_cluster(self.cluster)
        ref = edge.submit_job(self._manifest())
        self.created.append(("job", self.job_name))
        self._submitted = self._now()
        return f"Job {ref.name} (uid {ref.uid}) on {self.pool}: echo {self.line!r}"

    def _job_end(self) -> str:
        edge = self.tools.edges.for_cluster(self.cluster)
        seen: dict[str, int] = {}
        arrived: list[dt.datetime] = []

        def look() -> bool | None:
            for message in self._pull():
                data = message.data
                if data.get("job_name") == self.job_name and data.get("condition"):
                    key = str(data.get("resource_version"))
                    seen[key] = seen.get(key, 0) + 1
                    if not arrived:
                        arrived.append(self._now())
            if self._informer_thread is not None and not self._informer_thread.is_alive():
                raise StepFailed("the informer stopped (its log says why)")
            if self._ended is None:
                conditions = edge.job_conditions(self.job_name)
                if any(c in JOB_CONDITIONS for c in conditions):
                    self._ended = self._now()
                    self.obs.job_conditions = conditions
            return True if self._ended is not None and arrived else None

        try:
            self._until("the Job to end and its end to arrive through Pub/Sub",
                        self.options.job_deadline_seconds, look)
        finally:
            self.obs.delivered = bool(arrived) if self._ended is not None else None
            if arrived and self._ended is not None:
                self.obs.delivery_seconds = max(0.0, (arrived[0] - self._ended).total_seconds())
            self.obs.duplicates = sum(count - 1 for count in seen.values())
        if COMPLETE_CONDITION not in self.obs.job_conditions:
            raise StepFailed(f"Job {self.job_name} ended with conditions "
                             f"{', '.join(self.obs.job_conditions)}: "
                             f"{edge.diagnose_pending(self.job_name) or 'no diagnosis'}")
        return (f"conditions {', '.join(self.obs.job_conditions)}; the end arrived through "
                f"Pub/Sub {self.obs.delivery_seconds or 0.0:.1f} s after the API showed it")

    def _pull(self) -> Sequence[BusMessage]:
        messages = self.tools.bus.pull(self.subscription)
        if messages:
            self.tools.bus.ack(self.subscription, [m.id for m in messages])
        return messages

    def _log(self) -> str:
        bucket = self.cluster.gcs_bucket
        prefix = f"logs/{naming.log_dir(self.task_id)}/"
        assert self._ended is not None
        ended = self._ended

        looks: list[dt.datetime] = []

        def look() -> str | None:
            looks.append(self._now())
            for obj in self.tools.log_files.list(bucket, prefix):
                text = self.tools.log_files.read(bucket, obj.name).decode("utf-8", "replace")
                if self.line in text:
                    return obj.name
            return None

        try:
            name = self._until(f"the line in gs://{bucket}/{prefix}",
                               self.options.job_deadline_seconds, look)
        except StepFailed:
            self.obs.log_found = False
            raise
        self.obs.log_found = True
        # At the first look the file was there already: uploaded within the time the
        # Job's end took to arrive, which is all a look can tell.
        self.obs.log_seconds = 0.0 if len(looks) == 1 else self._since(ended)
        return f"gs://{bucket}/{name} holds the line (kept as the run's record)"

    def _delete_job(self) -> str:
        self.tools.edges.for_cluster(self.cluster).delete_job(self.job_name)
        self.created.remove(("job", self.job_name))
        return f"Job {self.job_name} deleted"

    def _delete_pool(self) -> str:
        words = self._delete_pool_and_wait()
        self.created.remove(("pool", self.pool))
        said = f"{self.pool} deleted; operation {' -> '.join(words)}"
        if self.options.supply_mode == RESERVATION and not self._reused:
            self.obs.free_slices_after = self._free_slices()
            said += f"; reservation: {self.obs.free_slices_after} free slice(s)"
        return said

    def _delete_pool_and_wait(self) -> list[str]:
        # GKE refuses a delete while the pool's create runs ("... is currently creating
        # node pool ..."): a transient refusal, asked again at each look.
        asked = self._until(f"GKE to accept the delete of {self.pool}",
                            self.options.cleanup_deadline_seconds,
                            lambda: [self.tools.node_pools.delete(self.cluster, self.pool)])
        operation = asked[0]
        if operation is None:
            return ["(already gone)"]
        words = [operation.status]

        def done() -> Operation | None:
            current = self.tools.node_pools.get_operation(self.cluster, operation.id)
            words.append(current.status)
            return current if current.done else None

        finished = self._until(f"the delete of {self.pool}",
                               self.options.cleanup_deadline_seconds, done)
        if finished.error:
            raise StepFailed(f"delete of {self.pool}: {finished.error}")
        self.obs.operation_words.extend(words)
        return list(dict.fromkeys(words))

    def _retention(self) -> str:
        if self._create_op is None or self._create_done is None:
            return "no operation of this run to ask for"
        self.obs.retention_seconds = self._since(self._create_done)
        try:
            self.tools.node_pools.get_operation(self.cluster, self._create_op.id)
            self.obs.operation_kept = True
        except PortError as error:
            if error.code != NOT_FOUND:
                raise
            self.obs.operation_kept = False
        return (f"create operation {'still known' if self.obs.operation_kept else 'unknown'} "
                f"{self.obs.retention_seconds:.1f} s after DONE")

    # ------------------------------------------------------------------ clean-up

    def _clean_up(self) -> None:
        """Delete what this run made, newest first; what cannot be deleted (an error, a
        second interrupt) is listed in the report with the reason."""
        self._stop_informer.set()
        if self._informer_thread is not None:
            self._informer_thread.join(timeout=30)
        remaining = list(reversed(self.created))
        while remaining:
            kind, name = remaining[0]
            try:
                self._remove(kind, name)
            except KeyboardInterrupt:
                self.report.left += [f"{k} {n}: not deleted (interrupted during clean-up)"
                                     for k, n in remaining]
                return
            except (PortError, StepFailed) as error:
                words = error.message if isinstance(error, PortError) else str(error)
                self.report.left.append(f"{kind} {name}: not deleted ({words})")
            remaining.pop(0)
        self.created = []

    def _remove(self, kind: str, name: str) -> None:
        if kind == "job":
            self.tools.edges.for_cluster(self.cluster).delete_job(name)
        elif kind == "pool":
            self._delete_pool_and_wait()
        elif kind == "subscription":
            self.tools.bus.delete_subscription(name)
        elif kind == "topic":
            self.tools.bus.delete_topic(name)


def slot_holders_of(app: Any) -> Callable[[Cluster, str], list[str]]:
    """The queue book as a starting controller folds it: who holds a queue's slot."""
    from falcon_es.app.application import load_task_states

    load_task_states(app)
    return lambda cluster, topology: list(app.queue_view.book.holders((cluster.id, topology)))


def real_tools(settings: Settings, app: Any) -> tuple[SmokeTools, Callable[[], None]]:
    """The gcp backend's clients on the wall clock, and what closes them."""
    import time

    from falcon_es.adapters.gcp.doctor import Doctor
    from falcon_es.adapters.gcp.informer import run_informer
    from falcon_es.adapters.gcp.log_files import gcs_log_files
    from falcon_es.adapters.gcp.wiring import build_gcp_backend

    backend = build_gcp_backend(settings)

    def informer(cluster: Cluster, informer_settings: InformerSettings,
                 stop: threading.Event) -> object:
        return run_informer(cluster, backend.edges, backend.bus, stop,
                            settings=informer_settings)

    tools = SmokeTools(
        settings=settings, node_pools=backend.node_pools, reservations=backend.reservations,
        edges=backend.edges, bus=backend.bus, log_files=gcs_log_files(settings),
        clock=backend.clock, wait=time.sleep,
        doctor=lambda cluster: Doctor(settings).run([cluster]),
        informer=informer, slot_holders=slot_holders_of(app))
    return tools, backend.close
