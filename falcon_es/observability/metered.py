"""Ports that report every external call to the metrics: latency, and errors by code.

One wrapper per port, put around whichever backend runs (sim or gcp) by the
composition root, so handlers, the effect executor and the outbox stay unaware of
metrics and every call is counted once, at the boundary. Method labels are the
external API's own names (``create_node_pool``, ``create_job``, ``publish``), the
vocabulary the dashboard and the retry counter share (``METHOD_OF_STEP``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain.ports import Ports
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import COMPUTE, GKE, KUBERNETES, PUBSUB

#: Port method -> the API method it calls, per port.
NODE_POOL_METHODS = MappingProxyType({
    "create": "create_node_pool", "get_operation": "get_operation", "get": "get_node_pool",
    "delete": "delete_node_pool", "list": "list_node_pools",
})
RESERVATION_METHODS = MappingProxyType({"remaining_slices": "get_reservation",
                                         "capacity": "get_reservation"})
EDGE_METHODS = MappingProxyType({
    "submit_job": "create_job", "get_job": "read_job", "delete_job": "delete_job",
    "node_counts": "list_nodes", "diagnose_pending": "diagnose_pending",
})
BUS_METHODS = MappingProxyType({"publish": "publish", "pull": "pull", "ack": "acknowledge"})
#: The API method behind each step the effect executor retries (``ApiCallRetrying.step``).
METHOD_OF_STEP = MappingProxyType({
    "pool-create": "create_node_pool", "pool-delete": "delete_node_pool",
    "job-submit": "create_job", "job-delete": "delete_job",
    "reservation-check": "get_reservation",
})


class MeteredPort:
    """Forwards to ``inner``; the methods named in ``methods`` are timed as calls to
    ``api`` (an exception is counted with its code and raised again)."""

    def __init__(self, inner: Any, api: str, methods: Mapping[str, str], metrics: Any) -> None:
        self._inner = inner
        self._api = api
        self._methods = methods
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        method = self._methods.get(name)
        if method is None:
            return attribute
        return self._timed(attribute, method)

    def _timed(self, call: Callable[..., Any], method: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self._metrics.timed_call(self._api, method):
                return call(*args, **kwargs)
        return timed


class MeteredEdges:
    """Each edge cluster's Kubernetes API, metered."""

    def __init__(self, inner: Any, metrics: Any) -> None:
        self._inner = inner
        self._metrics = metrics

    def for_cluster(self, cluster: Cluster) -> MeteredPort:
        return MeteredPort(self._inner.for_cluster(cluster), KUBERNETES, EDGE_METHODS,
                           self._metrics)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def metered_ports(ports: Ports, metrics: Any) -> Ports:
    """The same ports, every external call observed by ``metrics``."""
    return dataclasses.replace(
        ports,
        node_pools=MeteredPort(ports.node_pools, GKE, NODE_POOL_METHODS, metrics),
        reservations=MeteredPort(ports.reservations, COMPUTE, RESERVATION_METHODS, metrics),
        edges=MeteredEdges(ports.edges, metrics),
        bus=MeteredPort(ports.bus, PUBSUB, BUS_METHODS, metrics),
    )
