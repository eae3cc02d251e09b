"""The product's own phrases that events recorded inside a cause, said in Chinese.

A few events keep, next to the words of the component that knew the cause, a phrase
of Falcon-ES itself: the node counts a wait for nodes showed last (``NodePoolTimedOut``),
the disruption budget, the exit code and the JobSet's end inside a ``JobFailed`` cause,
the flex-start node's end inside a disruption's cause, the frames of the edge cluster's
diagnosis of pending pods (``PodsPending``, ``NodesAwaited``), a step given up, and why
a Job is deleted. The log keeps those
events as they were written (stored rows are never rewritten), so the Messages render
these phrases in the reader's language here, by their fixed English form, and leave
every quoted word (the autoscaler's, a pod's condition, an API's error) as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

#: Why a Job is deleted (``JobDeleteRequested.why``): a fixed word per decision.
WHY_ZH: Mapping[str, str] = MappingProxyType({
    "abort": "中止",
    "timeout": "超时",
    "pods refused": "Pod 被拒绝创建",
    "nodes not ready": "节点未就绪",
    "image pull failure": "镜像拉取失败",
    "disruption budget spent": "中断次数超出预算",
})

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

_RULES: tuple[Rule, ...] = (
    # A wait for an autoscaled pool's nodes, and a fixed-size pool's counts.
    (re.compile(r"(\d+)/(\d+) expected node\(s\) registered \(Ready=(\d+)\)"),
     lambda m: f"预期 {m[2]} 个节点中 {m[1]} 个已注册（Ready={m[3]}）"),
    (re.compile(r"control-plane RUNNING, (\d+)/(\d+) expected node\(s\) registered, "
                r"Ready=(\d+)/(\d+)"),
     lambda m: f"控制面 RUNNING，预期 {m[2]} 个节点中 {m[1]} 个已注册，Ready={m[3]}/{m[4]}"),
    (re.compile(r"control-plane RUNNING, Ready=(\d+)/(\d+)"),
     lambda m: f"控制面 RUNNING，Ready={m[1]}/{m[2]}"),
    # The disruption budget spent, and a JobSet's own end.
    (re.compile(r"^disrupted (\d+) times, more than the budget of (\d+) "
                r"\(FALCON_DISRUPTION_BUDGET\); last: (\d+) pod\(s\) killed on node "),
     lambda m: f"已中断 {m[1]} 次，超过预算 {m[2]} 次（FALCON_DISRUPTION_BUDGET）；"
               f"最近一次：{m[3]} 个 Pod 被终止于节点 "),
    (re.compile(r" \(JobSet failed: (.+) after (\d+) restart\(s\)\)$"),
     lambda m: f"（JobSet 失败：{m[1]}，已重启 {m[2]} 次）"),
    (re.compile(r"flex-start node at the end of its life \(GKE deletes flex-start nodes "
                r"after at most 7 days, their max run duration\): "),
     lambda m: "flex-start 节点寿命已到（GKE 最多 7 天后删除 flex-start 节点，即其最长运行"
               "时长）："),
    (re.compile(r"^Job failed \(no failed pod was observed\)$"),
     lambda m: "Job 失败（未观察到失败的 Pod）"),
    (re.compile(r" \(\+(\d+) more\)"), lambda m: f"（另有 {m[1]} 个）"),
    # A failed pod's cause (the status handler's words around the pod's own).
    (re.compile(r"^OOMKilled \(exit code (\d+)\)"), lambda m: f"OOMKilled（退出码 {m[1]}）"),
    (re.compile(r"^exit code (-?\d+)"), lambda m: f"退出码 {m[1]}"),
    (re.compile(r"^pod (\S+) failed$"), lambda m: f"Pod {m[1]} 失败"),
    # The edge cluster's diagnosis of pending pods (the gcp adapter's frames around the
    # scheduler's, the kubelet's and the autoscaler's words; the sim's alike).
    (re.compile(r"node pool (\S+) has no Ready nodes \((\d+) registered\)"),
     lambda m: f"节点池 {m[1]} 没有 Ready 节点（{m[2]} 个已注册）"),
    (re.compile(r"(?<![\w-])pod (\S+) cannot be scheduled: "),
     lambda m: f"Pod {m[1]} 无法调度："),
    (re.compile(r"(?<![\w-])pod (\S+) container (\S+) (last terminated|terminated): (\S+) "
                r"\(exit code (-?\d+)\)"),
     lambda m: f"Pod {m[1]} 的容器 {m[2]} {'上次终止' if m[3] == 'last terminated' else '已终止'}"
               f"：{m[4]}（退出码 {m[5]}）"),
    (re.compile(r"(?<![\w-])pod (\S+) container (\S+): "), lambda m: f"Pod {m[1]} 的容器 {m[2]}："),
    (re.compile(r"(?<![\w-])pod (\S+) failed: "), lambda m: f"Pod {m[1]} 失败："),
    (re.compile(r"(?<![\w-])Job (\S+) failed: "), lambda m: f"Job {m[1]} 失败："),
    (re.compile(r"(?<![\w-])leader pod (\S+) of Job (\S+) Unschedulable: "),
     lambda m: f"Job {m[2]} 的 leader Pod {m[1]} Unschedulable："),
    (re.compile(r"(?<![\w-])pod (\S+) Unschedulable: "), lambda m: f"Pod {m[1]} Unschedulable："),
    (re.compile(r"node pool (\S+) \(autoscaled\): (\d+)/(\d+) nodes registered, (\d+) Ready"),
     lambda m: f"节点池 {m[1]}（自动扩缩）：{m[3]} 个节点中 {m[2]} 个已注册，{m[4]} 个 Ready"),
    (re.compile(r"node pool (\S+) has (\d+)/(\d+) nodes ready \((\d+)/\d+ registered\)"),
     lambda m: f"节点池 {m[1]} 有 {m[2]}/{m[3]} 个节点就绪（{m[4]} 个已注册）"),
    (re.compile(r"node pool (\S+) has (\d+)/(\d+) nodes ready: no (\S+) capacity for "
                r"(\d+) x (\S+) in (.+?) \((GCE_STOCKOUT: [^)]*)\); the cluster autoscaler "
                r"keeps retrying"),
     lambda m: f"节点池 {m[1]} 有 {m[2]}/{m[3]} 个节点就绪：{m[7]} 没有可用于 {m[5]} x {m[6]} "
               f"的 {m[4]} 容量（{m[8]}）；集群自动扩缩器持续重试"),
    (re.compile(r"node pool (\S+) is still being created \(PROVISIONING, operation (\S+)\); "
                r"(\d+)/(\d+) nodes ready"),
     lambda m: f"节点池 {m[1]} 仍在创建中（PROVISIONING，操作 {m[2]}）；{m[3]}/{m[4]} 个节点就绪"),
    (re.compile(r"node pool (\S+) is in ERROR: "), lambda m: f"节点池 {m[1]} 处于 ERROR："),
    (re.compile(r"node pool (\S+) is being deleted \(operation (\S+)\)"),
     lambda m: f"节点池 {m[1]} 正在删除（操作 {m[2]}）"),
    (re.compile(r"node pool (\S+) does not exist in cluster (\S+)"),
     lambda m: f"集群 {m[2]} 中不存在节点池 {m[1]}"),
    (re.compile(r"node pool (\S+) is busy: its nodes run pods of Job "),
     lambda m: f"节点池 {m[1]} 正忙：其节点运行着以下 Job 的 Pod："),
    # A step given up, and a pool not found after its create.
    (re.compile(r"^gave up after (\d+) attempts: "), lambda m: f"尝试 {m[1]} 次后放弃："),
    (re.compile(r"node pool (\S+) still not found (\d+)s after its create finished "
                r"\(create-visibility grace (\d+)s\)"),
     lambda m: f"节点池 {m[1]} 在创建完成 {m[2]} 秒后仍不存在（创建可见性宽限 {m[3]} 秒）"),
)


def in_language(text: str, lang: str) -> str:
    """``text`` with the product's recorded phrases in ``lang`` (English as written)."""
    if lang != "zh" or not text:
        return text
    for pattern, words in _RULES:
        text = pattern.sub(words, text)
    return text


def why(word: str, lang: str) -> str:
    """Why a Job is deleted, in ``lang``."""
    return WHY_ZH.get(word, word) if lang == "zh" else word
