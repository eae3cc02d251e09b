"""A local Kubernetes API server that speaks the real HTTP/JSON wire protocol.

The official ``kubernetes`` client talks to it unchanged (URL templates, query
parameters, chunked watch streams, Status errors), so the edge-cluster adapter and the
informer are tested through the library's own serialisation and watch machinery.

What it serves, on 127.0.0.1 at a free port, over TLS with its own CA by default (the
CA is what GKE's ``get_cluster`` would hand out, base64-encoded):

- ``/version``; ``/token``, an OAuth2 token endpoint (refresh-token grant) that issues
  short-lived access tokens, as Google's would for the google-auth credentials;
- ``batch/v1`` Jobs: create, get (and ``/status``), list, watch, delete with
  ``propagationPolicy`` (Background/Foreground take the pods along; Orphan or none
  leaves them, which is what batch/v1 does by default);
- ``core/v1`` Pods (get, list, watch), Nodes (list), Events (list, watch) with label
  and field selectors; ``record_event`` aggregates a repeated event as client-go's
  recorder does (same object, reason and message: one event, ``count`` and
  ``lastTimestamp`` updated), which is how the Job controller's FailedCreate shows.
- ``core/v1`` Services: create (``409 AlreadyExists`` for a taken name), get, list,
  delete (honouring a uid precondition with ``409 Conflict``). The garbage collector is
  modelled for them: deleting a Job with Background or Foreground propagation deletes
  the Services whose ownerReferences name the Job's uid in the same request (the real
  collector does it moments later, asynchronously); Orphan or no policy strips the
  ownerReference and leaves them.
- ``jobset.x-k8s.io/v1alpha2`` JobSets (a custom resource, served unless the fake is
  made with ``jobset_crd=False``, when the API server answers 404 for the resource type
  as it does without the CRD): create, get, list, watch, delete. A small JobSet
  controller creates, for each replicatedJob, ``replicas`` child Jobs named
  ``<jobset>-<replicatedJob>-<index>`` (labelled ``jobset.sigs.k8s.io/jobset-name``,
  owned by the JobSet) and a headless Service named after the JobSet; deleting the
  JobSet with Background or Foreground propagation deletes them (and the children's
  pods). ``refuse_followers`` records the pod webhook's FailedCreate on a child Job.
  ``job_quota`` (a ResourceQuota on ``count/jobs.batch``, None: none) refuses Job
  creates past it with the quota plugin's 403; the controller records the children it
  could not create as one ``JobCreationFailed`` event on the JobSet, in its words
  (``job %q creation failed with error: %v``, joined by newlines).
- ``coordination.k8s.io/v1`` Leases (get, create, replace) for leader election:
  a replace whose ``resourceVersion`` is not the current one is a ``409 Conflict``,
  and times must be MicroTime (RFC 3339 with exactly six fractional digits and a
  zone), which is what the real API server parses them with.

Every resource shares one resourceVersion counter, like etcd's revision, and every
change is kept in a history that watches replay from any resourceVersion not older
than the last compaction; older ones get the ``410 Gone`` ERROR event a real API
server sends. A small job controller keeps each Job's status (active, ready,
succeeded, failed, Complete/Failed conditions) in step with its pods.

Bearer tokens are checked on every request except ``/version`` and ``/token``: an
unknown or expired token is a 401 Status. With ``end_watch_at_token_expiry`` a watch
stream ends when the token that opened it expires, so a long watch only continues if
the client reconnects with a fresh token.

Faults on demand: any status on the next matching requests (``inject``), dropped watch
connections (``drop_watches``), gracefully ended watches (``end_watches``),
``410 Gone`` to open watches and a compacted history (``compact``), and revoked tokens
(``expire_tokens``). Time comes from an injectable clock (a VirtualClock in tests).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import http.server
import ipaddress
import itertools
import json
import re
import socket
import ssl
import tempfile
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from falcon_es.domain.clock import Clock, WallClock

REFRESH_TOKEN = "falcon-test-refresh-token"
CLIENT_ID = "falcon-test-client"
CLIENT_SECRET = "falcon-test-secret"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
CONTROLLER_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_WAIT_STEP = 0.02  # seconds a watch stream waits for news before looking again

KINDS: Mapping[str, tuple[str, str]] = {
    "jobs": ("Job", "batch/v1"),
    "pods": ("Pod", "v1"),
    "nodes": ("Node", "v1"),
    "events": ("Event", "v1"),
    "leases": ("Lease", "coordination.k8s.io/v1"),
    "services": ("Service", "v1"),
    "jobsets": ("JobSet", "jobset.x-k8s.io/v1alpha2"),
}
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: The JobSet pod webhook's refusals of a follower: with no node selector at all, and
#: with selectors but not the topology key's (Falcon's pods).
FOLLOWER_REFUSAL = ('Error creating: admission webhook "vpod.kb.io" denied the request: '
                    "follower pod node selector not set")
FOLLOWER_MISSING_SELECTOR = ('Error creating: admission webhook "vpod.kb.io" denied the '
                             "request: follower pod node selector for topology domain not "
                             "found. missing selector: cloud.google.com/gke-nodepool")

_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^/version/?$"), "version"),
    (re.compile(r"^/token$"), "token"),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs$"), "jobs"),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)(?:/status)?$"),
     "job"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$"), "pod"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/services$"), "services"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<name>[^/]+)$"), "service"),
    (re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets$"),
     "jobsets"),
    (re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets/"
                r"(?P<name>[^/]+)(?:/status)?$"), "jobset"),
    (re.compile(r"^/api/v1/nodes$"), "nodes"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$"), "events"),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases$"), "leases"),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases/(?P<name>[^/]+)$"),
     "lease"),
)


class KubeApiError(Exception):
    """An API error, answered as a ``Status`` object with this code and reason."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "message": self.message,
                                "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


@dataclasses.dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    error: KubeApiError
    remaining: int
    watch: bool | None  # None: watches and plain requests alike


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: Mapping[str, str]
    token: str | None
    status: int
    body: Any = None


@dataclasses.dataclass
class _Watch:
    token: str | None
    dropped: bool = False
    ended: bool = False
    gone: bool = False
    bookmark: bool = False


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca_pem: str
    ca_path: Path
    cert_path: Path
    key_path: Path


def make_tls(directory: Path) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1 signed by it (EC keys: fast)."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    later = now + dt.timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "falcon-test-cluster-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (directory / "ca.crt", directory / "server.crt",
                                    directory / "server.key")
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return TlsFiles(ca_cert.public_bytes(serialization.Encoding.PEM).decode(), ca_path, cert_path,
                    key_path)


def timestamp(moment: dt.datetime) -> str:
    return moment.replace(tzinfo=None, microsecond=0).isoformat() + "Z"


# --------------------------------------------------------------------- selectors

