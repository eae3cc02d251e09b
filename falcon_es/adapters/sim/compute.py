"""Simulated Compute reservations: configured capacity minus what live pools hold.

Counts are VMs, as in a specific-SKU reservation's ``count`` / ``inUseCount``;
slices available = (count - in_use - VMs held by this world's reservation pools)
// hosts per slice (xpk's formula). A reservation for another machine type offers
no slices of this shape.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from falcon_es.ports import NOT_FOUND, PortError
from falcon_es.registry import Cluster
from falcon_es.tpu import SliceShape

if TYPE_CHECKING:
    from falcon_es.adapters.sim.world import SimWorld


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
    """The ``Reservations`` port."""

    def __init__(self, world: SimWorld) -> None:
        self._world = world

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: SliceShape) -> int:
        sim = self._world.cluster(cluster)

        def answer(now: object) -> int:
            config = sim.identity.config.reservation(reservation)
            if config is None:
                name = reservation.rsplit("/", 1)[-1]
                raise PortError(NOT_FOUND, f"The resource '{sim.identity.reservation_path(name)}' "
                                           f"was not found (reservation {name} not found in "
                                           f"project {sim.identity.project} zone "
                                           f"{sim.identity.location})")
            return sim.gke.reservation_free_hosts(config, shape) // max(1, shape.hosts)

        return self._world.call(answer)
