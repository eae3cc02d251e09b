"""The GKE NodePools adapter through the real google-cloud-container client.

Every test runs twice, once per transport (REST/JSON and gRPC), against the local
fake in ``tests/fakes/gke_server.py``: what the fake receives is what the library put
on the wire, and what the adapter maps is what the library raised.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1

from falcon_es.adapters.gcp import errors, pools
from falcon_es.adapters.gcp.compute import WorkloadPolicies
from falcon_es.adapters.gcp.gke import GkeNodePools, cluster_manager_client
from falcon_es.adapters.sim.common import COMPACT_ZONES_WORDS
from falcon_es.domain.ports import (
    ALREADY_EXISTS,
    FAILED,
    INVALID,
    NOT_FOUND,
    PERMISSION_DENIED,
    QUOTA_EXCEEDED,
    RETRYABLE,
    STOCKOUT,
    NodePoolSpec,
    PortError,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.tpu import slice_shape
from tests.fakes import compute_server, gke_server

PROJECT, ZONE, NAME = "proj-a", "us-east5-b", "edge-a"
CLUSTER = Cluster("c-1", NAME, PROJECT, ZONE, "v6e", "bucket-a", "res-1", "active",
                  dt.datetime(2026, 11, 1))
CLUSTER_PATH = f"projects/{PROJECT}/locations/{ZONE}/clusters/{NAME}"
Affinity = container_v1.ReservationAffinity.Type


@pytest.fixture(params=["rest", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake() -> gke_server.FakeGke:
    server = gke_server.FakeGke()
    server.add_cluster(PROJECT, ZONE, NAME)
    return server


@pytest.fixture
def endpoint(fake: gke_server.FakeGke, transport: str) -> Iterator[str]:
    serve = gke_server.serve_rest if transport == "rest" else gke_server.serve_grpc
    with serve(fake) as address:
        yield address


@pytest.fixture
def node_pools(endpoint: str, transport: str) -> Iterator[GkeNodePools]:
    adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=endpoint,
                           transport=transport)
    yield adapter
    adapter.close()


def spec(tpu_type: str = "v6e", topology: str = "2x2", supply_mode: str = "reservation", *,
         reservation: str | None = "res-1", name: str = "falcon-t1", task: str = "job-42",
         scale_down: int = 600, cluster: Cluster = CLUSTER) -> NodePoolSpec:
    return NodePoolSpec(cluster, name, slice_shape(tpu_type, topology), supply_mode,
                        reservation, scale_down, {"falcon-task": task},
                        locations=(cluster.node_zone,) if cluster.node_zone else ())


def sent_pool(fake: gke_server.FakeGke) -> container_v1.NodePool:
    (request,) = fake.calls_of("CreateNodePool")
    assert request.parent == CLUSTER_PATH
    return request.node_pool


# -- translation: what GKE receives ------------------------------------------------


def test_single_host_reservation_pool_as_gke_receives_it(node_pools, fake):
    node_pools.create(spec("v6e", "2x2", "reservation", scale_down=600))

    pool = sent_pool(fake)
    assert pool.name == "falcon-t1"
    assert pool.config.machine_type == "ct6e-standard-4t"
    assert pool.initial_node_count == 1
    assert list(pool.locations) == [ZONE]
    assert "placement_policy" not in pool
    affinity = pool.config.reservation_affinity
    assert affinity.consume_reservation_type == Affinity.SPECIFIC_RESERVATION
    assert affinity.key == "compute.googleapis.com/reservation-name"
    assert list(affinity.values) == ["res-1"]
    # a fixed-size pool does not autoscale: a consolidation delay could not act on it
    assert "consolidation_delay" not in pool.config
    assert "max_pods_constraint" not in pool  # single-host: GKE's default
    assert "flex_start" not in pool.config
    assert not pool.autoscaling.enabled
    assert dict(pool.config.labels) == {
        "managed-by": "falcon", "falcon-task": "job-42", "falcon-topology": "2x2",
        "falcon-supply-mode": "reservation", "falcon-tpu-type": "v6e",
    }
    assert dict(pool.config.resource_labels) == dict(pool.config.labels)
    assert pool.config.workload_metadata_config.mode == (
        container_v1.WorkloadMetadataConfig.Mode.GKE_METADATA)


def test_pool_never_declares_the_tpu_taint_gke_adds_itself(node_pools, fake):
    node_pools.create(spec("v6e", "4x4", "on-demand", reservation=None))

    assert list(sent_pool(fake).config.taints) == []
    assert pools.TPU_TAINT_KEY == "google.com/tpu"


@pytest.mark.parametrize(("tpu_type", "machine_type"), [
    ("v5e", "ct5lp-hightpu-8t"), ("v6e", "ct6e-standard-8t"),
])
def test_eight_chip_2x4_is_one_host_without_placement(node_pools, fake, tpu_type, machine_type):
    node_pools.create(spec(tpu_type, "2x4"))

    pool = sent_pool(fake)
    assert pool.config.machine_type == machine_type
    assert pool.initial_node_count == 1
    assert "placement_policy" not in pool


@pytest.mark.parametrize(("tpu_type", "topology", "machine_type", "nodes"), [
    ("v6e", "4x4", "ct6e-standard-4t", 4),
    ("v6e", "16x16", "ct6e-standard-4t", 64),
    ("v5e", "4x8", "ct5lp-hightpu-4t", 8),
    ("v5p", "4x4x4", "ct5p-hightpu-4t", 16),
    ("v5p", "2x2x2", "ct5p-hightpu-4t", 2),
])
def test_multi_host_pool_is_compact_with_its_topology(node_pools, fake, tpu_type, topology,
                                                      machine_type, nodes):
    node_pools.create(spec(tpu_type, topology))

    pool = sent_pool(fake)
    assert pool.config.machine_type == machine_type
    assert pool.initial_node_count == nodes
    assert pool.placement_policy.type_ == container_v1.NodePool.PlacementPolicy.Type.COMPACT
    assert pool.placement_policy.tpu_topology == topology
    assert pool.placement_policy.policy_name == ""


def test_ironwood_multi_host_uses_a_workload_policy_not_compact(node_pools, fake):
    node_pools.create(spec("v7x", "2x2x2"))

    pool = sent_pool(fake)
    assert pool.config.machine_type == "tpu7x-standard-4t"
    assert pool.initial_node_count == 2
    assert pool.placement_policy.policy_name == "falcon-v7x-2x2x2"
    assert pool.placement_policy.type_ == container_v1.NodePool.PlacementPolicy.Type.TYPE_UNSPECIFIED
    assert pool.placement_policy.tpu_topology == ""


def test_ironwood_single_host_has_no_placement(node_pools, fake):
    node_pools.create(spec("v7x", "2x2x1"))

    pool = sent_pool(fake)
    assert pool.initial_node_count == 1
    assert "placement_policy" not in pool


def test_ironwood_workload_policy_is_created_once_in_the_cluster_region(endpoint, transport, fake):
    compute = compute_server.FakeCompute()
    with compute_server.serve_rest(compute) as compute_endpoint:
        policies = WorkloadPolicies(credentials=AnonymousCredentials(),
                                    api_endpoint=compute_endpoint)
        adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=endpoint,
                               transport=transport, workload_policies=policies)
        try:
            adapter.create(spec("v7x", "4x4x4", name="falcon-a"))
            fake.finish_operations()
            adapter.create(spec("v7x", "4x4x4", name="falcon-b"))
        finally:
            adapter.close()
            policies.close()

    policy = compute.policies[(PROJECT, "us-east5", "falcon-v7x-4x4x4")]
    assert policy.workload_policy.type_ == "HIGH_THROUGHPUT"
    assert policy.workload_policy.accelerator_topology == "4x4x4"
    assert len(compute.calls_of("policy-insert")) == 1
    assert [r.node_pool.placement_policy.policy_name for r in fake.calls_of("CreateNodePool")] == [
        "falcon-v7x-4x4x4", "falcon-v7x-4x4x4"]


def test_flex_start_pool_autoscales_from_zero_with_location_policy_any(node_pools, fake):
    node_pools.create(spec("v6e", "4x4", "flex-start", reservation=None, scale_down=6 * 3600))

    pool = sent_pool(fake)
    assert pool.config.flex_start is True
    assert pool.initial_node_count == 0
    assert pool.autoscaling.enabled
    assert pool.autoscaling.min_node_count == 0
    assert pool.autoscaling.max_node_count == 4
    assert pool.autoscaling.location_policy == container_v1.NodePoolAutoscaling.LocationPolicy.ANY
    assert pool.config.reservation_affinity.consume_reservation_type == Affinity.NO_RESERVATION
    assert list(pool.config.reservation_affinity.values) == []
    assert pool.management.auto_repair is False
    # the fake cluster is on the REGULAR channel: upgrades stay on, held off per pool
    assert pool.management.auto_upgrade is True
    assert pool.maintenance_policy.exclusion_until_end_of_support.enabled is True
    assert pool.config.consolidation_delay == dt.timedelta(hours=6)
    assert pool.config.labels["falcon-supply-mode"] == "flex-start"


def test_multi_host_pools_hold_upgrades_off_and_cap_pods_per_node(node_pools, fake):
    """Repairs stay on for a fixed-size pool; on a release channel auto-upgrade cannot
    be off, so the pool carries GKE's per-pool maintenance exclusion; 15 pods per node
    (xpk's setting) instead of the default 110, which takes a /24 per node."""
    node_pools.create(spec("v6e", "4x4", "reservation"))

    pool = sent_pool(fake)
    assert (pool.management.auto_repair, pool.management.auto_upgrade) == (True, True)
    assert pool.maintenance_policy.exclusion_until_end_of_support.enabled is True
    assert pool.max_pods_constraint.max_pods_per_node == 15
    assert len(fake.calls_of("GetCluster")) == 1


def test_without_a_release_channel_auto_upgrade_is_off(transport):
    fake = gke_server.FakeGke()
    fake.add_cluster(PROJECT, ZONE, NAME, release_channel="")
    serve = gke_server.serve_rest if transport == "rest" else gke_server.serve_grpc
    with serve(fake) as address:
        adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=address,
                               transport=transport)
        try:
            adapter.create(spec("v6e", "4x4", "flex-start", reservation=None))
            fake.finish_operations()
            adapter.create(spec("v6e", "4x4", "reservation", name="falcon-t2"))
        finally:
            adapter.close()
    flex, reserved = (r.node_pool for r in fake.calls_of("CreateNodePool"))
    assert (flex.management.auto_upgrade, flex.management.auto_repair) == (False, False)
    assert (reserved.management.auto_upgrade, reserved.management.auto_repair) == (False, True)
    assert "maintenance_policy" not in flex and "maintenance_policy" not in reserved
    assert len(fake.calls_of("GetCluster")) == 1  # the channel is read once per cluster


