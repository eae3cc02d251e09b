"""A local Compute Engine REST endpoint for reservations and workload policies.

google-cloud-compute is REST-only; this server answers the URL templates of the real
client (``/compute/v1/projects/{project}/zones/{zone}/reservations/{reservation}``,
its reservationBlocks and reservationSubBlocks, ``regions/{region}/resourcePolicies``
and ``regions/{region}/operations/{operation}/wait``) with the JSON Compute sends:
lowerCamel field names, int64 as strings, errors as ``{"error": {"code", "message",
"errors": [{"reason", ...}]}}``. Faults: any HTTP status on the next call of a
route, and a resource-policy insert whose operation is still RUNNING when returned.
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import itertools
import json
import re
import threading
from collections.abc import Mapping
from typing import Any

import proto
from google.cloud import compute_v1

from tests.fakes.http_server import serve_http

ReservedInfo = compute_v1.AllocationAggregateReservationReservedResourceInfo
ReservedAccelerator = compute_v1.AllocationAggregateReservationReservedResourceInfoAccelerator
InstanceProperties = compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties

REASONS = {400: "invalid", 403: "forbidden", 404: "notFound", 409: "alreadyExists",
           429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def ending(*, delete_at_time: str | None = None, delete_after_seconds: int | None = None,
           created: str | None = None) -> compute_v1.Reservation:
    """The fields of a reservation that say when Compute deletes it: an absolute
    ``deleteAtTime`` or a ``deleteAfterDuration`` after its ``creationTimestamp``."""
    end = compute_v1.Reservation()
    if delete_at_time is not None:
        end.delete_at_time = delete_at_time
    if delete_after_seconds is not None:
        end.delete_after_duration = compute_v1.Duration(seconds=delete_after_seconds)
    if created is not None:
        end.creation_timestamp = created
    return end


class FakeCompute:
    """Reservations (specific, aggregate, dense blocks) and resource policies."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.reservations: dict[tuple[str, str, str], compute_v1.Reservation] = {}
        self.blocks: dict[tuple[str, str, str, str], compute_v1.ReservationBlock] = {}
        self.sub_blocks: dict[tuple[str, str, str, str, str], compute_v1.ReservationSubBlock] = {}
        self.policies: dict[tuple[str, str, str], compute_v1.ResourcePolicy] = {}
        self.operations: dict[tuple[str, str, str], compute_v1.Operation] = {}
        self._faults: dict[str, collections.deque[HttpError]] = collections.defaultdict(
            collections.deque)
        self.insert_stays_running = False
        self.calls: list[tuple[str, str]] = []

    # -- set-up and faults ----------------------------------------------------------

    def add_specific(self, project: str, zone: str, name: str, *, machine_type: str,
                     count: int, in_use: int, status: str = "READY",
                     end: compute_v1.Reservation | None = None) -> None:
        """``end``: the fields saying when Compute deletes it (``ending``)."""
        with self._lock:
            found = compute_v1.Reservation(
                name=name,
                zone=f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
                status=status, specific_reservation_required=True,
                specific_reservation=compute_v1.AllocationSpecificSKUReservation(
                    count=count, in_use_count=in_use, assured_count=count,
                    instance_properties=InstanceProperties(machine_type=machine_type),
                ),
            )
            if end is not None:
                compute_v1.Reservation.pb(found).MergeFrom(compute_v1.Reservation.pb(end))
            self.reservations[(project, zone, name)] = found

    def remove(self, project: str, zone: str, name: str) -> None:
        """Compute deleted the reservation (a calendar-mode one at its end): reads 404."""
        with self._lock:
            self.reservations.pop((project, zone, name), None)

    def add_aggregate(self, project: str, zone: str, name: str, *, vm_family: str,
                      reserved: Mapping[str, int], in_use: Mapping[str, int],
                      type_project: str | None = None) -> None:
        types = f"projects/{type_project or project}/zones/{zone}/acceleratorTypes"

        def resources(counts: Mapping[str, int]) -> list[ReservedInfo]:
            return [
                ReservedInfo(accelerator=ReservedAccelerator(
                    accelerator_type=f"{types}/{kind}", accelerator_count=count))
                for kind, count in counts.items()
            ]

        with self._lock:
            self.reservations[(project, zone, name)] = compute_v1.Reservation(
                name=name, status="READY",
                aggregate_reservation=compute_v1.AllocationAggregateReservation(
                    vm_family=vm_family, workload_type="BATCH",
                    reserved_resources=resources(reserved), in_use_resources=resources(in_use),
                ),
            )

    def add_block(self, project: str, zone: str, reservation: str, block: str, *,
                  count: int, in_use: int) -> None:
        with self._lock:
            self.blocks[(project, zone, reservation, block)] = compute_v1.ReservationBlock(
                name=block, count=count, in_use_count=in_use, status="READY")

    def add_sub_block(self, project: str, zone: str, reservation: str, block: str,
                      sub_block: str, *, count: int, in_use: int) -> None:
        with self._lock:
            self.sub_blocks[(project, zone, reservation, block, sub_block)] = (
                compute_v1.ReservationSubBlock(name=sub_block, count=count,
                                               in_use_count=in_use, status="READY"))

    def fail_next(self, route: str, status: int, message: str) -> None:
        """The next call of ``route`` ("reservation", "policy-insert", ...) fails so."""
        with self._lock:
            self._faults[route].append(HttpError(status, message))

    def calls_of(self, route: str) -> list[str]:
        with self._lock:
            return [path for name, path in self.calls if name == route]

    # -- the API --------------------------------------------------------------------

    def handle(self, method: str, path: str, body: bytes) -> proto.Message:
        for verb, pattern, route in _ROUTES:
            match = pattern.match(path)
            if verb == method and match:
                with self._lock:
                    self.calls.append((route, path))
                    faults = self._faults.get(route)
                    if faults:
                        raise faults.popleft()
                    return getattr(self, "_" + route.replace("-", "_"))(body, **match.groupdict())
        raise HttpError(404, f"no route for {method} {path}")

    def _reservation(self, body: bytes, project: str, zone: str, name: str) -> proto.Message:
        found = self.reservations.get((project, zone, name))
        if found is None:
            raise HttpError(404, f"The resource 'projects/{project}/zones/{zone}/reservations/"
                                 f"{name}' was not found")
        return found

    def _block(self, body: bytes, project: str, zone: str, name: str, block: str) -> proto.Message:
        found = self.blocks.get((project, zone, name, block))
        if found is None:
            raise HttpError(404, f"The resource 'projects/{project}/zones/{zone}/reservations/"
                                 f"{name}/reservationBlocks/{block}' was not found")
        return compute_v1.ReservationBlocksGetResponse(resource=found)

    def _sub_block(self, body: bytes, project: str, zone: str, name: str, block: str,
                   sub_block: str) -> proto.Message:
        found = self.sub_blocks.get((project, zone, name, block, sub_block))
        if found is None:
            raise HttpError(404, f"The resource 'projects/{project}/zones/{zone}/reservations/"
                                 f"{name}/reservationBlocks/{block}/reservationSubBlocks/"
                                 f"{sub_block}' was not found")
        return compute_v1.ReservationSubBlocksGetResponse(resource=found)

    def _policy_get(self, body: bytes, project: str, region: str, name: str) -> proto.Message:
        found = self.policies.get((project, region, name))
        if found is None:
            raise HttpError(404, f"The resource 'projects/{project}/regions/{region}/"
                                 f"resourcePolicies/{name}' was not found")
        return found

    def _policy_insert(self, body: bytes, project: str, region: str) -> proto.Message:
        policy = compute_v1.ResourcePolicy.from_json(body.decode())
        if (project, region, policy.name) in self.policies:
            raise HttpError(409, f"The resource 'projects/{project}/regions/{region}/"
                                 f"resourcePolicies/{policy.name}' already exists")
        policy.region = region
        policy.status = "READY"
        self.policies[(project, region, policy.name)] = policy
        name = f"operation-{next(self._ids)}"
        status = (compute_v1.Operation.Status.RUNNING if self.insert_stays_running
                  else compute_v1.Operation.Status.DONE)
        operation = compute_v1.Operation(name=name, status=status, operation_type="insert",
                                          region=region, target_link=policy.name)
        self.operations[(project, region, name)] = operation
        return operation

    def _operation_wait(self, body: bytes, project: str, region: str, name: str) -> proto.Message:
        found = self.operations.get((project, region, name))
        if found is None:
            raise HttpError(404, f"The resource 'projects/{project}/regions/{region}/"
                                 f"operations/{name}' was not found")
        found.status = compute_v1.Operation.Status.DONE
        return found


