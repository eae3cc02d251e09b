"""``falcon-es smoke`` against the sim-backed fakes: the real gcp adapters (GKE over
gRPC, Compute over REST, the kubernetes client with Google tokens, the informer),
Google's Pub/Sub emulator and the Cloud Storage emulator.

The world behind the fakes plays the quiet configuration of the lifecycle tests,
whose every value lies inside the packaged model's ranges, so a whole run agrees on
every row it observes; a world configured otherwise is flagged in exactly the rows it
changes. Time is the world's virtual clock: each of smoke's waits moves it and then
waits, in wall time, until the informer has published what changed. GCS FUSE is
played by the test: once the Job is Complete its log file is uploaded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud import container_v1

from falcon_es.adapters.gcp.doctor import Doctor
from falcon_es.adapters.gcp.iam import EDGE_PERMISSIONS
from falcon_es.adapters.gcp.informer import InformerSettings, run_informer
from falcon_es.adapters.gcp.log_files import GcsLogFiles
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.adapters.gcp.wiring import GcpBackend, build_gcp_backend
from falcon_es.adapters.sim import SimClusterConfig, SimWorld
from falcon_es.adapters.sim.config import JobDefaults, Span
from falcon_es.app.smoke import (
    INTERRUPTED, PASSED, REFUSED, SmokeOptions, SmokeReport, SmokeRun, SmokeTools,
)
from falcon_es.app.smoke_model import ROWS, Model
from falcon_es.cli.smoke import report_data, report_text
from falcon_es.config.retry import Backoff
from falcon_es.config.settings import Settings
from falcon_es.domain.clock import VirtualClock, WallClock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import PortError
from tests.fakes import fixtures, storage_emulator
from tests.fakes.fixtures import unique_name
from tests.fakes.pubsub_emulator import PubSubEmulator
from tests.fakes.sim_backed import SimBackedCloud, TracedPublisher
from tests.support.harness import Harnesses, reserved_cluster, sim_config
from tests.test_gcp_cli import QUICK

pubsub_emulator = fixtures.pubsub_emulator

START = dt.datetime(2026, 11, 1, 9, 0, 0)
RUN_ID = "t1"
FAST_BACKOFF = Backoff(initial=0.05, maximum=0.5, multiplier=2.0, jitter=0.0, attempts=1)
#: Wall seconds a wait gives the informer to publish what changed.
PUBLISH_WAIT_SECONDS = 10.0
STEPS = ("doctor", "queue", "informer", "node pool", "nodes", "job submitted", "job ended",
         "log read back", "job deleted", "node pool deleted", "operation kept")


@dataclasses.dataclass
class Rig:
    """A cloud of fakes around one world, and smoke's tools on it."""

    cloud: SimBackedCloud
    backend: GcpBackend
    cluster: Cluster
    settings: Settings
    log_files: GcsLogFiles
    bucket: Any
    holders: list[str] = dataclasses.field(default_factory=list)
    #: A step to interrupt: at its first wait, else as the next step starts.
    interrupt_at: str | None = None
    run_id: str = RUN_ID
    #: How many Ctrl-C: a second one lands in the clean-up's first wait.
    interrupts: int = 1
    _armed: bool = False

    def on_step(self, name: str) -> None:
        self._fire()
        self._armed = name == self.interrupt_at
        if self._armed and name == STEPS[-1]:  # no next step to be interrupted at
            self._fire()

    def _fire(self) -> None:
        if self._armed:
            self.interrupts -= 1
            self._armed = self.interrupts > 0  # else the clean-up's own waits go on
            raise KeyboardInterrupt

    def wait(self, seconds: float) -> None:
        self._fire()
        clock = self.cloud.world.clock
        assert isinstance(clock, VirtualClock)
        clock.advance(seconds)
        self.cloud.step()
        self.cloud.trace.wait_until_published(PUBLISH_WAIT_SECONDS)
        self._upload_finished_log()

    def _upload_finished_log(self) -> None:
        """GCS FUSE's part: the file is uploaded when the container has exited."""
        job = f"smoke-{self.run_id}"
        name = f"logs/{job}/{job}-0.log"
        try:
            ended = "Complete" in self.backend.edges.for_cluster(self.cluster).job_conditions(job)
        except PortError:
            return
        if ended and self.bucket.get_blob(name) is None:
            self.bucket.blob(name).upload_from_string(
                f"falcon-es smoke {self.run_id}: hello from the TPU node\n")

    def informer(self, cluster: Cluster, settings: InformerSettings, stop: Any) -> object:
        publisher = TracedPublisher(self.backend.bus, self.cloud.trace, cluster.name)
        return run_informer(cluster, self.backend.edges, publisher, stop,
                            settings=dataclasses.replace(settings, backoff=FAST_BACKOFF),
                            clock=self.cloud.world.clock)

    def tools(self) -> SmokeTools:
        return SmokeTools(
            settings=self.settings, node_pools=self.backend.node_pools,
            reservations=self.backend.reservations, edges=self.backend.edges,
            bus=self.backend.bus, log_files=self.log_files, clock=self.cloud.world.clock,
            wait=self.wait, doctor=lambda cluster: Doctor(self.settings).run([cluster]),
            informer=self.informer, slot_holders=lambda cluster, topology: self.holders)

    def smoke(self, **options: Any) -> SmokeReport:
        chosen = {"supply_mode": "reservation", "topology": "2x2", "run_id": RUN_ID,
                  "poll_seconds": 1.0, **options}
        self.run_id = chosen["run_id"]
        return SmokeRun(self.cluster, self.tools(), SmokeOptions(**chosen),
                        model=Model.packaged(), on_step=self.on_step).run()

    # -- what is left in the cloud --------------------------------------------------

    def smoke_pools(self) -> list[str]:
        return [p.name for p in self.backend.node_pools.list(self.cluster)
                if p.name.startswith("smoke-") and p.status != "STOPPING"]

    def smoke_jobs(self) -> list[str]:
        edge = self.backend.edges.for_cluster(self.cluster)
        return [j.metadata.name for j in edge.batch.list_namespaced_job(edge.namespace).items
                if j.metadata.name.startswith("smoke-")]

    def smoke_topics(self) -> list[str]:
        from google.cloud import pubsub_v1

        publisher = pubsub_v1.PublisherClient()
        return [t.name for t in publisher.list_topics(
            request={"project": f"projects/{self.backend.bus.project}"})
            if "/topics/smoke-" in t.name]


