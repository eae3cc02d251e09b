"""A staging world: ``run --backend sim --bus pubsub`` publishes the ops stream and the
simulated informers' edge events to Google's Pub/Sub emulator, where a subscriber using
the official google-cloud-pubsub client receives every event of the run, in order per
task."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from google.cloud import pubsub_v1

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.adapters.staging import EdgeRelay
from falcon_es.adapters.sim import SimWorld
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import BackendError, RunOptions, build_service
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings, SettingsError
from falcon_es.storage.tables import task_events
from tests.conftest import migrate
from tests.fakes import fixtures
from tests.fakes.fixtures import RecordingBus, unique_name
from tests.fakes.pubsub_emulator import PubSubEmulator
from tests.test_demo_and_run import _fresh as fresh_database

pubsub_emulator = fixtures.pubsub_emulator

SPEC = {"image": "us-docker.pkg.dev/p/r/w:1", "tpu_type": "v7x", "topology": "2x2x1",
        "sim": {"duration_seconds": 300}}
FAILING = {**SPEC, "sim": {"duration_seconds": 120, "outcome": "oom"}}


@dataclasses.dataclass
class Staging:
    url: str
    env: dict[str, str]
    project: str
    subscriber: pubsub_v1.SubscriberClient

    def subscribe(self, topic: str) -> str:
        """An ordered subscription, made before the run as an ops consumer's is."""
        path = self.subscriber.subscription_path(self.project, unique_name("sub"))
        self.subscriber.create_subscription(request={
            "name": path, "topic": f"projects/{self.project}/topics/{topic}",
            "enable_message_ordering": True, "ack_deadline_seconds": 60})
        return path

    def receive(self, subscription: str, count: int) -> list[pubsub_v1.types.PubsubMessage]:
        """Pull (and acknowledge) until ``count`` messages came, in delivery order."""
        received: list[pubsub_v1.types.PubsubMessage] = []
        for _ in range(200):
            response = self.subscriber.pull(
                request={"subscription": subscription, "max_messages": 1000}, timeout=10)
            if response.received_messages:
                received.extend(m.message for m in response.received_messages)
                self.subscriber.acknowledge(request={
                    "subscription": subscription,
                    "ack_ids": [m.ack_id for m in response.received_messages]})
            if len(received) >= count:
                return received
        raise AssertionError(f"received {len(received)} of {count} messages")


@pytest.fixture
def staging(tmp_path: Path, pubsub_emulator: PubSubEmulator,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Staging]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    url = fresh_database(tmp_path)  # one v7x cluster registered, as run --backend sim wants
    env = {"PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
           "FALCON_PUBSUB_PROJECT": pubsub_emulator.project,
           "FALCON_TASK_EVENTS_TOPIC": unique_name("ops"),
           "FALCON_EDGE_EVENTS_TOPIC": unique_name("edge")}
    bus = PubSubBus(pubsub_emulator.project)
    for topic in (env["FALCON_TASK_EVENTS_TOPIC"], env["FALCON_EDGE_EVENTS_TOPIC"]):
        bus.create_topic(topic)
    bus.close()
    subscriber = pubsub_v1.SubscriberClient()
    yield Staging(url, env, pubsub_emulator.project, subscriber)
    subscriber.close()


def _logged(url: str) -> list[tuple[int, str, int, str]]:
    engine = db.make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(task_events.c.seq, task_events.c.stream_id,
                                      task_events.c.version, task_events.c.type)
                            .order_by(task_events.c.seq)).all()
    engine.dispose()
    return [tuple(row) for row in rows]


