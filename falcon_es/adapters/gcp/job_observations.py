"""A Job (or JobSet) as Kubernetes holds it, with its pods and events, read into the
``JobObservation`` the edge-events bus carries: its condition, counts, pods, and the
refusal that keeps its pods from being created (``refusal_of``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain.manifests import TASK_ID_ANNOTATION, TASK_LABEL
from falcon_es.domain.ports import (
    JOB_CREATION_FAILED, CreateRefusal, JobObservation, PodObservation, jobset_cause,
)

#: The Job controller's event reasons (pkg/controller controller_utils.go).
FAILED_CREATE, SUCCESSFUL_CREATE = "FailedCreate", "SuccessfulCreate"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def object_rv(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (0 when it has none)."""
    raw = (obj.get("metadata") or {}).get("resourceVersion") or "0"
    return int(raw) if str(raw).isdigit() else 0


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def refusal_of(events: Iterable[Mapping[str, Any]]) -> CreateRefusal | None:
    """The Job controller's refusal to create the Job's pods, while it lasts: its
    newest FailedCreate event when no SuccessfulCreate came after it. Events time
    themselves in whole seconds, so a tie goes to the one the API server wrote last
    (the larger resourceVersion)."""
    newest: dict[str, tuple[dt.datetime, int, Mapping[str, Any]]] = {}
    for event in events:
        reason = str(event.get("reason"))
        key = (_event_time(event), object_rv(event), event)
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


def task_id_of(job: Mapping[str, Any]) -> str | None:
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
    """A pod's phase and the most telling reason (``_pod_cause``), its node, and its
    ``DisruptionTarget`` condition when a disruption killed it (Kubernetes "Pod
    disruption conditions": the pod failure policy ignores such a pod)."""
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or None
    disruption = next((f"{c.get('reason') or 'DisruptionTarget'}: {c.get('message') or ''}"
                       .rstrip(": ") for c in status.get("conditions") or ()
                       if c.get("type") == "DisruptionTarget" and c.get("status") == "True"),
                      None)
    return dataclasses.replace(_pod_cause(pod), node=node, disruption=disruption)


def _pod_cause(pod: Mapping[str, Any]) -> PodObservation:
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


def job_content(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
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


def jobset_content(jobset: Mapping[str, Any],
                    children: Iterable[tuple[Mapping[str, Any], list[dict[str, Any]],
                                             list[dict[str, Any]]]],
                    jobset_events: Iterable[Mapping[str, Any]] = ()) -> JobSetContent:
    """A JobSet's observation: its children's pods and counts summed (slice order), the
    completions its spec asks for, the refusal (the JobSet controller's own, from
    ``jobset_events`` on the JobSet, while a child Job is missing; else the first child's,
    transient while that child's leader has no node), and the JobSet's own verdict,
    restarts and reason."""
    children = list(children)
    succeeded = failed = completions = 0
    pods: list[PodObservation] = []
    refusal: CreateRefusal | None = None
    for child, child_pods, events in children:
        child_succeeded, child_failed, child_completions, _, ordered, refused = job_content(
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
    completions = jobset_completions(jobset) or completions
    refusal = jobset_refusal(jobset, jobset_events, len(children)) or refusal
    status = jobset.get("status") or {}
    condition = reason = None
    for entry in status.get("conditions") or ():
        if entry.get("type") in _JOBSET_CONDITIONS and entry.get("status") == "True":
            condition, reason = _JOBSET_CONDITIONS[entry["type"]], entry.get("reason")
    return (succeeded, failed, completions, condition, tuple(pods), refusal,
            int(status.get("restarts") or 0), reason)


def jobset_refusal(jobset: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
                   children: int) -> CreateRefusal | None:
    """The JobSet controller's refusal to create a child Job (its newest
    ``JobCreationFailed`` on the JobSet, in its words), while fewer child Jobs exist
    than the spec asks for; the upstream cause of any child's refusal."""
    wanted = sum(int(r.get("replicas") or 1)
                 for r in (jobset.get("spec") or {}).get("replicatedJobs") or ())
    failed = [e for e in events if e.get("reason") == JOB_CREATION_FAILED]
    if not failed or children >= wanted:
        return None
    newest = max(failed, key=lambda e: (_event_time(e), object_rv(e)))
    series = newest.get("series") or {}
    return CreateRefusal(jobset_cause(JOB_CREATION_FAILED, str(newest.get("message") or "")),
                         int(newest.get("count") or series.get("count") or 1))


def jobset_completions(jobset: Mapping[str, Any]) -> int:
    """The pods a JobSet needs to succeed, from its own spec: each replicated Job's
    replicas times its Jobs' completions (0 when the spec says nothing). A count summed
    over the child Jobs seen so far falls short while the Jobs watch has not delivered
    every child yet (the JobSets and Jobs watches are not ordered)."""
    total = 0
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or ():
        job_spec = (replicated.get("template") or {}).get("spec") or {}
        total += int(replicated.get("replicas") or 1) * int(job_spec.get("completions") or 1)
    return total


def children_behind(condition: str | None, children: Iterable[
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


def observation_of(cluster_name: str, job: Mapping[str, Any], task_id: str, content: Content,
                 version: int, moment: dt.datetime) -> JobObservation:
    succeeded, failed, completions, condition, ordered, refusal = content
    return JobObservation(
        cluster_name=cluster_name, job_name=str(job["metadata"]["name"]), job_uid=uid_of(job),
        task_id=task_id, resource_version=version,
        active=sum(1 for p in ordered if p.phase == "Running"), succeeded=succeeded,
        failed=failed, completions=completions, pods=ordered, observed_at=moment,
        condition=condition, refusal=refusal,
    )
