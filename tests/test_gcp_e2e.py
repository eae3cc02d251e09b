"""The task lifecycle scenarios (as in test_lifecycle.py) again, on the gcp backend.

Each scenario runs twice on the same simulated world configuration: once on the sim
backend (``Harness``, as in test_lifecycle.py) and once with the ports
``build_gcp_ports`` builds from the environment -- the real google-cloud-container
client over gRPC (or REST) to a GKE front end, google-cloud-compute over REST to a
Compute front end, the kubernetes client with Google access tokens (found by
``google.auth.default()`` in a service-account key whose token endpoint is local) to one
Kubernetes API server per edge cluster, and google-cloud-pubsub to Google's Pub/Sub
emulator. The servers are front ends of one ``SimWorld`` (tests/fakes/sim_backed.py),
and the real ``EdgeInformer`` of each cluster watches its API server and publishes to
the emulator. Both runs must leave the same job table: the same (Status, Reason)
sequence, the same Messages, the same node pools.

Time: the controller and the world run on one VirtualClock; virtual time only jumps
once the edge pipeline is quiet (every change published by its informer and
acknowledged by the controller), which the driver waits for in wall time.
"""

from __future__ import annotations

import re

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from falcon_es.jobtable import job_rows
from falcon_es.domain import manifests, naming
from falcon_es.adapters.gcp import build_gcp_ports
from falcon_es.adapters.gcp.informer import InformerSettings
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.adapters.sim import SimClusterConfig, SimConfig
from falcon_es.adapters.sim.config import QuotaConfig, ReservationConfig, Span, StockoutConfig
from falcon_es.adapters.sim.kube_api import DENIAL
from falcon_es.app.application import open_app
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.clusters import Cluster
from falcon_es.storage.registry import list_clusters
from falcon_es.config.retry import Backoff
from falcon_es.config.settings import Settings
from falcon_es.domain.tpu import slice_shape
from falcon_es.engine import outbox
from tests.fakes import fixtures
from tests.fakes.fixtures import unique_name
from tests.fakes.pubsub_emulator import PubSubEmulator
from tests.fakes.sim_backed import SimBackedCloud, TracedBus
from tests.support.harness import Harness, flex_cluster, reserved_cluster, sim_config
from tests.conftest import migrate

pubsub_emulator = fixtures.pubsub_emulator

START = dt.datetime(2026, 11, 1, 9, 0, 0)

RESERVED_PATH = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                 ("Pending", "Dispatching"), ("Running", None)]
#: Wall seconds the driver waits for the informers and the emulator between looks.
PIPELINE_POLL_SECONDS = 0.05
#: Wall seconds the edge pipeline may stay busy before the scenario is declared stuck.
PIPELINE_STALL_SECONDS = 30.0
#: The informers reconnect fast: a failed watch costs the test wall time, not virtual.
FAST_BACKOFF = Backoff(initial=0.05, maximum=0.5, multiplier=2.0, jitter=0.0, attempts=1)
#: What the job table says when the informer published a Job's failure before its pod's.
TORN_VIEW_MESSAGE = "Job failed (no failed pod was observed)"
ROW_FIELDS = ("status", "reason", "message", "node_pool_name", "dispatched_at", "finished_at",
              "aborted_at")


