"""The Kubernetes ``batch/v1`` Job that runs one task on its TPU node pool, and the
JobSet (``render_jobset``) that runs a multi-slice task on its pools.

Only four things come from the task spec: image, command, args and env. Everything
that touches the pod's security boundary (namespace, service account, volumes,
security context, host access) is fixed here or by configuration, so no spec can make
a Job privileged, mount a host path, use the host network or leave its namespace.

TPU placement follows GKE's rules (reference §2.4): node selectors on the accelerator,
the topology and the node pool; ``google.com/tpu`` requested and limited as a string
equal to the chips per VM; a toleration for the TPU taint; one Pod per VM, so a
multi-host slice is an Indexed Job with completions = parallelism = hosts.

Multi-host workers find each other by name: the pods' ``subdomain`` is the Job's name
and a headless Service of that name selects them, so each pod resolves as
``<job>-<index>.<job>``. GKE's TPU webhook injects ``TPU_WORKER_ID`` and
``TPU_WORKER_HOSTNAMES`` from exactly that (Indexed, a subdomain, parallelism > 1,
``google.com/tpu`` requested). The Service is rendered from the Job manifest and the
Job's uid (``render_headless_service``): it is owned by the Job, so Kubernetes' garbage
collector deletes it with the Job. Single-host Jobs get neither.

Logs: a GCS FUSE CSI ephemeral volume mounts the cluster's bucket and the container's
command runs under ``/bin/sh -c`` with stdout and stderr redirected to
``gs://<bucket>/logs/<job_id>/<pod_name>.log`` (the pod name from the downward API).
The wrapper ``exec``s the task's command, so its exit code, OOM kill and signals are
the pod's own. A spec without a command keeps the image's entrypoint, which cannot be
wrapped without knowing it; its output then stays in the pod log only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from falcon_es.domain import naming
from falcon_es.domain.tpu import TPU_TYPES, SliceShape

MANAGED_BY = "managed-by"
MANAGED_BY_VALUE = "falcon"
TASK_LABEL = "falcon-task"
TASK_ID_ANNOTATION = "falcon/task-id"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
NODEPOOL_SELECTOR = "cloud.google.com/gke-nodepool"
LOG_VOLUME = "falcon-logs"
LOG_MOUNT = "/falcon-logs"
CONTAINER_NAME = "task"
#: The label the Job controller puts on each of its pods (with the newer
#: ``batch.kubernetes.io/job-name``); the headless Service selects on it.
JOB_NAME_POD_LABEL = "job-name"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
#: JobSet's exclusive placement: one child Job (one slice) per node pool, the leader
#: pod pinned by affinity and the followers by a node selector the pod webhook adds.
EXCLUSIVE_TOPOLOGY_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
#: The one replicatedJob of a multi-slice task: child Jobs ``<jobset>-slice-<i>``.
REPLICATED_JOB = "slice"
#: The pod condition Kubernetes sets on a pod killed by a disruption (a drain for a
#: node repair or upgrade, an eviction, a preemption, a node gone).
DISRUPTION_CONDITION = "DisruptionTarget"
#: The reason the Job controller gives a Job a ``FailJob`` rule failed: the JobSet's
#: failure-policy rule fails the whole JobSet on it instead of restarting.
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
#: A memory-backed /dev/shm for the workload (the container runtime's default is
#: 64 MiB; xpk's TPU workloads mount one, as JAX and PyTorch data loaders need it).
SHM_VOLUME, SHM_MOUNT = "dshm", "/dev/shm"
#: Environment variables the log wrapper reads; a spec cannot override them.
POD_NAME_ENV = "FALCON_POD_NAME"
LOG_DIR_ENV = "FALCON_LOG_DIR"
RESERVED_ENV = frozenset({POD_NAME_ENV, LOG_DIR_ENV})
LOG_WRAPPER = (
    'mkdir -p "$FALCON_LOG_DIR" && '
    'exec "$@" > "$FALCON_LOG_DIR/$FALCON_POD_NAME.log" 2>&1'
)
WRAPPER_NAME = "falcon-log-wrapper"


@dataclasses.dataclass(frozen=True)
class JobPlacement:
    """Where and as whom a Job runs: fixed by configuration, never by a spec."""

    namespace: str
    service_account: str
    bucket: str
    ttl_seconds_after_finished: int | None = None


def task_labels(task_id: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGED_BY_VALUE, TASK_LABEL: naming.task_label(task_id)}


def log_path(bucket: str, task_id: str, pod_name: str) -> str:
    """Where a pod's stdout/stderr end up."""
    return f"gs://{bucket}/logs/{naming.log_dir(task_id)}/{pod_name}.log"


