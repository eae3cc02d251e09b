"""The simulated Kubernetes API of one edge cluster: Jobs, their Pods, and the nodes
the cluster's TPU node pools bring.

A Job's pods are scheduled like kube-scheduler would: onto a ready node that matches
the pod's nodeSelector, tolerates the ``google.com/tpu`` taint, and has the TPU chips
the pod asks for -- otherwise they stay Pending with a FailedScheduling-style message
("0/7 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, 4
Insufficient google.com/tpu. ..."). A bound pod starts after a short delay and then
plays the behaviour of the task's ``spec.sim``: succeed, fail with an exit code, be
OOMKilled (137), never pull its image, or never be schedulable. A Job whose outcome
is ``create-denied`` gets no pods at all: an admission webhook refuses each of the
Job controller's creates, which records a ``FailedCreate`` event on the Job in the
webhook's words (aggregated: one event, its count growing) and tries again with its
exponential backoff (1 s doubling to 60 s), as long as the Job exists.

Failed pods count against ``spec.backoffLimit`` (Kubernetes' default 6 when unset);
past it the Job gets the Failed condition and its remaining pods are deleted. Every
change to a Job or its pods becomes one ``JobObservation`` per Job and moment,
published through the informer with a cluster-wide increasing resourceVersion.
Deleting a Job removes it and its pods at once and publishes nothing more for it.

Services: a multi-host Job's headless Service is created in the same ``submit_job`` of
the port (``kube.SimEdgeCluster``) and recorded with the uid of the Job that owns it;
deleting the Job, by hand or by its TTL, deletes the Services it owns, as the garbage
collector does. A Service draws nothing from the random stream, so a run's Jobs and
pods are the same whether or not its Jobs have Services.

Submitted manifests are read and checked by ``kube_manifests``; the objects this API
holds are those of ``kube_objects``. JobSets, their child Jobs and the pod webhooks that
order a child's leader before its followers are ``kube_jobset``'s.
"""

from __future__ import annotations

import collections
import datetime as dt
import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain.ports import (
    ALREADY_EXISTS, JOB_KIND, JOBSET_KIND, RETRYABLE, CreateRefusal, JobObservation, JobRef,
    NodeCounts, PodObservation, PortError,
)

from falcon_es.adapters.sim.common import ClusterIdentity, seconds_after, suffix
from falcon_es.adapters.sim.gke import (
    ERROR, FAILED_SCALE_UP, PROVISIONING, RUNNING, STOPPING, TRIGGERED_SCALE_UP,
    NodePoolService, SimNode, SimPool,
)
from falcon_es.adapters.sim.informer import Informer
from falcon_es.adapters.sim.kube_jobset import JOBS_REFUSED, SimJobSets, quota_refusal
from falcon_es.adapters.sim.kube_manifests import BehaviourSource, parse_job, parse_service
from falcon_es.adapters.sim.pod_logs import SimPodLogs
from falcon_es.adapters.sim.kube_objects import (
    FAIL_JOB, FAILED, IGNORE, PENDING, RUNNING_PHASE, SUCCEEDED, SimJob, SimPod, SimService,
)
from falcon_es.adapters.sim.timeline import Method, Timeline

COMPLETE_CONDITION, FAILED_CONDITION = "Complete", "Failed"

_SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
_NOT_READY = "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
_TPU_TAINT = "node(s) had untolerated taint {google.com/tpu: present}"
_NO_TPU = "Insufficient google.com/tpu"
_NO_MEMORY = "Insufficient memory"
_BACKOFF_START, _BACKOFF_CAP = 10.0, 360.0
#: The Job controller's requeue after a failed sync (a pod create refused):
#: DefaultJobApiBackOff and MaxJobApiBackOff of pkg/controller/job.
_SYNC_BACKOFF_START, _SYNC_BACKOFF_CAP = 1.0, 60.0
CREATE_DENIED = "create-denied"
NODE_REPAIR = "node-repair"
#: The DisruptionTarget conditions the sim gives (Kubernetes "Pod disruption
#: conditions"): a drain through the Eviction API (GKE's node repair and upgrade), and
#: the pod garbage collector's for a pod whose node is gone.
EVICTED = ("EvictionByEvictionAPI", "Eviction API: evicting")
POD_GC = "DeletionByPodGC"
#: Exit code of a container stopped by SIGTERM (a drained pod's).
SIGTERM_EXIT = 143
DENYING_WEBHOOK = "tpu-policy.falcon-es.example.com"
#: What the API server answers a pod create the webhook denies (the Job controller
#: prefixes "Error creating: "), in the apiserver's "admission webhook %q denied the
#: request: %s" form.
DENIAL = (f'admission webhook "{DENYING_WEBHOOK}" denied the request: pods requesting '
          "google.com/tpu in this namespace must carry an approved cost-center label")
_SYSTEM_NODE_LABELS = MappingProxyType({
    "cloud.google.com/gke-nodepool": "default-pool",
    "node.kubernetes.io/instance-type": "e2-standard-8",
})


#: What one observation of a Job says: running, succeeded, failed, its condition, its
#: pods, the Job controller's refusal.
JobState = tuple[int, int, int, str | None, tuple[PodObservation, ...], CreateRefusal | None]