def test_the_fake_refuses_auto_upgrade_off_on_a_release_channel(node_pools, fake):
    """Why the adapter reads the channel: GKE keeps auto-upgrade on there."""
    pool = pools.node_pool(spec("v6e", "4x4"), release_channel=False)
    with pytest.raises(gke_server.ApiError, match="Auto_upgrade cannot be false"):
        gke_server.refuse_disabled_upgrades(fake.clusters[CLUSTER_PATH], pool)


def test_on_demand_pool_consumes_no_reservation(node_pools, fake):
    node_pools.create(spec("v6e", "4x4", "on-demand", reservation=None))

    pool = sent_pool(fake)
    assert pool.config.reservation_affinity.consume_reservation_type == Affinity.NO_RESERVATION
    assert pool.initial_node_count == 4
    assert "flex_start" not in pool.config
    assert not pool.autoscaling.enabled


@pytest.mark.parametrize("reservation", [
    "projects/owner-proj/reservations/shared-res",
    "projects/owner-proj/reservations/shared-res/reservationBlocks/block-1",
    "shared-res/reservationBlocks/block-1/reservationSubBlocks/sub-2",
])
def test_shared_and_block_reservation_paths_go_through_verbatim(node_pools, fake, reservation):
    node_pools.create(spec(reservation=reservation))

    assert list(sent_pool(fake).config.reservation_affinity.values) == [reservation]


