"""A local GKE ClusterManager that speaks the real wire protocols, REST and gRPC.

The official google-cloud-container client talks to it unchanged, so the adapter is
tested through the library's own serialisation, URL templates, enum encoding and
error mapping. One ``FakeGke`` holds the state and the behaviour; ``serve_rest`` and
``serve_grpc`` put it on 127.0.0.1 on a free port:

- REST: ``/v1/projects/*/locations/*/clusters/*/nodePools[/*]``, ``.../operations/*``
  and ``.../clusters/*``, JSON bodies, errors as ``{"error": {"code", "message",
  "status"}}`` exactly like Google's front end (so a FAILED_PRECONDITION arrives at
  the client as a plain HTTP 400);
- gRPC: the ``google.container.v1.ClusterManager`` service, errors as status codes.

Behaviour modelled on GKE: operations go PENDING/RUNNING -> DONE after a number of
``GetOperation`` polls (no wall-clock time at all); a cluster runs one node-pool
operation at a time and refuses a second with FAILED_PRECONDITION "... Please wait
and try again once it is done."; creating a pool that exists is ALREADY_EXISTS;
getting or deleting a missing pool is NOT_FOUND. Faults on demand: any status on the
next call of a method (429, 403 quota, ...), a create whose operation ends in a
quota or stockout error, and a window in which a just-created pool 404s on get.

Regional and zonal clusters: a cluster is addressed by its own location (a region or a
zone) and has ``locations``, its node zones (three for a regional cluster). A pool
created without ``locations`` gets the cluster's, so a regional pool has a node group
in each zone (``initial_node_count`` is per zone); COMPACT placement over more than one
zone is refused, as is a pool zone outside the cluster's region (docs/FIDELITY.md).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import http.server
import itertools
import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import proto
from google.cloud import container_v1
from google.rpc import status_pb2

from falcon_es.adapters.sim.common import zone_problem
from falcon_es.domain.clusters import is_zone, region_of
from tests.fakes.http_server import serve_http

HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}
RPC_CODE = {name: grpc.StatusCode[name].value[0] for name in HTTP_STATUS}

STOCKOUT_WORDS = (
    "Google Compute Engine: Not all instances running in IGM after 9m13s. Expected {n}, "
    "running 0, transitioning {n}. Current errors: [GCE_STOCKOUT]: Instance "
    "'gke-{pool}-0' creation failed: The zone 'projects/{project}/zones/{zone}' does not "
    "have enough resources available to fulfill the request. Try a different zone, or "
    "try again later."
)
QUOTA_WORDS = (
    "Insufficient quota to satisfy the request: Not all instances running in IGM after "
    "4m2s. Expected {n}, running 0, transitioning {n}. Current errors: "
    "[GCE_QUOTA_EXCEEDED]: Instance 'gke-{pool}-0' creation failed: Quota "
    "'TPU_V6E_PODSLICE_CHIPS' exceeded. Limit: 0.0 in region {region}."
)


class ApiError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclasses.dataclass
class _Op:
    operation: container_v1.Operation
    cluster: str
    pool: str
    polls_left: int
    on_done: Callable[[], status_pb2.Status | None]


@dataclasses.dataclass
class _Outcome:
    kind: str  # "quota" | "stockout" | "stockout-condition-only"


class FakeGke:
    """GKE's node-pool API in memory: state, behaviour and fault injection."""

    def __init__(self, *, polls_until_done: int = 1) -> None:
        self.polls_until_done = polls_until_done
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.clusters: dict[str, container_v1.Cluster] = {}
        self.pools: dict[str, container_v1.NodePool] = {}
        self.operations: dict[str, _Op] = {}
        self._faults: dict[str, collections.deque[ApiError]] = collections.defaultdict(
            collections.deque)
        self._outcomes: collections.deque[_Outcome] = collections.deque()
        self._hidden: dict[str, int] = {}
        self._hide_next_create = 0
        self.calls: list[tuple[str, Any]] = []
        self.raw_bodies: list[dict[str, Any]] = []

    # -- set-up and fault injection -------------------------------------------------

    def add_cluster(self, project: str, location: str, name: str, *,
                    endpoint: str = "10.20.30.40", ca_pem: bytes = b"-----FAKE CA-----\n",
                    gcs_fuse: bool = True, locations: list[str] | None = None,
                    release_channel: str = "REGULAR",
                    exclusions: dict[str, container_v1.TimeWindow] | None = None,
                    ) -> container_v1.Cluster:
        """A zonal cluster (``location`` a zone) has its zone as ``locations``; a
        regional one (a region) the region's zones a, b and c unless told."""
        path = f"projects/{project}/locations/{location}/clusters/{name}"
        if locations is None:
            locations = ([location] if is_zone(location)
                         else [f"{location}-{z}" for z in "abc"])
        cluster = container_v1.Cluster(
            name=name, location=location, locations=locations, endpoint=endpoint,
            status=container_v1.Cluster.Status.RUNNING, self_link=f"https://fake/v1/{path}",
            master_auth=container_v1.MasterAuth(
                cluster_ca_certificate=base64.b64encode(ca_pem).decode()),
            workload_identity_config=container_v1.WorkloadIdentityConfig(
                workload_pool=f"{project}.svc.id.goog"),
            addons_config=container_v1.AddonsConfig(
                gcs_fuse_csi_driver_config=container_v1.GcsFuseCsiDriverConfig(enabled=gcs_fuse)),
            release_channel=container_v1.ReleaseChannel(
                channel=container_v1.ReleaseChannel.Channel[release_channel or "UNSPECIFIED"]),
            maintenance_policy=container_v1.MaintenancePolicy(window=container_v1.MaintenanceWindow(
                maintenance_exclusions=exclusions or {})),
        )
        with self._lock:
            self.clusters[path] = cluster
            self.pools[f"{path}/nodePools/default-pool"] = container_v1.NodePool(
                name="default-pool", initial_node_count=3,
                status=container_v1.NodePool.Status.RUNNING,
                config=container_v1.NodeConfig(machine_type="e2-standard-4"),
            )
        return cluster

    def fail_next(self, method: str, status: str, message: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (e.g. "CreateNodePool") fail so."""
        with self._lock:
            self._faults[method].extend(ApiError(status, message) for _ in range(times))

    def fail_next_create_operation(self, kind: str) -> None:
        """The next created pool's operation ends DONE with a quota or stockout error."""
        with self._lock:
            self._outcomes.append(_Outcome(kind))

    def hide_next_created_pool(self, gets: int) -> None:
        """The next created pool answers NOT_FOUND to its first ``gets`` reads."""
        with self._lock:
            self._hide_next_create = gets

    def finish_operations(self) -> None:
        """Bring every running operation to DONE, as if time had passed."""
        with self._lock:
            for op in list(self.operations.values()):
                if op.operation.status != container_v1.Operation.Status.DONE:
                    op.polls_left = 0
                    self._complete(op)

    def calls_of(self, method: str) -> list[Any]:
        with self._lock:
            return [request for name, request in self.calls if name == method]

    # -- the API --------------------------------------------------------------------

    def _enter(self, method: str, request: Any) -> None:
        self.calls.append((method, request))
        faults = self._faults.get(method)
        if faults:
            raise faults.popleft()

    def _cluster(self, path: str) -> container_v1.Cluster:
        cluster = self.clusters.get(path)
        if cluster is None:
            raise ApiError("NOT_FOUND", f"Not found: {path}.")
        return cluster

    def _busy(self, cluster_path: str) -> None:
        for op in self.operations.values():
            if op.cluster == cluster_path and op.operation.status != container_v1.Operation.Status.DONE:
                verb = {container_v1.Operation.Type.CREATE_NODE_POOL: "creating",
                        container_v1.Operation.Type.DELETE_NODE_POOL: "deleting"}[
                    op.operation.operation_type]
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"Operation {op.operation.name} is currently {verb} node pool {op.pool}. "
                    "Please wait and try again once it is done.",
                )

    def create_node_pool(self, request: container_v1.CreateNodePoolRequest) -> container_v1.Operation:
        with self._lock:
            self._enter("CreateNodePool", request)
            parent = request.parent
            cluster = self._cluster(parent)
            pool = container_v1.NodePool(request.node_pool)
            path = f"{parent}/nodePools/{pool.name}"
            if path in self.pools:
                raise ApiError("ALREADY_EXISTS", f"Already exists: {path}.")
            if not pool.locations:
                pool.locations = list(cluster.locations)
            _validate(pool)
            _validate_zones(pool, cluster)
            refuse_disabled_upgrades(self._cluster(parent), pool)
            self._busy(parent)
            pool.status = container_v1.NodePool.Status.PROVISIONING
            pool.self_link = f"https://fake/v1/{path}"
            self.pools[path] = pool
            if self._hide_next_create:
                self._hidden[path] = self._hide_next_create
                self._hide_next_create = 0
            outcome = self._outcomes.popleft() if self._outcomes else None
            return self._start(parent, pool.name, container_v1.Operation.Type.CREATE_NODE_POOL,
                               lambda: self._created(path, outcome))

    def _created(self, path: str, outcome: _Outcome | None) -> status_pb2.Status | None:
        pool = self.pools[path]
        if outcome is None:
            pool.status = container_v1.NodePool.Status.RUNNING
            return None
        project, zone = path.split("/")[1], pool.locations[0]
        words = (STOCKOUT_WORDS if outcome.kind.startswith("stockout") else QUOTA_WORDS).format(
            n=max(pool.initial_node_count, 1), pool=pool.name, project=project, zone=zone,
            region=region_of(zone),
        )
        condition = container_v1.StatusCondition(
            code=(container_v1.StatusCondition.Code.GCE_STOCKOUT
                  if outcome.kind.startswith("stockout")
                  else container_v1.StatusCondition.Code.GCE_QUOTA_EXCEEDED),
            message=words,
        )
        pool.status = container_v1.NodePool.Status.ERROR
        pool.conditions = [condition]
        if outcome.kind == "stockout-condition-only":
            return status_pb2.Status(code=RPC_CODE["UNAVAILABLE"],
                                     message="Node pool creation failed; see conditions.")
        return status_pb2.Status(code=RPC_CODE["RESOURCE_EXHAUSTED"], message=words)

    def _start(self, cluster_path: str, pool_name: str, kind: container_v1.Operation.Type,
               on_done: Callable[[], status_pb2.Status | None]) -> container_v1.Operation:
        location = cluster_path.split("/")[3]
        name = f"operation-{1700000000000 + next(self._ids)}-{pool_name[:8]}"
        operation_path = f"{cluster_path.rsplit('/clusters/', 1)[0]}/operations/{name}"
        operation = container_v1.Operation(
            name=name, operation_type=kind, status=container_v1.Operation.Status.RUNNING,
            location=location, self_link=f"https://fake/v1/{operation_path}",
            target_link=f"https://fake/v1/{cluster_path}/nodePools/{pool_name}",
            start_time="2026-11-01T09:00:00.000000Z",
        )
        op = _Op(operation, cluster_path, pool_name, self.polls_until_done, on_done)
        self.operations[operation_path] = op
        if op.polls_left <= 0:
            self._complete(op)
        return container_v1.Operation(op.operation)

    def _complete(self, op: _Op) -> None:
        error = op.on_done()
        op.operation.status = container_v1.Operation.Status.DONE
        op.operation.end_time = "2026-11-01T09:05:00.000000Z"
        if error is not None:
            op.operation.error = error
            op.operation.status_message = error.message
            pool = self.pools.get(f"{op.cluster}/nodePools/{op.pool}")
            if pool is not None:
                op.operation.nodepool_conditions = list(pool.conditions)

    def get_operation(self, request: container_v1.GetOperationRequest) -> container_v1.Operation:
        with self._lock:
            self._enter("GetOperation", request)
            op = self.operations.get(request.name)
            if op is None:
                raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
            if op.operation.status != container_v1.Operation.Status.DONE:
                op.polls_left -= 1
                if op.polls_left <= 0:
                    self._complete(op)
            return container_v1.Operation(op.operation)

    def get_node_pool(self, request: container_v1.GetNodePoolRequest) -> container_v1.NodePool:
        with self._lock:
            self._enter("GetNodePool", request)
            self._cluster(request.name.split("/nodePools/")[0])
            hidden = self._hidden.get(request.name, 0)
            if hidden:
                self._hidden[request.name] = hidden - 1
                raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
            pool = self.pools.get(request.name)
            if pool is None:
                raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
            return container_v1.NodePool(pool)

    def list_node_pools(self, request: container_v1.ListNodePoolsRequest
                        ) -> container_v1.ListNodePoolsResponse:
        with self._lock:
            self._enter("ListNodePools", request)
            self._cluster(request.parent)
            prefix = f"{request.parent}/nodePools/"
            return container_v1.ListNodePoolsResponse(
                node_pools=[pool for path, pool in sorted(self.pools.items())
                            if path.startswith(prefix)]
            )

    def delete_node_pool(self, request: container_v1.DeleteNodePoolRequest) -> container_v1.Operation:
        with self._lock:
            self._enter("DeleteNodePool", request)
            cluster_path = request.name.split("/nodePools/")[0]
            self._cluster(cluster_path)
            pool = self.pools.get(request.name)
            if pool is None:
                raise ApiError("NOT_FOUND", f"Not found: {request.name}.")
            self._busy(cluster_path)
            pool.status = container_v1.NodePool.Status.STOPPING

            def deleted() -> None:
                self.pools.pop(request.name, None)
                self._hidden.pop(request.name, None)

            return self._start(cluster_path, pool.name, container_v1.Operation.Type.DELETE_NODE_POOL,
                               deleted)

    def get_cluster(self, request: container_v1.GetClusterRequest) -> container_v1.Cluster:
        with self._lock:
            self._enter("GetCluster", request)
            return container_v1.Cluster(self._cluster(request.name))


