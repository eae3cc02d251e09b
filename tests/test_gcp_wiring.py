"""``build_gcp_ports`` from the environment: what it needs, and the one-line errors
``falcon-es run --backend gcp`` gives when something is missing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from falcon_es.adapters.gcp import GcpConfigError, build_gcp_backend, build_gcp_ports
from falcon_es.adapters.gcp.gke import GkeNodePools
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.adapters.gcp.wiring import is_local
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings, SettingsError

NO_ADC = {"GOOGLE_APPLICATION_CREDENTIALS": "", "NO_GCE_CHECK": "True",
          "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
          "CLOUDSDK_CONFIG": "/nonexistent-gcloud-config"}


def key_file(directory: Path, project: str | None) -> Path:
    """A service-account key as gcloud writes it (nothing ever asks it for a token here)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "private_key_id": "k", "private_key": pem,
            "client_email": "falcon@p.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": "http://127.0.0.1:9/token"}
    if project:
        info["project_id"] = project
    path = directory / "key.json"
    path.write_text(json.dumps(info))
    return path


@pytest.fixture
def no_adc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in NO_ADC.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("HOME", str(tmp_path))


def test_run_gcp_without_credentials_is_one_line(no_adc: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 'f.db'}", "run",
                                       "--backend", "gcp", "--no-health"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("falcon-es: no Google credentials found (")
    assert "Workload Identity" in line and "gcloud auth application-default login" in line


def test_the_pubsub_project_comes_from_settings_or_the_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:9")  # nothing is called
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file(tmp_path, None)))
    settings = Settings.from_env({"FALCON_GKE_ENDPOINT": "http://127.0.0.1:9",
                                  "FALCON_COMPUTE_ENDPOINT": "http://127.0.0.1:9"})
    with pytest.raises(GcpConfigError) as refused:
        build_gcp_ports(settings)
    assert str(refused.value) == (
        "no project for the Pub/Sub topics: set FALCON_PUBSUB_PROJECT (or GOOGLE_CLOUD_PROJECT) "
        "to the project that holds falcon-edge-events and falcon-task-events")
    assert isinstance(refused.value, SettingsError)  # the CLI makes it one line

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file(tmp_path, "adc-proj")))
    clock = VirtualClock(dt.datetime(2026, 11, 1))
    backend = build_gcp_backend(settings, clock=clock)
    try:
        ports = backend.ports()
        assert isinstance(ports.node_pools, GkeNodePools)
        assert isinstance(ports.edges, KubeEdgeClusters)
        assert isinstance(ports.bus, PubSubBus) and ports.bus.project == "adc-proj"
        assert ports.clock is clock and ports.next_due is None
        assert backend.adc_project == "adc-proj"
        assert "falcon@p.iam.gserviceaccount.com" == backend.credentials.service_account_email
    finally:
        backend.close()

    named = Settings.from_env({"GOOGLE_CLOUD_PROJECT": "central", "FALCON_PUBSUB_PROJECT": ""})
    assert named.gcp.pubsub_project == "central"


def test_endpoint_settings() -> None:
    settings = Settings.from_env({"FALCON_GKE_ENDPOINT": "http://127.0.0.1:1234",
                                  "FALCON_GKE_TRANSPORT": "rest",
                                  "FALCON_COMPUTE_ENDPOINT": "compute.example:443",
                                  "FALCON_EDGE_EVENTS_TOPIC": "edge",
                                  "FALCON_TASK_EVENTS_TOPIC": "ops"})
    assert (settings.gcp.gke_endpoint, settings.gcp.gke_transport, settings.gcp.compute_endpoint) == (
        "http://127.0.0.1:1234", "rest", "compute.example:443")
    assert (settings.bus.edge_events_topic, settings.bus.task_events_topic) == ("edge", "ops")
    assert is_local(settings.gcp.gke_endpoint) and not is_local(settings.gcp.compute_endpoint)
    with pytest.raises(SettingsError, match="FALCON_GKE_TRANSPORT='http': expected one of "
                                            "grpc, rest"):
        Settings.from_env({"FALCON_GKE_TRANSPORT": "http"})