class GcpHarness(Harness):
    """The lifecycle harness with the gcp ports over a sim-backed cloud."""

    def __init__(self, db_url: str, clock: VirtualClock, config: SimConfig, *,
                 emulator: PubSubEmulator, key_dir: Path, monkeypatch: pytest.MonkeyPatch,
                 overrides: dict[str, Any], gke_transport: str = "grpc") -> None:
        super().__init__(db_url, clock, config, Settings(db_url=db_url, **overrides))
        self.cloud = SimBackedCloud(self.world, gke_transport=gke_transport).start()
        key = self.cloud.authority.service_account_file(key_dir, emulator.project)
        environment = {
            **self.cloud.environment(key), "FALCON_DB_URL": db_url,
            "FALCON_PUBSUB_PROJECT": emulator.project,
            "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge-events"),
            "FALCON_EDGE_EVENTS_SUBSCRIPTION": unique_name("edge-events-controller"),
            "FALCON_TASK_EVENTS_TOPIC": unique_name("task-events"),
        }
        for name in ("GOOGLE_APPLICATION_CREDENTIALS",):
            monkeypatch.setenv(name, environment[name])
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
        self.settings = Settings(**{
            **dict(Settings.from_env({**environment, "PUBSUB_EMULATOR_HOST": emulator.host})),
            **overrides})
        ports = build_gcp_ports(self.settings, clock=clock)
        self.gcp_bus: PubSubBus = ports.bus  # type: ignore[assignment]
        self.gcp_edges = ports.edges
        self.gcp_bus.create_topic(self.settings.bus.edge_events_topic)
        self.gcp_bus.create_subscription(self.settings.bus.edge_events_subscription,
                                         self.settings.bus.edge_events_topic,
                                         message_ordering=False, ack_deadline_seconds=10)
        self.ports = dataclasses.replace(ports, bus=TracedBus(ports.bus, self.cloud.trace))
        self.app.close()
        self.app = open_app(self.settings, clock)
        self.rebuild()
        self._stalled_since: float | None = None

    def add_cluster(self, config: SimClusterConfig) -> Cluster:
        cluster = super().add_cluster(config)
        self.cloud.start_informer(cluster, self.gcp_edges, self.gcp_bus, InformerSettings(
            topic=self.settings.bus.edge_events_topic, resync_seconds=3600, backoff=FAST_BACKOFF))
        return cluster

    def next_due(self) -> dt.datetime | None:
        with self.cloud.lock:
            due = super().next_due()
            self.cloud.sync()
        return due

    def step(self) -> bool:
        appended = self.tick()
        if appended or self.executor.has_outcomes:
            return True
        trace = self.cloud.trace
        if not trace.quiet():
            self._stalled_since = self._stalled_since or time.monotonic()
            if time.monotonic() - self._stalled_since > PIPELINE_STALL_SECONDS:
                raise AssertionError(f"edge pipeline stuck: {trace.describe()}")
            trace.wait_for_news(PIPELINE_POLL_SECONDS)
            return True
        self._stalled_since = None
        due = self.next_due()
        if due is None:
            return False
        self.clock.advance_to(max(due, self.clock.now() + dt.timedelta(milliseconds=1)))
        self.cloud.step()
        return True

    def close(self) -> None:
        self.cloud.stop()
        self.gcp_edges.close()  # type: ignore[attr-defined]
        self.gcp_bus.close()
        super().close()


Scenario = Callable[[Harness], None]
Make = Callable[..., Harness]


@pytest.fixture
def make(db_url: str, tmp_path: Path, pubsub_emulator: PubSubEmulator,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Make]:
    """``make("gcp", ...)`` runs on ``db_url`` (SQLite and MariaDB); ``make("sim", ...)``,
    the reference run, on a SQLite file of its own."""
    made: list[Harness] = []

    def factory(backend: str, *clusters: SimClusterConfig, gke_transport: str = "grpc",
                **overrides: Any) -> Harness:
        directory = tmp_path / f"{backend}-{len(made)}"
        directory.mkdir()
        clock = VirtualClock(START)
        config = sim_config(*clusters)
        if backend == "sim":
            url = f"sqlite:///{directory / 'falcon.db'}"
            migrate(url)
            harness = Harness(url, clock, config, Settings(db_url=url, **overrides))
        else:
            harness = GcpHarness(db_url, clock, config, emulator=pubsub_emulator,
                                 key_dir=directory, monkeypatch=monkeypatch,
                                 overrides=overrides, gke_transport=gke_transport)
        made.append(harness)
        for cluster in clusters:
            harness.add_cluster(cluster)
        return harness

    yield factory
    for harness in made:
        harness.close()


def job_table(h: Harness) -> dict[str, dict[str, Any]]:
    return {row["id"]: {field: row[field] for field in ROW_FIELDS}
            for row in job_rows.list_rows(h.app.engine)}


