"""The informer of one edge cluster: list + watch Falcon's Jobs, their Pods and the
Job controller's events on them, and publish what it sees of each Job as a
``JobObservation`` on the edge-events bus.

Three watches (Jobs, Pods: label ``managed-by=falcon``; core/v1 Events about Jobs:
field selector ``involvedObject.kind=Job``) run in their own threads and feed one
cache (``JobViews``). The events are how pods that are never created show: the Job
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
growing. Kubernetes resourceVersions are one counter for all objects (etcd's
revision), but the two watches deliver independently: the Job update the job
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
from types import MappingProxyType
from typing import Any, Protocol, cast

import urllib3
from kubernetes import watch as kube_watch
from kubernetes.client.exceptions import ApiException

from falcon_es.adapters.gcp.kube import KubeEdgeCluster, KubeEdgeClusters
from falcon_es.adapters.gcp.kube_objects import FALCON_SELECTOR
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.domain.manifests import (
    JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, TASK_ID_ANNOTATION, TASK_LABEL,
)
from falcon_es.domain.ports import (
    EDGE_EVENTS_TOPIC, JOBSET_KIND, CreateRefusal, JobObservation, PodObservation, PortError,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import DEFAULT_BACKOFFS, KUBERNETES, Backoff

log = logging.getLogger("falcon_es.adapters.gcp.informer")

JOBS, PODS, EVENTS, JOBSETS = "jobs", "pods", "events", "jobsets"
#: The Job controller's event reasons (pkg/controller controller_utils.go).
FAILED_CREATE, SUCCESSFUL_CREATE = "FailedCreate", "SuccessfulCreate"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
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


# ------------------------------------------------------------------ the cache

@dataclasses.dataclass
class _View:
    job: dict[str, Any]
    max_rv: int
    version: int = 0
    published: tuple[Any, ...] | None = None  # content last published successfully
    attempted: tuple[Any, ...] | None = None  # content the version was assigned to


def _rv(obj: Mapping[str, Any]) -> int:
    raw = (obj.get("metadata") or {}).get("resourceVersion") or "0"
    return int(raw) if str(raw).isdigit() else 0


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _owner_job(pod: Mapping[str, Any]) -> str | None:
    return _owner(pod, "Job")


def _owner(obj: Mapping[str, Any], kind: str) -> str | None:
    """The uid of the object's controller of ``kind``."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("kind") == kind and owner.get("controller", True):
            return str(owner.get("uid"))
    return None


