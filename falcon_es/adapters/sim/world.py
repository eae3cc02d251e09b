"""The simulated world: GKE, Compute, Kubernetes and Pub/Sub of every cluster, moved
only by an injected clock.

Nothing here reads the wall clock or the global random module. The world changes at
the moments on its timeline; ``step(now)`` plays everything due up to ``now`` (every
port call first catches up with the clock), and ``next_due()`` says when the next
change will happen so a controller on a virtual clock can jump there when idle. With
the same seed, configuration and sequence of calls, two worlds answer identically.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from falcon_es.domain.clock import Clock
from falcon_es.domain.ports import JobObservation, Ports
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.task_states import TaskStates
from falcon_es.domain.tpu import TPU_TYPES

from falcon_es.adapters.sim.bus import SimBus
from falcon_es.adapters.sim.common import ClusterIdentity, random_streams
from falcon_es.adapters.sim.compute import ReservationUsage, SimReservations
from falcon_es.adapters.sim.config import SimClusterConfig, SimConfig
from falcon_es.adapters.sim.gke import NodePoolService, PoolSnapshot, SimNode, SimPool
from falcon_es.adapters.sim.pool_port import SimNodePools
from falcon_es.adapters.sim.informer import Informer
from falcon_es.adapters.sim.kube import SimEdgeClusters
from falcon_es.adapters.sim.kube_api import KubeService
from falcon_es.adapters.sim.kube_manifests import BehaviourSource
from falcon_es.adapters.sim.kube_objects import SimService
from falcon_es.adapters.sim.timeline import Timeline

T = TypeVar("T")
log = logging.getLogger("falcon_es.adapters.sim")
#: The identity of a cluster addressed by name only (a test's or a fake's world, with
#: no registry to read), where its config entry gives none.
UNREGISTERED_PROJECT, UNREGISTERED_LOCATION = "falcon-sim", "us-central1-a"


def behaviour_from_tasks(tasks: TaskStates) -> BehaviourSource:
    """The ``behaviour_source`` the composition root wires: what a task's ``spec.sim``
    says, as intake accepted it; the config's ``jobs`` defaults fill in the rest."""

    def lookup(task_id: str) -> Mapping[str, Any] | None:
        state = tasks.get(task_id)
        sim = state.submission.spec.sim if state is not None else None
        return sim.said() if sim is not None else None

    return lookup


class ClusterSim:
    """One cluster: its node pools (GKE side) and its Kubernetes API, wired together."""

    def __init__(self, identity: ClusterIdentity, world: SimWorld) -> None:
        streams = random_streams(world.seed, identity.name)
        self.identity = identity
        self.informer = Informer(world.bus, world.config.delivery, streams["delivery"],
                                 world.timeline)
        self.gke = NodePoolService(identity, world.timeline, streams["gke"], self._nodes_changed)
        self.kube = KubeService(identity, self.gke, world.timeline, streams["kube"],
                                self.informer, world.current_behaviour_source)

    def _nodes_changed(self, pool: SimPool, moment: dt.datetime, lost: list[SimNode]) -> None:
        self.kube.nodes_changed(pool, moment, lost)


