"""The ``sim`` backend of every port: a seeded, virtual-time world of GKE clusters,
Compute reservations, Kubernetes Jobs and Pub/Sub (the embedded default backend).

    world = SimWorld(clock, load_sim_config(path_or_None), seed=7,
                     behaviour_source=behaviour_from_tasks(app.tasks))
    ports = build_sim_ports(world)   # ports.next_due = world.next_due
"""

from __future__ import annotations

from falcon_es.domain.ports import Ports

from falcon_es.adapters.sim.bus import SimBus
from falcon_es.adapters.sim.compute import ReservationUsage, SimReservations
from falcon_es.adapters.sim.config import (
    BusConfig, ClusterBehaviour, DeliveryFaults, FaultRule, JobDefaults, QuotaConfig,
    ReservationConfig, SimClusterConfig, SimConfig, SimConfigError, Span, StockoutConfig,
    load_sim_config,
)
from falcon_es.adapters.sim.gke import PoolSnapshot
from falcon_es.adapters.sim.kube import SimEdgeCluster, SimEdgeClusters
from falcon_es.adapters.sim.kube_manifests import SIM_ANNOTATION
from falcon_es.adapters.sim.world import ClusterSim, SimWorld, behaviour_from_tasks
from falcon_es.adapters.sim.pool_port import SimNodePools


def build_sim_ports(world: SimWorld) -> Ports:
    """The ports bundle over ``world`` (``Ports.next_due`` is the world's)."""
    return world.ports()


__all__ = [
    "BusConfig", "ClusterBehaviour", "ClusterSim", "DeliveryFaults", "FaultRule",
    "JobDefaults", "PoolSnapshot", "QuotaConfig", "ReservationConfig", "ReservationUsage",
    "SIM_ANNOTATION", "SimBus", "SimClusterConfig", "SimConfig", "SimConfigError",
    "SimEdgeCluster", "SimEdgeClusters", "SimNodePools", "SimReservations", "SimWorld",
    "Span", "StockoutConfig", "behaviour_from_tasks", "build_sim_ports", "load_sim_config",
]
