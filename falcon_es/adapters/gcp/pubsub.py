"""The Bus port on Google Cloud Pub/Sub (google-cloud-pubsub).

Publishing: every message is a JSON object (UTF-8) plus string attributes, published
with an ordering key when the caller gives one, so the publisher is built with message
ordering on (reference §5.3: publishing with a key is a ValueError otherwise). After a
failed publish Pub/Sub pauses that ordering key and refuses every later message for
it; the bus resumes the key at once and reports the failure, so the caller's retry
(from its own cursor, in order) goes through instead of failing forever.

Consuming: synchronous pull, and acknowledgement only when the caller says so: the
controller acks after the events an observation produced are committed. Pub/Sub acks
by ``ack_id`` (one per delivery) while the port acks by message id, so the bus keeps
the latest ack id of each pulled message per subscription. A message that is not
acked comes back after the subscription's ack deadline with the same message id: the
message id identifies a delivery's message, and the attributes the informer sets
(``job_uid``, ``resource_version``) identify an observation published twice.

Credentials are Application Default Credentials (Workload Identity in the central
cluster). ``PUBSUB_EMULATOR_HOST`` aims both clients at Google's emulator, which is
how the tests run; the variable is read when the bus is built.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1  # untyped (no py.typed): mypy skips this form
from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.cloud.pubsub_v1.publisher import exceptions as publish_exceptions

from falcon_es.adapters.gcp.errors import code_for_api_error
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.domain.ports import INVALID, RETRYABLE, BusMessage, PortError

log = logging.getLogger("falcon_es.adapters.gcp.pubsub")

#: Keyword names of ``PublisherClient.publish``: an attribute by one of these names
#: would be taken for the argument, so such attributes are refused.
RESERVED_ATTRIBUTES = frozenset({"topic", "data", "ordering_key", "retry", "timeout"})
#: Acknowledge requests are limited in size; 2,500 ack ids stay well inside it.
ACK_BATCH = 2500
#: The longest ack deadline Pub/Sub allows; an ack id older than this is useless.
MAX_ACK_DEADLINE_SECONDS = 600
DEFAULT_ACK_DEADLINE_SECONDS = 60
#: Data that is not a JSON object arrives as {UNDECODABLE_KEY: "<why>"}.
UNDECODABLE_KEY = "_undecodable"

_TRANSIENT = retries.if_exception_type(
    gexc.Aborted, gexc.Cancelled, gexc.DeadlineExceeded, gexc.InternalServerError,
    gexc.ResourceExhausted, gexc.ServiceUnavailable, gexc.Unknown,
)


@dataclasses.dataclass(frozen=True)
class _Lease:
    ack_id: str
    pulled_at: dt.datetime


class PubSubBus:
    """The ``Bus`` port over one project's Pub/Sub topics and subscriptions.

    ``topic`` and ``subscription`` arguments are short names in ``project`` or full
    ``projects/P/topics/T`` / ``projects/P/subscriptions/S`` paths.
    """

    def __init__(
        self,
        project: str,
        *,
        publisher: pubsub_v1.PublisherClient | None = None,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        publish_timeout_seconds: float = 30.0,
        pull_timeout_seconds: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        if not project:
            raise ValueError("Pub/Sub bus: a project id is required")
        self.project = project
        self._publisher = publisher or pubsub_v1.PublisherClient(
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        )
        self._subscriber = subscriber or pubsub_v1.SubscriberClient()
        self._publish_timeout = publish_timeout_seconds
        self._publish_retry = retries.Retry(
            initial=0.1, maximum=max(0.2, publish_timeout_seconds / 4), multiplier=2.0,
            predicate=_TRANSIENT, timeout=publish_timeout_seconds,
        )
        self._pull_timeout = pull_timeout_seconds
        self._clock = clock or WallClock()
        self._lock = threading.Lock()
        self._leases: dict[str, dict[str, _Lease]] = {}

    # ------------------------------------------------------------------ Bus port

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        path = self.topic_path(topic)
        attrs = _checked_attributes(path, attributes)
        try:
            body = json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise PortError(INVALID, f"message for {path} is not JSON: {error}") from None
        try:
            future = self._publisher.publish(
                path, body, ordering_key=ordering_key, retry=self._publish_retry,
                timeout=self._publish_timeout, **attrs,
            )
            return str(future.result(timeout=self._publish_timeout))
        except Exception as error:  # every failure becomes a PortError
            self._resume(path, ordering_key)
            raise _publish_error(path, ordering_key, error) from error

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        path = self.subscription_path(subscription)
        if max_messages <= 0:
            return []
        try:
            response = self._subscriber.pull(
                request={"subscription": path, "max_messages": max_messages},
                timeout=self._pull_timeout,
            )
        except gexc.DeadlineExceeded:
            return []  # nothing arrived within the pull timeout
        except Exception as error:
            raise _call_error(f"pulling {path}", error) from error
        now = self._clock.now()
        messages: list[BusMessage] = []
        with self._lock:
            leases = self._leases.setdefault(path, {})
            _forget_expired(leases, now)
            for received in response.received_messages:
                message = received.message
                leases[message.message_id] = _Lease(received.ack_id, now)
                messages.append(BusMessage(
                    id=message.message_id,
                    data=_decode(message.data),
                    attributes=dict(message.attributes),
                ))
        return messages

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        path = self.subscription_path(subscription)
        ack_ids = self._take_ack_ids(path, message_ids)
        for start in range(0, len(ack_ids), ACK_BATCH):
            batch = ack_ids[start:start + ACK_BATCH]
            try:
                self._subscriber.acknowledge(request={"subscription": path, "ack_ids": batch})
            except Exception as error:
                raise _call_error(f"acknowledging {len(batch)} messages on {path}",
                                  error) from error

    # ----------------------------------------------------------------- extras

    def nack(self, subscription: str, message_ids: Sequence[str]) -> None:
        """Give messages back now (ack deadline 0) instead of waiting for the deadline."""
        path = self.subscription_path(subscription)
        ack_ids = self._take_ack_ids(path, message_ids)
        for start in range(0, len(ack_ids), ACK_BATCH):
            batch = ack_ids[start:start + ACK_BATCH]
            try:
                self._subscriber.modify_ack_deadline(request={
                    "subscription": path, "ack_ids": batch, "ack_deadline_seconds": 0,
                })
            except Exception as error:
                raise _call_error(f"returning {len(batch)} messages to {path}", error) from error

    def topic_path(self, topic: str) -> str:
        if topic.startswith("projects/"):
            return topic
        return self._publisher.topic_path(self.project, topic)

    def subscription_path(self, subscription: str) -> str:
        if subscription.startswith("projects/"):
            return subscription
        return self._subscriber.subscription_path(self.project, subscription)

    def create_topic(self, topic: str) -> str:
        """Create the topic unless it exists (set-up, ``falcon-es doctor``)."""
        path = self.topic_path(topic)
        try:
            self._publisher.create_topic(request={"name": path})
        except gexc.AlreadyExists:
            return path  # made earlier: by setup.sh, another replica or a previous run
        except Exception as error:
            raise _call_error(f"creating topic {path}", error) from error
        return path

    def create_subscription(
        self, subscription: str, topic: str, *, message_ordering: bool = True,
        ack_deadline_seconds: int = DEFAULT_ACK_DEADLINE_SECONDS,
    ) -> str:
        """Create the subscription unless it exists; an existing one must match.

        Message ordering cannot be changed on an existing subscription, so a mismatch
        is an error naming the fix rather than a silent difference in delivery.
        """
        if not 10 <= ack_deadline_seconds <= MAX_ACK_DEADLINE_SECONDS:
            raise ValueError(f"ack deadline {ack_deadline_seconds}s: Pub/Sub allows 10 to "
                             f"{MAX_ACK_DEADLINE_SECONDS} seconds")
        path = self.subscription_path(subscription)
        topic_path = self.topic_path(topic)
        request = {"name": path, "topic": topic_path, "ack_deadline_seconds": ack_deadline_seconds,
                   "enable_message_ordering": message_ordering}
        try:
            self._subscriber.create_subscription(request=request)
        except gexc.AlreadyExists:
            return self._check_existing(path, topic_path, message_ordering)
        except Exception as error:
            raise _call_error(f"creating subscription {path} on {topic_path}", error) from error
        return path

    def delete_subscription(self, subscription: str) -> None:
        """Delete the subscription; one already gone is fine (``falcon-es smoke``'s
        clean-up of its own)."""
        path = self.subscription_path(subscription)
        try:
            self._subscriber.delete_subscription(request={"subscription": path})
        except gexc.NotFound:
            return
        except Exception as error:
            raise _call_error(f"deleting subscription {path}", error) from error

    def delete_topic(self, topic: str) -> None:
        """Delete the topic; one already gone is fine."""
        path = self.topic_path(topic)
        try:
            self._publisher.delete_topic(request={"topic": path})
        except gexc.NotFound:
            return
        except Exception as error:
            raise _call_error(f"deleting topic {path}", error) from error

    def _check_existing(self, path: str, topic_path: str, message_ordering: bool) -> str:
        """An existing subscription is used only if it delivers what a new one would."""
        try:
            existing = self._subscriber.get_subscription(request={"subscription": path})
        except Exception as error:
            raise _call_error(f"reading subscription {path}", error) from error
        if existing.topic != topic_path:
            raise PortError(INVALID, f"subscription {path} is attached to {existing.topic}, "
                                     f"not {topic_path}; delete it or choose another name")
        if existing.enable_message_ordering != message_ordering:
            raise PortError(INVALID, f"subscription {path} has message ordering "
                                     f"{'on' if existing.enable_message_ordering else 'off'}; "
                                     "ordering cannot be changed: delete and recreate it")
        return path

    def close(self) -> None:
        """Flush outstanding publishes and close both clients' channels."""
        self._publisher.stop()
        self._subscriber.close()

    # ---------------------------------------------------------------- helpers

    def _resume(self, path: str, ordering_key: str) -> None:
        if not ordering_key:
            return
        try:
            self._publisher.resume_publish(path, ordering_key)
        except (ValueError, RuntimeError) as error:
            log.warning("could not resume ordering key %r on %s: %s", ordering_key, path, error)

    def _take_ack_ids(self, path: str, message_ids: Sequence[str]) -> list[str]:
        with self._lock:
            leases = self._leases.get(path, {})
            ack_ids = []
            unknown = []
            for message_id in message_ids:
                lease = leases.pop(message_id, None)
                if lease is None:
                    unknown.append(message_id)
                else:
                    ack_ids.append(lease.ack_id)
        if unknown:
            # Pulled by another bus (or before a restart): it comes back by itself.
            log.info("no delivery of %d message(s) on %s to acknowledge: %s",
                     len(unknown), path, ", ".join(unknown[:5]))
        return ack_ids