def render_job(
    *,
    task_id: str,
    spec: Mapping[str, Any],
    shape: SliceShape,
    pool_name: str,
    placement: JobPlacement,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Job manifest (a plain dict, as the Kubernetes API takes it).

    ``spec`` is the validated spec's data (``TaskSpec.to_data()``); only its image,
    command, args and env are read. ``annotations`` are extra Job annotations the
    caller decides (never taken from the spec's pod-level fields).
    """
    labels = task_labels(task_id)
    name = naming.job_name(task_id)
    job_annotations = {TASK_ID_ANNOTATION: task_id, **dict(annotations or {})}
    pod_spec = _pod_spec(task_id, spec, shape, pool_name, placement)
    job_spec = _one_slice_job_spec(labels, shape, pod_spec, spec)
    if spec.get("retry_exit_codes"):
        job_spec["backoffLimit"] = int(spec.get("max_restarts") or 0)
    if shape.multi_host:
        job_spec["completionMode"] = "Indexed"
        pod_spec["subdomain"] = name
    if placement.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = placement.ttl_seconds_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": placement.namespace,
            "labels": labels,
            "annotations": job_annotations,
        },
        "spec": job_spec,
    }


def _one_slice_job_spec(labels: Mapping[str, str], shape: SliceShape,
                        pod_spec: dict[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a Job of one pod per VM of a slice, shared by a task's Job and each
    child Job of its JobSet: one failed pod fails it (``backoffLimit: 0``), since a
    slice's workers cannot go on without one of theirs; a disrupted pod is recreated
    and the workload's own exit codes fail it at once (``pod_failure_policy``)."""
    return {
        "backoffLimit": 0,
        "completions": shape.hosts,
        "parallelism": shape.hosts,
        "podFailurePolicy": pod_failure_policy(spec.get("retry_exit_codes") or ()),
        "template": {
            "metadata": {
                "labels": dict(labels),
                "annotations": {GCSFUSE_ANNOTATION: "true"},
            },
            "spec": pod_spec,
        },
    }


def pod_failure_policy(retry_exit_codes: Sequence[int]) -> dict[str, Any]:
    """Disruptions are not the workload's failure; its own exit codes are.

    Rules are evaluated in order and the first match wins, so ``Ignore`` on the
    ``DisruptionTarget`` condition comes first: a pod drained for a node repair exits
    on SIGTERM (143) and must not meet the exit-code rule. Then ``FailJob`` on every
    exit code of the task's container not worth a retry (``NotIn``; a container that
    exited 0 is never checked, and 0 keeps the list non-empty). An exit code in
    ``retry_exit_codes`` matches no rule and counts against ``backoffLimit``.
    Kubernetes requires ``restartPolicy: Never`` on the pod template for this.
    """
    return {"rules": [
        {"action": "Ignore",
         "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn",
                         "values": sorted({0, *(int(c) for c in retry_exit_codes)})}},
    ]}


def render_jobset(
    *,
    task_id: str,
    spec: Mapping[str, Any],
    shape: SliceShape,
    pool_names: Sequence[str],
    placement: JobPlacement,
) -> dict[str, Any]:
    """The JobSet of a multi-slice task: one replicatedJob with a replica (a child Job)
    per slice, each an Indexed Job of one pod per VM of its slice.

    Placement: the accelerator and topology selectors as for a Job, exclusive topology
    per node pool (no two slices share a pool), and a required node affinity to this
    task's own pools, so no slice lands on a pool another task holds. The JobSet
    controller, not Falcon-ES, creates the headless Service (named after the JobSet)
    and sets the pods' subdomain, so the pods of a JobSet get neither here. The pods
    use the pod network, never the host's: see docs/design-notes/no-host-network.md.
    ``failurePolicy.maxRestarts`` is the spec's ``max_restarts``; a child Job gives up
    on its first failed pod (``backoffLimit: 0``), so a restart is the JobSet's whole,
    and a child failed by its pod failure policy fails the JobSet (``FailJobSet``).
    """
    labels = task_labels(task_id)
    pod_spec = _pod_spec(task_id, spec, shape, None, placement)
    pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": NODEPOOL_SELECTOR, "operator": "In", "values": list(pool_names),
        }]}],
    }}}
    jobset_spec: dict[str, Any] = {
        "failurePolicy": {
            "maxRestarts": int(spec.get("max_restarts") or 0),
            # A child failed by its FailJob rule (the workload's own exit code) fails
            # the JobSet: restarting would only repeat it until maxRestarts is spent.
            "rules": [{"name": "workload-exit-code", "action": "FailJobSet",
                       "onJobFailureReasons": [POD_FAILURE_POLICY_REASON]}],
        },
        "network": {"enableDNSHostnames": True},
        "replicatedJobs": [{
            "name": REPLICATED_JOB,
            "replicas": len(pool_names),
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {**_one_slice_job_spec(labels, shape, pod_spec, spec),
                         "completionMode": "Indexed"},
            },
        }],
    }
    if placement.ttl_seconds_after_finished is not None:
        jobset_spec["ttlSecondsAfterFinished"] = placement.ttl_seconds_after_finished
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": naming.job_name(task_id),
            "namespace": placement.namespace,
            "labels": labels,
            "annotations": {TASK_ID_ANNOTATION: task_id,
                            EXCLUSIVE_TOPOLOGY_ANNOTATION: NODEPOOL_SELECTOR},
        },
        "spec": jobset_spec,
    }