def both(make: Make, clusters: tuple[SimClusterConfig, ...], scenario: Scenario,
         **options: Any) -> tuple[Harness, Harness]:
    """Run the scenario on the sim backend, then on the gcp backend; the job tables,
    the (Status, Reason) sequences and the pools created must be the same."""
    sim = make("sim", *clusters, **{k: v for k, v in options.items() if k != "gke_transport"})
    scenario(sim)
    gcp = make("gcp", *clusters, **options)
    scenario(gcp)
    assert gcp.history == sim.history
    gcp_table, sim_table = job_table(gcp), job_table(sim)
    # A torn informer view (a Job's Failed before its failed pod, reproduced in
    # test_gcp_informer_torn_view) is absorbed by the status handler, so the tables match.
    assert not any(row["message"].startswith(TORN_VIEW_MESSAGE) for row in gcp_table.values())
    assert gcp_table == sim_table
    assert _pools(gcp) == _pools(sim)
    for on_gke, on_sim in zip(gcp.world.pools(include_deleted=True),
                              sim.world.pools(include_deleted=True), strict=True):
        assert dict(on_sim.labels).items() <= dict(on_gke.labels).items()
    return sim, gcp


def _pools(h: Harness) -> list[tuple[Any, ...]]:
    """The pools as each backend made them; the scale-down delay only where it acts
    (an autoscaled pool: GKE's pool carries it only there)."""
    return [(p.name, p.status, p.supply_mode, p.reservation, p.hosts, p.machine_type,
             p.scale_down_unneeded_seconds if p.supply_mode == "flex-start" else None,
             p.created_at, p.deleted_at)
            for p in h.world.pools(include_deleted=True)]


def _status_is(h: Harness, task_id: str, status: str) -> Callable[[], bool]:
    return lambda: h.statuses().get(task_id, ("", None))[0] == status


# ------------------------------------------------------------------ the scenarios


@pytest.mark.parametrize("gke_transport", ["grpc", "rest"])
def test_success_with_a_reservation_pool(make: Make, gke_transport: str) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1")
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario, gke_transport=gke_transport)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert "1/1 active" in gcp.messages["t1"]
    assert gcp.messages["t1"][-1] == "succeeded (1 pod(s)); node pool falcon-t1-2x2 deleted"
    assert gcp.row("t1")["job_uid"] and gcp.live_pools() == []
    assert isinstance(gcp, GcpHarness) and gcp.cloud.trace.messages >= 3
    assert gcp.cloud.authority.grants  # the Kubernetes token came from google.auth.default()


def test_the_ops_stream_reaches_subscribers_in_order_with_its_attributes(make: Make) -> None:
    h = make("gcp", reserved_cluster())
    assert isinstance(h, GcpHarness)
    h.submit("t1")
    h.run()
    topic, subscription = h.settings.bus.task_events_topic, unique_name("ops")
    h.gcp_bus.create_topic(topic)
    h.gcp_bus.create_subscription(subscription, topic, message_ordering=True)
    published = outbox.publish_pending(h.app.store, h.ports.bus, topic)
    records = list(h.app.store.read_after(0))
    assert published == len(records)
    received = []
    for _ in range(50):
        batch = h.gcp_bus.pull(subscription)
        h.gcp_bus.ack(subscription, [m.id for m in batch])
        received.extend(batch)
        if len(received) >= published:
            break
    assert [m.data for m in received if m.attributes["stream_id"] == "t1"] == [
        outbox.message_of(r) for r in records if r.stream_id == "t1"]
    first = received[0]
    assert set(first.attributes) == {"type", "stream_id", "version", "seq"}
    assert first.data["seq"] == int(first.attributes["seq"])
    assert outbox.publish_pending(h.app.store, h.ports.bus, topic) == 0  # the cursor moved


