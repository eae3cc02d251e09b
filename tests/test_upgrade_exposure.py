"""Which clusters leave their TPU pools to automatic node upgrades
(``adapters/gcp/upgrades.py``, the verdict ``falcon-es doctor`` gives)."""

from __future__ import annotations

import datetime as dt

from google.cloud import container_v1

from falcon_es.adapters.gcp.upgrades import upgrade_exposure

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
Channel = container_v1.ReleaseChannel.Channel
Scope = container_v1.MaintenanceExclusionOptions.Scope


def cluster(channel: int = Channel.REGULAR, **exclusions: tuple[int, int, int]
            ) -> container_v1.Cluster:
    """``exclusions``: name -> (scope, start day, end day) of December 2026."""
    windows = {name: container_v1.TimeWindow(
        start_time=dt.datetime(2026, 12, start, tzinfo=dt.timezone.utc),
        end_time=dt.datetime(2026, 12, end, tzinfo=dt.timezone.utc),
        maintenance_exclusion_options=container_v1.MaintenanceExclusionOptions(scope=scope))
        for name, (scope, start, end) in exclusions.items()}
    return container_v1.Cluster(
        name="edge", release_channel=container_v1.ReleaseChannel(channel=channel),
        maintenance_policy=container_v1.MaintenancePolicy(window=container_v1.MaintenanceWindow(
            maintenance_exclusions=windows)))


def pool(name: str, *, upgrade: bool, exclusion: bool = False,
         ours: bool = True) -> container_v1.NodePool:
    message = container_v1.NodePool(
        name=name, config=container_v1.NodeConfig(labels={"managed-by": "falcon"} if ours else {}),
        management=container_v1.NodeManagement(auto_upgrade=upgrade))
    if exclusion:
        message.maintenance_policy = container_v1.NodePool.NodePoolMaintenancePolicy(
            exclusion_until_end_of_support=container_v1.NodePool.ExclusionUntilEndOfSupport(
                enabled=True))
    return message


def verdict(gke: container_v1.Cluster, pools: list[container_v1.NodePool],
            pool_exclusion: bool = True) -> tuple[bool, str]:
    found = upgrade_exposure(gke, pools, NOW, pool_exclusion=pool_exclusion, command="gcloud x")
    return found.exposed, found.found


def test_a_cluster_exclusion_of_node_upgrades_in_force_holds_them() -> None:
    gke = cluster(tpu=(Scope.NO_MINOR_OR_NODE_UPGRADES, 1, 20))
    exposed, found = verdict(gke, [pool("falcon-a", upgrade=True)], pool_exclusion=False)
    assert not exposed and "tpu (NO_MINOR_OR_NODE_UPGRADES until 2026-12-20" in found


def test_an_exclusion_of_minor_upgrades_only_or_out_of_its_window_does_not() -> None:
    for gke in (cluster(minor=(Scope.NO_MINOR_UPGRADES, 1, 20)),
                cluster(old=(Scope.NO_MINOR_OR_NODE_UPGRADES, 1, 1))):
        exposed, found = verdict(gke, [pool("falcon-a", upgrade=True)])
        assert exposed and "falcon-a can be upgraded under running work" in found


def test_pools_with_their_own_exclusion_are_held_and_others_are_not_ours() -> None:
    pools = [pool("falcon-a", upgrade=True, exclusion=True),
             pool("default-pool", upgrade=True, ours=False)]
    assert verdict(cluster(), pools) == (False, (
        "release channel REGULAR: each TPU pool Falcon creates carries its own maintenance "
        "exclusion until end of support (FALCON_POOL_UPGRADE_EXCLUSION); no cluster-wide "
        "exclusion is in force"))
    assert verdict(cluster(), pools, pool_exclusion=False)[0]


def test_without_a_release_channel_only_auto_upgrade_on_exposes_a_pool() -> None:
    gke = cluster(Channel.UNSPECIFIED)
    assert not verdict(gke, [pool("falcon-a", upgrade=False)])[0]
    exposed, found = verdict(gke, [pool("falcon-old", upgrade=True)])
    assert exposed and "falcon-old have node auto-upgrade on" in found
