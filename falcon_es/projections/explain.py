"""``falcon-es explain``: a task's causal chain as a tree, upstream root cause first.

Folded from the task's own stream (every fact says which event it came from and
when), with what the queue view says of a waiting task (its position, who holds its
queue's slot and in what state) and, when the caller has one, a live look at the edge
cluster and GKE (``LiveLook``). Each node is one link of the chain; its one child is
what it caused, down to the symptom the task shows, so the first line is the thing to
fix. Works for every Reason, and for tasks that are still waiting.

The JobSet webhook trap is spelled out link by link: too little TPU capacity leaves
the leader pod Pending, so JobSet's mutating pod webhook has no node to copy into the
followers' node selector, and its validating webhook, which checks the selector before
it checks the leader, refuses them with "follower pod node selector not set" or, for
pods with other selectors (Falcon's), "follower pod node selector for topology domain
not found. missing selector: cloud.google.com/gke-nodepool". The trap is shown in the
flex-start stockout too (WaitingForNode), where the pods wait for the autoscaler.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.task import TaskState, fold
from falcon_es.projections.messages import render as render_message

TPU_SHORTAGE = "Insufficient google.com/tpu"
#: The JobSet validating pod webhook's refusals of a follower created before its leader
#: is scheduled: with no node selector at all, and with selectors but not the topology
#: key's (Falcon's pods carry the accelerator and topology selectors).
FOLLOWER_NOT_SET = "follower pod node selector not set"
FOLLOWER_MISSING = "follower pod node selector for topology domain not found"


@dataclasses.dataclass(frozen=True)
class Node:
    """One link: what is the case, where that fact comes from, and when it was seen."""

    text: str
    source: str
    at: dt.datetime | None = None
    children: tuple[Node, ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source,
                "at": self.at.isoformat() if self.at else None,
                "children": [c.to_data() for c in self.children]}


@dataclasses.dataclass(frozen=True)
class LiveLook:
    """What the edge cluster and GKE say now (the gcp backend's look)."""

    workload: str | None = None  # the Job's or JobSet's pending diagnosis, if any
    pools: tuple[str, ...] = ()  # "<pool>: <status>, <ready>/<total> nodes Ready"
    reservation: str | None = None  # "<name>: N slice(s) free"
    at: dt.datetime | None = None


def explain(task_id: str, records: Sequence[RecordedEvent],
            queue: Mapping[str, Any] | None = None, live: LiveLook | None = None,
            row_findings: Sequence[RecordedEvent] = ()) -> Node:
    """The tree for one task's events (its stream, in order); ``row_findings`` are the
    ``JobRowDiverged`` records of its job row, said after the task's own chain (its
    row deleted or reused while it ran, its spec changed after acceptance)."""
    state = fold(task_id, [(r.event, r.recorded_at) for r in records])
    chain = _chain(state, records, queue)
    if live is not None:
        chain = [*_live_nodes(live), *chain]
    chain.extend(_row_node(r) for r in row_findings
                 if isinstance(r.event, ev.JobRowDiverged) and r.event.task_id == task_id)
    return _nested(chain)


def _row_node(record: RecordedEvent) -> Node:
    event = record.event
    assert isinstance(event, ev.JobRowDiverged)
    return Node(f"job row {event.found}: {event.detail}", _log(record), record.recorded_at)


def render(node: Node, depth: int = 0) -> list[str]:
    """The tree as text lines, each child indented under what caused it."""
    when = f" @ {node.at.isoformat(timespec='seconds')}" if node.at else ""
    prefix = "   " * (depth - 1) + "└─ " if depth else ""
    lines = [f"{prefix}{node.text}  [{node.source}{when}]"]
    for child in node.children:
        lines.extend(render(child, depth + 1))
    return lines


# ------------------------------------------------------------------------ chains

def _nested(chain: Sequence[Node]) -> Node:
    """Root first: each node's child is the next link."""
    tree: Node | None = None
    for node in reversed(chain):
        tree = dataclasses.replace(node, children=(tree,) if tree else ())
    assert tree is not None
    return tree


def _last(records: Sequence[RecordedEvent], *types: type[ev.Event]) -> RecordedEvent | None:
    return next((r for r in reversed(records) if isinstance(r.event, types)), None)


def _log(record: RecordedEvent) -> str:
    return f"log: {record.type_name} (version {record.version})"


def _disruptions(records: Sequence[RecordedEvent]) -> list[Node]:
    """Each disruption the task went through, oldest first: the condition and the node
    lead (the cause), and what followed is said as such, never as the workload's
    failure."""
    nodes = []
    for record in records:
        event = record.event
        if isinstance(event, ev.WorkloadDisrupted):
            nodes.append(Node(
                f"disruption {event.disruptions}: {len(event.pods)} pod(s) killed on node "
                f"{event.node} ({event.cause}); not the workload's failure: the Job's pod "
                "failure policy ignores it and recreates the pods", _log(record),
                record.recorded_at))
    return nodes


def _outcome(state: TaskState) -> Node:
    reason = f"/{state.reason}" if state.reason else ""
    return Node(f"task is {state.status}{reason}", "job table", state.updated_at)


def _chain(state: TaskState, records: Sequence[RecordedEvent],
           queue: Mapping[str, Any] | None) -> list[Node]:
    if not records:
        return [Node(f"task {state.task_id} has no events in the log yet: the controller has "
                     "not taken it in", "log")]
    status, reason = state.status, state.reason
    if status == chart.FAILED:
        return [*_failure(state, records), _outcome(state)]
    if status in (chart.ABORTED, chart.ABORTING):
        asked = _last(records, ev.AbortRequested)
        first = ([Node("abort requested by the upper layer", _log(asked), asked.recorded_at)]
                 if asked else [])
        return [*first, _outcome(state)]
    if status == chart.SUCCEEDED:
        done = _last(records, ev.JobSucceeded)
        if done is None or not isinstance(done.event, ev.JobSucceeded):
            return [*_disruptions(records), _outcome(state)]
        return [*_disruptions(records),
                Node(f"every pod completed ({done.event.succeeded})", _log(done),
                     done.recorded_at), _outcome(state)]
    if status == chart.RUNNING:
        record = _last(records, ev.PodsRunning, ev.WorkloadDisrupted)
        if record is None or not isinstance(record.event, ev.PodsRunning):
            return [*_disruptions(records), _outcome(state)]
        running = record.event
        restarted = f", JobSet restarted {running.restarts} time(s)" if running.restarts else ""
        return [*_disruptions(records),
                Node(f"{running.active}/{running.total} pods running{restarted}", _log(record),
                     record.recorded_at), _outcome(state)]
    return [*_waiting(state, records, queue), _outcome(state)]


def _failure(state: TaskState, records: Sequence[RecordedEvent]) -> list[Node]:
    last = _last(records, ev.TaskRejected, ev.NoMatchingCluster, ev.NodePoolFailed,
                 ev.NodePoolTimedOut, ev.JobSubmitFailed, ev.JobFailed, ev.TaskTimedOut)
    if last is None:
        return []
    event, source, at = last.event, _log(last), last.recorded_at
    match event:
        case ev.TaskRejected():
            return [Node(f"invalid task spec: {event.field}: {event.detail}", source, at)]
        case ev.NoMatchingCluster() if event.never_fit:
            return [Node(render_message("NoMatchingCluster", event.to_data()), source, at)]
        case ev.NoMatchingCluster():
            return [Node(f"no active cluster offers {state.submission.tpu_type}", source, at)]
        case ev.NodePoolFailed() if event.reservation_gone:
            return [Node(f"Compute: {event.error}", source, at),
                    Node(render_message("NodePoolFailed", event.to_data()), source, at)]
        case ev.NodePoolFailed():
            return [Node(f"GKE: {event.error}", source, at),
                    Node(f"node pool {event.pool_name} cannot be used", source, at)]
        case ev.NodePoolTimedOut():
            wait = _last(records[:-1], ev.NodesNotReady, ev.NodesAwaited,
                         ev.NodePoolNotVisible, ev.ReservationInsufficient)
            return [*_wait_nodes(state, wait),
                    Node(f"node pool {event.pool_name} not ready after {event.waited_seconds}s",
                         source, at)]
        case ev.JobSubmitFailed():
            if event.refused_seconds:
                first = next((r for r in records if isinstance(r.event, ev.PodsRefused)), None)
                return [Node(f"the API server refuses the pods: {event.error}",
                             _log(first) if first else source,
                             first.recorded_at if first else at),
                        Node(f"pods of {event.job_name} refused for {event.refused_seconds}s "
                             "(past the grace)", source, at)]
            return [Node(f"the Kubernetes API refused {event.job_name}: {event.error}",
                         source, at)]
        case ev.JobFailed():
            cause, _, jobset = event.cause.partition(" (JobSet failed: ")
            if cause.startswith("disrupted "):  # the disruption budget spent
                return [*_disruptions(records), Node(cause, source, at)]
            nodes = [*_disruptions(records), Node(f"pod failed: {cause}", source, at)]
            if event.log_file:
                nodes.append(Node(f"its output: {event.log_file} (falcon-es logs)", source, at))
            if jobset:
                nodes.append(Node(f"JobSet failed: {jobset.rstrip(')')}", source, at))
            return nodes
        case ev.TaskTimedOut():
            pending = _last(records, ev.PodsPending)
            upstream = _pending_nodes(pending) if pending is not None else []
            return [*upstream, Node(f"timed out after {event.timeout_seconds}s", source, at)]
    return []


def _waiting(state: TaskState, records: Sequence[RecordedEvent],
             queue: Mapping[str, Any] | None) -> list[Node]:
    reason = state.reason
    if reason == chart.PendingReason.WAITING:
        return _queue_nodes(state, queue)
    if reason == chart.PendingReason.DISPATCHING:
        last = _last(records, ev.PodsPending, ev.PodsRefused, ev.JobSubmitted,
                     ev.JobSubmitRequested)
        if last is not None and isinstance(last.event, ev.PodsPending):
            return _pending_nodes(last)
        if last is not None and isinstance(last.event, ev.PodsRefused):
            return [Node(f"the API server refuses the pods of {last.event.job_name}: "
                         f"{last.event.message}", _log(last), last.recorded_at)]
        return [Node("workload submitted; no pod observed yet",
                     _log(last) if last else "log", last.recorded_at if last else None)]
    wait = _last(records, ev.NodesNotReady, ev.NodesAwaited, ev.NodePoolNotVisible,
                 ev.ReservationInsufficient, ev.NodePoolCreateRequested,
                 ev.NodePoolCreateStarted)
    return _wait_nodes(state, wait)


def _wait_nodes(state: TaskState, record: RecordedEvent | None) -> list[Node]:
    if record is None:
        return []
    event, source, at = record.event, _log(record), record.recorded_at
    match event:
        case ev.ReservationInsufficient():
            return [Node(f"reservation {event.reservation} has {event.remaining} slice(s) of "
                         f"{state.submission.topology} free, {event.needed} needed "
                         f"(reservation_remaining_slices={event.remaining} "
                         f"reservation_needed_slices={event.needed})", source, at)]
        case ev.NodesNotReady():
            return [Node(f"{event.ready}/{event.total} nodes Ready in "
                         f"{', '.join(state.node_pools)}", source, at)]
        case ev.NodesAwaited():
            # Each cause once (a multi-slice task's pools repeat the autoscaler's
            # word); a JobSet's refused followers as the trap they are.
            parts = dict.fromkeys(p.strip() for p in event.cause.split("; ") if p.strip())
            causes = [Node(part, source, at) for part in parts if not _refuses_followers(part)]
            for part in (p for p in parts if _refuses_followers(p)):
                causes.extend(_trap_nodes(part, at))
            return [*causes, Node(
                f"node pool {event.pool_name} control-plane {event.control_plane} but "
                f"{event.registered}/{event.expected} expected node(s) registered "
                f"(Ready={event.ready}); the workload waits for the cluster autoscaler",
                source, at)]
        case ev.NodePoolNotVisible():
            return [Node(f"node pool {event.pool_name} not visible yet after its create",
                         source, at)]
        case ev.NodePoolCreateRequested() | ev.NodePoolCreateStarted():
            return [Node(f"GKE is creating {', '.join(state.node_pools)}", source, at)]
    return []


def _pending_nodes(record: RecordedEvent) -> list[Node]:
    """A pending diagnosis, split into its links (upstream causes first)."""
    event = record.event
    assert isinstance(event, ev.PodsPending)
    source, at = _log(record), record.recorded_at
    parts = list(dict.fromkeys(p.strip() for p in event.diagnosis.split("; ") if p.strip()))
    nodes: list[Node] = []
    if TPU_SHORTAGE in event.diagnosis:
        nodes.append(Node(f"too little TPU capacity for the pod ({TPU_SHORTAGE})",
                          "edge: FailedScheduling (kube-scheduler)", at))
    nodes.extend(Node(part, source, at) for part in parts)
    if event.followers_refused:
        nodes.extend(_trap_nodes(event.followers_refused, at))
    return nodes


def _followers_lack(refusal: str) -> str:
    """What the followers lack, in the words of the refusal they got."""
    if FOLLOWER_NOT_SET in refusal:
        return "the follower pods have no node selector"
    return ("the follower pods have no node selector on the leader's node pool "
            "(cloud.google.com/gke-nodepool)")


def _refuses_followers(text: str) -> bool:
    """The JobSet webhook's refusal of a follower, in either of its wordings."""
    return FOLLOWER_NOT_SET in text or FOLLOWER_MISSING in text


def _trap_nodes(refusal: str, at: dt.datetime | None) -> list[Node]:
    """The JobSet webhook trap, link by link, after the leader's own cause."""
    return [Node("JobSet's mutating pod webhook (mpod.kb.io) finds no node for the leader, "
                 "so it leaves the followers without a node selector on its pool",
                 "JobSet pod webhook order (kubernetes-sigs/jobset#1187)", at),
            Node(_followers_lack(refusal), "JobSet pod webhook", at),
            Node(f"its validating webhook (vpod.kb.io) refuses them: {refusal}",
                 "edge: FailedCreate on the child Job", at)]


def _queue_nodes(state: TaskState, queue: Mapping[str, Any] | None) -> list[Node]:
    if queue is None:
        return [Node(f"waiting for a cluster of {state.submission.tpu_type}", "queue view")]
    where = f"queue {queue.get('cluster') or queue.get('cluster_id')}/{queue.get('topology')}"
    waiting = queue.get("waiting") or []
    mine = next((w for w in waiting if w.get("task_id") == state.task_id), None)
    nodes = []
    holder = queue.get("slot_holder")
    if holder:
        nodes.append(Node(f"the slot of {where} is held by {holder.get('actor')}: "
                          f"{holder.get('name')} ({holder.get('status')}"
                          f"{'/' + holder['reason'] if holder.get('reason') else ''})",
                          "queue view"))
    if mine is not None:
        nodes.append(Node(f"position #{mine['position']} of {len(waiting)} in {where}: "
                          f"{mine.get('message') or ''}".rstrip(": "), "queue view"))
    return nodes


def _live_nodes(live: LiveLook) -> list[Node]:
    nodes = []
    if live.reservation:
        nodes.append(Node(f"reservation now: {live.reservation}", "live: Compute", live.at))
    for pool in live.pools:
        nodes.append(Node(f"node pool now: {pool}", "live: GKE", live.at))
    if live.workload:
        nodes.append(Node(f"pods now: {live.workload}", "live: Kubernetes API", live.at))
    return nodes