def test_rest_body_carries_enums_as_integers(fake):
    with gke_server.serve_rest(fake) as address:
        adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=address,
                               transport="rest")
        try:
            adapter.create(spec("v6e", "4x4", "flex-start", reservation=None))
        finally:
            adapter.close()

    (body,) = fake.raw_bodies
    assert body["nodePool"]["config"]["reservationAffinity"]["consumeReservationType"] == 1  # NO_RESERVATION
    assert body["nodePool"]["placementPolicy"] == {"type": 1, "tpuTopology": "4x4"}
    assert body["nodePool"]["config"]["consolidationDelay"] == "600s"
    assert body["nodePool"]["maxPodsConstraint"] == {"maxPodsPerNode": "15"}
    assert body["nodePool"]["maintenancePolicy"] == {
        "exclusionUntilEndOfSupport": {"enabled": True}}


@pytest.mark.parametrize(("bad", "words"), [
    (spec(reservation=None), "needs a reservation name"),
    (spec(reservation="Bad Name!"), "is neither a reservation name"),
    (spec(supply_mode="spot"), "supply mode 'spot'"),
    (spec(task="not valid/label"), "falcon-task='not valid/label' is not a valid"),
    (spec(scale_down=-1), "is negative"),
])
def test_bad_specs_are_refused_before_any_call(node_pools, fake, bad, words):
    with pytest.raises(PortError) as refused:
        node_pools.create(bad)

    assert refused.value.code == INVALID
    assert words in refused.value.message
    assert "falcon-t1" in refused.value.message
    assert fake.calls_of("CreateNodePool") == []


