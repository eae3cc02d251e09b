"""The ops-stream publisher (the outbox): every stored event published in ``seq``
order, the cursor stored only past what was published, so a failed publish is
resumed, never skipped. It reads the log and its checkpoint: both dialects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from falcon_es.domain import events as ev
from falcon_es.domain.ports import RETRYABLE, Bus, BusMessage, PortError
from tests.support.bench import HandlerBench, HandlerBenches

TOPIC = "falcon-task-events"


class FailingBus:
    """Pub/Sub refusing the ``fail_at``-th publish and every later one (a fake of the
    outside world, around the sim bus)."""

    def __init__(self, inner: Bus, fail_at: int) -> None:
        self.inner = inner
        self.fail_at = fail_at
        self.published = 0

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        if self.published + 1 >= self.fail_at:  # this publish is number published + 1
            raise PortError(RETRYABLE, "503 The service is currently unavailable.")
        self.published += 1
        return self.inner.publish(topic, data, ordering_key=ordering_key, attributes=attributes)

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        return self.inner.pull(subscription, max_messages)

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        self.inner.ack(subscription, message_ids)


def two_tasks(bench: HandlerBench) -> None:
    """Five events in two streams, interleaved in the log."""
    now = bench.clock.now()
    spec = {"image": "i", "tpu_type": "v6e", "topology": "2x2"}
    bench.given("a", ev.TaskAccepted("a", "user-a", spec, "v6e", "2x2", now))
    bench.given("b", ev.TaskAccepted("b", "user-b", spec, "v6e", "2x2", now))
    bench.given("a", ev.AbortRequested(now, "Pending/Waiting"))
    bench.given("b", ev.AbortRequested(now, "Pending/Waiting"))
    bench.given("a", ev.TaskAborted("Pending/Waiting"))


def test_every_event_is_published_in_seq_order_with_its_attributes(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(None)
    subscription = bench.subscribe(TOPIC, "ops-reader")
    two_tasks(bench)
    stored = bench.records()

    assert bench.publish_outbox(TOPIC) == len(stored) == 5
    messages = bench.pull_all(subscription)

    assert [m.data["seq"] for m in messages] == [r.seq for r in stored]
    assert [(m.attributes["stream_id"], m.attributes["version"], m.attributes["type"])
            for m in messages] == [("a", "1", "TaskAccepted"), ("b", "1", "TaskAccepted"),
                                   ("a", "2", "AbortRequested"), ("b", "2", "AbortRequested"),
                                   ("a", "3", "TaskAborted")]
    first = messages[0].data
    assert (first["stream_id"], first["version"], first["type"], first["schema_version"]) == (
        "a", 1, "TaskAccepted", 1)
    assert first["data"]["actor"] == "user-a" and first["meta"]["actor"] == "test:given"


def test_the_cursor_moves_past_what_was_published_only(make_bench: HandlerBenches) -> None:
    bench = make_bench(None)
    subscription = bench.subscribe(TOPIC, "ops-reader")
    two_tasks(bench)
    assert bench.publish_outbox(TOPIC) == 5
    assert len(bench.pull_all(subscription)) == 5
    assert bench.publish_outbox(TOPIC) == 0
    assert bench.outbox_lag() == 0

    bench.given("b", ev.TaskAborted("Pending/Waiting"))

    assert bench.publish_outbox(TOPIC) == 1
    (message,) = bench.pull_all(subscription)
    assert (message.data["seq"], message.attributes["stream_id"], message.attributes["type"]) == (
        bench.head(), "b", "TaskAborted")


def test_a_failed_publish_stops_the_pass_and_the_next_pass_resumes_there(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(None)
    subscription = bench.subscribe(TOPIC, "ops-reader")
    two_tasks(bench)
    failing = FailingBus(bench.ports.bus, fail_at=3)

    assert bench.publish_outbox(TOPIC, bus=failing) == 2
    assert bench.outbox_lag() == 3

    assert bench.publish_outbox(TOPIC) == 3
    seqs = [m.data["seq"] for m in bench.pull_all(subscription)]
    assert seqs == [r.seq for r in bench.records()]  # none lost, none twice


def test_a_limited_pass_leaves_the_rest_to_the_next(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(None)
    subscription = bench.subscribe(TOPIC, "ops-reader")
    two_tasks(bench)

    assert bench.publish_outbox(TOPIC, batch_size=2, limit=2) == 2
    assert bench.outbox_lag() == 3
    assert bench.publish_outbox(TOPIC, batch_size=2) == 3
    assert [m.data["seq"] for m in bench.pull_all(subscription)] == [
        r.seq for r in bench.records()]
