"""NodePoolSpec -> ``container_v1.NodePool``: the TPU node pool GKE is asked for.

Pure translation, no I/O, so every rule below is checked without a server. Facts are
from ``shared/reference/gcp-k8s-apis.md`` §1.5, §1.6, §2.2, §2.3 and §2.5.

Shape
  Machine type and host count come from ``falcon_es.domain.tpu.slice_shape``: 1-, 4- and
  8-chip single-host VMs (the 8-chip ct5lp/ct6e machines give a single-host 2x4) and
  4-chip VMs for multi-host slices, one node per VM. A multi-host slice is atomic, so
  its pool asks for exactly ``hosts`` nodes.

Zones
  ``locations`` is the spec's (the cluster's node zone): the request is sent to the
  cluster's own location, a region for a regional cluster, and a pool without
  ``locations`` would get a node group in each of the cluster's zones (three times
  the nodes, and COMPACT placement refused). Sources: docs/FIDELITY.md.

Placement
  Multi-host v5e / v5p / v6e slices get COMPACT placement with ``tpu_topology``.
  Multi-host Ironwood (v7x) slices get a workload policy instead
  (``placement_policy.policy_name``; COMPACT and a workload policy are mutually
  exclusive). Single-host pools get no placement policy (xpk omits it too).

Taint
  GKE itself taints every TPU node ``google.com/tpu=present:NoSchedule``. The pool
  does not declare that taint again: Kubernetes refuses two taints with the same key
  and effect on one node. Jobs tolerate it (``TPU_TAINT_KEY``).

Supply mode
  reservation: ``reservation_affinity`` SPECIFIC_RESERVATION, key
    ``compute.googleapis.com/reservation-name``, the reservation's name, or for a
    shared reservation the path ``projects/OWNER/reservations/NAME`` (optionally
    ``/reservationBlocks/B[/reservationSubBlocks/SB]``); all ``hosts`` nodes at once.
  on-demand: NO_RESERVATION, so an on-demand pool never silently eats capacity that a
    reservation-mode task was promised; all ``hosts`` nodes at once (needs TPU quota).
  flex-start: ``flex_start=True``, NO_RESERVATION, autoscaling 0..hosts with location
    policy ANY, 0 initial nodes.

Repairs and upgrades (docs/design-notes/disruptions.md)
  A repair or upgrade of one node of a multi-host slice recreates the whole slice and
  evicts every pod on it; the Jobs' pod failure policy recreates the pods, but the run
  starts again. Auto-repair stays on (GKE's default) for reservation and on-demand
  pools, whose broken VM would otherwise hold the slice down, and is off for
  flex-start pools (repairing a flex-start slice gives its capacity back to the queue).
  Auto-upgrade is off, except on a cluster enrolled in a release channel, where GKE
  does not allow it off ("Auto-upgrading nodes"): there the pool carries GKE's
  per-node-pool maintenance exclusion until the end of support
  (``maintenance_policy.exclusion_until_end_of_support``, FALCON_POOL_UPGRADE_EXCLUSION),
  and ``doctor`` reports a cluster whose TPU pools are otherwise exposed.

Pods per node
  Multi-host TPU pools get ``max_pods_constraint`` 15 (xpk's ``--max-pods-per-node
  15``): one workload pod per VM plus GKE's system pods, where the default of 110
  takes a /24 of the cluster's pod range per node and a large slice can exhaust it.

Scale-down-unneeded time (what GKE honours and what not)
  Falcon's ``scale_down_unneeded_seconds`` (reservation short, flex-start long) has no
  exact counterpart in the GKE API: neither ``NodePoolAutoscaling`` nor
  ``ClusterAutoscaling`` has a scale-down-unneeded or scale-down-delay field, and the
  cluster autoscaler's ``--scale-down-unneeded-time`` flag is not exposed by GKE. The
  closest per-pool field is ``NodeConfig.consolidation_delay`` ("duration after which
  the Cluster Autoscaler can scale down underutilized nodes"). GKE's autoscaler only
  scales pools that have autoscaling enabled, so Falcon sets it on flex-start pools
  only (whether GKE accepts it on a pool without autoscaling is not documented); the
  fixed-size reservation and on-demand pools give their capacity back by Falcon
  deleting the pool when no task of the same topology waits. The only other scale-down knob is the
  cluster-wide autoscaling profile (BALANCED / OPTIMIZE_UTILIZATION), which Falcon
  leaves alone. Whether GKE honours ``consolidation_delay`` on TPU pools, and from
  which GKE version, is not verified (reference §1.6, §8).

Labels
  Every pool carries ``managed-by=falcon``, ``falcon-topology``, ``falcon-supply-mode``
  and ``falcon-tpu-type``, plus the spec's labels (task id, ...). They go into
  ``config.labels`` (Kubernetes node labels, kept exactly, so the pool's owner can be
  read back before adopting it) and into ``config.resource_labels`` (GCE labels on
  the VMs, for billing and audits; GCE allows only lowercase letters, digits, ``_``
  and ``-``, so values are folded to that alphabet there).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

from google.cloud import container_v1

from falcon_es.domain.ports import INVALID, NodePoolSpec, PortError
from falcon_es.domain.tpu import SliceShape

RESERVATION = "reservation"
ON_DEMAND = "on-demand"
FLEX_START = "flex-start"
SUPPLY_MODES = (RESERVATION, ON_DEMAND, FLEX_START)

MANAGED_BY_KEY = "managed-by"
MANAGED_BY_VALUE = "falcon"
TOPOLOGY_KEY = "falcon-topology"
SUPPLY_MODE_KEY = "falcon-supply-mode"
TPU_TYPE_KEY = "falcon-tpu-type"

TPU_TAINT_KEY = "google.com/tpu"
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"
IRONWOOD = "v7x"
#: xpk's ``--max-pods-per-node`` for TPU pools (``src/xpk/core/nodepool.py``).
MAX_PODS_PER_TPU_NODE = 15

_RESOURCE_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_RESERVATION = re.compile(
    rf"^(projects/[a-z][-a-z0-9.:]{{4,61}}[a-z0-9]/reservations/)?{_RESOURCE_NAME}"
    rf"(/reservationBlocks/{_RESOURCE_NAME}(/reservationSubBlocks/{_RESOURCE_NAME})?)?$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_GCE_KEY = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
_GCE_INVALID = re.compile(r"[^-_a-z0-9]")

def workload_policy_name(shape: SliceShape) -> str:
    """The Compute workload policy an Ironwood multi-host pool of this shape uses.

    One policy per topology, shared by every pool of that topology in the region.
    """
    return f"falcon-{shape.tpu_type}-{shape.topology}"


def needs_workload_policy(shape: SliceShape) -> bool:
    return shape.tpu_type == IRONWOOD and shape.multi_host


def pool_labels(spec: NodePoolSpec) -> dict[str, str]:
    """The Kubernetes node labels of the pool: Falcon's marks plus the spec's own."""
    labels = {
        TOPOLOGY_KEY: spec.shape.topology,
        SUPPLY_MODE_KEY: spec.supply_mode,
        TPU_TYPE_KEY: spec.shape.tpu_type,
        **spec.labels,
        MANAGED_BY_KEY: MANAGED_BY_VALUE,
    }
    for key, value in labels.items():
        _check_label(spec.name, key, value)
    return labels


def gce_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The same labels folded to GCE's alphabet (lowercase, digits, '_' and '-')."""
    folded = {}
    for key, value in labels.items():
        gce_key = _GCE_INVALID.sub("_", key.lower())
        if not _GCE_KEY.match(gce_key):
            continue
        folded[gce_key] = _GCE_INVALID.sub("_", value.lower())[:63]
    return folded


