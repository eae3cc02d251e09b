"""What one edge cluster's informer knows: Falcon's Jobs (and JobSets), their pods and
the Job controller's events on them, as the watches deliver them, and each Job's
observation version.

The version of a Job's view is the sum of the watches' positions (see ``informer``,
'Versions'): it grows with every change, whichever watch delivered it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from falcon_es.adapters.gcp.job_observations import (
    FAILED_CREATE, SUCCESSFUL_CREATE, children_behind, job_content, jobset_content,
    object_rv, observation_of, task_id_of, uid_of,
)
from falcon_es.domain.clock import Clock
from falcon_es.domain.manifests import TASK_ID_ANNOTATION, TASK_LABEL
from falcon_es.domain.ports import JOBSET_EVENT_REASONS, JOBSET_KIND, JobObservation

log = logging.getLogger("falcon_es.adapters.gcp.job_views")

#: The resources an informer watches.
JOBS, PODS, EVENTS, JOBSETS = "jobs", "pods", "events", "jobsets"
#: Events about JobSets: the JobSet controller's own (``JOBSET_EVENT_REASONS``).
JOBSET_EVENTS = "jobset-events"


@dataclasses.dataclass
class _View:
    job: dict[str, Any]
    max_rv: int
    version: int = 0
    published: tuple[Any, ...] | None = None  # content last published successfully
    attempted: tuple[Any, ...] | None = None  # content the version was assigned to


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
        #: The JobSet controller's events, likewise by event uid and by the JobSet's uid.
        self._jobset_events: dict[str, dict[str, Any]] = {}
        self._jobset_events_of: dict[str, set[str]] = {}
        self._positions = {JOBS: 0, PODS: 0, EVENTS: 0, JOBSETS: 0, JOBSET_EVENTS: 0}
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
            released = self.advance(kind, object_rv(obj))
            if kind == JOBS:
                return self._routed([*self._apply_job(event_type, dict(obj)), *released])
            if kind == EVENTS:
                return self._routed([*self._apply_event(event_type, dict(obj)), *released])
            if kind == JOBSETS:
                return [*self._apply_jobset(event_type, dict(obj)), *self._routed(released)]
            if kind == JOBSET_EVENTS:
                return [*self._apply_jobset_event(event_type, dict(obj)),
                        *self._routed(released)]
            return self._routed([*self._apply_pod(event_type, dict(obj)), *released])

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]], list_rv: int) -> list[str]:
        """Fold a full list: objects not in it were deleted (at or before ``list_rv``)."""
        with self._lock:
            touched = self.advance(kind, list_rv)
            listed = {uid_of(item): dict(item) for item in items}
            held: Mapping[str, object] = (self._views if kind == JOBS else
                                          self._jobsets if kind == JOBSETS else
                                          self._events if kind == EVENTS else
                                          self._jobset_events if kind == JOBSET_EVENTS
                                          else self._pods)
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
                elif kind == JOBSET_EVENTS:
                    touched += self._apply_jobset_event("DELETED", self._jobset_events[uid])
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
            task_id = task_id_of(view.job)
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
                self._held[job_uid] = object_rv(view.job)
                return None
            self._held.pop(job_uid, None)
            events = [self._events[uid] for uid in self._events_of.get(job_uid, ())]
            content = job_content(view.job, pods, events)
            if content == view.published and not republish:
                return None
            if content != view.attempted:
                view.version = max(sum(self._positions.values()), view.version + 1)
                view.attempted = content
            return observation_of(self.cluster_name, view.job, task_id, content, view.version,
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
        uid, rv = uid_of(jobset), object_rv(jobset)
        if event_type == "DELETED":
            self._jobsets.pop(uid, None)
            for event_uid in self._jobset_events_of.pop(uid, ()):
                self._jobset_events.pop(event_uid, None)
            return []
        view = self._jobsets.get(uid)
        if view is None:
            self._jobsets[uid] = _View(jobset, rv)
            return [uid]
        if rv <= object_rv(view.job):
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
        task_id = task_id_of(view.job)
        if task_id is None:
            return None
        children = self._children(uid)
        parts = []
        for child in children:
            child_uid = uid_of(child)
            pods = [self._pods[p] for p in self._pods_of.get(child_uid, ())]
            if self._pods_behind(child, pods):
                self._held[child_uid] = object_rv(child)
                return None
            events = [self._events[e] for e in self._events_of.get(child_uid, ())]
            parts.append((child, pods, events))
        jobset_events = [self._jobset_events[e] for e in self._jobset_events_of.get(uid, ())]
        content = jobset_content(view.job, parts, jobset_events)
        if children_behind(content[3], parts):
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
        return counted > seen and self._positions[PODS] < object_rv(job)

    def _apply_job(self, event_type: str, job: dict[str, Any]) -> list[str]:
        uid, rv = uid_of(job), object_rv(job)
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
            pod_rvs = [object_rv(self._pods[p]) for p in self._pods_of.get(uid, ())]
            self._views[uid] = _View(job, max(rv, *pod_rvs) if pod_rvs else rv)
            return [uid]
        if rv <= object_rv(view.job):
            return []  # a replay of what the view already holds
        view.job = job
        view.max_rv = max(view.max_rv, rv)
        return [uid]

    def _apply_pod(self, event_type: str, pod: dict[str, Any]) -> list[str]:
        uid, rv = uid_of(pod), object_rv(pod)
        known = self._pods.get(uid)
        owner = _owner_job(pod) or (_owner_job(known) if known else None)
        if event_type == "DELETED":
            if known is None:
                return []
            self._pods.pop(uid)
            if owner:
                self._pods_of.get(owner, set()).discard(uid)
        else:
            if known is not None and rv <= object_rv(known):
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
        job_uid = str((event.get("involvedObject") or {}).get("uid") or "")
        if event.get("reason") not in (FAILED_CREATE, SUCCESSFUL_CREATE) or not job_uid:
            return []
        if not _kept(self._events, self._events_of, event_type, event, job_uid):
            return []
        return _touched(self._views.get(job_uid), job_uid, event)

    def _apply_jobset_event(self, event_type: str, event: dict[str, Any]) -> list[str]:
        """An event the JobSet controller recorded on a JobSet: kept when it is one of
        its own refusals (it could not create a child Job or the headless Service)."""
        jobset_uid = str((event.get("involvedObject") or {}).get("uid") or "")
        if event.get("reason") not in JOBSET_EVENT_REASONS or not jobset_uid:
            return []
        if not _kept(self._jobset_events, self._jobset_events_of, event_type, event,
                     jobset_uid):
            return []
        return _touched(self._jobsets.get(jobset_uid), jobset_uid, event)


def _kept(events: dict[str, dict[str, Any]], events_of: dict[str, set[str]],
          event_type: str, event: dict[str, Any], about: str) -> bool:
    """Fold one watch event of an event about the object ``about`` into ``events``
    (by uid) and ``events_of`` (by that object); False when it changed nothing."""
    uid = uid_of(event)
    if event_type == "DELETED":
        if events.pop(uid, None) is None:
            return False
        events_of.get(about, set()).discard(uid)
        return True
    known = events.get(uid)
    if known is not None and object_rv(event) <= object_rv(known):
        return False
    events[uid] = event
    events_of.setdefault(about, set()).add(uid)
    return True


def _touched(view: _View | None, uid: str, event: Mapping[str, Any]) -> list[str]:
    """The object whose view an event changed (none when it is not known yet)."""
    if view is None:
        return []
    view.max_rv = max(view.max_rv, object_rv(event))
    return [uid]
