"""The ops event stream: every ``task_events`` row published in ``seq`` order.

The ordered log is itself the outbox. Each event goes to the topic with ordering key =
stream id and attributes (type, stream_id, version, seq); the stored cursor advances
only after the publishes up to it succeeded, so delivery is at least once and
subscribers dedupe by (stream_id, version) or seq.
"""

from __future__ import annotations

import logging
from typing import Any

from falcon_es.storage import checkpoints
from falcon_es.domain.ports import TASK_EVENTS_TOPIC, Bus, PortError
from falcon_es.storage.store import EventStore, RecordedEvent

log = logging.getLogger("falcon_es.outbox")

CHECKPOINT = "outbox:task-events"


def message_of(record: RecordedEvent) -> dict[str, Any]:
    """The published message body (documented for subscribers in docs/reference/ops-events.md)."""
    return {
        "seq": record.seq,
        "stream_id": record.stream_id,
        "version": record.version,
        "type": record.type_name,
        "schema_version": record.event.schema_version,
        "data": record.event.to_data(),
        "meta": dict(record.meta),
        "recorded_at": record.recorded_at.isoformat(),
    }


def attributes_of(record: RecordedEvent) -> dict[str, str]:
    return {"type": record.type_name, "stream_id": record.stream_id,
            "version": str(record.version), "seq": str(record.seq)}


def publish_pending(store: EventStore, bus: Bus, topic: str = TASK_EVENTS_TOPIC,
                    *, batch_size: int = 1000, limit: int | None = None) -> int:
    """Publish events after the cursor; returns how many were published."""
    cursor = checkpoints.read(store.engine, CHECKPOINT)
    published = 0
    for batch in store.read_batches(cursor, batch_size=batch_size):
        last_ok = cursor
        try:
            for record in batch:
                bus.publish(topic, message_of(record), ordering_key=record.stream_id,
                            attributes=attributes_of(record))
                last_ok = record.seq
                published += 1
        except PortError as error:
            log.warning("outbox publish stopped at seq %s: %s", last_ok + 1, error)
            checkpoints.advance(store.engine, CHECKPOINT, last_ok, store.clock.now())
            return published
        checkpoints.advance(store.engine, CHECKPOINT, last_ok, store.clock.now())
        cursor = last_ok
        if limit is not None and published >= limit:
            break
    return published


def lag(store: EventStore) -> int:
    """How many events the ops stream is behind the log head."""
    return store.head() - checkpoints.read(store.engine, CHECKPOINT)

