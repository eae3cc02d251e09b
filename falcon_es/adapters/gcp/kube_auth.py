"""Where an edge cluster's Kubernetes API server is, and the token to present to it.

Where: the API server's address and CA come from GKE's ``get_cluster`` (``endpoint``
and the base64 ``master_auth.cluster_ca_certificate``) through an ``EndpointProvider``,
so no kubeconfig exists anywhere. As whom: the bearer token is a Google access token
from ``google.auth.default()`` (Workload Identity in the central cluster).

The token: kubernetes 37 asks ``refresh_api_key_hook`` for the key before every
request, but sends a bearer token only when ``api_key`` already holds a key under
``BearerToken`` or ``authorization`` (``Configuration.auth_settings``), so the key is
seeded and the hook keeps it current. The hook refreshes the credentials a margin
*before* they expire, so a reconnecting watch never presents a token that is about to
lapse; long watches therefore outlive any one token (the informer reconnects them).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Sequence
from typing import Any

import google.auth
import google.auth.transport.requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import Credentials
import urllib3
from kubernetes import client

from falcon_es.adapters.gcp.errors import port_error
from falcon_es.domain.clock import Clock, WallClock, utcnow
from falcon_es.domain.ports import INVALID, PERMISSION_DENIED, RETRYABLE, PortError
from falcon_es.domain.clusters import Cluster

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Refresh this long before the token expires (google-auth itself says 3 min 45 s).
DEFAULT_REFRESH_MARGIN_SECONDS = 300
_PLACEHOLDER_TOKEN = "token-not-fetched-yet"
#: One attempt per call: no connect, read or status retries by urllib3
#: (``Configuration.retries`` is handed to its PoolManager).
NO_RETRIES = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0)


@dataclasses.dataclass(frozen=True)
class KubeEndpoint:
    """Where an edge cluster's API server listens and the CA that signs its certificate
    (PEM text; None trusts the system store, as for a DNS endpoint with a public CA)."""

    host: str
    ca_cert_pem: str | None


EndpointProvider = Callable[[Cluster], KubeEndpoint]


def endpoint_from_gke(gke_cluster: Any) -> KubeEndpoint:
    """The API server of a ``google.cloud.container_v1.Cluster`` (get_cluster's answer).

    The IP endpoint is preferred; a cluster with only the DNS-based control-plane
    endpoint is reached through that name.
    """
    address = gke_cluster.endpoint
    if not address:
        dns = gke_cluster.control_plane_endpoints_config.dns_endpoint_config.endpoint
        address = dns
    if not address:
        raise PortError(INVALID, f"GKE cluster {gke_cluster.name} reports no control-plane "
                                 "endpoint (is it still being created?)")
    encoded = gke_cluster.master_auth.cluster_ca_certificate
    ca_pem = None
    if encoded:
        try:
            ca_pem = base64.b64decode(encoded, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError) as error:
            raise PortError(INVALID, f"GKE cluster {gke_cluster.name}: cluster CA certificate "
                                     f"is not base64 PEM ({error})") from None
    host = address if address.startswith(("https://", "http://")) else f"https://{address}"
    return KubeEndpoint(host, ca_pem)


class GkeEndpoints:
    """An ``EndpointProvider`` that asks GKE: ``get_cluster`` on the cluster's resource
    name (``projects/P/locations/L/clusters/N``) with a ClusterManagerClient."""

    def __init__(self, cluster_manager: Any, *, timeout: float = 20.0) -> None:
        self._cluster_manager = cluster_manager
        self._timeout = timeout

    def __call__(self, cluster: Cluster) -> KubeEndpoint:
        name = f"projects/{cluster.project}/locations/{cluster.location}/clusters/{cluster.name}"
        try:
            gke_cluster = self._cluster_manager.get_cluster(name=name, timeout=self._timeout,
                                                            retry=None)
        except gexc.GoogleAPIError as error:
            raise port_error(error, f"reading GKE cluster {name} for its endpoint") from error
        return endpoint_from_gke(gke_cluster)


class _DeadlineRequest(google.auth.transport.requests.Request):
    """google-auth's requests transport with our deadline on each token request (its
    own default is 120 s, which a token endpoint that does not answer would cost)."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._deadline = timeout

    def __call__(self, url: str, method: str = "GET", body: Any = None,
                 headers: Any = None, timeout: float | None = None, **kwargs: Any) -> Any:
        return super().__call__(url, method=method, body=body, headers=headers,
                                timeout=timeout or self._deadline, **kwargs)


