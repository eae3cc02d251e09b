"""What the edge-cluster adapter reads off the objects the Kubernetes API returns.

The ``kubernetes`` client types every field Optional, even those the API server always
sets (metadata, its name and uid); these readers turn a missing one into a PortError
that names the object, so the adapter and the diagnosis never pass a None along. Also
here: the labels the adapter selects objects by, and a Job's task id, which Falcon
writes into the Job it renders (``falcon_es.domain.manifests``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes import client

from falcon_es.domain.manifests import MANAGED_BY, MANAGED_BY_VALUE, TASK_ID_ANNOTATION, TASK_LABEL
from falcon_es.domain.naming import OwnerMarks
from falcon_es.domain.ports import FAILED, JobRef, PortError

NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
FALCON_SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE}"


def task_of(metadata: Any) -> str | None:
    """The task id of a Job: the annotation holds it verbatim, the label maybe shortened."""
    if isinstance(metadata, Mapping):
        annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
    else:
        annotations, labels = metadata.annotations or {}, metadata.labels or {}
    return annotations.get(TASK_ID_ANNOTATION) or labels.get(TASK_LABEL) or None


def owner_of(metadata: Any) -> OwnerMarks:
    """Whose an object is, as its metadata says: the full id of the annotation (None
    for an object made without one) and the ``falcon-task`` label, for
    ``naming.owned_by``."""
    if isinstance(metadata, Mapping):
        annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
    else:
        annotations, labels = metadata.annotations or {}, metadata.labels or {}
    return OwnerMarks(task_id=annotations.get(TASK_ID_ANNOTATION),
                      label=labels.get(TASK_LABEL))


def owner_words(marks: OwnerMarks) -> str:
    """Whose an object is, in a Message: ``task <id>`` or ``no Falcon task``."""
    known = marks.task_id or marks.label
    return f"task {known}" if known else "no Falcon task"


class KubeObject(Protocol):
    """An object the Kubernetes API returns (a Job, Pod, Service ...)."""

    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def metadata_of(obj: KubeObject, what: str) -> client.V1ObjectMeta:
    """The object's metadata, which the API server always sets: an answer without it
    is malformed (a PortError naming ``what`` the object is)."""
    if obj.metadata is None:
        raise PortError(FAILED, f"the Kubernetes API returned {what} without metadata")
    return obj.metadata


def name_of(obj: KubeObject, what: str) -> str:
    """The object's metadata.name, likewise always set by the API server."""
    name = metadata_of(obj, what).name
    if name is None:
        raise PortError(FAILED, f"the Kubernetes API returned {what} without metadata.name")
    return name


def job_ref(job: client.V1Job) -> JobRef:
    """The port's handle on a Job: its name, its uid (which tells a recreated Job of
    the same name apart) and the task it runs."""
    name = name_of(job, "a Job")
    meta = metadata_of(job, f"Job {name}")
    if meta.uid is None:
        raise PortError(FAILED, f"the Kubernetes API returned Job {name} without metadata.uid")
    return workload_ref(name, meta.uid, meta)


def workload_ref(name: str, uid: str, metadata: Any) -> JobRef:
    """The port's handle on a Job or JobSet, with the marks its ownership is decided on."""
    marks = owner_of(metadata)
    return JobRef(name=name, uid=uid, task_id=marks.task_id, task_label=marks.label)


def node_ready(node: client.V1Node) -> bool:
    """The node's Ready condition is True: only such a node takes pods, so a pool's
    registered nodes that are not Ready cannot run a Job yet."""
    conditions = (node.status.conditions if node.status else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
