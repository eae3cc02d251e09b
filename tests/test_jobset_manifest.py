"""The JobSet of a multi-slice task: shape, placement, logs, security, names.

A JobSet is a custom resource, which ``kubernetes_validate`` does not know; its child
Job template is a ``batch/v1`` JobSpec, validated as a Job of the same spec. The
JobSet's own fields are the ones upstream's API names (jobset_types.go, v1alpha2).
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falcon_es.domain import naming
from falcon_es.domain.manifests import JobPlacement, child_job_name, render_jobset
from falcon_es.domain.spec import SpecLimits, parse_spec
from falcon_es.domain.tpu import TPU_TYPES, slice_shape

PLACEMENT = JobPlacement(namespace="falcon-jobs", service_account="falcon-task",
                         bucket="logs-bucket", ttl_seconds_after_finished=3600)


def jobset_for(task_id: str = "task-1", **fields: Any) -> dict[str, Any]:
    spec = parse_spec({"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                       "topology": "4x4", "slices": 2, **fields}, SpecLimits(max_slices=8))
    return render_jobset(task_id=task_id, spec=spec.to_data(),
                         shape=slice_shape(spec.tpu_type, spec.topology),
                         pool_names=naming.pool_group(naming.pool_name(task_id, spec.topology),
                                                      spec.slices),
                         placement=PLACEMENT)


def child(jobset: dict[str, Any]) -> dict[str, Any]:
    (replicated,) = jobset["spec"]["replicatedJobs"]
    return replicated["template"]


def pod(jobset: dict[str, Any]) -> dict[str, Any]:
    return child(jobset)["spec"]["template"]["spec"]


#: The workload's own exit code (its child failed by the FailJob rule) fails the JobSet.
RULES = [{"name": "workload-exit-code", "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"]}]


def test_one_replicated_job_with_a_replica_per_slice_and_a_pod_per_vm() -> None:
    jobset = jobset_for(slices=3, max_restarts=2)
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"]["name"] == "falcon-task-1"
    assert jobset["metadata"]["labels"] == {"managed-by": "falcon", "falcon-task": "task-1"}
    assert jobset["metadata"]["annotations"][
        "alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert (replicated["name"], replicated["replicas"]) == ("slice", 3)
    job_spec = child(jobset)["spec"]
    assert (job_spec["completions"], job_spec["parallelism"]) == (4, 4)  # v6e 4x4: 4 VMs
    assert (job_spec["completionMode"], job_spec["backoffLimit"]) == ("Indexed", 0)
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 2, "rules": RULES}
    assert job_spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 3600
    assert child_job_name("falcon-task-1", 2) == "falcon-task-1-slice-2"


def test_restarts_default_to_none() -> None:
    assert jobset_for()["spec"]["failurePolicy"] == {"maxRestarts": 0, "rules": RULES}


def test_pods_land_only_on_the_tasks_own_pools_of_the_right_accelerator() -> None:
    spec = pod(jobset_for(slices=2))
    assert spec["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                    "cloud.google.com/gke-tpu-topology": "4x4"}
    terms = spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{
        "key": "cloud.google.com/gke-nodepool", "operator": "In",
        "values": ["falcon-task-1-4x4", "falcon-task-1-4x4-s1"]}]}]
    container = spec["containers"][0]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
    assert container["resources"]["requests"] == {"google.com/tpu": "4"}


def test_logs_per_pod_through_gcs_fuse_as_for_jobs() -> None:
    template = child(jobset_for(command=["python", "train.py"]))["spec"]["template"]
    assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    volume, shm = template["spec"]["volumes"]
    assert shm["emptyDir"] == {"medium": "Memory"}
    assert volume["csi"]["volumeAttributes"]["bucketName"] == "logs-bucket"
    command = template["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"] and command[-2:] == ["python", "train.py"]


def test_no_host_network_and_nothing_from_the_spec_reaches_security() -> None:
    spec = pod(jobset_for(command=["run"], env={"FALCON_POD_NAME": "spoof"}))
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert "dnsPolicy" not in spec  # ClusterFirst: the pod network's DNS
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["securityContext"]["privileged"] is False
    assert "subdomain" not in spec  # the JobSet controller sets it, with its Service
    for forbidden in ({"hostNetwork": True}, {"dnsPolicy": "ClusterFirstWithHostNet"},
                      {"namespace": "kube-system"}):
        with pytest.raises(ValueError):
            jobset_for(**forbidden)


@pytest.mark.parametrize("fields", [
    {}, {"command": ["python", "-c", "print(1)"], "env": {"X": "y"}, "slices": 4},
    {"tpu_type": "v5p", "topology": "2x2x4", "max_restarts": 3},
])
def test_the_child_job_template_is_valid_for_the_kubernetes_api(fields: dict[str, Any]) -> None:
    jobset = jobset_for(**fields)
    as_job = {"apiVersion": "batch/v1", "kind": "Job",
              "metadata": {"name": child_job_name(jobset["metadata"]["name"], 0),
                           "namespace": "falcon-jobs", **child(jobset)["metadata"]},
              "spec": child(jobset)["spec"]}
    kubernetes_validate.validate(as_job, "1.33", strict=True)


_POOL = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_TOPOLOGIES = sorted({t for kind in TPU_TYPES.values() for t in kind.topologies}, key=len)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(task_id=st.text(min_size=1, max_size=64), topology=st.sampled_from(_TOPOLOGIES),
       slices=st.integers(1, 16))
def test_slice_pool_names_are_distinct_valid_and_keep_the_first(task_id: str, topology: str,
                                                                slices: int) -> None:
    names = naming.pool_group(naming.pool_name(task_id, topology), slices)
    assert len(set(names)) == slices and all(_POOL.match(n) for n in names)
    assert names[0] == naming.pool_name(task_id, topology)
    assert {naming.group_first(n) for n in names} == {names[0]}
    # Child Job pod host names <jobset>-slice-<i>-<pod> stay DNS labels (63 characters).
    assert len(f"{naming.job_name(task_id)}-slice-{slices - 1}-99") <= 63
