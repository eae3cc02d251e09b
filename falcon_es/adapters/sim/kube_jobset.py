"""The JobSet controller and its pod webhooks, as the simulated Kubernetes API of one
cluster runs them (kubernetes-sigs/jobset, ``jobset.x-k8s.io/v1alpha2``).

- A JobSet's one replicatedJob makes ``replicas`` child Jobs named
  ``<jobset>-<replicatedJob>-<index>``, labelled with the JobSet's name, and one
  headless Service named after the JobSet (the default subdomain), owned by it.
- Exclusive placement (``alpha.jobset.sigs.k8s.io/exclusive-topology:
  cloud.google.com/gke-nodepool``): each child's leader pod (completion index 0) takes
  a node pool no sibling holds, among the pools the pods' node affinity allows; the
  mutating pod webhook gives each follower a node selector on the leader's pool. While
  the leader is not scheduled the webhook leaves followers unpatched, and the
  validating webhook, which checks the selector before it checks the leader, refuses
  them with "follower pod node selector not set" (a follower with no node selector at
  all) or, for pods that have other selectors (Falcon's: the accelerator and topology),
  "follower pod node selector for topology domain not found. missing selector:
  cloud.google.com/gke-nodepool" -- the FailedCreate events on the
  child Job that mask the leader's real cause (kubernetes-sigs/jobset#1187). Followers are
  created as soon as their leader is bound.
- Failure policy: a child Job failed for a reason a ``FailJobSet`` rule names
  (``onJobFailureReasons``, e.g. ``PodFailurePolicy``) fails the JobSet at once
  (reason FailJobSetFailurePolicyAction, ``pkg/controllers/failure_policy.go``); any
  other failed child Job restarts the whole JobSet (Recreate: every child
  deleted and created again, ``status.restarts`` + 1) until ``maxRestarts`` is
  reached; then the JobSet is Failed with reason ReachedMaxRestarts (FailedJobs when it
  has no failure policy). Every child Complete makes it Completed (AllJobsCompleted).
- Observations: the informer publishes one observation per JobSet (kind JobSet), its
  pods and counts summed over the current children; children publish none of their own.

Only one replicatedJob is modelled: the one Falcon-ES renders.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import random
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from falcon_es.domain.ports import (
    ALREADY_EXISTS, INVALID, JOB_CREATION_FAILED, JOBSET_KIND, QUOTA_EXCEEDED, CreateRefusal,
    JobObservation, JobRef, PortError, jobset_cause,
)

from falcon_es.adapters.sim.common import (
    DNS_LABEL, ClusterIdentity, label_problem, seconds_after,
)
from falcon_es.adapters.sim.kube_manifests import SIM_ANNOTATION, TASK_ID_ANNOTATION, TASK_LABEL
from falcon_es.adapters.sim.kube_objects import (
    PENDING, POOL_SELECTOR, RUNNING_PHASE, SUCCEEDED, SimJob, SimJobSet,
)
from falcon_es.adapters.sim.timeline import Method



class JobSetHost(Protocol):
    """What the JobSet controller uses of the cluster's API (``kube_api.KubeService``,
    which owns the controller: a protocol, so neither module imports the other)."""

    identity: ClusterIdentity
    jobs: dict[str, SimJob]

    def submit_child(self, manifest: Mapping[str, Any], now: dt.datetime, jobset: str,
                     allowed_pools: tuple[str, ...], *, exclusive: bool) -> None: ...
    def delete_job(self, name: str, now: dt.datetime, kind: str = ...) -> None: ...
    def create_service(self, manifest: Mapping[str, Any]) -> Any: ...
    def collect_services_of(self, job_uid: str) -> None: ...
    def forget_unbound(self, job: SimJob) -> None: ...
    def new_pod(self, job: SimJob, index: int) -> Any: ...
    def pool_cause(self, job: SimJob, name: str | None = None) -> str | None: ...
    def next_resource_version(self) -> int: ...
    def at(self, moment: dt.datetime, method: Method, *args: object) -> None: ...
    def stop(self, job: SimJob, moment: dt.datetime) -> None: ...

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
EXCLUSIVE_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
COMPLETED, FAILED_CONDITION = "Completed", "Failed"
ALL_JOBS_COMPLETED, FAILED_JOBS, REACHED_MAX_RESTARTS = (
    "AllJobsCompleted", "FailedJobs", "ReachedMaxRestarts")
#: The Failed condition's reason when a FailJobSet rule acted (jobset
#: ``pkg/constants/constants.go`` ``FailJobSetActionReason``).
FAIL_JOBSET_ACTION = "FailJobSetFailurePolicyAction"
#: The validating pod webhook's answer to a follower created before its leader is
#: scheduled (the Job controller's FailedCreate prefixes "Error creating: ").
FOLLOWER_REFUSED = ('admission webhook "vpod.kb.io" denied the request: '
                    "follower pod node selector not set")
#: The same refusal of a follower whose pod has node selectors, only not the topology
#: key's (Falcon's pods: the TPU accelerator and topology): the validating webhook's
#: second check (``pod_webhook.go``, wording of jobset PR 636).
FOLLOWER_MISSING_SELECTOR = ('admission webhook "vpod.kb.io" denied the request: follower '
                             "pod node selector for topology domain not found. missing "
                             "selector: cloud.google.com/gke-nodepool")
#: The sim outcome whose Jobs the namespace's ResourceQuota refuses, and that quota.
JOBS_REFUSED = "jobs-refused"
JOB_QUOTA = "falcon-jobs"
#: The JobSet controller's requeue after a failed reconcile (controller-runtime's
#: per-item backoff, 5 ms doubling up to 1000 s; the sim starts at 1 s).
_REQUEUE_START, _REQUEUE_CAP = 1.0, 1000.0


def quota_refusal(job_name: str) -> PortError:
    """The API server's 403 for a Job create past a ResourceQuota of 0 Jobs
    (``count/jobs.batch``), in the quota admission plugin's words."""
    return PortError(QUOTA_EXCEEDED, (
        f'jobs.batch "{job_name}" is forbidden: exceeded quota: {JOB_QUOTA}, requested: '
        "count/jobs.batch=1, used: count/jobs.batch=0, limited: count/jobs.batch=0"))


