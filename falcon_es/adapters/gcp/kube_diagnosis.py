"""Why a Job's pods are pending, read off the Job, its pods and their events: the
Message of a task that waits on an edge cluster.

The root cause comes first, so the Message says what to fix rather than the symptom.
Each finding carries a rank: a node pool without Ready nodes (0), then a pod the
scheduler cannot place (1: PodScheduled=False / FailedScheduling, with the cluster
autoscaler's word on it), then containers that cannot start (2) or died (3), a pod
that failed (4), and only then complaints about the Job itself (5: a Warning event,
6: the Failed condition). FailedCreate from an admission webhook is a symptom when the
leader pod is Pending for lack of accelerators, so it ranks below the pod's own cause.

Everything here is a pure function of what the API returned, except the node counts
of a pool, which the caller supplies (the adapter lists the pool's nodes).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence

from kubernetes import client

from falcon_es.adapters.gcp.kube_objects import (
    COMPLETION_INDEX,
    NODEPOOL_LABEL,
    metadata_of,
    name_of,
)
from falcon_es.domain.ports import NodeCounts

#: Waiting reasons of a container that will not start by itself.
CONTAINER_FAILURES = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
    "CrashLoopBackOff",
})
#: Cluster-autoscaler event reasons on a pending pod worth quoting next to the cause.
AUTOSCALER_REASONS = frozenset({"NotTriggerScaleUp", "FailedScaleUp"})
#: The cluster autoscaler's note while it backs off after a failed scale-up (a Normal
#: NotTriggerScaleUp, kubernetes/autoscaler ``core/scaleup/orchestrator/skippedreasons.go``):
#: newer than the FailedScaleUp that says why, and no cause of its own.
BACKOFF_NOTE = "in backoff after failed scale-up"
#: Findings quoted in a diagnosis at most (the first is the root cause).
MAX_FINDINGS = 3
#: Pending pods whose events are read, leader first (a 64-host slice has 64 pods).
MAX_PODS_EXAMINED = 3


def examined_pods(pods: Sequence[client.V1Pod]) -> list[client.V1Pod]:
    """The pending pods whose events are worth reading, leader first (``pods`` come in
    ``pod_order``): a few, since every pod of a large slice tells the same story."""
    pending = [p for p in pods if p.status is None or p.status.phase == "Pending"]
    return pending[:MAX_PODS_EXAMINED]


def diagnosis(job: client.V1Job, pods: Sequence[client.V1Pod],
              events: Iterable[client.CoreV1Event],
              node_counts: Callable[[str], NodeCounts]) -> str | None:
    """The Message for ``job``: its findings, root cause first, at most
    ``MAX_FINDINGS`` of them; None when nothing is wrong that the API shows.
    ``node_counts`` tells how many nodes of a pool are registered and Ready."""
    findings = _findings(job, pods, events, node_counts)
    if not findings:
        return None
    ordered = sorted(dict.fromkeys(findings), key=lambda finding: finding[0])
    return "; ".join(text for _, text in ordered[:MAX_FINDINGS])


def _findings(job: client.V1Job, pods: Sequence[client.V1Pod],
              events: Iterable[client.CoreV1Event],
              node_counts: Callable[[str], NodeCounts]) -> list[tuple[int, str]]:
    """Every (rank, text) the Job, its pods and their events show, in the pods' order;
    a pool's nodes are counted once however many of its pods cannot be scheduled."""
    by_object: dict[tuple[str, str], list[client.CoreV1Event]] = {}
    for event in events:
        involved = event.involved_object
        by_object.setdefault((involved.kind or "", involved.name or ""), []).append(event)
    findings: list[tuple[int, str]] = []
    pools_checked: set[str] = set()
    for pod in pods:
        pod_name = name_of(pod, "a Pod")
        pod_events = sorted(by_object.get(("Pod", pod_name), []), key=_event_time)
        unschedulable = _unschedulable_message(pod, pod_events)
        if unschedulable is not None:
            # The autoscaler's word on why no node comes (a stockout, a quota) is the
            # root cause: it leads, ahead of the pool's counts and the pod's symptom.
            word = autoscaler_cause(pod_events)
            if word is not None:
                findings.append((0, f"cluster autoscaler {word.reason}: {word.message}"))
            pool = (pod.spec.node_selector or {}).get(NODEPOOL_LABEL) if pod.spec else None
            if pool and pool not in pools_checked:
                pools_checked.add(pool)
                counts = node_counts(pool)
                if counts.ready == 0:
                    findings.append((0, (f"node pool {pool} has no Ready nodes "
                                         f"({counts.registered} registered)")))
            findings.append((1, f"pod {pod_name} cannot be scheduled: {unschedulable}"))
        findings.extend(_container_findings(pod))
        status = pod.status
        if status is not None and status.phase == "Failed" and status.reason:
            detail = f": {status.message}" if status.message else ""
            findings.append((4, f"pod {pod_name} failed: {status.reason}{detail}"))
    job_name = name_of(job, "a Job")
    for event in sorted(by_object.get(("Job", job_name), []), key=_event_time):
        if event.type == "Warning":
            findings.append((5, f"Job {job_name}: {event.reason}: {event.message}"))
    for condition in (job.status.conditions if job.status else None) or ():
        if condition.type == "Failed" and condition.status == "True":
            findings.append((6, (f"Job {job_name} failed: {condition.reason}: "
                                 f"{condition.message}")))
    return findings


