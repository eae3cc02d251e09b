"""The names a saved sim world gives the classes of its objects, declared in one place.

A saved world (``persist``) names each object's class by the name given here, never by
its module path, so moving a sim module (or a domain value class the world holds)
breaks no saved world: only this table changes. A name, once used, stays: a class
renamed keeps its old name here, a class dropped leaves its name unused. Classes
of the standard library (``datetime``, ``Counter``, ``random.Random``) are pickled
as Python names them, which does not move.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType

from falcon_es.adapters.sim import (
    bus, common, compute, config, gke, informer, kube, kube_api, kube_jobset, kube_objects,
    pod_logs, pool_port, timeline, world,
)
from falcon_es.domain import clusters, naming, ports, spec, tpu

#: Saved name -> class, for every class a saved world holds (rows and values).
SAVED_CLASSES: Mapping[str, type] = MappingProxyType({
    # The world and its clusters.
    "SimWorld": world.SimWorld,
    "ClusterSim": world.ClusterSim,
    "CreateRecord": world.CreateRecord,
    "Timeline": timeline.Timeline,
    "ClusterIdentity": common.ClusterIdentity,
    "Random": random.Random,
    # Its configuration.
    "SimConfig": config.SimConfig,
    "Span": config.Span,
    "FaultRule": config.FaultRule,
    "StockoutConfig": config.StockoutConfig,
    "QuotaConfig": config.QuotaConfig,
    "ReservationConfig": config.ReservationConfig,
    "ReservationSize": config.ReservationSize,
    "ClusterBehaviour": config.ClusterBehaviour,
    "SimClusterConfig": config.SimClusterConfig,
    "JobDefaults": config.JobDefaults,
    "DeliveryFaults": config.DeliveryFaults,
    "BusConfig": config.BusConfig,
    # GKE and Compute.
    "NodePoolService": gke.NodePoolService,
    "SimNodePools": pool_port.SimNodePools,
    "SimPool": gke.SimPool,
    "SimNode": gke.SimNode,
    "SimOperation": gke.SimOperation,
    "PoolSnapshot": gke.PoolSnapshot,
    "SimReservations": compute.SimReservations,
    "ReservationUsage": compute.ReservationUsage,
    # The edge clusters.
    "KubeService": kube_api.KubeService,
    "SimEdgeCluster": kube.SimEdgeCluster,
    "SimEdgeClusters": kube.SimEdgeClusters,
    "SimJobSets": kube_jobset.SimJobSets,
    "SimPod": kube_objects.SimPod,
    "SimCreateFailure": kube_objects.SimCreateFailure,
    "SimFailureRule": kube_objects.SimFailureRule,
    "SimJob": kube_objects.SimJob,
    "SimJobSet": kube_objects.SimJobSet,
    "SimService": kube_objects.SimService,
    "SimPodLogs": pod_logs.SimPodLogs,
    "Informer": informer.Informer,
    # The bus.
    "SimBus": bus.SimBus,
    "SimBusMessage": bus._Message,
    "SimBusEntry": bus._Entry,
    "SimBusSubscription": bus._Subscription,
    # Values of the domain the world holds.
    "Cluster": clusters.Cluster,
    "JobObservation": ports.JobObservation,
    "PodObservation": ports.PodObservation,
    "CreateRefusal": ports.CreateRefusal,
    "JobRef": ports.JobRef,
    "OwnerMarks": naming.OwnerMarks,
    "NodeCounts": ports.NodeCounts,
    "NodePoolInfo": ports.NodePoolInfo,
    "NodePoolSpec": ports.NodePoolSpec,
    "Operation": ports.Operation,
    "ReservationCapacity": ports.ReservationCapacity,
    "BusMessage": ports.BusMessage,
    "SimBehaviour": spec.SimBehaviour,
    "SliceShape": tpu.SliceShape,
    "MappingProxyType": MappingProxyType,
})


def saved_names() -> dict[type, str]:
    """Class -> the name it is saved under (a table to look classes up in)."""
    return {cls: name for name, cls in SAVED_CLASSES.items()}
