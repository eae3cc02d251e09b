"""What the simulated world does, read from a JSON file (``--sim-config``).

The world simulates the clusters of the registry, as ``falcon-es cluster add``
registered them (name, project, location, TPU type, default reservation); this file
says how they behave. ``clusters`` is an object keyed by cluster name, each entry
changing only the knobs it names over ``defaults``; a registered cluster the file does
not name behaves like ``defaults``. A registered cluster's default reservation exists
with ``default_reservation_size`` (16 VMs, none in use, unless the file says otherwise)
when its entry lists no reservation of that name. An entry's ``project``,
``location``, ``node_location``, ``tpu_type`` (or ``tpu_types``), ``gcs_bucket`` and
``default_reservation`` are what ``demo``, ``simulate`` and ``bench`` register; the
world simulates the registry's values. A regional cluster (``location`` a region) has
the zones ``zones`` lists (default: the region's a, b and c); a reservation lives in
its ``zone``, by default the zone of the cluster's TPU pools; one with ``ends_at`` (an
RFC 3339 time) is a calendar-mode reservation, deleted then with the VMs on it.

Every knob has a default so an empty object is a valid world. Latencies are
seconds, either a number or ``[low, high]`` (drawn uniformly from the world's seeded
random stream); per-supply-mode knobs take one such value or an object keyed by
``reservation`` / ``on-demand`` / ``flex-start``. Reservation ``count`` and ``in_use``
count **VMs (hosts)**, as Compute's specific reservations do: a v6e 4x4 slice uses 4.

A bad file fails with one line naming the file, the place in it and what was expected.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from falcon_es.domain.clusters import is_zone
from falcon_es.domain.ports import EDGE_EVENTS_TOPIC, TASK_EVENTS_TOPIC
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.domain.spec import SIM_OUTCOMES, SUPPLY_MODES
from falcon_es.domain.tpu import TPU_TYPES

RESERVATION, ON_DEMAND, FLEX_START = SUPPLY_MODES
#: When the TPU quota bites an autoscaled pool: when the autoscaler adds its VMs (an
#: autoscaled pool with 0 nodes creates none at create), or already at its create.
QUOTA_AT_SCALE_UP, QUOTA_AT_CREATE = "scale-up", "create"
DEFAULT_CONFIG_RESOURCE = "default_config.json"
#: VMs of a registered cluster's default reservation that the config does not size: a
#: modest real reservation (sixteen single-host slices, or four v6e 4x4 ones).
DEFAULT_RESERVATION_VMS = 16


class SimConfigError(ValueError):
    """The simulator configuration cannot describe a world (says where and why)."""


@dataclasses.dataclass(frozen=True)
class Span:
    """A duration in seconds drawn uniformly from [low, high] (a fixed value when equal)."""

    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        """Whole milliseconds: timestamps stay readable and survive any DATETIME(3+)."""
        return self.low if self.low == self.high else round(rng.uniform(self.low, self.high), 3)

    def to_data(self) -> float | list[float]:
        return self.low if self.low == self.high else [self.low, self.high]


def fixed(seconds: float) -> Span:
    return Span(float(seconds), float(seconds))


@dataclasses.dataclass(frozen=True)
class FaultRule:
    """Which attempts fail: the first ``first_n`` always, then each with ``probability``."""

    probability: float = 0.0
    first_n: int = 0

    def hits(self, index: int, rng: random.Random) -> bool:
        """Always draws once, so enabling ``first_n`` does not shift later draws."""
        roll = rng.random()
        return index < self.first_n or roll < self.probability

    @property
    def inert(self) -> bool:
        """Never hits: a fault added later may skip its draw, so worlds written before
        it keep their random stream."""
        return self.first_n == 0 and self.probability == 0


@dataclasses.dataclass(frozen=True)
class StockoutConfig:
    """Pools that come up RUNNING with 0/N nodes; ``duration`` None means for good."""

    supply_modes: tuple[str, ...] = (FLEX_START,)
    probability: float = 0.0
    first_n: int = 0
    duration: Span | None = Span(600.0, 1800.0)

    @property
    def rule(self) -> FaultRule:
        return FaultRule(self.probability, self.first_n)


@dataclasses.dataclass(frozen=True)
class QuotaConfig:
    """Pools refused for TPU quota: a fixed-size pool's create operation fails with
    TPUS_PER_TPU_FAMILY quota words; an autoscaled pool's scale-ups fail with the
    cluster autoscaler's "GCE quota exceeded" (``autoscaled_at`` "scale-up", the
    default), or its create fails as a fixed-size pool's does (``autoscaled_at``
    "create": whether GKE checks quota at the create of a 0-node pool is not
    documented, so both readings can be played).

    ``probability`` / ``first_n`` pick the pools refused (an autoscaled pool so picked
    fails every scale-up). ``tpu_chip_limit`` is the explicit rule: chips in use in
    ``supply_modes`` on the cluster may not exceed it -- a fixed-size pool's from its
    create, an autoscaled pool's while it has or is adding nodes (reservation pools
    need no quota, as on GKE).
    """

    supply_modes: tuple[str, ...] = (ON_DEMAND, FLEX_START)
    probability: float = 0.0
    first_n: int = 0
    tpu_chip_limit: int | None = None
    failure_after: Span = Span(20.0, 60.0)
    autoscaled_at: str = QUOTA_AT_SCALE_UP

    @property
    def rule(self) -> FaultRule:
        return FaultRule(self.probability, self.first_n)


@dataclasses.dataclass(frozen=True)
class ReservationConfig:
    name: str
    count: int  # VMs
    in_use: int = 0  # VMs used by something other than Falcon's pools
    machine_type: str | None = None  # None: any machine of the cluster's TPU type
    #: Reservations are zonal; None: the zone of the cluster's TPU pools.
    zone: str | None = None
    #: A calendar-mode reservation's end (naive UTC): Compute deletes it then, and the
    #: VMs that consume it; reads after it answer 404. None: it has no end.
    ends_at: dt.datetime | None = None

    def gone(self, now: dt.datetime) -> bool:
        return self.ends_at is not None and now >= self.ends_at


@dataclasses.dataclass(frozen=True)
class ReservationSize:
    """The reservation the registry names as a cluster's default, when the config lists
    none of that name: the registry knows its name only, so its size comes from here."""

    count: int = DEFAULT_RESERVATION_VMS  # VMs
    in_use: int = 0  # VMs used by something other than Falcon's pools
    machine_type: str | None = None  # None: any machine of the cluster's TPU type

    def named(self, name: str) -> ReservationConfig:
        return ReservationConfig(name, self.count, self.in_use, self.machine_type)


def _by_mode(reservation: Span, on_demand: Span, flex_start: Span) -> Callable[[], Mapping[str, Span]]:
    return lambda: MappingProxyType({RESERVATION: reservation, ON_DEMAND: on_demand,
                                     FLEX_START: flex_start})


@dataclasses.dataclass(frozen=True)
class ClusterBehaviour:
    create_latency: Mapping[str, Span] = dataclasses.field(default_factory=_by_mode(
        Span(60.0, 120.0), Span(120.0, 240.0), Span(300.0, 900.0)))
    delete_latency: Span = Span(30.0, 90.0)
    #: After create, get/list answer 404 for this long (eventual consistency).
    visibility_delay: Mapping[str, Span] = dataclasses.field(default_factory=_by_mode(
        fixed(0), fixed(0), Span(10.0, 30.0)))
    #: From RUNNING (or the end of a stockout) until the slice's nodes register.
    node_register_delay: Mapping[str, Span] = dataclasses.field(default_factory=_by_mode(
        Span(20.0, 40.0), Span(30.0, 60.0), Span(60.0, 180.0)))
    node_ready_lag: Span = Span(5.0, 15.0)
    #: How long a flex-start node lives: GKE deletes it at the end of its max run
    #: duration (up to 7 days, "About flex-start"); the pods on it are killed.
    flex_start_max_run_seconds: float = 7 * 24 * 3600.0
    stockout: StockoutConfig = StockoutConfig()
    quota: QuotaConfig = QuotaConfig()
    delete_failures: FaultRule = FaultRule()
    #: Pool creates GKE refuses with its 429 words (nothing is created; try again later).
    create_throttled: FaultRule = FaultRule()
    #: Job submits the Kubernetes API refuses with 429 Too Many Requests.
    submit_throttled: FaultRule = FaultRule()
    #: GKE leaves a pool whose create failed in status ERROR until someone deletes it.
    failed_pool_remains: bool = True
    #: None: unlimited; else a create/delete beyond it gets GKE's 429 words.
    max_concurrent_operations: int | None = None
    #: CPU nodes of the cluster (no TPU); they appear in "0/N nodes are available".
    system_nodes: int = 3
    #: The registered default reservation when ``reservations`` does not list it;
    #: None: Compute has no such reservation (its reads and pools fail as not found).
    default_reservation_size: ReservationSize | None = ReservationSize()


@dataclasses.dataclass(frozen=True)
class SimClusterConfig:
    """How one cluster behaves. The identity fields are what ``demo``, ``simulate`` and
    ``bench`` register; a simulated cluster takes them from the registry (the world
    fills them in when it starts simulating the cluster)."""

    name: str
    project: str | None = None  # None: the registry's value for the cluster
    #: The cluster's own location: a zone (zonal cluster) or a region (regional).
    location: str | None = None
    #: The zone its TPU pools go in (``--node-location``); a zonal cluster's location.
    node_location: str | None = None
    #: The cluster's zones (GKE's ``Cluster.locations``), where a pool created without
    #: ``locations`` puts nodes; empty: its zone, or for a region its zones a, b, c.
    zones: tuple[str, ...] = ()
    tpu_types: tuple[str, ...] = ()
    gcs_bucket: str | None = None
    default_reservation: str | None = None
    reservations: tuple[ReservationConfig, ...] = ()
    behaviour: ClusterBehaviour = ClusterBehaviour()

    @property
    def tpu_type(self) -> str:
        return self.tpu_types[0] if self.tpu_types else ""

    def cluster_zones(self, location: str) -> tuple[str, ...]:
        """GKE's ``Cluster.locations`` for the cluster at ``location``."""
        if self.zones:
            return self.zones
        return (location,) if is_zone(location) else tuple(f"{location}-{z}" for z in "abc")

    def node_zone(self, location: str) -> str:
        """Where its TPU pools go, and its reservations live unless they name a zone."""
        return self.node_location or self.cluster_zones(location)[0]

    def reservation(self, name: str) -> ReservationConfig | None:
        short = name.rsplit("/", 1)[-1]
        return next((r for r in self.reservations if r.name == short), None)

    def with_default_reservation(self, name: str | None) -> tuple[ReservationConfig, ...]:
        """The reservations Compute holds for the cluster whose default reservation is
        ``name``: those listed, and ``name`` sized by ``default_reservation_size`` when
        the list does not hold it."""
        size = self.behaviour.default_reservation_size
        if name is None or size is None or self.reservation(name) is not None:
            return self.reservations
        return (*self.reservations, size.named(name.rsplit("/", 1)[-1]))