class GoogleAccessTokens:
    """Google OAuth2 access tokens for the Kubernetes API, refreshed before expiry.

    ``credentials`` default to ``google.auth.default()`` (fetched on first use);
    ``auth_request`` is the google-auth transport used to refresh them.
    """

    def __init__(
        self,
        credentials: Credentials | None = None,
        *,
        scopes: Sequence[str] = (CLOUD_PLATFORM_SCOPE,),
        refresh_margin_seconds: float = DEFAULT_REFRESH_MARGIN_SECONDS,
        clock: Clock | None = None,
        auth_request: google.auth.transport.Request | None = None,
        timeout_seconds: float = 20.0,
    ) -> None:
        self._credentials = credentials
        self._timeout = timeout_seconds
        self._scopes = tuple(scopes)
        self._margin = dt.timedelta(seconds=refresh_margin_seconds)
        self._clock = clock or WallClock()
        self._auth_request = auth_request
        self._lock = threading.Lock()
        self._valid_until: dt.datetime | None = None
        self.refreshes = 0

    def token(self) -> str:
        """The access token to send now: refreshed first when it is missing or within
        the margin of its expiry, so no request carries a token that lapses in flight."""
        with self._lock:
            credentials = self._ensure_credentials()
            if self._needs_refresh(credentials):
                self._refresh(credentials)
            return str(credentials.token)

    def invalidate(self) -> None:
        """Forget the current token (the API server refused it): the next call refreshes."""
        with self._lock:
            self._valid_until = None
            if self._credentials is not None:
                self._credentials.token = None

    def _ensure_credentials(self) -> Credentials:
        if self._credentials is None:
            try:
                self._credentials, _ = google.auth.default(scopes=list(self._scopes))
            except auth_exceptions.DefaultCredentialsError as error:
                raise PortError(PERMISSION_DENIED, "no Google credentials for the Kubernetes "
                                                   f"API: {error}") from None
        return self._credentials

    def _needs_refresh(self, credentials: Credentials) -> bool:
        if not credentials.token:
            return True
        if self._valid_until is None:
            if credentials.expiry is None:
                return False  # a token without expiry: kept until the server refuses it
            self._valid_until = self._on_our_clock(credentials.expiry)
        return self._clock.now() >= self._valid_until - self._margin

    def _on_our_clock(self, expiry: dt.datetime) -> dt.datetime:
        """google-auth stamps ``expiry`` with the wall clock; what counts is the token's
        remaining lifetime, measured from now on the injected clock."""
        return self._clock.now() + (expiry.replace(tzinfo=None) - utcnow())

    def _refresh(self, credentials: Credentials) -> None:
        request = self._auth_request or _DeadlineRequest(self._timeout)
        try:
            credentials.refresh(request)
        except auth_exceptions.RefreshError as error:
            code = RETRYABLE if getattr(error, "retryable", False) else PERMISSION_DENIED
            raise PortError(code, f"refreshing the Google access token: {error}") from None
        except auth_exceptions.TransportError as error:
            raise PortError(RETRYABLE, f"refreshing the Google access token: {error}",
                            unanswered=True) from None
        self.refreshes += 1
        expiry = credentials.expiry
        self._valid_until = self._on_our_clock(expiry) if expiry is not None else None


def kube_configuration(endpoint: KubeEndpoint, tokens: GoogleAccessTokens) -> client.Configuration:
    """A client Configuration whose bearer token is asked for before every request."""
    configuration = client.Configuration(host=endpoint.host, ca_cert_data=endpoint.ca_cert_pem)
    # One key, "authorization", everywhere: the client looks a key up under
    # "BearerToken" first, so a seeded "BearerToken" would win and be sent forever
    # while the hook updated "authorization".
    configuration.api_key = {"authorization": _PLACEHOLDER_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}

    def refresh(config: client.Configuration) -> None:
        config.api_key["authorization"] = tokens.token()

    # The client declares the hook None-only, yet calls it before every request.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    # urllib3's default (Retry(3)) would make a call to an API that does not answer
    # cost four deadlines; the controller's own paced retries are the only ones.
    configuration.retries = NO_RETRIES
    return configuration