def test_oom(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1", sim={"outcome": "oom", "duration_seconds": 60})
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Failed", "JobFailed")]
    assert re.fullmatch(r"OOMKilled \(exit code 137\); log: gs://logs-bucket/logs/t1/"
                        r"falcon-t1-0-[a-z0-9]{5}\.log; node pool falcon-t1-2x2 deleted",
                        gcp.row("t1")["message"])


def test_image_pull_failure(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1", sim={"outcome": "image-pull-error"})
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "JobFailed")]
    assert gcp.row("t1")["message"].startswith('ErrImagePull: Failed to pull image "us-docker')
    assert gcp.world.job_state("v6e-res", "falcon-t1") is None
    assert isinstance(gcp, GcpHarness) and gcp.cloud.kube["v6e-res"].names("jobs") == []


def test_pods_denied_by_an_admission_webhook(make: Make) -> None:
    """The informer reads the Job controller's FailedCreate events off the API server;
    the task shows the webhook's words and fails JobSubmitFailed after the grace."""
    def scenario(h: Harness) -> None:
        h.submit("t1", sim={"outcome": "create-denied"})
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "JobSubmitFailed")]
    words = f"Error creating: {DENIAL}"
    assert f"pods of Job falcon-t1 cannot be created: {words}" in gcp.messages["t1"]
    assert gcp.row("t1")["message"] == (f"pods of Job falcon-t1 refused for 600s: {words}; "
                                        "Job deleted; node pool falcon-t1-2x2 deleted")
    assert isinstance(gcp, GcpHarness) and gcp.cloud.kube["v6e-res"].names("jobs") == []
    assert gcp.cloud.kube["v6e-res"].names("pods") == []