def test_gce_resource_labels_are_folded_node_labels_kept_exactly(node_pools, fake):
    node_pools.create(spec(task="Job_42.A"))

    pool = sent_pool(fake)
    assert pool.config.labels["falcon-task"] == "Job_42.A"
    assert pool.config.resource_labels["falcon-task"] == "job_42_a"


# -- regional and zonal clusters (docs/FIDELITY.md) ---------------------------------

REGION, RNAME = "us-east5", "edge-r"
REGIONAL = Cluster("c-2", RNAME, PROJECT, REGION, "v6e", "bucket-a", "res-1", "active",
                   dt.datetime(2026, 11, 1), node_location=ZONE)
REGIONAL_PATH = f"projects/{PROJECT}/locations/{REGION}/clusters/{RNAME}"


def test_regional_cluster_is_addressed_by_its_region_and_its_pool_is_in_the_node_zone(
        node_pools, fake):
    fake.add_cluster(PROJECT, REGION, RNAME)

    started = node_pools.create(spec("v6e", "4x4", cluster=REGIONAL))
    node_pools.get_operation(REGIONAL, started.id)
    info = node_pools.get(REGIONAL, "falcon-t1")

    (request,) = fake.calls_of("CreateNodePool")
    assert request.parent == REGIONAL_PATH
    assert list(request.node_pool.locations) == [ZONE]
    assert request.node_pool.placement_policy.tpu_topology == "4x4"
    assert fake.calls_of("GetOperation")[0].name.startswith(
        f"projects/{PROJECT}/locations/{REGION}/operations/")
    assert (info.status, info.node_count) == ("RUNNING", 4)


def test_a_pool_without_locations_spreads_over_the_regional_clusters_zones(node_pools, fake):
    """What one ``location`` field did to a regional cluster: no ``locations`` on the
    pool, so GKE puts a node group in each of the region's three zones."""
    fake.add_cluster(PROJECT, REGION, RNAME)
    unplaced = dataclasses.replace(spec("v6e", "2x2", cluster=REGIONAL), locations=())

    node_pools.create(unplaced)
    fake.finish_operations()

    info = node_pools.get(REGIONAL, "falcon-t1")
    assert info.node_count == 3
    assert list(fake.pools[f"{REGIONAL_PATH}/nodePools/falcon-t1"].locations) == [
        "us-east5-a", "us-east5-b", "us-east5-c"]


def test_compact_placement_over_the_regional_clusters_zones_is_refused(node_pools, fake):
    fake.add_cluster(PROJECT, REGION, RNAME)
    unplaced = dataclasses.replace(spec("v6e", "4x4", cluster=REGIONAL), locations=())

    with pytest.raises(PortError) as refused:
        node_pools.create(unplaced)

    assert refused.value.code == INVALID
    assert COMPACT_ZONES_WORDS in refused.value.message
    assert fake.pools.keys() == {f"{CLUSTER_PATH}/nodePools/default-pool",
                                 f"{REGIONAL_PATH}/nodePools/default-pool"}


def test_a_regional_cluster_addressed_by_its_node_zone_is_not_found(node_pools, fake):
    """Registered with the zone instead of the region: GKE answers 404."""
    fake.add_cluster(PROJECT, REGION, RNAME)
    by_zone = dataclasses.replace(REGIONAL, location=ZONE)

    with pytest.raises(PortError) as missing:
        node_pools.create(spec(cluster=by_zone))

    assert missing.value.code == NOT_FOUND
    assert f"projects/{PROJECT}/locations/{ZONE}/clusters/{RNAME}" in missing.value.message


