"""``falcon-es doctor``, ``falcon-es informer`` and ``falcon-es clusters`` against the
sim-backed GKE, Compute and Kubernetes fakes (tests/fakes/sim_backed.py), Google's
Pub/Sub emulator, and credentials found by ``google.auth.default()`` in a
service-account key whose token endpoint is local.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from google.oauth2 import service_account

from falcon_es.domain.clusters import cluster_stream
from falcon_es.jobtable import job_rows
from falcon_es.storage import registry
from falcon_es.adapters.gcp.iam import EDGE_PERMISSIONS
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import GkeEndpoints, GoogleAccessTokens
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.adapters.gcp.wiring import build_cluster_manager
from falcon_es.adapters.sim import (
    ClusterBehaviour, JobDefaults, SimClusterConfig, SimConfig, SimWorld, Span, build_sim_ports,
)
from falcon_es.app.application import open_app
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock, WallClock, utcnow
from falcon_es.domain.manifests import JobPlacement, render_job
from falcon_es.domain.ports import JobObservation
from falcon_es.config.settings import Settings
from falcon_es.domain.spec import SUPPLY_MODES
from falcon_es.domain.tpu import slice_shape
from falcon_es.storage.tables import clusters as cluster_rows
from tests.fakes import fixtures
from tests.fakes.fixtures import unique_name
from tests.fakes.pubsub_emulator import PubSubEmulator, free_port
from tests.fakes.sim_backed import SimBackedCloud
from tests.support.harness import Harness, reserved_cluster, sim_config

pubsub_emulator = fixtures.pubsub_emulator

START = dt.datetime(2026, 11, 1, 9, 0, 0)
#: v6e-res: project proj, zone us-east5-b, reservation v6e-res-r of two VMs.
CLUSTER = reserved_cluster(count=2)


@dataclasses.dataclass
class Installation:
    """A database with the cluster registered, the cloud around it, the topics."""

    db_url: str
    cloud: SimBackedCloud
    env: dict[str, str]
    bus: PubSubBus

    def cli(self, *args: str, **env: str) -> Result:
        return CliRunner(env={**self.env, **env}).invoke(main, list(args))


#: A regional cluster beside it: region us-central1, TPU pools in us-central1-b.
REGIONAL = dataclasses.replace(reserved_cluster("v6e-reg", count=2), location="us-central1",
                               node_location="us-central1-b")


@pytest.fixture
def installation(db_url: str, tmp_path: Path, pubsub_emulator: PubSubEmulator,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Installation]:
    yield from _installation(db_url, tmp_path, pubsub_emulator, monkeypatch, CLUSTER)


@pytest.fixture
def regional_installation(db_url: str, tmp_path: Path, pubsub_emulator: PubSubEmulator,
                          monkeypatch: pytest.MonkeyPatch) -> Iterator[Installation]:
    yield from _installation(db_url, tmp_path, pubsub_emulator, monkeypatch, CLUSTER, REGIONAL)


def _installation(db_url: str, tmp_path: Path, pubsub_emulator: PubSubEmulator,
                  monkeypatch: pytest.MonkeyPatch, *clusters: SimClusterConfig,
                  ) -> Iterator[Installation]:
    world = SimWorld(VirtualClock(START), sim_config(*clusters))
    cloud = SimBackedCloud(world).start()
    key = cloud.authority.service_account_file(tmp_path, pubsub_emulator.project)
    env = {**cloud.environment(key), "FALCON_DB_URL": db_url,
           "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
           "FALCON_PUBSUB_PROJECT": pubsub_emulator.project,
           "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge"),
           "FALCON_EDGE_EVENTS_SUBSCRIPTION": unique_name("edge-sub"),
           "FALCON_TASK_EVENTS_TOPIC": unique_name("ops")}
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    bus = PubSubBus(pubsub_emulator.project, pull_timeout_seconds=0.5)
    app = open_app(Settings(db_url=db_url))
    for cluster in clusters:
        registry.add_cluster(app.store, name=cluster.name, project="proj",
                             location=cluster.location or "us-east5-b", tpu_type="v6e",
                             gcs_bucket="logs-bucket", node_location=cluster.node_location,
                             default_reservation=cluster.default_reservation)
    app.close()
    cloud.resource_manager.grant("proj", EDGE_PERMISSIONS)
    yield Installation(db_url, cloud, env, bus)
    bus.close()
    cloud.stop()


def topics(installation: Installation, *, subscription: bool = True) -> None:
    env = installation.env
    installation.bus.create_topic(env["FALCON_EDGE_EVENTS_TOPIC"])
    installation.bus.create_topic(env["FALCON_TASK_EVENTS_TOPIC"])
    if subscription:
        installation.bus.create_subscription(env["FALCON_EDGE_EVENTS_SUBSCRIPTION"],
                                             env["FALCON_EDGE_EVENTS_TOPIC"],
                                             message_ordering=False)


def lines(result: Result) -> dict[str, str]:
    """Each check line by its subject and name ("cluster v6e-res: GKE get_cluster")."""
    found = {}
    for line in result.output.splitlines():
        if line[:4] in ("ok  ", "FAIL", "skip"):
            subject_and_name = ": ".join(line[5:].split(": ")[:2])
            found[subject_and_name] = line
    return found


# ----------------------------------------------------------------------- doctor


def test_doctor_passes_every_check_of_a_working_installation(installation: Installation) -> None:
    topics(installation)
    result = installation.cli("doctor")
    assert result.exit_code == 0, result.output
    found = lines(result)
    assert all(line.startswith("ok") for line in found.values()), result.output
    assert list(found) == [
        "database: " + found_key(found, "database"),
        "credentials: Application Default Credentials",
        "cluster v6e-res: GKE get_cluster", "cluster v6e-res: location",
        "cluster v6e-res: Workload Identity",
        "cluster v6e-res: GCS FUSE CSI driver", "cluster v6e-res: TPU pool upgrades",
        "cluster v6e-res: Kubernetes API",
        "cluster v6e-res: JobSet CRD", "cluster v6e-res: node pools list",
        "cluster v6e-res: reservation v6e-res-r",
        "project proj: falconEdgeOperator permissions",
        f"pubsub: topic {installation.env['FALCON_EDGE_EVENTS_TOPIC']}",
        f"pubsub: topic {installation.env['FALCON_TASK_EVENTS_TOPIC']}",
        f"pubsub: subscription {installation.env['FALCON_EDGE_EVENTS_SUBSCRIPTION']}",
    ]
    credentials = found["credentials: Application Default Credentials"]
    assert "service account falcon-controller@falcon-test.iam.gserviceaccount.com" in credentials
    assert "ya29." not in result.output  # the token is never shown
    assert "2 of 2 ct6e-standard-4t VM(s) free" in found["cluster v6e-res: reservation v6e-res-r"]
    assert "v1.33" in found["cluster v6e-res: Kubernetes API"]
    assert f"all {len(EDGE_PERMISSIONS)} permissions held" in found["project proj: falconEdgeOperator permissions"]
    (call,) = installation.cloud.resource_manager.calls
    assert call[:2] == ("proj", EDGE_PERMISSIONS)
    assert found["cluster v6e-res: location"] == (
        "ok   cluster v6e-res: location: zonal cluster (zone us-east5-b); TPU pools and "
        "reservations in zone us-east5-b")
    assert result.output.rstrip().endswith("15 checks, all passed")


def found_key(found: dict[str, str], subject: str) -> str:
    return next(k for k in found if k.startswith(subject + ": ")).split(": ", 1)[1]


def test_doctor_names_the_root_cause_and_the_fix(installation: Installation) -> None:
    topics(installation, subscription=False)
    installation.cloud.gke.workload_identity = False
    installation.cloud.gke.gcs_fuse = False
    installation.cloud.resource_manager.revoke("proj", "container.jobs.create",
                                               "container.clusters.update")
    app = open_app(Settings(db_url=installation.db_url))
    registry.add_cluster(app.store, name="ghost", project="proj", location="us-east5-a",
                         tpu_type="v6e", gcs_bucket="b", default_reservation="nowhere")
    app.close()

    result = installation.cli("doctor")

    assert result.exit_code == 1
    found = lines(result)
    wi = found["cluster v6e-res: Workload Identity"]
    assert wi.startswith("FAIL") and ("--workload-pool=proj.svc.id.goog" in wi)
    fuse = found["cluster v6e-res: GCS FUSE CSI driver"]
    assert fuse.startswith("FAIL") and "--update-addons GcsFuseCsiDriver=ENABLED" in fuse
    ghost = found["cluster ghost: GKE get_cluster"]
    assert ghost.startswith("FAIL") and "404 NotFound" in ghost
    assert "correct the registration" in ghost
    assert found["cluster ghost: Kubernetes API"].startswith("skip")  # root cause first
    reservation = found["cluster ghost: reservation nowhere"]
    assert "reservation nowhere not found in project proj zone us-east5-a" in reservation
    edge_subscription = installation.env["FALCON_EDGE_EVENTS_SUBSCRIPTION"]
    role = found["project proj: falconEdgeOperator permissions"]
    assert role.startswith("FAIL") and (
        f"lacks 2 of the {len(EDGE_PERMISSIONS)} permissions: container.clusters.update, "
        "container.jobs.create" in role), role
    assert "falconEdgeOperator custom role in project proj (deploy/iam/setup.sh)" in role
    subscription = found[f"pubsub: subscription {edge_subscription}"]
    assert subscription.startswith("FAIL") and "gcloud pubsub subscriptions create" in subscription


def test_doctor_says_which_kind_each_cluster_is_and_checks_the_node_zone(
        regional_installation: Installation) -> None:
    """A regional cluster is addressed by its region and its reservation is read in its
    node zone; a node zone outside GKE's zones for the cluster, and a regional row
    from before the node zone was kept, each fail with the fix."""
    installation = regional_installation
    topics(installation)
    result = installation.cli("doctor")
    assert result.exit_code == 0, result.output
    found = lines(result)
    assert found["cluster v6e-reg: location"] == (
        "ok   cluster v6e-reg: location: regional cluster (region us-central1); TPU pools "
        "and reservations in zone us-central1-b")
    assert "2 of 2 ct6e-standard-4t VM(s) free" in found["cluster v6e-reg: reservation v6e-reg-r"]
    assert found["cluster v6e-reg: GKE get_cluster"].startswith("ok")

    engine = sa.create_engine(installation.db_url)
    with engine.begin() as conn:
        conn.execute(cluster_rows.update().where(cluster_rows.c.name == "v6e-reg")
                     .values(node_location="us-central1-f"))
        conn.execute(cluster_rows.update().where(cluster_rows.c.name == "v6e-res")
                     .values(location="us-east5", node_location=None))
    engine.dispose()
    result = installation.cli("doctor")
    assert result.exit_code == 1
    found = lines(result)
    assert found["cluster v6e-reg: location"] == (
        "FAIL cluster v6e-reg: location: regional cluster (region us-central1): node zone "
        "us-central1-f is not one of the cluster's zones (us-central1-a, us-central1-b, "
        "us-central1-c) -- fix: falcon-es cluster set-node-location v6e-reg ZONE (one of "
        "those), or add the zone to the cluster (gcloud container clusters update "
        "--node-locations)")
    legacy = found["cluster v6e-res: location"]
    assert legacy.startswith("FAIL cluster v6e-res: location: regional cluster (region "
                             "us-east5) with no node zone")
    assert legacy.endswith("fix: falcon-es cluster set-node-location v6e-res ZONE")
    reservation = found["cluster v6e-res: reservation v6e-res-r"]
    assert "--node-location ZONE" in reservation and "us-east5-b" not in reservation


def test_doctor_says_how_to_install_a_missing_jobset_crd(installation: Installation) -> None:
    topics(installation)
    installation.cloud.kube["v6e-res"].jobset_crd = False
    result = installation.cli("doctor")
    assert result.exit_code == 1
    crd = lines(result)["cluster v6e-res: JobSet CRD"]
    assert crd.startswith("FAIL") and "jobsets.jobset.x-k8s.io is not served" in crd
    assert ("fix: install JobSet: kubectl apply --server-side -f "
            "https://github.com/kubernetes-sigs/jobset/releases/download/") in crd
def test_doctor_reports_tpu_pools_exposed_to_node_upgrades(installation: Installation) -> None:
    """A release-channel cluster (node auto-upgrade cannot be off) without a cluster
    maintenance exclusion, and Falcon told not to set the per-pool one."""
    topics(installation)
    result = installation.cli("doctor", FALCON_POOL_UPGRADE_EXCLUSION="false")
    assert result.exit_code == 1
    found = lines(result)["cluster v6e-res: TPU pool upgrades"]
    assert found.startswith("FAIL") and "release channel REGULAR" in found
    assert "--add-maintenance-exclusion-scope=no_minor_or_node_upgrades" in found
    assert lines(installation.cli("doctor"))["cluster v6e-res: TPU pool upgrades"].startswith(
        "ok")


def test_doctor_names_an_edge_project_the_identity_cannot_see(
        installation: Installation) -> None:
    topics(installation)
    app = open_app(Settings(db_url=installation.db_url))
    registry.add_cluster(app.store, name="far", project="hidden", location="us-east5-b",
                         tpu_type="v6e", gcs_bucket="b", default_reservation=None)
    app.close()

    result = installation.cli("doctor")

    assert result.exit_code == 1
    found = lines(result)
    assert found["project proj: falconEdgeOperator permissions"].startswith("ok")
    hidden = found["project hidden: falconEdgeOperator permissions"]
    assert hidden.startswith("FAIL") and "testIamPermissions: 403" in hidden, hidden
    assert "The caller does not have permission" in hidden
    assert "a project the identity cannot see answers 403" in hidden
    assert sorted(call[0] for call in installation.cloud.resource_manager.calls) == [
        "hidden", "proj"]  # one call per edge project


def test_doctor_without_usable_credentials_or_schema(installation: Installation,
                                                      tmp_path: Path) -> None:
    dead = tmp_path / "dead-key.json"
    key = json.loads(Path(installation.env["GOOGLE_APPLICATION_CREDENTIALS"]).read_text())
    key["token_uri"] = f"http://127.0.0.1:{free_port()}/token"
    dead.write_text(json.dumps(key))
    empty = f"sqlite:///{tmp_path / 'empty.db'}"

    result = installation.cli("doctor", GOOGLE_APPLICATION_CREDENTIALS=str(dead),
                              FALCON_DB_URL=empty)

    assert result.exit_code == 1
    found = lines(result)
    assert "without the Falcon-ES schema" in found[f"database: {empty}"]
    assert "fix: falcon-es db upgrade" in found[f"database: {empty}"]
    credentials = found["credentials: Application Default Credentials"]
    assert credentials.startswith("FAIL") and "no token could be obtained" in credentials
    assert "Workload Identity binding" in credentials
    assert found["pubsub: topics and subscription"].startswith("skip")


def test_doctor_json(installation: Installation) -> None:
    topics(installation)
    result = installation.cli("doctor", "--json")
    checks = json.loads(result.output)
    assert result.exit_code == 0
    assert {c["status"] for c in checks} == {"ok"}
    assert set(checks[0]) == {"subject", "name", "status", "detail", "fix"}


# ----------------------------------------------------------------------- informer


def test_informer_of_an_unknown_cluster_is_refused(installation: Installation) -> None:
    result = installation.cli("informer", "--cluster", "nope", "--no-health")
    assert result.exit_code == 2
    assert result.output.strip() == ("falcon-es: informer: no registered cluster named nope "
                                     "(see falcon-es cluster list)")


#: The process takes seconds just to import the Google clients: once, on SQLite (the
#: informer reads the registry and nothing else from the database).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_informer_process_publishes_serves_its_probes_and_stops_on_sigterm(
        installation: Installation) -> None:
    """``falcon-es informer --cluster NAME`` as the informer Deployment runs it."""
    topics(installation)
    port = free_port()
    env = {**os.environ, **installation.env, "FALCON_HEALTH_PORT": str(port),
           "FALCON_HEALTH_HOST": "127.0.0.1"}
    process = subprocess.Popen([sys.executable, "-m", "falcon_es", "informer", "--cluster",
                                CLUSTER.name], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        health = _get(port, "/healthz", until=lambda status: status == 200)
        ready = json.loads(_get(port, "/readyz", until=lambda status: status == 200)[1])
        installation.cloud.kube[CLUSTER.name].wait_for_watches(4)
        manifest = render_job(task_id="t1", spec={"image": "busybox"},
                              shape=slice_shape("v6e", "2x2"), pool_name="falcon-t1-2x2",
                              placement=JobPlacement("falcon-jobs", "falcon-task", "logs"))
        _submit(installation, manifest)
        observation = _pull_observation(installation)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert health[0] == 200 and ready["ready"] is True
    assert ready["detail"] == f"watching {CLUSTER.name}"
    assert (observation.job_name, observation.task_id, observation.cluster_name) == (
        "falcon-t1", "t1", CLUSTER.name)
    assert process.returncode == 0, stderr
    assert "informer stopped" in stderr


def _get(port: int, path: str, *, until: Any, timeout: float = 30.0) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                status, body = reply.status, reply.read().decode()
        except OSError:
            status, body = 0, ""
        if until(status) or time.monotonic() > deadline:
            return status, body
        time.sleep(0.1)


def _submit(installation: Installation, manifest: dict[str, Any]) -> None:
    settings = Settings.from_env(installation.env)
    credentials = service_account.Credentials.from_service_account_file(
        installation.env["GOOGLE_APPLICATION_CREDENTIALS"],
        scopes=["https://www.googleapis.com/auth/cloud-platform"])
    edges = KubeEdgeClusters(GkeEndpoints(build_cluster_manager(settings, credentials)),
                             tokens=GoogleAccessTokens(credentials))
    app = open_app(Settings(db_url=installation.db_url))
    with app.engine.connect() as conn:
        cluster = registry.find_cluster(conn, CLUSTER.name)
    app.close()
    assert cluster is not None
    edges.for_cluster(cluster).submit_job(manifest)
    edges.close()


def _pull_observation(installation: Installation) -> JobObservation:
    subscription = installation.env["FALCON_EDGE_EVENTS_SUBSCRIPTION"]
    for _ in range(100):
        messages = installation.bus.pull(subscription)
        installation.bus.ack(subscription, [m.id for m in messages])
        if messages:
            return JobObservation.from_data(messages[-1].data)
        time.sleep(0.05)
    raise AssertionError("the informer published nothing")


# ----------------------------------------------------------------------- clusters


class SharedWorldHarness(Harness):
    """The lifecycle harness on the world the fakes front (sim ports, one world)."""

    def __init__(self, db_url: str, world: SimWorld) -> None:
        super().__init__(db_url, world.clock, world.config,  # type: ignore[arg-type]
                         Settings(db_url=db_url))
        self.world = world
        world.behaviour_source = self._behaviour
        self.ports = build_sim_ports(world)
        self.rebuild()


def test_clusters_shows_pools_queues_and_live_state(installation: Installation) -> None:
    """A controller on the sim backend leaves a 2x2 and a 2x4 task (one 8-chip VM)
    running on the reservation of two VMs and a second 2x2 one in ClusterBusy;
    ``clusters`` folds that from the log, and ``--live`` asks the sim-backed GKE and
    Compute, which front the same world, what they hold now."""
    harness = SharedWorldHarness(installation.db_url, installation.cloud.world)
    try:
        for name, topology in (("long", "2x2"), ("next", "2x2"), ("wide", "2x4")):
            harness.submit(name, topology=topology, sim={"duration_seconds": 50_000})
            harness.clock.advance(1)
        harness.run(lambda: harness.statuses() == {
            "long": ("Running", None), "wide": ("Running", None),
            "next": ("Pending", "ClusterBusy")})
    finally:
        harness.close()

    result = installation.cli("clusters", "--json")
    (entry,) = json.loads(result.output)
    assert entry["name"] == CLUSTER.name and entry["default_reservation"] == "v6e-res-r"
    assert entry["pools"] == [
        {"name": f"falcon-{task}-{topology}", "topology": topology, "supply_mode": "reservation",
         "state": "active", "owner_task": task} for task, topology in (("long", "2x2"),
                                                                        ("wide", "2x4"))]
    assert entry["queues"] == [
        {"topology": "2x2", "depth": 1, "running": 1, "acquiring_task": "next"},
        {"topology": "2x4", "depth": 0, "running": 1, "acquiring_task": None}]
    # The controller's scheduled reads, as last recorded in the cluster's stream.
    app = open_app(Settings(db_url=installation.db_url))
    (cluster,) = app.cluster_cache.clusters()
    last = {r.event.topology: (r.event.slices, r.recorded_at.isoformat())
            for r in app.store.read_stream(cluster_stream(cluster.id))
            if r.type_name == "ReservationRead"}
    app.close()
    assert set(last) == {"2x2", "2x4"}
    assert {r["topology"]: (r["slices"], r["observed_at"])
            for r in entry["reservation_remaining"]} == last

    live = installation.cli("clusters", "--json", "--live")
    assert live.exit_code == 0, live.output
    (seen,) = json.loads(live.output)
    assert seen["live_pools"] == [
        {"name": f"falcon-{task}-{topology}", "status": "RUNNING", "topology": topology,
         "node_count": 1, "in_log": True} for task, topology in (("long", "2x2"),
                                                                 ("wide", "2x4"))]
    assert {(r["topology"], r["slices"]) for r in seen["reservation_remaining"]} == {
        ("2x2", 0), ("2x4", 0)}
    assert seen["errors"] == []
    table = installation.cli("clusters", "--live")
    assert "falcon-long-2x2 2x2 active (long)" in table.output
    assert "2x2: 1 pending, 1 running" in table.output
    assert "2x4: 0 slice(s) free" in table.output
    # explain --live in the job table's language: what GKE, Compute and the edge say now
    # ahead of the log's chain, the product's words in Chinese, the APIs' as they are.
    explained = installation.cli("--lang", "zh", "explain", "long", "--live")
    assert explained.exit_code == 0, explained.output
    lines = [line.split("  [")[0] for line in explained.output.splitlines()]
    assert lines[:3] == ["预留现状：v6e-res-r：剩余 0 个 2x2 切片",
                         "└─ 节点池现状：falcon-long-2x2：RUNNING，1/1 个节点 Ready",
                         "   └─ Pod 现状：Job falcon-long：没有等待的 Pod"]
    assert lines[-1].endswith("任务状态为 Running")


# ----------------------------------------------------------------------- run


QUICK = ClusterBehaviour(
    create_latency=MappingProxyType({mode: Span(0.5, 0.5) for mode in SUPPLY_MODES}),
    delete_latency=Span(0.3, 0.3),
    visibility_delay=MappingProxyType({mode: Span(0, 0) for mode in SUPPLY_MODES}),
    node_register_delay=MappingProxyType({mode: Span(0, 0) for mode in SUPPLY_MODES}),
    node_ready_lag=Span(0, 0),
)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_run_gcp_backend_with_in_process_informers_until_idle(
        db_url: str, tmp_path: Path, pubsub_emulator: PubSubEmulator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``falcon-es run --backend gcp --in-process-informers --until-idle`` as a process:
    ports from the environment, a task through its whole life on a wall-clock world
    behind the fakes, its Job's changes published by the controller's own informer, and
    every event on the ops topic."""
    config = SimConfig(seed=3, clusters=(dataclasses.replace(CLUSTER, behaviour=QUICK),),
                       defaults=QUICK, jobs=JobDefaults(duration_seconds=1.0,
                                                        pod_start=Span(0.2, 0.2)))
    cloud = SimBackedCloud(SimWorld(WallClock(), config)).start()
    stepping = threading.Event()
    stepper = threading.Thread(target=_follow_the_wall_clock, args=(cloud, stepping),
                               daemon=True)
    stepper.start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    bus = PubSubBus(pubsub_emulator.project, pull_timeout_seconds=0.5)
    try:
        key = cloud.authority.service_account_file(tmp_path, pubsub_emulator.project)
        env = {**os.environ, **cloud.environment(key), "FALCON_DB_URL": db_url,
               "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
               "FALCON_PUBSUB_PROJECT": pubsub_emulator.project,
               "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge"),
               "FALCON_EDGE_EVENTS_SUBSCRIPTION": unique_name("edge-sub"),
               "FALCON_TASK_EVENTS_TOPIC": unique_name("ops")}
        for topic in (env["FALCON_EDGE_EVENTS_TOPIC"], env["FALCON_TASK_EVENTS_TOPIC"]):
            bus.create_topic(topic)
        bus.create_subscription(env["FALCON_EDGE_EVENTS_SUBSCRIPTION"],
                                env["FALCON_EDGE_EVENTS_TOPIC"], message_ordering=False,
                                ack_deadline_seconds=10)
        ops = unique_name("ops-sub")
        bus.create_subscription(ops, env["FALCON_TASK_EVENTS_TOPIC"])
        app = open_app(Settings(db_url=db_url))
        registry.add_cluster(app.store, name=CLUSTER.name, project="proj",
                             location="us-east5-b", tpu_type="v6e", gcs_bucket="logs-bucket",
                             default_reservation=CLUSTER.default_reservation)
        job_rows.submit(app.engine, name="t1", actor="user-a", task_id="t1", now=utcnow(),
                        spec={"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                              "topology": "2x2", "command": ["python", "train.py"]})
        finished = subprocess.run(
            [sys.executable, "-m", "falcon_es", "run", "--backend", "gcp", "--until-idle",
             "--in-process-informers", "--no-health", "--tick", "0.1"],
            env=env, capture_output=True, text=True, timeout=120)
        row = job_rows.get_row(app.engine, "t1")
        head = app.store.head()
        app.close()
        published = []
        for _ in range(40):
            batch = bus.pull(ops)
            bus.ack(ops, [m.id for m in batch])
            published.extend(batch)
            if len({m.data["seq"] for m in published}) >= head:
                break
    finally:
        stepping.set()
        stepper.join(timeout=10)
        bus.close()
        cloud.stop()
    assert finished.returncode == 0, finished.stderr
    assert "stopped (idle)" in finished.stderr
    assert (row["status"], row["message"]) == (
        "Succeeded", "succeeded (1 pod(s)); node pool falcon-t1-2x2 deleted")
    assert cloud.world.pools() == []
    assert sorted({m.data["seq"] for m in published}) == list(range(1, head + 1))
    assert {m.attributes["stream_id"] for m in published} >= {"t1"}


def _follow_the_wall_clock(cloud: SimBackedCloud, stop: threading.Event) -> None:
    """The world moves with the wall clock here (the controller runs on it)."""
    while not stop.is_set():
        cloud.step()
        stop.wait(0.05)