class KubeService:
    """One edge cluster's Kubernetes API, reading nodes from the cluster's node pools."""

    def __init__(self, identity: ClusterIdentity, pools: NodePoolService, timeline: Timeline,
                 rng: random.Random, informer: Informer,
                 behaviour_source: Callable[[], BehaviourSource | None]) -> None:
        self.identity = identity
        self.defaults = identity.jobs
        self._pools = pools
        self._timeline = timeline
        self._rng = rng
        self._informer = informer
        self._behaviour_source = behaviour_source
        self.jobs: dict[str, SimJob] = {}
        self.services: dict[str, SimService] = {}
        self._unbound: dict[str | None, dict[str, None]] = {}
        self._dirty: dict[str, SimJob] = {}
        self.resource_version = 0
        self.jobsets = SimJobSets(self, rng)
        #: What this cluster's pods wrote to their log files (``pod_logs``).
        self.pod_logs = SimPodLogs()
        self._submit_index = 0
        self._system_nodes = [
            SimNode(f"gke-{identity.name[:12]}-default-pool-{suffix(rng, 8)}-{suffix(rng, 4)}",
                    ready=True, shared=True)
            for _ in range(identity.behaviour.system_nodes)
        ]

    # ----------------------------------------------------------------- API

    def submit(self, manifest: Mapping[str, Any], now: dt.datetime) -> JobRef:
        self._check_throttled()
        if isinstance(manifest, Mapping) and manifest.get("kind") == JOBSET_KIND:
            return self.jobsets.submit(manifest, now)
        job = parse_job(manifest, now, self.defaults, self._rng, self._behaviour_source)
        if job.name in self.jobs:
            raise PortError(ALREADY_EXISTS, f'jobs.batch "{job.name}" already exists')
        if job.behaviour.outcome == JOBS_REFUSED:
            raise quota_refusal(job.name)
        self.jobs[job.name] = job
        if job.behaviour.outcome == CREATE_DENIED:
            self._refuse_pods(job, now)
            return job.ref()
        for index in range(min(job.parallelism, job.completions)):
            self.new_pod(job, index)
        self._dirty[job.name] = job
        self._schedule_job(job, now)
        return job.ref()

    def _check_throttled(self) -> None:
        """The API server's priority and fairness refusing a request
        (``submit_throttled``)."""
        rule = self.identity.behaviour.submit_throttled
        if rule.inert:
            return
        hit = rule.hits(self._submit_index, self._rng)
        self._submit_index += 1
        if hit:
            raise PortError(RETRYABLE, "429 Too Many Requests: the server has received too "
                                       "many requests and has asked us to try again later")

    def submit_child(self, manifest: Mapping[str, Any], now: dt.datetime, jobset: str,
                     allowed_pools: tuple[str, ...], *, exclusive: bool) -> None:
        """A JobSet's child Job. With exclusive placement only its leader (index 0) is
        created at first: the pod webhook refuses the followers until it is scheduled."""
        job = parse_job(manifest, now, self.defaults, self._rng, self._behaviour_source)
        if job.name in self.jobs:
            raise PortError(ALREADY_EXISTS, f'jobs.batch "{job.name}" already exists')
        if job.behaviour.outcome == JOBS_REFUSED:
            raise quota_refusal(job.name)
        job.jobset, job.allowed_pools = jobset, allowed_pools
        self.jobs[job.name] = job
        if exclusive and min(job.parallelism, job.completions) > 1:
            job.followers_held = True
            self.new_pod(job, 0)
            self.jobsets.refuse_followers(job, now)
        else:
            for index in range(min(job.parallelism, job.completions)):
                self.new_pod(job, index)
        self._dirty[job.name] = job
        self._schedule_job(job, now)

    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None:
        if kind == JOBSET_KIND:
            return self.jobsets.get(name)
        job = self.jobs.get(name)
        return None if job is None else job.ref()

    def delete_job(self, name: str, now: dt.datetime, kind: str = JOB_KIND) -> None:
        if kind == JOBSET_KIND:
            self.jobsets.delete(name, now)
            return
        job = self.jobs.pop(name, None)
        if job is None:
            return
        self.collect_services_of(job.uid)
        self._dirty.pop(name, None)
        self.forget_unbound(job)
        freed = {pod.pool for pod in job.pods if self._unbind(pod, now)}
        self._reschedule(now, freed)

    def create_service(self, manifest: Mapping[str, Any]) -> SimService:
        """Record a Service; ALREADY_EXISTS when one of that name is there."""
        service = parse_service(manifest)
        if service.name in self.services:
            raise PortError(ALREADY_EXISTS, f'services "{service.name}" already exists')
        self.services[service.name] = service
        return service

    def delete_service(self, name: str) -> None:
        self.services.pop(name, None)

    def collect_services_of(self, job_uid: str) -> None:
        """The garbage collector: Services owned by a deleted Job go with it."""
        for name in [n for n, s in self.services.items() if job_uid in s.owner_uids]:
            del self.services[name]

    def next_resource_version(self) -> int:
        self.resource_version += 1
        return self.resource_version

    def at(self, moment: dt.datetime, method: Method, *args: object) -> None:
        self._timeline.at(moment, method, *args)

    def stop(self, job: SimJob, moment: dt.datetime) -> None:
        """Delete a Job's live pods (a failed JobSet stops its other children)."""
        freed = set()
        for pod in job.live_pods():
            freed.add(pod.pool)
            self._unbind(pod, moment)
            job.pods.remove(pod)
        self.forget_unbound(job)
        job.followers_held, job.refused = False, None
        self._dirty[job.name] = job
        self._reschedule(moment, freed)

    def node_counts(self, pool_name: str) -> NodeCounts:
        pool = self._pools.pools.get(pool_name)
        if pool is None:
            return NodeCounts(0, 0)
        return NodeCounts(pool.registered, pool.ready)

    def diagnose(self, job_name: str) -> str | None:
        if job_name in self.jobsets.jobsets:
            return self.jobsets.diagnose(job_name)
        job = self.jobs.get(job_name)
        if job is None:
            return None
        if job.refused is not None:
            return job.refused.event_message
        pending = [p for p in job.pods if p.phase == PENDING]
        if not pending:
            return None
        pod = pending[0]
        upstream = self.pool_cause(job)
        if pod.reason in ("ErrImagePull", "ImagePullBackOff"):
            symptom: str | None = f"pod {pod.name}: {pod.reason}: {pod.message}"
        elif pod.node is None and pod.message:
            symptom = f"pod {pod.name} Unschedulable: {pod.message}"
        else:
            symptom = None
        causes = [c for c in (upstream, symptom) if c]
        return "; ".join(causes) if causes else None

    # ---------------------------------------------------- the world calls these

    def nodes_changed(self, pool: SimPool, moment: dt.datetime, lost: list[SimNode]) -> None:
        for node in lost:
            if node.pod is None:
                continue
            job_name, pod_name = node.pod.split("/", 1)
            job = self.jobs.get(job_name)
            pod = next((p for p in job.pods if p.name == pod_name), None) if job else None
            if job is None or pod is None:
                continue
            pod.node = None
            words = (f"node {node.name} {node.end} and was deleted" if node.end else
                     f"node {node.name} was deleted with node pool {pool.name}")
            self._pod_failed(job, pod, moment, POD_GC, None, words, (POD_GC, words))
        self._reschedule(moment, {pool.name})

    def flush(self, moment: dt.datetime) -> None:
        """Publish one observation per Job (or JobSet) that changed at this moment."""
        dirty, self._dirty = self._dirty, {}
        for job in dirty.values():
            if self.jobs.get(job.name) is not job:
                continue
            if job.jobset is not None:
                self.jobsets.child_changed(job)  # its JobSet's observation says it
                continue
            state = self._state(job)
            if state == job.last_published:
                continue
            job.last_published = state
            self.resource_version += 1
            job.resource_version = self.resource_version
            self._informer.deliver(self.observe(job, moment, state), moment)
        for observation in self.jobsets.flush(moment):
            self._informer.deliver(observation, moment)

    def observe(self, job: SimJob, moment: dt.datetime,
                state: JobState | None = None) -> JobObservation:
        running, succeeded, failed, condition, pods, refusal = state or self._state(job)
        return JobObservation(
            cluster_name=self.identity.name, job_name=job.name, job_uid=job.uid,
            task_id=job.task_id, resource_version=job.resource_version, active=running,
            succeeded=succeeded, failed=failed, completions=job.completions, pods=pods,
            observed_at=moment, condition=condition, refusal=refusal,
        )

    @staticmethod
    def _state(job: SimJob) -> JobState:
        pods = tuple(p.observation() for p in job.pods)
        running = sum(1 for p in job.pods if p.phase == RUNNING_PHASE)
        succeeded = sum(1 for p in job.pods if p.phase == SUCCEEDED)
        refusal = None if job.refused is None else job.refused.observation()
        return running, succeeded, job.failed, job.condition, pods, refusal

    # ---------------------------------------------------------- scheduling

    def _reschedule(self, moment: dt.datetime, pools: set[str | None]) -> None:
        names: dict[str, None] = {}
        for key in (*sorted(p for p in pools if p is not None), None):
            names.update(self._unbound.get(key, {}))
        for name in names:
            job = self.jobs.get(name)
            if job is not None:
                self._schedule_job(job, moment)

    def _schedule_job(self, job: SimJob, moment: dt.datetime) -> None:
        asked = False
        for pod in list(job.pods):
            if pod.phase != PENDING or pod.node is not None:
                continue
            node, why = self._fit(job)
            if node is None:
                if (pod.reason, pod.message) != ("Unschedulable", why):
                    pod.reason, pod.message = "Unschedulable", why
                    self._dirty[job.name] = job
                if not asked:
                    asked = True
                    self._ask_autoscaler(job, moment)
                continue
            if not node.shared:
                node.pod = f"{job.name}/{pod.name}"
            pod.node, pod.pool = node.name, job.pool or self._pool_of(node)
            pod.last_node = node.name
            if not node.shared:
                self._pools.node_use_changed(pod.pool or "", moment)
            pod.reason, pod.message = "ContainerCreating", None
            self._dirty[job.name] = job
            start = self.defaults.pod_start.draw(self._rng)
            self._timeline.at(seconds_after(moment, start), self._start, job, pod)
            if job.followers_held and pod.index == 0:
                self.jobsets.leader_bound(job, pod.pool)
                self._schedule_job(job, moment)
                return
        if all(p.node is not None or p.phase != PENDING for p in job.pods):
            self.forget_unbound(job)

    def _fit(self, job: SimJob) -> tuple[SimNode | None, str]:
        """A free node for one of the job's pods, or why there is none (the scheduler's
        FailedScheduling words). A pool-pinned job looks at its own pool only; every
        other TPU node counts as not matching its selector."""
        reasons: collections.Counter[str] = collections.Counter()
        if self._system_nodes:
            if any(_SYSTEM_NODE_LABELS.get(k) != v for k, v in job.selector.items()):
                reasons[_SELECTOR_MISMATCH] += len(self._system_nodes)
            elif job.tpu_per_pod > 0:
                reasons[_NO_TPU] += len(self._system_nodes)
            elif job.behaviour.outcome == "unschedulable":
                reasons[_NO_MEMORY] += len(self._system_nodes)
            else:
                return self._system_nodes[0], ""
        pools = self._pools.pools
        tpu_nodes = self._pools.registered_nodes
        total = len(self._system_nodes) + tpu_nodes
        if job.pool is not None or job.allowed_pools:
            if job.pool is not None:
                allowed = [job.pool]
            else:  # node affinity, less the pools a sibling child holds (exclusive)
                claimed = self.jobsets.claimed(job)
                allowed = [p for p in job.allowed_pools if p not in claimed]
            candidates = [pools[p] for p in allowed if p in pools and pools[p].nodes]
            elsewhere = tpu_nodes - sum(len(p.nodes) for p in candidates)
            if elsewhere:
                reasons[_SELECTOR_MISMATCH] += elsewhere
        else:
            candidates = [p for p in pools.values() if p.nodes]
        enforce_taint = self.defaults.enforce_tpu_taint
        for pool in candidates:
            labels = pool.node_labels()
            if any(labels.get(k) != v for k, v in job.selector.items()):
                reasons[_SELECTOR_MISMATCH] += len(pool.nodes)
                continue
            for node in pool.nodes:
                if not node.ready:
                    reasons[_NOT_READY] += 1
                elif enforce_taint and not job.tolerates_tpu:
                    reasons[_TPU_TAINT] += 1
                elif node.pod is not None or job.tpu_per_pod > pool.shape.chips_per_host:
                    reasons[_NO_TPU] += 1
                elif job.behaviour.outcome == "unschedulable":
                    # A JobSet's leader waits for TPUs in the seed's scenario.
                    reasons[_NO_TPU if job.jobset else _NO_MEMORY] += 1
                else:
                    return node, ""
        if total == 0:
            return None, "no nodes available to schedule pods"
        detail = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
        return None, (f"0/{total} nodes are available: {detail}. preemption: 0/{total} nodes are "
                      f"available: {total} Preemption is not helpful for scheduling.")

    def _ask_autoscaler(self, job: SimJob, moment: dt.datetime) -> None:
        """The cluster autoscaler sees the Job's pending pods: it scales up a pool they
        may use (a JobSet child's: one of its allowed pools no sibling holds or scales,
        exclusive per pool). Its event is on the pods: a changed one republishes them."""
        if job.pool is not None:
            candidates = [job.pool]
        elif job.allowed_pools:
            claimed = self.jobsets.claimed(job)
            candidates = [p for p in job.allowed_pools if p not in claimed]
        else:
            return
        misfit = ((_NO_TPU if job.jobset else _NO_MEMORY)
                  if job.behaviour.outcome == "unschedulable" else None)
        for name in candidates:
            pool = self._pools.pools.get(name)
            before = pool.autoscaler_event if pool else None
            helped = self._pools.scale_up(name, job.name, moment, misfit)
            if pool is not None and pool.autoscaler_event != before:
                self._dirty[job.name] = job
            if helped:
                return

    def _pool_of(self, node: SimNode) -> str | None:
        return next((name for name, pool in self._pools.pools.items() if node in pool.nodes), None)

    def pool_cause(self, job: SimJob, name: str | None = None) -> str | None:
        """The node pool's side of a Pending pod: the upstream cause, when there is one
        (``name``: one of the pools a JobSet child may use)."""
        name = name or job.pool
        if name is None:
            return None
        pool = self._pools.pools.get(name)
        where = f"cluster {self.identity.name}"
        if pool is None:
            return f"node pool {name} does not exist in {where}"
        hosts = pool.node_count
        if pool.status == PROVISIONING:
            return (f"node pool {name} is still being created (PROVISIONING, operation "
                    f"{pool.create_operation}); 0/{hosts} nodes ready")
        if pool.status == ERROR:
            return f"node pool {name} is in ERROR: {pool.status_message}"
        if pool.status == STOPPING:
            return f"node pool {name} is being deleted (operation {pool.delete_operation})"
        if pool.status == RUNNING and pool.ready < hosts and pool.autoscaled:
            counts = f"{pool.registered}/{hosts} nodes registered, {pool.ready} Ready"
            event = pool.autoscaler_event
            if event is not None and event[0] != FAILED_SCALE_UP and pool.failed_scale_up:
                event = pool.failed_scale_up  # the cause, not the backoff note after it
            if event is None:
                return f"node pool {name} (autoscaled): {counts}"
            if event[0] == TRIGGERED_SCALE_UP and pool.registered:
                return f"node pool {name} (autoscaled): {counts}"
            return f"cluster autoscaler {event[0]}: {event[1]}"
        if pool.status == RUNNING and pool.ready < hosts:
            if pool.stocked_out:
                return (f"node pool {name} has {pool.ready}/{hosts} nodes ready: no "
                        f"{pool.supply_mode} capacity for {hosts} x {pool.shape.machine_type} in "
                        f"{pool.zone_words} (GCE_STOCKOUT: the zone does not have enough "
                        "resources available to fulfill the request); the cluster autoscaler "
                        "keeps retrying")
            return (f"node pool {name} has {pool.ready}/{hosts} nodes ready "
                    f"({pool.registered}/{hosts} registered)")
        busy = sorted({n.pod.split("/", 1)[0] for n in pool.nodes
                       if n.pod is not None and not n.pod.startswith(f"{job.name}/")
                       and not (job.jobset and n.pod.startswith(f"{job.jobset}-"))})
        if busy:
            return f"node pool {name} is busy: its nodes run pods of Job {', '.join(busy)}"
        return None

    # --------------------------------------------------------- pod lifecycle

    def _refuse_pods(self, job: SimJob, moment: dt.datetime) -> None:
        """One of the Job controller's creates, denied by the webhook: the FailedCreate
        event counts it, and the controller tries again after its backoff."""
        if self.jobs.get(job.name) is not job:
            return
        refused = job.refuse(DENIAL, 1, moment)
        self._dirty[job.name] = job
        delay = min(_SYNC_BACKOFF_CAP, _SYNC_BACKOFF_START * 2 ** min(refused.count - 1, 16))
        self._timeline.at(seconds_after(moment, delay), self._refuse_pods, job)

    def _start(self, job: SimJob, pod: SimPod, moment: dt.datetime) -> None:
        if not self._current(job, pod) or pod.phase != PENDING or pod.node is None:
            return
        self._dirty[job.name] = job
        if job.behaviour.outcome == "image-pull-error":
            pod.reason = "ErrImagePull"
            pod.message = (f'Failed to pull image "{job.image}": rpc error: code = NotFound desc = '
                           f'failed to pull and unpack image "{job.image}": failed to resolve '
                           f'reference "{job.image}": {job.image}: not found')
            self._timeline.at(seconds_after(moment, self.defaults.image_pull_backoff_seconds),
                              self._image_backoff, job, pod)
            return
        pod.phase, pod.reason, pod.message = RUNNING_PHASE, None, None
        self._log(job, pod, moment, f"pod {pod.name} started on node {pod.node} "
                                    f"(node pool {pod.pool}), image {job.image}")
        # ``parse_job`` filled in what the spec left unsaid from the config's defaults.
        duration = job.behaviour.duration_seconds
        runs = self.defaults.duration_seconds if duration is None else duration
        self._timeline.at(seconds_after(moment, runs), self._finish, job, pod)
        if job.behaviour.outcome == NODE_REPAIR and not job.repaired:
            job.repaired = True
            self._timeline.at(seconds_after(moment, runs / 2), self._repair_slice, job,
                              pod.pool)

    def _repair_slice(self, job: SimJob, pool_name: str | None, moment: dt.datetime) -> None:
        """GKE repairs a node of the Job's slice, which recreates the whole slice: every
        node is drained (its pod evicted through the Eviction API, the container
        stopped by SIGTERM, the pod marked DisruptionTarget) and then replaced; the
        Job controller recreates the pods its pod failure policy ignores."""
        pool = self._pools.pools.get(pool_name or "")
        if self.jobs.get(job.name) is not job or job.finished or pool is None:
            return
        for node in pool.nodes:
            node.ready = False  # cordoned: nothing new lands on the slice being repaired
        for node in list(pool.nodes):
            owner, _, pod_name = (node.pod or "").partition("/")
            victim_job = self.jobs.get(owner)
            victim = next((p for p in victim_job.pods if p.name == pod_name), None) \
                if victim_job is not None else None
            if victim_job is not None and victim is not None and victim.phase in (
                    PENDING, RUNNING_PHASE):
                self._pod_failed(victim_job, victim, moment, "Error", SIGTERM_EXIT,
                                 f"node {node.name} drained for repair by GKE", EVICTED)
        self._pools.repair_nodes(pool.name, moment)

    def _log(self, job: SimJob, pod: SimPod, moment: dt.datetime, text: str) -> None:
        """A line in the pod's log file. A world saved before pods kept log files (no
        ``pod_logs``) gets its book at the first line."""
        if "pod_logs" not in vars(self):
            self.pod_logs = SimPodLogs()
        self.pod_logs.write(job.task_id, pod.name, moment, text)

    def _image_backoff(self, job: SimJob, pod: SimPod, moment: dt.datetime) -> None:
        if self._current(job, pod) and pod.reason == "ErrImagePull":
            pod.reason, pod.message = "ImagePullBackOff", f'Back-off pulling image "{job.image}"'
            self._dirty[job.name] = job

    def _finish(self, job: SimJob, pod: SimPod, moment: dt.datetime) -> None:
        if not self._current(job, pod) or pod.phase != RUNNING_PHASE:
            return
        behaviour = job.behaviour
        if behaviour.outcome == "oom":
            self._pod_failed(job, pod, moment, "OOMKilled", 137,
                             "container main was OOMKilled: it exceeded its memory limit")
            return
        exit_code = behaviour.exit_code if behaviour.exit_code is not None else 1
        if behaviour.outcome == "fail" and exit_code != 0:
            self._pod_failed(job, pod, moment, "Error", exit_code, None)
            return
        pod.phase, pod.reason, pod.exit_code = SUCCEEDED, "Completed", 0
        pod.finished_at = moment
        self._log(job, pod, moment, "exited with code 0")
        freed = pod.pool
        self._unbind(pod, moment)
        job.done_indexes.add(pod.index)
        self._dirty[job.name] = job
        if len(job.done_indexes) >= job.completions:
            self._conclude(job, COMPLETE_CONDITION, moment)
        else:
            self._top_up(job, moment)
        self._reschedule(moment, {freed})

    def _pod_failed(self, job: SimJob, pod: SimPod, moment: dt.datetime, reason: str,
                    exit_code: int | None, message: str | None,
                    disruption: tuple[str, str] | None = None) -> None:
        """A pod of the Job failed; its pod failure policy decides: Ignore (a
        disruption: a replacement at once, nothing counted), FailJob (the Job Failed
        with reason PodFailurePolicy), else counted against ``backoffLimit``."""
        pod.phase, pod.reason, pod.exit_code, pod.message = FAILED, reason, exit_code, message
        pod.finished_at, pod.disruption = moment, disruption
        if pod.node is not None:  # a pod that ran: its container's last words
            detail = f": {message}" if message else ""
            code = f" (exit code {exit_code})" if exit_code is not None else ""
            self._log(job, pod, moment, f"{reason}{detail}{code}")
        freed = {pod.pool}
        self._unbind(pod, moment)
        self._dirty[job.name] = job
        action = job.failure_action(pod)
        if action == IGNORE:
            self._timeline.at(moment, self._replace, job, pod.index)
            self._reschedule(moment, freed)
            return
        job.failed += 1
        if action == FAIL_JOB or job.failed > job.backoff_limit:
            job.condition_reason = ("PodFailurePolicy" if action == FAIL_JOB
                                    else "BackoffLimitExceeded")
            self._conclude(job, FAILED_CONDITION, moment)
            for other in job.live_pods():
                freed.add(other.pool)
                self._unbind(other, moment)
                job.pods.remove(other)
            self.forget_unbound(job)
        else:
            delay = min(_BACKOFF_CAP, _BACKOFF_START * 2 ** (job.failed - 1))
            self._timeline.at(seconds_after(moment, delay),
                              self._replace, job, pod.index)
        self._reschedule(moment, freed)

    def _conclude(self, job: SimJob, condition: str, moment: dt.datetime) -> None:
        """The Job's final condition; with ttlSecondsAfterFinished the TTL controller
        deletes it (and its pods) that long afterwards."""
        job.condition = condition
        if job.jobset is not None:
            self.jobsets.child_concluded(job, condition, moment)
        if job.ttl_after_finished is not None:
            self._timeline.at(seconds_after(moment, job.ttl_after_finished),
                              self._expire, job)

    def _expire(self, job: SimJob, moment: dt.datetime) -> None:
        if self.jobs.get(job.name) is job:
            self.delete_job(job.name, moment)

    def _replace(self, job: SimJob, index: int, moment: dt.datetime) -> None:
        if self.jobs.get(job.name) is not job or job.finished:
            return
        self.new_pod(job, index)
        self._dirty[job.name] = job
        self._schedule_job(job, moment)

    def _top_up(self, job: SimJob, moment: dt.datetime) -> None:
        """Start pods for indexes not yet done or running, up to the parallelism."""
        live = {p.index for p in job.live_pods()}
        for index in range(job.completions):
            if len(live) >= job.parallelism:
                break
            if index not in live and index not in job.done_indexes:
                self.new_pod(job, index)
                live.add(index)
        self._schedule_job(job, moment)

    def new_pod(self, job: SimJob, index: int) -> SimPod:
        pod = SimPod(f"{job.name}-{index}-{suffix(self._rng)}", index)
        job.pods.append(pod)
        self._unbound.setdefault(job.pool, {})[job.name] = None
        return pod

    def _unbind(self, pod: SimPod, moment: dt.datetime) -> bool:
        """Free the pod's node; True when it held one."""
        if pod.node is None:
            return False
        pool = self._pools.pools.get(pod.pool or "")
        for node in pool.nodes if pool else ():
            if node.name == pod.node:
                node.pod = None
        pod.node = None
        if pool is not None:
            self._pools.node_use_changed(pool.name, moment)
        return True

    def forget_unbound(self, job: SimJob) -> None:
        waiting = self._unbound.get(job.pool)
        if waiting is not None:
            waiting.pop(job.name, None)

    def _current(self, job: SimJob, pod: SimPod) -> bool:
        return self.jobs.get(job.name) is job and not job.finished and pod in job.pods