def node_pool(spec: NodePoolSpec, *, workload_policy: str | None = None,
              release_channel: bool = False,
              upgrade_exclusion: bool = True) -> container_v1.NodePool:
    """The NodePool message for ``create_node_pool``.

    ``workload_policy`` names the Compute workload policy of an Ironwood multi-host
    slice (default: ``workload_policy_name(spec.shape)``); it must exist in the
    cluster's region before the pool is created. ``release_channel``: the cluster is
    enrolled in one (auto-upgrade cannot be off; ``upgrade_exclusion`` then holds
    node upgrades off with the pool's own maintenance exclusion).
    """
    shape = spec.shape
    if spec.supply_mode not in SUPPLY_MODES:
        raise PortError(INVALID, f"node pool {spec.name}: supply mode {spec.supply_mode!r} "
                                 f"is not one of {', '.join(SUPPLY_MODES)}")
    if spec.scale_down_unneeded_seconds < 0:
        raise PortError(INVALID, f"node pool {spec.name}: scale_down_unneeded_seconds "
                                 f"{spec.scale_down_unneeded_seconds} is negative")
    labels = pool_labels(spec)
    flex = spec.supply_mode == FLEX_START
    config = container_v1.NodeConfig(
        machine_type=shape.machine_type,
        labels=labels,
        resource_labels=gce_labels(labels),
        reservation_affinity=_reservation_affinity(spec),
        workload_metadata_config=container_v1.WorkloadMetadataConfig(
            mode=container_v1.WorkloadMetadataConfig.Mode.GKE_METADATA
        ),
    )
    if spec.scale_down_unneeded_seconds and flex:  # only an autoscaled pool scales down
        config.consolidation_delay = dt.timedelta(seconds=spec.scale_down_unneeded_seconds)
    if flex:
        config.flex_start = True
    # proto-plus copies a message assigned into another: finish ``config`` first.
    pool = container_v1.NodePool(
        name=spec.name,
        config=config,
        initial_node_count=0 if flex else shape.hosts,
    )
    if spec.locations:
        pool.locations = list(spec.locations)
    if flex:
        pool.autoscaling = container_v1.NodePoolAutoscaling(
            enabled=True,
            min_node_count=0,
            max_node_count=shape.hosts,
            location_policy=container_v1.NodePoolAutoscaling.LocationPolicy.ANY,
        )
    pool.management = container_v1.NodeManagement(auto_upgrade=release_channel,
                                                  auto_repair=not flex)
    if release_channel and upgrade_exclusion:
        pool.maintenance_policy = container_v1.NodePool.NodePoolMaintenancePolicy(
            exclusion_until_end_of_support=container_v1.NodePool.ExclusionUntilEndOfSupport(
                enabled=True))
    if shape.multi_host:
        pool.max_pods_constraint = container_v1.MaxPodsConstraint(
            max_pods_per_node=MAX_PODS_PER_TPU_NODE)
    if needs_workload_policy(shape):
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(
            policy_name=workload_policy or workload_policy_name(shape)
        )
    elif shape.multi_host:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(
            type_=container_v1.NodePool.PlacementPolicy.Type.COMPACT,
            tpu_topology=shape.topology,
        )
    return pool


