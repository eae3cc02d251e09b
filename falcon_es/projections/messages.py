"""The message catalog: human-readable Messages rendered from structured event data.

Messages are never stored in events, only their arguments, so wording and language
(``FALCON_LANG=en|zh``) can change and the job table be rebuilt by replay.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from falcon_es.domain import chart
from falcon_es.domain.intents import JobIntent, PoolDisposition, PoolIntent
from falcon_es.domain.reservation_end import RESERVATION_ENDING
from falcon_es.domain.ports import is_jobset_cause
from falcon_es.domain.spec import INVALID_COLUMN
from falcon_es.domain.task import TaskState
from falcon_es.projections.recorded_phrases import in_language, why
from falcon_es.storage.tables import MessageRoom

Args = Mapping[str, Any]
Template = str | Callable[[Args], str]

#: How many tasks ahead a waiting Message names before it says "and N more".
AHEAD_NAMED = 3


def _clusters(args: Args, ending: str = "{name} (reservation {reservation} ends at {ends_at}, "
              "before a run of up to {timeout_seconds}s would)") -> str:
    """Each cluster and its status; one whose reservation ends too soon for the task
    says when (``ending``, in the Message's language)."""
    return ", ".join(ending.format(**c) if c.get("ends_at") else f"{c['name']} ({c['status']})"
                       for c in args["clusters"])


def _never_fit(args: Args, needs: str, holds: str, joiner: str, anything: str) -> str:
    """A request no cluster's reservation can ever serve: what it needs, then what each
    reservation holds (its machine type, and its VMs where known)."""
    def side(data: Args) -> dict[str, Any]:
        """One side's words; what it does not say is shown as unknown."""
        return {name: "?" if data.get(name) is None else data[name]
                for name in ("reservation", "cluster", "topology", "vms", "machine_type")}

    held = joiner.join(holds.format(**{**side(u), "machine_type": u.get("machine_type") or anything})
                       for u in args["never_fit"])
    return needs.format(**{**side(args.get("needs") or {}), "tpu_type": args["tpu_type"]}) + held


def _types(args: Args) -> str:
    return ", ".join(args["registered_tpu_types"]) or "-"


def _exit(log: str, lang: str) -> Callable[[Args], str]:
    """The pod's root cause (the product's recorded phrases in it in ``lang``), then
    where its output is (when the task wrote there)."""
    def render(args: Args) -> str:
        cause = in_language(args["cause"], lang)
        return cause + log.format(**args) if args.get("log_file") else cause
    return render


def _recorded(template: Template, lang: str, *fields: str) -> Callable[[Args], str]:
    """A template whose ``fields`` may hold a phrase of the product recorded in the
    event (node counts, a node's end, the frames of a diagnosis), said in ``lang``."""
    def render(args: Args) -> str:
        said = {**args, **{f: in_language(str(args.get(f) or ""), lang) for f in fields
                           if f in args}}
        return template(said) if callable(template) else template.format(**said)
    return render


def _why(words: str, lang: str) -> Callable[[Args], str]:
    """A Job's delete, with why in ``lang``."""
    return lambda args: words.format(**{**args, "why": why(args["why"], lang)})


def _timed_out(done: str, pending: str) -> Callable[[Args], str]:
    def render(args: Args) -> str:
        text = done.format(**args)
        if args.get("pods_pending"):
            text += pending.format(**args)
        return text
    return render


def _rejected(spec: str, column: str) -> Callable[[Args], str]:
    """A rejected task: its spec was invalid, or a column of its row unreadable."""
    def render(args: Args) -> str:
        return (column if args.get("reason") == INVALID_COLUMN else spec).format(**args)
    return render


#: The API call behind each retried step (``ApiCallRetrying.step``), named as the
#: API's own reference does, so the same in every language.
CALLS: Mapping[str, str] = MappingProxyType({
    "pool-create": "GKE create_node_pool",
    "pool-delete": "GKE delete_node_pool",
    "job-submit": "Kubernetes create Job",
    "job-delete": "Kubernetes delete Job",
    "reservation-check": "Compute get reservation",
})


def _retrying(limited: str, unlimited: str) -> Callable[[Args], str]:
    """A retried call: 'attempt 3 of 12' while it may be given up, 'attempt 3' for a
    step retried until it succeeds (a delete)."""
    def render(args: Args) -> str:
        template = unlimited if args.get("attempts") is None else limited
        return template.format(call=CALLS.get(args["step"], args["step"]), **args)
    return render


#: The APIs a cluster's calls go to, named as their owners name them.
API_NAMES: Mapping[str, str] = MappingProxyType({
    "kubernetes": "Kubernetes", "gke": "GKE", "compute": "Compute"})


def _unanswered(edge: str, cloud: str, again: str) -> Callable[[Args], str]:
    """A cluster's API that does not answer: the edge cluster's own Kubernetes API, or
    a Google API on the cluster's behalf; ``since`` absent: it answers again."""
    def render(args: Args) -> str:
        api = API_NAMES.get(args["api"], args["api"])
        if not args.get("since"):
            return again.format(api=api, **{k: v for k, v in args.items() if k != "api"})
        since = clock_time(dt.datetime.fromisoformat(args["since"]))
        template = edge if args["api"] == "kubernetes" else cloud
        return template.format(cluster=args["cluster"], api=api, since=since,
                               error=args.get("error", ""))
    return render


def _submit_failed(created: str, refused: str, jobset: str) -> Callable[[Args], str]:
    """A Job the API refused, or one created whose pods were refused past the grace
    (a JobSet whose controller could not create its Jobs: its words lead)."""
    def render(args: Args) -> str:
        if not args.get("refused_seconds"):
            return created.format(**args)
        return (jobset if is_jobset_cause(args["error"]) else refused).format(**args)
    return render


def _with_followers(words: str, followers: str) -> Callable[[Args], str]:
    """Pending pods; a JobSet's refused followers come after the leader's cause."""
    def render(args: Args) -> str:
        tail = followers.format(**args) if args.get("followers_refused") else ""
        return words.format(**args) + tail
    return render


def _restarted(words: str, restarts: str) -> Callable[[Args], str]:
    """Running pods; a JobSet that restarted says how often."""
    def render(args: Args) -> str:
        return words.format(**args) + (restarts.format(**args) if args.get("restarts") else "")
    return render


def _disrupted(words: str) -> Callable[[Args], str]:
    """A disruption: how many pods, the node, the condition's words first."""
    def render(args: Args) -> str:
        return words.format(count=len(args.get("pods") or ()), **args)
    return render


def _refused(words: str, transient: str, jobset: str) -> Callable[[Args], str]:
    """Pods the Job controller cannot create; a transient refusal says it will wait. A
    JobSet whose own controller cannot create its Jobs leads with that controller's
    words."""
    def render(args: Args) -> str:
        if is_jobset_cause(args["message"]):
            return jobset.format(**args)
        return words.format(**args) + (transient if args.get("transient") else "")
    return render


def _nodes_not_ready(counted: str, bare: str, since: str) -> Callable[[Args], str]:
    """A fixed-size pool's nodes: registered and Ready counts where the event has them,
    and since when the task waits for them (``_since``)."""
    def render(args: Args) -> str:
        words = bare if args.get("registered") is None else counted
        return _since(words, since)(args)
    return render


def _cause_first(words: str, cause: str) -> Callable[[Args], str]:
    """The wait's cause (the autoscaler's words) ahead of the counts it explains."""
    def render(args: Args) -> str:
        text = words.format(**args)
        return cause.format(**args) + text if args.get("cause") else text
    return render


def _since(words: str, since: str) -> Callable[[Args], str]:
    """A wait's try: since when the task waits, where the row's renderer knows it (a
    try that found nothing new appends no event, so the count is the last recorded
    one and the moment says how long the wait has lasted)."""
    def render(args: Args) -> str:
        return words.format(**args) + (since.format(**args) if args.get("since") else "")
    return render


def _group(one: str, many: str) -> Callable[[Args], str]:
    """A pool's fate; a multi-slice task's group names every pool (``pools``)."""
    def render(args: Args) -> str:
        others = args.get("slice_pools") or ()
        if not others:
            return one.format(**args)
        return many.format(pools=", ".join((args["pool_name"], *others)), **args)
    return render


EN: Mapping[str, Template] = MappingProxyType({
    "TaskAccepted": "accepted; choosing a cluster for {tpu_type} {topology}",
    "TaskRejected": _rejected("invalid task spec: {field}: {detail}",
                              "unreadable job row: column {field}: {detail}"),
    "RowRefused": "job row not taken in: {field}: {detail}",
    "NoMatchingCluster": lambda a: (
        _never_fit(a, "no {tpu_type} cluster's reservation can ever serve {topology}, which "
                      "needs {vms} VM(s) of {machine_type}: ",
                   "reservation {reservation} of {cluster} holds {vms} VM(s) of {machine_type}",
                   "; ", "any machine type")
        if a.get("never_fit") else
        f"supply mode {a['supply_mode']} was asked for, but no {a['tpu_type']} cluster has "
        f"a reservation ({', '.join(a['without_reservation'])})"
        if a.get("supply_mode") else
        f"no cluster serves TPU type {a['tpu_type']}; registered TPU types: {_types(a)}"
    ),
    "NoActiveCluster": lambda a: (
        f"waiting for an active {a['tpu_type']} cluster: {_clusters(a)}"
    ),
    "ClusterChosen": "queued on {cluster_name} ({topology})",
    "TaskRequeued": lambda a: (
        f"the reservation of cluster {a['from_cluster_name']} ends before this task's timeout "
        "could; re-queued" if a["cluster_status"] == RESERVATION_ENDING else
        f"cluster {a['from_cluster_name']} is {a['cluster_status']}; re-queued"),
    "TaskPicked": "provisioning on {topology}",
    "TaskMoved": (
        "moved from {from_cluster_name} (its slot {holder_reason} for {held_seconds}s) "
        "to {to_cluster_name}"),
    "SlotYielded": "slot yielded to {to_name} (priority {to_effective} over {effective})",
    "SlotLent": (
        "slot lent to {to_name} ({to_supply_mode}) while reservation {reservation} is full, "
        "taken back the moment the reservation has room"),
    "SlotBorrowed": lambda a: (
        f"provisioning on {a['topology']} on the slot lent by {a['from_name']}, which waits "
        f"for reservation {a['reservation']} ({a['supply_mode']} does not use it"
        + (f"; {a['passed_over_count']} task(s) waiting for it passed over)"
           if a["passed_over_count"] else ")")),
    "PriorityChanged": "priority changed from {old} to {new} by {requester}",
    "ReservationInsufficient": _since(
        "reservation {reservation} has {remaining} slice(s) free, {needed} needed "
        "(reservation_remaining_slices={remaining} reservation_needed_slices={needed}); "
        "retry {attempt}", ", waiting since {since}"),
    "NodePoolReused": "reusing node pool {pool_name}",
    "NodePoolTaken": "took node pool {pool_name} of {from_task} for one slice",
    "NodePoolCreateRequested": (
        "creating node pool {pool_name} ({supply_mode}, {node_count} x {machine_type})"
    ),
    "NodePoolCreateStarted": "creating node pool {pool_name} (operation {operation})",
    "NodePoolNotVisible": "node pool {pool_name} not visible yet; looking again (attempt {attempt})",
    "NodesNotReady": _nodes_not_ready(
        "node pool {pool_name} control-plane RUNNING but {registered}/{total} expected "
        "node(s) registered (Ready={ready}); attempt {attempt}",
        "node pool {pool_name}: {ready}/{total} nodes ready (attempt {attempt})",
        ", waiting since {since}"),
    "NodesAwaited": _cause_first(
        "node pool {pool_name} control-plane {control_plane} but {registered}/{expected} "
        "expected node(s) registered (Ready={ready}); the workload is submitted and waits "
        "for the cluster autoscaler", "{cause}; "),
    "NodeWaitExtended": (
        "node pool {pool_name} kept after {waited_seconds}s without nodes: no task of "
        "another topology waits on this cluster, so GKE keeps trying until a node is "
        "Ready or the task is aborted"),
    "NodePoolReady": "node pool {pool_name} ready ({nodes} nodes)",
    "NodePoolFailed": _recorded(lambda a: (
        f"reservation {a['reservation_gone']} of cluster {a['cluster_name']} is gone (Compute "
        f"has no such reservation; it deletes a calendar-mode one at its end): {a['error']}"
        if a.get("reservation_gone") else f"node pool {a['pool_name']} failed: {a['error']}"),
        "en", "error"),
    "NodePoolTimedOut": _cause_first("node pool {pool_name} not ready after {waited_seconds}s",
                                     "{cause}; "),
    "JobSubmitRequested": "submitting Job {job_name}",
    "JobSubmitted": "Job {job_name} submitted; waiting for pods",
    "JobSubmitFailed": _submit_failed("Job {job_name} could not be submitted: {error}",
                                      "pods of Job {job_name} refused for "
                                      "{refused_seconds}s: {error}; Job deleted",
                                      "{error}; JobSet {job_name} could not create its Jobs "
                                      "for {refused_seconds}s; JobSet deleted"),
    "JobSubmitCancelled": "Job {job_name} not submitted: the task is being aborted",
    "PodsPending": _with_followers("pods pending: {diagnosis}",
                                   "; until it is scheduled the JobSet webhook refuses its "
                                   "followers (expected, transient): {followers_refused}"),
    "PodsRefused": _refused("pods of Job {job_name} cannot be created: {message}",
                            " (expected to clear; waiting)",
                            "{message}; JobSet {job_name} cannot create its Jobs"),
    "PodsRunning": _restarted("{active}/{total} active", " (JobSet restarted {restarts} time(s))"),
    "WorkloadDisrupted": _disrupted(
        "disrupted: {count} pod(s) killed on node {node} ({cause}); not the workload's "
        "failure: the Job recreates them (disruption {disruptions} of this task)"),
    "JobSucceeded": "succeeded ({succeeded} pod(s))",
    "JobFailed": _exit("; log: {log_file}", "en"),
    "TaskTimedOut": _timed_out("timed out after {timeout_seconds}s; Job deleted",
                               " (pods were pending: {pods_pending})"),
    "JobDeleteRequested": _why("deleting Job {job_name} ({why})", "en"),
    "JobDeleted": "Job {job_name} deleted",
    "AbortRequested": "abort requested while {phase}",
    "AbortIgnored": "abort ignored: the task had already {status}",
    "TaskAborted": "aborted while {phase}",
    "NodePoolRetained": "node pool {pool_name} handed over to {for_task}",
    "NodePoolHandedOver": "node pool {pool_name} handed over to {to_task}",
    "NodePoolDeleteRequested": _group("deleting node pool {pool_name}",
                                      "deleting node pools {pools}"),
    "NodePoolDeleted": _group("node pool {pool_name} deleted", "node pools {pools} deleted"),
    "NodePoolDeleteFailed": _since(
        "deleting node pool {pool_name} failed (attempt {attempt}): {error}",
        ", failing since {since}"),
    "ApiCallRetrying": _retrying(
        "{call} failed ({error}), attempt {attempt} of {attempts}, next in {retry_in_seconds}s",
        "{call} failed ({error}), attempt {attempt}, next in {retry_in_seconds}s"),
    "ClusterApiUnanswered": _unanswered(
        "edge cluster {cluster}'s Kubernetes API has not answered since {since}: {error}",
        "the {api} API has not answered for cluster {cluster} since {since}: {error}",
        "cluster {cluster}'s {api} API answers again"),
    "position": "#{position}, {ahead} ahead{names}",
    "position-first": "#1, next in line",
    "more": "{count} more",
    "wait-holder": "slot held by {holder} ({reason} since {since})",
    "wait-reservation": "reservation {reservation} full: {remaining} slice(s) free, {needed} needed",
    "wait-lent": "slot lent to {borrower} (another supply mode) until its pods run",
    "wait-expected": "expected start ~{at} (likely {span})",
    "aborting-waits": "waiting for {waits}",
    "aborting-and": " and ",
    "aborting-job": "Job {job} to be deleted",
    "aborting-create": "the create of node pool {pool} to end",
    "aborting-pools": "node pool {pools} to be handed over or deleted",
})

ZH: Mapping[str, Template] = MappingProxyType({
    "TaskAccepted": "已接收，正在为 {tpu_type} {topology} 选择集群",
    "TaskRejected": _rejected("任务规格无效：{field}：{detail}",
                              "无法读取的作业行：列 {field}：{detail}"),
    "RowRefused": "作业行未被接收：{field}：{detail}",
    "NoMatchingCluster": lambda a: (
        _never_fit(a, "没有任何 {tpu_type} 集群的预留能满足 {topology}（需要 {vms} 台 {machine_type} "
                      "虚拟机）：", "集群 {cluster} 的预留 {reservation} 共有 {vms} 台 {machine_type} 虚拟机",
                   "；", "任意机型")
        if a.get("never_fit") else
        f"要求的供给方式为 {a['supply_mode']}，但没有 {a['tpu_type']} 集群配置预留"
        f"（{'、'.join(a['without_reservation'])}）"
        if a.get("supply_mode") else
        f"没有集群提供 TPU 类型 {a['tpu_type']}；已注册的 TPU 类型：{_types(a)}"
    ),
    "NoActiveCluster": lambda a: f"等待可用的 {a['tpu_type']} 集群：" + _clusters(
        a, "{name}（预留 {reservation} 于 {ends_at} 结束，早于最长 {timeout_seconds} 秒的运行）"),
    "ClusterChosen": "已排队于 {cluster_name} ({topology})",
    "TaskRequeued": lambda a: (
        f"集群 {a['from_cluster_name']} 的预留在本任务超时之前就会结束，已重新排队"
        if a["cluster_status"] == RESERVATION_ENDING else
        f"集群 {a['from_cluster_name']} 状态为 {a['cluster_status']}，已重新排队"),
    "TaskPicked": "正在 {topology} 上准备资源",
    "TaskMoved": "已从 {from_cluster_name}（资源槽 {holder_reason} 已 {held_seconds} 秒）移至 {to_cluster_name}",
    "SlotYielded": "资源槽已让给 {to_name}（优先级 {to_effective} 高于 {effective}）",
    "SlotLent": (
        "预留 {reservation} 已满，资源槽暂借给 {to_name}（{to_supply_mode}），"
        "预留一有空余即收回"),
    "SlotBorrowed": lambda a: (
        f"正在 {a['topology']} 上准备资源，使用 {a['from_name']} 借出的资源槽（它在等待预留 "
        f"{a['reservation']}，{a['supply_mode']} 不使用该预留"
        + (f"；越过了 {a['passed_over_count']} 个等待该预留的任务）"
           if a["passed_over_count"] else "）")),
    "PriorityChanged": "优先级已由 {requester} 从 {old} 改为 {new}",
    "ReservationInsufficient": _since(
        "预留 {reservation} 剩余 {remaining} 个切片，需要 {needed} 个"
        "（reservation_remaining_slices={remaining} reservation_needed_slices={needed}）；"
        "第 {attempt} 次重试", "，自 {since} 起等待"),
    "NodePoolReused": "复用节点池 {pool_name}",
    "NodePoolTaken": "已接管 {from_task} 的节点池 {pool_name} 作为一个切片",
    "NodePoolCreateRequested": (
        "正在创建节点池 {pool_name}（{supply_mode}，{node_count} x {machine_type}）"
    ),
    "NodePoolCreateStarted": "正在创建节点池 {pool_name}（操作 {operation}）",
    "NodePoolNotVisible": "节点池 {pool_name} 暂不可见，稍后重试（第 {attempt} 次）",
    "NodesNotReady": _nodes_not_ready(
        "节点池 {pool_name} 控制面 RUNNING，但预期 {total} 个节点中仅 {registered} 个已注册"
        "（Ready={ready}）；第 {attempt} 次",
        "节点池 {pool_name}：{ready}/{total} 个节点就绪（第 {attempt} 次）",
        "，自 {since} 起等待"),
    "NodesAwaited": _recorded(_cause_first(
        "节点池 {pool_name} 控制面 {control_plane}，但预期 {expected} 个节点中仅 {registered} "
        "个已注册（Ready={ready}）；工作负载已提交，等待集群自动扩缩器", "{cause}；"), "zh", "cause"),
    "NodeWaitExtended": (
        "节点池 {pool_name} 等待 {waited_seconds} 秒仍无节点，予以保留：本集群没有其他拓扑的任务"
        "在等待，GKE 会继续尝试，直到有节点 Ready 或任务被中止"),
    "NodePoolReady": "节点池 {pool_name} 已就绪（{nodes} 个节点）",
    "NodePoolFailed": _recorded(lambda a: (
        f"集群 {a['cluster_name']} 的预留 {a['reservation_gone']} 已不存在（Compute 中没有该预留；"
        f"日历模式的预留在结束时被它删除）：{a['error']}"
        if a.get("reservation_gone") else f"节点池 {a['pool_name']} 创建失败：{a['error']}"),
        "zh", "error"),
    "NodePoolTimedOut": _recorded(
        _cause_first("节点池 {pool_name} 在 {waited_seconds} 秒后仍未就绪", "{cause}；"),
        "zh", "cause"),
    "JobSubmitRequested": "正在提交 Job {job_name}",
    "JobSubmitted": "Job {job_name} 已提交，等待 Pod",
    "JobSubmitFailed": _recorded(_submit_failed(
        "Job {job_name} 提交失败：{error}",
        "Job {job_name} 的 Pod 被拒绝创建已 {refused_seconds} 秒：{error}；Job 已删除",
        "{error}；JobSet {job_name} 已 {refused_seconds} 秒无法创建其 Job；JobSet 已删除"),
        "zh", "error"),
    "JobSubmitCancelled": "Job {job_name} 未提交：任务正在中止",
    "PodsPending": _recorded(_with_followers("Pod 等待中：{diagnosis}",
                                             "；在它被调度之前，JobSet webhook 拒绝创建其 "
                                             "follower（预期的暂时错误）：{followers_refused}"),
                             "zh", "diagnosis"),
    "PodsRefused": _refused("Job {job_name} 的 Pod 无法创建：{message}",
                            "（预计会自行恢复，继续等待）",
                            "{message}；JobSet {job_name} 无法创建其 Job"),
    "PodsRunning": _restarted("{active}/{total} 运行中", "（JobSet 已重启 {restarts} 次）"),
    "WorkloadDisrupted": _recorded(_disrupted(
        "中断：节点 {node} 上的 {count} 个 Pod 被终止（{cause}）；不是工作负载自身的失败，"
        "Job 会重建它们（本任务第 {disruptions} 次中断）"), "zh", "node", "cause"),
    "JobSucceeded": "已成功（{succeeded} 个 Pod）",
    "JobFailed": _exit("；日志：{log_file}", "zh"),
    "TaskTimedOut": _recorded(_timed_out("运行超过 {timeout_seconds} 秒超时，Job 已删除",
                                         "（Pod 一直等待：{pods_pending}）"), "zh", "pods_pending"),
    "JobDeleteRequested": _why("正在删除 Job {job_name}（{why}）", "zh"),
    "JobDeleted": "Job {job_name} 已删除",
    "AbortRequested": "在 {phase} 阶段请求中止",
    "AbortIgnored": "忽略中止：任务已 {status}",
    "TaskAborted": "已在 {phase} 阶段中止",
    "NodePoolRetained": "节点池 {pool_name} 已移交给 {for_task}",
    "NodePoolHandedOver": "节点池 {pool_name} 已移交给 {to_task}",
    "NodePoolDeleteRequested": _group("正在删除节点池 {pool_name}", "正在删除节点池 {pools}"),
    "NodePoolDeleted": _group("节点池 {pool_name} 已删除", "节点池 {pools} 已删除"),
    "NodePoolDeleteFailed": _since("删除节点池 {pool_name} 失败（第 {attempt} 次）：{error}",
                                   "，自 {since} 起失败"),
    "ApiCallRetrying": _retrying(
        "{call} 调用失败（{error}），第 {attempt}/{attempts} 次尝试，{retry_in_seconds} 秒后重试",
        "{call} 调用失败（{error}），第 {attempt} 次尝试，{retry_in_seconds} 秒后重试"),
    "ClusterApiUnanswered": _unanswered(
        "边缘集群 {cluster} 的 Kubernetes API 自 {since} 起无应答：{error}",
        "{api} API 自 {since} 起未就集群 {cluster} 应答：{error}",
        "集群 {cluster} 的 {api} API 已恢复应答"),
    "position": "队列位置 #{position}，前面有 {ahead} 个任务{names}",
    "position-first": "队列位置 #1，下一个",
    "more": "另外 {count} 个",
    "wait-holder": "资源槽被 {holder} 占用（自 {since} 起 {reason}）",
    "wait-reservation": "预留 {reservation} 已满：剩余 {remaining} 个切片，需要 {needed} 个",
    "wait-lent": "资源槽暂借给 {borrower}（其他供给方式），直到其 Pod 运行",
    "wait-expected": "预计开始时间约 {at}（可能在 {span} 之间）",
    "aborting-waits": "等待{waits}",
    "aborting-and": "，以及",
    "aborting-job": " Job {job} 被删除",
    "aborting-create": "节点池 {pool} 的创建结束",
    "aborting-pools": "节点池 {pools} 被移交或删除",
})

CATALOGS: Mapping[str, Mapping[str, Template]] = MappingProxyType({"en": EN, "zh": ZH})
SEPARATOR: Mapping[str, str] = MappingProxyType({"en": "; ", "zh": "；"})


def render(key: str, args: Args, lang: str = "en") -> str:
    template = CATALOGS[lang].get(key) or EN[key]
    if callable(template):
        return template(args)
    return template.format(**args)


#: What the job table's ``message`` column Falcon-ES creates holds: a MySQL/MariaDB
#: TEXT, 65,535 bytes (a longer value was stored cut at its length modulo 64 KiB,
#: mid-character). An upper layer's column may hold less (``MessageRoom``).
MESSAGE_BYTES = MessageRoom().octets
#: Ends a Message cut to fit the column, so a reader knows there was more.
CUT_MARK = " …[cut]"


def fit_message(text: str | None, room: MessageRoom = MessageRoom()) -> str | None:
    """A Message cut to what the column holds (``room``: characters and UTF-8 bytes) at
    a character boundary, ending with ``CUT_MARK`` when cut. Most Messages are short:
    those are returned untouched without being encoded."""
    if text is None:
        return None
    if room.chars is not None and len(text) > room.chars:
        text = text[:max(room.chars - len(CUT_MARK), 0)] + CUT_MARK
    if len(text) * 4 <= room.octets:
        return text
    data = text.encode("utf-8", errors="replace")
    if len(data) <= room.octets:
        return text
    body = text[:-len(CUT_MARK)] if text.endswith(CUT_MARK) else text
    space = room.octets - len(CUT_MARK.encode("utf-8"))
    return body.encode("utf-8", errors="replace")[:space].decode("utf-8", errors="ignore") \
        + CUT_MARK


def task_message(state: TaskState, lang: str = "en",
                 room: MessageRoom = MessageRoom()) -> str | None:
    """The Message of a task: its latest statement, then the fate of each pool it
    handed over (a multi-slice task's pools may go to several tasks), then the latest
    pool note."""
    parts = []
    if state.status == chart.ABORTING:
        parts.append(render("AbortRequested", {"phase": state.ending.abort_phase}, lang))
        waits = aborting_waits(state, lang)
        if waits:
            parts.append(waits)
    elif state.message_event is not None:
        parts.append(render(type(state.message_event).__name__, _with_wait(state), lang))
    retained = state.pool.retained
    for pool, taker in retained.items():
        parts.append(render("NodePoolRetained", {"pool_name": pool, "for_task": taker}, lang))
    note_key = state.note_key
    if note_key and not (note_key == "NodePoolRetained"
                         and state.note_args.get("pool_name") in retained
                         or _loan_over(state)):
        parts.append(render(note_key, _with_failing(state), lang))
    return fit_message(SEPARATOR[lang].join(parts) or None, room)


def _loan_over(state: TaskState) -> bool:
    """A slot lent while the task waited for its reservation is no news once it no
    longer waits: the note is shown only in ClusterBusy."""
    return (state.note_key == "SlotLent"
            and state.reason != chart.PendingReason.CLUSTER_BUSY)


def aborting_waits(state: TaskState, lang: str = "en") -> str:
    """What an aborting task waits on before it is Aborted (DESIGN: the Job's deletion
    and the pool's cleanup): its Job's delete, a pool create it follows to its end, and
    the fate of its pools (handed over to a waiting task, or deleted). Empty when it
    waits on nothing."""
    waits = []
    if state.job.name and state.job.intent in _JOB_OPEN:
        waits.append(render("aborting-job", {"job": state.job.name}, lang))
    if state.pool.intent in _POOL_CREATING and state.pool.name:
        waits.append(render("aborting-create", {"pool": state.pool.name}, lang))
    if state.held_pools and state.pool.disposition in _POOL_UNSETTLED:
        waits.append(render("aborting-pools", {"pools": ", ".join(state.held_pools)}, lang))
    if not waits:
        return ""
    return render("aborting-waits", {"waits": render("aborting-and", {}, lang).join(waits)},
                  lang)


_JOB_OPEN = frozenset({JobIntent.SUBMIT_REQUESTED, JobIntent.SUBMITTED,
                       JobIntent.DELETE_REQUESTED})
_POOL_CREATING = frozenset({PoolIntent.CREATE_REQUESTED, PoolIntent.CREATE_STARTED})
_POOL_UNSETTLED = frozenset({None, PoolDisposition.DELETE_REQUESTED,
                             PoolDisposition.DELETE_FAILED})

#: Tries of a wait on the world: their Message says since when the task waits.
_WAIT_TRIES = frozenset({"ReservationInsufficient", "NodesNotReady"})


def _with_wait(state: TaskState) -> Args:
    """The message event's arguments, and for a wait's try the moment the wait began
    (its phase: ClusterBusy, WaitingForNode), which the fold knows and the event not."""
    args = state.message_args
    if state.message_key in _WAIT_TRIES and state.phase_started_at is not None:
        return {**args, "since": clock_time(state.phase_started_at)}
    return args


def _with_failing(state: TaskState) -> Args:
    """The note's arguments, and for a failed pool delete since when its deletes fail
    (the fold knows it; the tries between recorded ones append nothing)."""
    args = state.note_args
    since = state.retries.failing_since
    if state.note_key == "NodePoolDeleteFailed" and since is not None:
        return {**args, "since": clock_time(since)}
    return args


def position_message(
    position: int, ahead: Sequence[tuple[str, str]], lang: str = "en"
) -> str:
    """'#3, 2 ahead (user-a: profiling-v7x, user-b: benchmark-v7x)' for a waiting task."""
    if position == 1:
        return render("position-first", {}, lang)
    named = [f"{actor}: {name}" for actor, name in ahead[:AHEAD_NAMED]]
    if len(ahead) > AHEAD_NAMED:
        named.append(render("more", {"count": len(ahead) - AHEAD_NAMED}, lang))
    names = f" ({', '.join(named)})" if named else ""
    return render("position", {"position": position, "ahead": len(ahead), "names": names}, lang)


def clock_time(at: dt.datetime) -> str:
    """A moment as a Message states it: absolute, so a Message written once stays true
    however long it is not rewritten (``2026-11-01 09:12 UTC``). Formatted by hand:
    a queue's refresh states hundreds of moments, and ``strftime`` took twice as long."""
    return "%d-%02d-%02d %02d:%02d UTC" % (at.year, at.month, at.day, at.hour, at.minute)


def clock_span(low: dt.datetime, high: dt.datetime) -> str:
    """Two moments as a Message states a range: the date once when both fall on it
    (``2026-11-01 09:05–09:40 UTC``)."""
    if low.day == high.day and low.month == high.month and low.year == high.year:
        return "%d-%02d-%02d %02d:%02d–%02d:%02d UTC" % (
            low.year, low.month, low.day, low.hour, low.minute, high.hour, high.minute)
    return f"{clock_time(low)}–{clock_time(high)}"


def position_part(message: str, lang: str = "en") -> str:
    """The position a waiting task's Message starts with, without the wait note."""
    return message.split(SEPARATOR[lang], 1)[0]


def wait_reason(holder: str, reason: str, since: dt.datetime, reservation: Args | None,
                lang: str = "en", borrower: str | None = None) -> str:
    """Why a waiting task waits: who holds its queue's slot, in which state since when,
    and, when that holder waits for a full reservation, the reservation's numbers and
    the task it lent the slot to."""
    text = render("wait-holder", {"holder": holder, "reason": reason,
                                  "since": clock_time(since)}, lang)
    if reservation is not None:
        text += SEPARATOR[lang] + render("wait-reservation", reservation, lang)
    if borrower is not None:
        text += SEPARATOR[lang] + render("wait-lent", {"borrower": borrower}, lang)
    return text