@dataclasses.dataclass(frozen=True)
class JobDefaults:
    """Job behaviour when a task's ``spec.sim`` says nothing."""

    duration_seconds: float = 300.0
    outcome: str = "succeed"
    exit_code: int | None = None
    pod_start: Span = Span(5.0, 15.0)
    image_pull_backoff_seconds: float = 20.0
    #: TPU nodes carry google.com/tpu=present:NoSchedule; pods must tolerate it.
    enforce_tpu_taint: bool = True
    #: Kubernetes' own default when a Job does not set spec.backoffLimit.
    default_backoff_limit: int = 6


@dataclasses.dataclass(frozen=True)
class DeliveryFaults:
    """How the simulated informers mistreat edge events on their way to the bus."""

    topic: str = EDGE_EVENTS_TOPIC
    late_probability: float = 0.0
    max_late_seconds: float = 30.0
    duplicate_probability: float = 0.0
    #: Held back until the Job's next observation has been delivered (or the hold ends).
    reorder_probability: float = 0.0
    reorder_max_hold_seconds: float = 60.0


@dataclasses.dataclass(frozen=True)
class BusConfig:
    ack_deadline_seconds: float = 60.0
    #: topic -> its subscriptions; a topic without subscriptions drops what it gets
    #: (the ops stream has none by default: nobody in-process reads it).
    subscriptions: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({
            EDGE_EVENTS_TOPIC: (EDGE_EVENTS_TOPIC,), TASK_EVENTS_TOPIC: ()}))


