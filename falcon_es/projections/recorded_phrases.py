"""The product's own phrases that events recorded inside a cause, said in Chinese.

A few events keep, next to the words of the component that knew the cause, a phrase
of Falcon-ES itself: the node counts a wait for nodes showed last (``NodePoolTimedOut``),
the disruption budget and the JobSet's end inside a ``JobFailed`` cause, the flex-start
node's end inside a disruption's cause, and why a Job is deleted. The log keeps those
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