def test_a_node_zone_outside_the_clusters_region_is_refused(node_pools, fake):
    fake.add_cluster(PROJECT, REGION, RNAME)
    elsewhere = dataclasses.replace(spec(cluster=REGIONAL), locations=("us-central1-a",))

    with pytest.raises(PortError) as refused:
        node_pools.create(elsewhere)

    assert refused.value.code == INVALID
    assert "us-central1-a are not in the cluster's region us-east5" in refused.value.message


# -- operations ---------------------------------------------------------------------


def test_create_is_followed_with_get_operation_until_done(endpoint, transport, fake):
    fake.polls_until_done = 3
    adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=endpoint,
                           transport=transport)
    try:
        started = adapter.create(spec("v6e", "4x4"))
        polls = [adapter.get_operation(CLUSTER, started.id) for _ in range(3)]
        info = adapter.get(CLUSTER, "falcon-t1")
    finally:
        adapter.close()

    assert not started.done
    assert [p.done for p in polls] == [False, False, True]
    assert polls[-1].error is None and polls[-1].error_code is None
    assert fake.calls_of("GetOperation")[0].name == (
        f"projects/{PROJECT}/locations/{ZONE}/operations/{started.id}")
    assert info.status == "RUNNING"
    assert info.node_count == 4
    assert info.cluster_name == NAME
    assert info.labels["falcon-task"] == "job-42"
    assert info.labels["managed-by"] == "falcon"


def test_stockout_operation_fails_with_gke_words(node_pools, fake):
    fake.fail_next_create_operation("stockout")
    started = node_pools.create(spec("v6e", "4x4"))

    done = node_pools.get_operation(CLUSTER, started.id)
    info = node_pools.get(CLUSTER, "falcon-t1")

    assert done.done
    assert done.error_code == STOCKOUT
    assert "[GCE_STOCKOUT]" in done.error
    assert f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources" in done.error
    assert info.status == "ERROR"
    assert "does not have enough resources" in info.status_message


def test_quota_operation_fails_with_gke_words(node_pools, fake):
    fake.fail_next_create_operation("quota")
    started = node_pools.create(spec("v6e", "4x4", "on-demand", reservation=None))

    done = node_pools.get_operation(CLUSTER, started.id)

    assert done.done
    assert done.error_code == QUOTA_EXCEEDED
    assert done.error.startswith("Insufficient quota to satisfy the request")
    assert "Quota 'TPU_V6E_PODSLICE_CHIPS' exceeded" in done.error


def test_stockout_known_only_from_the_pool_condition(node_pools, fake):
    fake.fail_next_create_operation("stockout-condition-only")
    started = node_pools.create(spec("v6e", "4x4"))

    done = node_pools.get_operation(CLUSTER, started.id)

    assert done.error_code == STOCKOUT
    assert done.error.startswith("Node pool creation failed; see conditions.")
    assert "does not have enough resources available" in done.error


def test_unknown_operation_is_not_found(node_pools):
    with pytest.raises(PortError) as missing:
        node_pools.get_operation(CLUSTER, "operation-0-nope")

    assert missing.value.code == NOT_FOUND
    assert "operation-0-nope" in missing.value.message


# -- errors on calls ----------------------------------------------------------------


def test_existing_pool_is_already_exists_and_get_shows_whose_it_is(node_pools, fake):
    node_pools.create(spec())
    fake.finish_operations()

    with pytest.raises(PortError) as exists:
        node_pools.create(spec())
    owner = node_pools.get(CLUSTER, "falcon-t1").labels

    assert exists.value.code == ALREADY_EXISTS
    assert "Already exists" in exists.value.message
    assert owner["managed-by"] == "falcon" and owner["falcon-task"] == "job-42"


def test_concurrent_operation_is_retryable_and_arrives_as_plain_bad_request_over_rest(
        node_pools, fake, transport):
    node_pools.create(spec(name="falcon-a"))

    with pytest.raises(PortError) as busy:
        node_pools.create(spec(name="falcon-b"))
    fake.finish_operations()
    retried = node_pools.create(spec(name="falcon-b"))

    assert busy.value.code == RETRYABLE
    assert "Please wait and try again once it is done." in busy.value.message
    raised = type(busy.value.__cause__)
    assert raised is (gexc.BadRequest if transport == "rest" else gexc.FailedPrecondition)
    assert not retried.done


