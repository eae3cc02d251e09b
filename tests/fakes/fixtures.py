"""Fixtures for the gcp backend's tests: Google's Pub/Sub emulator and a fake
Kubernetes API server. Test modules import the fixtures they use by name.

The emulator is started once per test session even when several modules import the
fixture (pytest registers an imported fixture once per module): the running emulator
is kept in the session's ``config.stash`` and stopped, by pid, when the session ends.
If it is not installed the tests fail with a message saying how to install it; they
never skip.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from falcon_es.adapters.gcp.pubsub import PubSubBus
from tests.fakes.pubsub_emulator import EmulatorError, PubSubEmulator

_EMULATOR = pytest.StashKey[PubSubEmulator]()


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

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        with self._changed:
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
