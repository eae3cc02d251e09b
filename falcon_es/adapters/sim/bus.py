"""An in-process Pub/Sub: topics fan out to subscriptions, delivery is at least once.

A pulled message is leased for the ack deadline (virtual time); if it is not acked
by then it becomes deliverable again, exactly the redelivery a slow or crashed
subscriber sees on Pub/Sub. Messages cross as JSON text, so a body Pub/Sub could not
carry fails here too. Ordering keys are recorded but, as on a subscription without
message ordering, promise nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import heapq
import json
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from falcon_es.domain.clock import Clock
from falcon_es.domain.ports import INVALID, NOT_FOUND, BusMessage, PortError

from falcon_es.adapters.sim.config import BusConfig


@dataclasses.dataclass(frozen=True)
class _Message:
    id: str
    topic: str
    body: str | Mapping[str, Any]  # JSON text, or JSON-safe data from the simulator
    attributes: Mapping[str, str]
    ordering_key: str

    def data(self) -> dict[str, Any]:
        """A fresh copy per delivery, as a subscriber decoding bytes would get."""
        data: dict[str, Any] = (json.loads(self.body) if isinstance(self.body, str)
                                else _copy(self.body))
        return data


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(item) for item in value]
    return value


@dataclasses.dataclass
class _Entry:
    message: _Message
    order: int
    visible_at: dt.datetime
    leased_until: dt.datetime | None = None
    generation: int = 0
    deliveries: int = 0


class _Subscription:
    """Rows are (moment, order, message id, generation); a row whose generation no
    longer matches its entry (acked, leased again) is stale and skipped lazily."""

    def __init__(self, name: str, topic: str) -> None:
        self.name = name
        self.topic = topic
        self.entries: dict[str, _Entry] = {}
        self.waiting: list[tuple[dt.datetime, int, str, int]] = []  # not yet visible
        self.ready: collections.deque[tuple[dt.datetime, int, str, int]] = collections.deque()
        self.leased: list[tuple[dt.datetime, int, str, int]] = []

    def add(self, entry: _Entry) -> None:
        self.entries[entry.message.id] = entry
        heapq.heappush(self.waiting, (entry.visible_at, entry.order, entry.message.id, 0))

    def _live(self, row: tuple[dt.datetime, int, str, int]) -> _Entry | None:
        entry = self.entries.get(row[2])
        return entry if entry is not None and entry.generation == row[3] else None

    def catch_up(self, now: dt.datetime) -> None:
        """Expired leases go back to waiting; whatever is visible by ``now`` is ready."""
        while self.leased and self.leased[0][0] <= now:
            row = heapq.heappop(self.leased)
            entry = self._live(row)
            if entry is not None:
                entry.leased_until = None
                entry.generation += 1
                heapq.heappush(self.waiting, (row[0], entry.order, entry.message.id,
                                              entry.generation))
        while self.waiting and self.waiting[0][0] <= now:
            self.ready.append(heapq.heappop(self.waiting))

    def take(self, now: dt.datetime, limit: int, deadline: float) -> list[_Entry]:
        self.catch_up(now)
        taken: list[_Entry] = []
        while self.ready and len(taken) < limit:
            entry = self._live(self.ready.popleft())
            if entry is None:
                continue
            entry.generation += 1
            entry.leased_until = now + dt.timedelta(seconds=deadline)
            entry.deliveries += 1
            heapq.heappush(self.leased, (entry.leased_until, entry.order, entry.message.id,
                                         entry.generation))
            taken.append(entry)
        return taken

    def next_moment(self, after: dt.datetime) -> dt.datetime | None:
        """The first moment after ``after`` at which this subscription's backlog changes."""
        self.catch_up(after)
        for heap in (self.waiting, self.leased):
            while heap and self._live(heap[0]) is None:
                heapq.heappop(heap)
        moments = [heap[0][0] for heap in (self.waiting, self.leased) if heap]
        return min(moments) if moments else None


