"""The Compute Reservations adapter through the real google-cloud-compute client.

The client speaks REST to the local fake in ``tests/fakes/compute_server.py``; counts
travel as Compute sends them (int64 as JSON strings), so the VM-vs-chip arithmetic is
checked on what the library actually parses.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials

from falcon_es.adapters.gcp.compute import ComputeReservations, WorkloadPolicies
from falcon_es.domain.ports import (
    INVALID, NOT_FOUND, PERMISSION_DENIED, RETRYABLE, PortError, ReservationCapacity,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.tpu import slice_shape
from tests.fakes.compute_server import FakeCompute, ending, serve_rest

PROJECT, ZONE = "proj-a", "us-east5-b"
CLUSTER = Cluster("c-1", "edge-a", PROJECT, ZONE, "v6e", "bucket-a", "res-1", "active",
                  dt.datetime(2026, 11, 1))
CT6E = "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E"


@pytest.fixture
def fake() -> FakeCompute:
    return FakeCompute()


@pytest.fixture
def endpoint(fake: FakeCompute) -> Iterator[str]:
    with serve_rest(fake) as address:
        yield address


@pytest.fixture
def reservations(endpoint: str) -> Iterator[ComputeReservations]:
    adapter = ComputeReservations(credentials=AnonymousCredentials(), api_endpoint=endpoint)
    yield adapter
    adapter.close()


@pytest.fixture
def policies(endpoint: str) -> Iterator[WorkloadPolicies]:
    adapter = WorkloadPolicies(credentials=AnonymousCredentials(), api_endpoint=endpoint)
    yield adapter
    adapter.close()


# -- specific-SKU reservations: counts are VMs ---------------------------------------


@pytest.mark.parametrize(("topology", "count", "in_use", "slices"), [
    ("4x4", 16, 5, 2),    # 11 free VMs, 4 per slice
    ("2x2", 16, 5, 11),   # single host: one VM per slice
    ("16x16", 64, 0, 1),
    ("16x16", 64, 1, 0),
    ("4x4", 4, 9, 0),     # more in use than reserved (resized down): never negative
])
def test_specific_reservation_counts_free_vms_per_slice(reservations, fake, topology, count,
                                                        in_use, slices):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=count,
                      in_use=in_use)

    assert reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", topology)) == slices


def test_specific_reservation_of_another_machine_type_is_refused(reservations, fake):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=0)

    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", "2x4"))

    assert refused.value.code == INVALID
    assert refused.value.message == (
        f"reservation res-1 in project {PROJECT} zone {ZONE} reserves ct6e-standard-4t VMs; "
        "a v6e 2x4 pool needs ct6e-standard-8t")


def test_the_machine_type_a_reservation_holds_is_read_for_the_2x4_choice(reservations, fake):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=0)
    fake.add_aggregate(PROJECT, ZONE, "agg", vm_family=CT6E, reserved={"ct6e": 64},
                       in_use={"ct6e": 0})

    assert reservations.capacity(CLUSTER, "res-1").machine_type == "ct6e-standard-4t"
    assert reservations.capacity(CLUSTER, "agg").machine_type is None  # chips of a family
    shape = slice_shape("v6e", "2x4", "ct6e-standard-4t")
    assert reservations.remaining_slices(CLUSTER, "res-1", shape) == 4


def test_capacity_is_the_specific_reservations_machine_type_and_count(reservations, fake):
    """What never-fits is decided from: whatever is in use."""
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=8)
    fake.add_aggregate(PROJECT, ZONE, "agg", vm_family=CT6E, reserved={"ct6e": 64}, in_use={})

    assert reservations.capacity(CLUSTER, "res-1") == ReservationCapacity("ct6e-standard-4t", 8)
    assert reservations.capacity(CLUSTER, "agg") == ReservationCapacity()  # counts chips


# -- calendar-mode reservations: their end -----------------------------------------


@pytest.mark.parametrize(("end", "ends_at"), [
    (ending(delete_at_time="2026-12-09T08:00:00Z"), dt.datetime(2026, 12, 9, 8)),
    (ending(delete_at_time="2026-12-09T00:00:00.000-08:00"), dt.datetime(2026, 12, 9, 8)),
    (ending(delete_after_seconds=7 * 86400, created="2026-12-02T08:00:00.000-00:00"),
     dt.datetime(2026, 12, 9, 8)),
    (ending(delete_after_seconds=3600), None),  # a duration without its start: unknown
    (None, None),
])
def test_capacity_reads_when_compute_deletes_the_reservation(reservations, fake, end, ends_at):
    """``deleteAtTime`` or ``deleteAfterDuration`` after ``creationTimestamp``, as the
    official client parses what Compute sends; naive UTC like the controller's clock."""
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8,
                      in_use=0, end=end)

    assert reservations.capacity(CLUSTER, "res-1") == ReservationCapacity(
        "ct6e-standard-4t", 8, ends_at)


