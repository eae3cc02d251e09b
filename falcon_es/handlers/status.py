"""Status: fold what the edge clusters' informers saw of each Job into the log.

Observations (``JobObservation``) arrive on the ``edge-events`` subscription at least
once and in any order. Each carries the Job's uid and a resourceVersion; the last
resourceVersion folded is kept in the task's state, so a duplicate or an older
observation changes nothing. Observations of a task that is not dispatched or running
(ended, being aborted) are dropped on purpose: the task's outcome is already decided,
and the abort handler deletes the Job itself. An observation that arrives before the
task's ``JobSubmitted`` is left unacknowledged and comes back after the ack deadline.

Messages are acknowledged only after the tick that folded them has committed
(``ack_folded``, an after-commit step); a tick that loses a race acknowledges nothing.

What an observation means:
- pods killed by a disruption (their ``DisruptionTarget`` condition: a node repair,
  upgrade, drain, preemption) -> WorkloadDisrupted, led by the condition and the node:
  the Job's pod failure policy ignores them and recreates the pods, so the task keeps
  its state (past ``FALCON_DISRUPTION_BUDGET`` disruptions: JobFailed, Job deleted);
- a failed pod no disruption killed, or the Job's Failed condition -> JobFailed with
  the pod's root cause
  ("OOMKilled (exit code 137)", "exit code 3"); a JobSet (a multi-slice task) fails
  only by its Failed condition (ReachedMaxRestarts, FailedJobs), with the pod that
  failed first in any child Job, and its restarts show in the Message meanwhile;
- followers of a JobSet child refused while their leader pod is not scheduled (a
  transient refusal) -> PodsPending led by the leader's own cause (FailedScheduling,
  the pools), the refusal after it: the webhook's "follower pod node selector not set"
  is the symptom, never the headline;
- a pod that cannot pull its image -> JobFailed ("ErrImagePull: ...") and the Job is
  deleted (its pods would otherwise wait forever);
- the Job's Complete condition -> JobSucceeded;
- every pod running -> PodsRunning "n/n active" (Running; the queue's slot frees);
- pods pending on an autoscaled (flex-start) pool short of Ready nodes -> NodesAwaited
  (Pending/WaitingForNode): the pool's expected, registered and Ready node counts,
  led by the edge cluster's diagnosis (the cluster autoscaler's words: a stockout, a
  quota); once the nodes are there, pods still pending are PodsPending again;
- pods pending -> PodsPending with the edge cluster's upstream diagnosis (no pod
  capacity, a missing node pool, the TPU taint...) rather than the symptom, so the
  Message says what to fix;
- pods the Job controller cannot create (the observation's ``refusal``: FailedCreate
  events on the Job, e.g. an admission webhook's denial) -> PodsRefused with the API
  server's words, ahead of any pending pod (they are the cause, not a symptom). The
  timeouts handler fails the task once a refusal that is not transient has lasted
  ``failed_create_grace_seconds``; pods created after all clear it (PodsPending,
  PodsRunning).

The edge cluster's node counts and diagnosis are read through the cluster's workers
(``engine/observed.py``): while an answer is awaited the observation is held in memory
(``ctx.held_observations``, unacknowledged, so a restart loses nothing) and folded at a
later tick, with the task's later observations behind it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.manifests import log_path
from falcon_es.domain.ports import (
    AWAITING, JOBSET_KIND, NOT_FOUND, JobObservation, PodObservation, PortError,
)
from falcon_es.engine.runtime import Tick
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.reservation_end import reservation_ended
from falcon_es.domain.spec import FLEX_START, FLEX_START_MAX_RUN_SECONDS, RESERVATION, autoscaled
from falcon_es.domain.task import TaskState

log = logging.getLogger("falcon_es.handlers.status")

PULL_BATCH = 1000
#: Pulls per tick at most, so one tick never starves the rest of the loop.
MAX_PULLS = 20
WAITING_FOR_NODE = f"{chart.PENDING}.{chart.PendingReason.WAITING_FOR_NODE}"
#: States in which a task's Job is observed: WaitingForNode only once its workload is
#: submitted (an autoscaled pool's pods waiting for nodes).
OBSERVED = frozenset({"Pending.Dispatching", WAITING_FOR_NODE, chart.RUNNING})
#: Waiting reasons of a container that will never start by itself.
IMAGE_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
OOM_EXIT_CODE = 137
#: How long a Job reported failed with no failed pod in view is held back, unacked,
#: waiting for the observation that carries the pod (an informer's Job and Pod watches
#: deliver independently, so the Job's Failed status can come first).
TORN_VIEW_GRACE = dt.timedelta(seconds=30)


def fold_observations(tick: Tick, ctx: HandlerContext) -> None:
    """Pull the edge events and turn each new observation into task events."""
    subscription = ctx.settings.bus.edge_events_subscription
    by_task: dict[str, list[tuple[str, JobObservation]]] = {}
    held = dict(ctx.held_observations)
    ctx.held_observations.clear()
    for message_id, observation in held.items():
        task_id = ctx.index.task_for_label(observation.task_id)
        by_task.setdefault(task_id, []).append((message_id, observation))
    for _ in range(MAX_PULLS):
        try:
            messages = ctx.ports.bus.pull(subscription, PULL_BATCH)
        except PortError as error:
            log.warning("pulling %s: %s", subscription, error)
            break
        for message in messages:
            try:
                observation = JobObservation.from_data(message.data)
            except (KeyError, TypeError, ValueError) as error:
                log.error("message %s on %s is not a Job observation (%s); dropped",
                          message.id, subscription, error)
                ctx.acks.append(message.id)
                ctx.edge_outcomes.append((str(message.attributes.get("cluster", "")),
                                          "malformed"))
                continue
            if message.id in held:
                continue  # redelivered while held: the held one stands for it
            task_id = ctx.index.task_for_label(observation.task_id)
            by_task.setdefault(task_id, []).append((message.id, observation))
        if len(messages) < PULL_BATCH:
            break
    for task_id, received in sorted(by_task.items()):
        received.sort(key=lambda pair: pair[1].resource_version)
        _fold_task(tick, ctx, task_id, received)


def _fold_task(tick: Tick, ctx: HandlerContext, task_id: str,
               received: Sequence[tuple[str, JobObservation]]) -> None:
    awaiting = False
    for message_id, observation in received:
        state = tick.state(task_id)
        cluster = observation.cluster_name
        if awaiting:
            ctx.held_observations[message_id] = observation  # behind the one held
            continue
        if (state is not None and state.state in OBSERVED and state.job.uid is None
                and state.state != WAITING_FOR_NODE):
            ctx.edge_outcomes.append((cluster, "held"))
            continue  # the submit's outcome is not folded yet: let it come back
        if (state is None or state.state not in OBSERVED
                or observation.job_uid != state.job.uid):
            ctx.acks.append(message_id)
            ctx.edge_outcomes.append((cluster, "unknown-task"))
            continue
        if observation.resource_version <= state.job.last_resource_version:
            ctx.acks.append(message_id)
            ctx.edge_outcomes.append((cluster, "stale"))
            continue
        if _torn_failure(ctx, state, observation):
            ctx.edge_outcomes.append((cluster, "held"))
            continue  # unacked: it comes back after the ack deadline, decided then
        try:
            events = _events_for(ctx, state, observation)
        except PortError as error:
            if error.code != AWAITING:
                raise
            awaiting = True
            ctx.held_observations[message_id] = observation
            ctx.edge_outcomes.append((cluster, "held"))
            continue
        ctx.acks.append(message_id)
        ctx.edge_outcomes.append((cluster, "applied"))
        for event in events:
            tick.emit(task_id, event)


def _torn_failure(ctx: HandlerContext, state: TaskState, observation: JobObservation) -> bool:
    """A Job failed with no failed pod in view yet, seen recently: wait for the pod's
    root cause instead of recording a failure without one."""
    if not _failed(state, observation) or any(
            p.phase == "Failed" and not p.disruption for p in observation.pods):
        return False
    return ctx.now - observation.observed_at < TORN_VIEW_GRACE


def _events_for(ctx: HandlerContext, state: TaskState,
                observation: JobObservation) -> list[ev.Event]:
    version = observation.resource_version
    if _failed(state, observation):
        pod = _failed_first([p for p in observation.pods if not p.disruption])
        cause, exit_code = _failure_cause(pod, observation)
        if observation.kind == JOBSET_KIND:
            cause += (f" (JobSet failed: {observation.condition_reason or 'Failed'} after "
                      f"{observation.restarts} restart(s))")
        pod_name = pod.name if pod is not None else ""
        return [ev.JobFailed(cause, exit_code, version, _log_file(ctx, state, pod_name))]
    disrupted = _disruption(ctx, state, observation)
    if disrupted:
        return disrupted
    stuck = _first(observation.pods, lambda p: p.phase == "Pending" and p.reason in IMAGE_FAILURES)
    if stuck is not None:
        cause = f"{stuck.reason}: {stuck.message}" if stuck.message else str(stuck.reason)
        return [ev.JobFailed(cause, None, version),
                ev.JobDeleteRequested(observation.job_name, "image pull failure")]
    if observation.condition == "Complete" or (
            observation.completions > 0 and observation.succeeded >= observation.completions):
        return [ev.JobSucceeded(observation.succeeded, version)]
    total = observation.completions
    running = sum(1 for p in observation.pods if p.phase == "Running")
    active = max(observation.active, running) if observation.pods else observation.active
    restarts = observation.restarts
    if state.status == chart.RUNNING:
        shown = state.message_event
        if isinstance(shown, ev.WorkloadDisrupted) and running < total:
            return []  # the disruption leads until the recreated pods all run
        shown_restarts = shown.restarts if isinstance(shown, ev.PodsRunning) else 0
        if active != state.job.pods_active or restarts != shown_restarts:
            return [ev.PodsRunning(active, total, version, restarts)]
        return []
    if total > 0 and running + observation.succeeded >= total:
        return [ev.PodsRunning(running, total, version, restarts)]
    refusal = observation.refusal
    if (refusal is None or refusal.transient) and any(
            p.phase == "Pending" for p in observation.pods):
        awaited = _nodes_awaited(ctx, state, observation)
        if awaited is not None:
            shown = state.message_event
            if isinstance(shown, ev.NodesAwaited) and dataclasses.replace(
                    shown, resource_version=version) == awaited:
                return []
            return [awaited]
    if refusal is not None and refusal.transient and observation.kind == JOBSET_KIND and any(
            p.phase == "Pending" for p in observation.pods):
        # Followers refused while their leader waits: the leader's cause leads.
        diagnosis = _diagnose(ctx, state, observation)
        shown = state.message_event
        if (isinstance(shown, ev.PodsPending) and shown.diagnosis == diagnosis
                and shown.followers_refused == refusal.message):
            return []
        return [ev.PodsPending(diagnosis, version, refusal.message)]
    if refusal is not None:
        shown = state.message_event
        if (isinstance(shown, ev.PodsRefused) and shown.message == refusal.message
                and shown.transient == refusal.transient):
            return []  # the controller's next attempt, refused in the same words
        return [ev.PodsRefused(observation.job_name, refusal.message, refusal.transient,
                               version)]
    if any(p.phase == "Pending" for p in observation.pods):
        diagnosis = _diagnose(ctx, state, observation)
        shown = state.message_event
        refused_before = isinstance(shown, ev.PodsPending) and bool(shown.followers_refused)
        if (diagnosis != state.job.pending_diagnosis or refused_before
                or state.state == WAITING_FOR_NODE):
            return [ev.PodsPending(diagnosis, version)]
    return []


def _nodes_awaited(ctx: HandlerContext, state: TaskState,
                   observation: JobObservation) -> ev.NodesAwaited | None:
    """Pods pending on an autoscaled pool that has fewer Ready nodes than the slices
    need: the wait for nodes (WaitingForNode), with the pool's registered and Ready
    counts and the edge cluster's diagnosis (the autoscaler's words first) as its
    cause; None when the pool is not autoscaled or its nodes are all there (then the
    pods wait for something else). The control plane was RUNNING when the workload was
    submitted; a pool broken since shows in the diagnosis."""
    cluster = next((c for c in ctx.clusters if c.id == state.placement.cluster_id), None)
    if cluster is None or not autoscaled(state.pool.supply_mode) or not state.node_pools:
        return None
    registered = ready = 0
    try:
        edge = ctx.ports.edges.for_cluster(cluster)
        for name in state.node_pools:
            counts = edge.node_counts(name)
            registered += counts.registered
            ready += counts.ready
    except PortError as error:
        if error.code == AWAITING:
            raise  # decided once the counts are in
        log.warning("nodes of pool %s: %s", state.pool.name, error)
        return None
    shape = state.shape
    expected = shape.hosts * state.slices
    if ready >= expected:
        return None
    cause = _diagnose(ctx, state, observation)
    refusal = observation.refusal
    if observation.kind == JOBSET_KIND and refusal is not None and refusal.transient:
        cause = f"{cause}; {refusal.message}"  # the JobSet trap, after the leader's cause
    return ev.NodesAwaited(state.pool.name or "", expected, registered, ready,
                           "RUNNING", cause, observation.resource_version)


def _failed(state: TaskState, observation: JobObservation) -> bool:
    """The workload has failed. A JobSet fails only by its Failed condition: a child
    Job's failed pod before that is one attempt, which the JobSet restarts. A Job fails
    by its condition, or at its first failed pod that no disruption killed (the pod
    failure policy ignores those) unless the spec names exit codes to retry (then the
    Job's ``backoffLimit`` decides, and its condition says so)."""
    if observation.condition == "Failed":
        return True
    if observation.kind == JOBSET_KIND or state.submission.spec.retry_exit_codes:
        return False
    disrupted = {p.name for p in observation.pods if p.disruption} | state.job.disrupted_pods
    return (observation.failed > len(disrupted)
            or any(p.phase == "Failed" and not p.disruption for p in observation.pods))


def _disruption(ctx: HandlerContext, state: TaskState,
                observation: JobObservation) -> list[ev.Event]:
    """Pods a disruption killed that no earlier observation showed: WorkloadDisrupted
    (the Job recreates them), or past the task's disruption budget JobFailed and the
    workload deleted, so a slice that cannot stay up does not hold its pool.

    One disruption is one episode: a slice's repair evicts every pod of it, and an
    informer may show them one observation at a time, so pods disrupted while the
    Message still says the last disruption (its pods not all running again) belong to
    that one, which the new event restates with every pod and node it took."""
    fresh = [p.name for p in observation.pods if p.phase == "Failed" and p.disruption
             and p.name not in state.job.disrupted_pods]
    if not fresh:
        return []
    shown = state.message_event
    ongoing = isinstance(shown, ev.WorkloadDisrupted)
    episode = (*shown.pods, *fresh) if isinstance(shown, ev.WorkloadDisrupted) else tuple(fresh)
    hit = [p for p in observation.pods if p.name in episode and p.disruption]
    nodes = sorted({p.node for p in hit if p.node}) or ["(unknown)"]
    node = nodes[0] + (f" (+{len(nodes) - 1} more)" if len(nodes) > 1 else "")
    cause = _node_end(ctx, state) + f"DisruptionTarget {hit[-1].disruption}"
    count = state.job.disruptions + (0 if ongoing else 1)
    budget = ctx.settings.lifecycle.disruption_budget
    if count > budget:
        words = (f"disrupted {count} times, more than the budget of {budget} "
                 f"(FALCON_DISRUPTION_BUDGET); last: {len(episode)} pod(s) killed on node "
                 f"{node} ({cause})")
        return [ev.JobFailed(words, None, observation.resource_version),
                ev.JobDeleteRequested(observation.job_name, "disruption budget spent")]
    return [ev.WorkloadDisrupted(episode, node, cause, count, observation.resource_version)]


def _node_end(ctx: HandlerContext, state: TaskState) -> str:
    """A flex-start node lives at most 7 days: a disruption on a pool old enough for its
    nodes to have reached that end is named as such (the pod's condition says only that
    its node went)."""
    if state.pool.supply_mode == RESERVATION:
        return _reservation_end(ctx, state)
    born = state.pool.requested_at or state.submission.submitted_at
    if state.pool.supply_mode != FLEX_START or born is None:
        return ""
    if (ctx.now - born).total_seconds() < FLEX_START_MAX_RUN_SECONDS:
        return ""
    return ("flex-start node at the end of its life (GKE deletes flex-start nodes after at "
            "most 7 days, their max run duration): ")


def _reservation_end(ctx: HandlerContext, state: TaskState) -> str:
    """A calendar-mode reservation's end deletes the VMs that consume it: a disruption
    of a pool made from a reservation that has ended, or that Compute no longer has, is
    named as such. Disruptions are rare: the reservation is read only then."""
    request = state.pool.request
    cluster = next((c for c in ctx.clusters if c.id == state.placement.cluster_id), None)
    if request is None or not request.reservation or cluster is None:
        return ""
    try:
        ends_at = ctx.ports.reservations.capacity(cluster, request.reservation).ends_at
    except PortError as error:
        if error.code == AWAITING:
            raise  # decided once the answer is in
        gone = error.code == NOT_FOUND
        return reservation_ended(request.reservation, cluster.name) if gone else ""
    if ends_at is None or ctx.now < ends_at:
        return ""
    return reservation_ended(request.reservation, cluster.name)


def _failure_cause(pod: PodObservation | None,
                   observation: JobObservation) -> tuple[str, int | None]:
    """The pod's root cause in the words an operator looks for."""
    if pod is None:
        return "Job failed (no failed pod was observed)", None
    if pod.reason == "OOMKilled":
        code = pod.exit_code if pod.exit_code is not None else OOM_EXIT_CODE
        return f"OOMKilled (exit code {code})", code
    if pod.reason in IMAGE_FAILURES:
        return (f"{pod.reason}: {pod.message}" if pod.message else str(pod.reason)), pod.exit_code
    if pod.exit_code is not None:
        detail = f": {pod.message}" if pod.message else ""
        return f"exit code {pod.exit_code}{detail}", pod.exit_code
    if pod.reason:
        return (f"{pod.reason}: {pod.message}" if pod.message else pod.reason), None
    return f"pod {pod.name} failed", None


def _diagnose(ctx: HandlerContext, state: TaskState, observation: JobObservation) -> str:
    """Root cause first: ask the edge cluster why the pods wait (it looks upstream:
    scheduling events, the node pool, capacity), fall back to the pod's own words."""
    cluster = next((c for c in ctx.clusters if c.id == state.placement.cluster_id), None)
    if cluster is not None:
        try:
            found = ctx.ports.edges.for_cluster(cluster).diagnose_pending(observation.job_name)
        except PortError as error:
            if error.code == AWAITING:
                raise  # decided once the diagnosis is in
            log.warning("diagnosing Job %s: %s", observation.job_name, error)
            found = None
        if found:
            return found
    pod = _first(observation.pods, lambda p: p.phase == "Pending")
    if pod is not None and pod.reason:
        return f"{pod.reason}: {pod.message}" if pod.message else pod.reason
    pending = sum(1 for p in observation.pods if p.phase == "Pending")
    return f"{pending} pod(s) pending"


def _log_file(ctx: HandlerContext, state: TaskState, pod_name: str) -> str:
    """Where the blamed pod's output went: its file in the cluster's bucket, when the
    task has a command (the log wrapper runs only then) and the pod is known."""
    cluster = next((c for c in ctx.clusters if c.id == state.placement.cluster_id), None)
    if not pod_name or cluster is None or not state.submission.spec.command:
        return ""
    return log_path(cluster.gcs_bucket, state.task_id, pod_name)


def _failed_first(pods: Sequence[PodObservation]) -> PodObservation | None:
    """The pod that failed first: by the time its container terminated, then in the
    informer's order (completion index). In a multi-host slice one pod's failure (an
    OOM) makes its siblings crash a moment later; the first is the root cause."""
    failed = [(position, pod) for position, pod in enumerate(pods) if pod.phase == "Failed"]
    if not failed:
        return None
    return min(failed, key=lambda item: (_finished(item[1]), item[0]))[1]


def _finished(pod: PodObservation) -> tuple[bool, dt.datetime]:
    """Sort key: pods with a (readable) termination time first, earliest first, in UTC."""
    try:
        moment = dt.datetime.fromisoformat(pod.finished_at or "")
    except ValueError:
        return (True, dt.datetime.min)
    return (False, moment.replace(tzinfo=None) - (moment.utcoffset() or dt.timedelta()))


def _first(pods: Sequence[PodObservation],
           accept: Callable[[PodObservation], bool]) -> PodObservation | None:
    return next((p for p in pods if accept(p)), None)


def ack_folded(ctx: HandlerContext, recorded: Sequence[RecordedEvent]) -> None:
    """After-commit step: acknowledge the messages the committed tick folded."""
    if not ctx.acks:
        return
    try:
        ctx.ports.bus.ack(ctx.settings.bus.edge_events_subscription, list(ctx.acks))
    except PortError as error:
        log.warning("acknowledging %d message(s): %s; they will be delivered again",
                    len(ctx.acks), error)
