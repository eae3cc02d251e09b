"""The message catalog: every Status / Reason / Message the chart can produce, in English
and in Chinese, and every task event type rendered in both languages."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import string
import typing
from collections.abc import Sequence
from typing import Any

import hypothesis
import hypothesis.strategies
import pytest

from falcon_es.domain import events as ev
from falcon_es.jobtable import job_rows
from falcon_es.app.application import open_app
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.store import Meta, StreamAppend
from falcon_es.domain.task import fold
from falcon_es.projections import messages
from falcon_es.projections.job_table import row_values

AT = dt.datetime(2026, 11, 1, 9)
CJK = re.compile(r"[\u4e00-\u9fff]")
#: Keys whose text is a diagnosis from the cluster itself, the same in every language
#: (none now: a failed pod's exit reason is followed by where its log is, said in the
#: reader's language).
LANGUAGE_NEUTRAL: frozenset[str] = frozenset()

ACCEPTED = ev.TaskAccepted("train", "user-a", {"image": "i"}, "v6e", "2x2", AT)
CHOSEN = ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ())
PICKED = ev.TaskPicked("c-1", "2x2", "only-waiting", (), None)
CREATE = ev.NodePoolCreateRequested("falcon-p1", "flex-start", "ct6e-standard-4t", 2, None, 600)
STARTED = ev.NodePoolCreateStarted("falcon-p1", "op-7")
READY = ev.NodePoolReady("falcon-p1", 2)
SUBMIT = ev.JobSubmitRequested("falcon-j1", "falcon-p1")
SUBMITTED = ev.JobSubmitted("falcon-j1", "uid-1")
RUNNING = ev.PodsRunning(2, 2)

WEBHOOK_DENIAL = ('Error creating: admission webhook "policy.example.com" denied the request: '
                  "no TPUs without a cost center")

WAITING = (ACCEPTED, CHOSEN)
PROVISIONING = (*WAITING, PICKED)
DISPATCHING = (*PROVISIONING, CREATE, STARTED, READY)
RUN = (*DISPATCHING, SUBMIT, SUBMITTED, RUNNING)

#: (events, Status, Reason, English Message, Chinese Message): one row per state the
#: chart has and per fact that can be the latest word in it.
COMBINATIONS: tuple[tuple[tuple[ev.Event, ...], str, str | None, str, str], ...] = (
    ((ACCEPTED,), "Pending", "Waiting",
     "accepted; choosing a cluster for v6e 2x2", "已接收，正在为 v6e 2x2 选择集群"),
    ((ACCEPTED, ev.NoActiveCluster("v6e", ({"name": "gke-a", "status": "maintenance"},
                                          {"name": "gke-b", "status": "offline"}))),
     "Pending", "Waiting",
     "waiting for an active v6e cluster: gke-a (maintenance), gke-b (offline)",
     "等待可用的 v6e 集群：gke-a (maintenance), gke-b (offline)"),
    ((ACCEPTED, ev.NoActiveCluster("v6e", (
        {"name": "gke-a", "status": "reservation-ending", "reservation": "cal-1",
         "ends_at": "2026-12-09T08:00:00Z", "timeout_seconds": 7200},
        {"name": "gke-b", "status": "offline"}))), "Pending", "Waiting",
     "waiting for an active v6e cluster: gke-a (reservation cal-1 ends at 2026-12-09T08:00:00Z, "
     "before a run of up to 7200s would), gke-b (offline)",
     "等待可用的 v6e 集群：gke-a（预留 cal-1 于 2026-12-09T08:00:00Z 结束，早于最长 7200 秒的运行）, "
     "gke-b (offline)"),
    (WAITING, "Pending", "Waiting", "queued on gke-a (2x2)", "已排队于 gke-a (2x2)"),
    ((*WAITING, ev.TaskRequeued("c-1", "gke-a", "maintenance")), "Pending", "Waiting",
     "cluster gke-a is maintenance; re-queued", "集群 gke-a 状态为 maintenance，已重新排队"),
    ((*WAITING, ev.TaskRequeued("c-1", "gke-a", "reservation-ending")), "Pending", "Waiting",
     "the reservation of cluster gke-a ends before this task's timeout could; re-queued",
     "集群 gke-a 的预留在本任务超时之前就会结束，已重新排队"),
    (PROVISIONING, "Pending", "Provisioning", "provisioning on 2x2", "正在 2x2 上准备资源"),
    ((*PROVISIONING, CREATE), "Pending", "Provisioning",
     "creating node pool falcon-p1 (flex-start, 2 x ct6e-standard-4t)",
     "正在创建节点池 falcon-p1（flex-start，2 x ct6e-standard-4t）"),
    ((*PROVISIONING, CREATE, STARTED), "Pending", "Provisioning",
     "creating node pool falcon-p1 (operation op-7)", "正在创建节点池 falcon-p1（操作 op-7）"),
    ((*PROVISIONING, CREATE, STARTED, ev.NodePoolNotVisible("falcon-p1", 2)), "Pending",
     "Provisioning", "node pool falcon-p1 not visible yet; looking again (attempt 2)",
     "节点池 falcon-p1 暂不可见，稍后重试（第 2 次）"),
    ((*PROVISIONING, ev.ReservationInsufficient("res-a", 1, 2, 3)), "Pending", "ClusterBusy",
     "reservation res-a has 1 slice(s) free, 2 needed (reservation_remaining_slices=1 "
     "reservation_needed_slices=2); retry 3, waiting since 2026-11-01 09:03 UTC",
     "预留 res-a 剩余 1 个切片，需要 2 个（reservation_remaining_slices=1 "
     "reservation_needed_slices=2）；第 3 次重试，自 2026-11-01 09:03 UTC 起等待"),
    ((*PROVISIONING, CREATE, STARTED, ev.NodesNotReady("falcon-p1", 1, 2, 4)), "Pending",
     "WaitingForNode",
     "node pool falcon-p1: 1/2 nodes ready (attempt 4), waiting since 2026-11-01 09:05 UTC",
     "节点池 falcon-p1：1/2 个节点就绪（第 4 次），自 2026-11-01 09:05 UTC 起等待"),
    (DISPATCHING, "Pending", "Dispatching",
     "node pool falcon-p1 ready (2 nodes)", "节点池 falcon-p1 已就绪（2 个节点）"),
    ((*PROVISIONING, ev.NodePoolReused("falcon-p0", "t-0", "reservation")), "Pending",
     "Dispatching", "reusing node pool falcon-p0", "复用节点池 falcon-p0"),
    ((*DISPATCHING, SUBMIT), "Pending", "Dispatching",
     "submitting Job falcon-j1", "正在提交 Job falcon-j1"),
    ((*DISPATCHING, SUBMIT, SUBMITTED), "Pending", "Dispatching",
     "Job falcon-j1 submitted; waiting for pods", "Job falcon-j1 已提交，等待 Pod"),
    ((*DISPATCHING, SUBMIT, SUBMITTED,
      ev.PodsPending("0/2 nodes available: 2 Insufficient google.com/tpu")),
     "Pending", "Dispatching",
     "pods pending: 0/2 nodes available: 2 Insufficient google.com/tpu",
     "Pod 等待中：0/2 nodes available: 2 Insufficient google.com/tpu"),
    ((*DISPATCHING, SUBMIT, SUBMITTED, ev.PodsRefused("falcon-j1", WEBHOOK_DENIAL)),
     "Pending", "Dispatching",
     f"pods of Job falcon-j1 cannot be created: {WEBHOOK_DENIAL}",
     f"Job falcon-j1 的 Pod 无法创建：{WEBHOOK_DENIAL}"),
    ((*DISPATCHING, SUBMIT, SUBMITTED, ev.PodsRefused("falcon-j1", WEBHOOK_DENIAL, True)),
     "Pending", "Dispatching",
     f"pods of Job falcon-j1 cannot be created: {WEBHOOK_DENIAL} (expected to clear; waiting)",
     f"Job falcon-j1 的 Pod 无法创建：{WEBHOOK_DENIAL}（预计会自行恢复，继续等待）"),
    (RUN, "Running", None, "2/2 active", "2/2 运行中"),
    ((*RUN, ev.JobSucceeded(2)), "Succeeded", None, "succeeded (2 pod(s))", "已成功（2 个 Pod）"),
    ((ev.TaskRejected("train", "user-a", "InvalidSpec", "spec", "not valid JSON"),),
     "Failed", "InvalidSpec", "invalid task spec: spec: not valid JSON", "任务规格无效：spec：not valid JSON"),
    ((ev.TaskRejected("train", "user-a", "ForbiddenField", "privileged", "not allowed"),),
     "Failed", "ForbiddenField", "invalid task spec: privileged: not allowed",
     "任务规格无效：privileged：not allowed"),
    ((ev.TaskRejected("train", "user-a", "InvalidTopology", "topology", "3x3 is not a v6e shape"),),
     "Failed", "InvalidTopology", "invalid task spec: topology: 3x3 is not a v6e shape",
     "任务规格无效：topology：3x3 is not a v6e shape"),
    ((ACCEPTED, ev.NoMatchingCluster("v6e", ("v5p", "v7x"))), "Failed", "NoMatchingCluster",
     "no cluster serves TPU type v6e; registered TPU types: v5p, v7x",
     "没有集群提供 TPU 类型 v6e；已注册的 TPU 类型：v5p, v7x"),
    ((ACCEPTED, ev.NoMatchingCluster("v6e", ())), "Failed", "NoMatchingCluster",
     "no cluster serves TPU type v6e; registered TPU types: -",
     "没有集群提供 TPU 类型 v6e；已注册的 TPU 类型：-"),
    ((*PROVISIONING, CREATE, ev.NodePoolFailed("falcon-p1", "GCE_STOCKOUT")), "Failed",
     "NodePoolFailed", "node pool falcon-p1 failed: GCE_STOCKOUT", "节点池 falcon-p1 创建失败：GCE_STOCKOUT"),
    ((*PROVISIONING, ev.NodePoolFailed("falcon-p1", "reservation cal-1 not found", "cal-1",
                                       "gke-a")), "Failed", "ReservationGone",
     "reservation cal-1 of cluster gke-a is gone (Compute has no such reservation; it deletes "
     "a calendar-mode one at its end): reservation cal-1 not found",
     "集群 gke-a 的预留 cal-1 已不存在（Compute 中没有该预留；日历模式的预留在结束时被它删除）："
     "reservation cal-1 not found"),
    ((*PROVISIONING, CREATE, STARTED, ev.NodePoolTimedOut("falcon-p1", 1800)), "Failed",
     "NodePoolTimeout", "node pool falcon-p1 not ready after 1800s",
     "节点池 falcon-p1 在 1800 秒后仍未就绪"),
    ((*DISPATCHING, SUBMIT, ev.JobSubmitFailed("falcon-j1", "403 forbidden")), "Failed",
     "JobSubmitFailed", "Job falcon-j1 could not be submitted: 403 forbidden",
     "Job falcon-j1 提交失败：403 forbidden"),
    ((*DISPATCHING, SUBMIT, SUBMITTED, ev.PodsRefused("falcon-j1", WEBHOOK_DENIAL),
      ev.JobSubmitFailed("falcon-j1", WEBHOOK_DENIAL, 600)), "Failed", "JobSubmitFailed",
     f"pods of Job falcon-j1 refused for 600s: {WEBHOOK_DENIAL}; Job deleted",
     f"Job falcon-j1 的 Pod 被拒绝创建已 600 秒：{WEBHOOK_DENIAL}；Job 已删除"),
    ((*RUN, ev.JobFailed("OOMKilled (exit code 137)", 137)), "Failed", "JobFailed",
     "OOMKilled (exit code 137)", "OOMKilled（退出码 137）"),
    ((*RUN, ev.TaskTimedOut(3600)), "Failed", "Timeout",
     "timed out after 3600s; Job deleted", "运行超过 3600 秒超时，Job 已删除"),
    ((*DISPATCHING, SUBMIT, SUBMITTED, ev.TaskTimedOut(600, "Insufficient google.com/tpu")),
     "Failed", "Timeout",
     "timed out after 600s; Job deleted (pods were pending: Insufficient google.com/tpu)",
     "运行超过 600 秒超时，Job 已删除（Pod 一直等待：Insufficient google.com/tpu）"),
    # Aborting says what it waits on: the Job's deletion and the pool's cleanup.
    ((*RUN, ev.AbortRequested(AT, "Running")), "Aborting", None,
     "abort requested while Running; waiting for Job falcon-j1 to be deleted and node pool "
     "falcon-p1 to be handed over or deleted",
     "在 Running 阶段请求中止；等待 Job falcon-j1 被删除，以及节点池 falcon-p1 被移交或删除"),
    ((*PROVISIONING, CREATE, STARTED, ev.AbortRequested(AT, "Pending/Provisioning")),
     "Aborting", None,
     "abort requested while Pending/Provisioning; waiting for the create of node pool "
     "falcon-p1 to end and node pool falcon-p1 to be handed over or deleted",
     "在 Pending/Provisioning 阶段请求中止；等待节点池 falcon-p1 的创建结束，以及节点池 falcon-p1 "
     "被移交或删除"),
    ((*RUN, ev.AbortRequested(AT, "Running"), ev.TaskAborted("Running")), "Aborted", None,
     "aborted while Running", "已在 Running 阶段中止"),
    ((ev.AbortRequested(AT, "New"), ev.TaskAborted("New")), "Aborted", None,
     "aborted while New", "已在 New 阶段中止"),
    ((*RUN, ev.JobSucceeded(2), ev.NodePoolDeleteRequested("falcon-p1")), "Succeeded", None,
     "succeeded (2 pod(s)); deleting node pool falcon-p1",
     "已成功（2 个 Pod）；正在删除节点池 falcon-p1"),
    ((*RUN, ev.JobSucceeded(2), ev.NodePoolDeleteFailed("falcon-p1", "503", 2)), "Succeeded",
     None, "succeeded (2 pod(s)); deleting node pool falcon-p1 failed (attempt 2): 503, "
           "failing since 2026-11-01 09:10 UTC",
     "已成功（2 个 Pod）；删除节点池 falcon-p1 失败（第 2 次）：503，自 2026-11-01 09:10 UTC 起失败"),
    ((*RUN, ev.JobSucceeded(2), ev.NodePoolDeleted("falcon-p1")), "Succeeded", None,
     "succeeded (2 pod(s)); node pool falcon-p1 deleted",
     "已成功（2 个 Pod）；节点池 falcon-p1 已删除"),
    ((*RUN, ev.JobFailed("exit code 1", 1), ev.NodePoolRetained("falcon-p1", "t-9")), "Failed",
     "JobFailed", "exit code 1; node pool falcon-p1 handed over to t-9",
     "退出码 1；节点池 falcon-p1 已移交给 t-9"),
    ((*RUN, ev.JobSucceeded(2), ev.AbortIgnored("Succeeded")), "Succeeded", None,
     "succeeded (2 pod(s)); abort ignored: the task had already Succeeded",
     "已成功（2 个 Pod）；忽略中止：任务已 Succeeded"),
    ((*RUN, ev.TaskTimedOut(3600), ev.JobDeleteRequested("falcon-j1", "timeout"),
      ev.JobDeleted("falcon-j1")), "Failed", "Timeout",
     "timed out after 3600s; Job deleted", "运行超过 3600 秒超时，Job 已删除"),
    # Transient API errors: the main message while Pending, a note afterwards.
    ((*PROVISIONING, CREATE,
      ev.ApiCallRetrying("gke", "pool-create", 3, 12, "429 Too Many Requests", 40)),
     "Pending", "Provisioning",
     "GKE create_node_pool failed (429 Too Many Requests), attempt 3 of 12, next in 40s",
     "GKE create_node_pool 调用失败（429 Too Many Requests），第 3/12 次尝试，40 秒后重试"),
    ((*DISPATCHING, SUBMIT, ev.ApiCallRetrying("kubernetes", "job-submit", 1, 10, "503", 2)),
     "Pending", "Dispatching",
     "Kubernetes create Job failed (503), attempt 1 of 10, next in 2s",
     "Kubernetes create Job 调用失败（503），第 1/10 次尝试，2 秒后重试"),
    ((*RUN, ev.AbortRequested(AT, "Running"), ev.JobDeleteRequested("falcon-j1", "abort"),
      ev.ApiCallRetrying("kubernetes", "job-delete", 2, None, "503", 4)), "Aborting", None,
     "abort requested while Running; waiting for Job falcon-j1 to be deleted and node pool "
     "falcon-p1 to be handed over or deleted; Kubernetes delete Job failed (503), attempt 2, "
     "next in 4s",
     "在 Running 阶段请求中止；等待 Job falcon-j1 被删除，以及节点池 falcon-p1 被移交或删除；"
     "Kubernetes delete Job 调用失败（503），第 2 次尝试，4 秒后重试"),
)


def _fold(events: Sequence[ev.Event]) -> Any:
    return fold("t-1", [(event, AT + dt.timedelta(minutes=i)) for i, event in enumerate(events)])


@pytest.mark.parametrize(("events", "status", "reason", "english", "chinese"), COMBINATIONS,
                         ids=[f"{c[1]}-{c[2]}-{c[0][-1].type_name}" for c in COMBINATIONS])
def test_status_reason_message_in_english_and_chinese(
    events: tuple[ev.Event, ...], status: str, reason: str | None, english: str, chinese: str,
) -> None:
    state = _fold(events)
    en, zh = row_values(state, "en"), row_values(state, "zh")
    assert (en["status"], en["reason"], en["message"]) == (status, reason, english)
    assert (zh["status"], zh["reason"], zh["message"]) == (status, reason, chinese)


def test_the_combinations_cover_every_state_and_failure_reason() -> None:
    from falcon_es.domain import chart

    covered = {(s, r) for _, s, r, _, _ in COMBINATIONS}
    for state in chart.STATES:
        status = chart.status_of(state)
        if status == chart.NEW:
            continue
        if status == chart.FAILED:
            continue
        assert (status, chart.pending_reason(state)) in covered, state
    failure_reasons = {cls.failure_reason for cls in ev.TASK_EVENTS if cls.failure_reason}
    assert failure_reasons <= {r for _, s, r, _, _ in COMBINATIONS if s == chart.FAILED}


# ------------------------------------------------------------------ every event type


def _sample_value(name: str, hint: Any) -> Any:
    """A plausible value for an event field, from its type annotation."""
    text = str(hint)
    if "datetime" in text:
        return AT
    if text.startswith("tuple[dict") or text.startswith("tuple[typing.Dict"):
        return ({"name": "gke-a", "status": "offline", "cluster_id": "c-1", "queued": 0},)
    if text.startswith("tuple"):
        return ("v5p", "v6e")
    if text.startswith("dict"):
        return {"image": "i"}
    if "int" in text and "str" not in text:
        return 3
    return f"{name}-x"


def sample(cls: type[ev.Event]) -> ev.Event:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _sample_value(f.name, hints[f.name]) for f in dataclasses.fields(cls)})


TASK_EVENT_NAMES = tuple(sorted(cls.__name__ for cls in ev.TASK_EVENTS))


def test_both_catalogs_have_the_same_keys_and_cover_every_task_event() -> None:
    assert set(messages.EN) == set(messages.ZH)
    assert set(TASK_EVENT_NAMES) <= set(messages.EN)
    assert set(messages.CATALOGS) == {"en", "zh"}


def _fields(template: messages.Template) -> set[str]:
    if callable(template):
        return set()
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("key", sorted(messages.EN))
def test_translations_use_the_same_placeholders(key: str) -> None:
    assert _fields(messages.EN[key]) == _fields(messages.ZH[key])


@pytest.mark.parametrize("name", TASK_EVENT_NAMES)
def test_every_task_event_renders_in_english_and_chinese(name: str) -> None:
    event = sample(ev.REGISTRY[name])
    args = event.to_data()
    en, zh = messages.render(name, args, "en"), messages.render(name, args, "zh")
    for text in (en, zh):
        assert text and "{" not in text and "}" not in text, text
    assert not CJK.search(en), en
    if name in LANGUAGE_NEUTRAL:
        assert zh == en
    else:
        assert CJK.search(zh), f"{name} has no Chinese wording: {zh}"
    string_args = [v for v in args.values() if isinstance(v, str) and v.endswith("-x")]
    for value in string_args:
        assert (value in en) == (value in zh), f"{name}: {value} shown in only one language"


# ------------------------------------------------------------------ waiting positions


AHEAD = (("user-a", "profiling-v7x"), ("user-b", "benchmark-v7x"))


def test_waiting_position_names_who_is_ahead() -> None:
    assert messages.position_message(3, AHEAD) == "#3, 2 ahead (user-a: profiling-v7x, user-b: benchmark-v7x)"
    assert messages.position_message(3, AHEAD, "zh") == (
        "队列位置 #3，前面有 2 个任务 (user-a: profiling-v7x, user-b: benchmark-v7x)")


def test_first_in_line_and_long_queues() -> None:
    assert messages.position_message(1, ()) == "#1, next in line"
    assert messages.position_message(1, (), "zh") == "队列位置 #1，下一个"
    ahead = tuple((f"user-{i}", f"task-{i}") for i in range(5))
    assert messages.position_message(6, ahead) == (
        "#6, 5 ahead (user-0: task-0, user-1: task-1, user-2: task-2, 2 more)")
    assert messages.position_message(6, ahead, "zh") == (
        "队列位置 #6，前面有 5 个任务 (user-0: task-0, user-1: task-1, user-2: task-2, 另外 2 个)")


def test_position_two_names_the_one_ahead() -> None:
    assert messages.position_message(2, AHEAD[:1]) == "#2, 1 ahead (user-a: profiling-v7x)"


# ------------------------------------------------------------------ language setting


def test_falcon_lang_selects_the_catalog_of_the_projected_rows(db_url: str) -> None:
    settings = Settings.from_env({"FALCON_LANG": "zh_CN.UTF-8", "FALCON_DB_URL": db_url})
    assert settings.job_table.language == "zh"
    app = open_app(settings, VirtualClock(AT))
    try:
        for task_id, actor in (("t-1", "user-a"), ("t-2", "user-b")):
            job_rows.submit(app.engine, name="train", actor=actor, spec={}, now=AT, task_id=task_id)
            accepted = dataclasses.replace(ACCEPTED, actor=actor)
            app.store.append([StreamAppend(task_id, 0, (accepted,), Meta(actor="controller"))])
            row = job_rows.get_row(app.engine, task_id)
            assert (row["status"], row["reason"], row["message"]) == (
                "Pending", "Waiting", "已接收，正在为 v6e 2x2 选择集群")
        app.store.append([StreamAppend(t, 1, (CHOSEN,), Meta(actor="controller")) for t in ("t-1", "t-2")])
        second = job_rows.get_row(app.engine, "t-2")
        assert (second["status"], second["reason"], second["message"]) == (
            "Pending", "Waiting", "队列位置 #2，前面有 1 个任务 (user-a: train)")
    finally:
        app.close()


def test_english_is_the_default_and_unknown_languages_are_refused() -> None:
    from falcon_es.config.settings import SettingsError

    assert Settings.from_env({}).job_table.language == "en"
    assert Settings().job_table.language == "en"
    with pytest.raises(SettingsError, match="FALCON_LANG='fr': expected one of en, zh"):
        Settings.from_env({"FALCON_LANG": "fr"})


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(low=hypothesis.strategies.datetimes(min_value=dt.datetime(2000, 1, 1)),
                  ahead=hypothesis.strategies.timedeltas(min_value=dt.timedelta(0),
                                                         max_value=dt.timedelta(days=3)))
def test_moments_read_as_strftime_writes_them(low: dt.datetime, ahead: dt.timedelta) -> None:
    """The hand-made formatting of Message moments says what ``strftime`` said: the
    minute of each moment, the date once when both ends of a range fall on it."""
    high = low + ahead
    assert messages.clock_time(low) == low.strftime("%Y-%m-%d %H:%M UTC")
    expected = (f"{low:%Y-%m-%d %H:%M}–{high:%H:%M} UTC" if low.date() == high.date()
                else f"{low:%Y-%m-%d %H:%M UTC}–{high:%Y-%m-%d %H:%M UTC}")
    assert messages.clock_span(low, high) == expected
