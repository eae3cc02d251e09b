"""Are a cluster's TPU pools exposed to automatic node upgrades? (``falcon-es doctor``)

A node upgrade drains and recreates a node; on a multi-host TPU slice that recreates the
whole slice and restarts the task's run (the pods are recreated: see
docs/design-notes/disruptions.md). GKE holds upgrades off in three ways, read here
from ``get_cluster`` and ``list_node_pools``:

- a cluster outside every release channel: node auto-upgrade is a pool setting, and
  Falcon creates its pools with it off (``pools.node_pool``);
- on a release channel, where node auto-upgrade cannot be off ("Auto-upgrading
  nodes"): a cluster maintenance exclusion of scope ``NO_MINOR_OR_NODE_UPGRADES`` (what
  Google's TPU blueprints set, cluster-toolkit ``gke-tpu-v6e.yaml``) or
  ``NO_UPGRADES`` in force now;
- or the pool's own exclusion until the end of support
  (``NodePool.maintenance_policy.exclusion_until_end_of_support``), which Falcon sets
  on the pools it creates on such a cluster (``FALCON_POOL_UPGRADE_EXCLUSION``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from google.cloud import container_v1

from falcon_es.adapters.gcp.pools import MANAGED_BY_KEY, MANAGED_BY_VALUE

Scope = container_v1.MaintenanceExclusionOptions.Scope
#: Exclusion scopes that keep node pools from being upgraded.
NODE_UPGRADE_SCOPES = frozenset({Scope.NO_UPGRADES, Scope.NO_MINOR_OR_NODE_UPGRADES})


@dataclasses.dataclass(frozen=True)
class Exposure:
    """The verdict: exposed or not, what was found, and the fix when exposed."""

    exposed: bool
    found: str
    fix: str = ""


def upgrade_exposure(gke: container_v1.Cluster, pools: Sequence[container_v1.NodePool],
                     now: dt.datetime, *, pool_exclusion: bool, command: str) -> Exposure:
    """Whether the TPU pools Falcon has and will create on ``gke`` can be upgraded
    under running work. ``command`` is the cluster's ``gcloud container clusters
    update`` prefix, for the fix."""
    fix = (f"{command} --add-maintenance-exclusion-name=falcon-tpu "
           "--add-maintenance-exclusion-start=NOW --add-maintenance-exclusion-end=END "
           "--add-maintenance-exclusion-scope=no_minor_or_node_upgrades (what Google's TPU "
           "blueprints set; renew it before END)")
    ours = [p for p in pools if p.config.labels.get(MANAGED_BY_KEY) == MANAGED_BY_VALUE]
    channel = gke.release_channel.channel
    if channel == container_v1.ReleaseChannel.Channel.UNSPECIFIED:
        upgraded = sorted(p.name for p in ours if p.management.auto_upgrade)
        if upgraded:
            return Exposure(True, f"no release channel, but Falcon's pool(s) {', '.join(upgraded)} "
                                  "have node auto-upgrade on (created before it was turned off)",
                            "gcloud container node-pools update POOL --no-enable-autoupgrade "
                            f"for each (cluster {gke.name})")
        return Exposure(False, "no release channel: Falcon creates its TPU pools with node "
                               "auto-upgrade off")
    name = container_v1.ReleaseChannel.Channel(channel).name
    held = _cluster_exclusion(gke, now)
    if held is not None:
        return Exposure(False, f"release channel {name}: node upgrades held by the cluster's "
                               f"maintenance exclusion {held}")
    bare = sorted(p.name for p in ours
                  if not p.maintenance_policy.exclusion_until_end_of_support.enabled)
    if bare:
        return Exposure(True, f"release channel {name} (node auto-upgrade cannot be off) and no "
                              "cluster maintenance exclusion of node upgrades in force: "
                              f"Falcon's pool(s) {', '.join(bare)} can be upgraded under "
                              "running work", fix)
    if not pool_exclusion:
        return Exposure(True, f"release channel {name}, no cluster maintenance exclusion of node "
                              "upgrades in force, and FALCON_POOL_UPGRADE_EXCLUSION is off: "
                              "the TPU pools Falcon creates can be upgraded under running work",
                        fix)
    return Exposure(False, f"release channel {name}: each TPU pool Falcon creates carries its own "
                           "maintenance exclusion until end of support "
                           "(FALCON_POOL_UPGRADE_EXCLUSION); no cluster-wide exclusion is in force")


def _cluster_exclusion(gke: container_v1.Cluster, now: dt.datetime) -> str | None:
    """The cluster maintenance exclusion holding node upgrades off at ``now``, named
    with its scope and end, or None."""
    exclusions = gke.maintenance_policy.window.maintenance_exclusions
    for key, window in sorted(exclusions.items()):
        scope = window.maintenance_exclusion_options.scope
        if scope not in NODE_UPGRADE_SCOPES:
            continue
        start, end = _moment(window.start_time), _moment(window.end_time)
        if (start is None or start <= now) and (end is None or now < end):
            until = f" until {end.isoformat()}" if end is not None else ""
            return f"{key} ({Scope(scope).name}{until})"
    return None


def _moment(value: object) -> dt.datetime | None:
    """A TimeWindow bound as an aware datetime (proto-plus gives one; unset is None)."""
    if not isinstance(value, dt.datetime) or value.timestamp() <= 0:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