def test_delete_during_a_running_create_is_retryable(node_pools):
    node_pools.create(spec())

    with pytest.raises(PortError) as busy:
        node_pools.delete(CLUSTER, "falcon-t1")

    assert busy.value.code == RETRYABLE
    assert "is currently creating node pool falcon-t1" in busy.value.message


@pytest.mark.parametrize(("status", "message", "code"), [
    ("RESOURCE_EXHAUSTED", 'Too many operations: cluster "edge-a" hits the concurrent '
                           "operations quota 5, please try again later.", RETRYABLE),
    ("RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Write requests' and limit "
                           "'Write requests per minute' of service 'container.googleapis.com'",
     RETRYABLE),
    ("PERMISSION_DENIED", 'Insufficient regional quota to satisfy request: resource '
                          '"TPU_V6E_PODSLICE_CHIPS": request requires \'16.0\' and is short '
                          "'16.0'.", QUOTA_EXCEEDED),
    ("PERMISSION_DENIED", "Required 'container.clusters.update' permission for "
                          f"'{CLUSTER_PATH}'.", PERMISSION_DENIED),
    ("INVALID_ARGUMENT", "Machine type \"ct6e-standard-4t\" is not supported in zone.", INVALID),
    ("FAILED_PRECONDITION", "Cluster is running incompatible operation operation-17.", RETRYABLE),
    ("FAILED_PRECONDITION", "Workload Identity must be enabled on the cluster.", INVALID),
    ("UNAVAILABLE", "The service is currently unavailable.", RETRYABLE),
    ("ABORTED", "The operation was aborted.", RETRYABLE),
])
def test_call_errors_map_to_port_codes_with_gke_words(node_pools, fake, status, message, code):
    fake.fail_next("CreateNodePool", status, message)

    with pytest.raises(PortError) as refused:
        node_pools.create(spec())

    assert refused.value.code == code
    assert refused.value.message.endswith(message)
    assert refused.value.message.startswith(
        f"create node pool falcon-t1 in cluster {NAME} (project {PROJECT}, location {ZONE}): ")


def test_create_visibility_window_then_the_pool_appears(node_pools, fake):
    fake.hide_next_created_pool(gets=2)
    node_pools.create(spec("v6e", "4x4", "flex-start", reservation=None))

    codes = []
    for _ in range(2):
        with pytest.raises(PortError) as hidden:
            node_pools.get(CLUSTER, "falcon-t1")
        codes.append(hidden.value.code)
    info = node_pools.get(CLUSTER, "falcon-t1")

    assert codes == [NOT_FOUND, NOT_FOUND]
    assert info.name == "falcon-t1"
    assert info.status == "PROVISIONING"
    assert info.node_count == 4  # the autoscaling ceiling of a flex pool that starts at 0


def test_get_missing_pool_is_not_found_with_where(node_pools):
    with pytest.raises(PortError) as missing:
        node_pools.get(CLUSTER, "falcon-nope")

    assert missing.value.code == NOT_FOUND
    assert missing.value.message == (
        f"node pool falcon-nope not found in cluster {NAME} (project {PROJECT}, location {ZONE})")


def test_delete_follows_to_gone_and_a_second_delete_is_done(node_pools, fake):
    node_pools.create(spec())
    fake.finish_operations()

    deleting = node_pools.delete(CLUSTER, "falcon-t1")
    state_while_deleting = node_pools.get(CLUSTER, "falcon-t1").status
    finished = node_pools.get_operation(CLUSTER, deleting.id)
    again = node_pools.delete(CLUSTER, "falcon-t1")

    assert deleting is not None and not deleting.done
    assert state_while_deleting == "STOPPING"
    assert finished.done and finished.error is None
    assert again is None
    with pytest.raises(PortError) as gone:
        node_pools.get(CLUSTER, "falcon-t1")
    assert gone.value.code == NOT_FOUND


def test_list_returns_every_pool_with_labels(node_pools, fake):
    node_pools.create(spec("v6e", "4x4", name="falcon-a", task="job-1"))
    fake.finish_operations()
    node_pools.create(spec("v6e", "2x2", "flex-start", reservation=None, name="falcon-b",
                           task="job-2"))

    listed = {info.name: info for info in node_pools.list(CLUSTER)}

    assert set(listed) == {"default-pool", "falcon-a", "falcon-b"}
    assert listed["default-pool"].labels == {}
    assert listed["falcon-a"].labels["falcon-task"] == "job-1"
    assert listed["falcon-a"].status == "RUNNING"
    assert listed["falcon-b"].labels["falcon-supply-mode"] == "flex-start"
    assert listed["falcon-b"].status == "PROVISIONING"
    assert listed["falcon-b"].node_count == 1