class SimBus:
    """The ``Bus`` port. ``before_read`` lets the world catch up to the clock first."""

    def __init__(self, clock: Clock, config: BusConfig = BusConfig(),
                 before_read: Callable[[], object] | None = None) -> None:
        self._clock = clock
        self._deadline = config.ack_deadline_seconds
        self._before_read = before_read
        self._ids = 0
        self._order = 0
        self._topics: dict[str, list[_Subscription]] = {}
        self._subscriptions: dict[str, _Subscription] = {}
        for topic, names in config.subscriptions.items():
            self._topics.setdefault(topic, [])
            for name in names:
                self.subscribe(topic, name)

    # --------------------------------------------------------------- Bus port

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        return self.publish_at(topic, data, self._clock.now(), ordering_key=ordering_key,
                               attributes=attributes)

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        if self._before_read is not None:
            self._before_read()
        sub = self._subscription(subscription)
        now = self._clock.now()
        return [BusMessage(e.message.id, e.message.data(), dict(e.message.attributes))
                for e in sub.take(now, max(0, max_messages), self._deadline)]

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        sub = self._subscription(subscription)
        for message_id in message_ids:
            sub.entries.pop(message_id, None)

    # ------------------------------------------------------ for the simulator

    def publish_at(self, topic: str, data: Mapping[str, Any], visible_at: dt.datetime, *,
                   ordering_key: str = "", attributes: Mapping[str, str] | None = None,
                   frozen: bool = False) -> str:
        """Publish now, deliverable from ``visible_at`` (how a late informer looks).

        ``frozen``: the simulator's own JSON-safe data that nobody changes afterwards,
        copied per delivery instead of a JSON round trip (the informer publishes one
        per Job change).
        """
        subscriptions = self._topics.get(topic)
        if subscriptions is None:
            raise PortError(NOT_FOUND, f"Resource not found (resource={topic}). Known topics: "
                                       f"{', '.join(sorted(self._topics)) or 'none'}")
        body: str | Mapping[str, Any]
        if frozen:
            body = data
        else:
            try:
                body = json.dumps(data)
            except (TypeError, ValueError) as error:
                raise PortError(INVALID, f"message for topic {topic} is not JSON: {error}") from None
        attrs = dict(attributes or {})
        bad = sorted(k for k, v in attrs.items() if not isinstance(k, str) or not isinstance(v, str))
        if bad:
            raise PortError(INVALID, f"attribute {bad[0]!r}: keys and values must be strings")
        self._ids += 1
        message = _Message(str(self._ids), topic, body, MappingProxyType(attrs), ordering_key)
        order = self._order
        self._order += 1
        for sub in subscriptions:
            sub.add(_Entry(message, order, visible_at))
        return message.id

    def subscribe(self, topic: str, name: str) -> None:
        """Attach a subscription; like Pub/Sub it receives only later publishes."""
        if name in self._subscriptions:
            if self._subscriptions[name].topic != topic:
                raise PortError(INVALID, f"subscription {name} is attached to topic "
                                         f"{self._subscriptions[name].topic}, not {topic}")
            return
        sub = _Subscription(name, topic)
        self._subscriptions[name] = sub
        self._topics.setdefault(topic, []).append(sub)

    def backlog(self, subscription: str) -> int:
        """Messages published to the subscription and not yet acked."""
        return len(self._subscription(subscription).entries)

    def next_due(self, after: dt.datetime | None = None) -> dt.datetime | None:
        """When a message next becomes deliverable (again) after ``after`` (default now).

        Messages deliverable already are not counted: pulling them is the subscriber's
        business, and an unread subscription must not keep a simulation from idling.
        """
        after = self._clock.now() if after is None else after
        moments = [m for sub in self._subscriptions.values()
                   if (m := sub.next_moment(after)) is not None]
        return min(moments) if moments else None

    def _subscription(self, name: str) -> _Subscription:
        sub = self._subscriptions.get(name)
        if sub is None:
            raise PortError(NOT_FOUND, f"Resource not found (resource={name}). Known "
                                       f"subscriptions: {', '.join(sorted(self._subscriptions)) or 'none'}")
        return sub
