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
from falcon_es.domain.ports import JOBSET_CONTROLLER, is_jobset_cause
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.task import TaskState, fold
from falcon_es.projections.explain_words import COLON, say
from falcon_es.projections.messages import render as render_message
from falcon_es.projections.recorded_phrases import in_language

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
            row_findings: Sequence[RecordedEvent] = (), lang: str = "en") -> Node:
    """The tree for one task's events (its stream, in order); ``row_findings`` are the
    ``JobRowDiverged`` records of its job row, said after the task's own chain (its
    row deleted or reused while it ran, its spec changed after acceptance)."""
    state = fold(task_id, [(r.event, r.recorded_at) for r in records])
    chain = _chain(state, records, queue, lang)
    if live is not None:
        chain = [*_live_nodes(live, lang), *chain]
    chain.extend(_row_node(r, lang) for r in row_findings
                 if isinstance(r.event, ev.JobRowDiverged) and r.event.task_id == task_id)
    return _nested(chain)


def _row_node(record: RecordedEvent, lang: str) -> Node:
    event = record.event
    assert isinstance(event, ev.JobRowDiverged)
    return Node(say("job-row", lang, found=event.found, detail=event.detail),
                _log(record, lang), record.recorded_at)


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


def _log(record: RecordedEvent, lang: str) -> str:
    return say("source-log", lang, type_name=record.type_name, version=record.version)


def _disruptions(records: Sequence[RecordedEvent], lang: str) -> list[Node]:
    """Each disruption the task went through, oldest first: the condition and the node
    lead (the cause), and what followed is said as such, never as the workload's
    failure."""
    nodes = []
    for record in records:
        event = record.event
        if isinstance(event, ev.WorkloadDisrupted):
            nodes.append(Node(
                say("disruption", lang, disruptions=event.disruptions, count=len(event.pods),
                    node=in_language(event.node, lang), cause=in_language(event.cause, lang)),
                _log(record, lang),
                record.recorded_at))
    return nodes


def _outcome(state: TaskState, lang: str) -> Node:
    reason = f"/{state.reason}" if state.reason else ""
    return Node(say("outcome", lang, status=f"{state.status}{reason}"),
                say("source-job-table", lang), state.updated_at)


def _chain(state: TaskState, records: Sequence[RecordedEvent],
           queue: Mapping[str, Any] | None, lang: str) -> list[Node]:
    if not records:
        return [Node(say("no-events", lang, task_id=state.task_id), say("source-log-bare", lang))]
    status = state.status
    if status == chart.FAILED:
        return [*_failure(state, records, lang), _outcome(state, lang)]
    if status in (chart.ABORTED, chart.ABORTING):
        asked = _last(records, ev.AbortRequested)
        first = ([Node(say("abort", lang), _log(asked, lang), asked.recorded_at)]
                 if asked else [])
        return [*first, _outcome(state, lang)]
    if status == chart.SUCCEEDED:
        done = _last(records, ev.JobSucceeded)
        if done is None or not isinstance(done.event, ev.JobSucceeded):
            return [*_disruptions(records, lang), _outcome(state, lang)]
        return [*_disruptions(records, lang),
                Node(say("completed", lang, succeeded=done.event.succeeded),
                     _log(done, lang), done.recorded_at), _outcome(state, lang)]
    if status == chart.RUNNING:
        record = _last(records, ev.PodsRunning, ev.WorkloadDisrupted)
        if record is None or not isinstance(record.event, ev.PodsRunning):
            return [*_disruptions(records, lang), _outcome(state, lang)]
        running = record.event
        restarted = say("restarted", lang, restarts=running.restarts) if running.restarts else ""
        return [*_disruptions(records, lang),
                Node(say("running", lang, active=running.active, total=running.total)
                     + restarted, _log(record, lang), record.recorded_at),
                _outcome(state, lang)]
    return [*_waiting(state, records, queue, lang), _outcome(state, lang)]


