"""The cluster registry as the controller reads it every tick, without a query per tick.

The registry changes rarely (an operator adds a cluster or sets its status) while the
controller ticks many times a second, so the rows are kept in memory and read again
when a change commits through this process's store (this cache is one of its inline
projections and watches for ``ClusterRegistered`` / ``ClusterStatusChanged`` /
``ClusterNodeLocationSet``), and at
least every ``max_age_seconds`` of wall time, for changes another process commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import db
from falcon_es.domain import events as ev
from falcon_es.domain.clusters import Cluster
from falcon_es.storage.registry import list_clusters
from falcon_es.storage.store import RecordedEvent

#: Wall seconds after which the rows are read again even if no change was seen here.
MAX_AGE_SECONDS = 2.0
_REGISTRY_EVENTS = (ev.ClusterRegistered, ev.ClusterStatusChanged, ev.ClusterNodeLocationSet)


class ClusterCache:
    def __init__(self, engine: Engine, *, max_age_seconds: float = MAX_AGE_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.reader = db.read_only(engine)
        self.max_age_seconds = max_age_seconds
        self._monotonic = monotonic
        self._clusters: tuple[Cluster, ...] | None = None
        self._read_at = 0.0
        self._changing = False

    def clusters(self) -> list[Cluster]:
        """Every registered cluster, ordered by name (as ``registry.list_clusters``)."""
        now = self._monotonic()
        if self._clusters is None or now - self._read_at >= self.max_age_seconds:
            with self.reader.connect() as conn:
                self._clusters = tuple(list_clusters(conn))
            self._read_at = now
        return list(self._clusters)

    def invalidate(self) -> None:
        self._clusters = None

    # ------------------------------------------------------- inline projection
    def apply(self, conn: Connection, recorded: Sequence[RecordedEvent]) -> None:
        if not self._changing:
            self._changing = any(isinstance(r.event, _REGISTRY_EVENTS) for r in recorded)

    def committed(self) -> None:
        if self._changing:
            self._changing = False
            self._clusters = None

    def discarded(self) -> None:
        self._changing = False