def _checked_attributes(path: str, attributes: Mapping[str, str] | None) -> dict[str, str]:
    attrs = dict(attributes or {})
    for key, value in attrs.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PortError(INVALID, f"message for {path}: attribute {key!r}={value!r}: "
                                     "keys and values must be strings")
        if key in RESERVED_ATTRIBUTES:
            raise PortError(INVALID, f"message for {path}: attribute name {key!r} is reserved "
                                     f"({', '.join(sorted(RESERVED_ATTRIBUTES))})")
    return attrs


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return {UNDECODABLE_KEY: f"not UTF-8 JSON: {error}"}
    if not isinstance(data, dict):
        return {UNDECODABLE_KEY: f"JSON {type(data).__name__}, expected an object"}
    return data


def _forget_expired(leases: dict[str, _Lease], now: dt.datetime) -> None:
    """Drop ack ids older than any ack deadline: their messages were redelivered or
    acknowledged elsewhere, and a consumer that never acks must not grow the map."""
    horizon = now - dt.timedelta(seconds=MAX_ACK_DEADLINE_SECONDS)
    for message_id in [m for m, lease in leases.items() if lease.pulled_at < horizon]:
        del leases[message_id]


def _publish_error(path: str, ordering_key: str, error: BaseException) -> PortError:
    where = f"publishing to {path}" + (f" (ordering key {ordering_key})" if ordering_key else "")
    if isinstance(error, publish_exceptions.PublishToPausedOrderingKeyException):
        return PortError(RETRYABLE, f"{where}: the ordering key was paused by an earlier "
                                    "failure; it has been resumed, publish again")
    if isinstance(error, (concurrent.futures.TimeoutError, TimeoutError)):
        return PortError(RETRYABLE, f"{where}: no answer within the publish timeout")
    if isinstance(error, ValueError):
        return PortError(INVALID, f"{where}: {error}")
    return _call_error(where, error)


def _call_error(context: str, error: BaseException) -> PortError:
    if isinstance(error, gexc.GoogleAPICallError):
        return PortError(code_for_api_error(error), f"{context}: {error.message}")
    if isinstance(error, gexc.GoogleAPIError):
        return PortError(RETRYABLE, f"{context}: {error}")
    return PortError(code_for_api_error(error), f"{context}: {error}")