def _failure(state: TaskState, records: Sequence[RecordedEvent], lang: str) -> list[Node]:
    last = _last(records, ev.TaskRejected, ev.NoMatchingCluster, ev.NodePoolFailed,
                 ev.NodePoolTimedOut, ev.JobSubmitFailed, ev.JobFailed, ev.TaskTimedOut)
    if last is None:
        return []
    event, source, at = last.event, _log(last, lang), last.recorded_at
    match event:
        case ev.TaskRejected():
            return [Node(say("invalid-spec", lang, field=event.field, detail=event.detail),
                         source, at)]
        case ev.NoMatchingCluster() if event.never_fit:
            return [Node(render_message("NoMatchingCluster", event.to_data(), lang), source, at)]
        case ev.NoMatchingCluster():
            return [Node(say("no-cluster", lang, tpu_type=state.submission.tpu_type), source, at)]
        case ev.NodePoolFailed() if event.reservation_gone:
            return [Node(f"Compute: {event.error}", source, at),
                    Node(render_message("NodePoolFailed", event.to_data(), lang), source, at)]
        case ev.NodePoolFailed():
            return [Node(f"GKE: {in_language(event.error, lang)}", source, at),
                    Node(say("pool-unusable", lang, pool_name=event.pool_name), source, at)]
        case ev.NodePoolTimedOut():
            wait = _last(records[:-1], ev.NodesNotReady, ev.NodesAwaited,
                         ev.NodePoolNotVisible, ev.ReservationInsufficient)
            return [*_wait_nodes(state, wait, lang),
                    Node(say("pool-not-ready", lang, pool_name=event.pool_name,
                             waited_seconds=event.waited_seconds), source, at)]
        case ev.JobSubmitFailed():
            if event.refused_seconds and is_jobset_cause(event.error):
                return [_jobset_node(event.error, event.job_name, at, lang),
                        Node(say("jobset-jobs-long", lang, job_name=event.job_name,
                                 refused_seconds=event.refused_seconds), source, at)]
            if event.refused_seconds:
                first = next((r for r in records if isinstance(r.event, ev.PodsRefused)), None)
                return [Node(say("pods-refused", lang, error=in_language(event.error, lang)),
                             _log(first, lang) if first else source,
                             first.recorded_at if first else at),
                        Node(say("pods-refused-long", lang, job_name=event.job_name,
                                 refused_seconds=event.refused_seconds), source, at)]
            return [Node(say("job-refused", lang, job_name=event.job_name,
                             error=in_language(event.error, lang)),
                         source, at)]
        case ev.JobFailed():
            cause, _, jobset = event.cause.partition(" (JobSet failed: ")
            if cause.startswith("disrupted "):  # the disruption budget spent
                return [*_disruptions(records, lang), Node(in_language(cause, lang), source, at)]
            nodes = [*_disruptions(records, lang),
                     Node(say("pod-failed", lang, cause=in_language(cause, lang)), source, at)]
            if event.log_file:
                nodes.append(Node(say("output", lang, log_file=event.log_file), source, at))
            if jobset:
                nodes.append(Node(say("jobset-failed", lang, words=jobset.rstrip(")")),
                                  source, at))
            return nodes
        case ev.TaskTimedOut():
            pending = _last(records, ev.PodsPending)
            upstream = _pending_nodes(pending, lang) if pending is not None else []
            return [*upstream, Node(say("timed-out", lang, timeout_seconds=event.timeout_seconds),
                                    source, at)]
    return []


def _waiting(state: TaskState, records: Sequence[RecordedEvent],
             queue: Mapping[str, Any] | None, lang: str) -> list[Node]:
    reason = state.reason
    if reason == chart.PendingReason.WAITING:
        return _queue_nodes(state, queue, lang)
    if reason == chart.PendingReason.DISPATCHING:
        last = _last(records, ev.PodsPending, ev.PodsRefused, ev.JobSubmitted,
                     ev.JobSubmitRequested)
        if last is not None and isinstance(last.event, ev.PodsPending):
            return _pending_nodes(last, lang)
        if (last is not None and isinstance(last.event, ev.PodsRefused)
                and is_jobset_cause(last.event.message)):
            return [_jobset_node(last.event.message, last.event.job_name, last.recorded_at,
                                 lang),
                    Node(say("jobset-jobs", lang, job_name=last.event.job_name),
                         _log(last, lang), last.recorded_at)]
        if last is not None and isinstance(last.event, ev.PodsRefused):
            return [Node(say("job-pods-refused", lang, job_name=last.event.job_name,
                             message=last.event.message), _log(last, lang), last.recorded_at)]
        return [Node(say("no-pod-yet", lang),
                     _log(last, lang) if last else say("source-log-bare", lang),
                     last.recorded_at if last else None)]
    wait = _last(records, ev.NodesNotReady, ev.NodesAwaited, ev.NodePoolNotVisible,
                 ev.ReservationInsufficient, ev.NodePoolCreateRequested,
                 ev.NodePoolCreateStarted)
    return _wait_nodes(state, wait, lang)


