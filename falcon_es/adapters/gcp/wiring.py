"""The gcp backend assembled from ``Settings``: what ``falcon-es run --backend gcp``,
``falcon-es informer`` and ``falcon-es doctor`` talk to.

One identity for everything: Application Default Credentials, found once with
``google.auth.default()`` (Workload Identity in the central cluster, ``gcloud auth
application-default login`` on a workstation). Nothing here reads a key, a kubeconfig
or a token from configuration; the edge clusters' endpoints and CAs come from GKE.

Endpoints can be overridden for local fakes and emulators: ``FALCON_GKE_ENDPOINT``
(with ``FALCON_GKE_TRANSPORT`` grpc or rest) and ``FALCON_COMPUTE_ENDPOINT``; an
``http://`` endpoint is a local server without TLS and gets anonymous credentials, the
convention Google's own clients follow for ``PUBSUB_EMULATOR_HOST`` (which the Pub/Sub
clients honour by themselves).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any

import google.auth
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import container_v1

from falcon_es.adapters.gcp.compute import ComputeReservations, WorkloadPolicies
from falcon_es.adapters.gcp.gke import CLOUD_PLATFORM_SCOPE, GkeNodePools, cluster_manager_client
from falcon_es.adapters.gcp.informer import InformerSettings, ObservationPublisher, run_informer
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import GkeEndpoints, GoogleAccessTokens
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.domain.ports import Ports
from falcon_es.domain.clusters import Cluster
from falcon_es.config.settings import Settings, SettingsError

#: Seconds a pull of the edge-events subscription may take. The controller pulls at
#: least once per tick, so an empty subscription must not hold a tick: messages that are
#: there arrive in milliseconds, and an empty pull ends at this deadline with nothing
#: (Google's emulator answers an empty pull at once below one second, and holds it for
#: the deadline minus one second above).
PULL_TIMEOUT_SECONDS = 0.5
LOCAL_PREFIX = "http://"
ADC_HINT = ("in the central cluster, run the pod as a Kubernetes service account bound to "
            "a Google service account through Workload Identity (deploy/iam/setup.sh); on a "
            "workstation, run `gcloud auth application-default login`")

CredentialsSource = Callable[[], tuple[Credentials, str | None]]


class GcpConfigError(SettingsError):
    """The gcp backend cannot be built: says what is missing and how to provide it."""


def application_default_credentials() -> tuple[Credentials, str | None]:
    """``google.auth.default()`` with the cloud-platform scope: the credentials and the
    project they come with (None when the environment names none)."""
    try:
        credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exceptions.DefaultCredentialsError as error:
        raise GcpConfigError(f"no Google credentials found ({_first_line(error)}); "
                             f"{ADC_HINT}") from None
    return credentials, project or None


def is_local(endpoint: str | None) -> bool:
    """A plaintext endpoint: a local fake or emulator, never Google's front end."""
    return bool(endpoint) and str(endpoint).startswith(LOCAL_PREFIX)


def pubsub_project(settings: Settings, adc_project: str | None) -> str:
    project = settings.gcp.pubsub_project or adc_project
    if not project:
        raise GcpConfigError("no project for the Pub/Sub topics: set FALCON_PUBSUB_PROJECT "
                             "(or GOOGLE_CLOUD_PROJECT) to the project that holds "
                             f"{settings.bus.edge_events_topic} and {settings.bus.task_events_topic}")
    return project


def pubsub_bus(settings: Settings, *,
               credentials_source: CredentialsSource = application_default_credentials,
               ) -> PubSubBus:
    """Pub/Sub alone, for a simulated world whose bus the outside reads (a staging
    world): Google's emulator when ``PUBSUB_EMULATOR_HOST`` is set (the clients honour
    it and need no credentials), else the project's Pub/Sub with the Application
    Default Credentials. The project is ``FALCON_PUBSUB_PROJECT``, else the ADC one."""
    adc_project = None
    if not settings.gcp.pubsub_project and not settings.gcp.pubsub_emulator_host:
        adc_project = credentials_source()[1]
    return PubSubBus(pubsub_project(settings, adc_project),
                     pull_timeout_seconds=PULL_TIMEOUT_SECONDS)


def informer_settings(settings: Settings) -> InformerSettings:
    """The informers publish where the controller's subscription listens."""
    return InformerSettings(topic=settings.bus.edge_events_topic)


def start_informers(clusters: Iterable[Cluster], edges: KubeEdgeClusters,
                    bus: ObservationPublisher, settings: Settings,
                    stop: threading.Event, metrics: Any = None) -> list[threading.Thread]:
    """One informer thread per cluster, until ``stop`` is set: ``falcon-es informer``,
    or the controller's own when it runs them in-process. ``metrics`` counts each watch
    restart per cluster and reason."""
    threads = [threading.Thread(target=run_informer, args=(cluster, edges, bus, stop),
                                kwargs={"settings": informer_settings(settings),
                                        "restarted": _restart_counter(metrics, cluster)},
                                name=f"informer-{cluster.name}", daemon=True)
               for cluster in clusters]
    for thread in threads:
        thread.start()
    return threads


