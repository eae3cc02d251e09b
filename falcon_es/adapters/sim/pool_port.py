"""The ``NodePools`` port of the simulated world: each call made at the world's moment
on the cluster's simulated GKE side (``falcon_es.adapters.sim.gke``)."""

from __future__ import annotations

from collections.abc import Callable

from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import NodePoolInfo, NodePoolSpec, Operation

from falcon_es.adapters.sim.common import RecordCreate, WorldCall, no_record
from falcon_es.adapters.sim.gke import NodePoolService


class SimNodePools:
    """The ``NodePools`` port over every cluster of the world. ``pools_of(cluster)`` is
    the cluster's node-pool API (created on first use) and ``call`` runs a call at the
    world's moment: all this port needs of the world that builds it."""

    def __init__(self, call: WorldCall, pools_of: Callable[[Cluster], NodePoolService],
                 record: RecordCreate = no_record) -> None:
        self._call = call
        self._pools_of = pools_of
        self._record = record

    def create(self, spec: NodePoolSpec) -> Operation:
        gke = self._pools_of(spec.cluster)
        operation = self._call(lambda now: gke.create(spec, now))
        self._record(spec.cluster.name, "NodePool", spec.name)
        return operation

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        gke = self._pools_of(cluster)
        return self._call(lambda now: gke.get_operation(operation_id))

    def get(self, cluster: Cluster, name: str) -> NodePoolInfo:
        gke = self._pools_of(cluster)
        return self._call(lambda now: gke.get(name, now))

    def delete(self, cluster: Cluster, name: str) -> Operation | None:
        gke = self._pools_of(cluster)
        return self._call(lambda now: gke.delete(name, now))

    def list(self, cluster: Cluster) -> list[NodePoolInfo]:
        gke = self._pools_of(cluster)
        return self._call(lambda now: gke.list(now))
