"""The Reservations port on Compute Engine (google-cloud-compute, REST only).

How many slices of a shape a TPU reservation can still give (reference §3.3):

- specific-SKU reservations count VMs: ``count - in_use_count`` hosts are free, the
  reservation's machine type must be the pool's (a ct6e-standard-8t reservation
  cannot feed a ct6e-standard-4t pool), and a slice needs ``hosts`` of them;
- aggregate reservations count chips per accelerator type
  (``projects/P/zones/Z/acceleratorTypes/ct6e``): free chips ``reserved - in use``
  for the pool's family, and a slice needs ``hosts * chips_per_host`` of them;
- a reference to a block or sub-block of a dense reservation
  (``.../reservationBlocks/B[/reservationSubBlocks/SB]``) counts the hosts free in
  that block or sub-block.

Reservations are zonal (``compute.reservations.get`` takes a zone): the reservation is
looked up in the zone of the cluster's TPU pools (its node zone, not the cluster's
location, which is a region for a regional cluster), in the cluster's project, or in the owner's project for a shared reservation written
``projects/OWNER/reservations/NAME``.

``WorkloadPolicies`` lives here as well because it is Compute too: an Ironwood
multi-host pool names a workload policy (HIGH_THROUGHPUT, the slice's accelerator
topology) that must exist in the cluster's region before GKE can create the pool.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import google.auth
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from falcon_es.adapters.gcp.errors import capacity_code, port_error
from falcon_es.domain.ports import FAILED, INVALID, NOT_FOUND, PortError, ReservationCapacity
from falcon_es.domain.clusters import Cluster, missing_node_zone
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.domain.tpu import SliceShape

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
UNUSABLE_STATUSES = frozenset({"CREATING", "DELETING"})
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"

_CALL_ERRORS = (gexc.GoogleAPIError, requests.RequestException)
_REFERENCE = re.compile(
    r"^(?:projects/(?P<project>[^/]+)/reservations/)?(?P<name>[^/]+)"
    r"(?:/reservationBlocks/(?P<block>[^/]+)(?:/reservationSubBlocks/(?P<sub_block>[^/]+))?)?$"
)


@dataclasses.dataclass(frozen=True)
class ReservationRef:
    """Where a reservation (or one of its blocks / sub-blocks) lives."""

    project: str
    zone: str
    name: str
    block: str | None = None
    sub_block: str | None = None

    @property
    def label(self) -> str:
        parts = [f"reservation {self.name}"]
        if self.block:
            parts.append(f"block {self.block}")
        if self.sub_block:
            parts.append(f"sub-block {self.sub_block}")
        return " ".join(parts) + f" in project {self.project} zone {self.zone}"


def reservation_ref(cluster: Cluster, reservation: str) -> ReservationRef:
    zone = cluster.node_zone
    if zone is None:
        raise PortError(INVALID, f"{missing_node_zone(cluster.name, cluster.location)}: "
                                 "TPU reservations are zonal")
    match = _REFERENCE.match(reservation)
    if not match:
        raise PortError(INVALID, f"reservation {reservation!r} is neither a name nor "
                                 "projects/OWNER/reservations/NAME[/reservationBlocks/B"
                                 "[/reservationSubBlocks/SB]]")
    return ReservationRef(
        project=match["project"] or cluster.project, zone=zone,
        name=match["name"], block=match["block"], sub_block=match["sub_block"],
    )


def reservation_end(found: compute_v1.Reservation) -> dt.datetime | None:
    """When Compute deletes the reservation, and the VMs that consume it: its
    ``deleteAtTime`` (RFC 3339), or its ``deleteAfterDuration`` after its
    ``creationTimestamp``; None when it carries neither. The reservation a calendar-mode
    future reservation creates is deleted at the request's end; which of the two fields
    that reservation shows is not documented, so both are read (docs/FIDELITY.md)."""
    if found.delete_at_time:
        return as_timestamp(found.delete_at_time)
    created = as_timestamp(found.creation_timestamp)
    if "delete_after_duration" in found and created is not None:
        after = found.delete_after_duration
        return created + dt.timedelta(seconds=after.seconds, microseconds=after.nanos // 1000)
    return None


def accelerator_family(machine_type: str) -> str:
    """``ct6e-standard-4t`` -> ``ct6e``: the acceleratorTypes name of its chips."""
    return machine_type.split("-", 1)[0]


def _compute_credentials(credentials: Credentials | None) -> Credentials:
    if credentials is not None:
        return credentials
    found, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return found


def _options(api_endpoint: str | None) -> dict[str, str] | None:
    return {"api_endpoint": api_endpoint} if api_endpoint else None


class ComputeReservations:
    """Remaining TPU capacity of a reservation, in slices of a given shape."""

    def __init__(
        self, reservations: compute_v1.ReservationsClient | None = None, *,
        blocks: compute_v1.ReservationBlocksClient | None = None,
        sub_blocks: compute_v1.ReservationSubBlocksClient | None = None,
        credentials: Credentials | None = None, api_endpoint: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if reservations is None or blocks is None or sub_blocks is None:
            credentials = _compute_credentials(credentials)
        options = _options(api_endpoint)
        self._reservations = reservations or compute_v1.ReservationsClient(
            credentials=credentials, client_options=options)
        self._blocks = blocks or compute_v1.ReservationBlocksClient(
            credentials=credentials, client_options=options)
        self._sub_blocks = sub_blocks or compute_v1.ReservationSubBlocksClient(
            credentials=credentials, client_options=options)
        self._timeout = timeout

    def close(self) -> None:
        for client in (self._reservations, self._blocks, self._sub_blocks):
            client.transport.close()

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: SliceShape) -> int:
        ref = reservation_ref(cluster, reservation)
        found = self._get_reservation(ref)
        if found.status in UNUSABLE_STATUSES:
            return 0
        if "specific_reservation" in found:
            machine_type = found.specific_reservation.instance_properties.machine_type
            machine_type = machine_type.rsplit("/", 1)[-1]
            if machine_type != shape.machine_type:
                raise PortError(INVALID, f"{ref.label} reserves {machine_type or 'no'} VMs; "
                                         f"a {shape.tpu_type} {shape.topology} pool needs "
                                         f"{shape.machine_type}")
            if ref.block:
                free_hosts = self._free_hosts_in_block(ref)
            else:
                free_hosts = (found.specific_reservation.count
                              - found.specific_reservation.in_use_count)
            return max(free_hosts, 0) // shape.hosts
        if "aggregate_reservation" in found:
            return max(self._free_chips(ref, found.aggregate_reservation, shape), 0) // shape.chips
        raise PortError(INVALID, f"{ref.label} has neither a specific nor an aggregate "
                                 "allocation; Falcon cannot count its TPU capacity")

    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity:
        """A specific reservation's machine type and VM count (of the block or
        sub-block when the reference names one); an aggregate reservation counts chips
        per accelerator type, which ``remaining_slices`` checks: nothing known here.
        Either kind's end (``reservation_end``) is read."""
        ref = reservation_ref(cluster, reservation)
        found = self._get_reservation(ref)
        ends_at = reservation_end(found)
        if "specific_reservation" not in found:
            return ReservationCapacity(ends_at=ends_at)
        specific = found.specific_reservation
        machine_type = specific.instance_properties.machine_type.rsplit("/", 1)[-1] or None
        return ReservationCapacity(machine_type, None if ref.block else specific.count, ends_at)

    def _get_reservation(self, ref: ReservationRef) -> compute_v1.Reservation:
        try:
            return self._reservations.get(
                project=ref.project, zone=ref.zone, reservation=ref.name,
                timeout=self._timeout, retry=None
            )
        except gexc.NotFound as error:
            raise PortError(NOT_FOUND, f"reservation {ref.name} not found in project "
                                       f"{ref.project} zone {ref.zone}") from error
        except _CALL_ERRORS as error:
            raise port_error(error, f"reading reservation {ref.name} in project {ref.project} "
                                    f"zone {ref.zone}") from error

    def _free_hosts_in_block(self, ref: ReservationRef) -> int:
        try:
            if ref.sub_block:
                sub_block = self._sub_blocks.get(
                    project=ref.project, zone=ref.zone,
                    parent_name=f"reservations/{ref.name}/reservationBlocks/{ref.block}",
                    reservation_sub_block=ref.sub_block, timeout=self._timeout, retry=None,
                ).resource
                return sub_block.count - sub_block.in_use_count
            block = self._blocks.get(
                project=ref.project, zone=ref.zone, reservation=ref.name,
                reservation_block=ref.block, timeout=self._timeout, retry=None,
            ).resource
            return block.count - block.in_use_count
        except gexc.NotFound as error:
            raise PortError(NOT_FOUND, f"{ref.label}: not found") from error
        except _CALL_ERRORS as error:
            raise port_error(error, f"reading {ref.label}") from error

    @staticmethod
    def _free_chips(ref: ReservationRef, aggregate: compute_v1.AllocationAggregateReservation,
                    shape: SliceShape) -> int:
        family = accelerator_family(shape.machine_type)

        def matches(accelerator_type: str) -> bool:
            parts = accelerator_type.strip("/").split("/")
            zone_ok = "zones" not in parts[:-1] or parts[parts.index("zones") + 1] == ref.zone
            return parts[-1] == family and zone_ok

        reserved = [r.accelerator for r in aggregate.reserved_resources
                    if matches(r.accelerator.accelerator_type)]
        if not reserved:
            held = sorted({r.accelerator.accelerator_type.rsplit("/", 1)[-1]
                           for r in aggregate.reserved_resources}) or ["nothing"]
            raise PortError(INVALID, f"{ref.label} reserves no {family} TPU chips "
                                     f"(it holds: {', '.join(held)})")
        in_use = sum(r.accelerator.accelerator_count for r in aggregate.in_use_resources
                     if matches(r.accelerator.accelerator_type))
        return sum(a.accelerator_count for a in reserved) - in_use


