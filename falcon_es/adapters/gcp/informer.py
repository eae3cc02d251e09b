"""The informer of one edge cluster: list + watch Falcon's Jobs, their Pods and the
Job controller's events on them, and publish what it sees of each Job as a
``JobObservation`` on the edge-events bus (the cache: ``job_views``; reading a Job
into an observation: ``job_observations``).

Three watches (Jobs, Pods: label ``managed-by=falcon``; core/v1 Events about Jobs:
field selector ``involvedObject.kind=Job``), and for multi-slice tasks two more
(JobSets, and Events about JobSets: the JobSet controller records its own refusals,
``JobCreationFailed``, on the JobSet, not on a child Job), run in their own threads and
feed one cache (``JobViews``). The events are how pods that are never created show: the Job
controller records ``FailedCreate`` ("Error creating: ...") on the Job for each create
the API server refuses and ``SuccessfulCreate`` ("Created pod: ...") for each it
makes, so a Job's refusal lasts while its newest FailedCreate is newer than its newest
SuccessfulCreate (``refusal_of``). Each watch resumes from the last resourceVersion it
saw (bookmarks included); ``410 Gone`` means the history it needs is compacted away,
so it lists again; a dropped connection or an error reconnects after an exponential
backoff (injected ``sleep`` and ``rng``); a watch the server ends normally is resumed
at once. Every ``resync_seconds`` (injected clock) each watch lists again, which
repairs anything missed, and every Job is published again: unchanged ones with the
same version, a harmless duplicate that reaches subscriptions that missed it.

Versions. The consumer drops an observation whose ``resource_version`` is not larger
than the last one it folded, so a Job's view must never change without its version
growing. Kubernetes promises resourceVersions comparable only within one resource
type (KEP-5504; today they are etcd's one revision counter), and the two watches
deliver independently: the Job update the job
controller made *because* a pod started (rv 111) can arrive before that pod's own
event (rv 110), and the pod then changes the view without any larger object rv. What
the view holds is fixed by how far each watch has read (its position: the last
resourceVersion it delivered, or the list's), and every change moves one of them; so
the version is the sum of the positions. It grows with every change, and a
restarted informer, whose lists start at the cluster's current resourceVersion, never
falls below what a previous process published unless nothing changed since (then its
view is the same). ``kube_resource_version`` (an attribute) is the newest object rv in
the view, for people.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

import urllib3
from kubernetes import watch as kube_watch
from kubernetes.client.exceptions import ApiException

from falcon_es.adapters.gcp.job_observations import object_rv
from falcon_es.adapters.gcp.job_views import (
    EVENTS, JOBS, JOBSET_EVENTS, JOBSETS, PODS, JobViews,
)
from falcon_es.adapters.gcp.kube import KubeEdgeCluster, KubeEdgeClusters
from falcon_es.adapters.gcp.kube_objects import FALCON_SELECTOR
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.domain.manifests import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION
from falcon_es.domain.ports import EDGE_EVENTS_TOPIC, PortError
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import DEFAULT_BACKOFFS, KUBERNETES, Backoff

log = logging.getLogger("falcon_es.adapters.gcp.informer")

#: Seconds added to the server-side watch timeout before the client gives up reading.
READ_SLACK_SECONDS = 30
CONNECT_TIMEOUT_SECONDS = 10


class ObservationPublisher(Protocol):
    """The publishing half of the Bus port: all an informer needs."""

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str: ...


@dataclasses.dataclass(frozen=True)
class InformerSettings:
    topic: str = EDGE_EVENTS_TOPIC
    job_selector: str = FALCON_SELECTOR
    pod_selector: str = FALCON_SELECTOR
    #: A field selector: events carry no labels of the object they are about.
    event_selector: str = "involvedObject.kind=Job"
    #: The JobSet controller's own events (JobCreationFailed) are on the JobSet.
    jobset_event_selector: str = "involvedObject.kind=JobSet"
    resync_seconds: float = 300.0
    #: Server-side timeout of one watch request; the informer then resumes it.
    watch_timeout_seconds: int = 290
    backoff: Backoff = DEFAULT_BACKOFFS[KUBERNETES]
    #: A watch that has not failed for this long starts its backoff from the start.
    backoff_reset_seconds: float = 120.0
    #: Watch JobSets too (multi-slice tasks); off only where no JobSet can exist.
    jobsets: bool = True

    def __post_init__(self) -> None:
        if self.resync_seconds <= 0:
            raise ValueError(f"informer resync {self.resync_seconds}s: must be positive")
        if self.watch_timeout_seconds < 1:
            raise ValueError(f"informer watch timeout {self.watch_timeout_seconds}s: "
                             "must be at least 1")


@dataclasses.dataclass
class InformerStats:
    """Counters for logs and metrics (and for tests to see what happened)."""

    lists: int = 0
    watches: int = 0
    gone: int = 0
    reconnects: int = 0
    resyncs: int = 0
    published: int = 0
    publish_failures: int = 0
    backoff_delays: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Failures:
    """One watch's run of failures: the backoff grows with it and starts over after an
    event arrives or after ``reset`` without a failure (an idle watch sends nothing)."""

    backoff: Backoff
    reset: dt.timedelta
    count: int = 0
    last: dt.datetime | None = None

    def next_delay(self, now: dt.datetime, rng: random.Random) -> float:
        if self.last is not None and now - self.last >= self.reset:
            self.count = 0
        self.count += 1
        self.last = now
        return self.backoff.delay(self.count, rng)

    def recovered(self) -> None:
        self.count = 0


# ------------------------------------------------------------------ the informer

class EdgeInformer:
    """Keeps ``JobViews`` current from the Kubernetes API and publishes each change."""

    def __init__(
        self,
        edge: KubeEdgeCluster,
        bus: ObservationPublisher,
        *,
        settings: InformerSettings | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        restarted: Callable[[str], None] | None = None,
    ) -> None:
        self.edge = edge
        self._on_restart = restarted
        self.settings = settings or InformerSettings()
        self._bus = bus
        self._clock = clock or WallClock()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.views = JobViews(edge.name, self._clock)
        self.stats = InformerStats()
        self._watches: set[kube_watch.Watch] = set()
        self._watches_lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop`` is set (each watched resource in its own thread)."""
        threads = [threading.Thread(target=self._watch_loop, args=(kind, stop),
                                    name=f"informer-{self.edge.name}-{kind}", daemon=True)
                   for kind in (PODS, JOBS, EVENTS, JOBSETS, JOBSET_EVENTS)
                   if kind not in (JOBSETS, JOBSET_EVENTS) or self.settings.jobsets]
        for thread in threads:
            thread.start()
        stop.wait()
        while any(thread.is_alive() for thread in threads):
            with self._watches_lock:
                for active in self._watches:
                    active.stop()
            for thread in threads:
                thread.join(timeout=0.05)

    # -- one resource ---------------------------------------------------------------

    def _watch_loop(self, kind: str, stop: threading.Event) -> None:
        resume_from: str | None = None
        next_resync = self._clock.now()
        failures = _Failures(self.settings.backoff,
                             dt.timedelta(seconds=self.settings.backoff_reset_seconds))
        while not stop.is_set():
            try:
                if resume_from is None or self._clock.now() >= next_resync:
                    resync = resume_from is not None
                    resume_from = self._relist(kind, republish=resync)
                    if resync:
                        self.stats.resyncs += 1
                    next_resync = self._clock.now() + dt.timedelta(
                        seconds=self.settings.resync_seconds)
                    failures.recovered()
                resume_from = self._watch(kind, resume_from, next_resync, stop, failures)
            except ApiException as error:
                if error.status == 410:
                    self.stats.gone += 1
                    self._restarted("gone")
                    log.info("%s watch on %s: %s; listing again", kind, self.edge.name,
                             error.reason)
                    resume_from = None
                    continue
                if error.status == 401 and self.edge.tokens is not None:
                    self.edge.tokens.invalidate()
                self._back_off(kind, failures, error, stop)
            except (urllib3.exceptions.HTTPError, OSError, PortError, ValueError) as error:
                if stop.is_set():
                    break
                self._back_off(kind, failures, error, stop)
            except Exception as error:
                # Anything else (an answer the code did not expect) must not end the
                # thread silently and leave the cluster unwatched: log it and go on.
                log.exception("%s watch on %s: unexpected error", kind, self.edge.name)
                self._back_off(kind, failures, error, stop)

    def _relist(self, kind: str, *, republish: bool) -> str:
        call, selectors = self._list_call(kind)
        listed = call(self.edge.namespace, **selectors, _preload_content=False,
                      _request_timeout=self._read_timeout(60))
        # With _preload_content=False the client returns the raw urllib3 response; it is
        # declared to return the parsed list whatever that flag says.
        response = cast(urllib3.BaseHTTPResponse, listed)
        body = json.loads(response.data)
        list_rv = str(body["metadata"]["resourceVersion"])
        self.stats.lists += 1
        touched = self.views.replace(kind, body.get("items") or (), int(list_rv))
        if republish and kind in (JOBS, JOBSETS):
            self._publish(self.views.job_uids(), republish=True)
        else:
            self._publish(touched)
        return list_rv

    def _watch(self, kind: str, resume_from: str, next_resync: dt.datetime,
               stop: threading.Event, failures: _Failures) -> str:
        """Stream events from ``resume_from``; the resourceVersion to resume from next."""
        remaining = (next_resync - self._clock.now()).total_seconds()
        timeout = int(max(1, min(self.settings.watch_timeout_seconds, remaining)))
        call, selectors = self._list_call(kind)
        watcher = kube_watch.Watch()
        with self._watches_lock:
            self._watches.add(watcher)
        try:
            if stop.is_set():
                return resume_from
            self.stats.watches += 1
            for event in watcher.stream(call, self.edge.namespace, **selectors,
                                        resource_version=resume_from, timeout_seconds=timeout,
                                        allow_watch_bookmarks=True,
                                        _request_timeout=self._read_timeout(timeout)):
                failures.recovered()
                raw = event["raw_object"]
                version = (raw.get("metadata") or {}).get("resourceVersion")
                if event["type"] == "BOOKMARK":
                    self._publish(self.views.advance(kind, object_rv(raw)))
                else:
                    self._publish(self.views.apply(kind, event["type"], raw))
                if version:
                    resume_from = str(version)
                if stop.is_set() or self._clock.now() >= next_resync:
                    break
        finally:
            with self._watches_lock:
                self._watches.discard(watcher)
        return resume_from

    def _list_call(self, kind: str) -> tuple[Callable[..., object], dict[str, str]]:
        """The list call of ``kind`` (which its watch streams too) and its selector."""
        if kind == JOBS:
            return (self.edge.batch.list_namespaced_job,
                    {"label_selector": self.settings.job_selector})
        if kind == EVENTS:
            return (self.edge.core.list_namespaced_event,
                    {"field_selector": self.settings.event_selector})
        if kind == JOBSET_EVENTS:
            return (self.edge.core.list_namespaced_event,
                    {"field_selector": self.settings.jobset_event_selector})
        if kind == JOBSETS:
            custom = self.edge.custom

            def list_jobsets(namespace: str, **options: Any) -> object:
                """JobSets of the namespace (a custom resource: plain dicts)."""
                return custom.list_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, **options)
            return list_jobsets, {"label_selector": self.settings.job_selector}
        return self.edge.core.list_namespaced_pod, {"label_selector": self.settings.pod_selector}

    def _publish(self, job_uids: Iterable[str], *, republish: bool = False) -> None:
        with self.views.lock:
            for uid in job_uids:
                observation = self.views.observe(uid, republish=republish)
                if observation is None:
                    continue
                attributes = {
                    "cluster": observation.cluster_name, "job": observation.job_name,
                    "job_uid": observation.job_uid, "task_id": observation.task_id,
                    "resource_version": str(observation.resource_version),
                    "kube_resource_version": str(self.views.max_resource_version(uid)),
                }
                try:
                    self._bus.publish(self.settings.topic, observation.to_data(),
                                      ordering_key=observation.job_uid, attributes=attributes)
                except PortError as error:
                    self.stats.publish_failures += 1
                    log.warning("publishing Job %s of %s: %s (published again at the next "
                                "change or resync)", observation.job_name, self.edge.name, error)
                    continue
                self.views.published(uid, observation.resource_version)
                self.stats.published += 1

    def _restarted(self, reason: str) -> None:
        if self._on_restart is not None:
            self._on_restart(reason)

    def _back_off(self, kind: str, failures: _Failures, error: BaseException,
                  stop: threading.Event) -> None:
        delay = failures.next_delay(self._clock.now(), self._rng)
        self.stats.reconnects += 1
        self._restarted("error")
        self.stats.backoff_delays.append(delay)
        log.warning("%s watch on %s failed (%s); reconnecting in %.1fs", kind, self.edge.name,
                    error, delay)
        if self._sleep is not None:
            self._sleep(delay)
        else:
            stop.wait(delay)

    @staticmethod
    def _read_timeout(seconds: int) -> tuple[int, int]:
        return CONNECT_TIMEOUT_SECONDS, seconds + READ_SLACK_SECONDS


def run_informer(
    cluster: Cluster,
    edges: KubeEdgeClusters,
    bus: ObservationPublisher,
    stop: threading.Event,
    *,
    settings: InformerSettings | None = None,
    clock: Clock | None = None,
    sleep: Callable[[float], None] | None = None,
    rng: random.Random | None = None,
    restarted: Callable[[str], None] | None = None,
) -> InformerStats:
    """Run the informer of ``cluster`` until ``stop`` is set (``falcon-es informer``;
    the controller may run it in a thread instead). Returns its counters;
    ``restarted(reason)`` hears of each watch restart (``gone``: a 410, ``error``)."""
    informer = EdgeInformer(edges.for_cluster(cluster), bus, settings=settings, clock=clock,
                            sleep=sleep, rng=rng, restarted=restarted)
    log.info("informer for cluster %s: watching namespace %s at %s", cluster.name,
             informer.edge.namespace, informer.edge.host)
    informer.run(stop)
    return informer.stats