def _restart_counter(metrics: Any, cluster: Cluster) -> Callable[[str], None] | None:
    if metrics is None:
        return None
    return lambda reason: metrics.informer_restarted(cluster.name, reason)


@dataclasses.dataclass
class GcpBackend:
    """The clients of one process, built once and shared by the ports."""

    settings: Settings
    credentials: Credentials
    adc_project: str | None
    cluster_manager: container_v1.ClusterManagerClient
    node_pools: GkeNodePools
    reservations: ComputeReservations
    edges: KubeEdgeClusters
    bus: PubSubBus
    clock: Clock

    def ports(self) -> Ports:
        return Ports(node_pools=self.node_pools, reservations=self.reservations,
                     edges=self.edges, bus=self.bus, clock=self.clock)

    def close(self) -> None:
        """Flush pending publishes and close every client's connections."""
        self.bus.close()
        self.edges.close()
        self.reservations.close()
        self.node_pools.close()


def build_cluster_manager(settings: Settings,
                          credentials: Credentials) -> container_v1.ClusterManagerClient:
    endpoint = settings.gcp.gke_endpoint
    return cluster_manager_client(
        credentials=AnonymousCredentials() if is_local(endpoint) else credentials,
        api_endpoint=endpoint, transport=settings.gcp.gke_transport)


@dataclasses.dataclass
class CloudClients:
    """The clients of the calls made on behalf of clusters: GKE, Compute and the edge
    clusters' Kubernetes APIs (everything of the gcp backend but Pub/Sub)."""

    cluster_manager: container_v1.ClusterManagerClient
    node_pools: GkeNodePools
    reservations: ComputeReservations
    edges: KubeEdgeClusters

    def close(self) -> None:
        self.edges.close()
        self.reservations.close()
        self.node_pools.close()


def build_cloud_clients(settings: Settings, credentials: Credentials,
                        clock: Clock) -> CloudClients:
    """GKE, Compute and Kubernetes clients, each call with the deadline of ``calls`` and
    no retries of the client's own."""
    compute_endpoint = settings.gcp.compute_endpoint
    compute_credentials = AnonymousCredentials() if is_local(compute_endpoint) else credentials
    cluster_manager = build_cluster_manager(settings, credentials)
    calls = settings.calls
    deadline = calls.read_timeout_seconds
    node_pools = GkeNodePools(cluster_manager, timeout=deadline,
                              workload_policies=WorkloadPolicies(
                                  credentials=compute_credentials,
                                  api_endpoint=compute_endpoint))
    reservations = ComputeReservations(credentials=compute_credentials,
                                       api_endpoint=compute_endpoint, timeout=deadline)
    edges = KubeEdgeClusters(GkeEndpoints(cluster_manager, timeout=deadline),
                             tokens=GoogleAccessTokens(credentials, clock=clock,
                                                       timeout_seconds=deadline),
                             namespace=settings.lifecycle.job_namespace,
                             request_timeout_seconds=(calls.connect_timeout_seconds, deadline))
    return CloudClients(cluster_manager, node_pools, reservations, edges)


def build_gcp_backend(settings: Settings, *, clock: Clock | None = None,
                      credentials_source: CredentialsSource = application_default_credentials,
                      ) -> GcpBackend:
    """Every client of the gcp backend; raises ``GcpConfigError`` naming what is missing.

    ``clock`` is the controller's (a VirtualClock in tests): the effect executor reads
    it through ``Ports.clock`` and the Kubernetes tokens are refreshed on it.
    """
    clock = clock or WallClock()
    credentials, adc_project = credentials_source()
    project = pubsub_project(settings, adc_project)
    clients = build_cloud_clients(settings, credentials, clock)
    bus = PubSubBus(project, pull_timeout_seconds=PULL_TIMEOUT_SECONDS)
    return GcpBackend(settings, credentials, adc_project, clients.cluster_manager,
                      clients.node_pools, clients.reservations, clients.edges, bus, clock)


def build_gcp_ports(settings: Settings, *, clock: Clock | None = None) -> Ports:
    """The ports of ``--backend gcp``: GKE node pools, Compute reservations (and the
    workload policies of Ironwood multi-host slices), the edge clusters' Kubernetes APIs
    (endpoint and CA from GKE, Google access tokens), Pub/Sub, the wall clock."""
    return build_gcp_backend(settings, clock=clock).ports()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
