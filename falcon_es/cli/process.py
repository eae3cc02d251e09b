"""The set-up of a long-running ``falcon-es`` process, written once for ``run`` (the
controller) and ``informer``: logging, a stop Event set by SIGINT/SIGTERM, the health
server, the worker threads' shutdown, and the choice and construction of the leader
election.

Small functions rather than one context manager: each command keeps its own order
(``run`` installs the signal handlers only once its controller is built and its
health server listens, ``informer`` before it starts its health server) and its own
shutdown sequence (``run`` releases its database lock after its threads have ended
and before its health server stops).
The observability and Kubernetes modules are imported inside the functions, so
``falcon-es --help`` and the short commands do not pay for them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from falcon_es.cli.common import Failure

if TYPE_CHECKING:
    from falcon_es.adapters.gcp.lease import LeaseElector
    from falcon_es.config.settings import ObservabilitySettings, Settings
    from falcon_es.observability.health import HealthServer
    from falcon_es.observability.metrics import Metrics

#: Seconds shutdown waits for each worker thread (an informer's watch) to end.
THREAD_JOIN_SECONDS = 30


def configure_logs(settings: Settings, log_format: str | None) -> ObservabilitySettings:
    """Configure logging with the observability settings; ``--log-format`` wins over
    their format. They are returned for the health server and the heartbeat."""
    from falcon_es.observability.logs import configure_logging

    observability = settings.observability
    if log_format:
        observability = observability.model_copy(update={"log_format": log_format})
    configure_logging(observability.log_format, observability.log_level)
    return observability


def stop_on_signals() -> threading.Event:
    """An Event that SIGINT and SIGTERM set, so the process finishes what it is doing (a
    tick, a watch) and shuts down in order instead of being killed mid-commit."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def start_health_server(
    observability: ObservabilitySettings, metrics: Metrics, *,
    database_check: Callable[[], None] | None = None,
    clusters: Callable[[], list[dict[str, Any]]] | None = None,
) -> HealthServer:
    """/healthz, /readyz and /metrics (and /clusters when given) on
    FALCON_HEALTH_HOST:FALCON_HEALTH_PORT, listening when this returns; the caller
    stops it."""
    from falcon_es.observability.health import HealthServer

    server = HealthServer(host=observability.health_host, port=observability.health_port,
                          max_tick_age=observability.max_tick_age_seconds,
                          database_check=database_check, metrics=metrics.exposition,
                          clusters=clusters)
    server.start()
    return server


def stop_threads(stop: threading.Event, threads: Iterable[threading.Thread]) -> None:
    """Set ``stop`` and give each thread watching it a bounded time to end (they are
    daemons: one stuck in a network call does not keep the process alive)."""
    stop.set()
    for thread in threads:
        thread.join(timeout=THREAD_JOIN_SECONDS)


def default_leader_election(settings: Settings, backend: str) -> str:
    """The configured election, else a lease where several replicas can run (in a
    Kubernetes cluster, real backends); elsewhere the database lock, which refuses a
    second controller started by mistake."""
    if settings.run.leader_election:
        return settings.run.leader_election
    in_cluster = bool(settings.run.kubernetes_service_host)
    return "lease" if backend == "gcp" and in_cluster else "db"


def lease_elector(settings: Settings) -> LeaseElector:
    """This replica's candidate in the Kubernetes Lease election, configured from
    FALCON_LEASE_*; a bad setting, or no cluster to hold a lease in, is one line for the
    user."""
    from falcon_es.adapters.gcp.lease import LeaseElector, LeaseUnavailable, in_cluster_api
    from falcon_es.config.errors import LeaseConfigError

    try:
        return LeaseElector.from_settings(in_cluster_api(), settings.lease)
    except (LeaseConfigError, LeaseUnavailable) as error:
        raise Failure(str(error)) from error
