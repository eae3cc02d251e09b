"""Calls on behalf of one cluster, kept off the tick's thread and out of each other's way.

Every call the controller makes to an edge cluster's Kubernetes API, or to a Google API
on behalf of one cluster (its node pools, its reservation), runs on that cluster's own
worker threads (``ClusterCalls``): at most ``calls.per_cluster`` at once, so a cluster
whose API hangs holds only its own workers, and the tick never waits for any of them.
Why threads and not asyncio: docs/design-notes/cluster-isolation.md.

``ApiHealth`` remembers, per cluster and API, when it last answered and since when it
has not (a call that got no answer at all: no connection, nothing within its deadline).
``health_recorded`` wraps the ports so that every call, the executor's and the reads',
is recorded there; the tasks' Messages, ``/healthz`` and the metrics read it.

``ClusterCalls(inline=True)`` runs each call at once on the caller's thread: the sim
backend's ports are in-process and quick, and its runs on a virtual clock must stay
deterministic, so there is nothing to isolate there.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from falcon_es.config.retry import COMPUTE, GKE, KUBERNETES
from falcon_es.domain.clock import Clock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import Ports, PortError

log = logging.getLogger("falcon_es.engine.cluster_calls")


@dataclasses.dataclass(frozen=True)
class Unanswered:
    """One cluster's API that has not answered since ``since`` (``error``: the last
    call's words)."""

    cluster_id: str
    cluster: str
    api: str
    since: dt.datetime
    error: str


@dataclasses.dataclass
class _ApiState:
    cluster: str
    last_answer: dt.datetime | None = None
    unanswered: Unanswered | None = None


class ApiHealth:
    """Per (cluster id, API): the last answer and the unanswered spell, if one runs.

    Written by the worker threads, read by the tick, the health server and the metrics:
    every access holds the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apis: dict[tuple[str, str], _ApiState] = {}
        #: Some API failed to answer in this process (until then nobody need look).
        self.ever_unanswered = False

    def answered(self, cluster: Cluster, api: str, at: dt.datetime) -> None:
        with self._lock:
            state = self._apis.setdefault((cluster.id, api), _ApiState(cluster.name))
            state.last_answer = at
            if state.unanswered is not None:
                log.warning("%s's %s API answers again (it had not since %s)", cluster.name,
                            api, state.unanswered.since.isoformat())
            state.unanswered = None

    def not_answered(self, cluster: Cluster, api: str, asked_at: dt.datetime,
                     error: str) -> None:
        """A call asked at ``asked_at`` got no answer: the spell starts then, unless
        one already runs (its start stays, its words become the latest)."""
        with self._lock:
            state = self._apis.setdefault((cluster.id, api), _ApiState(cluster.name))
            since = state.unanswered.since if state.unanswered is not None else asked_at
            if state.unanswered is None:
                log.error("%s's %s API does not answer: %s", cluster.name, api, error)
            state.unanswered = Unanswered(cluster.id, cluster.name, api, since, error)
            self.ever_unanswered = True

    def unanswered(self, cluster_id: str | None = None) -> list[Unanswered]:
        """Every API not answering now (of one cluster, when ``cluster_id`` is given)."""
        with self._lock:
            spells = [s.unanswered for (cid, _), s in self._apis.items()
                      if s.unanswered is not None and cluster_id in (None, cid)]
        return sorted(spells, key=lambda u: (u.cluster, u.api))

    def last_answers(self) -> dict[tuple[str, str], dt.datetime]:
        """(cluster name, API) -> when it last answered."""
        with self._lock:
            return {(s.cluster, api): s.last_answer for (_, api), s in self._apis.items()
                    if s.last_answer is not None}


class ClusterCalls:
    """Each cluster's worker threads (``per_cluster`` of them), started on first use.

    ``submit`` queues a call on its cluster's workers and returns at once; ``landed``
    is set whenever a call has finished, so a waiting loop can tick again. With
    ``inline`` the call runs on the caller's thread before ``submit`` returns.
    """

    def __init__(self, *, per_cluster: int, inline: bool = False) -> None:
        self.per_cluster = per_cluster
        self.inline = inline
        self.landed = threading.Event()
        self._lock = threading.Lock()
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._running: dict[str, int] = {}
        self._closed = False

    def submit(self, cluster: Cluster, call: Callable[[], None]) -> None:
        if self.inline:
            call()
            return
        with self._lock:
            if self._closed:
                return  # the service is closing: nothing new is started
            pool = self._pools.get(cluster.id)
            if pool is None:
                pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.per_cluster, thread_name_prefix=f"calls-{cluster.name}")
                self._pools[cluster.id] = pool
            self._running[cluster.id] = self._running.get(cluster.id, 0) + 1
        pool.submit(self._run, cluster.id, call)

    def _run(self, cluster_id: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # a bug must not kill the worker silently
            log.exception("a call on behalf of cluster %s failed unexpectedly", cluster_id)
        finally:
            with self._lock:
                self._running[cluster_id] -= 1
            self.landed.set()

    def queued(self, cluster_id: str) -> int:
        """Calls of this cluster submitted and not finished (running or waiting)."""
        with self._lock:
            return self._running.get(cluster_id, 0)

    def close(self) -> None:
        """Stop taking calls; calls running go on to their deadlines, unwaited for."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)


class _Recorded:
    """Forwards to ``inner``; each call of the named methods is recorded in ``health``
    against the cluster ``cluster_of`` finds in its arguments."""

    def __init__(self, inner: Any, api: str, methods: frozenset[str], health: ApiHealth,
                 clock: Clock, cluster_of: Callable[[tuple[Any, ...]], Cluster]) -> None:
        self._inner, self._api, self._methods = inner, api, methods
        self._health, self._clock, self._cluster_of = health, clock, cluster_of

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in self._methods:
            return attribute

        def recorded(*args: Any, **kwargs: Any) -> Any:
            cluster = self._cluster_of(args)
            asked_at = self._clock.now()
            try:
                result = attribute(*args, **kwargs)
            except PortError as error:
                if error.unanswered:
                    self._health.not_answered(cluster, self._api, asked_at, error.message)
                else:
                    self._health.answered(cluster, self._api, self._clock.now())
                raise
            self._health.answered(cluster, self._api, self._clock.now())
            return result

        return recorded


class _RecordedEdges:
    def __init__(self, inner: Any, health: ApiHealth, clock: Clock) -> None:
        self._inner, self._health, self._clock = inner, health, clock

    def for_cluster(self, cluster: Cluster) -> Any:
        return _Recorded(self._inner.for_cluster(cluster), KUBERNETES, _EDGE_CALLS,
                         self._health, self._clock, lambda args: cluster)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_POOL_CALLS = frozenset({"create", "get_operation", "get", "delete", "list"})
_EDGE_CALLS = frozenset({"submit_job", "get_job", "delete_job", "node_counts",
                         "diagnose_pending"})


def _first_cluster(args: tuple[Any, ...]) -> Cluster:
    first = args[0]
    return first if isinstance(first, Cluster) else first.cluster  # a NodePoolSpec


def health_recorded(ports: Ports, health: ApiHealth) -> Ports:
    """The same ports, every call on behalf of a cluster recorded in ``health``."""
    return dataclasses.replace(
        ports,
        node_pools=_Recorded(ports.node_pools, GKE, _POOL_CALLS, health, ports.clock,
                             _first_cluster),
        reservations=_Recorded(ports.reservations, COMPUTE, frozenset({"remaining_slices"}),
                               health, ports.clock, _first_cluster),
        edges=_RecordedEdges(ports.edges, health, ports.clock),
    )