def _validate_zones(pool: container_v1.NodePool, cluster: container_v1.Cluster) -> None:
    """The sim's rule (one home): zones in the cluster's region, one zone for a slice
    placed as one (COMPACT or a workload policy)."""
    placed = bool(pool.placement_policy.type_ or pool.placement_policy.policy_name)
    problem = zone_problem(cluster.location, tuple(pool.locations), placed)
    if problem:
        raise ApiError("INVALID_ARGUMENT", problem)


def refuse_disabled_upgrades(cluster: container_v1.Cluster, pool: container_v1.NodePool) -> None:
    """On a cluster enrolled in a release channel node auto-upgrade cannot be turned off
    (GKE "Auto-upgrading nodes"); the refusal's exact words are not documented, these
    are the product's model of them."""
    unspecified = container_v1.ReleaseChannel.Channel.UNSPECIFIED
    channel = cluster.release_channel.channel
    if channel != unspecified and "management" in pool and not pool.management.auto_upgrade:
        name = container_v1.ReleaseChannel.Channel(channel).name
        raise ApiError("INVALID_ARGUMENT", f"Auto_upgrade cannot be false when release_channel "
                                           f"{name} is set.")


def _validate(pool: container_v1.NodePool) -> None:
    """Refusals GKE gives for malformed TPU pools (a subset, in GKE's spirit)."""
    config = pool.config
    if not config.machine_type:
        raise ApiError("INVALID_ARGUMENT", "Node pool machine type must be specified.")
    placement = pool.placement_policy
    if placement.policy_name and (placement.type_ or placement.tpu_topology):
        raise ApiError("INVALID_ARGUMENT", "placement_policy.policy_name cannot be combined "
                                           "with COMPACT placement or tpu_topology.")
    if placement.tpu_topology and not pool.config.flex_start:
        per_vm = int(re.search(r"-(\d+)t$", config.machine_type).group(1))
        chips = math.prod(int(d) for d in placement.tpu_topology.split("x"))
        if pool.initial_node_count != chips // per_vm:
            raise ApiError("INVALID_ARGUMENT",
                           f"TPU topology {placement.tpu_topology} on {config.machine_type} "
                           f"needs {chips // per_vm} nodes, not {pool.initial_node_count}.")
    affinity = config.reservation_affinity
    specific = container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION
    if affinity.consume_reservation_type == specific:
        if affinity.key != "compute.googleapis.com/reservation-name" or len(affinity.values) != 1:
            raise ApiError("INVALID_ARGUMENT", "SPECIFIC_RESERVATION needs key "
                                               "compute.googleapis.com/reservation-name and "
                                               "one reservation.")
        if config.flex_start:
            raise ApiError("INVALID_ARGUMENT", "Flex-start node pools cannot consume a reservation.")
    if config.flex_start and not pool.autoscaling.enabled:
        raise ApiError("INVALID_ARGUMENT", "Flex-start node pools need autoscaling enabled.")