@dataclasses.dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    clusters: tuple[SimClusterConfig, ...] = ()
    defaults: ClusterBehaviour = ClusterBehaviour()
    jobs: JobDefaults = JobDefaults()
    delivery: DeliveryFaults = DeliveryFaults()
    bus: BusConfig = BusConfig()
    source: str = "<defaults>"

    def cluster(self, name: str) -> SimClusterConfig | None:
        return next((c for c in self.clusters if c.name == name), None)

    def unregistered(self, registered: Collection[str]) -> list[str]:
        """The clusters this config describes that are not among ``registered``: the
        world does not simulate them until someone registers them."""
        return [c.name for c in self.clusters if c.name not in registered]

    @classmethod
    def from_data(cls, data: Any, source: str = "<data>") -> SimConfig:
        return _Parser(source).config(data)


def load_sim_config(path: str | Path | None = None) -> SimConfig:
    """The file's world, or the packaged default (no cluster named: every registered
    cluster behaves like its ``defaults``) when None."""
    if path is None:
        text = resources.files(__package__).joinpath(DEFAULT_CONFIG_RESOURCE).read_text("utf-8")
        source = f"{__package__}/{DEFAULT_CONFIG_RESOURCE}"
    else:
        source = str(path)
        try:
            text = Path(path).read_text("utf-8")
        except OSError as error:
            raise SimConfigError(f"sim config {source}: cannot read ({error.strerror})") from None

    def refuse_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # JSON keeps the last of a repeated key: a cluster described twice would lose
        # its first description without a word.
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise SimConfigError(f"sim config {source}: {repeated!r} is given twice in one "
                                 "object (only the last would count)")
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=refuse_repeats)
    except json.JSONDecodeError as error:
        raise SimConfigError(
            f"sim config {source}: not valid JSON (line {error.lineno} column {error.colno}: "
            f"{error.msg})"
        ) from None
    return SimConfig.from_data(data, source)