def _split_requirements(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


@dataclasses.dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str  # = != in notin exists !exists
    values: frozenset[str] = frozenset()

    def matches(self, value: str | None) -> bool:
        if self.operator == "exists":
            return value is not None
        if self.operator == "!exists":
            return value is None
        if self.operator in ("=", "in"):
            return value in self.values
        return value not in self.values  # != and notin


def _requirements(selector: str) -> list[_Requirement]:
    """Kubernetes selector syntax: =, ==, !=, in, notin, exists, !exists."""
    parsed = []
    for requirement in _split_requirements(selector or ""):
        set_match = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", requirement)
        if set_match:
            values = frozenset(v.strip() for v in set_match.group(3).split(","))
            parsed.append(_Requirement(set_match.group(1), set_match.group(2), values))
        elif "!=" in requirement:
            key, value = requirement.split("!=", 1)
            parsed.append(_Requirement(key.strip(), "!=", frozenset({value.strip()})))
        elif "=" in requirement:
            key, value = re.split(r"==?", requirement, maxsplit=1)
            parsed.append(_Requirement(key.strip(), "=", frozenset({value.strip()})))
        elif requirement.startswith("!"):
            parsed.append(_Requirement(requirement[1:].strip(), "!exists"))
        else:
            parsed.append(_Requirement(requirement, "exists"))
    return parsed


def label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    requirements = _requirements(selector)
    return lambda labels: all(r.matches(labels.get(r.key)) for r in requirements)


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def field_matcher(selector: str) -> Callable[[Mapping[str, Any]], bool]:
    """Field selectors (= and !=) over dotted paths: involvedObject.name, reason, ..."""
    requirements = _requirements(selector)
    return lambda obj: all(r.matches(str(_field(obj, r.key) or "")) for r in requirements)


# --------------------------------------------------------------------- the server

class FakeKubeServer:
    """One edge cluster's API server: state, behaviour, faults, and the HTTP listener."""

    def __init__(self, *, clock: Clock | None = None, tls: bool = True,
                 token_lifetime_seconds: int = 3600, end_watch_at_token_expiry: bool = True,
                 namespace: str = "falcon-jobs", first_resource_version: int = 1000,
                 jobset_crd: bool = True) -> None:
        self.clock = clock or WallClock()
        #: The JobSet CRD is installed (its resource type is served).
        self.jobset_crd = jobset_crd
        #: The namespace's ResourceQuota on ``count/jobs.batch`` (None: no quota).
        self.job_quota: int | None = None
        self.namespace = namespace
        self.token_lifetime = dt.timedelta(seconds=token_lifetime_seconds)
        self.end_watch_at_token_expiry = end_watch_at_token_expiry
        self._tls = tls
        self._cond = threading.Condition()
        self._rv = first_resource_version
        self._oldest_rv = first_resource_version
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._tokens: dict[str, dt.datetime] = {}
        self._token_ids = itertools.count(1)
        self._suffixes = itertools.count(1)
        self._faults: list[Fault] = []
        self._watches: dict[int, _Watch] = {}
        self._watch_ids = itertools.count(1)
        self._closing = False
        #: While set, every request is read and never answered (``hang``).
        self._hung = False
        #: Requests that arrived while hung, in order (method, path): each attempt once.
        self.unanswered: list[tuple[str, str]] = []
        self.requests: list[RequestRecord] = []
        #: Why each watch stream ended: gone, dropped, ended, timeout, token-expired, ...
        self.watch_endings: list[str] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-kube-")
        self.tls_files = make_tls(Path(self._tmp.name)) if tls else None
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake Kubernetes API server is not started")
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    @property
    def endpoint(self) -> str:
        """What GKE's ``Cluster.endpoint`` would say: host and port, no scheme."""
        return self.url.split("://", 1)[1]

    @property
    def ca_pem(self) -> str | None:
        return self.tls_files.ca_pem if self.tls_files else None

    def start(self) -> FakeKubeServer:
        server = _QuietServer(("127.0.0.1", 0), _handler(self))
        if self.tls_files is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls_files.cert_path, self.tls_files.key_path)
            server.socket = context.wrap_socket(server.socket, server_side=True,
                                                do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={"poll_interval": 0.01},
                                        name="fake-kube-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._tmp.cleanup()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- tokens ---------------------------------------------------------------------

    def issue_token(self, lifetime: dt.timedelta | None = None) -> str:
        with self._cond:
            token = f"ya29.fake-{next(self._token_ids)}"
            self._tokens[token] = self.clock.now() + (lifetime or self.token_lifetime)
            return token

    def expire_tokens(self) -> None:
        """Revoke every token issued so far (the next request with one is a 401)."""
        with self._cond:
            moment = self.clock.now()
            for token in self._tokens:
                self._tokens[token] = moment
            self._cond.notify_all()

    def token_valid(self, token: str | None) -> bool:
        expiry = self._tokens.get(token or "")
        return expiry is not None and self.clock.now() < expiry

    def tokens_used(self, path_prefix: str = "/") -> list[str]:
        """Distinct tokens that authorised requests under ``path_prefix``, in order."""
        seen: dict[str, None] = {}
        for record in list(self.requests):
            if record.token and record.path.startswith(path_prefix) and record.status != 401:
                seen.setdefault(record.token)
        return list(seen)

    # -- faults ---------------------------------------------------------------------

    def inject(self, method: str, path_pattern: str, code: int, *, reason: str | None = None,
               message: str | None = None, times: int = 1, watch: bool | None = None) -> None:
        """Answer the next ``times`` matching requests with this error instead."""
        reason = reason or {401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                            409: "AlreadyExists", 410: "Expired", 429: "TooManyRequests",
                            500: "InternalError", 503: "ServiceUnavailable"}.get(code, "Unknown")
        error = KubeApiError(code, reason, message or f"injected {code} {reason}")
        with self._cond:
            self._faults.append(Fault(method.upper(), re.compile(path_pattern), error, times,
                                      watch))

    def hang(self) -> None:
        """From now on the API server reads each request and never answers it (held
        until ``release`` or ``stop``): an API server that does not answer, as one
        behind a dead control plane or a black-holed network path does. Open watches
        are cut, so the informers' next requests hang too."""
        with self._cond:
            self._hung = True
        self.drop_watches()

    def release(self) -> None:
        """Answer again (the requests held so far are answered now)."""
        with self._cond:
            self._hung = False
            self._cond.notify_all()

    def _hold_while_hung(self, method: str, path: str) -> bool:
        """Hold a request while hung; True when it is never to be answered (the server
        stops meanwhile)."""
        with self._cond:
            if not self._hung:
                return False
            self.unanswered.append((method, path))
            while self._hung and not self._closing:
                self._cond.wait()
            return self._closing

    def drop_watches(self) -> int:
        """Cut every open watch connection without ending the HTTP response."""
        return self._mark_watches(dropped=True)

    def end_watches(self) -> int:
        """End every open watch cleanly, like the server's watch timeout does."""
        return self._mark_watches(ended=True)

    def send_bookmarks(self) -> int:
        """Send a BOOKMARK (the current resourceVersion) to watches that allow them."""
        return self._mark_watches(bookmark=True)

    def compact(self, *, expire_open_watches: bool = True) -> None:
        """Forget the history before now: a watch from an older resourceVersion is
        answered with 410 Gone; open watches get the 410 ERROR event too."""
        with self._cond:
            self._oldest_rv = self._rv
            self._history.clear()
        if expire_open_watches:
            self._mark_watches(gone=True)

    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def wait_for_watches(self, count: int, timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._watches) >= count, timeout):
                raise AssertionError(f"{len(self._watches)} watches open, expected {count}")

    def _mark_watches(self, **flags: bool) -> int:
        with self._cond:
            for state in self._watches.values():
                for name, value in flags.items():
                    setattr(state, name, value)
            self._cond.notify_all()
            return len(self._watches)

    # -- the world: nodes, pods, events, the job controller ---------------------------

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        with self._cond:
            obj = self._objects.get((resource, self._ns(resource, namespace), name))
            return copy.deepcopy(obj) if obj is not None else None

    def names(self, resource: str, namespace: str | None = None) -> list[str]:
        ns = self._ns(resource, namespace)
        with self._cond:
            return sorted(name for (kind, space, name) in self._objects
                          if kind == resource and space == ns)

    def add_node(self, name: str, pool: str, *, ready: bool = True,
                 labels: Mapping[str, str] | None = None) -> None:
        node = {
            "metadata": {"name": name, "labels": {NODEPOOL_LABEL: pool, **dict(labels or {})}},
            "spec": {},
            "status": {"conditions": [_node_ready(ready)]},
        }
        with self._cond:
            self._put("nodes", "", node, "ADDED")

    def set_node_ready(self, name: str, ready: bool) -> None:
        with self._cond:
            node = copy.deepcopy(self._objects[("nodes", "", name)])
            node["status"]["conditions"] = [_node_ready(ready)]
            self._put("nodes", "", node, "MODIFIED")

    def start_pods(self, job_name: str, count: int | None = None, *,
                   namespace: str | None = None) -> list[str]:
        """What the job controller does after a create: one Pending pod per index, up
        to the parallelism (names ``<job>-<index>-<suffix>``)."""
        ns = namespace or self.namespace
        with self._cond:
            job = self._objects.get(("jobs", ns, job_name))
            if job is None:
                raise KeyError(f"no Job {ns}/{job_name}")
            spec = job["spec"]
            count = spec.get("parallelism", 1) if count is None else count
            template = spec.get("template", {})
            indexed = spec.get("completionMode") == "Indexed"
            names = []
            for index in range(count):
                name = f"{job_name}-{index}-{next(self._suffixes):05x}"
                labels = {**template.get("metadata", {}).get("labels", {})}
                for key in JOB_NAME_LABELS:
                    labels[key] = job_name
                for key in CONTROLLER_UID_LABELS:
                    labels[key] = job["metadata"]["uid"]
                annotations = {}
                if indexed:
                    labels[COMPLETION_INDEX_LABEL] = str(index)
                    annotations[COMPLETION_INDEX_LABEL] = str(index)
                pod = {
                    "metadata": {
                        "name": name, "namespace": ns, "labels": labels,
                        "annotations": annotations,
                        "ownerReferences": [{
                            "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                            "uid": job["metadata"]["uid"], "controller": True,
                            "blockOwnerDeletion": True,
                        }],
                    },
                    "spec": copy.deepcopy(template.get("spec", {})),
                    "status": {"phase": "Pending", "conditions": [],
                               "qosClass": "BestEffort"},
                }
                self._put("pods", ns, pod, "ADDED")
                names.append(name)
            self._sync_job(ns, job_name)
            return names

    def update_pod(self, name: str, change: Callable[[dict[str, Any]], None], *,
                   namespace: str | None = None) -> None:
        """Apply ``change`` to the pod's JSON (status, spec) as one MODIFIED event."""
        ns = namespace or self.namespace
        with self._cond:
            pod = copy.deepcopy(self._objects[("pods", ns, name)])
            change(pod)
            self._put("pods", ns, pod, "MODIFIED")
            self._sync_job_of(pod)

    def unschedulable(self, pod: str, message: str, *, namespace: str | None = None) -> None:
        """The scheduler gave up on the pod: condition plus FailedScheduling event."""
        def change(obj: dict[str, Any]) -> None:
            obj["status"]["conditions"] = [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastTransitionTime": timestamp(self.clock.now()),
            }]
        self.update_pod(pod, change, namespace=namespace)
        self.add_event("Pod", pod, "FailedScheduling", message, namespace=namespace,
                       source="default-scheduler")

    def run_pod(self, pod: str, node: str, *, namespace: str | None = None) -> None:
        now = timestamp(self.clock.now())

        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["nodeName"] = node
            obj["status"].update({
                "phase": "Running", "startTime": now,
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Ready", "status": "True"}],
                "containerStatuses": [_container_status(c["name"], {"running": {"startedAt": now}},
                                                        ready=True)
                                      for c in obj["spec"].get("containers", [])],
            })
        self.update_pod(pod, change, namespace=namespace)

    def wait_container(self, pod: str, reason: str, message: str, *,
                       namespace: str | None = None) -> None:
        """The pod is bound but its container cannot start (ErrImagePull, ...)."""
        def change(obj: dict[str, Any]) -> None:
            obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            obj["status"]["containerStatuses"] = [
                _container_status(c["name"], {"waiting": {"reason": reason, "message": message}})
                for c in obj["spec"].get("containers", [])]
        self.update_pod(pod, change, namespace=namespace)

    def finish_pod(self, pod: str, exit_code: int = 0, *, reason: str | None = None,
                   message: str | None = None, namespace: str | None = None) -> None:
        now = timestamp(self.clock.now())
        reason = reason or ("Completed" if exit_code == 0 else "Error")

        def change(obj: dict[str, Any]) -> None:
            terminated = {"exitCode": exit_code, "reason": reason, "finishedAt": now}
            if message:
                terminated["message"] = message
            obj["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                           {"type": "Ready", "status": "False"}]
            obj["status"]["containerStatuses"] = [
                _container_status(c["name"], {"terminated": terminated})
                for c in obj["spec"].get("containers", [])]
        self.update_pod(pod, change, namespace=namespace)

    def add_event(self, kind: str, name: str, reason: str, message: str, *,
                  namespace: str | None = None, event_type: str = "Warning",
                  source: str = "default-scheduler") -> str:
        ns = namespace or self.namespace
        now = timestamp(self.clock.now())
        with self._cond:
            involved = self._objects.get((f"{kind.lower()}s", ns, name))
            event_name = f"{name}.{next(self._suffixes):016x}"
            event = {
                "metadata": {"name": event_name, "namespace": ns},
                "involvedObject": {"kind": kind, "name": name, "namespace": ns,
                                   "uid": involved["metadata"]["uid"] if involved else ""},
                "reason": reason, "message": message, "type": event_type, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now, "source": {"component": source},
                "reportingComponent": source,
            }
            self._put("events", ns, event, "ADDED")
            return event_name

    def refuse_followers(self, child_job: str, *, namespace: str | None = None,
                         selector_set: bool = True) -> str:
        """The JobSet pod webhook refused a child Job's followers (its leader has no
        node): the Job controller's FailedCreate event, in its words; ``selector_set``:
        the followers have other node selectors (Falcon's do)."""
        words = FOLLOWER_MISSING_SELECTOR if selector_set else FOLLOWER_REFUSAL
        return self.add_event("Job", child_job, "FailedCreate", words,
                              namespace=namespace, source="job-controller")

    def set_jobset_condition(self, name: str, condition: str, reason: str, *,
                             restarts: int = 0, namespace: str | None = None) -> None:
        """The JobSet controller's verdict (Completed / Failed with its reason)."""
        ns = namespace or self.namespace
        with self._cond:
            jobset = copy.deepcopy(self._objects[("jobsets", ns, name)])
            status = jobset.setdefault("status", {})
            status["restarts"] = restarts
            status.setdefault("conditions", []).append(_condition(
                condition, reason, f"jobset {condition.lower()}: {reason}", self.clock.now()))
            self._put("jobsets", ns, jobset, "MODIFIED")

    def record_event(self, kind: str, name: str, reason: str, message: str, *,
                     namespace: str | None = None, event_type: str = "Warning",
                     source: str = "job-controller", count: int | None = None,
                     first: dt.datetime | None = None) -> str:
        """An event as client-go's recorder writes it: a repeat of one about the same
        object with the same reason and message updates that event (``count`` grows or
        is set, ``lastTimestamp`` is now) instead of adding one. Returns its name."""
        ns = namespace or self.namespace
        with self._cond:
            involved = self._objects.get((f"{kind.lower()}s", ns, name))
            uid = involved["metadata"]["uid"] if involved else ""
            same = next((obj for (resource, space, _), obj in self._objects.items()
                         if resource == "events" and space == ns
                         and obj["involvedObject"].get("uid") == uid
                         and obj["involvedObject"].get("name") == name
                         and (obj["reason"], obj["message"]) == (reason, message)), None)
            if same is None:
                event_name = self.add_event(kind, name, reason, message, namespace=ns,
                                            event_type=event_type, source=source)
                same = self._objects[("events", ns, event_name)]
                if count is None and first is None:
                    return event_name
            event = copy.deepcopy(same)
            event["count"] = count if count is not None else int(event["count"]) + 1
            if first is not None:
                event["firstTimestamp"] = timestamp(first)
            event["lastTimestamp"] = timestamp(self.clock.now())
            self._put("events", ns, event, "MODIFIED")
            return str(event["metadata"]["name"])

    def set_job_condition(self, name: str, condition: str, reason: str, message: str, *,
                          namespace: str | None = None) -> None:
        ns = namespace or self.namespace
        with self._cond:
            job = copy.deepcopy(self._objects[("jobs", ns, name)])
            job["status"].setdefault("conditions", []).append(_condition(
                condition, reason, message, self.clock.now()))
            self._put("jobs", ns, job, "MODIFIED")

    # -- internals (called with self._cond held) --------------------------------------

    def _ns(self, resource: str, namespace: str | None) -> str:
        return "" if resource == "nodes" else (namespace or self.namespace)

    def _put(self, resource: str, ns: str, obj: dict[str, Any], event: str) -> dict[str, Any]:
        self._rv += 1
        kind, api_version = KINDS[resource]
        obj["kind"], obj["apiVersion"] = kind, api_version
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", timestamp(self.clock.now()))
        if ns:
            meta["namespace"] = ns
        key = (resource, ns, meta["name"])
        if event == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._history.append((self._rv, resource, event, copy.deepcopy(obj)))
        self._cond.notify_all()
        return obj

    def _sync_job_of(self, pod: dict[str, Any]) -> None:
        for owner in pod["metadata"].get("ownerReferences", []):
            if owner.get("kind") == "Job":
                self._sync_job(pod["metadata"]["namespace"], owner["name"])

    def _sync_job(self, ns: str, name: str) -> None:
        """The job controller: status counts and the terminal condition from the pods."""
        job = self._objects.get(("jobs", ns, name))
        if job is None:
            return
        uid = job["metadata"]["uid"]
        pods = [p for (kind, space, _), p in self._objects.items()
                if kind == "pods" and space == ns and any(
                    o.get("uid") == uid for o in p["metadata"].get("ownerReferences", []))]
        phases = [p["status"].get("phase") for p in pods]
        status = copy.deepcopy(job["status"])
        status["active"] = sum(1 for phase in phases if phase in ("Pending", "Running"))
        status["ready"] = sum(1 for phase in phases if phase == "Running")
        status["succeeded"] = sum(1 for phase in phases if phase == "Succeeded")
        status["failed"] = sum(1 for phase in phases if phase == "Failed")
        for field in ("active", "succeeded", "failed"):
            if status[field] == 0:
                status.pop(field)
        spec = job["spec"]
        conditions = status.setdefault("conditions", [])
        types = {c["type"] for c in conditions}
        if "Complete" not in types and "Failed" not in types:
            if status.get("succeeded", 0) >= spec.get("completions", 1):
                conditions.append(_condition("Complete", "", "", self.clock.now()))
                status["completionTime"] = timestamp(self.clock.now())
            elif status.get("failed", 0) > spec.get("backoffLimit", 6):
                conditions.append(_condition("Failed", "BackoffLimitExceeded",
                                             "Job has reached the specified backoff limit",
                                             self.clock.now()))
        if not conditions:
            status.pop("conditions")
        if status != job["status"]:
            updated = copy.deepcopy(job)
            updated["status"] = status
            self._put("jobs", ns, updated, "MODIFIED")

    # -- leases (coordination.k8s.io/v1) -------------------------------------------------

    def _lease_request(self, method: str, ns: str, name: str | None, body: Any) -> dict[str, Any]:
        """GET one lease, POST a new one, PUT a replacement (conditional on the
        ``resourceVersion`` it carries, as the API server's optimistic concurrency is)."""
        if method == "GET":
            if name is None:
                raise KubeApiError(405, "MethodNotAllowed", "listing leases is not served here")
            lease = self.get("leases", name, ns)
            if lease is None:
                raise _lease_error(404, "NotFound", name, "not found")
            return lease
        lease = _checked_lease(body, ns, name)
        with self._cond:
            current = self._objects.get(("leases", ns, lease["metadata"]["name"]))
            if method == "POST":
                if current is not None:
                    raise _lease_error(409, "AlreadyExists", lease["metadata"]["name"],
                                       "already exists")
                return copy.deepcopy(self._put("leases", ns, lease, "ADDED"))
            if current is None:
                raise _lease_error(404, "NotFound", lease["metadata"]["name"], "not found")
            sent_version = lease["metadata"].get("resourceVersion")
            if sent_version not in (None, "", current["metadata"]["resourceVersion"]):
                raise KubeApiError(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on leases.coordination.k8s.io '
                    f'"{lease["metadata"]["name"]}": the object has been modified; please '
                    "apply your changes to the latest version and try again",
                    {"name": lease["metadata"]["name"], "group": "coordination.k8s.io",
                     "kind": "leases"})
            for kept in ("uid", "creationTimestamp"):
                lease["metadata"][kept] = current["metadata"][kept]
            return copy.deepcopy(self._put("leases", ns, lease, "MODIFIED"))

    # -- request handling ---------------------------------------------------------------

    def _authorise(self, headers: Mapping[str, str]) -> str | None:
        header = headers.get("Authorization") or ""
        token = header[7:] if header.lower().startswith("bearer ") else None
        if not self.token_valid(token):
            raise KubeApiError(401, "Unauthorized", "Unauthorized")
        return token

    def _take_fault(self, method: str, path: str, watch: bool) -> KubeApiError | None:
        with self._cond:
            for fault in self._faults:
                if (fault.remaining > 0 and fault.method == method and fault.path.search(path)
                        and (fault.watch is None or fault.watch == watch)):
                    fault.remaining -= 1
                    return fault.error
        return None

    def _list(self, resource: str, ns: str, query: Mapping[str, str]) -> dict[str, Any]:
        labels = label_matcher(query.get("labelSelector", ""))
        fields = field_matcher(query.get("fieldSelector", ""))
        with self._cond:
            items = [copy.deepcopy(obj) for (kind, space, _), obj in sorted(self._objects.items())
                     if kind == resource and (resource == "nodes" or space == ns)
                     and labels(obj["metadata"].get("labels") or {}) and fields(obj)]
            kind, api_version = KINDS[resource]
            return {"kind": f"{kind}List", "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _create_job(self, ns: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise KubeApiError(400, "BadRequest", "the body of the request was not a JSON object")
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if body.get("kind") != "Job" or body.get("apiVersion") != "batch/v1":
            raise KubeApiError(400, "BadRequest",
                               f"expected batch/v1 Job, got {body.get('apiVersion')} "
                               f"{body.get('kind')}")
        if meta.get("namespace") not in (None, ns):
            raise KubeApiError(400, "BadRequest", "the namespace of the provided object does not "
                                                  "match the namespace sent on the request")
        if not _DNS_LABEL.match(name):
            raise KubeApiError(422, "Invalid", f'Job.batch "{name}" is invalid: metadata.name: '
                                               "Invalid value: a lowercase RFC 1123 label")
        for where, mapping in (("metadata.labels", meta.get("labels")),
                               ("spec.template.metadata.labels",
                                ((body.get("spec") or {}).get("template") or {})
                                .get("metadata", {}).get("labels"))):
            if mapping is not None and not all(isinstance(v, str) for v in mapping.values()):
                raise KubeApiError(400, "BadRequest", f"{where}: json: cannot unmarshal number "
                                                      "into Go struct field of type string")
        if not (body.get("spec") or {}).get("template", {}).get("spec", {}).get("containers"):
            raise KubeApiError(422, "Invalid", f'Job.batch "{name}" is invalid: '
                                               "spec.template.spec.containers: Required value")
        with self._cond:
            if ("jobs", ns, name) in self._objects:
                raise KubeApiError(409, "AlreadyExists", f'jobs.batch "{name}" already exists',
                                   {"name": name, "group": "batch", "kind": "jobs"})
            self._within_job_quota(ns, name)
            job = copy.deepcopy(body)
            job["metadata"] = {k: v for k, v in meta.items()
                               if k not in ("uid", "resourceVersion", "creationTimestamp")}
            job["metadata"]["generation"] = 1
            spec = job["spec"]
            if "completions" not in spec and "parallelism" not in spec:
                spec["completions"] = 1
            spec.setdefault("parallelism", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            job["status"] = {}
            return copy.deepcopy(self._put("jobs", ns, job, "ADDED"))

    def _delete_job(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        with self._cond:
            job = self._objects.get(("jobs", ns, name))
            if job is None:
                raise KubeApiError(404, "NotFound", f'jobs.batch "{name}" not found',
                                   {"name": name, "group": "batch", "kind": "jobs"})
            uid = job["metadata"]["uid"]
            owned = self._owned_by(uid, "pods", ns)
            services = self._owned_by(uid, "services", ns)
            if policy == "Foreground":
                # The Job stays, marked for deletion, until the garbage collector has
                # deleted its pods.
                marked = copy.deepcopy(job)
                marked["metadata"]["deletionTimestamp"] = timestamp(self.clock.now())
                marked["metadata"]["finalizers"] = ["foregroundDeletion"]
                self._put("jobs", ns, marked, "MODIFIED")
                for pod in owned:
                    self._put("pods", ns, copy.deepcopy(pod), "DELETED")
                self._put("jobs", ns, marked, "DELETED")
                self._collect(ns, uid, "services", services, delete=True)
            else:
                self._put("jobs", ns, copy.deepcopy(job), "DELETED")
                # Background: the garbage collector follows the Job; otherwise orphans.
                self._collect(ns, uid, "pods", owned, delete=policy == "Background")
                self._collect(ns, uid, "services", services, delete=policy == "Background")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": "batch", "kind": "jobs", "uid": uid}}

    def _create_jobset(self, ns: str, body: Any, *, children: bool = True) -> dict[str, Any]:
        """Store the JobSet and its headless Service; with ``children`` (the fake's own
        small JobSet controller) its child Jobs too. A front end whose world runs the
        JobSet controller itself (``sim_backed``) adds the children it makes."""
        if not isinstance(body, dict):
            raise KubeApiError(400, "BadRequest", "the body of the request was not a JSON object")
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if body.get("kind") != "JobSet" or body.get("apiVersion") != KINDS["jobsets"][1]:
            raise KubeApiError(400, "BadRequest", f"expected {KINDS['jobsets'][1]} JobSet, got "
                                                  f"{body.get('apiVersion')} {body.get('kind')}")
        if not _DNS_LABEL.match(name):
            raise KubeApiError(422, "Invalid", f'JobSet.jobset.x-k8s.io "{name}" is invalid: '
                                               "metadata.name: Invalid value")
        replicated = (body.get("spec") or {}).get("replicatedJobs")
        if not isinstance(replicated, list) or not replicated:
            raise KubeApiError(422, "Invalid", f'JobSet.jobset.x-k8s.io "{name}" is invalid: '
                                               "spec.replicatedJobs: Required value")
        with self._cond:
            if ("jobsets", ns, name) in self._objects:
                raise KubeApiError(409, "AlreadyExists",
                                   f'jobsets.jobset.x-k8s.io "{name}" already exists',
                                   {"name": name, "group": "jobset.x-k8s.io", "kind": "jobsets"})
            jobset = copy.deepcopy(body)
            jobset["metadata"] = {k: v for k, v in meta.items()
                                  if k not in ("uid", "resourceVersion", "creationTimestamp")}
            jobset["status"] = {"restarts": 0}
            created = self._put("jobsets", ns, jobset, "ADDED")
            owner = [{"apiVersion": KINDS["jobsets"][1], "kind": "JobSet", "name": name,
                      "uid": created["metadata"]["uid"], "controller": True}]
            refused = []
            for entry in replicated if children else ():
                for index in range(int(entry.get("replicas", 1))):
                    child = f"{name}-{entry.get('name')}-{index}"
                    try:
                        self._within_job_quota(ns, child)
                    except KubeApiError as error:
                        refused.append(f'job "{child}" creation failed with error: '
                                       f"{error.message}")
                        continue
                    self.add_jobset_child(ns, created, entry, index)
            if refused:
                self.record_event("JobSet", name, "JobCreationFailed", "\n".join(refused),
                                  namespace=ns, source="jobset")
            self._put("services", ns, {
                "metadata": {"name": name, "ownerReferences": owner,
                             "labels": {JOBSET_NAME_LABEL: name}},
                "spec": {"clusterIP": "None", "selector": {JOBSET_NAME_LABEL: name},
                         "publishNotReadyAddresses": True}}, "ADDED")
            return copy.deepcopy(created)

    def _within_job_quota(self, ns: str, name: str) -> None:
        """The quota admission plugin's 403 for a Job past ``job_quota``."""
        if self.job_quota is None:
            return
        used = len(self.names("jobs", ns))
        if used >= self.job_quota:
            raise KubeApiError(403, "Forbidden", (
                f'jobs.batch "{name}" is forbidden: exceeded quota: falcon-jobs, requested: '
                f"count/jobs.batch=1, used: count/jobs.batch={used}, limited: "
                f"count/jobs.batch={self.job_quota}"))

    def add_jobset_child(self, ns: str, jobset: Mapping[str, Any], entry: Mapping[str, Any],
                         index: int) -> dict[str, Any]:
        """Child Job ``index`` of the replicatedJob ``entry``, as the JobSet controller
        makes it: named ``<jobset>-<replicatedJob>-<index>``, labelled with the JobSet's
        name and owned by it."""
        meta = jobset["metadata"]
        name = meta["name"]
        template = entry.get("template") or {}
        labels = {**(template.get("metadata") or {}).get("labels", {}), JOBSET_NAME_LABEL: name}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("completionMode", "Indexed")
        spec.setdefault("backoffLimit", 6)
        owner = [{"apiVersion": KINDS["jobsets"][1], "kind": "JobSet", "name": name,
                  "uid": meta["uid"], "controller": True}]
        child = {"metadata": {"name": f"{name}-{entry.get('name')}-{index}",
                              "labels": labels, "ownerReferences": owner,
                              "annotations": dict(meta.get("annotations") or {})},
                 "spec": spec, "status": {}}
        with self._cond:
            return self._put("jobs", ns, child, "ADDED")

    def _delete_jobset(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        with self._cond:
            jobset = self._objects.get(("jobsets", ns, name))
            if jobset is None:
                raise KubeApiError(404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found',
                                   {"name": name, "group": "jobset.x-k8s.io", "kind": "jobsets"})
            uid = jobset["metadata"]["uid"]
            self._put("jobsets", ns, copy.deepcopy(jobset), "DELETED")
            collect = policy in ("Background", "Foreground")
            for child in self._owned_by(uid, "jobs", ns):
                if collect:
                    self._delete_job(ns, child["metadata"]["name"], "Background")
            self._collect(ns, uid, "jobs", self._owned_by(uid, "jobs", ns), delete=collect)
            self._collect(ns, uid, "services", self._owned_by(uid, "services", ns),
                          delete=collect)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": "jobset.x-k8s.io", "kind": "jobsets",
                                "uid": uid}}

    def _owned_by(self, uid: str, resource: str, ns: str) -> list[dict[str, Any]]:
        return [obj for (kind, space, _), obj in sorted(self._objects.items())
                if kind == resource and space == ns and any(
                    o.get("uid") == uid for o in obj["metadata"].get("ownerReferences", []))]

    def _collect(self, ns: str, uid: str, resource: str, dependents: list[dict[str, Any]], *,
                 delete: bool) -> None:
        """The garbage collector on a deleted owner's dependents: delete them, or orphan
        them (their ownerReference to it removed)."""
        for dependent in dependents:
            if delete:
                self._put(resource, ns, copy.deepcopy(dependent), "DELETED")
                continue
            orphan = copy.deepcopy(dependent)
            orphan["metadata"]["ownerReferences"] = [
                o for o in orphan["metadata"]["ownerReferences"] if o.get("uid") != uid]
            self._put(resource, ns, orphan, "MODIFIED")

    def _create_service(self, ns: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise KubeApiError(400, "BadRequest", "the body of the request was not a JSON object")
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if body.get("kind") != "Service" or body.get("apiVersion") != "v1":
            raise KubeApiError(400, "BadRequest", f"expected v1 Service, got "
                                                  f"{body.get('apiVersion')} {body.get('kind')}")
        if meta.get("namespace") not in (None, ns):
            raise KubeApiError(400, "BadRequest", "the namespace of the provided object does not "
                                                  "match the namespace sent on the request")
        if not _DNS_1035_LABEL.match(name):
            raise KubeApiError(422, "Invalid", f'Service "{name}" is invalid: metadata.name: '
                                               "Invalid value: a DNS-1035 label")
        spec = body.get("spec") or {}
        if not spec.get("ports") and spec.get("clusterIP") != "None":
            raise KubeApiError(422, "Invalid", f'Service "{name}" is invalid: spec.ports: '
                                               "Required value")
        with self._cond:
            if ("services", ns, name) in self._objects:
                raise KubeApiError(409, "AlreadyExists", f'services "{name}" already exists',
                                   {"name": name, "kind": "services"})
            service = copy.deepcopy(body)
            service["metadata"] = {k: v for k, v in meta.items()
                                   if k not in ("uid", "resourceVersion", "creationTimestamp")}
            service["spec"] = {"type": "ClusterIP", "sessionAffinity": "None",
                               "clusterIPs": [spec["clusterIP"]] if spec.get("clusterIP") else [],
                               **copy.deepcopy(spec)}
            service["status"] = {"loadBalancer": {}}
            return copy.deepcopy(self._put("services", ns, service, "ADDED"))

    def _delete_service(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        preconditions = (body.get("preconditions") or {}) if isinstance(body, dict) else {}
        with self._cond:
            service = self._objects.get(("services", ns, name))
            if service is None:
                raise KubeApiError(404, "NotFound", f'services "{name}" not found',
                                   {"name": name, "kind": "services"})
            uid = service["metadata"]["uid"]
            if preconditions.get("uid") not in (None, uid):
                raise KubeApiError(
                    409, "Conflict", f'Operation cannot be fulfilled on services "{name}": '
                                     f"Precondition failed: UID in precondition: "
                                     f"{preconditions['uid']}, UID in object meta: {uid}",
                    {"name": name, "kind": "services"})
            # The Service registry answers with the deleted object (ReturnDeletedObject),
            # not a Status: the client's delete_namespaced_service parses a V1Service.
            return copy.deepcopy(self._put("services", ns, copy.deepcopy(service), "DELETED"))

    def _issue_from_form(self, form: Mapping[str, str]) -> dict[str, Any]:
        if (form.get("grant_type") != "refresh_token" or form.get("refresh_token") != REFRESH_TOKEN
                or form.get("client_id") != CLIENT_ID
                or form.get("client_secret") != CLIENT_SECRET):
            raise KubeApiError(400, "invalid_grant", "Bad Request")
        token = self.issue_token()
        return {"access_token": token, "token_type": "Bearer",
                "expires_in": int(self.token_lifetime.total_seconds())}

    def _watch_news(self, state: _Watch, cursor: int) -> bool:
        return bool(self._closing or state.dropped or state.ended or state.gone
                    or state.bookmark or (self._history and self._history[-1][0] > cursor))

    def _stream_watch(self, handler: http.server.BaseHTTPRequestHandler, resource: str, ns: str,
                      query: Mapping[str, str], token: str | None) -> None:
        labels = label_matcher(query.get("labelSelector", ""))
        fields = field_matcher(query.get("fieldSelector", ""))
        timeout = int(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        bookmarks = query.get("allowWatchBookmarks") == "true"
        since_raw = query.get("resourceVersion", "")
        started = self.clock.now()

        def wanted(kind: str, obj: Mapping[str, Any]) -> bool:
            return (kind == resource and (resource == "nodes"
                                          or obj["metadata"].get("namespace") == ns)
                    and labels(obj["metadata"].get("labels") or {}) and fields(obj))

        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(event_type: str, obj: Mapping[str, Any]) -> None:
            line = json.dumps({"type": event_type, "object": obj}).encode() + b"\n"
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()

        watch_id = next(self._watch_ids)
        state = _Watch(token)
        with self._cond:
            if since_raw not in ("", "0") and int(since_raw) < self._oldest_rv:
                gone = KubeApiError(410, "Expired", f"too old resource version: {since_raw} "
                                                    f"({self._oldest_rv})")
                pending: list[tuple[str, dict[str, Any]]] = [("ERROR", gone.status())]
                cursor = self._rv
            elif since_raw in ("", "0"):
                pending = [("ADDED", copy.deepcopy(obj))
                           for (kind, _, _), obj in sorted(self._objects.items())
                           if wanted(kind, obj)]
                cursor = self._rv
            else:
                pending = []
                cursor = int(since_raw)
            self._watches[watch_id] = state
            self._cond.notify_all()
        ending = ""
        try:
            while True:
                for event_type, obj in pending:
                    send(event_type, obj)
                if pending and pending[-1][0] == "ERROR":
                    ending = "gone"
                    break
                pending = []
                with self._cond:
                    self._cond.wait_for(functools.partial(self._watch_news, state, cursor),
                                        _WAIT_STEP)
                    if self._closing or state.dropped:
                        ending = "closing" if self._closing else "dropped"
                        break
                    if state.gone:
                        gone = KubeApiError(410, "Expired", "too old resource version: "
                                                            f"{cursor} ({self._oldest_rv})")
                        pending = [("ERROR", gone.status())]
                        continue
                    for rv, kind, event_type, obj in self._history:
                        if rv > cursor and wanted(kind, obj):
                            pending.append((event_type, copy.deepcopy(obj)))
                    cursor = max(cursor, self._rv)
                    now = self.clock.now()
                    expired = (self.end_watch_at_token_expiry and token is not None
                               and not self.token_valid(token))
                    timed_out = timeout is not None and now >= started + dt.timedelta(
                        seconds=timeout)
                    if not pending and (state.ended or expired or timed_out):
                        ending = ("ended" if state.ended else
                                  "token-expired" if expired else "timeout")
                        break
                    if not pending and bookmarks and state.bookmark:
                        state.bookmark = False
                        pending = [("BOOKMARK", {"kind": KINDS[resource][0],
                                                 "apiVersion": KINDS[resource][1],
                                                 "metadata": {"resourceVersion": str(cursor)}})]
            if state.dropped or self._closing:
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
            else:
                handler.wfile.write(b"0\r\n\r\n")
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            handler.close_connection = True
        finally:
            with self._cond:
                self._watches.pop(watch_id, None)
                self.watch_endings.append(ending or "broken")
                self._cond.notify_all()


class _QuietServer(http.server.ThreadingHTTPServer):
    """Connections a client cuts (a stopped watch, a failed TLS handshake) are normal
    here: no traceback on stderr."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return

    def get_request(self) -> tuple[Any, Any]:
        """No Nagle delay: a reply is written as headers, then body, and the client's
        delayed ACK of the first would hold the second back some 40 ms per request."""
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address


def _node_ready(ready: bool) -> dict[str, str]:
    return {"type": "Ready", "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady"}


def _condition(kind: str, reason: str, message: str, moment: dt.datetime) -> dict[str, str]:
    condition = {"type": kind, "status": "True", "lastProbeTime": timestamp(moment),
                 "lastTransitionTime": timestamp(moment)}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container_status(name: str, state: Mapping[str, Any], *, ready: bool = False) -> dict[str, Any]:
    return {"name": name, "state": dict(state), "ready": ready, "restartCount": 0,
            "image": "image", "imageID": ""}


_MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LEASE_SPEC_FIELDS: Mapping[str, type] = MappingProxyType({
    "holderIdentity": str, "leaseDurationSeconds": int, "acquireTime": str, "renewTime": str,
    "leaseTransitions": int, "strategy": str, "preferredHolder": str,
})


def _lease_error(code: int, reason: str, name: str, words: str) -> KubeApiError:
    return KubeApiError(code, reason, f'leases.coordination.k8s.io "{name}" {words}',
                        {"name": name, "group": "coordination.k8s.io", "kind": "leases"})


def _checked_lease(body: Any, ns: str, url_name: str | None) -> dict[str, Any]:
    """Decode and validate a Lease as the API server would: strict field types,
    MicroTime parsed with Go's ``2006-01-02T15:04:05.000000Z07:00`` (so a time without
    a zone or without its six fractional digits is a 400), positive lease duration.
    Times are stored re-encoded in UTC, as the server writes them back."""
    if not isinstance(body, dict):
        raise KubeApiError(400, "BadRequest", "the body of the request was not a JSON object")
    if body.get("kind") not in (None, "Lease") or body.get("apiVersion") not in (
            None, "coordination.k8s.io/v1"):
        raise KubeApiError(400, "BadRequest", f"expected coordination.k8s.io/v1 Lease, got "
                                              f"{body.get('apiVersion')} {body.get('kind')}")
    meta = dict(body.get("metadata") or {})
    name = meta.get("name") or ""
    if url_name is not None and name != url_name:
        raise KubeApiError(400, "BadRequest", f"the name of the object ({name}) does not match "
                                              f"the name on the URL ({url_name})")
    if meta.get("namespace") not in (None, ns):
        raise KubeApiError(400, "BadRequest", "the namespace of the provided object does not "
                                              "match the namespace sent on the request")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise KubeApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                           "metadata.name: Invalid value: a lowercase RFC 1123 "
                                           "subdomain")
    spec = dict(body.get("spec") or {})
    for field, value in list(spec.items()):
        expected = _LEASE_SPEC_FIELDS.get(field)
        if value is None:
            del spec[field]
            continue
        if expected is None or not isinstance(value, expected) or isinstance(value, bool):
            raise KubeApiError(400, "BadRequest", f'Lease in version "v1" cannot be handled as '
                                                  f"a Lease: spec.{field}: cannot unmarshal "
                                                  f"{type(value).__name__}")
        if field in ("acquireTime", "renewTime"):
            if not _MICRO_TIME.match(value):
                raise KubeApiError(400, "BadRequest", f'Lease in version "v1" cannot be handled '
                                                      f'as a Lease: parsing time "{value}" as '
                                                      '"2006-01-02T15:04:05.000000Z07:00"')
            moment = dt.datetime.fromisoformat(value)
            spec[field] = moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if spec.get("leaseDurationSeconds", 1) <= 0:
        raise KubeApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                           "spec.leaseDurationSeconds: Invalid value: must be "
                                           "greater than 0")
    if spec.get("leaseTransitions", 0) < 0:
        raise KubeApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                           "spec.leaseTransitions: Invalid value: must be "
                                           "greater than or equal to 0")
    meta = {k: v for k, v in meta.items() if k not in ("uid", "creationTimestamp")}
    return {"metadata": meta, "spec": spec}


def _handler(fake: FakeKubeServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(10)
                try:
                    self.request.do_handshake()
                except (ssl.SSLError, OSError):
                    self.request.close()
                    raise
                self.request.settimeout(None)
            super().setup()

        def handle(self) -> None:
            try:
                super().handle()
            except (ssl.SSLError, ConnectionError, OSError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _reply(self, code: int, body: Any) -> None:
            """Buffer the answer: the request is recorded before the client can read
            it (a test that checks ``requests`` after a call must find the call)."""
            self._pending = (code, json.dumps(body).encode())

        def _flush(self) -> None:
            pending, self._pending = getattr(self, "_pending", None), None
            if pending is None:
                return
            code, data = pending
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return None
            if "application/x-www-form-urlencoded" in (self.headers.get("Content-Type") or ""):
                return dict(urllib.parse.parse_qsl(raw.decode()))
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                return raw.decode(errors="replace")

        def _dispatch(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            path = parsed.path
            if fake._hold_while_hung(self.command, path):
                self.close_connection = True
                return
            query = dict(urllib.parse.parse_qsl(parsed.query))
            body = self._body()
            watch = query.get("watch") in ("true", "1")
            token: str | None = None
            status = 200
            try:
                route, match = next(((name, m) for pattern, name in _ROUTES
                                     if (m := pattern.match(path))), (None, None))
                if route is None or match is None:
                    raise KubeApiError(404, "NotFound", f"the server could not find the "
                                                        f"requested resource ({path})")
                if route == "version":
                    self._reply(200, {
                        "major": "1", "minor": "33", "gitVersion": "v1.33.5-gke.fake",
                        "gitCommit": "0" * 40, "gitTreeState": "clean",
                        "buildDate": "2026-10-01T00:00:00Z", "goVersion": "go1.24.6",
                        "compiler": "gc", "platform": "linux/amd64"})
                    self._flush()
                    return
                if route == "token":
                    self._reply(200, fake._issue_from_form(body if isinstance(body, dict) else {}))
                    self._flush()
                    return
                token = fake._authorise(self.headers)
                fault = fake._take_fault(self.command, path, watch)
                if fault is not None:
                    raise fault
                groups = match.groupdict()
                ns = groups.get("ns") or ""
                if route in ("jobsets", "jobset") and not fake.jobset_crd:
                    raise KubeApiError(404, "NotFound", "the server could not find the "
                                                        "requested resource")
                if route in ("jobs", "pods", "nodes", "events", "services", "jobsets") and \
                        self.command == "GET":
                    if watch:
                        fake.requests.append(RequestRecord(self.command, path, query, token,
                                                           200))
                        fake._stream_watch(self, route, ns, query, token)
                        return
                    self._reply(200, fake._list(route, ns, query))
                elif route == "jobs" and self.command == "POST":
                    status = 201
                    self._reply(201, fake._create_job(ns, body))
                elif route == "jobsets" and self.command == "POST":
                    status = 201
                    self._reply(201, fake._create_jobset(ns, body))
                elif route == "jobset" and self.command == "DELETE":
                    policy = query.get("propagationPolicy") or (
                        body.get("propagationPolicy") if isinstance(body, dict) else None)
                    self._reply(200, fake._delete_jobset(ns, groups["name"], policy))
                elif route == "services" and self.command == "POST":
                    status = 201
                    self._reply(201, fake._create_service(ns, body))
                elif route in ("job", "pod", "service", "jobset") and self.command == "GET":
                    resource = f"{route}s"
                    obj = fake.get(resource, groups["name"], ns)
                    if obj is None:
                        group = {"job": ".batch", "jobset": ".jobset.x-k8s.io"}.get(route, "")
                        raise KubeApiError(404, "NotFound",
                                           f'{resource}{group} "{groups["name"]}" not found',
                                           {"name": groups["name"], "kind": resource})
                    self._reply(200, obj)
                elif route == "service" and self.command == "DELETE":
                    self._reply(200, fake._delete_service(ns, groups["name"], body))
                elif route == "job" and self.command == "DELETE":
                    policy = query.get("propagationPolicy") or (
                        body.get("propagationPolicy") if isinstance(body, dict) else None)
                    self._reply(200, fake._delete_job(ns, groups["name"], policy))
                elif route in ("leases", "lease") and self.command in ("GET", "POST", "PUT"):
                    status = 201 if self.command == "POST" else 200
                    self._reply(status, fake._lease_request(self.command, ns,
                                                            groups.get("name"), body))
                else:
                    raise KubeApiError(405, "MethodNotAllowed",
                                       f"{self.command} is not supported on {path}")
            except KubeApiError as error:
                status = error.code
                self._reply(error.code, error.status())
            fake.requests.append(RequestRecord(self.command, path, query, token, status, body))
            self._flush()

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _dispatch

    return Handler

