"""The Job manifest and the deterministic names (reference §2.4 TPU pod spec, §4 GCS FUSE)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falcon_es.domain import manifests, naming
from falcon_es.domain.manifests import JobPlacement, render_headless_service, render_job
from falcon_es.domain.spec import parse_spec
from falcon_es.domain.tpu import TPU_TYPES, slice_shape

PLACEMENT = JobPlacement(namespace="falcon-jobs", service_account="falcon-task",
                         bucket="logs-bucket", ttl_seconds_after_finished=3600)


def job_for(task_id: str = "task-1", **spec_fields: Any) -> dict[str, Any]:
    spec = parse_spec({"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                       "topology": "2x2", **spec_fields})
    shape = slice_shape(spec.tpu_type, spec.topology)
    return render_job(task_id=task_id, spec=spec.to_data(), shape=shape,
                      pool_name=naming.pool_name(task_id, spec.topology), placement=PLACEMENT)


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def test_single_host_job_selects_the_pool_and_requests_chips_as_strings() -> None:
    job = job_for(command=["python", "train.py"], args=["--steps", "10"], env={"A": "1"})
    spec = pod(job)
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert job["metadata"]["name"] == "falcon-task-1"
    assert job["metadata"]["namespace"] == "falcon-jobs"
    assert job["metadata"]["labels"] == {"managed-by": "falcon", "falcon-task": "task-1"}
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x2",
        "cloud.google.com/gke-nodepool": "falcon-task-1-2x2",
    }
    container = spec["containers"][0]
    assert container["resources"] == {"requests": {"google.com/tpu": "4"},
                                      "limits": {"google.com/tpu": "4"}}
    assert spec["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    assert job["spec"]["backoffLimit"] == 0
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1, 1)
    assert "completionMode" not in job["spec"]
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600


def test_disruptions_are_ignored_and_the_workloads_own_exit_codes_fail_the_job() -> None:
    """Ignore on DisruptionTarget first (a drained pod exits 143 and must not meet the
    exit-code rule), then FailJob on every exit code not worth a retry."""
    job = job_for()
    assert pod(job)["restartPolicy"] == "Never"  # required by a pod failure policy
    assert job["spec"]["podFailurePolicy"] == {"rules": [
        {"action": "Ignore",
         "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": "task", "operator": "NotIn", "values": [0]}},
    ]}
    assert job["spec"]["backoffLimit"] == 0


def test_retry_exit_codes_are_counted_against_max_restarts() -> None:
    job = job_for(retry_exit_codes=[42, 3, 42], max_restarts=2)
    fail_job = job["spec"]["podFailurePolicy"]["rules"][1]
    assert fail_job["onExitCodes"]["values"] == [0, 3, 42]
    assert job["spec"]["backoffLimit"] == 2


@pytest.mark.parametrize("tpu_type,topology,hosts,chips", [
    ("v6e", "4x4", 4, "4"), ("v5p", "4x4x4", 16, "4"), ("v7x", "2x2x2", 2, "4"),
    ("v5e", "2x4", 1, "8"), ("v7x", "1x1x1", 1, "1"),
])
def test_one_pod_per_vm_and_indexed_for_multi_host(tpu_type: str, topology: str, hosts: int,
                                                   chips: str) -> None:
    job = job_for(tpu_type=tpu_type, topology=topology)
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (hosts, hosts)
    assert (job["spec"].get("completionMode") == "Indexed") == (hosts > 1)
    assert pod(job)["containers"][0]["resources"]["limits"]["google.com/tpu"] == chips
    assert pod(job)["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == \
        TPU_TYPES[tpu_type].accelerator


def test_logs_go_to_the_bucket_through_a_gcsfuse_volume() -> None:
    job = job_for(command=["python", "train.py"])
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    volume, shm = pod(job)["volumes"]
    assert shm == {"name": "dshm", "emptyDir": {"medium": "Memory"}}  # xpk's /dev/shm
    assert volume["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
    assert volume["csi"]["volumeAttributes"]["bucketName"] == "logs-bucket"
    container = pod(job)["containers"][0]
    assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": "/falcon-logs"},
                                         {"name": "dshm", "mountPath": "/dev/shm"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["FALCON_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["FALCON_LOG_DIR"]["value"] == "/falcon-logs/logs/task-1"
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert container["command"][4:] == ["python", "train.py"]
    assert manifests.log_path("logs-bucket", "task-1", "falcon-task-1-0-abcde") == \
        "gs://logs-bucket/logs/task-1/falcon-task-1-0-abcde.log"


def test_the_wrapper_runs_the_command_with_its_exit_code_and_output_in_the_log(tmp_path) -> None:
    job = job_for(command=["sh", "-c", 'echo "out $1"; echo err >&2; exit 3', "x"],
                  args=["it's quoted"])
    command = pod(job)["containers"][0]["command"]
    log_dir = tmp_path / "logs" / "task-1"
    result = subprocess.run(
        command, env={"FALCON_LOG_DIR": str(log_dir), "FALCON_POD_NAME": "pod-0",
                      "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 3
    assert (log_dir / "pod-0.log").read_text() == "out it's quoted\nerr\n"
    assert command[-1] == "it's quoted"  # passed as data, never through a shell string


def test_nothing_from_the_spec_reaches_security_fields() -> None:
    job = job_for(command=["run"], env={"FALCON_POD_NAME": "spoof", "HOME": "/root"})
    spec = pod(job)
    container = spec["containers"][0]
    assert spec["serviceAccountName"] == "falcon-task"
    assert spec["automountServiceAccountToken"] is False
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert container["securityContext"] == {"privileged": False,
                                            "allowPrivilegeEscalation": False}
    assert all("hostPath" not in v for v in spec["volumes"])
    names = [e["name"] for e in container["env"]]
    assert names.count("FALCON_POD_NAME") == 1
    assert {"name": "HOME", "value": "/root"} in container["env"]
    assert set(container) == {"name", "image", "env", "resources", "securityContext",
                              "volumeMounts", "command"}


def test_a_spec_without_command_keeps_the_image_entrypoint() -> None:
    container = pod(job_for(args=["--flag"]))["containers"][0]
    assert "command" not in container and container["args"] == ["--flag"]


@pytest.mark.parametrize("kwargs", [
    {}, {"command": ["python", "-c", "print(1)"], "env": {"X": "y"}},
    {"tpu_type": "v5p", "topology": "2x2x4"},
])
def test_manifest_is_valid_for_the_kubernetes_api(kwargs: dict[str, Any]) -> None:
    kubernetes_validate.validate(job_for(**kwargs), "1.33", strict=True)


# ------------------------------------------------- multi-host: the headless Service

JOB_UID = "0b6c1d9e-3f4a-4e2b-9c8d-7a6b5c4d3e2f"


@pytest.mark.parametrize("tpu_type,topology,hosts", [("v5p", "2x2x2", 2), ("v6e", "4x4", 4)])
def test_a_multi_host_job_names_its_headless_service_as_the_pods_subdomain(
        tpu_type: str, topology: str, hosts: int) -> None:
    job = job_for(tpu_type=tpu_type, topology=topology)
    name = job["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (hosts, hosts)
    assert pod(job)["subdomain"] == name == "falcon-task-1"

    service = render_headless_service(job, JOB_UID)

    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": "falcon-jobs",
            "labels": {"managed-by": "falcon", "falcon-task": "task-1"},
            "annotations": {"falcon/task-id": "task-1"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                 "uid": JOB_UID, "controller": False,
                                 "blockOwnerDeletion": False}],
        },
        "spec": {"clusterIP": "None", "selector": {"job-name": name},
                 "publishNotReadyAddresses": True},
    }


@pytest.mark.parametrize("tpu_type,topology", [("v6e", "2x2"), ("v5e", "2x4"), ("v5p", "2x2x1"),
                                               ("v7x", "1x1x1")])
def test_a_single_host_job_has_no_subdomain_and_no_service(tpu_type: str, topology: str) -> None:
    job = job_for(tpu_type=tpu_type, topology=topology)
    assert "subdomain" not in pod(job)
    assert render_headless_service(job, JOB_UID) is None


def test_the_headless_service_without_ports_is_valid_for_the_kubernetes_api() -> None:
    job = job_for(tpu_type="v6e", topology="4x4")
    kubernetes_validate.validate(job, "1.33", strict=True)
    kubernetes_validate.validate(render_headless_service(job, JOB_UID), "1.33", strict=True)


@pytest.mark.parametrize("tampering", [
    {"env": {"subdomain": "other", "namespace": "kube-system", "job-name": "other"}},
    {"command": ["sh", "-c", "hostname"], "args": ["--subdomain=other"]},
    {"subdomain": "other", "namespace": "kube-system", "name": "other", "hostname": "other",
     "labels": {"job-name": "other"}, "selector": {"app": "other"}, "clusterIP": "10.0.0.1",
     "ports": [{"port": 80}], "ownerReferences": []},
])
def test_nothing_from_the_task_spec_changes_the_service(tampering: dict[str, Any]) -> None:
    shape = slice_shape("v5p", "2x2x2")

    def rendered(spec: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        job = render_job(task_id="task-1", spec={"image": "us-docker.pkg.dev/p/r/train:1", **spec},
                         shape=shape, pool_name="falcon-task-1-2x2x2", placement=PLACEMENT)
        return pod(job)["subdomain"], render_headless_service(job, JOB_UID)

    assert rendered(tampering) == rendered({})
    subdomain, service = rendered(tampering)
    assert service is not None
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == (subdomain,
                                                                              "falcon-jobs")
    assert service["spec"]["selector"] == {"job-name": "falcon-task-1"}


# ----------------------------------------------------------------------- names

def test_names_are_deterministic_and_keep_the_short_id_readable() -> None:
    assert naming.pool_name("job-42", "2x2x1") == "falcon-job-42-2x2x1"
    assert naming.job_name("job-42") == "falcon-job-42"
    long_id = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    assert naming.pool_name(long_id, "4x4") == naming.pool_name(long_id, "4x4")
    assert naming.pool_name(long_id, "4x4").startswith("falcon-0f1e2d-")
    assert naming.short_task_id("job-2024-000001") != naming.short_task_id("job-2024-000002")


_POOL = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_TOPOLOGIES = sorted({t for kind in TPU_TYPES.values() for t in kind.topologies}, key=len)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(task_id=st.text(min_size=1, max_size=64), topology=st.sampled_from(_TOPOLOGIES))
def test_any_task_id_gives_names_the_apis_accept(task_id: str, topology: str) -> None:
    assert _POOL.match(naming.pool_name(task_id, topology))
    assert _LABEL.match(naming.job_name(task_id))
    assert _VALUE.match(naming.task_label(task_id))
    segment = naming.log_dir(task_id)
    assert "/" not in segment and segment not in (".", "..")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=2, unique=True))
def test_distinct_ids_get_distinct_names(ids: list[str]) -> None:
    first, second = ids
    assert naming.pool_name(first, "2x2") != naming.pool_name(second, "2x2")
    assert naming.job_name(first) != naming.job_name(second)
