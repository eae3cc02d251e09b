"""Google Cloud and Kubernetes backends of the ports (google-cloud-* clients, kubernetes)."""