# -- REST ---------------------------------------------------------------------------

_SEG = r"[^/]+"
_CLUSTER = rf"projects/{_SEG}/locations/{_SEG}/clusters/{_SEG}"
_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("POST", re.compile(rf"^/v1/(?P<parent>{_CLUSTER})/nodePools$"), "create"),
    ("GET", re.compile(rf"^/v1/(?P<parent>{_CLUSTER})/nodePools$"), "list"),
    ("GET", re.compile(rf"^/v1/(?P<name>{_CLUSTER}/nodePools/{_SEG})$"), "get"),
    ("DELETE", re.compile(rf"^/v1/(?P<name>{_CLUSTER}/nodePools/{_SEG})$"), "delete"),
    ("GET", re.compile(rf"^/v1/(?P<name>projects/{_SEG}/locations/{_SEG}/operations/{_SEG})$"),
     "operation"),
    ("GET", re.compile(rf"^/v1/(?P<name>{_CLUSTER})$"), "cluster"),
)


def _json(message: proto.Message) -> bytes:
    return type(message).to_json(message, use_integers_for_enums=False).encode()


def _rest_handler(fake: FakeGke) -> type[http.server.BaseHTTPRequestHandler]:
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
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                for method, pattern, action in _ROUTES:
                    match = pattern.match(path)
                    if method == self.command and match:
                        self._reply(200, _json(self._act(action, match, raw)))
                        return
                raise ApiError("NOT_FOUND", f"no route for {self.command} {path}")
            except ApiError as error:
                body = {"error": {"code": HTTP_STATUS[error.status], "message": error.message,
                                  "status": error.status}}
                self._reply(HTTP_STATUS[error.status], json.dumps(body).encode())

        def _act(self, action: str, match: re.Match[str], raw: bytes) -> proto.Message:
            if action == "create":
                body = json.loads(raw or b"{}")
                fake.raw_bodies.append(body)
                request = container_v1.CreateNodePoolRequest.from_json(json.dumps(body))
                request.parent = match["parent"]
                return fake.create_node_pool(request)
            if action == "list":
                return fake.list_node_pools(container_v1.ListNodePoolsRequest(parent=match["parent"]))
            if action == "get":
                return fake.get_node_pool(container_v1.GetNodePoolRequest(name=match["name"]))
            if action == "delete":
                return fake.delete_node_pool(container_v1.DeleteNodePoolRequest(name=match["name"]))
            if action == "operation":
                return fake.get_operation(container_v1.GetOperationRequest(name=match["name"]))
            return fake.get_cluster(container_v1.GetClusterRequest(name=match["name"]))

        do_GET = do_POST = do_DELETE = _dispatch

    return Handler


