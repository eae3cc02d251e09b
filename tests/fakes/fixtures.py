"""Fixtures for the gcp backend's tests: Google's Pub/Sub emulator and a fake
Kubernetes API server. Test modules import the fixtures they use by name.

The emulator is started once per test session even when several modules import the
fixture (pytest registers an imported fixture once per module): the running emulator
is kept in the session's ``config.stash`` and stopped, by pid, when the session ends.
If it is not installed the tests fail with a message saying how to install it; they
never skip.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import freezegun
import google.auth.transport.requests
import google.oauth2.credentials
import pytest
import requests

from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import GoogleAccessTokens, KubeEndpoint
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.domain.manifests import JobPlacement, render_job
from falcon_es.domain.ports import RETRYABLE, PortError
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.tpu import slice_shape
from tests.fakes import kube_server as fake_kube
from tests.fakes.kube_server import FakeKubeServer
from tests.fakes.pubsub_emulator import EmulatorError, PubSubEmulator

_EMULATOR = pytest.StashKey[PubSubEmulator]()

# kubernetes 37 imports its pydantic models lazily (a module ``__getattr__``). When
# freezegun freezes time it reads every attribute of every loaded module, which would
# import those models while ``datetime`` is its FakeDatetime, and pydantic cannot build
# a model on that type. Once these fixtures have loaded the kubernetes client, every
# later ``freeze_time`` in the session (tests/test_scheduling.py) must leave it alone.
freezegun.configure(extend_ignore_list=["kubernetes"])


def unique_name(prefix: str) -> str:
    """A topic or subscription name no other test uses on the shared emulator."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def pubsub_emulator(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> PubSubEmulator:
    config = request.config
    emulator = config.stash.get(_EMULATOR, None)
    if emulator is None or not emulator.is_running():
        try:
            emulator = PubSubEmulator.start(tmp_path_factory.mktemp("pubsub-emulator"))
        except EmulatorError as error:
            pytest.fail(str(error), pytrace=False)
        config.stash[_EMULATOR] = emulator
        config.add_cleanup(emulator.stop)
    return emulator


@pytest.fixture
def pubsub_bus(pubsub_emulator: PubSubEmulator,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubBus]:
    """A PubSubBus whose clients talk to the emulator (PUBSUB_EMULATOR_HOST)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    # The emulator holds an empty pull for about (timeout - 1 s): 1 s keeps "nothing
    # more to pull" checks instant.
    bus = PubSubBus(pubsub_emulator.project, pull_timeout_seconds=1.0)
    yield bus
    bus.close()


class RecordingBus:
    """The publishing half of a Bus, keeping what is published (for informer tests).

    Thread-safe: informer watch loops publish from their own threads.
    ``wait_for`` blocks (bounded) until a predicate over the messages holds.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.published: list[tuple[str, dict[str, Any], str, dict[str, str]]] = []
        self.refuse_next = 0  # that many publishes fail, as when Pub/Sub is unreachable

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        with self._changed:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                raise PortError(RETRYABLE, f"publishing to {topic}: 503 unavailable")
            self.published.append((topic, dict(data), ordering_key, dict(attributes or {})))
            self._changed.notify_all()
            return str(len(self.published))

    def data(self) -> list[dict[str, Any]]:
        with self._changed:
            return [data for _, data, _, _ in self.published]

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self._changed:
            if not self._changed.wait_for(
                    lambda: predicate([data for _, data, _, _ in self.published]), timeout):
                shown = [(d["job_name"], d["resource_version"], d["active"], d["succeeded"],
                          [(p["name"], p["phase"], p["reason"]) for p in d["pods"]])
                         for _, d, _, _ in self.published]
                raise AssertionError(f"condition not met within {timeout}s; published: {shown}")
            return [data for _, data, _, _ in self.published]


# --------------------------------------------------------------------- Kubernetes

def edge_cluster_row(name: str = "edge-a") -> Cluster:
    """A registered edge cluster as the registry returns it."""
    return Cluster(id=f"id-{name}", name=name, project="falcon-edge", location="us-east5-b",
                   tpu_type="v6e", gcs_bucket="falcon-logs", default_reservation=None,
                   status="active", created_at=dt.datetime(2026, 11, 1, 9, 0))


def falcon_manifest(task_id: str = "task-1", topology: str = "2x2", *,
                    image: str = "us-docker.pkg.dev/p/r/train:1",
                    namespace: str = "falcon-jobs") -> dict[str, Any]:
    """The Job Falcon-ES renders for a v6e task (the real renderer, not a hand-made dict)."""
    return render_job(
        task_id=task_id, spec={"image": image, "command": ["python", "train.py"]},
        shape=slice_shape("v6e", topology), pool_name=f"falcon-{task_id}-{topology}",
        placement=JobPlacement(namespace=namespace, service_account="falcon-task",
                               bucket="falcon-logs"),
    )


def google_credentials(server: FakeKubeServer) -> google.oauth2.credentials.Credentials:
    """Real google-auth OAuth2 credentials whose token endpoint is the fake's ``/token``."""
    return google.oauth2.credentials.Credentials(
        token=None, refresh_token=fake_kube.REFRESH_TOKEN, token_uri=f"{server.url}/token",
        client_id=fake_kube.CLIENT_ID, client_secret=fake_kube.CLIENT_SECRET,
    )


def auth_request(server: FakeKubeServer) -> google.auth.transport.requests.Request:
    """google-auth's HTTP transport, trusting the fake's CA for its token endpoint."""
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would otherwise replace ``verify``
    if server.tls_files is not None:
        session.verify = str(server.tls_files.ca_path)
    return google.auth.transport.requests.Request(session)


def access_tokens(server: FakeKubeServer, **options: Any) -> GoogleAccessTokens:
    return GoogleAccessTokens(google_credentials(server), auth_request=auth_request(server),
                              **options)


def edge_clusters_for(server: FakeKubeServer, **options: Any) -> KubeEdgeClusters:
    """KubeEdgeClusters whose every cluster is the fake (endpoint and CA as GKE gives)."""
    tokens = options.pop("tokens", None) or access_tokens(server)
    return KubeEdgeClusters(lambda cluster: KubeEndpoint(server.url, server.ca_pem),
                            tokens=tokens, namespace=server.namespace, **options)


@pytest.fixture
def kube_server() -> Iterator[FakeKubeServer]:
    server = FakeKubeServer().start()
    yield server
    server.stop()


@pytest.fixture
def edge_clusters(kube_server: FakeKubeServer) -> Iterator[KubeEdgeClusters]:
    clusters = edge_clusters_for(kube_server, request_timeout_seconds=10.0)
    yield clusters
    clusters.close()
