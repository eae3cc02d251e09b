"""A calendar-mode reservation's end, against the work that would run on it.

Compute deletes a calendar-mode reservation at the end of its period, and the VMs that
consume it (Cloud TPU "calendar mode"); a read after that answers 404. A task whose
timeout would carry it past the end would be killed there, so it is not started on
that reservation; a pool's nodes lost at the end are a disruption named as such. Pure
core: what the scheduling and status handlers say, in one place.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from falcon_es.domain.ports import ReservationCapacity

#: What a cluster is to a task its reservation ends too soon for (the waiting
#: Message's and a re-queue's word for it).
RESERVATION_ENDING = "reservation-ending"


@dataclasses.dataclass(frozen=True)
class EndsTooSoon:
    """The reservation a task would use on a cluster ends before the task's timeout
    could: the cluster cannot take it now (it may once the reservation is replaced)."""

    cluster: str
    reservation: str
    ends_at: dt.datetime
    timeout_seconds: int

    def as_data(self) -> dict[str, Any]:
        """The entry the waiting Message shows for the cluster."""
        return {"name": self.cluster, "status": RESERVATION_ENDING,
                "reservation": self.reservation,
                "ends_at": self.ends_at.isoformat(timespec="seconds") + "Z",
                "timeout_seconds": self.timeout_seconds}


def ends_too_soon(cluster: str, reservation: str, capacity: ReservationCapacity,
                  now: dt.datetime, timeout_seconds: int) -> EndsTooSoon | None:
    """The reservation's end, when a task started now and running its whole timeout
    would outlast it (None: it has no end, or the task fits before it)."""
    ends_at = capacity.ends_at
    if ends_at is None or now + dt.timedelta(seconds=timeout_seconds) <= ends_at:
        return None
    return EndsTooSoon(cluster, reservation, ends_at, timeout_seconds)


def reservation_ended(reservation: str, cluster: str) -> str:
    """The cause a disruption of nodes made from an ended reservation leads with."""
    return (f"calendar-mode reservation {reservation} of cluster {cluster} has ended "
            "(Compute deletes it, and the VMs that consume it, at the end of its period): ")