class WorkloadPolicies:
    """Makes sure the workload policy an Ironwood multi-host pool names exists."""

    def __init__(
        self, policies: compute_v1.ResourcePoliciesClient | None = None, *,
        operations: compute_v1.RegionOperationsClient | None = None,
        credentials: Credentials | None = None, api_endpoint: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        if policies is None or operations is None:
            credentials = _compute_credentials(credentials)
        options = _options(api_endpoint)
        self._policies = policies or compute_v1.ResourcePoliciesClient(
            credentials=credentials, client_options=options)
        self._operations = operations or compute_v1.RegionOperationsClient(
            credentials=credentials, client_options=options)
        self._timeout = timeout

    def close(self) -> None:
        for client in (self._policies, self._operations):
            client.transport.close()

    def ensure(self, project: str, region: str, name: str, topology: str) -> None:
        where = f"workload policy {name} in project {project} region {region}"
        try:
            existing = self._policies.get(
                project=project, region=region, resource_policy=name,
                timeout=self._timeout, retry=None
            )
        except gexc.NotFound:
            self._create(project, region, name, topology, where)
            return
        except _CALL_ERRORS as error:
            raise port_error(error, f"reading {where}") from error
        have = existing.workload_policy.accelerator_topology
        if have != topology:
            raise PortError(INVALID, f"{where} exists with accelerator topology "
                                     f"{have or 'unset'}, not {topology}")

    def _create(self, project: str, region: str, name: str, topology: str, where: str) -> None:
        policy = compute_v1.ResourcePolicy(
            name=name,
            description="Falcon-ES: placement of Ironwood multi-host TPU slices",
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_=WORKLOAD_POLICY_TYPE, accelerator_topology=topology
            ),
        )
        try:
            operation = self._policies.insert_unary(
                project=project, region=region, resource_policy_resource=policy,
                timeout=self._timeout, retry=None,
            )
            if operation.status != compute_v1.Operation.Status.DONE:
                operation = self._operations.wait(
                    project=project, region=region, operation=operation.name,
                    timeout=self._timeout, retry=None,
                )
        except gexc.Conflict:
            return  # another controller created it first
        except _CALL_ERRORS as error:
            raise port_error(error, f"creating {where}") from error
        if operation.status != compute_v1.Operation.Status.DONE:
            raise PortError(FAILED, f"creating {where}: operation {operation.name} is still "
                                    f"{compute_v1.Operation.Status(operation.status).name}")
        if operation.error.errors:
            words = "; ".join(e.message for e in operation.error.errors if e.message)
            raise PortError(capacity_code(words) or FAILED, f"creating {where}: {words}")