def _cluster_row(config: SimClusterConfig) -> Cluster:
    return Cluster(id=f"sim-{config.name}", name=config.name, project="proj",
                   location="us-east5-b", tpu_type="v6e", gcs_bucket="logs-bucket",
                   status="active", default_reservation=config.default_reservation,
                   created_at=START, node_location="us-east5-b")


@pytest.fixture
def rig_of(tmp_path: Path, pubsub_emulator: PubSubEmulator,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Rig]]:
    made: list[tuple[SimBackedCloud, GcpBackend]] = []
    storage = storage_emulator.storage_emulator()
    storage_host = storage.__enter__()

    def make(outcome: str = "succeed", **behaviour: Any) -> Rig:
        config = reserved_cluster(count=2, **behaviour)
        world_config = dataclasses.replace(sim_config(config), jobs=JobDefaults(
            duration_seconds=5.0, pod_start=Span(3, 3), outcome=outcome, exit_code=3))
        world = SimWorld(VirtualClock(START), world_config)
        cloud = SimBackedCloud(world).start()
        key = cloud.authority.service_account_file(tmp_path, pubsub_emulator.project)
        env = {**cloud.environment(key), "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
               "FALCON_PUBSUB_PROJECT": pubsub_emulator.project,
               "STORAGE_EMULATOR_HOST": storage_host,
               "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge"),
               "FALCON_EDGE_EVENTS_SUBSCRIPTION": unique_name("edge-sub"),
               "FALCON_TASK_EVENTS_TOPIC": unique_name("ops")}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = Settings.from_env(env)
        backend = build_gcp_backend(settings, clock=world.clock)
        made.append((cloud, backend))
        backend.bus.create_topic(env["FALCON_EDGE_EVENTS_TOPIC"])
        backend.bus.create_topic(env["FALCON_TASK_EVENTS_TOPIC"])
        backend.bus.create_subscription(env["FALCON_EDGE_EVENTS_SUBSCRIPTION"],
                                        env["FALCON_EDGE_EVENTS_TOPIC"], message_ordering=False)
        cloud.resource_manager.grant("proj", EDGE_PERMISSIONS)
        client = storage_emulator.client(storage_host)
        bucket = client.lookup_bucket("logs-bucket") or client.create_bucket("logs-bucket")
        return Rig(cloud, backend, _cluster_row(config), settings,
                   GcsLogFiles(client), bucket)

    yield make
    for cloud, backend in made:
        backend.close()
        cloud.stop()
    storage.__exit__(None, None, None)


def verdicts(report: SmokeReport) -> dict[str, bool | None]:
    return {check.row: check.agrees for check in report.checks}


