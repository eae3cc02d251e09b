"""Google Cloud and Kubernetes backends of the ports (google-cloud-* clients, kubernetes).

This package's ``__init__`` imports ``wiring``, which imports the other modules; so
they take what they share from each other's modules (``from
falcon_es.adapters.gcp.pools import node_pool``), never from this package, which is
only half-run while they load.
"""

from falcon_es.adapters.gcp.wiring import GcpConfigError, build_gcp_backend, build_gcp_ports

__all__ = ["GcpConfigError", "build_gcp_backend", "build_gcp_ports"]
