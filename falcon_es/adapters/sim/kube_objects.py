"""The objects the simulated Kubernetes API of one cluster holds: Jobs, their Pods and
Services, as the API server would store them.

``kube_api`` creates them from submitted manifests and moves them (the scheduler, the
Job controller, the garbage collector); the observations the informer publishes and
the test doubles that serve them over HTTP read them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from falcon_es.domain.naming import OwnerMarks
from falcon_es.domain.ports import CreateRefusal, JobRef, PodObservation
from falcon_es.domain.spec import SimBehaviour

POOL_SELECTOR = "cloud.google.com/gke-nodepool"
PENDING, RUNNING_PHASE, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"


@dataclasses.dataclass
class SimPod:
    """One pod of a Job: its completion index, phase, and the node it is bound to
    (None while the scheduler has found no node for it)."""

    name: str
    index: int
    phase: str = PENDING
    reason: str | None = None
    exit_code: int | None = None
    message: str | None = None
    node: str | None = None
    pool: str | None = None
    #: When its container terminated (what Kubernetes reports as ``finishedAt``).
    finished_at: dt.datetime | None = None
    #: The node it was last bound to (``spec.nodeName`` stays after it ends).
    last_node: str | None = None
    #: Its DisruptionTarget condition (reason, message), when a disruption killed it.
    disruption: tuple[str, str] | None = None

    def observation(self) -> PodObservation:
        """What the informer publishes of the pod."""
        finished = self.finished_at.isoformat() if self.finished_at is not None else None
        disruption = None if self.disruption is None else ": ".join(self.disruption)
        return PodObservation(self.name, self.phase, self.reason, self.exit_code, self.message,
                              finished, self.node or self.last_node, disruption)


IGNORE, FAIL_JOB, COUNT = "Ignore", "FailJob", "Count"


@dataclasses.dataclass(frozen=True)
class SimFailureRule:
    """One rule of a Job's ``podFailurePolicy``: its action, and what it matches (a pod
    condition type, or the container's exit code ``In`` / ``NotIn`` a set)."""

    action: str
    condition: str | None = None
    operator: str | None = None
    codes: frozenset[int] = frozenset()

    def matches(self, pod: SimPod) -> bool:
        if self.condition is not None:
            return self.condition == "DisruptionTarget" and pod.disruption is not None
        if pod.exit_code is None or pod.exit_code == 0:  # exit code 0 is never checked
            return False
        return (pod.exit_code in self.codes) == (self.operator == "In")


@dataclasses.dataclass
class SimCreateFailure:
    """The Job controller's FailedCreate event on a Job, as the event recorder
    aggregates it: the API server's answer to the pod create, how many pods it counts,
    the first and the latest. Whatever refused them (an admission webhook denying the
    Job's pods, the JobSet pod webhook refusing followers while their leader waits),
    the event reads the same, so it is one record."""

    message: str  # the API server's words; the Job controller prefixes "Error creating: "
    count: int
    first: dt.datetime
    last: dt.datetime

    @property
    def event_message(self) -> str:
        """The FailedCreate event's words, as the Job controller records them."""
        return f"Error creating: {self.message}"

    def observation(self, about: str = "", *, transient: bool = False) -> CreateRefusal:
        """What the informer publishes of it; ``about`` leads the words (a JobSet names
        the child Job the event is on)."""
        return CreateRefusal(f"{about}{self.event_message}", self.count, transient=transient)