class CreateRecord:
    """Every create the world accepted, "cluster/kind/name" -> how many times: a name
    created twice is a pool or Job made again (after a restart, say). An object of its
    own so a saved world rewrites it only when something is created."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()


class SimWorld:
    """``behaviour_source(task_id)`` returns the task's ``spec.sim`` (a mapping or a
    ``SimBehaviour``) for Jobs whose manifest carries no ``falcon-es/sim`` annotation;
    the composition root wires it to the task states so handlers stay unaware."""

    def __init__(self, clock: Clock, config: SimConfig | None = None, *, seed: int | None = None,
                 behaviour_source: BehaviourSource | None = None,
                 registry: Callable[[], Sequence[Cluster]] | None = None) -> None:
        """``registry`` lists the registered clusters (the controller's cluster cache):
        a cluster named by a string (reports, tests) is simulated as registered there."""
        self.clock = clock
        self.config = config or SimConfig()
        self.seed = self.config.seed if seed is None else seed
        self.behaviour_source = behaviour_source
        self.registry = registry
        self.timeline = Timeline()
        self.bus = SimBus(clock, self.config.bus, before_read=self.sync)
        self._clusters: dict[str, ClusterSim] = {}
        self._processed_until = clock.now()
        self._stepping = False
        self.creates = CreateRecord()

    def current_behaviour_source(self) -> BehaviourSource | None:
        """The task states' behaviours as wired now (each leadership term rewires them)."""
        return self.behaviour_source

    def record_create(self, cluster: str, kind: str, name: str) -> None:
        self.creates.counts[f"{cluster}/{kind}/{name}"] += 1

    # ------------------------------------------------------------- time

    def now(self) -> dt.datetime:
        return max(self.clock.now(), self._processed_until)

    def step(self, now: dt.datetime | None = None) -> int:
        """Play every change due up to ``now`` (default: the clock); returns how many."""
        if self._stepping:
            return 0
        until = self.clock.now() if now is None else now
        played = 0
        self._stepping = True
        try:
            while (moment := self.timeline.play_due(until)) is not None:
                played += 1
                following = self.timeline.next_moment()
                if following is None or following > moment:
                    self._flush(moment)
        finally:
            self._stepping = False
        if until > self._processed_until:
            self._processed_until = until
        return played

    def sync(self) -> dt.datetime:
        self.step()
        return self.now()

    def next_due(self) -> dt.datetime | None:
        """The next moment anything in the world changes by itself; None: nothing will."""
        now = self.sync()
        moments = [m for m in (self.timeline.next_moment(), self.bus.next_due(now)) if m is not None]
        return min(moments) if moments else None

    def advance(self, seconds: float) -> None:
        """Move a virtual clock forward and play what became due (tests, demos)."""
        advance = getattr(self.clock, "advance", None)
        if advance is None:
            raise TypeError(f"{type(self.clock).__name__} cannot be advanced; use a VirtualClock")
        advance(seconds)
        self.step()

    def advance_to_next_due(self) -> dt.datetime | None:
        """Jump a virtual clock to the next change and play it; None when nothing is due."""
        moment = self.next_due()
        if moment is None:
            return None
        advance_to = getattr(self.clock, "advance_to", None)
        if advance_to is None:
            raise TypeError(f"{type(self.clock).__name__} cannot jump; use a VirtualClock")
        advance_to(moment)
        self.step()
        return moment

    def call(self, action: Callable[[dt.datetime], T]) -> T:
        """Run one API call at the clock's moment, then publish what it changed."""
        now = self.sync()
        try:
            return action(now)
        finally:
            self._flush(now)

    # --------------------------------------------------------- clusters

    def cluster(self, cluster: Cluster | str) -> ClusterSim:
        """The cluster's simulation, made on first use: a ``Cluster`` is the registry's
        row; a name is looked up in the registry (when the world has one), else the
        config's entry gives the identity."""
        name = cluster if isinstance(cluster, str) else cluster.name
        sim = self._clusters.get(name)
        if sim is None:
            registered = self._registered(name) if isinstance(cluster, str) else cluster
            sim = self._clusters[name] = ClusterSim(self._identity(name, registered), self)
        return sim

    def simulated(self) -> list[str]:
        """The clusters simulated so far (each since its first call), by name."""
        return sorted(self._clusters)

    def _registered(self, name: str) -> Cluster | None:
        if self.registry is None:
            return None
        return next((c for c in self.registry() if c.name == name), None)

    def _identity(self, name: str, registered: Cluster | None) -> ClusterIdentity:
        entry = self.config.cluster(name)
        config = entry or SimClusterConfig(name=name, behaviour=self.config.defaults)
        if registered is None:
            config = dataclasses.replace(
                config, project=config.project or UNREGISTERED_PROJECT,
                location=config.location or UNREGISTERED_LOCATION,
                tpu_types=config.tpu_types or tuple(TPU_TYPES))
        else:
            for field, said, has in _disagreements(entry, registered):
                log.warning("sim config %s: clusters.%s.%s is %r but the registry has %r; "
                            "simulating the registered cluster (a config's %s only says what "
                            "demo, simulate and bench register)", self.config.source, name,
                            field, said, has, field, extra={"cluster": name})
            config = dataclasses.replace(
                config, project=registered.project, location=registered.location,
                node_location=registered.node_zone,
                tpu_types=(registered.tpu_type,), gcs_bucket=registered.gcs_bucket,
                default_reservation=registered.default_reservation)
        config = dataclasses.replace(
            config, reservations=config.with_default_reservation(config.default_reservation))
        if registered is not None:
            log.info("simulating cluster %s (%s, %s, %s%s) with %s", name, config.project,
                     config.location, config.tpu_type,
                     f", reservation {config.default_reservation}"
                     if config.default_reservation else "",
                     f"its entry in {self.config.source}" if entry else
                     f"the defaults of {self.config.source}", extra={"cluster": name})
        location = config.location or UNREGISTERED_LOCATION
        zones = config.cluster_zones(location)
        return ClusterIdentity(
            name=name, project=config.project or UNREGISTERED_PROJECT,
            location=location, tpu_types=config.tpu_types,
            config=config, behaviour=config.behaviour, jobs=self.config.jobs,
            zones=zones, node_zone=config.node_zone(location))

    def ports(self) -> Ports:
        """The ports over this world: each adapter gets ``call`` and the lookup of the
        cluster's side it serves, nothing else of the world."""

        def pools_of(cluster: Cluster) -> NodePoolService:
            return self.cluster(cluster).gke

        def kube_of(cluster: Cluster) -> KubeService:
            return self.cluster(cluster).kube

        return Ports(node_pools=SimNodePools(self.call, pools_of, self.record_create),
                     reservations=SimReservations(self.call, pools_of),
                     edges=SimEdgeClusters(self.call, kube_of, self.record_create),
                     bus=self.bus, clock=self.clock,
                     next_due=self.next_due)

    # -------------------------------------------------- what tests and reports read

    def pool(self, cluster: str, name: str) -> PoolSnapshot | None:
        """A pool as the world knows it, whether or not GKE would show it yet."""
        sim = self._clusters.get(cluster)
        pool = sim.gke.pools.get(name) if sim else None
        return sim.gke.snapshot(pool) if sim and pool else None

    def pools(self, cluster: str | None = None, *, include_deleted: bool = False) -> list[PoolSnapshot]:
        out: list[PoolSnapshot] = []
        for name, sim in sorted(self._clusters.items()):
            if cluster is not None and name != cluster:
                continue
            out.extend(sim.gke.snapshot(p) for _, p in sorted(sim.gke.pools.items()))
            if include_deleted:
                out.extend(sim.gke.deleted)
        return out

    def pool_hours(self) -> dict[str, float]:
        """Node-pool hours by supply mode, from create to delete (or now)."""
        now = self.now()
        hours: dict[str, float] = {}
        for pool in self.pools(include_deleted=True):
            end = pool.deleted_at or now
            hours[pool.supply_mode] = (hours.get(pool.supply_mode, 0.0)
                                       + (end - pool.created_at).total_seconds() / 3600)
        return hours

    def reservation_usage(self, cluster: str, reservation: str) -> ReservationUsage | None:
        sim = self.cluster(cluster)
        config = sim.identity.config.reservation(reservation)
        if config is None:
            return None
        return ReservationUsage(config.name, config.count, config.in_use,
                                sim.gke.reservation_hosts_in_use(config.name), config.machine_type)

    def job_state(self, cluster: str, job_name: str) -> JobObservation | None:
        """The Job as the API server holds it now (not what the bus has delivered)."""
        sim = self._clusters.get(cluster)
        job = sim.kube.jobs.get(job_name) if sim else None
        if sim is None or job is None:
            return None
        return sim.kube.observe(job, self.now())

    def service(self, cluster: str, name: str) -> SimService | None:
        """A Service as the cluster's API server holds it now."""
        sim = self._clusters.get(cluster)
        return sim.kube.services.get(name) if sim else None

    def delivery_stats(self) -> dict[str, int]:
        """What the informers published, and how many of those they duplicated or
        delivered out of order (late deliveries are not counted apart)."""
        totals = {"delivered": 0, "duplicated": 0, "reordered": 0}
        for sim in self._clusters.values():
            totals["delivered"] += sim.informer.delivered
            totals["duplicated"] += sim.informer.duplicated
            totals["reordered"] += sim.informer.reordered
        return totals

    def _flush(self, moment: dt.datetime) -> None:
        for sim in self._clusters.values():
            sim.kube.flush(moment)


def _disagreements(entry: SimClusterConfig | None,
                   registered: Cluster) -> Iterator[tuple[str, object, object]]:
    """(field, the config's value, the registry's) where a config entry names another
    identity than the registered cluster's."""
    if entry is None:
        return
    pairs: tuple[tuple[str, object, object], ...] = (
        ("project", entry.project, registered.project),
        ("location", entry.location, registered.location),
        ("node_location", entry.node_location, registered.node_zone),
        ("tpu_type", None if not entry.tpu_types or registered.tpu_type in entry.tpu_types
         else entry.tpu_type, registered.tpu_type),
        ("gcs_bucket", entry.gcs_bucket, registered.gcs_bucket),
        ("default_reservation", entry.default_reservation, registered.default_reservation),
    )
    for field, said, has in pairs:
        if said is not None and said != has:
            yield field, said, has