def autoscaler_cause(events: Sequence[client.CoreV1Event]) -> client.CoreV1Event | None:
    """The cluster autoscaler's word on a pending pod (``events`` oldest first): its
    newest event, unless that is the backoff note, which only says a scale-up failed
    before: then the last ``FailedScaleUp``, which says why (a stockout, a quota)."""
    scale = [e for e in events if e.reason in AUTOSCALER_REASONS]
    if not scale:
        return None
    newest = scale[-1]
    if newest.reason == "NotTriggerScaleUp" and BACKOFF_NOTE in (newest.message or ""):
        failed = [e for e in scale if e.reason == "FailedScaleUp"]
        if failed:
            return failed[-1]
    return newest


def pod_order(pod: client.V1Pod) -> tuple[int, str]:
    """The leader (completion index 0) first: its trouble is upstream of the others'."""
    meta = metadata_of(pod, "a Pod")
    raw = (meta.labels or {}).get(COMPLETION_INDEX) or (meta.annotations or {}).get(
        COMPLETION_INDEX)
    index = int(raw) if raw is not None and raw.isdigit() else 1 << 30
    return index, name_of(pod, "a Pod")


def _event_time(event: client.CoreV1Event) -> dt.datetime:
    """When the event last happened, on one naive scale: the client fills one of three
    timestamps depending on the API version that recorded it; one with none
    sorts first."""
    moment = event.last_timestamp or event.event_time or event.first_timestamp
    if moment is None:
        return dt.datetime.min
    return moment.replace(tzinfo=None)


def _unschedulable_message(pod: client.V1Pod, events: Sequence[client.CoreV1Event]) -> str | None:
    """The scheduler's words on why a Pending pod has no node (its PodScheduled
    condition, else its latest FailedScheduling event); None for a pod it placed."""
    status = pod.status
    if status is None or status.phase != "Pending":
        return None
    for condition in status.conditions or ():
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or condition.reason or "Unschedulable"
    failed = [e for e in events if e.reason == "FailedScheduling"]
    if failed and not (pod.spec and pod.spec.node_name):
        return failed[-1].message
    return None


def _container_findings(pod: client.V1Pod) -> list[tuple[int, str]]:
    """Containers that wait for something that will not come by itself (an image that
    cannot be pulled, a crash loop) or that terminated with an error."""
    status = pod.status
    statuses = [*(status.init_container_statuses or ()), *(status.container_statuses or ())] \
        if status else []
    findings: list[tuple[int, str]] = []
    for container in statuses:
        state = container.state
        where = f"pod {metadata_of(pod, 'a Pod').name} container {container.name}"
        if state and state.waiting and state.waiting.reason in CONTAINER_FAILURES:
            detail = f": {state.waiting.message}" if state.waiting.message else ""
            findings.append((2, f"{where}: {state.waiting.reason}{detail}"))
            last = container.last_state.terminated if container.last_state else None
            if last is not None and last.exit_code:
                findings.append((3, (f"{where} last terminated: {last.reason} "
                                     f"(exit code {last.exit_code})")))
        terminated = state.terminated if state else None
        if terminated is not None and (terminated.exit_code or terminated.reason == "OOMKilled"):
            detail = f": {terminated.message}" if terminated.message else ""
            findings.append((3, (f"{where} terminated: {terminated.reason} "
                                 f"(exit code {terminated.exit_code}){detail}")))
    return findings