_BEHAVIOUR_KEYS = frozenset({
    "create_latency_seconds", "delete_latency_seconds", "visibility_delay_seconds",
    "node_register_seconds", "node_ready_lag_seconds", "stockout", "quota",
    "delete_failures", "failed_pool_remains", "max_concurrent_operations", "system_nodes",
    "create_throttled", "submit_throttled", "default_reservation_size",
})
_CLUSTER_KEYS = frozenset({
    "project", "location", "node_location", "zones", "tpu_types", "tpu_type", "gcs_bucket",
    "default_reservation", "reservations",
}) | _BEHAVIOUR_KEYS


class _Parser:
    """Strict: an unknown key is a typo until proven otherwise, so it is refused."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> SimConfigError:
        return SimConfigError(f"sim config {self.source}: {where}: {what}")

    def config(self, data: Any) -> SimConfig:
        data = self.obj(data, "top level", {"seed", "defaults", "clusters", "jobs",
                                            "delivery", "bus"})
        defaults = self.behaviour(data.get("defaults", {}), "defaults", ClusterBehaviour())
        raw_clusters = data.get("clusters", {})
        if isinstance(raw_clusters, list):
            raise self.fail("clusters", 'expected an object keyed by cluster name, found a '
                                        'list; write {"NAME": {...}} for [{"name": "NAME", ...}]')
        raw_clusters = self.obj(raw_clusters, "clusters", None)
        clusters = tuple(self.cluster(name, entry, defaults)
                         for name, entry in raw_clusters.items())
        return SimConfig(
            seed=self.integer(data.get("seed", 0), "seed", minimum=None),
            clusters=clusters, defaults=defaults,
            jobs=self.jobs(data.get("jobs", {}), "jobs"),
            delivery=self.delivery(data.get("delivery", {}), "delivery"),
            bus=self.bus(data.get("bus", {}), "bus"),
            source=self.source,
        )

    def cluster(self, name: str, data: Any, defaults: ClusterBehaviour) -> SimClusterConfig:
        where = f"clusters.{name}"
        if not name.strip():
            raise self.fail("clusters", "a cluster name is empty")
        data = self.obj(data, where, _CLUSTER_KEYS)
        if "tpu_types" in data and "tpu_type" in data:
            raise self.fail(where, "give tpu_types or tpu_type, not both")
        raw_types = data.get("tpu_types", [data["tpu_type"]] if "tpu_type" in data else [])
        if not isinstance(raw_types, list):
            raise self.fail(f"{where}.tpu_types", f"expected a list, found {_kind(raw_types)}")
        for index, tpu in enumerate(raw_types):
            if tpu not in TPU_TYPES:
                raise self.fail(f"{where}.tpu_types[{index}]",
                                f"{tpu!r} is not a TPU type; expected one of {', '.join(TPU_TYPES)}")
        raw_reservations = data.get("reservations", [])
        if not isinstance(raw_reservations, list):
            raise self.fail(f"{where}.reservations",
                            f"expected a list of objects, found {_kind(raw_reservations)}")
        reservations = tuple(self.reservation(r, f"{where}.reservations[{i}]")
                             for i, r in enumerate(raw_reservations))
        default_reservation = self.optional_text(data, "default_reservation", where)
        return SimClusterConfig(
            name=name,
            project=self.optional_text(data, "project", where),
            location=self.optional_text(data, "location", where),
            node_location=self.optional_text(data, "node_location", where),
            zones=self.zones(data.get("zones", []), f"{where}.zones"),
            tpu_types=tuple(raw_types),
            gcs_bucket=self.optional_text(data, "gcs_bucket", where),
            default_reservation=default_reservation,
            reservations=reservations,
            behaviour=self.behaviour({k: v for k, v in data.items() if k in _BEHAVIOUR_KEYS},
                                     where, defaults),
        )

    def reservation(self, data: Any, where: str) -> ReservationConfig:
        data = self.obj(data, where, {"name", "count", "in_use", "machine_type", "zone",
                                      "ends_at"})
        name = self.text(data.get("name"), f"{where}.name")
        zone = self.optional_text(data, "zone", where)
        if zone is not None and not is_zone(zone):
            raise self.fail(f"{where}.zone", f"{zone!r} is not a zone (us-central1-a)")
        ends = self.optional_text(data, "ends_at", where)
        ends_at = as_timestamp(ends) if ends is not None else None
        if ends is not None and ends_at is None:
            raise self.fail(f"{where}.ends_at", f"{ends!r} is not an RFC 3339 time")
        return dataclasses.replace(self.size(data, where, count=data.get("count")).named(name),
                                   zone=zone, ends_at=ends_at)

    def zones(self, data: Any, where: str) -> tuple[str, ...]:
        if not isinstance(data, list):
            raise self.fail(where, f"expected a list of zones, found {_kind(data)}")
        for index, zone in enumerate(data):
            if not isinstance(zone, str) or not is_zone(zone):
                raise self.fail(f"{where}[{index}]", f"{zone!r} is not a zone (us-central1-a)")
        return tuple(data)

    def behaviour(self, data: Any, where: str, base: ClusterBehaviour) -> ClusterBehaviour:
        data = self.obj(data, where, _BEHAVIOUR_KEYS)
        changes: dict[str, Any] = {}
        for key, field in (("create_latency_seconds", "create_latency"),
                           ("visibility_delay_seconds", "visibility_delay"),
                           ("node_register_seconds", "node_register_delay")):
            if key in data:
                changes[field] = self.per_mode(data[key], f"{where}.{key}", getattr(base, field))
        if "delete_latency_seconds" in data:
            changes["delete_latency"] = self.span(data["delete_latency_seconds"],
                                                  f"{where}.delete_latency_seconds")
        if "node_ready_lag_seconds" in data:
            changes["node_ready_lag"] = self.span(data["node_ready_lag_seconds"],
                                                  f"{where}.node_ready_lag_seconds")
        if "stockout" in data:
            changes["stockout"] = self.stockout(data["stockout"], f"{where}.stockout", base.stockout)
        if "quota" in data:
            changes["quota"] = self.quota(data["quota"], f"{where}.quota", base.quota)
        for key in ("delete_failures", "create_throttled", "submit_throttled"):
            if key in data:
                changes[key] = self.fault_rule(data[key], f"{where}.{key}", getattr(base, key))
        if "failed_pool_remains" in data:
            changes["failed_pool_remains"] = self.boolean(data["failed_pool_remains"],
                                                          f"{where}.failed_pool_remains")
        if "max_concurrent_operations" in data:
            limit = data["max_concurrent_operations"]
            changes["max_concurrent_operations"] = (
                None if limit is None
                else self.integer(limit, f"{where}.max_concurrent_operations", minimum=1))
        if "system_nodes" in data:
            changes["system_nodes"] = self.integer(data["system_nodes"], f"{where}.system_nodes")
        if "default_reservation_size" in data:
            changes["default_reservation_size"] = self.reservation_size(
                data["default_reservation_size"], f"{where}.default_reservation_size")
        return dataclasses.replace(base, **changes)

    def reservation_size(self, data: Any, where: str) -> ReservationSize | None:
        if data is None:
            return None
        data = self.obj(data, where, {"count", "in_use", "machine_type"})
        return self.size(data, where, count=data.get("count", DEFAULT_RESERVATION_VMS))

    def size(self, data: Mapping[str, Any], where: str, *, count: Any) -> ReservationSize:
        """A reservation's VMs: ``count`` (required in a listed reservation), ``in_use``
        within it, and the machine type they are."""
        vms = self.integer(count, f"{where}.count")
        in_use = self.integer(data.get("in_use", 0), f"{where}.in_use")
        if in_use > vms:
            raise self.fail(f"{where}.in_use", f"{in_use} exceeds count {vms}")
        machine = data.get("machine_type")
        return ReservationSize(vms, in_use,
                               None if machine is None else self.text(machine, f"{where}.machine_type"))

    def fault_rule(self, data: Any, where: str, base: FaultRule) -> FaultRule:
        rule = self.obj(data, where, {"probability", "first_n"})
        return FaultRule(
            self.probability(rule.get("probability", base.probability), f"{where}.probability"),
            self.integer(rule.get("first_n", base.first_n), f"{where}.first_n"),
        )

    def stockout(self, data: Any, where: str, base: StockoutConfig) -> StockoutConfig:
        data = self.obj(data, where, {"supply_modes", "probability", "first_n", "duration_seconds"})
        duration = base.duration
        if "duration_seconds" in data:
            raw = data["duration_seconds"]
            duration = None if raw is None else self.span(raw, f"{where}.duration_seconds")
        return StockoutConfig(
            supply_modes=self.modes(data.get("supply_modes", list(base.supply_modes)),
                                    f"{where}.supply_modes"),
            probability=self.probability(data.get("probability", base.probability),
                                         f"{where}.probability"),
            first_n=self.integer(data.get("first_n", base.first_n), f"{where}.first_n"),
            duration=duration,
        )

    def quota(self, data: Any, where: str, base: QuotaConfig) -> QuotaConfig:
        data = self.obj(data, where, {"supply_modes", "probability", "first_n",
                                      "tpu_chip_limit", "failure_after_seconds",
                                      "autoscaled_at"})
        limit = data.get("tpu_chip_limit", base.tpu_chip_limit)
        readings = (QUOTA_AT_SCALE_UP, QUOTA_AT_CREATE)
        autoscaled_at = data.get("autoscaled_at", base.autoscaled_at)
        if autoscaled_at not in readings:
            raise self.fail(f"{where}.autoscaled_at",
                            f"{autoscaled_at!r}; expected one of {', '.join(readings)}")
        return QuotaConfig(
            supply_modes=self.modes(data.get("supply_modes", list(base.supply_modes)),
                                    f"{where}.supply_modes"),
            probability=self.probability(data.get("probability", base.probability),
                                         f"{where}.probability"),
            first_n=self.integer(data.get("first_n", base.first_n), f"{where}.first_n"),
            tpu_chip_limit=None if limit is None else self.integer(limit, f"{where}.tpu_chip_limit"),
            failure_after=(self.span(data["failure_after_seconds"], f"{where}.failure_after_seconds")
                           if "failure_after_seconds" in data else base.failure_after),
            autoscaled_at=autoscaled_at,
        )

    def jobs(self, data: Any, where: str) -> JobDefaults:
        data = self.obj(data, where, {"duration_seconds", "outcome", "exit_code",
                                      "pod_start_seconds", "image_pull_backoff_seconds",
                                      "enforce_tpu_taint", "default_backoff_limit"})
        base = JobDefaults()
        outcome = data.get("outcome", base.outcome)
        if outcome not in SIM_OUTCOMES:
            raise self.fail(f"{where}.outcome",
                            f"{outcome!r}; expected one of {', '.join(SIM_OUTCOMES)}")
        exit_code = data.get("exit_code")
        return JobDefaults(
            duration_seconds=self.seconds(data.get("duration_seconds", base.duration_seconds),
                                          f"{where}.duration_seconds"),
            outcome=outcome,
            exit_code=None if exit_code is None else self.integer(exit_code, f"{where}.exit_code",
                                                                  maximum=255),
            pod_start=(self.span(data["pod_start_seconds"], f"{where}.pod_start_seconds")
                       if "pod_start_seconds" in data else base.pod_start),
            image_pull_backoff_seconds=self.seconds(
                data.get("image_pull_backoff_seconds", base.image_pull_backoff_seconds),
                f"{where}.image_pull_backoff_seconds"),
            enforce_tpu_taint=self.boolean(data.get("enforce_tpu_taint", base.enforce_tpu_taint),
                                           f"{where}.enforce_tpu_taint"),
            default_backoff_limit=self.integer(
                data.get("default_backoff_limit", base.default_backoff_limit),
                f"{where}.default_backoff_limit"),
        )

    def delivery(self, data: Any, where: str) -> DeliveryFaults:
        data = self.obj(data, where, {f.name for f in dataclasses.fields(DeliveryFaults)})
        base = DeliveryFaults()
        return DeliveryFaults(
            topic=self.text(data.get("topic", base.topic), f"{where}.topic"),
            late_probability=self.probability(data.get("late_probability", 0.0),
                                              f"{where}.late_probability"),
            max_late_seconds=self.seconds(data.get("max_late_seconds", base.max_late_seconds),
                                          f"{where}.max_late_seconds"),
            duplicate_probability=self.probability(data.get("duplicate_probability", 0.0),
                                                   f"{where}.duplicate_probability"),
            reorder_probability=self.probability(data.get("reorder_probability", 0.0),
                                                 f"{where}.reorder_probability"),
            reorder_max_hold_seconds=self.seconds(
                data.get("reorder_max_hold_seconds", base.reorder_max_hold_seconds),
                f"{where}.reorder_max_hold_seconds"),
        )

    def bus(self, data: Any, where: str) -> BusConfig:
        data = self.obj(data, where, {"ack_deadline_seconds", "subscriptions"})
        base = BusConfig()
        subscriptions = base.subscriptions
        if "subscriptions" in data:
            raw = self.obj(data["subscriptions"], f"{where}.subscriptions", None)
            parsed: dict[str, tuple[str, ...]] = {}
            for topic, names in raw.items():
                if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                    raise self.fail(f"{where}.subscriptions.{topic}",
                                    "expected a list of subscription names")
                parsed[topic] = tuple(names)
            every = [n for names in parsed.values() for n in names]
            duplicates = sorted({n for n in every if every.count(n) > 1})
            if duplicates:
                raise self.fail(f"{where}.subscriptions",
                                f"subscription {duplicates[0]!r} is attached to two topics")
            subscriptions = MappingProxyType(parsed)
        deadline = self.seconds(data.get("ack_deadline_seconds", base.ack_deadline_seconds),
                                f"{where}.ack_deadline_seconds")
        if deadline <= 0:
            raise self.fail(f"{where}.ack_deadline_seconds", "must be positive")
        return BusConfig(deadline, subscriptions)

    def per_mode(self, value: Any, where: str, base: Mapping[str, Span]) -> Mapping[str, Span]:
        if isinstance(value, Mapping):
            unknown = sorted(k for k in value if k not in SUPPLY_MODES)
            if unknown:
                raise self.fail(f"{where}.{unknown[0]}",
                                f"not a supply mode; expected {', '.join(SUPPLY_MODES)}")
            merged = dict(base)
            merged.update({mode: self.span(v, f"{where}.{mode}") for mode, v in value.items()})
            return MappingProxyType(merged)
        span = self.span(value, where)
        return MappingProxyType({mode: span for mode in SUPPLY_MODES})

    def span(self, value: Any, where: str) -> Span:
        if isinstance(value, list):
            if len(value) != 2:
                raise self.fail(where, f"expected seconds or [low, high], found a list of {len(value)}")
            low = self.seconds(value[0], f"{where}[0]")
            high = self.seconds(value[1], f"{where}[1]")
            if high < low:
                raise self.fail(where, f"[{low}, {high}]: high is below low")
            return Span(low, high)
        return fixed(self.seconds(value, where))

    def modes(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or any(m not in SUPPLY_MODES for m in value):
            raise self.fail(where, f"expected a list drawn from {', '.join(SUPPLY_MODES)}")
        return tuple(value)

    def obj(self, value: Any, where: str, allowed: set[str] | frozenset[str] | None) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected an object, found {_kind(value)}")
        if allowed is not None:
            unknown = sorted(k for k in value if k not in allowed)
            if unknown:
                raise self.fail(f"{where}.{unknown[0]}" if where != "top level" else unknown[0],
                                f"unknown key; expected one of {', '.join(sorted(allowed))}")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, found {_kind(value)}")
        return value

    def optional_text(self, data: Mapping[str, Any], key: str, where: str) -> str | None:
        value = data.get(key)
        return None if value is None else self.text(value, f"{where}.{key}")

    def integer(self, value: Any, where: str, *, minimum: int | None = 0,
                maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected a whole number, found {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(where, f"{value} is below {minimum}")
        if maximum is not None and value > maximum:
            raise self.fail(where, f"{value} is above {maximum}")
        return value

    def seconds(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise self.fail(where, f"expected seconds (a number >= 0), found {_kind(value)} {value!r}")
        return float(value)

    def probability(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise self.fail(where, f"expected a probability between 0 and 1, found {value!r}")
        return float(value)

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, found {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "a list"
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
