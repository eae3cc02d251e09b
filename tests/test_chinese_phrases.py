"""Every phrase of the product's own is said in Chinese with ``--lang zh``: each Message
kind of the catalogue in each of its branches, each ``explain`` phrase, the product's
phrases an event recorded inside a cause, and ``explain`` on the simulated world. Only
the API's words (reasons, resource kinds, states, identifiers) and the words the event
quotes from the component that knew the cause stay as they were written."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pytest

from falcon_es.adapters.sim.config import StockoutConfig
from falcon_es.domain import events as ev
from falcon_es.domain.task import fold
from falcon_es.handlers.timeouts import _wait_cause
from falcon_es.projections import explain_words, messages
from falcon_es.projections.explain import Node, explain
from falcon_es.projections.messages import task_message
from tests.support.harness import Harness, Harnesses, flex_cluster, reserved_cluster
from tests.test_messages import (
    AT, CREATE, DISPATCHING, PROVISIONING, STARTED, SUBMIT, SUBMITTED, sample,
)

#: Words the APIs and their components write, kept as written in every language:
#: resource kinds and states, event reasons, API and component names, field names.
API_WORDS = frozenset(word.lower() for word in (
    "Job", "JobSet", "Pod", "GKE", "Kubernetes", "API", "server", "Compute", "RUNNING",
    "Ready", "webhook", "follower", "leader", "flex-start", "kube-scheduler",
    "FailedScheduling", "FailedCreate", "mpod.kb.io", "vpod.kb.io", "kubernetes-sigs", "jobset",
    "cloud.google.com", "gke-nodepool", "google.com", "tpu", "Insufficient", "TPU",
    "reservation_remaining_slices", "reservation_needed_slices", "FALCON_DISRUPTION_BUDGET",
    "falcon-es", "logs", "create_node_pool", "delete_node_pool", "create", "delete", "get",
    "reservation", "UTC", "x", "DisruptionTarget", "FailedScaleUp", "NotTriggerScaleUp",
    "JobCreationFailed",
))
#: Components named as their owners name them, ahead of their own words.
COMPONENTS = ("cluster autoscaler", "JobSet controller", "API server")
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*[A-Za-z0-9]|[A-Za-z]")
CJK = re.compile(r"[\u4e00-\u9fff]")


def words(text: str) -> set[str]:
    return {w.lower() for w in WORD.findall(text)}


def quoted_words(values: Iterable[Any]) -> set[str]:
    """The words of every string in ``values`` (nested lists and mappings too)."""
    found: set[str] = set()
    for value in values:
        if isinstance(value, str):
            found |= words(value)
        elif isinstance(value, Mapping):
            found |= quoted_words(value.values())
        elif isinstance(value, (list, tuple)):
            found |= quoted_words(value)
    return found


def untranslated(text: str, quoted: Iterable[Any] = ()) -> set[str]:
    """English words in ``text`` that neither an API writes nor the event quotes (a
    component's name counts as the API's)."""
    for name in COMPONENTS:
        text = text.replace(name, "")
    return words(text) - API_WORDS - quoted_words(quoted)


# ------------------------------------------------------------------ the catalogue


def _variants(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """An event's data, then with every optional branch a template has taken."""
    yield dict(data)
    yield {**data, "since": "2026-11-01T09:00:00", "followers_refused": "refused-x",
           "cause": "cause-x", "restarts": 2, "transient": True, "refused_seconds": 30,
           "pods_pending": "pending-x", "log_file": "gs://b/l-x", "slice_pools": ("p2-x",)}
    yield {**{k: None for k in data}, **{k: v for k, v in data.items()
                                          if not isinstance(v, (str, int, tuple))},
           **{k: v for k, v in data.items() if k in _NEEDED}}