def test_a_simulated_run_publishes_every_event_to_the_emulator_in_order_per_task(
        staging: Staging) -> None:
    ops = staging.subscribe(staging.env["FALCON_TASK_EVENTS_TOPIC"])
    edge = staging.subscribe(staging.env["FALCON_EDGE_EVENTS_TOPIC"])
    engine = db.make_engine(staging.url)
    for i, spec in enumerate((SPEC, SPEC, FAILING)):
        job_rows.submit(engine, task_id=f"s{i}", name=f"s{i}", actor="a", spec=spec,
                        now=dt.datetime(2026, 11, 1))
    engine.dispose()

    result = CliRunner(env=staging.env).invoke(
        main, ["--db", staging.url, "run", "--backend", "sim", "--bus", "pubsub",
               "--until-idle", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert "(sim backend, Pub/Sub bus, virtual clock" in result.output
    assert "stopped (idle)" in result.output

    logged = _logged(staging.url)
    assert {stream for _, stream, _, _ in logged} >= {"s0", "s1", "s2"}
    received = staging.receive(ops, len(logged))
    bodies = [json.loads(m.data) for m in received]
    first_seen: dict[tuple[str, int], int] = {}
    for body in bodies:
        first_seen.setdefault((body["stream_id"], body["version"]), body["seq"])
    assert sorted((seq, stream, version) for (stream, version), seq in first_seen.items()) == [
        (seq, stream, version) for seq, stream, version, _ in logged]
    assert {m.ordering_key for m in received} == {stream for _, stream, _, _ in logged}
    for stream in {stream for _, stream, _, _ in logged}:
        versions = [b["version"] for b in bodies if b["stream_id"] == stream]
        in_order = list(dict.fromkeys(versions))  # a redelivery repeats, never reorders
        assert in_order == sorted(in_order) == list(range(1, len(in_order) + 1)), stream
    assert any(b["type"] == "JobFailed" and b["stream_id"] == "s2" for b in bodies)

    observations = [json.loads(m.data) for m in staging.receive(edge, 3)]
    # The edge topic carries what the simulated informers delivered (late, twice, out of
    # order as the world's delivery faults say); every Job's end is among them.
    ended = {o["task_id"]: o["condition"] for o in observations if o["condition"]}
    assert ended == {"s0": "Complete", "s1": "Complete", "s2": "Failed"}


def test_the_bus_setting_is_checked_and_the_gcp_backend_keeps_pubsub(tmp_path: Path) -> None:
    assert Settings.from_env({"FALCON_BUS": "pubsub"}).bus.kind == "pubsub"
    assert Settings.from_env({}).bus.kind is None
    with pytest.raises(SettingsError, match="FALCON_BUS='kafka': expected one of sim, pubsub"):
        Settings.from_env({"FALCON_BUS": "kafka"})
    url = f"sqlite:///{tmp_path / 'gcp.db'}"
    migrate(url)
    with pytest.raises(BackendError, match="FALCON_BUS=sim with the gcp backend"):
        build_service(open_app(Settings(db_url=url, bus="sim")), None, RunOptions(backend="gcp"))


def test_the_relay_keeps_what_pubsub_refused_and_is_paced() -> None:
    clock = VirtualClock(dt.datetime(2026, 11, 1))
    world = SimWorld(clock)
    target = RecordingBus()
    wall = [0.0]
    relay = EdgeRelay(world.bus, "falcon-edge-events", target, "edge-out",
                      monotonic=lambda: wall[0])
    for n in range(3):
        world.bus.publish("falcon-edge-events", {"n": n}, attributes={"job_uid": f"u{n}"})
    target.refuse_next = 2

    assert relay() == 0  # refused: nothing acknowledged on the simulated bus
    assert relay() == 0  # paused: no publish is tried
    assert len(target.published) == 0 and target.refuse_next == 1
    wall[0] += 5.0
    clock.advance(61)  # the simulated ack deadline: the pulled messages come back
    assert relay() == 0 and target.refuse_next == 0
    wall[0] += 5.0
    clock.advance(61)
    assert relay() == 3
    assert [(topic, data["n"], key) for topic, data, key, _ in target.published] == [
        ("edge-out", 0, "u0"), ("edge-out", 1, "u1"), ("edge-out", 2, "u2")]
    assert relay() == 0 and world.bus.backlog("falcon-staging-relay") == 0