@dataclasses.dataclass
class SimJob:
    """A Job as the simulated API holds it: what its manifest asked for (read once at
    submit, so the scheduler never parses it again), its pods, and how far it got."""

    name: str
    uid: str
    task_id: str  # the task's own id: the falcon/task-id annotation, else the label
    task_label: str  # the falcon-task label value (a shortened id when the id is no label)
    completions: int
    parallelism: int
    backoff_limit: int
    selector: Mapping[str, str]
    tolerates_tpu: bool
    tpu_per_pod: int
    image: str
    behaviour: SimBehaviour
    created_at: dt.datetime
    pods: list[SimPod] = dataclasses.field(default_factory=list)
    done_indexes: set[int] = dataclasses.field(default_factory=set)
    failed: int = 0
    condition: str | None = None
    last_published: tuple[Any, ...] | None = None
    resource_version: int = 0
    ttl_after_finished: int | None = None
    #: A JobSet's child: the JobSet's name, the pools its node affinity allows (one
    #: taken per child, exclusively), and the follower pods not yet created because the
    #: pod webhook refuses them until the leader (index 0) is scheduled.
    jobset: str | None = None
    allowed_pools: tuple[str, ...] = ()
    followers_held: bool = False
    #: The FailedCreate of its pods while it lasts: the ``create-denied`` outcome's
    #: webhook, or a JobSet child's followers refused until the leader is scheduled.
    refused: SimCreateFailure | None = None
    #: The ``falcon/task-id`` annotation (None: the manifest had none).
    owner_id: str | None = None

    def ref(self) -> JobRef:
        """What the API answers of it: name, uid and the marks of its task."""
        return JobRef(self.name, self.uid, self.owner_id, self.task_label or None)
    #: Its ``podFailurePolicy`` rules, in order (none: every failed pod counts).
    failure_rules: tuple[SimFailureRule, ...] = ()
    #: Why it Failed (``BackoffLimitExceeded``, ``PodFailurePolicy``).
    condition_reason: str | None = None
    #: The ``node-repair`` outcome has repaired its slice (it happens once).
    repaired: bool = False

    @property
    def pool(self) -> str | None:
        """The node pool the Job's nodeSelector pins it to, if any."""
        return self.selector.get(POOL_SELECTOR)

    @property
    def finished(self) -> bool:
        """The Job has its final condition (Complete or Failed)."""
        return self.condition is not None

    def refuse(self, message: str, pods: int, moment: dt.datetime) -> SimCreateFailure:
        """The Job controller's create of ``pods`` pods was refused at ``moment``: the
        event recorder counts them into the Job's FailedCreate (a new one when it has
        none, else the same event counted up)."""
        refused = self.refused
        if refused is None:
            self.refused = refused = SimCreateFailure(message, pods, moment, moment)
        else:
            refused.message, refused.last = message, moment
            refused.count += pods
        return refused

    def failure_action(self, pod: SimPod) -> str:
        """What the Job controller does with a failed pod: the first matching rule's
        action, else Count (against ``backoffLimit``)."""
        return next((rule.action for rule in self.failure_rules if rule.matches(pod)), COUNT)

    def live_pods(self) -> list[SimPod]:
        """The pods that still hold or wait for a node."""
        return [p for p in self.pods if p.phase in (PENDING, RUNNING_PHASE)]


@dataclasses.dataclass
class SimJobSet:
    """A JobSet as the simulated API holds it: its child Jobs (named
    ``<jobset>-<replicatedJob>-<index>``), restarts and final condition."""

    name: str
    uid: str
    task_id: str
    task_label: str
    replicated_job: str
    replicas: int
    #: The child Job manifest the replicatedJob's template makes (name left out).
    template: Mapping[str, Any]
    max_restarts: int | None  # None: no failurePolicy (the first failed child fails it)
    created_at: dt.datetime
    #: The child Job failure reasons a ``FailJobSet`` rule of its failure policy names.
    fail_on_reasons: frozenset[str] = frozenset()
    #: Exclusive placement per node pool: leaders first, followers on their pool.
    exclusive: bool = False
    ttl_after_finished: int | None = None
    children: list[str] = dataclasses.field(default_factory=list)
    restarts: int = 0
    condition: str | None = None  # Completed | Failed
    condition_reason: str | None = None
    last_published: tuple[Any, ...] | None = None
    resource_version: int = 0
    #: The ``falcon/task-id`` annotation (None: the manifest had none).
    owner_id: str | None = None
    #: The controller's JobCreationFailed event on the JobSet: its words (the child
    #: Jobs' errors, joined) and how many creates it aggregates.
    creation_failed: str | None = None
    creation_failures: int = 0

    def ref(self) -> JobRef:
        """What the API answers of it: name, uid and the marks of its task."""
        return JobRef(self.name, self.uid, self.owner_id, self.task_label or None)


@dataclasses.dataclass(frozen=True)
class SimService:
    """A Service as the API server holds it: what adoption and garbage collection read."""

    name: str
    namespace: str
    task_label: str | None
    owner_uids: tuple[str, ...]
    selector: Mapping[str, str]
    headless: bool
    #: The ``falcon/task-id`` annotation (None: the manifest had none).
    owner_id: str | None = None

    @property
    def owner(self) -> OwnerMarks:
        return OwnerMarks(task_id=self.owner_id, label=self.task_label)
