"""What an operator sees of a running controller: Prometheus metrics, the health and
metrics HTTP server, structured logs without credentials.

The bootstrap creates one ``Metrics`` and one ``HealthServer`` per process (no
module-level registry). External calls are observed at the port boundary
(``metered.metered_ports`` wraps whichever backend runs); the rest reaches the
``Metrics`` through its small methods (``set_reservation_remaining``, ``set_lag``, ...)
and its inline projection of the log. Its settings are the ``observability`` group of
``falcon_es.config.settings``, re-exported here.
"""

from __future__ import annotations

from falcon_es.config.errors import ObservabilityConfigError
from falcon_es.config.settings import ObservabilitySettings
from falcon_es.observability.health import HealthServer
from falcon_es.observability.logs import LOG_FORMATS, configure_logging, redact
from falcon_es.observability.metrics import Metrics, MetricsProjection, PoolSample

__all__ = [
    "HealthServer", "LOG_FORMATS", "Metrics", "MetricsProjection", "ObservabilityConfigError",
    "ObservabilitySettings",
    "PoolSample", "configure_logging", "redact",
]
