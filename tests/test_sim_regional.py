"""Regional clusters on the sim (docs/FIDELITY.md, "Regional and zonal clusters").

The world models what GKE does with a regional cluster: it is addressed by its region,
has three zones, and a pool created without ``locations`` gets a node group in each
(three times the nodes; COMPACT placement refused). Reservations are zonal. What one
``location`` field did before (no ``locations`` on the pool) fails here; the controller,
which sends the node zone, runs tasks on a regional cluster to success.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from falcon_es.adapters.sim import SimConfig, SimConfigError, SimWorld, build_sim_ports
from falcon_es.adapters.sim.common import COMPACT_ZONES_WORDS
from falcon_es.adapters.sim.config import ReservationConfig, SimClusterConfig
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import INVALID, NOT_FOUND, NodePoolSpec, PortError, Ports
from falcon_es.domain.tpu import slice_shape
from falcon_es.storage.tables import clusters
from tests.support.harness import QUIET, Harness

START = dt.datetime(2026, 11, 1, 9, 0, 0)
REGION, ZONE = "us-central1", "us-central1-b"
WORLD: dict[str, Any] = {
    "defaults": {"create_latency_seconds": 60, "visibility_delay_seconds": 0,
                 "node_register_seconds": 10, "node_ready_lag_seconds": 5},
    "clusters": {
        "reg": {"project": "proj-r", "location": REGION, "node_location": ZONE,
                "tpu_types": ["v6e"], "default_reservation": "res-r",
                "reservations": [{"name": "res-r", "count": 8},
                                 {"name": "res-a", "count": 8, "zone": "us-central1-a"}]},
    },
}
REGIONAL = Cluster("id-reg", "reg", "proj-r", REGION, "v6e", "bucket", "res-r", "active", START,
                   node_location=ZONE)


class World:
    def __init__(self, data: dict[str, Any] = WORLD) -> None:
        self.clock = VirtualClock(START)
        self.world = SimWorld(self.clock, SimConfig.from_data(data), seed=1)
        self.ports: Ports = build_sim_ports(self.world)

    def create(self, topology: str, *, locations: tuple[str, ...], mode: str = "on-demand",
               reservation: str | None = None, name: str = "falcon-p") -> None:
        self.ports.node_pools.create(NodePoolSpec(
            REGIONAL, name, slice_shape("v6e", topology), mode, reservation, 600,
            {"managed-by": "falcon"}, locations=locations))

    def settle(self) -> None:
        """Play the world until nothing is due (each call plays one due moment)."""
        due = self.world.advance_to_next_due()
        while due is not None:
            due = self.world.advance_to_next_due()


def test_a_pool_without_locations_spreads_over_the_regions_three_zones() -> None:
    """The old behaviour: one node per zone for a one-host slice, three in all."""
    w = World()
    w.create("2x2", locations=())
    w.settle()
    info = w.ports.node_pools.get(REGIONAL, "falcon-p")
    (pool,) = w.world.pools("reg")
    assert (info.node_count, pool.registered) == (3, 3)
    assert pool.zones == ("us-central1-a", "us-central1-b", "us-central1-c")


def test_a_pool_in_the_node_zone_has_the_slices_hosts() -> None:
    w = World()
    w.create("4x4", locations=(ZONE,))
    w.settle()
    (pool,) = w.world.pools("reg")
    assert (pool.status, pool.registered, pool.zones) == ("RUNNING", 4, (ZONE,))
    assert w.ports.node_pools.get(REGIONAL, "falcon-p").node_count == 4


def test_compact_placement_over_the_regions_zones_is_refused() -> None:
    w = World()
    with pytest.raises(PortError) as refused:
        w.create("4x4", locations=())
    assert (refused.value.code, refused.value.message) == (INVALID, COMPACT_ZONES_WORDS)
    assert w.world.pools("reg") == []


def test_a_zone_outside_the_clusters_region_is_refused() -> None:
    w = World()
    with pytest.raises(PortError) as refused:
        w.create("2x2", locations=("us-east5-b",))
    assert refused.value.message == ("Node pool locations us-east5-b are not in the cluster's "
                                     "region us-central1.")


def test_reservations_are_zonal() -> None:
    """Read in the cluster's node zone; one in another zone of the region is not found
    there, and a pool in the node zone cannot consume it."""
    w = World()
    assert w.ports.reservations.remaining_slices(REGIONAL, "res-r", slice_shape("v6e", "2x2")) == 8
    with pytest.raises(PortError) as missing:
        w.ports.reservations.remaining_slices(REGIONAL, "res-a", slice_shape("v6e", "2x2"))
    assert missing.value.code == NOT_FOUND
    assert "projects/proj-r/zones/us-central1-b/reservations/res-a' was not found" in (
        missing.value.message)
    with pytest.raises(PortError) as refused:
        w.create("2x2", locations=(ZONE,), mode="reservation", reservation="res-a")
    assert "reservation res-a not found in project proj-r zone us-central1-b" in (
        refused.value.message)
    w.create("2x2", locations=("us-central1-a",), mode="reservation", reservation="res-a")


def test_a_regional_cluster_without_a_node_zone_reads_no_reservation() -> None:
    w = World()
    legacy = dataclasses.replace(REGIONAL, node_location=None)
    with pytest.raises(PortError) as refused:
        w.ports.reservations.remaining_slices(legacy, "res-r", slice_shape("v6e", "2x2"))
    assert refused.value.code == INVALID
    assert "--node-location ZONE" in refused.value.message


@pytest.mark.parametrize("entry, words", [
    ({"zones": ["us-central1"]}, "clusters.reg.zones[0]: 'us-central1' is not a zone"),
    ({"reservations": [{"name": "r", "count": 1, "zone": "us"}]},
     "clusters.reg.reservations[0].zone: 'us' is not a zone"),
])
def test_the_sim_config_refuses_a_region_where_a_zone_belongs(entry: dict[str, Any],
                                                               words: str) -> None:
    data = {"clusters": {"reg": {**WORLD["clusters"]["reg"], **entry}}}
    with pytest.raises(SimConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SimConfig.from_data(data)


# ------------------------------------------------------------ end to end

Make = Callable[..., Harness]


def regional(name: str = "v6e-reg") -> SimClusterConfig:
    return SimClusterConfig(
        name=name, project="proj", location=REGION, node_location=ZONE, tpu_types=("v6e",),
        gcs_bucket="logs-bucket", default_reservation=f"{name}-r",
        reservations=(ReservationConfig(f"{name}-r", 8),), behaviour=QUIET)


def test_tasks_run_on_a_regional_cluster_in_its_node_zone(make: Make) -> None:
    """A multi-host slice (COMPACT) from the reservation, and a flex-start one-host
    slice: each pool in the node zone with the slice's hosts, both tasks succeed."""
    h = make(regional())
    h.submit("big", topology="4x4")
    h.submit("small", topology="2x2", supply_mode="flex-start")
    h.run()
    assert h.statuses() == {"big": ("Succeeded", None), "small": ("Succeeded", None)}
    pools = {p.name: p for p in h.world.pools(include_deleted=True)}
    assert {(p.topology, p.zones, p.hosts) for p in pools.values()} == {
        ("4x4", (ZONE,), 4), ("2x2", (ZONE,), 1)}
    assert h.live_pools() == []


def test_a_regional_cluster_registered_before_the_node_zone_fails_the_task_naming_the_flag(
        make: Make) -> None:
    """A registry row from before (location a region, no node zone): the controller
    creates no pool that would spread over three zones; the task fails and says why."""
    h = make(regional())
    with h.app.engine.begin() as conn:
        conn.execute(clusters.update().values(node_location=None))
    h.app.cluster_cache.invalidate()
    h.submit("t1", topology="4x4")
    h.run()
    status, _ = h.statuses()["t1"]
    assert status == "Failed"
    assert any("cluster v6e-reg is regional (us-central1): give the zone its TPU pools go in "
               "with --node-location ZONE" in m for m in h.messages["t1"])
    assert h.world.pools(include_deleted=True) == []