def _reservation_affinity(spec: NodePoolSpec) -> container_v1.ReservationAffinity:
    kind = container_v1.ReservationAffinity.Type
    if spec.supply_mode != RESERVATION:
        return container_v1.ReservationAffinity(consume_reservation_type=kind.NO_RESERVATION)
    if not spec.reservation:
        raise PortError(INVALID, f"node pool {spec.name}: supply mode reservation needs a "
                                 "reservation name; the cluster has no default_reservation")
    if not _RESERVATION.match(spec.reservation):
        raise PortError(INVALID, f"node pool {spec.name}: reservation {spec.reservation!r} is "
                                 "neither a reservation name nor "
                                 "projects/OWNER/reservations/NAME[/reservationBlocks/B"
                                 "[/reservationSubBlocks/SB]]")
    return container_v1.ReservationAffinity(
        consume_reservation_type=kind.SPECIFIC_RESERVATION,
        key=RESERVATION_NAME_KEY,
        values=[spec.reservation],
    )


def _check_label(pool: str, key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    valid_key = bool(_LABEL_NAME.match(name)) and (
        not prefix or (len(prefix) <= 253 and bool(_LABEL_PREFIX.match(prefix)))
    )
    if not valid_key:
        raise PortError(INVALID, f"node pool {pool}: label key {key!r} is not a valid "
                                 "Kubernetes label key")
    if not _LABEL_VALUE.match(value):
        raise PortError(INVALID, f"node pool {pool}: label {key}={value!r} is not a valid "
                                 "Kubernetes label value (at most 63 letters, digits, '-', "
                                 "'_' or '.', starting and ending with a letter or digit)")


def labels_of(pool: container_v1.NodePool) -> dict[str, str]:
    """The labels a pool carries: node labels, falling back to GCE resource labels."""
    return {**dict(pool.config.resource_labels), **dict(pool.config.labels)}


def status_name(pool: container_v1.NodePool) -> str:
    return container_v1.NodePool.Status(pool.status).name


def status_message(pool: container_v1.NodePool) -> str:
    parts = [condition.message for condition in pool.conditions if condition.message]
    if pool.status_message and pool.status_message not in parts:
        parts.insert(0, pool.status_message)
    return "; ".join(parts)


def target_node_count(pool: container_v1.NodePool) -> int:
    """The size the pool is meant to reach: the autoscaling ceiling when it has one.
    ``initial_node_count`` and ``max_node_count`` count per zone, so a pool spread over a
    regional cluster's three zones is three times their size."""
    autoscaling = pool.autoscaling
    zones = max(len(pool.locations), 1)
    if autoscaling.enabled:
        return max(autoscaling.total_max_node_count, autoscaling.max_node_count * zones,
                   pool.initial_node_count * zones)
    return pool.initial_node_count * zones