def test_a_reservation_deleted_at_its_end_reads_not_found(reservations, fake):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8,
                      in_use=0, end=ending(delete_at_time="2026-12-09T08:00:00Z"))
    fake.remove(PROJECT, ZONE, "res-1")

    with pytest.raises(PortError) as gone:
        reservations.capacity(CLUSTER, "res-1")

    assert gone.value.code == NOT_FOUND
    assert gone.value.message == f"reservation res-1 not found in project {PROJECT} zone {ZONE}"


def test_shared_reservation_is_read_in_the_owner_project(reservations, fake):
    fake.add_specific("owner-proj", ZONE, "shared", machine_type="tpu7x-standard-4t", count=32,
                      in_use=8)

    slices = reservations.remaining_slices(CLUSTER, "projects/owner-proj/reservations/shared",
                                           slice_shape("v7x", "4x4x4"))

    assert slices == 1
    assert fake.calls_of("reservation") == [
        f"/compute/v1/projects/owner-proj/zones/{ZONE}/reservations/shared"]


@pytest.mark.parametrize("status", ["CREATING", "DELETING"])
def test_reservation_not_yet_or_no_longer_usable_has_no_capacity(reservations, fake, status):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=16,
                      in_use=0, status=status)

    assert reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", "4x4")) == 0


# -- aggregate reservations: counts are chips -----------------------------------------


@pytest.mark.parametrize(("topology", "slices"), [("4x4", 3), ("2x2", 12), ("1x1", 48),
                                                  ("8x8", 0)])
def test_aggregate_reservation_counts_free_chips_per_slice(reservations, fake, topology, slices):
    fake.add_aggregate(PROJECT, ZONE, "agg", vm_family=CT6E, reserved={"ct6e": 64},
                       in_use={"ct6e": 16})

    assert reservations.remaining_slices(CLUSTER, "agg", slice_shape("v6e", topology)) == slices


def test_aggregate_reservation_matches_the_family_whatever_the_project_form(reservations, fake):
    fake.add_aggregate(PROJECT, ZONE, "agg", vm_family=CT6E, reserved={"ct6e": 32, "ct5p": 64},
                       in_use={"ct6e": 0, "ct5p": 64}, type_project="123456789012")

    assert reservations.remaining_slices(CLUSTER, "agg", slice_shape("v6e", "4x4")) == 2
    assert reservations.remaining_slices(CLUSTER, "agg", slice_shape("v5p", "2x2x2")) == 0


def test_aggregate_reservation_without_the_family_says_what_it_holds(reservations, fake):
    fake.add_aggregate(PROJECT, ZONE, "agg", vm_family=CT6E, reserved={"ct5p": 64, "tpu7x": 8},
                       in_use={})

    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(CLUSTER, "agg", slice_shape("v6e", "4x4"))

    assert refused.value.code == INVALID
    assert refused.value.message == (
        f"reservation agg in project {PROJECT} zone {ZONE} reserves no ct6e TPU chips "
        "(it holds: ct5p, tpu7x)")


# -- dense reservations: blocks and sub-blocks ---------------------------------------


def test_block_and_sub_block_count_their_own_free_hosts(reservations, fake):
    fake.add_specific(PROJECT, ZONE, "dense", machine_type="tpu7x-standard-4t", count=64, in_use=0)
    fake.add_block(PROJECT, ZONE, "dense", "block-1", count=32, in_use=16)
    fake.add_sub_block(PROJECT, ZONE, "dense", "block-1", "sub-1", count=16, in_use=1)
    shape = slice_shape("v7x", "2x2x4")  # 4 hosts

    whole = reservations.remaining_slices(CLUSTER, "dense", shape)
    block = reservations.remaining_slices(CLUSTER, "dense/reservationBlocks/block-1", shape)
    sub = reservations.remaining_slices(
        CLUSTER, "projects/proj-a/reservations/dense/reservationBlocks/block-1/"
                 "reservationSubBlocks/sub-1", shape)

    assert (whole, block, sub) == (16, 4, 3)
    assert fake.calls_of("sub-block") == [
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/reservations/dense/reservationBlocks/"
        "block-1/reservationSubBlocks/sub-1"]


def test_missing_block_is_not_found(reservations, fake):
    fake.add_specific(PROJECT, ZONE, "dense", machine_type="tpu7x-standard-4t", count=64, in_use=0)

    with pytest.raises(PortError) as missing:
        reservations.remaining_slices(CLUSTER, "dense/reservationBlocks/nope",
                                      slice_shape("v7x", "2x2x2"))

    assert missing.value.code == NOT_FOUND
    assert missing.value.message == (
        f"reservation dense block nope in project {PROJECT} zone {ZONE}: not found")


# -- errors ---------------------------------------------------------------------------


def test_missing_reservation_names_reservation_project_and_zone(reservations):
    with pytest.raises(PortError) as missing:
        reservations.remaining_slices(CLUSTER, "res-9", slice_shape("v6e", "4x4"))

    assert missing.value.code == NOT_FOUND
    assert missing.value.message == f"reservation res-9 not found in project {PROJECT} zone {ZONE}"


