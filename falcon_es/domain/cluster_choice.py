"""Cluster choice: which registered cluster a task queues on, and where a task waiting
in a stuck queue would start at once.

The rule (see docs, 'Scheduling'): candidates are the active clusters of the task's TPU
type. A cluster holding an idle, retained pool of the task's topology wins; otherwise
the one where the fewest would be ahead of it (the slot holder and the waiting tasks of
its priority or higher); ties go to the cluster name, then its id. Pure core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from falcon_es.domain import chart
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.queue_places import QueueKey
from falcon_es.domain.ports import ReservationCapacity
from falcon_es.domain.reservation_end import EndsTooSoon
from falcon_es.domain.spec import RESERVATION
from falcon_es.domain.tpu import SliceShape

ACTIVE = "active"

# Why a cluster won.
WHY_IDLE_POOL = "idle-pool"
WHY_QUEUE_DEPTH = "queue-depth"
WHY_ONLY_CANDIDATE = "only-candidate"
WHY_TIE_BREAK = "tie-break"


class QueueOccupancy(Protocol):
    """What ``move_target`` reads of the queues (the ``QueueBook``)."""

    def holders(self, key: QueueKey) -> tuple[str, ...]: ...

    def waiting_count(self, key: QueueKey) -> int: ...


@dataclasses.dataclass(frozen=True)
class ClusterChoice:
    cluster: Cluster
    why: str
    candidates: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class NeverFit:
    """A cluster whose reservation can never serve a request, whatever is in use: it
    holds VMs of another machine type, or fewer in total than the request needs."""

    cluster: str
    reservation: str
    machine_type: str | None
    vms: int | None

    def as_data(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def never_fits(cluster: str, reservation: str, capacity: ReservationCapacity,
               shape: SliceShape, slices: int) -> NeverFit | None:
    """The reservation's side when it can never serve ``slices`` slices of ``shape``
    (None: it can, or what it holds is not known)."""
    other_machine = bool(capacity.machine_type) and capacity.machine_type != shape.machine_type
    too_few = capacity.vms is not None and capacity.vms < shape.hosts * slices
    if other_machine or too_few:
        return NeverFit(cluster, reservation, capacity.machine_type, capacity.vms)
    return None


@dataclasses.dataclass(frozen=True)
class NoMatch:
    """No cluster can take the task, which fails: none of the TPU type is registered,
    or the task asked for a reservation and no cluster of its type has one
    (``without_reservation`` names the clusters of the type then), or the reservation
    of every active cluster of its type can never serve its request (``never_fit``)."""

    registered_tpu_types: tuple[str, ...]
    supply_mode: str | None = None
    without_reservation: tuple[str, ...] = ()
    never_fit: tuple[NeverFit, ...] = ()


@dataclasses.dataclass(frozen=True)
class NoneActive:
    """Clusters of the TPU type exist but none is active, or every active one's
    reservation ends before the task could finish (its entry says when): the task
    keeps waiting."""

    clusters: tuple[dict[str, Any], ...]


def choose_cluster(
    tpu_type: str,
    topology: str,
    clusters: Sequence[Cluster],
    depth: Callable[[QueueKey], int],
    idle_pools: Collection[QueueKey],
    supply_mode: str | None = None,
    never_fit: Callable[[Cluster], NeverFit | EndsTooSoon | None] | None = None,
) -> ClusterChoice | NoMatch | NoneActive:
    """Pick the cluster for a task; ``depth(key)`` is the number of tasks that would be
    ahead of it in a (cluster, topology) queue (``QueueBook.ahead``); ``idle_pools`` holds the queues where an
    idle, retained pool of that topology sits. A task that asks for the reservation
    supply mode goes only to clusters with a default reservation: elsewhere its pool
    could never be created. It waits while those are all inactive, and fails when its
    TPU type has none. ``never_fit`` says of a cluster whether the reservation the task
    would use there can never serve it: such a cluster is no candidate; when every
    active one is such, the task fails naming them (or waits for an inactive one). Nor
    is one whose reservation ends before the task could finish (``EndsTooSoon``); the
    task waits while no other can take it, its Message naming that end."""
    of_type = [c for c in clusters if c.tpu_type == tpu_type]
    if not of_type:
        return NoMatch(tuple(sorted({c.tpu_type for c in clusters})))
    if supply_mode == RESERVATION:
        reserved = [c for c in of_type if c.default_reservation]
        if not reserved:
            return NoMatch(tuple(sorted({c.tpu_type for c in clusters})), supply_mode,
                           tuple(sorted(c.name for c in of_type)))
        of_type = reserved
    active = [c for c in of_type if c.status == ACTIVE]
    ending: dict[str, EndsTooSoon] = {}
    if active and never_fit is not None:
        unfit = {c.id: verdict for c in active if (verdict := never_fit(c)) is not None}
        ending = {key: v for key, v in unfit.items() if isinstance(v, EndsTooSoon)}
        never = [v for v in unfit.values() if isinstance(v, NeverFit)]
        if len(never) == len(active) == len(of_type):
            return NoMatch(tuple(sorted({c.tpu_type for c in clusters})), supply_mode,
                           never_fit=tuple(sorted(never, key=lambda u: u.cluster)))
        active = [c for c in active if c.id not in unfit]
    if not active:
        return NoneActive(tuple(ending[c.id].as_data() if c.id in ending
                                else {"name": c.name, "status": c.status}
                                for c in sorted(of_type, key=lambda c: (c.name, c.id))))
    rows = []
    for cluster in sorted(active, key=lambda c: (c.name, c.id)):
        key = (cluster.id, topology)
        rows.append((cluster, depth(key), key in idle_pools))
    candidates = tuple({"cluster_id": c.id, "name": c.name, "queued": queued, "idle_pool": idle}
                       for c, queued, idle in rows)
    if len(rows) == 1:
        return ClusterChoice(rows[0][0], WHY_ONLY_CANDIDATE, candidates)
    with_pool = [r for r in rows if r[2]]
    if with_pool:
        best = min(with_pool, key=lambda r: (r[1], r[0].name, r[0].id))
        return ClusterChoice(best[0], WHY_IDLE_POOL, candidates)
    fewest = min(r[1] for r in rows)
    best_rows = [r for r in rows if r[1] == fewest]
    why = WHY_QUEUE_DEPTH if len(best_rows) == 1 else WHY_TIE_BREAK
    return ClusterChoice(best_rows[0][0], why, candidates)


#: A slot holder in one of these states that long makes its queue's waiting tasks
#: candidates to move (the world, not the queue, is what holds them up).
STUCK_REASONS = (chart.PendingReason.CLUSTER_BUSY, chart.PendingReason.WAITING_FOR_NODE)


def move_target(tpu_type: str, topology: str, from_cluster: str, clusters: Sequence[Cluster],
                book: QueueOccupancy, supply_mode: str | None,
                room: Callable[[Cluster], bool] | None = None) -> Cluster | None:
    """Where a waiting task of a stuck queue would start at once: another active
    cluster of its TPU type (with a reservation when the task asks for one) whose queue
    for its topology has nobody waiting and the slot free, and (``room``, for a slot
    holder waiting for reservation room) whose capacity can take it; the first by name."""
    for cluster in sorted(clusters, key=lambda c: (c.name, c.id)):
        if (cluster.id == from_cluster or cluster.tpu_type != tpu_type
                or cluster.status != ACTIVE
                or (supply_mode == RESERVATION and not cluster.default_reservation)):
            continue
        key = (cluster.id, topology)
        if (not book.holders(key) and not book.waiting_count(key)
                and (room is None or room(cluster))):
            return cluster
    return None