#: Fields a template always reads (no branch without them).
_NEEDED = frozenset({"pool_name", "job_name", "step", "error", "cluster", "api", "cause",
                     "why", "tpu_type", "registered_tpu_types", "clusters", "topology",
                     "reservation", "remaining", "needed", "attempt", "ready", "total",
                     "phase", "status", "operation", "name", "actor", "old", "new",
                     "requester", "to_name", "to_effective", "effective", "from_cluster_name",
                     "to_cluster_name", "cluster_name", "cluster_status", "holder_reason",
                     "held_seconds", "supply_mode", "machine_type", "node_count", "expected",
                     "control_plane", "waited_seconds", "diagnosis", "message", "active",
                     "succeeded", "timeout_seconds", "for_task", "to_task", "from_task",
                     "node", "pods", "disruptions", "retry_in_seconds", "field", "detail",
                     "nodes", "reason", "registered", "to_supply_mode", "from_name"})


def _renders(key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    cls = ev.REGISTRY.get(key)
    if cls is not None:
        for args in _variants(sample(cls).to_data()):
            try:
                yield messages.render(key, args, "zh"), args
            except (KeyError, TypeError, AttributeError, ValueError):
                continue  # a combination no event writes
        return
    template = messages.ZH[key]
    assert not callable(template)
    args = {name: f"{name}-x" for _, name, _, _ in string.Formatter().parse(template) if name}
    yield messages.render(key, args, "zh"), args


@pytest.mark.parametrize("key", sorted(messages.EN))
def test_every_message_kind_says_the_products_words_in_chinese(key: str) -> None:
    rendered = list(_renders(key))
    assert rendered, key
    for text, args in rendered:
        assert not untranslated(text, args.values()), (key, text)


@pytest.mark.parametrize("key", sorted(explain_words.EN))
def test_every_explain_phrase_has_its_chinese_form(key: str) -> None:
    en, zh = explain_words.EN[key], explain_words.ZH[key]
    fields = {name for _, name, _, _ in string.Formatter().parse(en) if name}
    assert fields == {name for _, name, _, _ in string.Formatter().parse(zh) if name}, key
    text = explain_words.say(key, "zh", **{name: "" for name in fields})
    assert not untranslated(text), (key, text)


# ------------------------------------------------- phrases recorded inside a cause


def _timed_out(wait: ev.Event) -> str:
    """The NodePoolTimeout Message of a wait for nodes that showed ``wait`` last."""
    before = ((*PROVISIONING, CREATE, STARTED) if isinstance(wait, ev.NodesNotReady)
              else (*DISPATCHING, SUBMIT, SUBMITTED))
    events = [*before, wait]
    state = fold("t1", [(e, AT) for e in events])
    timed_out = ev.NodePoolTimedOut("pool-x", 600, _wait_cause(state))
    return messages.render("NodePoolTimedOut", timed_out.to_data(), "zh")


@pytest.mark.parametrize("wait", [
    ev.NodesAwaited("pool-x", 2, 1, 0, "RUNNING", "cluster autoscaler FailedScaleUp: "
                    "GCE out of resources", 7),
    ev.NodesAwaited("pool-x", 2, 0, 0, "RUNNING", "", 7),
    ev.NodesNotReady("pool-x", 1, 2, 3, 2),
    ev.NodesNotReady("pool-x", 1, 2, 3),
])
def test_the_node_counts_of_a_node_pool_timeout_are_in_chinese(wait: ev.Event) -> None:
    text = _timed_out(wait)
    quoted = ("pool-x", "cluster autoscaler FailedScaleUp: GCE out of resources")
    assert not untranslated(text, quoted), text
    assert "个已注册" in text or "Ready=1/2" in text


def test_a_spent_disruption_budget_and_a_jobsets_end_are_in_chinese() -> None:
    cause = ("disrupted 3 times, more than the budget of 2 (FALCON_DISRUPTION_BUDGET); last: "
             "2 pod(s) killed on node n-1 (+1 more) (flex-start node at the end of its life "
             "(GKE deletes flex-start nodes after at most 7 days, their max run duration): "
             "DisruptionTarget DeletionByPodGC)")
    text = messages.render("JobFailed", {"cause": cause, "log_file": "gs://b/x.log"}, "zh")
    assert not untranslated(text, ("n-1", "DeletionByPodGC", "gs://b/x.log")), text
    jobset = messages.render("JobFailed", {"cause": "Error (exit code 3) (JobSet failed: "
                                                    "FailedJobs after 2 restart(s))"}, "zh")
    assert jobset == "Error (exit code 3)（JobSet 失败：FailedJobs，已重启 2 次）"
    assert messages.render("JobFailed", {"cause": cause}, "en") == cause


@pytest.mark.parametrize("why", ["abort", "timeout", "pods refused", "nodes not ready",
                                 "image pull failure", "disruption budget spent"])
def test_why_a_job_is_deleted_is_in_chinese(why: str) -> None:
    text = messages.render("JobDeleteRequested", {"job_name": "j-x", "why": why}, "zh")
    assert not untranslated(text, ("j-x",)), text


# ------------------------------------------------------------ explain on the sim


def _links(node: Node) -> list[Node]:
    links = [node]
    while links[-1].children:
        links.append(links[-1].children[0])
    return links


def _explained_in_chinese(h: Harness, task_id: str) -> list[Node]:
    records = h.app.store.read_stream(task_id)
    state = fold(task_id, [(r.event, r.recorded_at) for r in records])
    # Event type names, Status and Reason are the log's and the job table's words.
    quoted = [*(r.event.to_data() for r in records), *(r.type_name for r in records),
              state.status, state.reason or ""]
    links = _links(explain(task_id, records, lang="zh"))
    for link in links:
        assert not untranslated(link.text, quoted), link.text
        assert not untranslated(link.source, quoted), link.source
        assert CJK.search(link.text + link.source) or not words(link.text) - API_WORDS, link
    message = task_message(state, "zh") or ""
    assert not untranslated(message, quoted), message
    return links


@pytest.mark.parametrize("spec", [
    {"sim": {"outcome": "oom", "duration_seconds": 30}},
    {"topology": "9x9"},
    {"sim": {"duration_seconds": 30}},
    {"sim": {"outcome": "unschedulable"}, "timeout_seconds": 300},
    {"topology": "4x4", "slices": 2, "sim": {"outcome": "unschedulable"},
     "timeout_seconds": 300},
])
def test_explain_says_every_ending_in_chinese(make: Harnesses, spec: dict[str, Any]) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", **spec)
    h.run()
    _explained_in_chinese(h, "t1")


def test_explain_says_the_flex_start_stockout_in_chinese(make: Harnesses) -> None:
    h = make(flex_cluster(stockout=StockoutConfig(probability=1.0, duration=None)))
    h.submit("t1", topology="4x4", slices=2)
    h.run(until=lambda: "follower" in (h.row("t1")["message"] or ""))
    h.run_for(600)
    links = _explained_in_chinese(h, "t1")
    assert links[-1].text == "任务状态为 Pending/WaitingForNode"
    assert any(link.text.startswith("cluster autoscaler FailedScaleUp") for link in links)


def test_explain_says_a_reservation_wait_in_chinese(make: Harnesses) -> None:
    h = make(reserved_cluster(count=8, in_use=4))
    h.submit("t1", topology="4x4", slices=2)
    h.run_for(30)
    (root, _) = _explained_in_chinese(h, "t1")
    assert root.text.startswith("预留 ") and root.source.startswith("日志：ReservationInsufficient")


def test_explain_says_a_queue_wait_in_chinese(make: Harnesses) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("first", sim={"duration_seconds": 5000})
    h.run_for(5)
    h.submit("second", actor="user-b")
    h.run_for(5)
    queue = {"cluster": "v6e-res", "topology": "2x2",
             "slot_holder": {"actor": "user-a", "name": "first", "status": "Pending",
                             "reason": "Provisioning"},
             "waiting": [{"task_id": "second", "position": 1, "message": "队列位置 #1，下一个"}]}
    links = _links(explain("second", h.app.store.read_stream("second"), queue, lang="zh"))
    quoted = ("v6e-res", "2x2", "user-a", "first", "Pending", "Provisioning", "Waiting")
    for link in links:
        assert not untranslated(link.text + " " + link.source, quoted), link
    assert [link.text for link in links] == [
        "队列 v6e-res/2x2 的资源槽被 user-a 的 first 占用（Pending/Provisioning）",
        "在 队列 v6e-res/2x2 中排第 1 位，共 1 个：队列位置 #1，下一个",
        "任务状态为 Pending/Waiting"]


# ----------------------------------------- the frames of the edge cluster's diagnosis


def _diagnosis_of_every_finding() -> tuple[list[str], list[str]]:
    """The gcp adapter's diagnoses of a Job whose pods show every kind of finding (the
    official client's objects; a diagnosis quotes at most three, so one a pod), and the
    words the API gave them (quoted as they are)."""
    from kubernetes import client

    from falcon_es.adapters.gcp.kube_diagnosis import diagnosis
    from falcon_es.domain.ports import NodeCounts

    def pod(name: str, index: str, status: client.V1PodStatus) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={
                "batch.kubernetes.io/job-completion-index": index}),
            spec=client.V1PodSpec(containers=[], node_selector={
                "cloud.google.com/gke-nodepool": "falcon-t1-2x2"}),
            status=status)

    scheduler = "0/4 nodes are available: 4 Insufficient google.com/tpu."
    scale_up = "Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources"
    pending = pod("falcon-t1-0-aaaaa", "0", client.V1PodStatus(phase="Pending", conditions=[
        client.V1PodCondition(type="PodScheduled", status="False", message=scheduler)]))
    pulling = pod("falcon-t1-1-bbbbb", "1", client.V1PodStatus(
        phase="Pending", container_statuses=[client.V1ContainerStatus(
            name="main", image="i", image_id="", ready=False, restart_count=3,
            state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(
                reason="CrashLoopBackOff", message="back-off restarting")),
            last_state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
                exit_code=2, reason="Error")))]))
    failed = pod("falcon-t1-2-ccccc", "2", client.V1PodStatus(
        phase="Failed", reason="Evicted", message="The node was low on resource: memory."))
    job = client.V1Job(metadata=client.V1ObjectMeta(name="falcon-t1"),
                       status=client.V1JobStatus(conditions=[client.V1JobCondition(
                           type="Failed", status="True", reason="BackoffLimitExceeded",
                           message="Job has reached the specified backoff limit")]))
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e"), reason="FailedScaleUp", message=scale_up,
        involved_object=client.V1ObjectReference(kind="Pod", name="falcon-t1-0-aaaaa"))
    found = [diagnosis(job, [one], [event], lambda _: NodeCounts(0, 0))
             for one in (pending, pulling, failed)]
    assert all(found)
    return [text for text in found if text], [scheduler, scale_up, "back-off restarting",
                   "The node was low on resource: memory.",
                   "Job has reached the specified backoff limit"]


def test_the_frames_of_a_diagnosis_are_said_in_chinese() -> None:
    """Each finding the gcp adapter writes (the pool's counts, the scheduler's refusal,
    a container that cannot start, a pod that failed) comes in the product's frame;
    ``--lang zh`` says the frames in Chinese and the API's words as they came."""
    from falcon_es.projections.recorded_phrases import in_language

    found, quoted = _diagnosis_of_every_finding()
    parts = [part for text in found for part in text.split("; ")]
    assert len(parts) == 8  # the autoscaler, the pool, the scheduler, the container's
    # wait and its last end, the failed pod, and the Job's Failed condition (twice)
    for part in parts:
        said = in_language(part, "zh")
        assert not untranslated(said, [*quoted, "falcon-t1-2x2", "falcon-t1-0-aaaaa",
                                       "falcon-t1-1-bbbbb", "falcon-t1-2-ccccc", "falcon-t1",
                                       "main", "CrashLoopBackOff", "Error", "Evicted",
                                       "BackoffLimitExceeded"]), said
    message = messages.render("PodsPending", {"diagnosis": found[0]}, "zh")
    assert message.startswith("Pod 等待中：cluster autoscaler FailedScaleUp: ")
