"""Simulated GKE node pools of one cluster: operations, latency, quota, stockouts.

A create returns a long-running operation at once; the pool is PROVISIONING (and
invisible to get/list for the create-visibility window), then RUNNING when the operation
ends. A fixed-size pool (reservation, on-demand) brings its nodes then, after a delay --
or, in a stockout, not for a while or never. An autoscaled pool (flex-start: autoscaling
0..N, 0 initial nodes) gets nodes only as the cluster autoscaler does: for Pending pods
that need them (``scale_up``, asked by the Kubernetes side), answering with its pod
events (TriggeredScaleUp, or FailedScaleUp in the stockout's or the quota's words, then
NotTriggerScaleUp while it backs off), and removes them once unneeded for the pool's
scale-down-unneeded time; its nodes are deleted at their max run duration. TPU quota
bites when VMs are made: at a fixed-size pool's create (its operation fails), at an
autoscaled pool's scale-up unless the config says at create (``QuotaConfig.autoscaled_at``).
Multi-host slices are atomic: all nodes arrive together, and a repair recreates them all.
A pool's zones are the spec's ``locations``, or, when it names none, every zone of the
cluster, as GKE does: a node group per zone, so a regional cluster's pool has three
times the nodes, and COMPACT placement (which wants one zone) is refused. Reservations
are zonal: a pool can consume one only in the reservation's zone. A failed create
leaves the pool in ERROR, as GKE does, until someone deletes it. Pools made from a
SPECIFIC reservation hold their VMs of it from create until deleted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from falcon_es.domain.ports import (
    ALREADY_EXISTS, INVALID, NOT_FOUND, QUOTA_EXCEEDED, RETRYABLE, STOCKOUT, NodePoolInfo,
    NodePoolSpec, Operation, PortError,
)
from falcon_es.domain.clusters import region_of
from falcon_es.domain.spec import SUPPLY_MODES
from falcon_es.domain.tpu import TPU_TYPES, SliceShape

from falcon_es.adapters.sim.common import (
    OPERATION_DONE, OPERATION_RUNNING, POOL_NAME, ClusterIdentity, label_problem,
    seconds_after, suffix, zone_problem,
)
from falcon_es.adapters.sim.config import (
    FLEX_START, QUOTA_AT_CREATE, RESERVATION, ReservationConfig,
)
from falcon_es.adapters.sim.timeline import Timeline

PROVISIONING, RUNNING, STOPPING, ERROR = "PROVISIONING", "RUNNING", "STOPPING", "ERROR"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
TRIGGERED_SCALE_UP, FAILED_SCALE_UP = "TriggeredScaleUp", "FailedScaleUp"
NOT_TRIGGER_SCALE_UP = "NotTriggerScaleUp"
#: The autoscaler's NotTriggerScaleUp while it backs off after a failed scale-up
#: (kubernetes/autoscaler ``core/scaleup/orchestrator/skippedreasons.go``).
BACKOFF_NOTE = "pod didn't trigger scale-up: 1 in backoff after failed scale-up"
#: The autoscaler's GKE provider's failure words for a MIG resize refused for quota.
GCE_QUOTA_EXCEEDED = "GCE quota exceeded"
FLEX_START_END = "reached the end of its flex-start max run duration"
RESERVATION_END = "reached the end of calendar-mode reservation {reservation}"


@dataclasses.dataclass
class SimNode:
    name: str
    ready: bool = False
    #: Why its VM was deleted under it: its flex-start run or its reservation ended.
    end: str | None = None
    pod: str | None = None  # "<job>/<pod>" bound to it; a TPU pod takes the whole VM
    shared: bool = False  # a CPU system node: pods without TPUs share it


@dataclasses.dataclass
class SimOperation:
    id: str
    kind: str  # CREATE_NODE_POOL | DELETE_NODE_POOL
    pool: str
    started_at: dt.datetime
    done: bool = False
    error: str | None = None
    error_code: str | None = None

    def view(self) -> Operation:
        return Operation(self.id, self.done, self.error, self.error_code,
                         status=OPERATION_DONE if self.done else OPERATION_RUNNING)


@dataclasses.dataclass
class SimPool:
    name: str
    supply_mode: str
    reservation: str | None
    shape: SliceShape
    labels: Mapping[str, str]
    scale_down_unneeded_seconds: int
    created_at: dt.datetime
    visible_at: dt.datetime
    create_operation: str
    status: str = PROVISIONING
    status_message: str = ""
    delete_operation: str | None = None
    running_at: dt.datetime | None = None
    deleted_at: dt.datetime | None = None
    holds_reservation: bool = False
    #: The zones it has a node group in (``NodePool.locations``), each ``hosts`` nodes.
    zones: tuple[str, ...] = ()
    stocked_out: bool = False
    stockout_ends_at: dt.datetime | None = None  # None while stocked out: for good
    nodes: list[SimNode] = dataclasses.field(default_factory=list)
    #: The cluster autoscaler's latest event about this pool on the pods waiting for
    #: it: (reason, message), e.g. ("FailedScaleUp", "... GCE out of resources ...").
    autoscaler_event: tuple[str, str] | None = None
    #: How many times in a row the autoscaler said it (a repeated event's count).
    autoscaler_event_count: int = 0
    #: Its last FailedScaleUp (the cause) while it backs off after it: the newest
    #: event is then the backoff note, which says no cause of its own.
    failed_scale_up: tuple[str, str] | None = None
    #: The Job whose pending pods a scale-up in flight is for (exclusive per pool).
    scaling_for: str | None = None
    #: Since when no pod has used the pool's nodes (None: in use, or no nodes).
    unneeded_since: dt.datetime | None = None
    #: An autoscaled pool the quota rule refused: each scale-up fails for quota.
    quota_refused: bool = False
    _node_labels: Mapping[str, str] | None = None

    @property
    def autoscaled(self) -> bool:
        """Flex-start pools are created with autoscaling 0..N and no initial nodes."""
        return self.supply_mode == FLEX_START

    @property
    def registered(self) -> int:
        return len(self.nodes)

    @property
    def node_count(self) -> int:
        """Nodes it is sized for: ``hosts`` per zone (a pool saved before zones were
        kept has one zone)."""
        return self.shape.hosts * max(1, len(self.zones))

    @property
    def zone_words(self) -> str:
        return ",".join(self.zones)

    @property
    def ready(self) -> int:
        return sum(1 for node in self.nodes if node.ready)

    def node_labels(self) -> Mapping[str, str]:
        """What GKE puts on the pool's nodes, plus the pool's own node labels."""
        if self._node_labels is not None:
            return self._node_labels
        labels = {
            "cloud.google.com/gke-nodepool": self.name,
            "cloud.google.com/gke-tpu-accelerator": TPU_TYPES[self.shape.tpu_type].accelerator,
            "cloud.google.com/gke-tpu-topology": self.shape.topology,
            "node.kubernetes.io/instance-type": self.shape.machine_type,
            "cloud.google.com/gke-provisioning": (
                "flex-start" if self.supply_mode == FLEX_START else "standard"),
        }
        if self.supply_mode == FLEX_START:
            labels["cloud.google.com/gke-flex-start"] = "true"
        if self.reservation:
            labels["cloud.google.com/reservation-name"] = self.reservation
        labels.update(self.labels)
        self._node_labels = MappingProxyType(labels)
        return self._node_labels


@dataclasses.dataclass(frozen=True)
class PoolSnapshot:
    """A read-only picture of one pool (live or deleted), for tests and reports."""

    cluster: str
    name: str
    status: str  # PROVISIONING | RUNNING | STOPPING | ERROR | DELETED
    supply_mode: str
    reservation: str | None
    topology: str
    machine_type: str
    hosts: int
    chips: int
    labels: Mapping[str, str]
    scale_down_unneeded_seconds: int
    created_at: dt.datetime
    visible_at: dt.datetime
    running_at: dt.datetime | None
    deleted_at: dt.datetime | None
    registered: int
    ready: int
    stocked_out: bool
    create_operation: str
    delete_operation: str | None
    status_message: str
    zones: tuple[str, ...] = ()


NodesChanged = Callable[[SimPool, dt.datetime, list[SimNode]], None]


class NodePoolService:
    """The GKE node-pool API of one cluster. ``on_nodes_changed(pool, moment, lost)``
    tells the Kubernetes side that nodes came, became ready, or went away."""

    def __init__(self, identity: ClusterIdentity, timeline: Timeline, rng: random.Random,
                 on_nodes_changed: NodesChanged) -> None:
        self.identity = identity
        self.behaviour = identity.behaviour
        self._timeline = timeline
        self._rng = rng
        self._on_nodes_changed = on_nodes_changed
        self.pools: dict[str, SimPool] = {}
        self.deleted: list[PoolSnapshot] = []
        self._operations: dict[str, SimOperation] = {}
        #: Registered TPU nodes across the cluster's pools (the scheduler's node count).
        self.registered_nodes = 0
        self._quota_index = 0
        self._stockout_index = 0
        self._delete_index = 0
        self._create_index = 0

    # ----------------------------------------------------------------- API

    def create(self, spec: NodePoolSpec, now: dt.datetime) -> Operation:
        zones = spec.locations or self.identity.zones
        self._validate(spec, zones, now)
        existing = self.pools.get(spec.name)
        if existing is not None:
            if existing.status == STOPPING:
                raise PortError(RETRYABLE, self._busy_words(existing.delete_operation or "",
                                                            "deleting", existing.name))
            raise PortError(ALREADY_EXISTS, f"Already exists: {self.identity.pool_path(spec.name)}.")
        self._check_throttled()
        self._check_concurrency()
        rng, behaviour, mode = self._rng, self.behaviour, spec.supply_mode
        latency = behaviour.create_latency[mode].draw(rng)
        visible_after = behaviour.visibility_delay[mode].draw(rng)
        failure_after = behaviour.quota.failure_after.draw(rng)
        quota_hit = False
        if mode in behaviour.quota.supply_modes:
            quota_hit = behaviour.quota.rule.hits(self._quota_index, rng)
            self._quota_index += 1
        stocked, stockout_seconds = False, None
        if mode in behaviour.stockout.supply_modes:
            stocked = behaviour.stockout.rule.hits(self._stockout_index, rng)
            self._stockout_index += 1
            if stocked and behaviour.stockout.duration is not None:
                stockout_seconds = behaviour.stockout.duration.draw(rng)
        operation = self._operation("CREATE_NODE_POOL", spec.name, now)
        reservation = spec.reservation.rsplit("/", 1)[-1] if spec.reservation else None
        pool = SimPool(
            name=spec.name, supply_mode=mode, reservation=reservation if mode == RESERVATION else None,
            shape=spec.shape, labels=MappingProxyType(dict(spec.labels)),
            scale_down_unneeded_seconds=spec.scale_down_unneeded_seconds, created_at=now,
            visible_at=seconds_after(now, visible_after), create_operation=operation.id,
            zones=tuple(zones),
        )
        if not self._quota_at_create(pool):
            pool.quota_refused, quota_hit = quota_hit, False
        failure = self._create_failure(pool, quota_hit)
        self.pools[pool.name] = pool
        if failure is not None:
            code, words = failure
            self._timeline.at(seconds_after(now, min(failure_after, latency)),
                              self._fail_create, pool, operation, code, words)
        else:
            pool.holds_reservation = pool.reservation is not None
            self._timeline.at(seconds_after(now, latency),
                              self._finish_create, pool, operation, stocked, stockout_seconds)
        return operation.view()

    def get_operation(self, operation_id: str) -> Operation:
        operation = self._operations.get(operation_id)
        if operation is None:
            raise PortError(NOT_FOUND, f"Not found: projects/{self.identity.project}/locations/"
                                       f"{self.identity.location}/operations/{operation_id}.")
        return operation.view()

    def get(self, name: str, now: dt.datetime) -> NodePoolInfo:
        pool = self.pools.get(name)
        if pool is None or now < pool.visible_at:
            raise PortError(NOT_FOUND, f"Not found: {self.identity.pool_path(name)}.")
        return self._info(pool)

    def list(self, now: dt.datetime) -> list[NodePoolInfo]:
        return [self._info(p) for name, p in sorted(self.pools.items()) if now >= p.visible_at]

    def delete(self, name: str, now: dt.datetime) -> Operation | None:
        pool = self.pools.get(name)
        if pool is None:
            return None
        if pool.status == STOPPING and pool.delete_operation:
            return self._operations[pool.delete_operation].view()
        if pool.status == PROVISIONING:
            raise PortError(RETRYABLE, self._busy_words(pool.create_operation, "creating", name))
        injected = self.behaviour.delete_failures.hits(self._delete_index, self._rng)
        self._delete_index += 1
        if injected:
            raise PortError(RETRYABLE, self._injected_delete_words(name, now))
        self._check_concurrency()
        operation = self._operation("DELETE_NODE_POOL", name, now)
        pool.status, pool.delete_operation = STOPPING, operation.id
        lost, pool.nodes = pool.nodes, []
        self.registered_nodes -= len(lost)
        if lost:
            self._on_nodes_changed(pool, now, lost)
        self._quota_freed(now)
        latency = self.behaviour.delete_latency.draw(self._rng)
        self._timeline.at(seconds_after(now, latency),
                          self._finish_delete, pool, operation)
        return operation.view()

    # ------------------------------------------------------------ accounting

    def reservation_hosts_in_use(self, reservation: str) -> int:
        """VMs of the reservation held by this cluster's live pools."""
        return sum(p.shape.hosts for p in self.pools.values()
                   if p.holds_reservation and p.reservation == reservation)

    def reservation_free_hosts(self, reservation: ReservationConfig, shape: SliceShape) -> int:
        """VMs of the reservation this shape could still use (0 for another machine type),
        as GCE allocates them: a pool being created holds its VMs from the create on, so
        a second create that does not fit fails."""
        return _unused(reservation, shape, self.reservation_hosts_in_use(reservation.name))

    def reservation_unused_vms(self, reservation: ReservationConfig, shape: SliceShape) -> int:
        """What Compute reports (``count - inUseCount``): inUseCount counts the VMs that exist,
        not a pool still being created; a reader trusting this alone overcommits it."""
        # A pool being deleted keeps its VMs until the delete is done.
        existing = sum(p.shape.hosts if p.status == STOPPING else p.registered
                       for p in self.pools.values()
                       if p.holds_reservation and p.reservation == reservation.name)
        return _unused(reservation, shape, existing)

    def quota_chips_in_use(self) -> int:
        """TPU chips counted against the quota: a pool checked at create holds them from then
        until its delete starts; an autoscaled one only while it has or adds nodes."""
        modes = self.behaviour.quota.supply_modes
        return sum(p.shape.chips for p in self.pools.values()
                   if p.supply_mode in modes and p.status in (PROVISIONING, RUNNING)
                   and (self._quota_at_create(p) or p.nodes or p.scaling_for is not None))

    def _quota_at_create(self, pool: SimPool) -> bool:
        """Whether GKE checks the pool's TPU quota at its create: a fixed-size pool makes its
        VMs then; an autoscaled one (0 nodes) none, unless the config plays that reading."""
        return not pool.autoscaled or self.behaviour.quota.autoscaled_at == QUOTA_AT_CREATE

    def _over_chip_limit(self, pool: SimPool) -> bool:
        """The pool's slice would take the cluster's chips in use past ``tpu_chip_limit``."""
        limit = self.behaviour.quota.tpu_chip_limit
        return (limit is not None and pool.supply_mode in self.behaviour.quota.supply_modes
                and self.quota_chips_in_use() + pool.shape.chips > limit)

    def snapshot(self, pool: SimPool) -> PoolSnapshot:
        return PoolSnapshot(
            cluster=self.identity.name, name=pool.name,
            status="DELETED" if pool.deleted_at else pool.status,
            supply_mode=pool.supply_mode, reservation=pool.reservation,
            topology=pool.shape.topology, machine_type=pool.shape.machine_type,
            hosts=pool.shape.hosts, chips=pool.shape.chips, labels=pool.labels,
            scale_down_unneeded_seconds=pool.scale_down_unneeded_seconds,
            created_at=pool.created_at, visible_at=pool.visible_at, running_at=pool.running_at,
            deleted_at=pool.deleted_at, registered=pool.registered, ready=pool.ready,
            stocked_out=pool.stocked_out, create_operation=pool.create_operation,
            delete_operation=pool.delete_operation, status_message=pool.status_message,
            zones=pool.zones,
        )

    # -------------------------------------------------------------- internals

    def _validate(self, spec: NodePoolSpec, zones: tuple[str, ...], now: dt.datetime) -> None:
        where = self.identity.pool_path(spec.name)
        if not isinstance(spec.name, str) or not POOL_NAME.match(spec.name):
            raise PortError(INVALID, f"Invalid value for field 'node_pool.name': {spec.name!r}. "
                                     "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?)' "
                                     "(only alphanumerics and '-' allowed, must start with a letter "
                                     "and end with an alphanumeric, and must be no longer than 40 "
                                     "characters).")
        if spec.supply_mode not in SUPPLY_MODES:
            raise PortError(INVALID, f"{where}: unknown supply mode {spec.supply_mode!r}; "
                                     f"expected one of {', '.join(SUPPLY_MODES)}")
        problem = label_problem(spec.labels)
        if problem:
            raise PortError(INVALID, f"Invalid value for field 'node_pool.config.labels': {problem}")
        if spec.shape.tpu_type not in self.identity.tpu_types:
            raise PortError(INVALID, f"Invalid value for field 'node_pool.config.machine_type': "
                                     f"machine type {spec.shape.machine_type} is not available in "
                                     f"zone {','.join(zones)} for cluster "
                                     f"{self.identity.name} (it offers "
                                     f"{', '.join(self.identity.tpu_types) or 'no TPUs'}).")
        if spec.scale_down_unneeded_seconds < 0:
            raise PortError(INVALID, f"{where}: scale-down-unneeded time must not be negative")
        problem = zone_problem(self.identity.location, zones, spec.shape.multi_host)
        if problem:
            raise PortError(INVALID, problem)
        if spec.supply_mode == RESERVATION:
            if not spec.reservation:
                raise PortError(INVALID, "Invalid value for field 'node_pool.config.reservation_"
                                         "affinity': SPECIFIC_RESERVATION requires key "
                                         "compute.googleapis.com/reservation-name and one value.")
            name = spec.reservation.rsplit("/", 1)[-1]
            found = self.identity.config.reservation(name)
            for zone in zones:
                if found is None or self.identity.reservation_zone(found) != zone or found.gone(now):
                    raise PortError(INVALID, f"Reservation "
                                             f"{self.identity.reservation_path(name, zone)} was "
                                             f"not found (reservation {name} not found in "
                                             f"project {self.identity.project} zone {zone}).")

    def _check_throttled(self) -> None:
        """GKE's per-cluster rate limit on node-pool operations (``create_throttled``)."""
        rule = self.behaviour.create_throttled
        if rule.inert:
            return
        hit = rule.hits(self._create_index, self._rng)
        self._create_index += 1
        if hit:
            raise PortError(RETRYABLE, "429 Too Many Requests: Quota exceeded for quota metric "
                                       "'Node pool operations' of service "
                                       "'container.googleapis.com' for consumer 'project_number:"
                                       f"{self.identity.project}'; please try again later.")

    def _check_concurrency(self) -> None:
        limit = self.behaviour.max_concurrent_operations
        if limit is not None and sum(1 for o in self._operations.values() if not o.done) >= limit:
            raise PortError(RETRYABLE, f"Too many operations: cluster {self.identity.name} hits "
                                       f"the concurrent operations quota {limit}, please try "
                                       "again later.")

    def _create_failure(self, pool: SimPool, quota_hit: bool) -> tuple[str, str] | None:
        limit = self.behaviour.quota.tpu_chip_limit
        over_limit = self._quota_at_create(pool) and self._over_chip_limit(pool)
        region = region_of(self.identity.location)
        if quota_hit or over_limit:
            shown = limit if limit is not None else self.quota_chips_in_use()
            return QUOTA_EXCEEDED, (
                "Insufficient quota to satisfy the request: Not all instances running in IGM "
                f"after 1m0s. Expected {pool.node_count}, running 0, transitioning "
                f"{pool.node_count}. Current errors: [QUOTA_EXCEEDED]: Instance "
                f"'gke-{self.identity.name[:12]}-{pool.name[:20]}-{suffix(self._rng, 4)}' "
                "creation failed: Quota 'TPUS_PER_TPU_FAMILY' exceeded. "
                f"Limit: {float(shown)} in region {region}."
            )
        if pool.reservation is not None:
            reservation = self.identity.config.reservation(pool.reservation)
            if reservation is not None:
                free = self.reservation_free_hosts(reservation, pool.shape)
                if free < pool.shape.hosts:
                    return STOCKOUT, self._reservation_words(reservation, pool, free)
        return None

    def _reservation_words(self, reservation: ReservationConfig, pool: SimPool, free: int) -> str:
        return (f"Instance 'gke-{self.identity.name[:12]}-{pool.name[:20]}-{suffix(self._rng, 4)}' "
                f"creation failed: Specified reservation '{reservation.name}' does not have "
                f"available resources for the request ({pool.shape.hosts} x "
                f"{pool.shape.machine_type} requested, {free} available in "
                f"{self.identity.reservation_path(reservation.name, pool.zones[0])}).")

    def _fail_create(self, pool: SimPool, operation: SimOperation, code: str, words: str,
                     moment: dt.datetime) -> None:
        operation.done, operation.error, operation.error_code = True, words, code
        if self.pools.get(pool.name) is not pool:
            return
        pool.holds_reservation = False
        if self.behaviour.failed_pool_remains:
            pool.status, pool.status_message = ERROR, words
        else:
            self._remove(pool, moment)
        self._quota_freed(moment)

    def _finish_create(self, pool: SimPool, operation: SimOperation, stocked: bool,
                       stockout_seconds: float | None, moment: dt.datetime) -> None:
        operation.done = True
        if self.pools.get(pool.name) is not pool or pool.status != PROVISIONING:
            return
        pool.status, pool.running_at = RUNNING, moment
        start = moment
        if stocked:
            pool.stocked_out = True
            if stockout_seconds is not None:
                start = seconds_after(moment, stockout_seconds)
                pool.stockout_ends_at = start
        if pool.autoscaled:
            # No nodes until pods ask for them: tell the Kubernetes side the pool is
            # there, so pods already pending for it ask the autoscaler now.
            self._on_nodes_changed(pool, moment, [])
            return
        if stocked and stockout_seconds is None:
            return
        self._bring_nodes(pool, start)

    def _bring_nodes(self, pool: SimPool, start: dt.datetime) -> None:
        register = self.behaviour.node_register_delay[pool.supply_mode].draw(self._rng)
        ready_lag = self.behaviour.node_ready_lag.draw(self._rng)
        at = seconds_after(start, register)
        self._timeline.at(at, self._register_nodes, pool, ready_lag)

    # ------------------------------------------------------ cluster autoscaler

    def scale_up(self, name: str, job: str, moment: dt.datetime, misfit: str | None) -> bool:
        """The cluster autoscaler, for pending pods of ``job`` needing a node of pool ``name``:
        True when the pool has nodes or a scale-up for this Job is under way, False when
        it cannot help (not autoscaled or RUNNING, scaling for another Job, out of capacity:
        FailedScaleUp). ``misfit``: why a new node would not fit either (NotTriggerScaleUp)."""
        pool = self.pools.get(name)
        if pool is None or not pool.autoscaled or pool.status != RUNNING:
            return False
        if pool.nodes:
            return True
        if pool.scaling_for is not None:
            return pool.scaling_for == job
        if misfit is not None:
            self._autoscaler_says(pool, NOT_TRIGGER_SCALE_UP, "pod didn't trigger scale-up (it "
                                  f"wouldn't fit if a new node is added): 1 {misfit}")
            return False
        if pool.quota_refused or (not self._quota_at_create(pool) and self._over_chip_limit(pool)):
            # The MIG resize is refused for quota before capacity is looked for. A
            # chip-limit refusal is retried when chips are freed (``_quota_freed``).
            self._autoscaler_says(pool, FAILED_SCALE_UP,
                                  self._failed_scale_up_words(pool, GCE_QUOTA_EXCEEDED))
            return False
        stockout = (FAILED_SCALE_UP, self._stockout_words(pool))
        if pool.stocked_out and (pool.stockout_ends_at is None or moment < pool.stockout_ends_at):
            if pool.failed_scale_up != stockout:
                self._autoscaler_says(pool, *stockout)
                pool.failed_scale_up = stockout
                if pool.stockout_ends_at is not None:
                    # The autoscaler tries again after its backoff; the first try
                    # after the stockout ends succeeds.
                    self._timeline.at(pool.stockout_ends_at, self._retry_scale_up, pool)
            elif pool.autoscaler_event == stockout:
                # Asked again while it backs off: the newest event is its note.
                self._autoscaler_says(pool, NOT_TRIGGER_SCALE_UP, BACKOFF_NOTE)
            return False
        pool.scaling_for = job
        self._autoscaler_says(pool, TRIGGERED_SCALE_UP, (
            f"pod triggered scale-up: [{{https://www.googleapis.com/compute/v1/projects/"
            f"{self.identity.project}/zones/{pool.zones[0]}/instanceGroups/"
            f"gke-{self.identity.name[:12]}-{pool.name[:24]}-grp 0->{pool.shape.hosts} "
            f"(max: {pool.shape.hosts})}}]"))
        self._bring_nodes(pool, moment)
        return True

    @staticmethod
    def _autoscaler_says(pool: SimPool, reason: str, message: str) -> None:
        """The autoscaler's event on the pool's pending pods: the same again counts up
        (Kubernetes aggregates a repeated event), another starts over at 1."""
        event = (reason, message)
        pool.autoscaler_event_count = (pool.autoscaler_event_count + 1
                                       if pool.autoscaler_event == event else 1)
        pool.autoscaler_event = event

    def _retry_scale_up(self, pool: SimPool, moment: dt.datetime) -> None:
        """The autoscaler tries again for the pool's pending pods (a stockout ended, or
        quota chips were freed)."""
        if self.pools.get(pool.name) is pool:
            self._on_nodes_changed(pool, moment, [])

    def _quota_freed(self, moment: dt.datetime) -> None:
        """TPU chips were freed (a pool deleted or failed, nodes scaled down): the
        autoscaler retries the scale-ups the chip limit refused. A pool the quota rule
        refused stays refused."""
        if self.behaviour.quota.tpu_chip_limit is None:
            return
        for pool in self.pools.values():
            quota_words = self._failed_scale_up_words(pool, GCE_QUOTA_EXCEEDED)
            if (pool.status == RUNNING and not pool.quota_refused
                    and pool.autoscaler_event == (FAILED_SCALE_UP, quota_words)):
                self._timeline.at(moment, self._retry_scale_up, pool)

    def _stockout_words(self, pool: SimPool) -> str:
        """The autoscaler's FailedScaleUp on a pod whose pool's zone has no capacity."""
        return self._failed_scale_up_words(
            pool, f"GCE out of resources ({pool.shape.hosts} x {pool.shape.machine_type}, "
            f"{pool.supply_mode})")

    @staticmethod
    def _failed_scale_up_words(pool: SimPool, failure: str) -> str:
        """The autoscaler's FailedScaleUp message on a pending pod, in its GKE provider's
        template ("GCE quota exceeded", "GCE out of resources", ...)."""
        return (f"Node scale up in zones {pool.zone_words} associated with this pod "
                f"failed: {failure}. Pod is at risk of not being scheduled.")

    def node_use_changed(self, name: str, moment: dt.datetime) -> None:
        """A pod bound to or left one of the pool's nodes: an autoscaled pool whose nodes
        all stay unneeded for its scale-down-unneeded time loses them."""
        pool = self.pools.get(name)
        if pool is None or not pool.autoscaled or not pool.nodes:
            return
        if any(node.pod is not None for node in pool.nodes):
            pool.unneeded_since = None
            return
        if pool.unneeded_since is not None:
            return
        pool.unneeded_since = since = moment
        self._timeline.at(seconds_after(moment, pool.scale_down_unneeded_seconds),
                          self._scale_down, pool, since)

    def repair_nodes(self, name: str, moment: dt.datetime) -> None:
        """GKE's repair of a node of a multi-host TPU slice recreates every VM of the
        slice (Cloud TPU "TPUs in GKE"): the nodes go (the Kubernetes side evicted their
        pods first), new ones come as after a create; no scale-up runs meanwhile."""
        pool = self.pools.get(name)
        if pool is not None and pool.status == RUNNING and pool.nodes:
            pool.scaling_for = "node-repair"
            self._lose(pool, pool.nodes, moment)
            self._bring_nodes(pool, moment)

    def _scale_down(self, pool: SimPool, since: dt.datetime, moment: dt.datetime) -> None:
        if (self.pools.get(pool.name) is pool and pool.status == RUNNING
                and pool.unneeded_since == since):
            pool.autoscaler_event, pool.autoscaler_event_count = None, 0
            self._lose(pool, pool.nodes, moment)
            self._quota_freed(moment)

    def _lose(self, pool: SimPool, lost: Sequence[SimNode], moment: dt.datetime) -> None:
        """The pool's ``lost`` nodes are gone; the Kubernetes side is told."""
        pool.nodes = [node for node in pool.nodes if node not in lost]
        pool.unneeded_since = None
        self.registered_nodes -= len(lost)
        self._on_nodes_changed(pool, moment, [*lost])

    def _register_nodes(self, pool: SimPool, ready_lag: float, moment: dt.datetime) -> None:
        if self.pools.get(pool.name) is not pool or pool.status != RUNNING:
            return
        pool.stocked_out = False
        pool.scaling_for, pool.failed_scale_up = None, None
        group = suffix(self._rng, 8)
        pool.nodes = [
            SimNode(f"gke-{self.identity.name[:12]}-{pool.name[:24]}-{group}-{suffix(self._rng, 4)}")
            for _ in range(pool.node_count)
        ]
        self.registered_nodes += len(pool.nodes)
        self._on_nodes_changed(pool, moment, [])
        self._timeline.at(seconds_after(moment, ready_lag), self._nodes_ready, pool)
        if pool.supply_mode == FLEX_START:
            self._timeline.at(seconds_after(moment, self.behaviour.flex_start_max_run_seconds),
                              self._end_of_run, pool, group, FLEX_START_END)
        reserved = self.identity.config.reservation(pool.reservation or "")
        if pool.reservation and reserved is not None and reserved.ends_at is not None:
            self._timeline.at(max(reserved.ends_at, moment), self._end_of_run, pool, group,
                              RESERVATION_END.format(reservation=reserved.name))

    def _end_of_run(self, pool: SimPool, group: str, why: str, moment: dt.datetime) -> None:
        """Flex-start nodes reach their max run duration, or the calendar-mode reservation
        they consume ends: their VMs are deleted, killing their pods."""
        lost = [node for node in pool.nodes if f"-{group}-" in node.name]
        if self.pools.get(pool.name) is pool and lost:
            for node in lost:
                node.end = why
            self._lose(pool, lost, moment)
            self._quota_freed(moment)

    def _nodes_ready(self, pool: SimPool, moment: dt.datetime) -> None:
        if self.pools.get(pool.name) is not pool or pool.status != RUNNING:
            return
        for node in pool.nodes:
            node.ready = True
        self._on_nodes_changed(pool, moment, [])

    def _finish_delete(self, pool: SimPool, operation: SimOperation, moment: dt.datetime) -> None:
        operation.done = True
        if self.pools.get(pool.name) is pool:
            self._remove(pool, moment)

    def _remove(self, pool: SimPool, moment: dt.datetime) -> None:
        del self.pools[pool.name]
        pool.holds_reservation = False
        pool.deleted_at = moment
        self.deleted.append(self.snapshot(pool))

    def _operation(self, kind: str, pool: str, now: dt.datetime) -> SimOperation:
        millis = int(now.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
        operation = SimOperation(f"operation-{millis}-{self._rng.getrandbits(32):08x}", kind,
                                 pool, now)
        self._operations[operation.id] = operation
        return operation

    def _busy_words(self, operation: str, doing: str, pool: str) -> str:
        return (f"Operation {operation} is currently {doing} node pool {pool}. Please wait and "
                "try again once it is done.")

    def _injected_delete_words(self, pool: str, now: dt.datetime) -> str:
        if self._rng.random() < 0.5:
            return (f"Too many operations: cluster {self.identity.name} hits the concurrent "
                    "operations quota 5, please try again later.")
        other = f"operation-{int(now.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)}-" \
                f"{self._rng.getrandbits(32):08x}"
        return (f"Cluster is running incompatible operation {other}. Please wait and try again "
                f"once it is done (deleting node pool {pool}).")

    def _info(self, pool: SimPool) -> NodePoolInfo:
        return NodePoolInfo(self.identity.name, pool.name, pool.status, pool.labels,
                            pool.node_count, pool.status_message)


def _unused(reservation: ReservationConfig, shape: SliceShape, taken: int) -> int:
    """VMs of the reservation left for this shape once ``taken`` are counted (0 for
    another machine type)."""
    if reservation.machine_type and reservation.machine_type != shape.machine_type:
        return 0
    return max(0, reservation.count - reservation.in_use - taken)
