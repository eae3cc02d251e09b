"""A running node-pool create is asked whether it is done every
``operation_poll_seconds``, not on every tick: each look is a call against the
project's GKE quota, and a create takes minutes."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest

from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.ports import NOT_FOUND, RETRYABLE, NodePoolInfo, Operation, PortError
from falcon_es.domain.clusters import Cluster
from falcon_es.config.settings import Settings
from tests.support.harness import Harness, flex_cluster, sim_config


class _OperationLooks:
    """GKE's node-pool API, noting when each create operation was asked about."""

    def __init__(self, inner: object, clock: VirtualClock) -> None:
        self._inner, self._clock = inner, clock
        self.asked: list[tuple[str, dt.datetime]] = []

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        self.asked.append((operation_id, self._clock.now()))
        return self._inner.get_operation(cluster, operation_id)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def harness(db_url: str, clock: VirtualClock) -> Iterator[Harness]:
    h = Harness(db_url, clock, sim_config(flex_cluster()),
                Settings(db_url=db_url, operation_poll_seconds=20))
    h.add_cluster(flex_cluster())
    yield h
    h.close()


def test_a_running_create_is_asked_every_poll_interval_and_seen_done_within_one(
        harness: Harness, clock: VirtualClock) -> None:
    h = harness
    looks = _OperationLooks(h.ports.node_pools, clock)
    h.ports = dataclasses.replace(h.ports, node_pools=looks)
    h.rebuild()
    task = h.submit("t1")
    h.run()
    assert h.history[task][-1] == ("Succeeded", None)

    (create,) = [r for r in h.app.store.read_stream(task)
                 if r.type_name == "NodePoolCreateStarted"]
    asked = [moment for operation, moment in looks.asked if operation == create.event.operation]
    create_seconds = 300  # the flex-start create latency of the test world
    gaps = [(b - a).total_seconds() for a, b in zip(asked, asked[1:])]
    assert asked and min(gaps) >= 20, gaps
    assert len(asked) <= create_seconds // 20 + 2
    done_at = create.recorded_at + dt.timedelta(seconds=create_seconds)
    assert asked[-1] >= done_at
    assert (asked[-1] - done_at).total_seconds() <= 20


class _ForgetfulGke:
    """GKE's node-pool API as it is after a long outage: it knows no operation any more
    (``get_operation`` is NOT_FOUND), and every third look at a pool is throttled
    (429). Notes when each pool was looked at, by any call."""

    def __init__(self, inner: object, clock: VirtualClock) -> None:
        self._inner, self._clock = inner, clock
        self.looks: dict[str, list[dt.datetime]] = {}
        self._gets = 0

    def _look(self, name: str) -> None:
        self.looks.setdefault(name, []).append(self._clock.now())

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        self._look(f"operation:{operation_id}")
        raise PortError(NOT_FOUND, f"Not found: operation {operation_id}")

    def get(self, cluster: Cluster, name: str) -> NodePoolInfo:
        self._look(name)
        self._gets += 1
        if self._gets % 3 == 0:
            raise PortError(RETRYABLE, "429 Too Many Requests: quota exceeded")
        return self._inner.get(cluster, name)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_unknown_operations_and_throttling_never_make_a_call_more_often_than_the_poll(
        harness: Harness, clock: VirtualClock) -> None:
    """After a long outage GKE may know none of the operations the log names; the
    controller looks at the pools themselves instead, and whatever the errors (NOT_FOUND,
    429) and across a restart, a task's pool is looked at no more often than the poll
    interval (apart from the one look each new event of the task may bring)."""
    h = harness
    gke = _ForgetfulGke(h.ports.node_pools, clock)
    h.ports = dataclasses.replace(h.ports, node_pools=gke)
    h.rebuild()
    tasks = [h.submit(f"t{i}") for i in range(3)]
    h.run_for(200)
    h.restart()
    h.run()

    assert {t: h.history[t][-1] for t in tasks} == dict.fromkeys(tasks, ("Succeeded", None))
    assert h.live_pools() == []
    poll = 20
    for name, moments in gke.looks.items():
        gaps = [(b - a).total_seconds() for a, b in zip(moments, moments[1:])]
        short = [g for g in gaps if g < poll]
        # A look right after an event of the task (created, nodes not ready, restart)
        # may come sooner; every other look waits the interval.
        assert len(short) <= 4, (name, gaps)
        assert len(moments) <= (moments[-1] - moments[0]).total_seconds() / poll + 5, (
            name, len(moments))