def assert_nothing_left(rig: Rig, report: SmokeReport) -> None:
    assert report.left == []
    assert rig.smoke_pools() == []
    assert rig.smoke_jobs() == []
    assert rig.smoke_topics() == []


def test_a_whole_run_on_the_fakes_agrees_with_the_model_on_every_row(
        rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    report = rig.smoke()
    assert report.outcome == PASSED, report.steps
    assert [step.name for step in report.steps] == list(STEPS)
    assert all(step.outcome == "ok" for step in report.steps)
    assert set(verdicts(report)) == set(ROWS)
    # A reservation pool brings its nodes at create: no autoscaler to hear from.
    assert verdicts(report) == {**{row: True for row in ROWS}, "autoscaler-events": None}
    steps = {step.name: step for step in report.steps}
    assert "2 free slice(s)" in steps["queue"].observed
    assert "1 free slice(s)" in steps["nodes"].observed
    assert steps["node pool"].seconds == pytest.approx(60, abs=2)  # QUIET's create latency
    assert "gs://logs-bucket/logs/smoke-t1/" in steps["log read back"].observed
    assert_nothing_left(rig, report)


def test_keep_leaves_the_pool_and_the_next_run_reuses_it(rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    first = rig.smoke(keep=True)
    assert first.outcome == PASSED
    assert first.kept == ["node pool smoke-2x2-res (--keep: a later run reuses it)"]
    assert rig.smoke_pools() == ["smoke-2x2-res"]
    second = rig.smoke(run_id="t2")
    assert second.outcome == PASSED, [s for s in second.steps if s.outcome != "ok"]
    assert "reused smoke-2x2-res" in second.steps[3].observed
    assert verdicts(second)["gke-pool-visibility"] is None  # nothing was created to see
    assert rig.smoke_pools() == []


@pytest.mark.parametrize("step", STEPS)
def test_an_interruption_at_any_step_leaves_nothing_behind(
        rig_of: Callable[..., Rig], step: str) -> None:
    rig = rig_of()
    rig.interrupt_at = step
    report = rig.smoke()
    assert report.outcome == INTERRUPTED
    assert report.steps[-1].outcome in ("interrupted", "ok")
    assert_nothing_left(rig, report)


def test_a_second_interruption_during_the_clean_up_lists_what_was_left(
        rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    rig.interrupt_at, rig.interrupts = "job ended", 2
    report = rig.smoke()
    assert report.outcome == INTERRUPTED
    # The Job went first (newest first, no wait); the pool's delete was asked, its end
    # not waited for.
    assert report.left == [
        "pool smoke-2x2-res: not deleted (interrupted during clean-up)",
        "subscription smoke-t1-edge-events: not deleted (interrupted during clean-up)",
        "topic smoke-t1-edge-events: not deleted (interrupted during clean-up)"]
    assert rig.smoke_jobs() == []
    # What the how-to says to do by hand (the emulator outlives this test).
    rig.backend.bus.delete_subscription("smoke-t1-edge-events")
    rig.backend.bus.delete_topic("smoke-t1-edge-events")


def test_a_failed_doctor_check_refuses_the_run(rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    rig.cloud.gke.workload_identity = False
    report = rig.smoke()
    assert report.outcome == REFUSED
    assert [s.name for s in report.steps] == ["doctor"]
    assert "Workload Identity" in report.steps[0].observed
    assert_nothing_left(rig, report)


def test_a_cluster_whose_queue_is_held_is_refused_before_anything_is_made(
        rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    rig.holders = ["train-42"]
    report = rig.smoke()
    assert report.outcome == REFUSED
    assert "held by task(s) train-42" in report.steps[-1].observed
    assert [s.name for s in report.steps] == ["doctor", "queue"]
    assert_nothing_left(rig, report)


def test_a_longer_visibility_delay_is_flagged_in_that_row_only(
        rig_of: Callable[..., Rig]) -> None:
    rig = rig_of(visibility_delay={"reservation": Span(45, 45), "on-demand": Span(0, 0),
                                   "flex-start": Span(20, 20)})
    report = rig.smoke()
    assert report.outcome == PASSED
    differs = [row for row, agrees in verdicts(report).items() if agrees is False]
    assert differs == ["gke-pool-visibility"]
    (check,) = [c for c in report.checks if c.row == "gke-pool-visibility"]
    assert check.assumed == "visible at once (reservation)"
    assert check.observed.startswith("visible 4")
    command = "falcon-es smoke --cluster v6e-res --supply-mode reservation --topology 2x2"
    text = report_text(report, command)
    assert "  DIFFERS      gke-pool-visibility" in text
    assert text.count("Finding: ") == 1
    assert ("Ledger row: `gke-pool-visibility` in docs/FIDELITY.md (a just-created pool can "
            "be missing from get for a while)") in text
    data = json.loads(json.dumps(report_data(report, command)))
    assert [f.splitlines()[0] for f in data["findings"]] == [
        "Finding: the model's row `gke-pool-visibility` differs from what cluster v6e-res did"]
    assert {c["row"]: c["agrees"] for c in data["checks"]} == verdicts(report)


def test_other_operation_words_are_flagged_in_that_row_only(
        rig_of: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch) -> None:
    rig = rig_of()
    answer = rig.cloud.gke._operation

    def pending_first(operation: Any, record: Any) -> container_v1.Operation:
        message = answer(operation, record)
        if message.status == container_v1.Operation.Status.RUNNING:
            message.status = container_v1.Operation.Status.PENDING
        return message

    monkeypatch.setattr(rig.cloud.gke, "_operation", pending_first)
    report = rig.smoke()
    assert report.outcome == PASSED
    differs = [c for c in report.checks if c.agrees is False]
    assert [c.row for c in differs] == ["gke-operation-words"]
    assert differs[0].observed == "status words PENDING, DONE"


def test_a_flex_start_run_hears_the_autoscaler(rig_of: Callable[..., Rig]) -> None:
    rig = rig_of()
    report = rig.smoke(supply_mode="flex-start")
    assert report.outcome == PASSED, [s for s in report.steps if s.outcome != "ok"]
    # The nodes come after the Job: the autoscaler scales the pool up for its pod.
    assert [step.name for step in report.steps][4:7] == ["job submitted", "nodes", "job ended"]
    assert verdicts(report) == {**{row: True for row in ROWS}, "reservation-in-use": None}
    (heard,) = [c for c in report.checks if c.row == "autoscaler-events"]
    assert heard.observed.startswith("TriggeredScaleUp: pod triggered scale-up: [{")
    assert_nothing_left(rig, report)


def test_every_row_smoke_names_carries_its_id_once_in_the_ledger() -> None:
    ledger = (Path(__file__).parent.parent / "docs" / "FIDELITY.md").read_text("utf-8")
    ids = re.findall(r"^\| \*\*`([a-z0-9-]+)`\*\* ", ledger, flags=re.MULTILINE)
    assert len(ids) == len(set(ids))
    assert set(ROWS) <= set(ids)


def test_smoke_of_an_unregistered_cluster_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from falcon_es.cli import main
    from tests.conftest import migrate

    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    result = CliRunner().invoke(main, ["--db", url, "smoke", "--cluster", "nowhere"])
    assert result.exit_code == 2, result.output
    assert "smoke: no registered cluster named nowhere" in result.output


def test_a_failed_step_stops_the_run_and_cleans_up(rig_of: Callable[..., Rig]) -> None:
    rig = rig_of(outcome="fail")
    report = rig.smoke()
    assert report.outcome == "failed"
    failed = report.steps[-1]
    assert (failed.name, failed.outcome) == ("job ended", "failed")
    assert failed.observed.startswith("Job smoke-t1 ended with conditions Failed")
    # The model's failed Job ends with Failed at once too: the step fails, not the row.
    assert verdicts(report)["job-conditions"] is True
    assert_nothing_left(rig, report)


def test_a_job_controller_that_marks_success_first_is_flagged() -> None:
    """Kubernetes 1.31 adds SuccessCriteriaMet before Complete; the sim does not."""
    from falcon_es.app.smoke_model import Observations, check_job_conditions

    seen = Observations("reservation", job_conditions=["SuccessCriteriaMet", "Complete"])
    check = check_job_conditions(seen)
    assert (check.agrees, check.observed) == (False, "conditions SuccessCriteriaMet, Complete")
    assert check_job_conditions(Observations("reservation")).agrees is None


# ----------------------------------------------------------------------- the command

def _follow_the_wall_clock(cloud: SimBackedCloud, bucket: Any, stop: threading.Event) -> None:
    """The world moves with the wall clock (the command runs on it), and GCS FUSE
    uploads a smoke Job's log file once the Job is Complete."""
    server = cloud.kube["v6e-res"]
    while not stop.is_set():
        cloud.step()
        for name in server.names("jobs", "falcon-jobs"):
            job = server.get("jobs", name, "falcon-jobs") or {}
            types = [c["type"] for c in (job.get("status") or {}).get("conditions") or ()]
            blob = f"logs/{name}/{name}-0.log"
            if "Complete" in types and bucket.get_blob(blob) is None:
                run_id = name.removeprefix("smoke-")
                bucket.blob(blob).upload_from_string(
                    f"falcon-es smoke {run_id}: hello from the TPU node\n")
        stop.wait(0.05)


def test_the_command_reports_steps_rows_and_findings_as_json(
        tmp_path: Path, pubsub_emulator: PubSubEmulator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from falcon_es.app.application import open_app
    from falcon_es.cli import main
    from falcon_es.storage import registry
    from tests.conftest import migrate

    # The world of the controller's own gcp run: much faster than the model.
    config = dataclasses.replace(reserved_cluster(count=2), behaviour=QUICK)
    world = SimWorld(WallClock(), dataclasses.replace(
        sim_config(config), jobs=JobDefaults(duration_seconds=1.0, pod_start=Span(0.2, 0.2))))
    cloud = SimBackedCloud(world).start()
    cloud.resource_manager.grant("proj", EDGE_PERMISSIONS)
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    app = open_app(Settings(db_url=url))
    registry.add_cluster(app.store, name="v6e-res", project="proj", location="us-east5-b",
                         tpu_type="v6e", gcs_bucket="logs-bucket",
                         default_reservation=config.default_reservation)
    app.close()
    stop = threading.Event()
    with storage_emulator.storage_emulator() as storage_host:
        client = storage_emulator.client(storage_host)
        bucket = client.create_bucket("logs-bucket")
        key = cloud.authority.service_account_file(tmp_path, pubsub_emulator.project)
        env = {**cloud.environment(key), "FALCON_DB_URL": url,
               "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
               "STORAGE_EMULATOR_HOST": storage_host,
               "FALCON_PUBSUB_PROJECT": pubsub_emulator.project,
               "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge"),
               "FALCON_EDGE_EVENTS_SUBSCRIPTION": unique_name("edge-sub"),
               "FALCON_TASK_EVENTS_TOPIC": unique_name("ops")}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        bus = PubSubBus(pubsub_emulator.project, pull_timeout_seconds=0.5)
        bus.create_topic(env["FALCON_EDGE_EVENTS_TOPIC"])
        bus.create_topic(env["FALCON_TASK_EVENTS_TOPIC"])
        bus.create_subscription(env["FALCON_EDGE_EVENTS_SUBSCRIPTION"],
                                env["FALCON_EDGE_EVENTS_TOPIC"], message_ordering=False)
        stepper = threading.Thread(target=_follow_the_wall_clock, args=(cloud, bucket, stop),
                                   daemon=True)
        stepper.start()
        try:
            result = CliRunner().invoke(main, ["smoke", "--cluster", "v6e-res",
                                               "--poll-seconds", "0.2", "--json"])
        finally:
            stop.set()
            stepper.join(timeout=10)
            bus.close()
            cloud.stop()
    assert result.exit_code == 1, result.output  # rows differ
    report = json.loads(result.output)
    # The reservation holds 4-chip VMs: its smallest slice is 2x2, not v6e's 1x1.
    assert (report["outcome"], report["supply_mode"], report["topology"]) == (
        "passed", "reservation", "2x2")
    assert [s["name"] for s in report["steps"]] == list(STEPS)
    differs = {c["row"] for c in report["checks"] if c["agrees"] is False}
    # Nodes at once where the model waits 20 s and more; everything else as modelled.
    assert differs == {"gke-node-registration"}, report["checks"]
    assert [f.splitlines()[1] for f in report["findings"]] == [
        f"Ledger row: `gke-node-registration` in docs/FIDELITY.md "
        f"({ROWS['gke-node-registration']})"]
    assert report["left"] == [] and world.pools() == []


def test_the_queue_guard_reads_the_slot_holder_from_the_log(
        make: Harnesses, db_url: str, clock: VirtualClock) -> None:
    """The guard folds the queue book as a starting controller does: a task being
    provisioned holds its queue's slot, a running one no longer does."""
    from falcon_es.app.application import open_app
    from falcon_es.app.smoke import slot_holders_of
    from falcon_es.storage import registry

    h = make(reserved_cluster())
    h.submit("t1")

    def holders(topology: str) -> list[str]:
        app = open_app(Settings(db_url=db_url), clock)
        try:
            with app.engine.connect() as conn:
                cluster = registry.find_cluster(conn, "v6e-res")
            assert cluster is not None
            return slot_holders_of(app)(cluster, topology)
        finally:
            app.close()

    h.run(lambda: h.row("t1")["reason"] == "Provisioning")
    assert (holders("2x2"), holders("2x4")) == (["t1"], [])
    h.run(lambda: h.row("t1")["status"] == "Running")
    assert holders("2x2") == []