def _slice_index(child: str) -> int:
    tail = child.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class JobViews:
    """What one informer knows: Falcon's Jobs, their pods, and each Job's version.

    Thread-safe; the watches of both resources apply their events here.
    """

    def __init__(self, cluster_name: str, clock: Clock) -> None:
        self.cluster_name = cluster_name
        self._clock = clock
        self._lock = threading.RLock()
        self._views: dict[str, _View] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self._pods_of: dict[str, set[str]] = {}
        #: The Job controller's create events, by event uid and by the Job's uid (the
        #: API server expires events after an hour, so these do not pile up).
        self._events: dict[str, dict[str, Any]] = {}
        self._events_of: dict[str, set[str]] = {}
        self._positions = {JOBS: 0, PODS: 0, EVENTS: 0, JOBSETS: 0}
        #: JobSets (multi-slice tasks) and the child Jobs each owns: a child is
        #: published only as part of its JobSet's observation.
        self._jobsets: dict[str, _View] = {}
        self._parent: dict[str, str] = {}
        #: Jobs held back because their status counts finished pods the pod view has not
        #: seen yet, with the Job's resourceVersion the pods watch has to reach.
        self._held: dict[str, int] = {}

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def job_uids(self) -> list[str]:
        with self._lock:
            return sorted([*self._views, *self._jobsets])

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> list[str]:
        """Fold one watch event; the uids of the Jobs whose view it touched."""
        with self._lock:
            released = self.advance(kind, _rv(obj))
            if kind == JOBS:
                return self._routed([*self._apply_job(event_type, dict(obj)), *released])
            if kind == EVENTS:
                return self._routed([*self._apply_event(event_type, dict(obj)), *released])
            if kind == JOBSETS:
                return [*self._apply_jobset(event_type, dict(obj)), *self._routed(released)]
            return self._routed([*self._apply_pod(event_type, dict(obj)), *released])

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]], list_rv: int) -> list[str]:
        """Fold a full list: objects not in it were deleted (at or before ``list_rv``)."""
        with self._lock:
            touched = self.advance(kind, list_rv)
            listed = {_uid(item): dict(item) for item in items}
            held: Mapping[str, object] = (self._views if kind == JOBS else
                                          self._jobsets if kind == JOBSETS else
                                          self._events if kind == EVENTS else self._pods)
            known = set(held)
            for uid in sorted(known - set(listed)):
                if kind == JOBS:
                    self._views.pop(uid, None)
                    parent = self._parent.pop(uid, None)
                    if parent:
                        touched.append(parent)
                elif kind == JOBSETS:
                    self._jobsets.pop(uid, None)
                elif kind == EVENTS:
                    touched += self._apply_event("DELETED", self._events[uid])
                else:
                    gone = self._pods[uid]
                    gone.setdefault("metadata", {})["resourceVersion"] = str(list_rv)
                    touched += self._apply_pod("DELETED", gone)
            for item in listed.values():
                touched += self.apply(kind, "MODIFIED", item)
            return list(dict.fromkeys(self._routed(touched)))

    def advance(self, kind: str, resource_version: int) -> list[str]:
        """The watch of ``kind`` has delivered everything up to ``resource_version``
        (an event, a list, a bookmark). Returns the held Jobs the pods watch has now
        caught up with (to be observed again)."""
        with self._lock:
            self._positions[kind] = max(self._positions[kind], resource_version)
            if kind != PODS or not self._held:
                return []
            caught_up = [uid for uid, job_rv in self._held.items()
                         if job_rv <= self._positions[PODS]]
            for uid in caught_up:
                del self._held[uid]
            return caught_up

    def observe(self, job_uid: str, *, republish: bool = False) -> JobObservation | None:
        """The Job's observation if its view changed since it was last published (or
        always, with ``republish``); None for an unknown Job or one without a task id.
        A JobSet's uid gives the JobSet's observation; a child Job's none of its own."""
        with self._lock:
            if job_uid in self._jobsets:
                return self._observe_jobset(job_uid, republish)
            if job_uid in self._parent:
                return None
            view = self._views.get(job_uid)
            if view is None or view.job["metadata"].get("deletionTimestamp"):
                return None  # unknown, or on its way out: its pods' deletion is no news
            task_id = _task_id(view.job)
            if task_id is None:
                log.warning("Job %s on %s has no %s label or %s annotation; not published",
                            view.job["metadata"].get("name"), self.cluster_name, TASK_LABEL,
                            TASK_ID_ANNOTATION)
                return None
            pods = [self._pods[uid] for uid in self._pods_of.get(job_uid, ())]
            if self._pods_behind(view.job, pods):
                # The two watches are not ordered: the Job's "failed: 1" can arrive
                # before the pod update that says why. Publishing it now would end the
                # task without its root cause; wait until the pods watch has reached
                # the Job's resourceVersion (an event, a bookmark or a relist).
                self._held[job_uid] = _rv(view.job)
                return None
            self._held.pop(job_uid, None)
            events = [self._events[uid] for uid in self._events_of.get(job_uid, ())]
            content = _content(view.job, pods, events)
            if content == view.published and not republish:
                return None
            if content != view.attempted:
                view.version = max(sum(self._positions.values()), view.version + 1)
                view.attempted = content
            return _observation(self.cluster_name, view.job, task_id, content, view.version,
                                self._clock.now())

    def published(self, job_uid: str, version: int) -> None:
        """Record a successful publish (the content the version was assigned to)."""
        with self._lock:
            view = self._views.get(job_uid) or self._jobsets.get(job_uid)
            if view is not None and view.version == version:
                view.published = view.attempted

    def max_resource_version(self, job_uid: str) -> int:
        with self._lock:
            view = self._views.get(job_uid) or self._jobsets.get(job_uid)
            return view.max_rv if view else 0

    # -- JobSets ----------------------------------------------------------------

    def _routed(self, uids: Iterable[str]) -> list[str]:
        """Touched Jobs, a JobSet's child replaced by its JobSet."""
        return list(dict.fromkeys(self._parent.get(uid, uid) for uid in uids))

    def _apply_jobset(self, event_type: str, jobset: dict[str, Any]) -> list[str]:
        uid, rv = _uid(jobset), _rv(jobset)
        if event_type == "DELETED":
            self._jobsets.pop(uid, None)
            return []
        view = self._jobsets.get(uid)
        if view is None:
            self._jobsets[uid] = _View(jobset, rv)
            return [uid]
        if rv <= _rv(view.job):
            return []
        view.job = jobset
        view.max_rv = max(view.max_rv, rv)
        return [uid]

    def _children(self, jobset_uid: str) -> list[dict[str, Any]]:
        """The JobSet's child Jobs in slice order (their name ends with the index)."""
        children = [self._views[uid].job for uid, parent in self._parent.items()
                    if parent == jobset_uid and uid in self._views]
        return sorted(children, key=lambda j: _slice_index(str(j["metadata"].get("name"))))

    def _observe_jobset(self, uid: str, republish: bool) -> JobObservation | None:
        view = self._jobsets[uid]
        if view.job["metadata"].get("deletionTimestamp"):
            return None
        task_id = _task_id(view.job)
        if task_id is None:
            return None
        children = self._children(uid)
        parts = []
        for child in children:
            child_uid = _uid(child)
            pods = [self._pods[p] for p in self._pods_of.get(child_uid, ())]
            if self._pods_behind(child, pods):
                self._held[child_uid] = _rv(child)
                return None
            events = [self._events[e] for e in self._events_of.get(child_uid, ())]
            parts.append((child, pods, events))
        content = _jobset_content(view.job, parts)
        if _children_behind(content[3], parts):
            return None  # observed again when the child Job's update arrives
        if content == view.published and not republish:
            return None
        if content != view.attempted:
            view.version = max(sum(self._positions.values()), view.version + 1)
            view.attempted = content
        succeeded, failed, completions, condition, ordered, refusal, restarts, reason = content
        return JobObservation(
            cluster_name=self.cluster_name, job_name=str(view.job["metadata"]["name"]),
            job_uid=uid, task_id=task_id, resource_version=view.version,
            active=sum(1 for p in ordered if p.phase == "Running"), succeeded=succeeded,
            failed=failed, completions=completions, pods=ordered,
            observed_at=self._clock.now(), condition=condition, refusal=refusal,
            kind=JOBSET_KIND, restarts=restarts, condition_reason=reason)

    # -- internals --------------------------------------------------------------

    def _pods_behind(self, job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> bool:
        """The Job's status counts more finished pods than the pod view shows, and the
        pods watch has not yet delivered everything up to the Job's resourceVersion
        (one revision counter orders both resources, so by then it would have)."""
        status = job.get("status") or {}
        counted = int(status.get("succeeded") or 0) + int(status.get("failed") or 0)
        if counted == 0:
            return False
        seen = sum(1 for pod in pods
                   if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
        return counted > seen and self._positions[PODS] < _rv(job)

    def _apply_job(self, event_type: str, job: dict[str, Any]) -> list[str]:
        uid, rv = _uid(job), _rv(job)
        parent = _owner(job, "JobSet")
        if parent and event_type != "DELETED":
            self._parent[uid] = parent
        if event_type == "DELETED":
            self._views.pop(uid, None)
            gone = self._parent.pop(uid, None)
            for event_uid in self._events_of.pop(uid, ()):
                self._events.pop(event_uid, None)
            return [gone] if gone else []
        view = self._views.get(uid)
        if view is None:
            pod_rvs = [_rv(self._pods[p]) for p in self._pods_of.get(uid, ())]
            self._views[uid] = _View(job, max(rv, *pod_rvs) if pod_rvs else rv)
            return [uid]
        if rv <= _rv(view.job):
            return []  # a replay of what the view already holds
        view.job = job
        view.max_rv = max(view.max_rv, rv)
        return [uid]

    def _apply_pod(self, event_type: str, pod: dict[str, Any]) -> list[str]:
        uid, rv = _uid(pod), _rv(pod)
        known = self._pods.get(uid)
        owner = _owner_job(pod) or (_owner_job(known) if known else None)
        if event_type == "DELETED":
            if known is None:
                return []
            self._pods.pop(uid)
            if owner:
                self._pods_of.get(owner, set()).discard(uid)
        else:
            if known is not None and rv <= _rv(known):
                return []
            self._pods[uid] = pod
            if owner:
                self._pods_of.setdefault(owner, set()).add(uid)
        view = self._views.get(owner or "")
        if view is None:
            return []
        view.max_rv = max(view.max_rv, rv)
        return [owner or ""]


    def _apply_event(self, event_type: str, event: dict[str, Any]) -> list[str]:
        """An event about a Job: kept when the Job controller says it created a pod or
        was refused one (other reasons change nothing the product reads)."""
        uid = _uid(event)
        job_uid = str((event.get("involvedObject") or {}).get("uid") or "")
        if event.get("reason") not in (FAILED_CREATE, SUCCESSFUL_CREATE) or not job_uid:
            return []
        if event_type == "DELETED":
            if self._events.pop(uid, None) is None:
                return []
            self._events_of.get(job_uid, set()).discard(uid)
        else:
            known = self._events.get(uid)
            if known is not None and _rv(event) <= _rv(known):
                return []
            self._events[uid] = event
            self._events_of.setdefault(job_uid, set()).add(uid)
        view = self._views.get(job_uid)
        if view is None:
            return []
        view.max_rv = max(view.max_rv, _rv(event))
        return [job_uid]


def refusal_of(events: Iterable[Mapping[str, Any]]) -> CreateRefusal | None:
    """The Job controller's refusal to create the Job's pods, while it lasts: its
    newest FailedCreate event when no SuccessfulCreate came after it. Events time
    themselves in whole seconds, so a tie goes to the one the API server wrote last
    (the larger resourceVersion)."""
    newest: dict[str, tuple[dt.datetime, int, Mapping[str, Any]]] = {}
    for event in events:
        reason = str(event.get("reason"))
        key = (_event_time(event), _rv(event), event)
        if reason not in newest or key[:2] > newest[reason][:2]:
            newest[reason] = key
    failed = newest.get(FAILED_CREATE)
    if failed is None:
        return None
    created = newest.get(SUCCESSFUL_CREATE)
    if created is not None and created[:2] > failed[:2]:
        return None
    event = failed[2]
    return CreateRefusal(str(event.get("message") or FAILED_CREATE),
                         int(event.get("count") or 1))


def _event_time(event: Mapping[str, Any]) -> dt.datetime:
    """When the event last happened: core/v1 events recorded by client-go's recorder
    have lastTimestamp (whole seconds); newer recorders fill series.lastObservedTime or
    eventTime (MicroTime). One without a readable time sorts first."""
    series = event.get("series") or {}
    raw = (event.get("lastTimestamp") or series.get("lastObservedTime")
           or event.get("eventTime") or event.get("firstTimestamp"))
    try:
        moment = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _task_id(job: Mapping[str, Any]) -> str | None:
    meta = job.get("metadata") or {}
    return (meta.get("annotations") or {}).get(TASK_ID_ANNOTATION) or (
        meta.get("labels") or {}).get(TASK_LABEL) or None


def _pod_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(COMPLETION_INDEX) or (
        meta.get("annotations") or {}).get(COMPLETION_INDEX)
    index = int(raw) if raw is not None and str(raw).isdigit() else 1 << 30
    return index, str(meta.get("name"))


def pod_observation(pod: Mapping[str, Any]) -> PodObservation:
    """A pod's phase and the most telling reason: a failed container's termination,
    a container that cannot start, the pod's own reason, the scheduler's refusal."""
    status = pod.get("status") or {}
    name = str((pod.get("metadata") or {}).get("name"))
    phase = str(status.get("phase") or "Pending")
    containers = [*(status.get("initContainerStatuses") or ()),
                  *(status.get("containerStatuses") or ())]
    for container in containers:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and (terminated.get("exitCode") or terminated.get("reason") == "OOMKilled"):
            return PodObservation(name, phase, terminated.get("reason") or "Error",
                                  terminated.get("exitCode"), terminated.get("message"),
                                  terminated.get("finishedAt"))
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            last = (container.get("lastState") or {}).get("terminated") or {}
            return PodObservation(name, phase, waiting["reason"], last.get("exitCode"),
                                  waiting.get("message"))
    if status.get("reason"):
        return PodObservation(name, phase, status["reason"], None, status.get("message"))
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return PodObservation(name, phase, condition.get("reason") or "Unschedulable", None,
                                  condition.get("message"))
    for container in containers:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return PodObservation(name, phase, terminated.get("reason") or "Completed",
                                  terminated.get("exitCode"), terminated.get("message"),
                                  terminated.get("finishedAt"))
    return PodObservation(name, phase)


def _condition(job: Mapping[str, Any]) -> str | None:
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


Content = tuple[int, int, int, str | None, tuple[PodObservation, ...], CreateRefusal | None]


def _content(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
             events: Iterable[Mapping[str, Any]]) -> Content:
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    ordered = tuple(pod_observation(p) for p in sorted(pods, key=_pod_order))
    return (int(status.get("succeeded") or 0), int(status.get("failed") or 0),
            int(spec.get("completions") or 1), _condition(job), ordered, refusal_of(events))


JobSetContent = tuple[int, int, int, str | None, tuple[PodObservation, ...],
                      CreateRefusal | None, int, str | None]
#: A JobSet's conditions and what the port calls them.
_JOBSET_CONDITIONS: Mapping[str, str] = MappingProxyType(
    {"Completed": "Complete", "Failed": "Failed"})


def _jobset_content(jobset: Mapping[str, Any],
                    children: Iterable[tuple[Mapping[str, Any], list[dict[str, Any]],
                                             list[dict[str, Any]]]]) -> JobSetContent:
    """A JobSet's observation: its children's pods and counts summed (slice order), the
    first child's refusal (transient while that child's leader has no node), and the
    JobSet's own verdict, restarts and reason."""
    succeeded = failed = completions = 0
    pods: list[PodObservation] = []
    refusal: CreateRefusal | None = None
    for child, child_pods, events in children:
        child_succeeded, child_failed, child_completions, _, ordered, refused = _content(
            child, child_pods, events)
        succeeded, failed = succeeded + child_succeeded, failed + child_failed
        completions += child_completions
        pods.extend(ordered)
        if refused is not None and refusal is None:
            leader = next((p for p in sorted(child_pods, key=_pod_order)
                           if _pod_order(p)[0] == 0), None)
            unscheduled = leader is None or not (leader.get("spec") or {}).get("nodeName")
            refusal = CreateRefusal(f"child Job {child['metadata'].get('name')}: "
                                    f"{refused.message}", refused.count, transient=unscheduled)
    status = jobset.get("status") or {}
    condition = reason = None
    for entry in status.get("conditions") or ():
        if entry.get("type") in _JOBSET_CONDITIONS and entry.get("status") == "True":
            condition, reason = _JOBSET_CONDITIONS[entry["type"]], entry.get("reason")
    return (succeeded, failed, completions, condition, tuple(pods), refusal,
            int(status.get("restarts") or 0), reason)


def _children_behind(condition: str | None, children: Iterable[
        tuple[Mapping[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]) -> bool:
    """The JobSet's verdict arrived before the child Jobs' status it was drawn from
    (the JobSets and Jobs watches are not ordered): a Completed JobSet whose children
    are not all Complete yet, or a Failed one with no Failed child. Publishing it now
    would end the task with a partial count or without its root cause. A JobSet whose
    children are all gone is published as it is."""
    verdicts = [_condition(child) for child, _, _ in children]
    if condition is None or not verdicts:
        return False
    if condition == "Complete":
        return any(verdict != "Complete" for verdict in verdicts)
    return "Failed" not in verdicts


def _observation(cluster_name: str, job: Mapping[str, Any], task_id: str, content: Content,
                 version: int, moment: dt.datetime) -> JobObservation:
    succeeded, failed, completions, condition, ordered, refusal = content
    return JobObservation(
        cluster_name=cluster_name, job_name=str(job["metadata"]["name"]), job_uid=_uid(job),
        task_id=task_id, resource_version=version,
        active=sum(1 for p in ordered if p.phase == "Running"), succeeded=succeeded,
        failed=failed, completions=completions, pods=ordered, observed_at=moment,
        condition=condition, refusal=refusal,
    )


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
        """Watch until ``stop`` is set (the three resources, each in its own thread)."""
        threads = [threading.Thread(target=self._watch_loop, args=(kind, stop),
                                    name=f"informer-{self.edge.name}-{kind}", daemon=True)
                   for kind in (PODS, JOBS, EVENTS, JOBSETS)
                   if kind != JOBSETS or self.settings.jobsets]
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
                    self._publish(self.views.advance(kind, _rv(raw)))
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
