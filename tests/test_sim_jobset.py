"""The simulated JobSet controller and pod webhooks (kubernetes-sigs/jobset): child
Jobs and their names, the headless Service, exclusive placement per node pool, the
leader-before-followers order and the validation order that masks a Pending leader
behind the followers' refusal (in the words Falcon's pods get), restarts, failure-policy
rules, node repairs and the final conditions."""

from __future__ import annotations

import json
from typing import Any

from falcon_es.domain import naming
from falcon_es.adapters.sim import SIM_ANNOTATION
from falcon_es.domain.manifests import JobPlacement, render_jobset
from falcon_es.domain.ports import JOBSET_KIND, JobObservation
from falcon_es.domain.spec import SpecLimits, parse_spec
from falcon_es.domain.tpu import slice_shape
from tests.test_sim_world import Sim, sim_seconds

PLACEMENT = JobPlacement(namespace="falcon-jobs", service_account="falcon-task",
                         bucket="bucket", ttl_seconds_after_finished=None)


def jobset(task_id: str = "t1", slices: int = 2, **fields: Any) -> dict[str, Any]:
    spec = parse_spec({"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                       "topology": "4x4", "slices": slices, **fields}, SpecLimits(max_slices=4))
    manifest = render_jobset(task_id=task_id, spec=spec.to_data(), shape=slice_shape("v6e", "4x4"),
                         pool_names=naming.pool_group(naming.pool_name(task_id, "4x4"), slices),
                         placement=PLACEMENT)
    if "sim" in fields:
        manifest["metadata"]["annotations"][SIM_ANNOTATION] = json.dumps(fields["sim"])
    return manifest


def ready_pools(sim: Sim, task_id: str = "t1", slices: int = 2) -> tuple[str, ...]:
    pools = naming.pool_group(naming.pool_name(task_id, "4x4"), slices)
    for pool in pools:
        sim.create(sim.east, pool, "4x4", "reservation", "res-a")
    sim.at(sim_seconds(sim) + 75)
    return pools


def test_a_jobset_runs_a_child_job_per_slice_each_on_a_pool_of_its_own() -> None:
    sim = Sim()
    pools = ready_pools(sim)
    ref = sim.edge(sim.east).submit_job(jobset(sim={"duration_seconds": 50}))
    kube = sim.world.cluster(sim.east).kube
    assert sorted(kube.jobs) == ["falcon-t1-slice-0", "falcon-t1-slice-1"]
    service = kube.services["falcon-t1"]
    assert service.headless and ref.uid in service.owner_uids
    assert service.selector == {"jobset.sigs.k8s.io/jobset-name": "falcon-t1"}
    seen = sim.run()
    assert {o.kind for o in seen} == {JOBSET_KIND} and {o.job_uid for o in seen} == {ref.uid}
    running = next(o for o in seen if o.active == 8)
    assert running.completions == 8 and len(running.pods) == 8
    last = seen[-1]
    assert (last.condition, last.condition_reason, last.succeeded) == ("Complete",
                                                                       "AllJobsCompleted", 8)
    used = {kube.jobs[name].pool for name in ("falcon-t1-slice-0", "falcon-t1-slice-1")}
    assert used == set(pools)  # exclusive: one slice per pool


def test_a_pending_leader_masks_itself_behind_the_followers_refusal() -> None:
    """The seed's chain: the leader waits for TPUs, the mutating webhook leaves the
    followers without a node selector, the validating webhook refuses them."""
    sim = Sim()
    ready_pools(sim)
    sim.edge(sim.east).submit_job(jobset(sim={"outcome": "unschedulable"}))
    sim.at(sim_seconds(sim) + 1)
    (observation,) = [o for o in sim.drain() if o.pods][-1:]
    assert [p.name.rsplit("-", 1)[0] for p in observation.pods] == [
        "falcon-t1-slice-0-0", "falcon-t1-slice-1-0"]  # only the leaders exist
    refusal = observation.refusal
    assert refusal is not None and refusal.transient
    # Falcon's followers carry the accelerator and topology selectors: the webhook's
    # second check refuses them (jobset pod_webhook.go)
    assert refusal.message == ('child Job falcon-t1-slice-0: Error creating: admission webhook '
                               '"vpod.kb.io" denied the request: follower pod node selector '
                               'for topology domain not found. missing selector: '
                               'cloud.google.com/gke-nodepool')
    diagnosis = sim.edge(sim.east).diagnose_pending("falcon-t1")
    assert diagnosis is not None and diagnosis.startswith("leader pod falcon-t1-slice-0-0-")
    assert "Insufficient google.com/tpu" in diagnosis


def test_followers_are_created_once_their_leader_is_scheduled() -> None:
    sim = Sim()
    ready_pools(sim)
    sim.edge(sim.east).submit_job(jobset(sim={"duration_seconds": 500}))
    sim.at(sim_seconds(sim) + 30)
    latest = sim.drain()[-1]
    assert latest.refusal is None and len(latest.pods) == 8 and latest.active == 8


def test_a_retryable_exit_code_restarts_the_jobset_until_max_restarts() -> None:
    sim = Sim()
    ready_pools(sim)
    ref = sim.edge(sim.east).submit_job(jobset(
        max_restarts=1, retry_exit_codes=[42],
        sim={"outcome": "fail", "exit_code": 42, "duration_seconds": 20}))
    seen: list[JobObservation] = sim.run()
    assert max(o.restarts for o in seen) == 1
    last = seen[-1]
    assert (last.condition, last.condition_reason, last.job_uid) == (
        "Failed", "ReachedMaxRestarts", ref.uid)
    assert any(p.exit_code == 42 for p in last.pods)


def test_the_workloads_own_exit_code_fails_the_jobset_without_a_restart() -> None:
    """An OOM kill (137) is not in retry_exit_codes: the child's FailJob rule fails it
    with reason PodFailurePolicy, and the JobSet's FailJobSet rule fails the JobSet
    instead of restarting it until max_restarts is spent (xpk's behaviour)."""
    sim = Sim()
    ready_pools(sim)
    sim.edge(sim.east).submit_job(jobset(max_restarts=3,
                                         sim={"outcome": "oom", "duration_seconds": 20}))
    seen: list[JobObservation] = sim.run()
    assert max(o.restarts for o in seen) == 0
    last = seen[-1]
    assert (last.condition, last.condition_reason) == ("Failed", "FailJobSetFailurePolicyAction")
    assert any(p.reason == "OOMKilled" and p.exit_code == 137 for p in last.pods)


def test_a_node_repair_recreates_a_slices_pods_and_the_jobset_completes() -> None:
    sim = Sim()
    ready_pools(sim)
    sim.edge(sim.east).submit_job(jobset(sim={"outcome": "node-repair", "duration_seconds": 200}))
    seen: list[JobObservation] = sim.run()
    last = seen[-1]
    assert (last.condition, last.restarts) == ("Complete", 0)
    disrupted = [p for p in last.pods if p.disruption]
    assert len(disrupted) == 8  # both slices repaired once, every VM's pod evicted
    assert {p.disruption for p in disrupted} == {"EvictionByEvictionAPI: Eviction API: evicting"}
    assert all(p.node and p.exit_code == 143 for p in disrupted)
    assert last.succeeded == 8


def test_deleting_the_jobset_takes_its_children_and_service() -> None:
    sim = Sim()
    ready_pools(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(jobset(sim={"duration_seconds": 500}))
    sim.at(sim_seconds(sim) + 30)
    edge.delete_job("falcon-t1", kind=JOBSET_KIND)
    kube = sim.world.cluster(sim.east).kube
    assert kube.jobs == {} and kube.services == {}
    assert edge.get_job("falcon-t1", kind=JOBSET_KIND) is None
    edge.delete_job("falcon-t1", kind=JOBSET_KIND)  # not found is done
