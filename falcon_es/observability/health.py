"""The health and metrics HTTP server: ``/healthz``, ``/readyz``, ``/metrics``, ``/clusters``.

It runs in a daemon thread of the controller process and only reads what the run loop
tells it (``mark_tick``, ``set_leader``, ``set_ready``) plus the callables the bootstrap
wires, so a stuck loop shows up as a failing liveness probe rather than as a server
that also hangs.

- ``/healthz`` (liveness): 200 while the loop ticked within ``max_tick_age`` seconds
  (counting from start until the first tick, so a long catch-up is not killed if it
  keeps calling ``mark_tick``); 503 otherwise: the kubelet restarts a stuck replica.
  Its detail names every cluster API that does not answer (``set_unanswered``): the
  controller stays live for the other clusters, and the probe says which one is sick.
- ``/readyz`` (readiness): 200 when the database answers and the replica says it is
  caught up. A standby replica is ready too (it serves metrics and takes over from the
  log), and the JSON body says ``leader`` or ``standby``. While the database is
  unavailable (the loop retries it in the process) the replica says it is not caught
  up, with the database's error in ``detail``, so /readyz fails even between checks.
- ``/metrics``: the Prometheus text exposition of the process's own registry.
- ``/clusters``: JSON per cluster: reservation remaining, active pools with topology,
  queue depths and running counts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger("falcon_es.health")

LEADER, STANDBY = "leader", "standby"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"


class HealthError(RuntimeError):
    """The health server cannot start (port taken, bad address)."""


@dataclasses.dataclass(frozen=True)
class Response:
    status: HTTPStatus
    content_type: str
    body: bytes

    @classmethod
    def json(cls, status: HTTPStatus, payload: Any) -> Response:
        return cls(status, JSON_TYPE, (json.dumps(payload, ensure_ascii=False, default=str)
                                       + "\n").encode("utf-8"))

    @classmethod
    def text(cls, status: HTTPStatus, text: str) -> Response:
        return cls(status, TEXT_TYPE, (text + "\n").encode("utf-8"))


class HealthServer:
    """Serves the probes and the metrics; started and stopped by the run loop.

    ``database_check`` raises when the database is unreachable (``SELECT 1``);
    ``metrics`` returns the exposition bytes; ``clusters`` returns the overview list.
    All three run on the server's request threads.
    """

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = 8080,
        max_tick_age: float = 60.0,
        database_check: Callable[[], None] | None = None,
        metrics: Callable[[], bytes] | None = None,
        clusters: Callable[[], list[dict[str, Any]]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_tick_age <= 0:
            raise ValueError(f"max_tick_age={max_tick_age}: must be positive")
        self.host = host
        self.requested_port = port
        self.max_tick_age = max_tick_age
        self._database_check = database_check
        self._metrics = metrics
        self._clusters = clusters
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._started_at = monotonic()
        self._last_tick: float | None = None
        self._leader = False
        self._caught_up = False
        self._ready_detail = "starting: catching up with the log"
        self._unanswered: tuple[str, ...] = ()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ run loop side
    def mark_tick(self, now: float | None = None) -> None:
        """The loop is alive (call after every tick, and during a long catch-up)."""
        with self._lock:
            self._last_tick = self._monotonic() if now is None else now

    def set_leader(self, is_leader: bool) -> None:
        with self._lock:
            self._leader = is_leader

    def set_ready(self, caught_up: bool, detail: str = "") -> None:
        """Caught up (intents re-issued, informers resynced) or not, and why."""
        with self._lock:
            self._caught_up = caught_up
            self._ready_detail = detail or ("caught up" if caught_up else "catching up")

    def set_unanswered(self, sentences: list[str]) -> None:
        """The cluster APIs that do not answer now, one sentence each (none: all do)."""
        with self._lock:
            self._unanswered = tuple(sentences)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Bind and serve in a daemon thread; returns the port (useful with port 0)."""
        if self._server is not None:
            return self.port
        try:
            server = ThreadingHTTPServer((self.host, self.requested_port), self._handler_class())
        except OSError as error:
            raise HealthError(
                f"health server cannot listen on {self.host}:{self.requested_port}: "
                f"{error.strerror or error}") from error
        server.daemon_threads = True
        self._server = server
        with self._lock:
            self._started_at = self._monotonic()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05},
            name="falcon-health", daemon=True)
        self._thread.start()
        log.info("health server listening on %s:%d", self.host, self.port)
        return self.port

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server, self._thread = None, None

    @property
    def port(self) -> int:
        if self._server is None:
            raise HealthError("health server is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the endpoints
    def healthz(self) -> Response:
        now = self._monotonic()
        with self._lock:
            last, started, unanswered = self._last_tick, self._started_at, self._unanswered
        since = now - (last if last is not None else started)
        what = "last tick" if last is not None else "started, no tick yet,"
        if since <= self.max_tick_age:
            sick = "".join(f"; {sentence}" for sentence in unanswered)
            return Response.text(HTTPStatus.OK, f"ok: {what} {since:.1f}s ago{sick}")
        return Response.text(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"unhealthy: {what} {since:.1f}s ago (limit {self.max_tick_age:.0f}s)")

    def readyz(self) -> Response:
        with self._lock:
            leader, caught_up, detail = self._leader, self._caught_up, self._ready_detail
        database = "ok"
        if self._database_check is not None:
            try:
                self._database_check()
            except Exception as error:  # any driver error means "not reachable"
                database = f"unreachable: {_first_line(error)}"
        ready = database == "ok" and caught_up
        body = {"ready": ready, "role": LEADER if leader else STANDBY,
                "database": database, "caught_up": caught_up, "detail": detail}
        return Response.json(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, body)

    def metrics(self) -> Response:
        if self._metrics is None:
            return Response.text(HTTPStatus.NOT_FOUND, "metrics are not wired in this process")
        return Response(HTTPStatus.OK, CONTENT_TYPE_LATEST, self._metrics())

    def clusters(self) -> Response:
        if self._clusters is None:
            return Response.text(HTTPStatus.NOT_FOUND, "the cluster overview is not wired "
                                 "in this process")
        try:
            return Response.json(HTTPStatus.OK, self._clusters())
        except Exception as error:  # a failing source must not kill the request thread
            log.warning("cluster overview failed: %s", error)
            return Response.json(HTTPStatus.SERVICE_UNAVAILABLE,
                                 {"error": f"cluster overview failed: {_first_line(error)}"})

    def respond(self, path: str) -> Response:
        route = path.split("?", 1)[0].rstrip("/") or "/"
        if route == "/healthz":
            return self.healthz()
        if route == "/readyz":
            return self.readyz()
        if route == "/metrics":
            return self.metrics()
        if route == "/clusters":
            return self.clusters()
        return Response.text(HTTPStatus.NOT_FOUND,
                             f"no such endpoint {route}; try /healthz, /readyz, /metrics, /clusters")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        health = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "falcon-es"

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                response = health.respond(self.path)
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(response.body)

            def do_HEAD(self) -> None:  # noqa: N802
                response = health.respond(self.path)
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("%s " + format, self.address_string(), *args)

        return Handler


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