def test_timeout_while_running(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1", sim={"duration_seconds": 5000}, timeout_seconds=1200)
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Failed", "Timeout")]
    assert gcp.row("t1")["message"] == ("timed out after 1200s; Job deleted; "
                                        "node pool falcon-t1-2x2 deleted")


def test_abort_while_running_hands_the_pool_over(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("long", sim={"duration_seconds": 5000})
        h.clock.advance(1)
        h.submit("next", sim={"duration_seconds": 60})
        h.run(_status_is(h, "long", "Running"))
        h.abort("long")
        h.run()

    _, gcp = both(make, (reserved_cluster(count=1),), scenario)
    assert gcp.history["long"] == [*RESERVED_PATH, ("Aborting", None), ("Aborted", None)]
    assert gcp.row("long")["message"] == ("aborted while Running; "
                                          "node pool falcon-long-2x2 handed over to next")
    assert gcp.history["next"][-1] == ("Succeeded", None)
    assert [p.name for p in gcp.world.pools(include_deleted=True)] == ["falcon-long-2x2"]
    assert gcp.live_pools() == []


def test_reservation_too_small_then_capacity_frees(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("wide", topology="4x4", sim={"duration_seconds": 200})
        h.clock.advance(1)
        h.submit("small", topology="2x2")
        h.run()

    sim, gcp = both(make, (reserved_cluster(count=4),), scenario)
    assert gcp.history["wide"] == [*RESERVED_PATH, ("Succeeded", None)]
    # The multi-host Job's headless Service, owned by the Job, on both backends.
    assert isinstance(gcp, GcpHarness)
    service = gcp.cloud.kube["v6e-res"].get("services", "falcon-wide")
    owners = [o["uid"] for o in service["metadata"]["ownerReferences"]]
    assert owners == [gcp.row("wide")["job_uid"]]
    assert sim.world.service("v6e-res", "falcon-wide").owner_uids == (sim.row("wide")["job_uid"],)
    assert gcp.cloud.kube["v6e-res"].names("services") == ["falcon-wide"]  # none for "small"
    assert gcp.history["small"] == [("Pending", "ClusterBusy"), *RESERVED_PATH,
                                    ("Succeeded", None)]
    assert "4/4 active" in gcp.messages["wide"]
    assert gcp.messages["small"][0].startswith(
        "reservation v6e-res-r has 0 slice(s) free, 1 needed (reservation_remaining_slices=0 "
        "reservation_needed_slices=1); retry 1, waiting since ")


def test_flex_start_stockout_that_resolves(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1")
        h.run()

    stockout = StockoutConfig(first_n=1, duration=Span(1200, 1200))
    _, gcp = both(make, (flex_cluster(stockout=stockout),), scenario)
    assert gcp.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                                 ("Pending", "WaitingForNode"), ("Pending", "Dispatching"),
                                 ("Running", None), ("Succeeded", None)]
    waiting = [m for m in gcp.messages["t1"] if "expected node(s) registered" in m]
    # Through the real clients: the autoscaler's FailedScaleUp event on the pod leads.
    assert waiting[0].startswith("cluster autoscaler FailedScaleUp: Node scale up in zones "
                                 "us-east5-b associated with this pod failed: GCE out of "
                                 "resources")
    assert "node pool falcon-t1-2x2 control-plane RUNNING but 0/1 expected node(s) " \
           "registered (Ready=0)" in waiting[0]
    (pool,) = gcp.world.pools(include_deleted=True)
    assert (pool.supply_mode, pool.scale_down_unneeded_seconds) == ("flex-start", 6 * 3600)


def test_flex_start_quota_at_scale_up_times_out_led_by_the_autoscalers_words(make: Make) -> None:
    """The pool is created; its scale-ups fail for TPU quota. Through the real clients the
    pod's FailedScaleUp event ("GCE quota exceeded") leads the wait and the timeout."""
    # The gcp run alone: the two backends word the pod's symptom differently, and the
    # timeout's Message carries it.
    gcp = make("gcp", flex_cluster(quota=QuotaConfig(first_n=1)),
               flex_start_provisioning_timeout_seconds=3600, retain_waiting_pool=False)
    gcp.submit("t1")
    assert isinstance(gcp, GcpHarness)
    gcp.run(lambda: gcp.statuses().get("t1") == ("Pending", "WaitingForNode"))
    server = gcp.cloud.kube["v6e-flex"]
    events = [server.get("events", name) for name in server.names("events")]
    (scale,) = [e for e in events if e["reason"] == "FailedScaleUp"]
    assert (scale["type"], scale["source"]["component"], scale["involvedObject"]["kind"]) == (
        "Warning", "cluster-autoscaler", "Pod")
    assert "GCE quota exceeded" in scale["message"]
    gcp.run()
    assert gcp.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                                 ("Pending", "WaitingForNode"), ("Failed", "NodePoolTimeout")]
    quota_words = ("cluster autoscaler FailedScaleUp: Node scale up in zones us-east5-b "
                   "associated with this pod failed: GCE quota exceeded. Pod is at risk of "
                   "not being scheduled.")
    waiting = [m for m in gcp.messages["t1"] if "expected node(s) registered" in m]
    assert waiting[0].startswith(quota_words)
    message = gcp.row("t1")["message"]
    assert message.startswith(quota_words)
    assert message.endswith("node pool falcon-t1-2x2 not ready after 3600s; node pool "
                            "falcon-t1-2x2 deleted")
    assert gcp.live_pools() == []


def test_pool_handover_to_the_next_task_of_its_topology(make: Make) -> None:
    def scenario(h: Harness) -> None:
        for name in ("a", "b", "c"):
            h.submit(name, sim={"duration_seconds": 120})
        h.run()

    _, gcp = both(make, (reserved_cluster(count=1),), scenario)
    busy_then_reuse = [("Pending", "Waiting"), ("Pending", "ClusterBusy"),
                       ("Pending", "Dispatching"), ("Running", None), ("Succeeded", None)]
    assert gcp.history["b"] == busy_then_reuse and gcp.history["c"] == busy_then_reuse
    assert gcp.messages["a"][-1] == ("succeeded (1 pod(s)); node pool falcon-a-2x2 "
                                     "handed over to b")
    assert [p.name for p in gcp.world.pools(include_deleted=True)] == ["falcon-a-2x2"]


def test_job_submit_conflict(make: Make) -> None:
    def scenario(h: Harness) -> None:
        with h.app.engine.connect() as conn:
            (registered,) = list_clusters(conn)
        intruder = manifests.render_job(
            task_id="someone-else", spec={"image": "busybox"}, shape=slice_shape("v6e", "2x2"),
            pool_name="elsewhere", placement=manifests.JobPlacement("falcon-jobs", "sa", "b"))
        intruder["metadata"]["name"] = naming.job_name("t1")
        h.ports.edges.for_cluster(registered).submit_job(intruder)
        h.submit("t1")
        h.run(lambda: h.settled())

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "JobSubmitFailed")]
    assert gcp.row("t1")["message"] == (
        "Job falcon-t1 could not be submitted: a Job named falcon-t1 already exists and is not "
        "this task's (falcon-task=someone-else); node pool falcon-t1-2x2 deleted")
    assert gcp.live_pools() == []


