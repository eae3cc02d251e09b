"""The NodePools port on GKE (google-cloud-container ``ClusterManagerClient``).

Node-pool operations are not api_core long-running operations (reference §1.3): the
create and delete calls return a ``container_v1.Operation`` that is followed with
``get_operation`` until its status is DONE, and DONE covers failure too, so the
``error`` field decides. The adapter never blocks on an operation: the handlers poll
``get_operation`` across ticks, which keeps a tick short and lets a crashed controller
pick the operation up again by id.

Errors become ``PortError`` codes (see ``errors.py``); the handlers decide:
quota / stockout fail the task with GKE's words; ALREADY_EXISTS means adopt after
``get`` shows the pool carries the task's labels; RETRYABLE (another operation holds
the cluster, 429, 5xx) means try again with backoff; NOT_FOUND on ``get`` just after
a create is the create-visibility grace; ``delete`` of a missing pool returns None.

Credentials are Application Default Credentials (``google.auth.default()``: Workload
Identity in the central cluster); nothing here reads a key file. Tests aim the real
client at a local fake with ``api_endpoint="http://127.0.0.1:PORT"``: over REST with
the credentials they pass (AnonymousCredentials), over gRPC through a plaintext
channel, the only way the gRPC transport talks to a non-TLS server (reference §1.10).
"""

from __future__ import annotations

import google.auth
import grpc
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import Credentials
from google.cloud import container_v1
from google.cloud.container_v1.services.cluster_manager.transports import (
    ClusterManagerGrpcTransport,
)

from falcon_es.adapters.gcp.compute import WorkloadPolicies
from falcon_es.adapters.gcp.errors import code_for_operation_error, port_error
from falcon_es.adapters.gcp.pools import (
    labels_of, needs_workload_policy, node_pool, status_message, status_name,
    target_node_count, workload_policy_name,
)
from falcon_es.domain.ports import NOT_FOUND, NodePoolInfo, NodePoolSpec, Operation, PortError
from falcon_es.domain.clusters import Cluster, region_of

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TRANSPORTS = ("grpc", "rest")
PLAINTEXT_PREFIX = "http://"

_CALL_ERRORS = (gexc.GoogleAPIError, requests.RequestException)


