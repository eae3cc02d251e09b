"""The Pub/Sub bus against Google's real Pub/Sub emulator, through google-cloud-pubsub.

The emulator starts once per session (tests/fakes/fixtures.py); each test uses its own
topic and subscription names. Nothing here waits for an ack deadline to pass: a nack
(ack deadline 0) is how a test makes Pub/Sub redeliver.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.publisher import exceptions as publish_exceptions

from falcon_es.adapters.gcp.pubsub import UNDECODABLE_KEY, PubSubBus
from falcon_es.domain.ports import (
    INVALID,
    NOT_FOUND,
    BusMessage,
    JobObservation,
    PodObservation,
    PortError,
)
from tests.fakes import fixtures
from tests.fakes.fixtures import unique_name
from tests.fakes.pubsub_emulator import EmulatorError, PubSubEmulator, emulator_command

# The fixtures this module uses (pytest looks them up by name in the module).
pubsub_emulator = fixtures.pubsub_emulator
pubsub_bus = fixtures.pubsub_bus


def _setup(bus: PubSubBus, *, ordering: bool = True) -> tuple[str, str]:
    topic, subscription = unique_name("topic"), unique_name("sub")
    bus.create_topic(topic)
    bus.create_subscription(subscription, topic, message_ordering=ordering)
    return topic, subscription


def _pull_exactly(bus: PubSubBus, subscription: str, count: int,
                  *, ack: bool = False) -> list[BusMessage]:
    """Pull until ``count`` messages came (bounded number of pulls)."""
    received: list[BusMessage] = []
    for _ in range(20):
        batch = bus.pull(subscription, max_messages=count - len(received))
        received.extend(batch)
        if ack and batch:
            bus.ack(subscription, [m.id for m in batch])
        if len(received) >= count:
            return received
    raise AssertionError(f"pulled {len(received)} of {count} messages from {subscription}")


def _observation(rv: int, phase: str = "Running") -> JobObservation:
    return JobObservation(
        cluster_name="edge-a", job_name="falcon-t1", job_uid="uid-1", task_id="t1",
        resource_version=rv, active=1 if phase == "Running" else 0, succeeded=0, failed=0,
        completions=1, pods=(PodObservation("falcon-t1-0-abcde", phase),),
        observed_at=dt.datetime(2026, 11, 1, 9, 0, rv % 60),
    )


def _attributes(observation: JobObservation) -> dict[str, str]:
    return {"cluster": observation.cluster_name, "job": observation.job_name,
            "job_uid": observation.job_uid, "task_id": observation.task_id,
            "resource_version": str(observation.resource_version)}


def test_publish_pull_ack_round_trip(pubsub_bus: PubSubBus) -> None:
    topic, subscription = _setup(pubsub_bus)
    sent = {pubsub_bus.publish(topic, {"n": n, "text": "zwölf"}, attributes={"n": str(n)})
            for n in range(3)}

    received = _pull_exactly(pubsub_bus, subscription, 3)

    assert {m.id for m in received} == sent
    assert sorted((m.data["n"], m.data["text"], m.attributes["n"]) for m in received) == [
        (0, "zwölf", "0"), (1, "zwölf", "1"), (2, "zwölf", "2")]
    pubsub_bus.ack(subscription, [m.id for m in received])
    assert pubsub_bus.pull(subscription) == []


def test_ordering_key_keeps_publish_order_per_key(pubsub_bus: PubSubBus) -> None:
    topic, subscription = _setup(pubsub_bus)
    for n in range(12):
        key = f"job-{n % 3}"
        pubsub_bus.publish(topic, {"key": key, "n": n}, ordering_key=key)

    received = _pull_exactly(pubsub_bus, subscription, 12, ack=True)

    for key in ("job-0", "job-1", "job-2"):
        sequence = [m.data["n"] for m in received if m.data["key"] == key]
        assert sequence == sorted(sequence) and len(sequence) == 4


def test_unacked_message_comes_back_with_the_same_id(pubsub_bus: PubSubBus) -> None:
    topic, subscription = _setup(pubsub_bus)
    message_id = pubsub_bus.publish(topic, {"step": "folded?"}, ordering_key="job-x")
    first = _pull_exactly(pubsub_bus, subscription, 1)

    # The controller's tick failed before commit: nothing is acked; the message
    # returns (here at once, via an ack deadline of 0, instead of after 60 s).
    pubsub_bus.nack(subscription, [m.id for m in first])
    again = _pull_exactly(pubsub_bus, subscription, 1)

    assert [m.id for m in first] == [m.id for m in again] == [message_id]
    assert again[0].data == {"step": "folded?"}
    pubsub_bus.ack(subscription, [message_id])  # the latest delivery's ack id is used
    assert pubsub_bus.pull(subscription) == []


def test_duplicates_and_redeliveries_are_recognisable_downstream(pubsub_bus: PubSubBus) -> None:
    """An informer may publish one observation twice, and Pub/Sub may deliver a message
    twice: the consumer needs the message id for the latter and (job_uid,
    resource_version) from the attributes for the former. (The edge-events
    subscription needs no ordering: the consumer orders by resourceVersion, and an
    ordered subscription would hold a Job's later messages behind an unacked one.)"""
    topic, subscription = _setup(pubsub_bus, ordering=False)
    older, newer = _observation(41, "Pending"), _observation(57)
    ids = [pubsub_bus.publish(topic, o.to_data(), ordering_key=o.job_uid, attributes=_attributes(o))
           for o in (newer, older, newer)]
    assert len(set(ids)) == 3  # separately published copies get distinct message ids

    first = _pull_exactly(pubsub_bus, subscription, 3)
    pubsub_bus.nack(subscription, [ids[0]])  # one delivery is not acked in time
    redelivered = _pull_exactly(pubsub_bus, subscription, 1)
    deliveries = [*first, *redelivered]

    seen_messages: set[str] = set()
    latest: dict[str, int] = {}
    folded: list[JobObservation] = []
    for message in deliveries:
        if message.id in seen_messages:
            continue
        seen_messages.add(message.id)
        key, version = message.attributes["job_uid"], int(message.attributes["resource_version"])
        if version <= latest.get(key, 0):
            continue  # a duplicate or an older observation: nothing new
        latest[key] = version
        folded.append(JobObservation.from_data(message.data))

    assert redelivered[0].id == ids[0]
    assert [m.attributes for m in deliveries].count(_attributes(newer)) == 3
    assert folded in ([newer], [older, newer])  # whatever order Pub/Sub chose
    assert latest == {"uid-1": 57}


def test_failed_publish_resumes_its_ordering_key(pubsub_bus: PubSubBus,
                                                 pubsub_emulator: PubSubEmulator) -> None:
    topic = unique_name("late-topic")
    with pytest.raises(PortError) as missing:
        pubsub_bus.publish(topic, {"n": 1}, ordering_key="task-7")
    assert missing.value.code == NOT_FOUND
    assert topic in missing.value.message

    pubsub_bus.create_topic(topic)
    subscription = unique_name("late-sub")
    pubsub_bus.create_subscription(subscription, topic)
    message_id = pubsub_bus.publish(topic, {"n": 2}, ordering_key="task-7")
    assert [m.id for m in _pull_exactly(pubsub_bus, subscription, 1, ack=True)] == [message_id]


def test_without_resume_the_client_keeps_the_key_paused(pubsub_bus: PubSubBus) -> None:
    """Why the bus resumes: the raw client refuses every later message for the key."""
    raw = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    topic = raw.topic_path(pubsub_bus.project, unique_name("raw-topic"))
    with pytest.raises(gexc.NotFound):
        raw.publish(topic, b"{}", ordering_key="k").result(timeout=30)
    raw.create_topic(request={"name": topic})
    with pytest.raises(publish_exceptions.PublishToPausedOrderingKeyException):
        raw.publish(topic, b"{}", ordering_key="k").result(timeout=30)
    raw.stop()


def test_bad_messages_are_refused_with_a_clear_reason(pubsub_bus: PubSubBus) -> None:
    topic, _ = _setup(pubsub_bus)
    cases: Sequence[tuple[dict[str, object], dict[str, object], str]] = (
        ({"n": 1}, {"count": 3}, "keys and values must be strings"),
        ({"n": 1}, {"timeout": "5"}, "reserved"),
        ({"when": dt.datetime(2026, 1, 1)}, {}, "not JSON"),
    )
    for data, attributes, words in cases:
        with pytest.raises(PortError) as refused:
            pubsub_bus.publish(topic, data, attributes=attributes)  # type: ignore[arg-type]
        assert refused.value.code == INVALID
        assert words in refused.value.message

    with pytest.raises(PortError) as no_subscription:
        pubsub_bus.pull(unique_name("missing-sub"))
    assert no_subscription.value.code == NOT_FOUND


def test_message_from_a_foreign_publisher_that_is_not_json(pubsub_bus: PubSubBus) -> None:
    topic, subscription = _setup(pubsub_bus)
    raw = pubsub_v1.PublisherClient()
    raw.publish(pubsub_bus.topic_path(topic), b"\xff not json", source="elsewhere").result(30)
    raw.stop()

    (message,) = _pull_exactly(pubsub_bus, subscription, 1)

    assert set(message.data) == {UNDECODABLE_KEY}
    assert message.attributes == {"source": "elsewhere"}


def test_create_helpers_are_idempotent_and_refuse_a_mismatch(pubsub_bus: PubSubBus) -> None:
    topic, subscription = _setup(pubsub_bus, ordering=False)
    assert pubsub_bus.create_topic(topic) == pubsub_bus.topic_path(topic)
    assert pubsub_bus.create_subscription(subscription, topic, message_ordering=False) == \
        pubsub_bus.subscription_path(subscription)

    with pytest.raises(PortError) as ordering:
        pubsub_bus.create_subscription(subscription, topic, message_ordering=True)
    assert ordering.value.code == INVALID and "cannot be changed" in ordering.value.message

    other = unique_name("other-topic")
    pubsub_bus.create_topic(other)
    with pytest.raises(PortError) as attached:
        pubsub_bus.create_subscription(subscription, other, message_ordering=False)
    assert "is attached to" in attached.value.message


def test_emulator_is_the_java_server_itself_and_stops_by_pid(tmp_path: Path) -> None:
    emulator = PubSubEmulator.start(tmp_path)
    try:
        cmdline = Path(f"/proc/{emulator.pid}/cmdline").read_bytes().split(b"\0")
        assert Path(cmdline[0].decode()).name == "java"
    finally:
        emulator.stop()
    assert not Path(f"/proc/{emulator.pid}").exists()


def test_missing_emulator_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("FALCON_PUBSUB_EMULATOR", str(tmp_path / "absent"))
    with pytest.raises(EmulatorError) as missing:
        emulator_command("127.0.0.1", 1)
    assert "apt-get install google-cloud-cli-pubsub-emulator" in str(missing.value)
