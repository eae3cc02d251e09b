"""Simulated Compute reservations: configured capacity minus what live pools hold.

Counts are VMs, as in a specific-SKU reservation's ``count`` / ``inUseCount``;
slices available = (count - in_use - VMs held by this world's reservation pools)
// hosts per slice (xpk's formula). A reservation for another machine type offers
no slices of this shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from falcon_es.domain.ports import NOT_FOUND, PortError, ReservationCapacity
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.tpu import SliceShape

from falcon_es.adapters.sim.common import WorldCall
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
        identity = gke.identity

        def answer(now: object) -> int:
            config = identity.config.reservation(reservation)
            if config is None:
                name = reservation.rsplit("/", 1)[-1]
                raise PortError(NOT_FOUND, f"The resource '{identity.reservation_path(name)}' "
                                           f"was not found (reservation {name} not found in "
                                           f"project {identity.project} zone "
                                           f"{identity.location})")
            return gke.reservation_unused_vms(config, shape) // max(1, shape.hosts)

        return self._call(answer)

    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity:
        """The configured reservation's machine type and VM count (as Compute's
        ``specificReservation.instanceProperties.machineType`` and ``count``)."""
        gke = self._pools_of(cluster)

        def answer(now: object) -> ReservationCapacity:
            config = gke.identity.config.reservation(reservation)
            if config is None:
                return ReservationCapacity()
            return ReservationCapacity(config.machine_type, config.count)

        return self._call(answer)
