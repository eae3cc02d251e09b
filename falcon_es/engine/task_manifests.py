"""What the effect executor sends for one task: its pools' labels and its Job (or, for
a multi-slice task, JobSet) manifest.

``manifests`` renders Kubernetes objects from plain values and knows nothing of tasks
or settings; this module reads those values off the task's folded state, its cluster
and the settings, so the executor only says which manifest to send where.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from falcon_es.domain import manifests, naming
from falcon_es.domain.ports import JOB_KIND, JOBSET_KIND
from falcon_es.domain.clusters import Cluster
from falcon_es.config.settings import Settings
from falcon_es.domain.task import TaskState

#: Labels on every pool Falcon-ES creates (the orphan sweep lists pools by them).
POOL_MANAGED_BY = manifests.MANAGED_BY
POOL_TASK_LABEL = manifests.TASK_LABEL
#: The whole SHA-256 of the task id: a pool has labels only, and ownership is decided
#: on the full id (``naming.owned_by``), never on the maybe shortened ``falcon-task``.
POOL_OWNER_LABEL = "falcon-task-sha256"
POOL_TOPOLOGY_LABEL = "falcon-topology"
POOL_SUPPLY_LABEL = "falcon-supply-mode"


def pool_labels(task_id: str, topology: str, supply_mode: str) -> dict[str, str]:
    return {
        POOL_MANAGED_BY: manifests.MANAGED_BY_VALUE,
        POOL_TASK_LABEL: naming.task_label(task_id),
        POOL_OWNER_LABEL: naming.owner_digest(task_id),
        POOL_TOPOLOGY_LABEL: topology,
        POOL_SUPPLY_LABEL: supply_mode,
    }


def pool_owner(labels: Mapping[str, str]) -> naming.OwnerMarks:
    """Whose a pool is, as its labels say (``naming.owned_by`` decides)."""
    return naming.OwnerMarks(digest=labels.get(POOL_OWNER_LABEL),
                             label=labels.get(POOL_TASK_LABEL))


def job_placement(settings: Settings, cluster: Cluster) -> manifests.JobPlacement:
    return manifests.JobPlacement(
        namespace=settings.lifecycle.job_namespace,
        service_account=settings.lifecycle.job_service_account,
        bucket=cluster.gcs_bucket,
        ttl_seconds_after_finished=settings.lifecycle.job_ttl_seconds_after_finished,
    )


def workload_kind(state: TaskState) -> str:
    """What runs the task: a JobSet for a multi-slice task, else a Job."""
    return JOBSET_KIND if state.slices > 1 else JOB_KIND


def render_task_job(state: TaskState, cluster: Cluster, settings: Settings) -> dict[str, Any]:
    """The Job manifest for a task on its pool, or the JobSet of a multi-slice task on
    its pools (the submit intent's payload)."""
    if state.slices > 1:
        return manifests.render_jobset(
            task_id=state.task_id,
            spec=state.submission.spec.to_data(),
            shape=state.shape,
            pool_names=state.node_pools,
            placement=job_placement(settings, cluster),
        )
    return manifests.render_job(
        task_id=state.task_id,
        spec=state.submission.spec.to_data(),
        shape=state.shape,
        pool_name=state.pool.name or "",
        placement=job_placement(settings, cluster),
    )