class SimJobSets:
    """The JobSets of one simulated cluster and the controller that runs them."""

    def __init__(self, kube: JobSetHost, rng: random.Random) -> None:
        self._kube = kube
        self._rng = rng
        self.jobsets: dict[str, SimJobSet] = {}
        self._dirty: dict[str, None] = {}
        self._restarting: set[str] = set()  # one restart per failed attempt

    # ----------------------------------------------------------------- API
    def submit(self, manifest: Mapping[str, Any], now: dt.datetime) -> JobRef:
        jobset = _parse(manifest, now, self._rng)
        if jobset.name in self.jobsets:
            raise PortError(ALREADY_EXISTS,
                            f'jobsets.jobset.x-k8s.io "{jobset.name}" already exists')
        self.jobsets[jobset.name] = jobset
        self._kube.create_service({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": jobset.name, "namespace": manifest["metadata"].get("namespace"),
                         "labels": {JOBSET_NAME_LABEL: jobset.name},
                         "ownerReferences": [{"uid": jobset.uid}]},
            "spec": {"clusterIP": "None", "selector": {JOBSET_NAME_LABEL: jobset.name},
                     "publishNotReadyAddresses": True},
        })
        self._create_children(jobset, now)
        return jobset.ref()

    def get(self, name: str) -> JobRef | None:
        jobset = self.jobsets.get(name)
        return None if jobset is None else jobset.ref()

    def delete(self, name: str, now: dt.datetime) -> None:
        """Delete the JobSet; its children and Service go with it (ownerReferences)."""
        jobset = self.jobsets.pop(name, None)
        if jobset is None:
            return
        self._dirty.pop(name, None)
        self._restarting.discard(name)
        self._delete_children(jobset, now)
        self._kube.collect_services_of(jobset.uid)

    # ---------------------------------------------- the scheduler calls these
    def claimed(self, job: SimJob) -> set[str]:
        """Pools a sibling child already holds (exclusive placement per node pool)."""
        jobset = self.jobsets.get(job.jobset or "")
        if jobset is None:
            return set()
        jobs = self._kube.jobs
        return {pool for name in jobset.children if name != job.name
                for pool in [jobs[name].pool if name in jobs else None] if pool}

    def leader_bound(self, job: SimJob, pool: str | None) -> None:
        """The mutating webhook now finds the leader's node: followers get its pool as
        their node selector and the Job controller's next attempt creates them."""
        if pool is None:
            return
        self._kube.forget_unbound(job)
        job.selector = {**job.selector, POOL_SELECTOR: pool}
        job.followers_held, job.refused = False, None
        for index in range(1, min(job.parallelism, job.completions)):
            self._kube.new_pod(job, index)

    def refuse_followers(self, job: SimJob, moment: dt.datetime) -> None:
        """The Job controller tried the followers; the validating webhook refused them."""
        words = FOLLOWER_MISSING_SELECTOR if job.selector else FOLLOWER_REFUSED
        job.refuse(words, max(1, min(job.parallelism, job.completions) - 1), moment)

    def child_changed(self, job: SimJob) -> None:
        if job.jobset in self.jobsets:
            self._dirty[job.jobset or ""] = None

    def child_concluded(self, job: SimJob, condition: str, moment: dt.datetime) -> None:
        """A child Job ended: restart the JobSet, fail it, or complete it."""
        jobset = self.jobsets.get(job.jobset or "")
        if jobset is None or jobset.condition is not None or jobset.name in self._restarting:
            return
        self._dirty[jobset.name] = None
        if condition == "Failed" and job.condition_reason in jobset.fail_on_reasons:
            # A FailJobSet rule on the child's failure reason: no restart.
            jobset.condition, jobset.condition_reason = FAILED_CONDITION, FAIL_JOBSET_ACTION
            self._stop_children(jobset, moment)
            self._expire_later(jobset, moment)
            return
        if condition == "Failed":
            limit = jobset.max_restarts
            if limit is not None and jobset.restarts < limit:
                # Recreate: the next moment, so the failing child's bookkeeping is done.
                self._restarting.add(jobset.name)
                self._kube.at(moment, self._restart, jobset)
                return
            jobset.condition = FAILED_CONDITION
            jobset.condition_reason = REACHED_MAX_RESTARTS if limit is not None else FAILED_JOBS
            self._stop_children(jobset, moment)
            self._expire_later(jobset, moment)
            return
        jobs = self._kube.jobs
        if all(jobs[n].condition == "Complete" for n in jobset.children if n in jobs):
            jobset.condition, jobset.condition_reason = COMPLETED, ALL_JOBS_COMPLETED
            self._expire_later(jobset, moment)

    def diagnose(self, name: str) -> str | None:
        """Root cause first: the controller's own refusal to create a child Job, then a
        child's leader that waits for a node (with the pools it may use), before the
        followers the webhook refuses because of it."""
        jobset = self.jobsets.get(name)
        if jobset is None:
            return None
        refused = _creation_refusal(jobset)
        if refused is not None:
            return refused.message
        jobs = self._kube.jobs
        for child_name in jobset.children:
            child = jobs.get(child_name)
            if child is None:
                continue
            leader = next((p for p in child.pods if p.index == 0), None)
            if leader is None or leader.phase != PENDING:
                continue
            causes = [self._kube.pool_cause(child, pool) for pool in child.allowed_pools]
            upstream = "; ".join(dict.fromkeys(c for c in causes if c))  # each cause once
            if leader.node is None and leader.message:
                symptom = (f"leader pod {leader.name} of Job {child.name} Unschedulable: "
                           f"{leader.message}")
                return f"{upstream}; {symptom}" if upstream else symptom
            if upstream:
                return upstream
        return None

    # ------------------------------------------------------------- publishing
    def flush(self, moment: dt.datetime) -> list[JobObservation]:
        dirty, self._dirty = self._dirty, {}
        observations = []
        for name in dirty:
            jobset = self.jobsets.get(name)
            if jobset is None:
                continue
            observation = self.observe(jobset, moment)
            state = (observation.active, observation.succeeded, observation.failed,
                     observation.condition, observation.pods, observation.refusal,
                     observation.restarts)
            if state == jobset.last_published:
                continue
            jobset.last_published = state
            jobset.resource_version = self._kube.next_resource_version()
            observations.append(dataclasses.replace(
                observation, resource_version=jobset.resource_version))
        return observations

    def observe(self, jobset: SimJobSet, moment: dt.datetime) -> JobObservation:
        jobs = [self._kube.jobs[n] for n in jobset.children if n in self._kube.jobs]
        pods = tuple(p.observation() for job in jobs for p in job.pods)
        refusal = _creation_refusal(jobset)  # upstream of any child's
        for child in jobs if refusal is None else ():
            if child.refused is not None:
                leader = next((p for p in child.pods if p.index == 0), None)
                refusal = child.refused.observation(
                    f"child Job {child.name}: ", transient=leader is None or leader.node is None)
                break
        condition = {COMPLETED: "Complete", FAILED_CONDITION: "Failed"}.get(
            jobset.condition or "")
        per_child = int(jobset.template["spec"].get("completions") or 1)
        return JobObservation(
            cluster_name=self._kube.identity.name, job_name=jobset.name, job_uid=jobset.uid,
            task_id=jobset.task_id, resource_version=jobset.resource_version,
            active=sum(1 for job in jobs for p in job.pods if p.phase == RUNNING_PHASE),
            succeeded=sum(1 for job in jobs for p in job.pods if p.phase == SUCCEEDED),
            failed=sum(job.failed for job in jobs), completions=per_child * jobset.replicas,
            pods=pods, observed_at=moment, condition=condition, refusal=refusal,
            kind=JOBSET_KIND, restarts=jobset.restarts,
            condition_reason=jobset.condition_reason,
        )

    # ---------------------------------------------------------------- children
    def _create_children(self, jobset: SimJobSet, now: dt.datetime) -> None:
        """Create the child Jobs it lacks. Those the API server refuses are one
        JobCreationFailed event on the JobSet, in the controller's words (each child's
        "job %q creation failed with error: %v", joined by newlines: ``createJobs``),
        and the controller tries again after its requeue backoff."""
        errors = []
        for index in range(jobset.replicas):
            manifest = copy.deepcopy(dict(jobset.template))
            name = f"{jobset.name}-{jobset.replicated_job}-{index}"
            if name in jobset.children:
                continue
            manifest["metadata"] = {**manifest.get("metadata", {}), "name": name}
            labels = manifest["metadata"].setdefault("labels", {})
            labels[JOBSET_NAME_LABEL] = jobset.name
            manifest["metadata"].setdefault("annotations", {})[TASK_ID_ANNOTATION] = jobset.task_id
            try:
                self._kube.submit_child(manifest, now, jobset.name, _allowed_pools(manifest),
                                        exclusive=jobset.exclusive)
            except PortError as error:
                if error.code != QUOTA_EXCEEDED:
                    raise
                errors.append(f'job "{name}" creation failed with error: {error.message}')
                continue
            jobset.children.append(name)
        jobset.children.sort(key=lambda child: int(child.rsplit("-", 1)[1]))
        if errors:
            jobset.creation_failed = "\n".join(errors)
            jobset.creation_failures += 1
            delay = min(_REQUEUE_START * 2 ** (jobset.creation_failures - 1), _REQUEUE_CAP)
            self._kube.at(seconds_after(now, delay), self._retry_children, jobset)
        self._dirty[jobset.name] = None

    def _retry_children(self, jobset: SimJobSet, moment: dt.datetime) -> None:
        """The controller's next reconcile of a JobSet whose child Jobs it could not
        create."""
        if self.jobsets.get(jobset.name) is jobset and jobset.condition is None:
            self._create_children(jobset, moment)

    def _delete_children(self, jobset: SimJobSet, now: dt.datetime) -> None:
        for name in jobset.children:
            self._kube.delete_job(name, now)

    def _stop_children(self, jobset: SimJobSet, moment: dt.datetime) -> None:
        """A failed JobSet's running children are stopped (their pods deleted); the
        failed child keeps its failed pods for the root cause."""
        for name in jobset.children:
            job = self._kube.jobs.get(name)
            if job is not None and job.condition is None:
                self._kube.stop(job, moment)

    def _restart(self, jobset: SimJobSet, moment: dt.datetime) -> None:
        self._restarting.discard(jobset.name)
        if self.jobsets.get(jobset.name) is not jobset or jobset.condition is not None:
            return
        self._delete_children(jobset, moment)
        jobset.restarts += 1
        jobset.children = []
        self._create_children(jobset, moment)

    def _expire_later(self, jobset: SimJobSet, moment: dt.datetime) -> None:
        if jobset.ttl_after_finished is None:
            return
        self._kube.at(seconds_after(moment, jobset.ttl_after_finished), self._expire, jobset)

    def _expire(self, jobset: SimJobSet, moment: dt.datetime) -> None:
        if self.jobsets.get(jobset.name) is jobset:
            self.delete(jobset.name, moment)


