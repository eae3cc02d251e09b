"""Google Cloud and Kubernetes backends of the ports (google-cloud-* clients, kubernetes)."""

from falcon_es.adapters.gcp.wiring import GcpConfigError, build_gcp_backend, build_gcp_ports

__all__ = ["GcpConfigError", "build_gcp_backend", "build_gcp_ports"]