def _wait_nodes(state: TaskState, record: RecordedEvent | None, lang: str) -> list[Node]:
    if record is None:
        return []
    event, source, at = record.event, _log(record, lang), record.recorded_at
    match event:
        case ev.ReservationInsufficient():
            return [Node(say("reservation", lang, reservation=event.reservation,
                             remaining=event.remaining, topology=state.submission.topology,
                             needed=event.needed), source, at)]
        case ev.NodesNotReady():
            return [Node(say("nodes-ready", lang, ready=event.ready, total=event.total,
                             pools=", ".join(state.node_pools)), source, at)]
        case ev.NodesAwaited():
            # Each cause once (a multi-slice task's pools repeat the autoscaler's
            # word); a JobSet's refused followers as the trap they are.
            parts = dict.fromkeys(p.strip() for p in event.cause.split("; ") if p.strip())
            causes = [Node(in_language(part, lang), source, at) for part in parts
                      if not _refuses_followers(part)]
            for part in (p for p in parts if _refuses_followers(p)):
                causes.extend(_trap_nodes(part, at, lang))
            return [*causes, Node(
                say("nodes-awaited", lang, pool_name=event.pool_name,
                    control_plane=event.control_plane, registered=event.registered,
                    expected=event.expected, ready=event.ready), source, at)]
        case ev.NodePoolNotVisible():
            return [Node(say("not-visible", lang, pool_name=event.pool_name), source, at)]
        case ev.NodePoolCreateRequested() | ev.NodePoolCreateStarted():
            return [Node(say("creating", lang, pools=", ".join(state.node_pools)), source, at)]
    return []


def _jobset_node(cause: str, jobset: str, at: dt.datetime | None, lang: str) -> Node:
    """The JobSet controller's own refusal (an event on the JobSet): its words, the
    event's reason and the JobSet named as the source."""
    reason = cause[len(JOBSET_CONTROLLER):].strip().split(":", 1)[0]
    return Node(cause, say("source-jobset", lang, reason=reason, name=jobset), at)


def _pending_nodes(record: RecordedEvent, lang: str) -> list[Node]:
    """A pending diagnosis, split into its links (upstream causes first)."""
    event = record.event
    assert isinstance(event, ev.PodsPending)
    source, at = _log(record, lang), record.recorded_at
    parts = list(dict.fromkeys(p.strip() for p in event.diagnosis.split("; ") if p.strip()))
    nodes: list[Node] = []
    if TPU_SHORTAGE in event.diagnosis:
        nodes.append(Node(say("tpu-shortage", lang, shortage=TPU_SHORTAGE),
                          say("source-scheduler", lang), at))
    nodes.extend(Node(in_language(part, lang), source, at) for part in parts)
    if event.followers_refused:
        nodes.extend(_trap_nodes(event.followers_refused, at, lang))
    return nodes


def _followers_lack(refusal: str, lang: str) -> str:
    """What the followers lack, in the words of the refusal they got."""
    if FOLLOWER_NOT_SET in refusal:
        return say("followers-bare", lang)
    return say("followers-pool", lang)


def _refuses_followers(text: str) -> bool:
    """The JobSet webhook's refusal of a follower, in either of its wordings."""
    return FOLLOWER_NOT_SET in text or FOLLOWER_MISSING in text


def _trap_nodes(refusal: str, at: dt.datetime | None, lang: str) -> list[Node]:
    """The JobSet webhook trap, link by link, after the leader's own cause."""
    return [Node(say("trap-mutating", lang), say("source-webhook-order", lang), at),
            Node(_followers_lack(refusal, lang), say("source-webhook", lang), at),
            Node(say("trap-refusal", lang, refusal=refusal),
                 say("source-failed-create", lang), at)]


def _queue_nodes(state: TaskState, queue: Mapping[str, Any] | None, lang: str) -> list[Node]:
    source = say("source-queue", lang)
    if queue is None:
        return [Node(say("cluster-wait", lang, tpu_type=state.submission.tpu_type), source)]
    where = say("queue", lang, cluster=queue.get("cluster") or queue.get("cluster_id"),
                topology=queue.get("topology"))
    waiting = queue.get("waiting") or []
    mine = next((w for w in waiting if w.get("task_id") == state.task_id), None)
    nodes = []
    holder = queue.get("slot_holder")
    if holder:
        status = f"{holder.get('status')}{'/' + holder['reason'] if holder.get('reason') else ''}"
        nodes.append(Node(say("slot-held", lang, where=where, actor=holder.get("actor"),
                              name=holder.get("name"), status=status), source))
    if mine is not None:
        text = say("position", lang, position=mine["position"], waiting=len(waiting), where=where)
        told = mine.get("message")
        nodes.append(Node(f"{text}{COLON[lang]}{told}" if told else text, source))
    return nodes


def _live_nodes(live: LiveLook, lang: str) -> list[Node]:
    nodes = []
    if live.reservation:
        nodes.append(Node(say("live-reservation", lang, reservation=live.reservation),
                          say("source-live-compute", lang), live.at))
    for pool in live.pools:
        nodes.append(Node(say("live-pool", lang, pool=pool), say("source-live-gke", lang),
                          live.at))
    if live.workload:
        nodes.append(Node(say("live-pods", lang, workload=live.workload),
                          say("source-live-kubernetes", lang), live.at))
    return nodes
