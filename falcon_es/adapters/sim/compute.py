"""Simulated Compute reservations: configured capacity minus what live pools hold.

Counts are VMs, as in a specific-SKU reservation's ``count`` / ``inUseCount``;
slices available = (count - in_use - VMs held by this world's reservation pools)
// hosts per slice (xpk's formula). A reservation for another machine type offers
no slices of this shape. Reservations are zonal: read in the cluster's node zone, one
in another zone is not found, as Compute answers; so is one after its end (``ends_at``:
a calendar-mode reservation, which Compute deletes then).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

from falcon_es.domain.ports import INVALID, NOT_FOUND, PortError, ReservationCapacity
from falcon_es.domain.clusters import Cluster, missing_node_zone
from falcon_es.domain.tpu import SliceShape

from falcon_es.adapters.sim.common import WorldCall
from falcon_es.adapters.sim.config import ReservationConfig
from falcon_es.adapters.sim.gke import NodePoolService


@dataclasses.dataclass(frozen=True)
class ReservationUsage:
    """One reservation in VMs: what ``remaining_slices`` divides by the slice's hosts."""

    name: str
    count: int
    in_use: int  # by something other than this world's pools
    held_by_pools: int
    machine_type: str | None

    @property
    def remaining(self) -> int:
        return max(0, self.count - self.in_use - self.held_by_pools)


class SimReservations:
    """The ``Reservations`` port. ``pools_of(cluster)`` is the cluster's simulated GKE
    side (its pools hold the reservations' VMs) and ``call`` runs a call at the world's
    moment: all this port needs of the world that builds it."""

    def __init__(self, call: WorldCall, pools_of: Callable[[Cluster], NodePoolService]) -> None:
        self._call = call
        self._pools_of = pools_of

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: SliceShape) -> int:
        gke = self._pools_of(cluster)
        zone = self._zone(cluster)

        def answer(now: dt.datetime) -> int:
            config = self._config(gke, reservation, zone, now)
            return gke.reservation_unused_vms(config, shape) // max(1, shape.hosts)

        return self._call(answer)

    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity:
        """The configured reservation's machine type and VM count (as Compute's
        ``specificReservation.instanceProperties.machineType`` and ``count``), read in
        the cluster's node zone; NOT_FOUND in Compute's words when it is not there."""
        gke = self._pools_of(cluster)
        zone = self._zone(cluster)

        def answer(now: dt.datetime) -> ReservationCapacity:
            config = self._config(gke, reservation, zone, now)
            return ReservationCapacity(config.machine_type, config.count, config.ends_at)

        return self._call(answer)

    @staticmethod
    def _zone(cluster: Cluster) -> str:
        """Where the cluster's reservations are read: its node zone."""
        if cluster.node_zone is None:
            raise PortError(INVALID, f"{missing_node_zone(cluster.name, cluster.location)}: "
                                     "TPU reservations are zonal")
        return cluster.node_zone

    @staticmethod
    def _config(gke: NodePoolService, reservation: str, zone: str,
                now: dt.datetime) -> ReservationConfig:
        """The reservation as configured in ``zone``; NOT_FOUND in Compute's words when
        there is none there, or when it has ended (Compute deleted it)."""
        identity = gke.identity
        config = identity.config.reservation(reservation)
        if config is None or identity.reservation_zone(config) != zone or config.gone(now):
            name = reservation.rsplit("/", 1)[-1]
            raise PortError(NOT_FOUND, f"The resource '{identity.reservation_path(name, zone)}"
                                       f"' was not found (reservation {name} not found in "
                                       f"project {identity.project} zone {zone})")
        return config