def test_list_of_an_unknown_cluster_is_not_found(node_pools):
    other = Cluster("c-2", "edge-z", PROJECT, ZONE, "v6e", "b", None, "active",
                    dt.datetime(2026, 11, 1))
    with pytest.raises(PortError) as missing:
        node_pools.list(other)

    assert missing.value.code == NOT_FOUND
    assert "list node pools of cluster edge-z" in missing.value.message


def test_unreachable_endpoint_is_retryable(transport):
    with gke_server.serve_rest(gke_server.FakeGke()) as address:
        dead = address  # the port is closed once the server stops
    adapter = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=dead,
                           transport=transport, timeout=5)
    try:
        with pytest.raises(PortError) as down:
            adapter.create(spec())
    finally:
        adapter.close()

    assert down.value.code == RETRYABLE


def test_get_cluster_gives_endpoint_ca_and_add_ons_to_the_real_client(endpoint, transport):
    client = cluster_manager_client(credentials=AnonymousCredentials(), api_endpoint=endpoint,
                                    transport=transport)
    try:
        found = client.get_cluster(name=CLUSTER_PATH)
    finally:
        client.transport.close()

    assert found.endpoint == "10.20.30.40"
    assert found.master_auth.cluster_ca_certificate == "LS0tLS1GQUtFIENBLS0tLS0K"
    assert found.workload_identity_config.workload_pool == f"{PROJECT}.svc.id.goog"
    assert found.addons_config.gcs_fuse_csi_driver_config.enabled


# -- credentials and construction ----------------------------------------------------


def test_production_client_uses_application_default_credentials(monkeypatch, tmp_path):
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))

    with pytest.raises(auth_exceptions.DefaultCredentialsError) as adc:
        GkeNodePools()

    assert str(missing) in str(adc.value)


def test_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="GKE transport 'http': expected one of grpc, rest"):
        cluster_manager_client(credentials=AnonymousCredentials(), transport="http")


# -- classification, without a server ----------------------------------------------


@pytest.mark.parametrize(("rpc_code", "message", "conditions", "code"), [
    (8, "Insufficient quota to satisfy the request: [GCE_QUOTA_EXCEEDED] ...", (), QUOTA_EXCEEDED),
    (13, "Google Compute Engine: Not all instances running in IGM ... [GCE_STOCKOUT] ...", (),
     STOCKOUT),
    (14, "creation failed", ("GCE_STOCKOUT",), STOCKOUT),
    (2, "creation failed", ("GCE_QUOTA_EXCEEDED",), QUOTA_EXCEEDED),
    (8, "Insufficient reserved capacity. Contact customer support.", (), STOCKOUT),
    (8, "Too many operations: please try again later", (), RETRYABLE),
    (8, "resources exhausted", (), QUOTA_EXCEEDED),
    (14, "backend unavailable", (), RETRYABLE),
    (10, "aborted by a concurrent update", (), RETRYABLE),
    (9, "Operation operation-1 is currently upgrading cluster edge-a. Please wait and try "
        "again once it is done.", (), RETRYABLE),
    (9, "Node auto-repair must be off", (), INVALID),
    (3, "Invalid machine type", (), INVALID),
    (7, "Permission denied on resource policy", (), PERMISSION_DENIED),
    (2, "something unexpected", (), FAILED),
])
def test_operation_errors_are_classified(rpc_code, message, conditions, code):
    assert errors.code_for_operation_error(rpc_code, message, conditions) == code


def test_api_words_strip_the_method_and_url_prefix_of_rest_errors(node_pools, fake, transport):
    fake.fail_next("GetNodePool", "PERMISSION_DENIED", "Required 'container.nodePools.get'.")

    with pytest.raises(PortError) as denied:
        node_pools.get(CLUSTER, "falcon-t1")

    assert denied.value.code == PERMISSION_DENIED
    assert "GET http" not in denied.value.message
    assert denied.value.message.endswith(": Required 'container.nodePools.get'.")
