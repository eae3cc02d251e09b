"""What the handlers read of the clusters: answers fetched on the clusters' own workers.

A handler never waits for a cluster. Its reads (a pool, a create operation, a pool's
node counts, a Job's diagnosis, a reservation) go through ``ObservedReads``: the answer
to the same question fetched within ``calls.answer_max_age_seconds`` and after the
cluster's last effect, else the question is queued on the cluster's workers
(``ClusterCalls``) and the handler gets ``PortError(AWAITING)``: it waits quietly and
decides at a later tick, once the answer has landed (the loop ticks again when one
lands). A question already asked is not asked twice, so a cluster that does not answer
holds one call per question, each for its deadline.

The handlers see these reads as the ports (``observed_ports``): the effect methods
refuse, since effects go through the executor alone.

With inline calls (the sim backend) each read is made at once and nothing is kept:
the answers are exactly those of calling the ports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import (
    AWAITING, FAILED, JOB_KIND, EdgeCluster, JobRef, NodeCounts, NodePoolInfo, NodePoolSpec,
    Operation, PortError, Ports, ReservationCapacity,
)
from falcon_es.domain.tpu import SliceShape
from falcon_es.engine.cluster_calls import ClusterCalls

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Answer:
    value: Any
    error: PortError | None
    at: dt.datetime
    #: The cluster's effect count when the question was asked: an answer from before
    #: an effect on the cluster may be out of date (a pool just created).
    generation: int


class ObservedReads:
    """The answers of the clusters' workers to the handlers' questions."""

    def __init__(self, ports: Ports, calls: ClusterCalls, max_age_seconds: float) -> None:
        self.ports = ports
        self.calls = calls
        self.max_age = dt.timedelta(seconds=max_age_seconds)
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, Hashable], _Answer] = {}
        self._asked: set[tuple[str, Hashable]] = set()
        self._generation: dict[str, int] = {}

    def ask(self, cluster: Cluster, question: Hashable, read: Callable[[], T]) -> T:
        """The answer to ``question`` about ``cluster``; ``PortError(AWAITING)`` while
        it is being fetched. A fetched error is raised as the call raised it."""
        if self.calls.inline:
            return read()
        key = (cluster.id, question)
        now = self.ports.clock.now()
        with self._lock:
            answer = self._answers.get(key)
            generation = self._generation.get(cluster.id, 0)
            if (answer is not None and answer.generation == generation
                    and now - answer.at <= self.max_age):
                if answer.error is not None:
                    raise answer.error
                return answer.value  # type: ignore[no-any-return]
            asking = key not in self._asked
            self._asked.add(key)
        if asking:
            self.calls.submit(cluster, lambda: self._fetch(key, generation, read))
        raise PortError(AWAITING, f"waiting for {cluster.name}'s answer to {question}")

    def _fetch(self, key: tuple[str, Hashable], generation: int, read: Callable[[], Any]) -> None:
        value, error = None, None
        try:
            value = read()
        except PortError as failed:
            error = failed
        except Exception as bug:  # kept as the answer, so the question is not stuck
            error = PortError(FAILED, f"{type(bug).__name__}: {bug}")
            raise
        finally:
            with self._lock:
                self._asked.discard(key)
                self._answers[key] = _Answer(value, error, self.ports.clock.now(), generation)

    def effect_done(self, cluster_id: str) -> None:
        """An effect on the cluster finished: answers asked before it are out of date."""
        with self._lock:
            self._generation[cluster_id] = self._generation.get(cluster_id, 0) + 1
            self._answers = {k: a for k, a in self._answers.items() if k[0] != cluster_id}


class EffectRefused(RuntimeError):
    """A handler asked for an effect directly; effects go through the executor."""


def _refuse(what: str) -> EffectRefused:
    return EffectRefused(f"{what} is an effect: handlers record an intent and the effect "
                         "executor carries it out")


class _ObservedPools:
    def __init__(self, reads: ObservedReads) -> None:
        self._reads = reads
        self._pools = reads.ports.node_pools

    def create(self, spec: NodePoolSpec) -> Operation:
        raise _refuse("creating a node pool")

    def delete(self, cluster: Cluster, name: str) -> Operation | None:
        raise _refuse("deleting a node pool")

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        return self._reads.ask(cluster, ("operation", operation_id),
                               lambda: self._pools.get_operation(cluster, operation_id))

    def get(self, cluster: Cluster, name: str) -> NodePoolInfo:
        return self._reads.ask(cluster, ("pool", name), lambda: self._pools.get(cluster, name))

    def list(self, cluster: Cluster) -> list[NodePoolInfo]:
        return self._reads.ask(cluster, ("pools",), lambda: self._pools.list(cluster))


class _ObservedReservations:
    def __init__(self, reads: ObservedReads) -> None:
        self._reads = reads

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: SliceShape) -> int:
        reservations = self._reads.ports.reservations
        return self._reads.ask(cluster, ("reservation", reservation, shape),
                               lambda: reservations.remaining_slices(cluster, reservation, shape))

    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity:
        reservations = self._reads.ports.reservations
        return self._reads.ask(cluster, ("capacity", reservation),
                               lambda: reservations.capacity(cluster, reservation))


class _ObservedEdge:
    def __init__(self, reads: ObservedReads, cluster: Cluster) -> None:
        self._reads = reads
        self._cluster = cluster

    def _edge(self) -> EdgeCluster:
        return self._reads.ports.edges.for_cluster(self._cluster)

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef:
        raise _refuse("submitting a Job")

    def delete_job(self, name: str, kind: str = JOB_KIND) -> None:
        raise _refuse("deleting a Job")

    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None:
        return self._reads.ask(self._cluster, ("job", name, kind),
                               lambda: self._edge().get_job(name, kind))

    def node_counts(self, pool_name: str) -> NodeCounts:
        return self._reads.ask(self._cluster, ("nodes", pool_name),
                               lambda: self._edge().node_counts(pool_name))

    def diagnose_pending(self, job_name: str) -> str | None:
        return self._reads.ask(self._cluster, ("diagnosis", job_name),
                               lambda: self._edge().diagnose_pending(job_name))


class _ObservedEdges:
    def __init__(self, reads: ObservedReads) -> None:
        self._reads = reads

    def for_cluster(self, cluster: Cluster) -> EdgeCluster:
        return _ObservedEdge(self._reads, cluster)


def observed_ports(reads: ObservedReads) -> Ports:
    """The ports as the handlers see them: reads answered by ``reads``; the bus and the
    clock as they are."""
    if reads.calls.inline:
        return reads.ports
    return dataclasses.replace(reads.ports, node_pools=_ObservedPools(reads),
                               reservations=_ObservedReservations(reads),
                               edges=_ObservedEdges(reads))
