"""What an operator sees of a running controller: Prometheus metrics, the health and
metrics HTTP server, structured logs without credentials.

The bootstrap creates one ``Metrics`` and one ``HealthServer`` per process (no
module-level registry). External calls are observed at the port boundary
(``metered.metered_ports`` wraps whichever backend runs); the rest reaches the
``Metrics`` through its small methods (``set_reservation_remaining``, ``set_lag``, ...)
and its inline projection of the log.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from falcon_es.observability.health import HealthServer
from falcon_es.observability.logs import LOG_FORMATS, configure_logging, redact
from falcon_es.observability.metrics import Metrics, MetricsProjection, PoolSample

__all__ = [
    "HealthServer", "LOG_FORMATS", "Metrics", "MetricsProjection", "ObservabilityConfigError",
    "ObservabilitySettings",
    "PoolSample", "configure_logging", "redact",
]


class ObservabilityConfigError(ValueError):
    """A FALCON_HEALTH_* / FALCON_LOG_* variable holds an unusable value."""


@dataclasses.dataclass(frozen=True)
class ObservabilitySettings:
    """Where the health server listens, how stale a tick may be, how logs look."""

    health_host: str = "0.0.0.0"
    health_port: int = 8080
    max_tick_age_seconds: float = 60.0
    log_format: str = "text"
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ObservabilitySettings:
        """``FALCON_HEALTH_HOST``, ``FALCON_HEALTH_PORT``, ``FALCON_HEALTH_MAX_TICK_AGE``,
        ``FALCON_LOG_FORMAT`` (json | text), ``FALCON_LOG_LEVEL``."""
        env = os.environ if environ is None else environ
        port_text = env.get("FALCON_HEALTH_PORT") or str(cls.health_port)
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ObservabilityConfigError(
                f"FALCON_HEALTH_PORT={port_text!r}: expected a port number 0-65535")
        age_text = env.get("FALCON_HEALTH_MAX_TICK_AGE") or str(cls.max_tick_age_seconds)
        try:
            age = float(age_text)
        except ValueError:
            age = -1.0
        if age <= 0:
            raise ObservabilityConfigError(
                f"FALCON_HEALTH_MAX_TICK_AGE={age_text!r}: expected a positive number of seconds")
        log_format = (env.get("FALCON_LOG_FORMAT") or cls.log_format).lower()
        if log_format not in LOG_FORMATS:
            raise ObservabilityConfigError(
                f"FALCON_LOG_FORMAT={log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
        return cls(
            health_host=env.get("FALCON_HEALTH_HOST") or cls.health_host,
            health_port=int(port_text),
            max_tick_age_seconds=age,
            log_format=log_format,
            log_level=(env.get("FALCON_LOG_LEVEL") or cls.log_level).upper(),
        )
