"""The phrases of ``falcon-es explain``, in English and Chinese.

``explain`` says each link of a task's causal chain in the reader's language
(``FALCON_LANG`` / ``--lang``), like the job table's Messages; the words of the
components that know a cause (the autoscaler's, the webhook's refusal, an API error,
event type names, resource names) are quoted as they were written, so only the
product's own phrases live here, one key per phrase, the same placeholders in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

EN: Mapping[str, str] = MappingProxyType({
    "source-log": "log: {type_name} (version {version})",
    "source-log-bare": "log",
    "source-job-table": "job table",
    "source-queue": "queue view",
    "source-scheduler": "edge: FailedScheduling (kube-scheduler)",
    "source-webhook-order": "JobSet pod webhook order (kubernetes-sigs/jobset#1187)",
    "source-webhook": "JobSet pod webhook",
    "source-failed-create": "edge: FailedCreate on the child Job",
    "source-jobset": "edge: {reason} on JobSet {name} (JobSet controller)",
    "source-live-compute": "live: Compute",
    "source-live-gke": "live: GKE",
    "source-live-kubernetes": "live: Kubernetes API",
    "job-row": "job row {found}: {detail}",
    "no-events": "task {task_id} has no events in the log yet: the controller has not "
                 "taken it in",
    "abort": "abort requested by the upper layer",
    "completed": "every pod completed ({succeeded})",
    "running": "{active}/{total} pods running",
    "restarted": ", JobSet restarted {restarts} time(s)",
    "outcome": "task is {status}",
    "disruption": "disruption {disruptions}: {count} pod(s) killed on node {node} "
                  "({cause}); not the workload's failure: the Job's pod failure policy "
                  "ignores it and recreates the pods",
    "invalid-spec": "invalid task spec: {field}: {detail}",
    "no-cluster": "no active cluster offers {tpu_type}",
    "pool-unusable": "node pool {pool_name} cannot be used",
    "pool-not-ready": "node pool {pool_name} not ready after {waited_seconds}s",
    "pods-refused": "the API server refuses the pods: {error}",
    "pods-refused-long": "pods of {job_name} refused for {refused_seconds}s (past the grace)",
    "job-refused": "the Kubernetes API refused {job_name}: {error}",
    "pod-failed": "pod failed: {cause}",
    "output": "its output: {log_file} (falcon-es logs)",
    "jobset-failed": "JobSet failed: {words}",
    "timed-out": "timed out after {timeout_seconds}s",
    "job-pods-refused": "the API server refuses the pods of {job_name}: {message}",
    "no-pod-yet": "workload submitted; no pod observed yet",
    "reservation": "reservation {reservation} has {remaining} slice(s) of {topology} free, "
                   "{needed} needed (reservation_remaining_slices={remaining} "
                   "reservation_needed_slices={needed})",
    "nodes-ready": "{ready}/{total} nodes Ready in {pools}",
    "nodes-awaited": "node pool {pool_name} control-plane {control_plane} but "
                     "{registered}/{expected} expected node(s) registered (Ready={ready}); "
                     "the workload waits for the cluster autoscaler",
    "not-visible": "node pool {pool_name} not visible yet after its create",
    "creating": "GKE is creating {pools}",
    "tpu-shortage": "too little TPU capacity for the pod ({shortage})",
    "followers-bare": "the follower pods have no node selector",
    "followers-pool": "the follower pods have no node selector on the leader's node pool "
                      "(cloud.google.com/gke-nodepool)",
    "trap-mutating": "JobSet's mutating pod webhook (mpod.kb.io) finds no node for the "
                     "leader, so it leaves the followers without a node selector on its pool",
    "trap-refusal": "its validating webhook (vpod.kb.io) refuses them: {refusal}",
    "jobset-jobs": "JobSet {job_name} cannot create its Jobs",
    "jobset-jobs-long": "JobSet {job_name} could not create its Jobs for {refused_seconds}s "
                        "(past the grace)",
    "cluster-wait": "waiting for a cluster of {tpu_type}",
    "queue": "queue {cluster}/{topology}",
    "slot-held": "the slot of {where} is held by {actor}: {name} ({status})",
    "position": "position #{position} of {waiting} in {where}",
    "live-reservation": "reservation now: {reservation}",
    "live-pool": "node pool now: {pool}",
    "live-pods": "pods now: {workload}",
    "live-no-pod": "{kind} {name}: no pod waits",
    "live-unseen": "{what}: could not look: {error}",
    "live-pool-state": "{name}: {status}, {ready}/{hosts} nodes Ready",
    "live-free": "{reservation}: {free} slice(s) of {topology} free",
})

ZH: Mapping[str, str] = MappingProxyType({
    "source-log": "日志：{type_name}（版本 {version}）",
    "source-log-bare": "日志",
    "source-job-table": "作业表",
    "source-queue": "队列视图",
    "source-scheduler": "边缘集群：FailedScheduling（kube-scheduler）",
    "source-webhook-order": "JobSet Pod webhook 的顺序（kubernetes-sigs/jobset#1187）",
    "source-webhook": "JobSet Pod webhook",
    "source-failed-create": "边缘集群：子 Job 上的 FailedCreate",
    "source-jobset": "边缘集群：JobSet {name} 上的 {reason}（JobSet 控制器）",
    "source-live-compute": "实时：Compute",
    "source-live-gke": "实时：GKE",
    "source-live-kubernetes": "实时：Kubernetes API",
    "job-row": "作业行 {found}：{detail}",
    "no-events": "任务 {task_id} 在日志中尚无事件：控制器还未接收它",
    "abort": "上层请求中止",
    "completed": "所有 Pod 已完成（{succeeded} 个）",
    "running": "{active}/{total} 个 Pod 运行中",
    "restarted": "，JobSet 已重启 {restarts} 次",
    "outcome": "任务状态为 {status}",
    "disruption": "第 {disruptions} 次中断：节点 {node} 上的 {count} 个 Pod 被终止（{cause}）；"
                  "不是工作负载自身的失败：Job 的 Pod 失败策略忽略它并重建这些 Pod",
    "invalid-spec": "任务规格无效：{field}：{detail}",
    "no-cluster": "没有可用的集群提供 {tpu_type}",
    "pool-unusable": "节点池 {pool_name} 无法使用",
    "pool-not-ready": "节点池 {pool_name} 在 {waited_seconds} 秒后仍未就绪",
    "pods-refused": "API server 拒绝创建 Pod：{error}",
    "pods-refused-long": "{job_name} 的 Pod 被拒绝已 {refused_seconds} 秒（超过宽限期）",
    "job-refused": "Kubernetes API 拒绝了 {job_name}：{error}",
    "pod-failed": "Pod 失败：{cause}",
    "output": "其输出：{log_file}（falcon-es logs）",
    "jobset-failed": "JobSet 失败：{words}",
    "timed-out": "运行 {timeout_seconds} 秒后超时",
    "job-pods-refused": "API server 拒绝创建 {job_name} 的 Pod：{message}",
    "no-pod-yet": "工作负载已提交；尚未看到 Pod",
    "reservation": "预留 {reservation} 剩余 {remaining} 个 {topology} 切片，需要 {needed} 个"
                   "（reservation_remaining_slices={remaining} "
                   "reservation_needed_slices={needed}）",
    "nodes-ready": "{pools} 中 {ready}/{total} 个节点 Ready",
    "nodes-awaited": "节点池 {pool_name} 控制面 {control_plane}，但预期 {expected} 个节点中仅 "
                     "{registered} 个已注册（Ready={ready}）；工作负载等待集群自动扩缩器",
    "not-visible": "节点池 {pool_name} 创建后暂不可见",
    "creating": "GKE 正在创建 {pools}",
    "tpu-shortage": "TPU 容量不足以调度该 Pod（{shortage}）",
    "followers-bare": "follower Pod 没有节点选择器",
    "followers-pool": "follower Pod 没有指向 leader 所在节点池的节点选择器"
                      "（cloud.google.com/gke-nodepool）",
    "trap-mutating": "JobSet 的变更型 Pod webhook（mpod.kb.io）找不到 leader 所在的节点，"
                     "因此没有为 follower 设置指向其节点池的节点选择器",
    "trap-refusal": "其校验型 webhook（vpod.kb.io）拒绝创建它们：{refusal}",
    "jobset-jobs": "JobSet {job_name} 无法创建其 Job",
    "jobset-jobs-long": "JobSet {job_name} 已 {refused_seconds} 秒无法创建其 Job（超过宽限期）",
    "cluster-wait": "等待提供 {tpu_type} 的集群",
    "queue": "队列 {cluster}/{topology}",
    "slot-held": "{where} 的资源槽被 {actor} 的 {name} 占用（{status}）",
    "position": "在 {where} 中排第 {position} 位，共 {waiting} 个",
    "live-reservation": "预留现状：{reservation}",
    "live-pool": "节点池现状：{pool}",
    "live-pods": "Pod 现状：{workload}",
    "live-no-pod": "{kind} {name}：没有等待的 Pod",
    "live-unseen": "{what}：无法查看：{error}",
    "live-pool-state": "{name}：{status}，{ready}/{hosts} 个节点 Ready",
    "live-free": "{reservation}：剩余 {free} 个 {topology} 切片",
})

CATALOGS: Mapping[str, Mapping[str, str]] = MappingProxyType({"en": EN, "zh": ZH})
#: Joins a link's text to the words it quotes (a queue row's Message).
COLON: Mapping[str, str] = MappingProxyType({"en": ": ", "zh": "："})


def say(key: str, lang: str = "en", **args: Any) -> str:
    """One phrase in ``lang`` (English where the language is unknown)."""
    return CATALOGS.get(lang, EN)[key].format(**args)