_SEG = r"[^/]+"
_ZONE = rf"^/compute/v1/projects/(?P<project>{_SEG})/zones/(?P<zone>{_SEG})"
_REGION = rf"^/compute/v1/projects/(?P<project>{_SEG})/regions/(?P<region>{_SEG})"
_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("GET", re.compile(rf"{_ZONE}/reservations/(?P<name>{_SEG})$"), "reservation"),
    ("GET", re.compile(rf"{_ZONE}/reservations/(?P<name>{_SEG})/reservationBlocks/"
                       rf"(?P<block>{_SEG})$"), "block"),
    ("GET", re.compile(rf"{_ZONE}/reservations/(?P<name>{_SEG})/reservationBlocks/"
                       rf"(?P<block>{_SEG})/reservationSubBlocks/(?P<sub_block>{_SEG})$"),
     "sub-block"),
    ("GET", re.compile(rf"{_REGION}/resourcePolicies/(?P<name>{_SEG})$"), "policy-get"),
    ("POST", re.compile(rf"{_REGION}/resourcePolicies$"), "policy-insert"),
    ("POST", re.compile(rf"{_REGION}/operations/(?P<name>{_SEG})/wait$"), "operation-wait"),
)


def _handler(fake: FakeCompute) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # one reply is two writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: pytest shows failures, not access logs."""

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _dispatch(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                message = fake.handle(self.command, self.path.split("?", 1)[0], raw)
            except HttpError as error:
                body = {"error": {"code": error.status, "message": error.message,
                                  "errors": [{"message": error.message, "domain": "global",
                                              "reason": REASONS.get(error.status, "error")}]}}
                self._reply(error.status, json.dumps(body).encode())
                return
            self._reply(200, type(message).to_json(message, use_integers_for_enums=False).encode())

        do_GET = do_POST = _dispatch

    return Handler


def serve_rest(fake: FakeCompute) -> contextlib.AbstractContextManager[str]:
    """Serve ``fake``; yields the ``http://127.0.0.1:PORT`` endpoint."""
    return serve_http(_handler(fake), "fake-compute-rest")
