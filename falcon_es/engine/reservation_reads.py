"""The schedule of the controller's reservation reads.

Each registered cluster's default reservation is read once per round, one read per
topology its tasks ask for, and a round starts at most once per
``FALCON_RESERVATION_READ_SECONDS``, whatever the answers: a failed read waits for the
next round like a good one, so an unreachable Compute API costs one call per
reservation and topology per interval, never more. What the controller keeps is
bounded by the clusters and the topologies of their TPU types, not by the history: the
next round's moment, and the last value read per (cluster, reservation, topology), so
only a change is recorded in the log.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import Reservations
from falcon_es.domain.tpu import SliceShape, choose_machine, machine_types, slice_shape

#: (cluster id, reservation, topology)
ReadKey = tuple[str, str, str]


class ReservationReads:
    def __init__(self, interval_seconds: float) -> None:
        self.interval = dt.timedelta(seconds=interval_seconds)
        self._next_round: dt.datetime | None = None
        self._last: dict[ReadKey, int] = {}
        #: The error text of each read that failed last round (logged once per change).
        self.failing: dict[ReadKey, str] = {}

    def round_due(self, now: dt.datetime) -> bool:
        """True (and the next round scheduled an interval on) when a round is due."""
        if self._next_round is not None and now < self._next_round:
            return False
        self._next_round = now + self.interval
        return True

    def unfinished(self) -> None:
        """A read of this round awaits its answer: the round is due again next tick."""
        self._next_round = None

    @property
    def next_round(self) -> dt.datetime | None:
        return self._next_round

    def topologies(self, cluster_id: str, asked: Iterable[str]) -> list[str]:
        """The topologies to read for a cluster: those its tasks ask for now, and those
        read before (so a gauge once shown keeps being current)."""
        known = {topology for cid, _, topology in self._last if cid == cluster_id}
        return sorted(known | set(asked))

    def read(self, key: ReadKey, slices: int) -> bool:
        """Record a good read; True when it differs from the last one (or is the first)."""
        self.failing.pop(key, None)
        changed = self._last.get(key) != slices
        self._last[key] = slices
        return changed

    def failed(self, key: ReadKey, words: str) -> bool:
        """Record a failed read; True when its words differ from the last failure's."""
        changed = self.failing.get(key) != words
        self.failing[key] = words
        return changed


def reserved_shape(reservations: Reservations, cluster: Cluster, reservation: str,
                   topology: str) -> SliceShape:
    """The slice a task of the topology would get on the reservation: for the one shape
    two machine types make (v5e/v6e 2x4), on the machine type the reservation holds."""
    machine = None
    if len(machine_types(cluster.tpu_type, topology)) > 1:
        reserved = reservations.capacity(cluster, reservation).machine_type
        machine = choose_machine(cluster.tpu_type, topology, reserved=reserved)
    return slice_shape(cluster.tpu_type, topology, machine)