def serve_rest(fake: FakeGke) -> contextlib.AbstractContextManager[str]:
    """Serve ``fake`` over HTTP/JSON; yields the ``http://127.0.0.1:PORT`` endpoint."""
    return serve_http(_rest_handler(fake), "fake-gke-rest")


# -- gRPC ---------------------------------------------------------------------------

_RPCS: tuple[tuple[str, type[proto.Message], type[proto.Message], str], ...] = (
    ("CreateNodePool", container_v1.CreateNodePoolRequest, container_v1.Operation, "create_node_pool"),
    ("GetNodePool", container_v1.GetNodePoolRequest, container_v1.NodePool, "get_node_pool"),
    ("ListNodePools", container_v1.ListNodePoolsRequest, container_v1.ListNodePoolsResponse,
     "list_node_pools"),
    ("DeleteNodePool", container_v1.DeleteNodePoolRequest, container_v1.Operation, "delete_node_pool"),
    ("GetOperation", container_v1.GetOperationRequest, container_v1.Operation, "get_operation"),
    ("GetCluster", container_v1.GetClusterRequest, container_v1.Cluster, "get_cluster"),
)


def _grpc_method(fake: FakeGke, attribute: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return getattr(fake, attribute)(request)
        except ApiError as error:
            context.abort(grpc.StatusCode[error.status], error.message)
    return call


@contextlib.contextmanager
def serve_grpc(fake: FakeGke) -> Iterator[str]:
    """Serve ``fake`` as ``google.container.v1.ClusterManager`` over plaintext gRPC."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _grpc_method(fake, attribute),
            request_deserializer=request_type.deserialize,
            response_serializer=response_type.serialize,
        )
        for name, request_type, response_type, attribute in _RPCS
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("google.container.v1.ClusterManager", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()