def test_two_ids_whose_old_names_collided_run_at_once_on_both_backends(make: Make) -> None:
    """Both tasks on one cluster and topology at once: each gets its own pool and Job,
    and the gcp adapter's adoption, which decides on the full id, takes neither."""
    ids = ("job-2026-07-01/user4883@example.com", "job-2026-07-01/user8747@example.com")

    def scenario(h: Harness) -> None:
        for index, task_id in enumerate(ids):
            h.submit(f"t{index}", task_id=task_id)
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert {gcp.statuses()[t] for t in ids} == {("Succeeded", None)}
    assert sorted(p.name for p in gcp.world.pools(include_deleted=True)) == sorted(
        naming.pool_name(t, "2x2") for t in ids)


def test_a_2x4_task_on_a_reservation_of_4_chip_vms_runs_on_two_on_both_backends(
        make: Make) -> None:
    """The reservation's machine type, read through Compute, makes the 2x4 slice two
    4-chip VMs: a multi-host pool GKE's fake accepts only on that machine type."""
    cluster = dataclasses.replace(reserved_cluster(count=4), reservations=(
        ReservationConfig("v6e-res-r", 4, 0, "ct6e-standard-4t"),))

    def scenario(h: Harness) -> None:
        h.submit("t1", topology="2x4")
        h.run()

    _, gcp = both(make, (cluster,), scenario)
    assert gcp.history["t1"][-1] == ("Succeeded", None)
    (pool,) = gcp.world.pools(include_deleted=True)
    assert (pool.machine_type, pool.hosts) == ("ct6e-standard-4t", 2)


# ------------------------------------------------------------ multi-slice tasks

SLICE_POOLS = "node pools falcon-t1-4x4, falcon-t1-4x4-s1"