def child_job_name(jobset: str, index: int) -> str:
    """The JobSet controller's name for the child Job of slice ``index``."""
    return f"{jobset}-{REPLICATED_JOB}-{index}"


def render_headless_service(job: Mapping[str, Any], job_uid: str) -> dict[str, Any] | None:
    """The headless Service through which a multi-host Job's pods resolve each other,
    or None for a Job whose pods name no subdomain of the Job's own name (every
    single-host Job).

    Rendered from the Job manifest (name, namespace, the falcon labels and the task id
    annotation its ownership is decided on), which
    ``render_job`` fixes, never from the spec; the uid is the created Job's. Headless
    (``clusterIP: None``) because workers address one another, not a load balancer; no
    ports, which a headless Service may omit; ``publishNotReadyAddresses`` because
    workers look each other up before any of them is Ready. The ownerReference lets
    the garbage collector delete it with the Job; it is no controller reference (the
    Job controller does not manage Services) and does not block the Job's deletion
    (which would also need update rights on the Job's finalizers).
    """
    metadata = job["metadata"]
    name = metadata["name"]
    pod_spec = job["spec"]["template"]["spec"]
    if pod_spec.get("subdomain") != name:
        return None
    job_labels = metadata.get("labels") or {}
    labels = {MANAGED_BY: MANAGED_BY_VALUE}
    if TASK_LABEL in job_labels:
        labels[TASK_LABEL] = job_labels[TASK_LABEL]
    task_id = (metadata.get("annotations") or {}).get(TASK_ID_ANNOTATION)
    annotations = {"annotations": {TASK_ID_ANNOTATION: task_id}} if task_id else {}
    namespace = {"namespace": metadata["namespace"]} if metadata.get("namespace") else {}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
             "controller": False, "blockOwnerDeletion": False}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **namespace, "labels": labels, **annotations,
                     "ownerReferences": [owner]},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_NAME_POD_LABEL: name},
            "publishNotReadyAddresses": True,
        },
    }


def _pod_spec(
    task_id: str, spec: Mapping[str, Any], shape: SliceShape, pool_name: str | None,
    placement: JobPlacement,
) -> dict[str, Any]:
    """The pod of one VM; ``pool_name`` None leaves the pool to the caller's affinity."""
    chips = str(shape.chips_per_host)
    selector = {
        ACCELERATOR_SELECTOR: TPU_TYPES[shape.tpu_type].accelerator,
        TOPOLOGY_SELECTOR: shape.topology,
    }
    if pool_name is not None:
        selector[NODEPOOL_SELECTOR] = pool_name
    return {
        "restartPolicy": "Never",
        "serviceAccountName": placement.service_account,
        "automountServiceAccountToken": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "nodeSelector": selector,
        "tolerations": [
            {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ],
        "containers": [_container(task_id, spec, chips)],
        "volumes": [{
            "name": LOG_VOLUME,
            "csi": {
                "driver": GCSFUSE_DRIVER,
                "volumeAttributes": {
                    "bucketName": placement.bucket,
                    "mountOptions": "implicit-dirs",
                },
            },
        }, {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}],
    }


def _container(task_id: str, spec: Mapping[str, Any], chips: str) -> dict[str, Any]:
    command = _strings(spec.get("command"))
    args = _strings(spec.get("args"))
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": str(spec["image"]),
        "env": _env(task_id, spec.get("env")),
        "resources": {
            "requests": {TPU_RESOURCE: chips},
            "limits": {TPU_RESOURCE: chips},
        },
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
        },
        "volumeMounts": [{"name": LOG_VOLUME, "mountPath": LOG_MOUNT},
                         {"name": SHM_VOLUME, "mountPath": SHM_MOUNT}],
    }
    if command:
        container["command"] = ["/bin/sh", "-c", LOG_WRAPPER, WRAPPER_NAME, *command, *args]
    elif args:
        container["args"] = args
    return container


def _env(task_id: str, env: Any) -> list[dict[str, Any]]:
    pairs = sorted(env.items()) if isinstance(env, Mapping) else list(env or ())
    out: list[dict[str, Any]] = [
        {"name": str(name), "value": str(value)}
        for name, value in pairs if str(name) not in RESERVED_ENV
    ]
    out.append({"name": POD_NAME_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    out.append({"name": LOG_DIR_ENV, "value": f"{LOG_MOUNT}/logs/{naming.log_dir(task_id)}"})
    return out


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence):
        return [str(v) for v in value]
    return []