@pytest.mark.parametrize(("status", "message", "code"), [
    (403, "Required 'compute.reservations.get' permission for "
          "'projects/proj-a/zones/us-east5-b/reservations/res-1'", PERMISSION_DENIED),
    (429, "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'",
     RETRYABLE),
    (500, "Internal error. Please try again or contact Google Support.", RETRYABLE),
])
def test_call_errors_map_to_port_codes_with_compute_words(reservations, fake, status, message,
                                                          code):
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=0)
    fake.fail_next("reservation", status, message)

    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", "4x4"))

    assert refused.value.code == code
    assert refused.value.message == (
        f"reading reservation res-1 in project {PROJECT} zone {ZONE}: {message}")


def test_a_503_is_not_retried_by_the_client_but_by_the_controllers_own_backoff(
        reservations, fake):
    """The generated client would retry a 503 on its own (its method default); every
    call passes retry=None, so a failed read is one attempt, paced by FALCON_RETRY_*."""
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=0)
    fake.fail_next("reservation", 503, "Backend unavailable")

    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", "4x4"))
    assert refused.value.code == RETRYABLE
    assert len(fake.calls_of("reservation")) == 1
    assert reservations.remaining_slices(CLUSTER, "res-1", slice_shape("v6e", "4x4")) == 2


def test_regional_cluster_without_a_node_zone_is_refused_naming_the_flag(reservations, fake):
    """A regional cluster registered before the node zone was kept (node_location
    None): Compute reservations are zonal, so nothing is asked of Compute."""
    regional = Cluster("c-2", "edge-r", PROJECT, "us-east5", "v6e", "b", "res-1", "active",
                       dt.datetime(2026, 11, 1))

    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(regional, "res-1", slice_shape("v6e", "4x4"))

    assert refused.value.code == INVALID
    assert refused.value.message.startswith(
        "cluster edge-r is regional (us-east5): give the zone its TPU pools go in with "
        "--node-location ZONE")
    assert fake.calls == []


def test_regional_cluster_reads_its_reservation_in_its_node_zone(reservations, fake):
    """The cluster's location is a region; the reservation lives in the pools' zone,
    and one of the same name in another zone of the region is not read."""
    fake.add_specific(PROJECT, ZONE, "res-1", machine_type="ct6e-standard-4t", count=8, in_use=0)
    fake.add_specific(PROJECT, "us-east5-a", "res-1", machine_type="ct6e-standard-4t",
                      count=4, in_use=4)
    regional = Cluster("c-2", "edge-r", PROJECT, "us-east5", "v6e", "b", "res-1", "active",
                       dt.datetime(2026, 11, 1), node_location=ZONE)

    assert reservations.remaining_slices(regional, "res-1", slice_shape("v6e", "4x4")) == 2


def test_malformed_reference_is_refused_before_any_call(reservations, fake):
    with pytest.raises(PortError) as refused:
        reservations.remaining_slices(CLUSTER, "projects/p/reservations/r/extra/parts",
                                      slice_shape("v6e", "4x4"))

    assert refused.value.code == INVALID
    assert fake.calls == []


def test_production_clients_use_application_default_credentials(monkeypatch, tmp_path):
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))

    with pytest.raises(auth_exceptions.DefaultCredentialsError):
        ComputeReservations()
    with pytest.raises(auth_exceptions.DefaultCredentialsError):
        WorkloadPolicies()


# -- workload policies (Ironwood multi-host placement) --------------------------------


def test_missing_workload_policy_is_created_high_throughput(policies, fake):
    policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "2x2x2")
    policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "2x2x2")

    created = fake.policies[(PROJECT, "us-east5", "falcon-v7x-2x2x2")]
    assert created.workload_policy.type_ == "HIGH_THROUGHPUT"
    assert created.workload_policy.accelerator_topology == "2x2x2"
    assert len(fake.calls_of("policy-insert")) == 1
    assert len(fake.calls_of("policy-get")) == 2


def test_running_insert_is_waited_for(policies, fake):
    fake.insert_stays_running = True

    policies.ensure(PROJECT, "us-east5", "falcon-v7x-4x4x4", "4x4x4")

    assert len(fake.calls_of("operation-wait")) == 1


def test_insert_race_with_another_controller_is_fine(policies, fake):
    fake.fail_next("policy-insert", 409, "The resource 'projects/proj-a/regions/us-east5/"
                                         "resourcePolicies/falcon-v7x-2x2x2' already exists")

    policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "2x2x2")


def test_policy_with_another_topology_is_refused(policies, fake):
    policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "2x2x2")

    with pytest.raises(PortError) as refused:
        policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "4x4x4")

    assert refused.value.code == INVALID
    assert refused.value.message == (
        f"workload policy falcon-v7x-2x2x2 in project {PROJECT} region us-east5 exists with "
        "accelerator topology 2x2x2, not 4x4x4")


def test_policy_insert_denied_is_permission_denied(policies, fake):
    fake.fail_next("policy-insert", 403, "Required 'compute.resourcePolicies.create' permission")

    with pytest.raises(PortError) as denied:
        policies.ensure(PROJECT, "us-east5", "falcon-v7x-2x2x2", "2x2x2")

    assert denied.value.code == PERMISSION_DENIED
    assert denied.value.message.endswith("Required 'compute.resourcePolicies.create' permission")