def test_a_multi_slice_task_runs_to_succeeded_as_a_jobset(make: Make) -> None:
    """Two slices on two pools, one JobSet through CustomObjectsApi; the world's JobSet
    controller makes the child Jobs the API server shows and the informer sums."""
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", slices=2)
        h.run()

    _, gcp = both(make, (reserved_cluster(count=16),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert "8/8 active" in gcp.messages["t1"]
    assert gcp.row("t1")["message"] == f"succeeded (8 pod(s)); {SLICE_POOLS} deleted"
    assert isinstance(gcp, GcpHarness)
    assert gcp.cloud.kube["v6e-res"].names("jobsets") == ["falcon-t1"]
    assert gcp.cloud.kube["v6e-res"].names("jobs") == ["falcon-t1-slice-0", "falcon-t1-slice-1"]
    assert gcp.live_pools() == []


def test_a_failing_slice_restarts_the_jobset_then_fails_it(make: Make) -> None:
    """An exit code the spec names worth a retry: the JobSet restarts (RestartJobSet,
    no rule matches BackoffLimitExceeded) until max_restarts is spent."""
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", slices=2, max_restarts=1, retry_exit_codes=[42],
                 sim={"outcome": "fail", "exit_code": 42, "duration_seconds": 60})
        h.run()

    _, gcp = both(make, (reserved_cluster(count=16),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Failed", "JobFailed")]
    assert any("JobSet restarted 1 time(s)" in m for m in gcp.messages["t1"])
    assert re.fullmatch(
        r"exit code 42 \(JobSet failed: ReachedMaxRestarts after 1 "
        r"restart\(s\)\); log: gs://logs-bucket/logs/t1/falcon-t1-[a-z0-9-]+\.log; "
        + re.escape(f"{SLICE_POOLS} deleted"), gcp.row("t1")["message"])


def test_the_workloads_own_exit_code_fails_the_jobset_at_once(make: Make) -> None:
    """An OOM kill is no exit code worth a retry: the child's FailJob rule and the
    JobSet's FailJobSet rule end it without a restart, whatever max_restarts says."""
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", slices=2, max_restarts=3,
                 sim={"outcome": "oom", "duration_seconds": 60})
        h.run()

    _, gcp = both(make, (reserved_cluster(count=16),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Failed", "JobFailed")]
    assert not any("JobSet restarted" in m for m in gcp.messages["t1"])
    assert re.fullmatch(
        r"OOMKilled \(exit code 137\) \(JobSet failed: FailJobSetFailurePolicyAction after 0 "
        r"restart\(s\)\); log: gs://logs-bucket/logs/t1/falcon-t1-[a-z0-9-]+\.log; "
        + re.escape(f"{SLICE_POOLS} deleted"), gcp.row("t1")["message"])


def test_a_node_repair_under_a_running_slice_is_survived_on_both_backends(make: Make) -> None:
    """The evicted pods' DisruptionTarget condition reaches the gcp informer through
    the official client: the task completes, and the disruption was its Message."""
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", sim={"outcome": "node-repair", "duration_seconds": 600})
        h.run()

    _, gcp = both(make, (reserved_cluster(),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert any(m.startswith("disrupted: 4 pod(s) killed on node gke-") and
               "EvictionByEvictionAPI: Eviction API: evicting" in m for m in gcp.messages["t1"])
    # the informer may show the slice's four evictions one at a time: one disruption
    assert gcp.row("t1")["message"].startswith("succeeded (4 pod(s))")
    assert not any("disruption 2" in m for m in gcp.messages["t1"])


def test_a_pending_leaders_followers_refusal_reaches_the_gcp_informer(make: Make) -> None:
    """The world's JobSet webhook refuses the followers while the leader waits for TPUs:
    the API server shows that as the child Job's FailedCreate event, which the informer
    reads, so the task says it after the leader's cause, as on the sim backend. (Only
    the gcp run: its diagnosis of the pending leader is worded as the real API's, not
    as the simulated one's.)"""
    gcp = make("gcp", reserved_cluster(count=16))
    gcp.submit("t1", topology="4x4", slices=2, timeout_seconds=900,
               sim={"outcome": "unschedulable"})
    gcp.run()
    assert gcp.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "Timeout")]
    words = ("until it is scheduled the JobSet webhook refuses its followers (expected, "
             'transient): child Job falcon-t1-slice-0: Error creating: admission webhook '
             '"vpod.kb.io" denied the request: follower pod node selector for topology '
             'domain not found. missing selector: cloud.google.com/gke-nodepool')
    pending = [m for m in gcp.messages["t1"] if m.startswith("pods pending: ") and words in m]
    assert pending, gcp.messages["t1"]
    assert 0 < pending[0].index("Insufficient google.com/tpu") < pending[0].index(words)


def test_the_jobset_controllers_refusal_leads_on_both_backends(make: Make) -> None:
    """The namespace's quota refuses every Job: the world's JobSet controller records
    JobCreationFailed on the JobSet, which the API server serves as an event on it and
    the informer's watch of events on JobSets reads, so the task leads with the
    controller's words and fails JobSubmitFailed after the grace, as on the sim
    backend; a single-slice task's own Job create is refused in the quota's words (the
    gcp adapter names the create it was refused)."""
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", slices=2, sim={"outcome": "jobs-refused"})
        h.run()

    _, gcp = both(make, (reserved_cluster(count=16),), scenario)
    assert gcp.history["t1"][-1] == ("Failed", "JobSubmitFailed")
    cause = "JobSet controller JobCreationFailed: job \"falcon-t1-slice-0\" creation failed"
    assert any(m.startswith(cause) and m.endswith("; JobSet falcon-t1 cannot create its Jobs")
               for m in gcp.messages["t1"]), gcp.messages["t1"]
    assert gcp.row("t1")["message"].startswith(cause)
    gcp.submit("t2", sim={"outcome": "jobs-refused"})
    gcp.run()
    assert gcp.history["t2"][-1] == ("Failed", "JobSubmitFailed")
    message = gcp.row("t2")["message"]
    assert message.startswith("Job falcon-t2 could not be submitted: creating Job falcon-t2 ")
    assert 'jobs.batch "falcon-t2" is forbidden: exceeded quota: falcon-jobs' in message


def test_an_aborted_multi_slice_task_deletes_its_jobset_and_every_pool(make: Make) -> None:
    def scenario(h: Harness) -> None:
        h.submit("t1", topology="4x4", slices=2, sim={"duration_seconds": 5000})
        h.run(_status_is(h, "t1", "Running"))
        h.abort("t1")
        h.run()

    _, gcp = both(make, (reserved_cluster(count=16),), scenario)
    assert gcp.history["t1"] == [*RESERVED_PATH, ("Aborting", None), ("Aborted", None)]
    assert gcp.row("t1")["message"] == f"aborted while Running; {SLICE_POOLS} deleted"
    assert isinstance(gcp, GcpHarness)
    kube = gcp.cloud.kube["v6e-res"]
    assert kube.names("jobsets") == [] and kube.names("jobs") == [] and kube.names("pods") == []
    assert gcp.live_pools() == []


def test_multi_slice_pools_are_handed_over_one_by_one_on_both_backends(make: Make) -> None:
    """A two-slice task takes the pool "a" leaves and creates its second slice; when it
    ends, its two pools go to the two single-slice tasks waiting behind it."""
    def scenario(h: Harness) -> None:
        h.submit("a", topology="4x4", sim={"duration_seconds": 120})
        h.clock.advance(1)
        h.submit("ms", topology="4x4", slices=2, sim={"duration_seconds": 300})
        h.clock.advance(1)
        for name in ("s1", "s2"):
            h.submit(name, topology="4x4", sim={"duration_seconds": 60})
            h.clock.advance(1)
        h.run()

    _, gcp = both(make, (reserved_cluster(count=8),), scenario)
    assert gcp.row("ms")["message"] == (
        "succeeded (8 pod(s)); node pool falcon-a-4x4 handed over to s1; "
        "node pool falcon-ms-4x4-s1 handed over to s2")
    assert {t: gcp.statuses()[t] for t in ("a", "ms", "s1", "s2")} == {
        t: ("Succeeded", None) for t in ("a", "ms", "s1", "s2")}
    assert sorted(p.name for p in gcp.world.pools(include_deleted=True)) == [
        "falcon-a-4x4", "falcon-ms-4x4-s1"]
    assert gcp.live_pools() == []


def test_tasks_on_a_regional_cluster_through_the_official_clients(make: Make) -> None:
    """A regional cluster (region us-central1, TPU pools in us-central1-b): GKE is
    addressed by the region, every pool is created in the node zone (a multi-host
    COMPACT slice over the region's three zones would be refused), the reservation is
    read in that zone; the sim and the gcp backends agree."""
    regional = dataclasses.replace(reserved_cluster("v6e-reg", count=8), location="us-central1",
                                   node_location="us-central1-b")

    def scenario(h: Harness) -> None:
        h.submit("big", topology="4x4")
        h.submit("small", topology="2x2", supply_mode="flex-start")
        h.run()

    _, gcp = both(make, (regional,), scenario)
    assert gcp.statuses() == {"big": ("Succeeded", None), "small": ("Succeeded", None)}
    assert {(p.topology, p.zones) for p in gcp.world.pools(include_deleted=True)} == {
        ("4x4", ("us-central1-b",)), ("2x2", ("us-central1-b",))}
    # the sim-backed GKE answers 404 to a cluster path with another location than
    # us-central1, so the tasks' success shows every call named the region
