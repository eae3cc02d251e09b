"""Leader election on a Kubernetes ``coordination.k8s.io/v1`` Lease (the ``kubernetes`` client).

Several replicas may run in the central cluster; exactly one appends to the log. The
rules are client-go's ``leaderelection`` package, so the Lease reads the same to
``kubectl`` and to any Go tooling an operator points at it:

- the Lease spec is the election record: ``holderIdentity``, ``leaseDurationSeconds``,
  ``acquireTime``, ``renewTime`` and ``leaseTransitions`` (bumped when the holder
  changes, kept on a renewal);
- every write is conditional on the ``resourceVersion`` just read, so when two
  candidates race, the API server answers the loser ``409 Conflict`` (or
  ``AlreadyExists`` on create) and it stays a follower;
- a follower judges expiry by its *own* clock, from the moment it last saw the record
  change, never by comparing ``renewTime`` with its clock: clocks of different nodes
  need not agree. A lease with no holder (released) is free at once;
- the leader renews every retry period and counts itself leader only until
  ``renew_deadline`` after the start of its last successful renewal. That deadline is
  shorter than the lease duration, and a follower waits the full duration after it
  saw the last renewal, so the old leader has stopped appending before anyone else
  may start: ``may_append()`` is the fence the loop checks before each tick and before
  each commit. It is computed from time alone, so a renewal stuck in a hung request
  cannot keep it open.

Times on the wire are MicroTime, which the API server parses with Go's layout
``2006-01-02T15:04:05.000000Z07:00``: exactly six fractional digits and a zone. The
client serialises every datetime with ``datetime.isoformat()``, which drops the zone of
a naive datetime and the fraction of a whole second (one renewal in a million would be
refused), and kubernetes 37 validates even a plain dict body into the pydantic model,
so preformatted strings become datetimes again (reference §6.1). The elector therefore
talks through ``MicroTimeApiClient``, whose serialisation writes every datetime as
MicroTime (which a plain ``Time`` field accepts too).

In the central cluster the client is configured in-cluster (the pod's service account
token, refreshed from its file by the client), never from a static kubeconfig.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import random
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from falcon_es.config.errors import LeaseConfigError  # noqa: F401 (re-exported: the election's error)
from falcon_es.config.settings import JITTER_FACTOR, LeaseSettings
from falcon_es.domain.clock import Clock, WallClock

log = logging.getLogger("falcon_es.adapters.gcp.lease")

DEFAULT_LEASE_NAME = "falcon-controller"
DEFAULT_LEASE_NAMESPACE = "falcon"
DEFAULT_LEASE_DURATION_SECONDS = 15.0
DEFAULT_RENEW_DEADLINE_SECONDS = 10.0
DEFAULT_RETRY_PERIOD_SECONDS = 2.0
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaseUnavailable(RuntimeError):
    """No Kubernetes API to hold a lease on (not running in a cluster)."""


@dataclasses.dataclass(frozen=True)
class LeaderRecord:
    """The election record a Lease spec holds."""

    holder: str
    lease_duration_seconds: int
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": micro_time(self.acquire_time) if self.acquire_time else None,
            "renewTime": micro_time(self.renew_time) if self.renew_time else None,
            "leaseTransitions": self.transitions,
        }


def micro_time(moment: dt.datetime) -> str:
    """A naive-UTC (or aware) datetime as Kubernetes MicroTime."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    return moment.strftime(MICRO_TIME_FORMAT)


def _naive_utc(moment: dt.datetime | None) -> dt.datetime | None:
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def record_of(lease: client.V1Lease) -> LeaderRecord:
    spec = lease.spec
    if spec is None:
        return LeaderRecord("", 0, None, None, 0)
    return LeaderRecord(
        holder=spec.holder_identity or "",
        lease_duration_seconds=spec.lease_duration_seconds or 0,
        acquire_time=_naive_utc(spec.acquire_time),
        renew_time=_naive_utc(spec.renew_time),
        transitions=spec.lease_transitions or 0,
    )


class MicroTimeApiClient(client.ApiClient):
    """An ApiClient that writes datetimes as Kubernetes MicroTime (naive ones are UTC)."""

    def sanitize_for_serialization(self, obj: Any) -> Any:
        if isinstance(obj, dt.datetime):
            return micro_time(obj)
        return super().sanitize_for_serialization(obj)


def lease_api(configuration: client.Configuration) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(MicroTimeApiClient(configuration))


def default_identity(pod_name: str | None = None) -> str:
    """The pod's name (the downward API's POD_NAME, the lease settings' ``pod_name``,
    else the hostname, which is the pod name in Kubernetes) plus a random suffix: a
    restarted container is a new candidate and never mistakes the lease of its previous
    life for its own."""
    base = pod_name or socket.gethostname() or "falcon-es"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def in_cluster_api() -> client.CoordinationV1Api:
    """The Lease API of the cluster this pod runs in (service-account token, refreshed
    from its projected file by the client; no kubeconfig)."""
    configuration = client.Configuration()
    # One attempt per request: the elector retries every retry period itself, and
    # urllib3's retries would stretch one attempt towards the renew deadline.
    configuration.retries = False
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException as error:
        raise LeaseUnavailable(
            f"--leader-election lease needs the Kubernetes API of the cluster it runs in "
            f"({error}); outside Kubernetes use --leader-election db") from None
    return lease_api(configuration)