def cluster_manager_client(
    *, credentials: Credentials | None = None, api_endpoint: str | None = None,
    transport: str = "grpc",
) -> container_v1.ClusterManagerClient:
    """A ClusterManagerClient on ADC, or on a plaintext local endpoint for tests.

    ``api_endpoint`` starting with ``http://`` means a local server without TLS.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"GKE transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
    plaintext_host = (
        api_endpoint.removeprefix(PLAINTEXT_PREFIX)
        if api_endpoint and api_endpoint.startswith(PLAINTEXT_PREFIX) else None
    )
    if plaintext_host and transport == "grpc":
        channel = grpc.insecure_channel(plaintext_host)
        return container_v1.ClusterManagerClient(
            transport=ClusterManagerGrpcTransport(channel=channel)
        )
    if credentials is None:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    options = {"api_endpoint": api_endpoint} if api_endpoint else None
    return container_v1.ClusterManagerClient(
        credentials=credentials, transport=transport, client_options=options
    )


def cluster_path(cluster: Cluster) -> str:
    """The cluster's own location (a region for a regional cluster), never the zone of
    its nodes: GKE answers 404 to a cluster addressed by another location."""
    return f"projects/{cluster.project}/locations/{cluster.location}/clusters/{cluster.name}"


def _where(cluster: Cluster) -> str:
    return f"cluster {cluster.name} (project {cluster.project}, location {cluster.location})"


class GkeNodePools:
    """Creates, follows, reads, lists and deletes Falcon's TPU node pools.

    ``workload_policies`` creates the Compute workload policy an Ironwood multi-host
    pool refers to, when missing; without it those policies must already exist
    (named by ``pools.workload_policy_name``). Before its first create on a cluster it
    reads the cluster once (``get_cluster``) for its release channel, which decides
    whether the pool's auto-upgrade may be off or must be held off by the pool's
    maintenance exclusion (``upgrade_exclusion``).
    """

    def __init__(
        self, client: container_v1.ClusterManagerClient | None = None, *,
        credentials: Credentials | None = None, api_endpoint: str | None = None,
        transport: str = "grpc", workload_policies: WorkloadPolicies | None = None,
        timeout: float = 30.0, upgrade_exclusion: bool = True,
    ) -> None:
        self._client = client or cluster_manager_client(
            credentials=credentials, api_endpoint=api_endpoint, transport=transport
        )
        self._workload_policies = workload_policies
        self._timeout = timeout
        self._upgrade_exclusion = upgrade_exclusion
        #: Per cluster path: enrolled in a release channel (read once; enrolment is
        #: an operator's change, and a pool created meanwhile is refused in words).
        self._channels: dict[str, bool] = {}

    def close(self) -> None:
        self._client.transport.close()

    def create(self, spec: NodePoolSpec) -> Operation:
        cluster = spec.cluster
        policy = None
        if needs_workload_policy(spec.shape):
            policy = workload_policy_name(spec.shape)
            if self._workload_policies is not None:
                self._workload_policies.ensure(
                    cluster.project, region_of(cluster.location), policy,
                    spec.shape.topology,
                )
        request = container_v1.CreateNodePoolRequest(
            parent=cluster_path(cluster),
            node_pool=node_pool(spec, workload_policy=policy,
                                release_channel=self._on_release_channel(cluster),
                                upgrade_exclusion=self._upgrade_exclusion),
        )
        try:
            operation = self._client.create_node_pool(request=request, timeout=self._timeout,
                                                      retry=None)
        except _CALL_ERRORS as error:
            raise port_error(error, f"create node pool {spec.name} in {_where(cluster)}") from error
        return to_operation(operation)

    def _on_release_channel(self, cluster: Cluster) -> bool:
        path = cluster_path(cluster)
        known = self._channels.get(path)
        if known is None:
            try:
                gke = self._client.get_cluster(name=path, timeout=self._timeout)
            except _CALL_ERRORS as error:
                raise port_error(error, f"get {_where(cluster)}") from error
            known = self._channels[path] = on_release_channel(gke)
        return known

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        name = f"projects/{cluster.project}/locations/{cluster.location}/operations/{operation_id}"
        try:
            operation = self._client.get_operation(name=name, timeout=self._timeout, retry=None)
        except _CALL_ERRORS as error:
            raise port_error(error, f"operation {operation_id} of {_where(cluster)}") from error
        return to_operation(operation)

    def get(self, cluster: Cluster, name: str) -> NodePoolInfo:
        try:
            pool = self._client.get_node_pool(
                name=f"{cluster_path(cluster)}/nodePools/{name}", timeout=self._timeout,
                retry=None,
            )
        except gexc.NotFound as error:
            raise PortError(NOT_FOUND, f"node pool {name} not found in {_where(cluster)}") from error
        except _CALL_ERRORS as error:
            raise port_error(error, f"get node pool {name} in {_where(cluster)}") from error
        return to_info(cluster, pool)

    def delete(self, cluster: Cluster, name: str) -> Operation | None:
        try:
            operation = self._client.delete_node_pool(
                name=f"{cluster_path(cluster)}/nodePools/{name}", timeout=self._timeout,
                retry=None,
            )
        except gexc.NotFound:
            return None
        except _CALL_ERRORS as error:
            raise port_error(error, f"delete node pool {name} in {_where(cluster)}") from error
        return to_operation(operation)

    def list(self, cluster: Cluster) -> list[NodePoolInfo]:
        """Every pool of the cluster, Falcon's or not: callers select by label."""
        try:
            response = self._client.list_node_pools(
                parent=cluster_path(cluster), timeout=self._timeout, retry=None
            )
        except _CALL_ERRORS as error:
            raise port_error(error, f"list node pools of {_where(cluster)}") from error
        return [to_info(cluster, pool) for pool in response.node_pools]


def on_release_channel(gke: container_v1.Cluster) -> bool:
    """The cluster is enrolled in a release channel (RAPID, REGULAR, STABLE, EXTENDED):
    GKE then keeps node auto-upgrade on."""
    channel = gke.release_channel.channel
    return channel != container_v1.ReleaseChannel.Channel.UNSPECIFIED


def to_operation(operation: container_v1.Operation) -> Operation:
    """The port's view of a GKE operation: done, and if it failed, why."""
    done = operation.status == container_v1.Operation.Status.DONE
    word = container_v1.Operation.Status(operation.status).name
    conditions = [*operation.nodepool_conditions, *operation.cluster_conditions]
    error = operation.error
    failed = bool(error.code or error.message)
    if not (done and failed):
        return Operation(id=operation.name, done=done, status=word)
    condition_words = [c.message for c in conditions if c.message and c.message not in error.message]
    words = "; ".join(
        part for part in (error.message or operation.status_message or operation.detail,
                          *condition_words) if part
    ) or f"operation {operation.name} failed with code {error.code}"
    code = code_for_operation_error(
        error.code, words, [container_v1.StatusCondition.Code(c.code).name for c in conditions]
    )
    return Operation(id=operation.name, done=True, error=words, error_code=code, status=word)


def to_info(cluster: Cluster, pool: container_v1.NodePool) -> NodePoolInfo:
    return NodePoolInfo(
        cluster_name=cluster.name,
        name=pool.name,
        status=status_name(pool),
        labels=labels_of(pool),
        node_count=target_node_count(pool),
        status_message=status_message(pool),
    )