def _creation_refusal(jobset: SimJobSet) -> CreateRefusal | None:
    """The controller's JobCreationFailed while a child Job is still missing."""
    if jobset.creation_failed is None or len(jobset.children) >= jobset.replicas:
        return None
    return CreateRefusal(jobset_cause(JOB_CREATION_FAILED, jobset.creation_failed),
                         jobset.creation_failures)


def _allowed_pools(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The node pools the pods' required node affinity allows (``In`` on the pool label)."""
    pod_spec = manifest["spec"]["template"]["spec"]
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                 "nodeSelectorTerms") or []
    pools: list[str] = []
    for term in terms:
        for expression in term.get("matchExpressions") or ():
            if expression.get("key") == POOL_SELECTOR and expression.get("operator") == "In":
                pools.extend(str(v) for v in expression.get("values") or ())
    return tuple(pools)


def _parse(manifest: Mapping[str, Any], now: dt.datetime, rng: random.Random) -> SimJobSet:
    """The JobSet ``manifest`` asks for; INVALID in the API server's words otherwise."""
    metadata = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name")
    shown = name if isinstance(name, str) else ""

    def invalid(field: str, words: str) -> PortError:
        return PortError(INVALID, f'JobSet.jobset.x-k8s.io "{shown}" is invalid: {field}: {words}')

    if manifest.get("apiVersion") != JOBSET_API_VERSION or manifest.get("kind") != "JobSet":
        raise invalid("kind", f"expected {JOBSET_API_VERSION} JobSet, found "
                              f"{manifest.get('apiVersion')} {manifest.get('kind')}")
    if not shown or not DNS_LABEL.match(shown):
        raise invalid("metadata.name", f'Invalid value: "{shown}": a lowercase RFC 1123 label')
    labels = metadata.get("labels") or {}
    problem = label_problem(labels)
    if problem:
        raise invalid("metadata.labels", problem)
    spec = manifest.get("spec") or {}
    replicated = spec.get("replicatedJobs")
    if not isinstance(replicated, list) or len(replicated) != 1:
        raise invalid("spec.replicatedJobs", "the simulation models exactly one replicatedJob")
    (entry,) = replicated
    replicas = entry.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise invalid("spec.replicatedJobs[0].replicas", f"Invalid value: {replicas!r}")
    template = entry.get("template")
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise invalid("spec.replicatedJobs[0].template", "Required value")
    child_metadata: dict[str, Any] = copy.deepcopy(dict(template.get("metadata") or {}))
    child_spec: dict[str, Any] = copy.deepcopy(dict(template["spec"]))
    child_spec.setdefault("completionMode", "Indexed")  # the defaulting webhook's
    annotations = metadata.get("annotations") or {}
    if SIM_ANNOTATION in annotations:  # how the children's pods behave in the simulation
        child_metadata.setdefault("annotations", {})[SIM_ANNOTATION] = annotations[
            SIM_ANNOTATION]
    child = {"apiVersion": "batch/v1", "kind": "Job", "metadata": child_metadata,
             "spec": child_spec}
    policy = spec.get("failurePolicy")
    max_restarts = int(policy.get("maxRestarts") or 0) if isinstance(policy, Mapping) else None
    rules = (policy.get("rules") or []) if isinstance(policy, Mapping) else []
    fail_on = frozenset(str(reason) for rule in rules if isinstance(rule, Mapping)
                        and rule.get("action") == "FailJobSet"
                        and not rule.get("targetReplicatedJobs")
                        for reason in rule.get("onJobFailureReasons") or ())
    task_label = str(labels.get(TASK_LABEL, ""))
    ttl = spec.get("ttlSecondsAfterFinished")
    return SimJobSet(
        name=shown, uid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        task_id=str(annotations.get(TASK_ID_ANNOTATION) or task_label), task_label=task_label,
        owner_id=annotations.get(TASK_ID_ANNOTATION),
        replicated_job=str(entry.get("name") or "job"), replicas=replicas, template=child,
        max_restarts=max_restarts, created_at=now, fail_on_reasons=fail_on,
        exclusive=annotations.get(EXCLUSIVE_ANNOTATION) == POOL_SELECTOR,
        ttl_after_finished=ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None,
    )
