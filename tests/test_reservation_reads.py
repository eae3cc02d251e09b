"""Scheduled reservation reads: the controller reads each cluster's reservation once
per FALCON_RESERVATION_READ_SECONDS (per topology its tasks ask for), whatever the
answers, records a changed value in the cluster's stream, and the gauge and
``falcon-es clusters`` show it. On the sim with the virtual clock (the port calls
counted) and through google-cloud-compute against the fake Compute server."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from google.auth.credentials import AnonymousCredentials

from falcon_es.domain import events as ev
from falcon_es.adapters.gcp.compute import ComputeReservations
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.observability.metrics import Metrics
from falcon_es.domain.ports import RETRYABLE, PortError
from falcon_es.domain.clusters import Cluster, cluster_stream
from falcon_es.config.settings import Settings
from tests.fakes.compute_server import FakeCompute, serve_rest
from tests.support.harness import Harness, Harnesses, reserved_cluster

INTERVAL = 60
#: Flex-start tasks on a cluster with a reservation: provisioning never reads the
#: reservation for them, so every reservation call is a scheduled read.
LONG = {"supply_mode": "flex-start", "sim": {"duration_seconds": 7200}}


class CountingReservations:
    """The sim's reservations port, counting calls; refuses while ``refusing``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[str, str]] = []
        self.refusing = False

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: Any) -> int:
        self.calls.append((reservation, shape.topology))
        if self.refusing:
            raise PortError(RETRYABLE, "429 Too Many Requests: rate limit exceeded")
        return int(self._inner.remaining_slices(cluster, reservation, shape))

    def capacity(self, cluster: Cluster, reservation: str) -> Any:
        return self._inner.capacity(cluster, reservation)


@pytest.fixture
def harness(db_url: str, clock: VirtualClock) -> Iterator[Harness]:
    harnesses = Harnesses(db_url, clock)
    settings = Settings.from_env({"FALCON_DB_URL": db_url,
                                  "FALCON_RESERVATION_READ_SECONDS": str(INTERVAL)})
    yield harnesses(reserved_cluster(count=16, in_use=3), settings=settings)
    harnesses.close()


def _reads(h: Harness) -> list[ev.ReservationRead]:
    cluster = h.app.cluster_cache.clusters()[0]
    return [r.event for r in h.app.store.read_stream(cluster_stream(cluster.id))
            if isinstance(r.event, ev.ReservationRead)]


def _tick_every_second(h: Harness, seconds: int) -> None:
    """A controller on a wall clock ticking once a second, played on the virtual clock."""
    for _ in range(seconds):
        h.tick()
        h.clock.advance(1)
        h.world.step()


def test_reads_are_one_per_reservation_and_topology_per_interval_even_while_refused(
        harness: Harness) -> None:
    h = harness
    counting = CountingReservations(h.ports.reservations)
    h.ports = dataclasses.replace(h.ports, reservations=counting)
    h.rebuild()
    h.submit("a", LONG, topology="2x2")
    h.submit("b", LONG, topology="4x4")
    counting.refusing = True

    _tick_every_second(h, 300)  # 300 ticks, every read refused

    # Rounds at 0, 60, 120, 180 and 240 s; the first came before intake took the tasks
    # in (its tick's own acceptances), so it had no topology to read.
    assert len(counting.calls) == 4 * 2
    assert set(counting.calls) == {("v6e-res-r", "2x2"), ("v6e-res-r", "4x4")}
    assert _reads(h) == []  # nothing read, nothing recorded

    counting.refusing = False
    _tick_every_second(h, 300)

    assert len(counting.calls) == (4 + 5) * 2
    # Only the first good read of each topology is recorded: nothing changed after.
    cluster_id = h.app.cluster_cache.clusters()[0].id
    assert _reads(h) == [ev.ReservationRead(cluster_id, "v6e-res", "v6e-res-r", "2x2", 13),
                         ev.ReservationRead(cluster_id, "v6e-res", "v6e-res-r", "4x4", 3)]


def test_a_change_is_recorded_and_feeds_the_gauge_and_clusters(harness: Harness,
                                                               db_url: str) -> None:
    h = harness
    h.submit("a", LONG, topology="2x2")
    _tick_every_second(h, 61)
    h.submit("r", {"supply_mode": "reservation", "sim": {"duration_seconds": 7200}},
             topology="4x4")  # takes four of the reservation's thirteen free VMs
    h.run(lambda: h.statuses()["r"] == ("Running", None))
    _tick_every_second(h, INTERVAL + 1)

    # Before: 13 VMs free (16 - 3 in use by others); the 4x4 pool then holds four.
    assert [(r.topology, r.slices) for r in _reads(h)] == [
        ("2x2", 13), ("4x4", 3), ("2x2", 9), ("4x4", 2)]

    metrics = Metrics(process_collectors=False)
    cluster = h.app.cluster_cache.clusters()[0]
    metrics.committed(h.app.store.read_stream(cluster_stream(cluster.id)), ())
    assert metrics.reservation_remaining.labels("v6e-res", "v6e-res-r", "2x2")._value.get() == 9

    shown = CliRunner().invoke(main, ["--db", db_url, "clusters", "--json"])
    assert shown.exit_code == 0, shown.output
    (entry,) = json.loads(shown.output)
    assert {(r["topology"], r["slices"]) for r in entry["reservation_remaining"]} == {
        ("2x2", 9), ("4x4", 2)}


def test_reads_through_compute_are_paced_through_its_errors(harness: Harness) -> None:
    h = harness
    fake = FakeCompute()
    fake.add_specific("proj", "us-east5-b", "v6e-res-r", machine_type="ct6e-standard-4t",
                      count=16, in_use=5)
    with serve_rest(fake) as endpoint:
        compute = ComputeReservations(credentials=AnonymousCredentials(), api_endpoint=endpoint)
        h.ports = dataclasses.replace(h.ports, reservations=compute)
        h.rebuild()
        h.submit("a", LONG, topology="2x2")
        for _ in range(2):
            fake.fail_next("reservation", 429, "Quota exceeded for quota metric 'Read "
                                               "requests' and limit 'Read requests per minute'")

        _tick_every_second(h, 5 * INTERVAL)
        compute.close()

    # Rounds at 60, 120, 180 and 240 s (the one at 0 s came before intake took the task
    # in), one read each: two refused (429), two answered; nothing read in between.
    assert len(fake.calls_of("reservation")) == 4
    assert [(r.topology, r.slices) for r in _reads(h)] == [("2x2", 11)]
