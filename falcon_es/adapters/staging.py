"""A staging world: the simulated clusters with Pub/Sub as the bus the outside sees.

An upper layer or an ops consumer that uses the sim as its staging environment
subscribes to Pub/Sub (Google's emulator, or a project), as it would in production.
So on the sim backend with ``FALCON_BUS=pubsub``:

- the ops stream (every ``task_events`` row) is published to Pub/Sub, ordering key the
  stream id, exactly as on the gcp backend (``StagingBus.publish``);
- every edge observation the simulated informers deliver is published to Pub/Sub's
  edge-events topic as well, ordering key the Job's uid (``EdgeRelay``), at the
  moment the simulated bus makes it deliverable: late, twice or out of order as the
  world's delivery faults say, as a real informer's publishes would arrive.

The controller itself still reads the edge events from the simulated bus, on the
world's clock: a virtual-clock run then takes the same course whichever bus the
outside sees, and its pace never waits on the emulator's delivery latency.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from falcon_es.domain.ports import Bus, BusMessage, PortError

from falcon_es.adapters.sim.bus import SimBus

log = logging.getLogger("falcon_es.adapters.staging")

#: The simulated bus's subscription the relay reads the informers' deliveries from.
RELAY_SUBSCRIPTION = "falcon-staging-relay"
#: Wall seconds the relay waits after a failed publish before it tries again.
RELAY_PAUSE_SECONDS = 5.0


class StagingBus:
    """The ``Bus`` port of a staging world: what the controller publishes (the ops
    stream) goes to Pub/Sub; what it pulls and acknowledges (the edge events) comes
    from the simulated world's bus."""

    def __init__(self, publish_to: Bus, pull_from: Bus) -> None:
        self.publish_to = publish_to
        self.pull_from = pull_from

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        return self.publish_to.publish(topic, data, ordering_key=ordering_key,
                                       attributes=attributes)

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        return self.pull_from.pull(subscription, max_messages)

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        self.pull_from.ack(subscription, message_ids)


class EdgeRelay:
    """Publishes to Pub/Sub each edge observation the simulated bus delivers on
    ``source_topic``, acknowledging it on the simulated bus only once Pub/Sub took it:
    a failed publish leaves the rest for the next call (after ``RELAY_PAUSE_SECONDS``),
    and what was pulled and not published comes back after the simulated ack deadline.
    At least once, as the informers' own publishes are."""

    def __init__(self, source: SimBus, source_topic: str, target: Bus, target_topic: str, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._target = target
        self._topic = target_topic
        self._monotonic = monotonic
        self._paused_until = 0.0
        self.relayed = 0
        source.subscribe(source_topic, RELAY_SUBSCRIPTION)

    def __call__(self) -> int:
        """Relay what is deliverable now; returns how many were published."""
        if self._monotonic() < self._paused_until:
            return 0
        published: list[str] = []
        try:
            for message in self._source.pull(RELAY_SUBSCRIPTION):
                self._target.publish(self._topic, message.data,
                                     ordering_key=message.attributes.get("job_uid", ""),
                                     attributes=message.attributes)
                published.append(message.id)
        except PortError as error:
            self._paused_until = self._monotonic() + RELAY_PAUSE_SECONDS
            log.warning("edge events relay to %s stopped after %d message(s), trying again in "
                        "%.0fs: %s", self._topic, len(published), RELAY_PAUSE_SECONDS, error)
        finally:
            if published:
                self._source.ack(RELAY_SUBSCRIPTION, published)
        self.relayed += len(published)
        return len(published)