class LeaseElector:
    """One candidate in a Lease election.

    Step-wise: ``step()`` makes one attempt to acquire or renew and returns whether this
    candidate leads; ``may_append()`` is the fence. ``run(stop, ...)`` repeats ``step()``
    every retry period (followers with client-go's jitter) until ``stop`` is set, calling
    ``on_started_leading`` / ``on_stopped_leading`` on each change. ``release()`` hands
    the lease back (holder cleared) so a follower takes over at once instead of waiting
    out the lease duration.
    """

    def __init__(
        self,
        api: client.CoordinationV1Api,
        namespace: str = DEFAULT_LEASE_NAMESPACE,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        *,
        lease_duration: float = DEFAULT_LEASE_DURATION_SECONDS,
        renew_deadline: float = DEFAULT_RENEW_DEADLINE_SECONDS,
        retry_period: float = DEFAULT_RETRY_PERIOD_SECONDS,
        clock: Clock | None = None,
        request_timeout_seconds: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = LeaseSettings.checked(
            name=name, namespace=namespace, lease_duration=lease_duration,
            renew_deadline=renew_deadline, retry_period=retry_period)
        if not isinstance(api.api_client, MicroTimeApiClient):
            api = lease_api(api.api_client.configuration)
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.clock = clock or WallClock()
        self.lease_duration = dt.timedelta(seconds=lease_duration)
        self.renew_deadline = dt.timedelta(seconds=renew_deadline)
        self.retry_period = retry_period
        self.request_timeout = request_timeout_seconds or max(renew_deadline / 2, 1.0)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._observed: LeaderRecord | None = None
        self._observed_version = ""
        self._observed_at: dt.datetime | None = None
        self._leading = False
        self._renewed_at: dt.datetime | None = None
        self.last_error = ""

    @classmethod
    def from_settings(cls, api: client.CoordinationV1Api, settings: LeaseSettings,
                      identity: str | None = None, **options: Any) -> LeaseElector:
        return cls(api, settings.namespace, settings.name,
                   identity or default_identity(settings.pod_name),
                   lease_duration=settings.lease_duration,
                   renew_deadline=settings.renew_deadline,
                   retry_period=settings.retry_period, **options)

    # ------------------------------------------------------------------ the fence
    def is_leader(self) -> bool:
        """This candidate holds the lease and renewed it within the renew deadline."""
        with self._lock:
            return self._holds(self.clock.now())

    def may_append(self) -> bool:
        return self.is_leader()

    def holder(self) -> str:
        """Who holds the lease as last seen ("" when free or never read)."""
        with self._lock:
            return self._observed.holder if self._observed else ""

    def describe(self) -> str:
        """One line for logs and readiness: who leads, from this candidate's view."""
        holder = self.holder()
        where = f"lease {self.namespace}/{self.name}"
        if self.is_leader():
            return f"leader: holding {where} as {self.identity}"
        if holder and holder != self.identity:
            return f"standby: {where} is held by {holder}"
        if self.last_error:
            return f"standby: {where} unreachable ({self.last_error})"
        return f"standby: {where} is free, acquiring"

    def _holds(self, now: dt.datetime) -> bool:
        return (self._leading and self._renewed_at is not None
                and now < self._renewed_at + self.renew_deadline)

    # ------------------------------------------------------------------ stepping
    def step(self) -> bool:
        """One attempt to acquire or renew; returns whether this candidate now leads.

        A leader whose attempt fails stays leader until the renew deadline after its
        last good renewal; past it, or as soon as it sees another holder, it has lost.
        """
        started = self.clock.now()
        acquired = self.try_acquire_or_renew(started)
        now = self.clock.now()
        with self._lock:
            was_leading = self._leading
            if acquired:
                self._leading = True
                self._renewed_at = started
            elif self._leading:
                taken = self._observed is not None and self._observed.holder != self.identity
                if taken or not self._holds(now):
                    self._leading = False
            leading = self._holds(now)
        if leading and not was_leading:
            log.info("%s acquired lease %s/%s", self.identity, self.namespace, self.name)
        elif was_leading and not self._leading:
            log.warning("%s lost lease %s/%s (last renewed %s; %s)", self.identity,
                        self.namespace, self.name, self._renewed_at,
                        self.last_error or f"now held by {self.holder()}")
        return leading

    def try_acquire_or_renew(self, now: dt.datetime | None = None) -> bool:
        """client-go's ``tryAcquireOrRenew``: read the lease (create it when absent); if
        another holder's lease is still valid by our observation, stay follower;
        otherwise write our record conditionally on the version read."""
        now = now or self.clock.now()
        duration = int(self.lease_duration.total_seconds())
        ours = LeaderRecord(self.identity, duration, now, now, 0)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace,
                                                   _request_timeout=self.request_timeout)
        except ApiException as error:
            if error.status != 404:
                return self._failed("reading", error)
            return self._create(ours, now)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("reading", error)
        current = record_of(lease)
        version = lease.metadata.resource_version if lease.metadata else ""
        with self._lock:
            if current != self._observed:
                if self._observed is not None and current.holder != self._observed.holder:
                    log.info("lease %s/%s: holder is now %s", self.namespace, self.name,
                             current.holder or "nobody")
                self._observed, self._observed_at = current, now
            self._observed_version = version or ""
            observed_at = self._observed_at or now
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and observed_at + dt.timedelta(
                seconds=current.lease_duration_seconds) > now:
            self.last_error = ""
            return False
        if current.holder == self.identity:
            ours = dataclasses.replace(ours, acquire_time=current.acquire_time or now,
                                       transitions=current.transitions)
        else:
            ours = dataclasses.replace(ours, transitions=current.transitions + 1)
        return self._replace(ours, version or "", now)

    def release(self) -> bool:
        """Hand the lease back if this candidate holds it: holder cleared and a one
        second duration, as client-go's ReleaseOnCancel writes it, so a follower takes
        over at its next attempt. Leadership ends here whatever the answer."""
        with self._lock:
            was_leading = self._leading
            self._leading = False
            observed, version = self._observed, self._observed_version
        if not was_leading or observed is None or observed.holder != self.identity:
            return False
        now = self.clock.now()
        released = LeaderRecord("", 1, now, now, observed.transitions)
        if self._replace(released, version, now):
            log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)
            return True
        log.warning("%s could not release lease %s/%s (%s); it expires by itself",
                    self.identity, self.namespace, self.name, self.last_error)
        return False

    def run(self, stop: threading.Event,
            on_started_leading: Callable[[], None] | None = None,
            on_stopped_leading: Callable[[], None] | None = None) -> None:
        """Step until ``stop`` is set, notifying each change of leadership. It does not
        release the lease on stop: the owner releases after its last commit."""
        leading = False
        while not stop.is_set():
            try:
                now_leading = self.step()
            except Exception as error:  # the campaign must outlive any one odd answer
                self.last_error = f"{type(error).__name__}: {error}"
                log.exception("lease %s/%s: attempt failed", self.namespace, self.name)
                now_leading = self.is_leader()
            if now_leading != leading:
                callback = on_started_leading if now_leading else on_stopped_leading
                if callback is not None:
                    callback()
                leading = now_leading
            stop.wait(self.next_wait(now_leading))
        if leading and on_stopped_leading is not None:
            on_stopped_leading()

    def next_wait(self, leading: bool) -> float:
        """Wall seconds to the next attempt: the retry period for a leader, with
        client-go's jitter for a follower (so followers do not retry in step)."""
        if leading:
            return self.retry_period
        return self.retry_period * (1 + self._rng.random() * JITTER_FACTOR)

    # ------------------------------------------------------------------ writes
    def _body(self, record: LeaderRecord, version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version:
            metadata["resourceVersion"] = version
        spec = {k: v for k, v in record.to_spec().items() if v is not None}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": spec}

    def _create(self, record: LeaderRecord, now: dt.datetime) -> bool:
        try:
            lease = self.api.create_namespaced_lease(
                # The client is declared to take a V1Lease but takes a dict body as well.
                self.namespace, self._body(record, None),  # type: ignore[arg-type]
                _request_timeout=self.request_timeout)
        except ApiException as error:
            return self._failed("creating", error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("creating", error)
        self._observe_written(record, lease, now)
        return True

    def _replace(self, record: LeaderRecord, version: str, now: dt.datetime) -> bool:
        try:
            lease = self.api.replace_namespaced_lease(
                # The client is declared to take a V1Lease but takes a dict body as well.
                self.name, self.namespace, self._body(record, version),  # type: ignore[arg-type]
                _request_timeout=self.request_timeout)
        except ApiException as error:
            return self._failed("updating", error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("updating", error)
        self._observe_written(record, lease, now)
        return True

    def _observe_written(self, record: LeaderRecord, lease: Any, now: dt.datetime) -> None:
        version = ""
        if isinstance(lease, client.V1Lease) and lease.metadata is not None:
            version = lease.metadata.resource_version or ""
            record = record_of(lease)
        with self._lock:
            self._observed, self._observed_at, self._observed_version = record, now, version
        self.last_error = ""

    def _failed(self, doing: str, error: BaseException) -> bool:
        if isinstance(error, ApiException):
            words = f"{error.status} {error.reason}"
            if error.status == 409:
                words += " (another candidate wrote it first)"
        else:
            words = type(error).__name__
        self.last_error = f"{doing} the lease: {words}"
        log.debug("%s: %s %s/%s failed: %s", self.identity, doing, self.namespace, self.name,
                  words)
        return False
