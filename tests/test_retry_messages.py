"""Retries of transient API errors on the simulated world (see docs/explanation/retries.md): the
job table's Message names the attempt a task waits on, a create or submit gives up after
its policy's attempts, deletes never give up, and the policies come from one place
(``Settings.retry``, read from ``FALCON_RETRY_<API>_<FIELD>``).

Faults are the world's own (``create_throttled``, ``submit_throttled``,
``delete_failures``); time moves on the virtual clock only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Iterator, Mapping

import pytest

from falcon_es.domain import events as ev
from falcon_es.adapters.sim import SimClusterConfig
from falcon_es.adapters.sim.config import FaultRule, SimConfig, SimConfigError
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.intents import RESERVATION_CHECK, IntentKind
from falcon_es.domain.ports import RETRYABLE, PortError
from falcon_es.config.retry import API_OF_STEP, DEFAULT_BACKOFFS, Backoff
from falcon_es.config.settings import Settings, SettingsError
from falcon_es.domain.task import STEP_OUTCOMES, fold
from falcon_es.projections.messages import CALLS, task_message
from tests.support.harness import Harness, Harnesses, reserved_cluster

Make = Callable[..., Harness]

PATH = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
        ("Pending", "Dispatching"), ("Running", None), ("Succeeded", None)]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)

    def factory(cluster: SimClusterConfig, env: Mapping[str, str] | None = None) -> Harness:
        return harnesses(cluster, settings=Settings.from_env({"FALCON_DB_URL": db_url,
                                                               **(env or {})}))

    yield factory
    harnesses.close()


def retries(h: Harness, task_id: str) -> list[ev.ApiCallRetrying]:
    return [r.event for r in h.app.store.read_stream(task_id)
            if isinstance(r.event, ev.ApiCallRetrying)]


def recorded(h: Harness, task_id: str, type_name: str) -> list[dt.datetime]:
    return [r.recorded_at for r in h.app.store.read_stream(task_id) if r.type_name == type_name]


def attempt_messages(h: Harness, task_id: str) -> list[str]:
    """The Messages that showed a retried call (not the waits on nodes)."""
    return [m for m in h.messages[task_id] if re.search(r"failed \(.*attempt \d", m)]


# ------------------------------------------------------------------ pool create


def test_a_throttled_create_shows_each_attempt_then_runs(make: Make) -> None:
    h = make(reserved_cluster(create_throttled=FaultRule(first_n=2)))
    h.submit("t1")
    h.run()
    assert h.history["t1"] == PATH
    shown = attempt_messages(h, "t1")
    assert len(shown) == 2
    for attempt, message in enumerate(shown, start=1):
        assert re.fullmatch(
            r"GKE create_node_pool failed \(429 Too Many Requests: .*try again later\.\), "
            rf"attempt {attempt} of 12, next in \d+s", message), message
    # The gke policy paces them: 10 s then 20 s, +-20 % jitter, whole seconds up.
    delays = [e.retry_in_seconds for e in retries(h, "t1")]
    assert 8 <= delays[0] <= 13 and 16 <= delays[1] <= 25
    created = recorded(h, "t1", "NodePoolCreateStarted")[0]
    assert created - recorded(h, "t1", "NodePoolCreateRequested")[0] >= dt.timedelta(
        seconds=sum(delays))
    assert len(h.world.pools(include_deleted=True)) == 1 and h.live_pools() == []


def test_a_create_throttled_beyond_its_attempts_fails_the_task(make: Make) -> None:
    h = make(reserved_cluster(create_throttled=FaultRule(first_n=5)),
             {"FALCON_RETRY_GKE_ATTEMPTS": "2"})
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Failed", "NodePoolFailed")]
    assert [e.attempt for e in retries(h, "t1")] == [1]
    assert "attempt 1 of 2, next in" in attempt_messages(h, "t1")[0]
    message = h.row("t1")["message"]
    assert message.startswith("node pool falcon-t1-2x2 failed: gave up after 2 attempts: "
                              "429 Too Many Requests")
    assert h.world.pools(include_deleted=True) == []  # refused creates left nothing


def test_a_restart_goes_on_counting_the_attempts_from_the_log(make: Make) -> None:
    h = make(reserved_cluster(create_throttled=FaultRule(first_n=5)),
             {"FALCON_RETRY_GKE_ATTEMPTS": "3"})
    h.submit("t1")
    h.run(lambda: len(retries(h, "t1")) == 1)
    (first,) = retries(h, "t1")
    (failed_at,) = recorded(h, "t1", "ApiCallRetrying")
    h.restart()  # the attempt count and the moment of the next call come from the log
    h.run()
    assert [e.attempt for e in retries(h, "t1")] == [1, 2]
    second_at = recorded(h, "t1", "ApiCallRetrying")[1]
    assert second_at >= failed_at + dt.timedelta(seconds=first.retry_in_seconds)
    assert h.history["t1"][-1] == ("Failed", "NodePoolFailed")
    assert "gave up after 3 attempts" in h.row("t1")["message"]


# ------------------------------------------------------------------- job submit


def test_a_throttled_submit_shows_the_attempt_while_dispatching(make: Make) -> None:
    h = make(reserved_cluster(submit_throttled=FaultRule(first_n=2)))
    h.submit("t1")
    h.run()
    assert h.history["t1"] == PATH
    shown = attempt_messages(h, "t1")
    assert [m.split(", next in")[0] for m in shown] == [
        "Kubernetes create Job failed (429 Too Many Requests: the server has received too "
        f"many requests and has asked us to try again later), attempt {n} of 10"
        for n in (1, 2)]
    assert [(e.api, e.step) for e in retries(h, "t1")] == [("kubernetes", "job-submit")] * 2


def test_a_submit_throttled_beyond_its_attempts_fails_and_deprovisions(make: Make) -> None:
    h = make(reserved_cluster(submit_throttled=FaultRule(probability=1.0)),
             {"FALCON_RETRY_KUBERNETES_ATTEMPTS": "2"})
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [*PATH[:3], ("Failed", "JobSubmitFailed")]
    assert h.row("t1")["message"] == (
        "Job falcon-t1 could not be submitted: gave up after 2 attempts: 429 Too Many "
        "Requests: the server has received too many requests and has asked us to try again "
        "later; node pool falcon-t1-2x2 deleted")
    assert h.live_pools() == []


# ------------------------------------------------------------------- pool delete


def test_a_failing_pool_delete_is_never_given_up(make: Make) -> None:
    """GKE refuses every delete for hours: the deletes go on, paced by the gke policy up
    to its maximum, long after its attempts would have ended a create; the log records
    the tries at 1, 2, 4, ... (GKE's refusal stays of one kind), and the note counts them
    and says since when."""
    h = make(reserved_cluster(delete_failures=FaultRule(probability=1.0)),
             {"FALCON_RETRY_GKE_ATTEMPTS": "2", "FALCON_RETRY_GKE_INITIAL": "10",
              "FALCON_RETRY_GKE_MAX": "120", "FALCON_RETRY_GKE_JITTER": "0"})
    h.submit("t1", sim={"duration_seconds": 60})
    h.run(lambda: h.statuses()["t1"] == ("Succeeded", None))
    h.run_for(3 * 3600)
    tries = [r for r in h.app.store.read_stream("t1") if r.type_name == "NodePoolDeleteFailed"]
    assert [r.event.attempt for r in tries] == [1, 2, 4, 8, 16, 32, 64]
    # Tries 10, 20, 40, 80 s apart, then 120 s: try n comes at the sum of the delays
    # before it.
    offsets = [(r.recorded_at - tries[0].recorded_at).total_seconds() for r in tries]
    assert offsets == pytest.approx([0, 10, 70, 510, 1470, 3390, 7230], abs=5)
    assert h.statuses()["t1"] == ("Succeeded", None)
    assert h.row("t1")["message"].startswith(
        "succeeded (1 pod(s)); deleting node pool falcon-t1-2x2 failed (attempt 64): ")
    assert h.row("t1")["message"].endswith(", failing since 2026-11-01 09:02 UTC")
    assert h.live_pools() == ["falcon-t1-2x2"]  # still there, still being deleted


def test_a_pool_delete_that_recovers_ends_with_the_pool_deleted(make: Make) -> None:
    h = make(reserved_cluster(delete_failures=FaultRule(first_n=3)),
             {"FALCON_RETRY_GKE_ATTEMPTS": "1"})
    h.submit("t1", sim={"duration_seconds": 60})
    h.run()
    notes = [m for m in h.messages["t1"] if "failed (attempt" in m]
    # The third try, like the second, is refused in kind: it appends nothing.
    assert [re.search(r"attempt (\d+)", m).group(1) for m in notes] == ["1", "2"]
    assert h.row("t1")["message"] == "succeeded (1 pod(s)); node pool falcon-t1-2x2 deleted"
    assert h.live_pools() == []


# ----------------------------------------------------------- notes after the end

AT = dt.datetime(2026, 11, 1, 9)
RUN = (
    ev.TaskAccepted("train", "user-a", {"image": "i"}, "v6e", "2x2", AT),
    ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ()),
    ev.TaskPicked("c-1", "2x2", "only-waiting", (), None),
    ev.NodePoolCreateRequested("falcon-p1", "reservation", "ct6e-standard-4t", 1, "r", 600),
    ev.NodePoolCreateStarted("falcon-p1", "op-1"),
    ev.NodePoolReady("falcon-p1", 1),
    ev.JobSubmitRequested("falcon-j1", "falcon-p1"),
    ev.JobSubmitted("falcon-j1", "uid-1"),
    ev.PodsRunning(1, 1),
)


def _message(*events: ev.Event, lang: str = "en") -> str | None:
    state = fold("t-1", [(e, AT + dt.timedelta(seconds=i)) for i, e in enumerate(events)])
    return task_message(state, lang)


def test_a_retried_delete_after_the_end_is_a_note_that_goes_when_the_step_ends() -> None:
    timed_out = (*RUN, ev.TaskTimedOut(600), ev.JobDeleteRequested("falcon-j1", "timeout"),
                 ev.NodePoolDeleteRequested("falcon-p1"))
    retrying = ev.ApiCallRetrying("kubernetes", "job-delete", 2, None, "503 Service Unavailable", 4)
    assert _message(*timed_out, retrying) == (
        "timed out after 600s; Job deleted; Kubernetes delete Job failed "
        "(503 Service Unavailable), attempt 2, next in 4s")
    assert _message(*timed_out, retrying, lang="zh") == (
        "运行超过 600 秒超时，Job 已删除；Kubernetes delete Job 调用失败"
        "（503 Service Unavailable），第 2 次尝试，4 秒后重试")
    # The Job is gone: the pool's note, which the retry had replaced, comes back.
    assert _message(*timed_out, retrying, ev.JobDeleted("falcon-j1")) == (
        "timed out after 600s; Job deleted; deleting node pool falcon-p1")


def test_the_attempt_count_restarts_once_the_step_got_an_answer() -> None:
    throttled = ev.ApiCallRetrying("compute", RESERVATION_CHECK, 1, 8, "503", 5)
    events = (*RUN[:3], throttled, ev.ReservationInsufficient("r", 0, 1, 1))
    state = fold("t-1", [(e, AT + dt.timedelta(seconds=i)) for i, e in enumerate(events)])
    assert state.retries.api_calls == {}
    still = fold("t-1", [(e, AT) for e in events[:-1]])
    assert still.retries.api_calls == {RESERVATION_CHECK: (1, AT + dt.timedelta(seconds=5))}


def test_every_retried_step_has_a_call_name_an_api_and_its_outcomes() -> None:
    steps = {IntentKind.POOL_CREATE, IntentKind.POOL_DELETE, IntentKind.JOB_SUBMIT, IntentKind.JOB_DELETE, RESERVATION_CHECK}
    assert steps == set(CALLS) == set(STEP_OUTCOMES) <= set(API_OF_STEP)


# --------------------------------------------------------- reservation reads


class _FlakyReservations:
    """Compute's reservation API refusing the first ``failures`` reads with a 503 (a
    fault of the outside world's connection, as the crash harness injects)."""

    def __init__(self, inner: object, failures: int) -> None:
        self._inner, self.left = inner, failures

    def remaining_slices(self, *args: object) -> int:
        if self.left > 0:
            self.left -= 1
            raise PortError(RETRYABLE, "503 Service Unavailable: backend error")
        return self._inner.remaining_slices(*args)  # type: ignore[attr-defined]

    def capacity(self, *args: object) -> object:
        return self._inner.capacity(*args)  # type: ignore[attr-defined]


def _flaky(h: Harness, failures: int) -> None:
    h.ports = dataclasses.replace(h.ports,
                                  reservations=_FlakyReservations(h.ports.reservations, failures))
    h.rebuild()


def test_an_unanswered_reservation_read_is_retried_with_the_compute_backoff(make: Make) -> None:
    h = make(reserved_cluster())
    _flaky(h, failures=2)
    h.submit("t1")
    h.run()
    assert h.history["t1"] == PATH
    assert [(e.api, e.step, e.attempt, e.attempts) for e in retries(h, "t1")] == [
        ("compute", RESERVATION_CHECK, 1, 8), ("compute", RESERVATION_CHECK, 2, 8)]
    assert attempt_messages(h, "t1")[0].startswith(
        "Compute get reservation failed (reservation v6e-res-r: 503 Service Unavailable: "
        "backend error), attempt 1 of 8, next in")


def test_a_reservation_read_that_never_answers_gives_up(make: Make) -> None:
    h = make(reserved_cluster(), {"FALCON_RETRY_COMPUTE_ATTEMPTS": "3"})
    _flaky(h, failures=100)
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Failed", "NodePoolFailed")]
    assert "gave up after 3 attempts: reservation v6e-res-r: 503" in h.row("t1")["message"]


# ------------------------------------------------------------- configuration


def test_the_environment_reaches_the_executor_and_the_handlers(make: Make) -> None:
    env = {"FALCON_RETRY_GKE_ATTEMPTS": "3", "FALCON_RETRY_WAIT_INITIAL": "5"}
    settings = Settings.from_env(env)
    assert settings.retry.for_api("gke") == dataclasses.replace(DEFAULT_BACKOFFS["gke"],
                                                                attempts=3)
    assert settings.retry.for_api("wait") == Backoff(5.0, 300.0, 2.0, 0.1, None)
    # The executor: a create refused every time gives up after the third call.
    h = make(reserved_cluster(create_throttled=FaultRule(probability=1.0)), env)
    h.submit("t1")
    h.run()
    assert "gave up after 3 attempts" in h.row("t1")["message"]
    # The handlers: a reservation too small for the moment is looked at again after
    # ~5 s (the wait policy), not the default 15 s.
    h2 = make(reserved_cluster(name="v6e-full", count=4, in_use=4), env)
    h2.submit("t2", task_id="t2")
    h2.run_for(60)
    busy = recorded(h2, "t2", "ReservationInsufficient")
    assert 4.5 <= (busy[1] - busy[0]).total_seconds() <= 5.5


@pytest.mark.parametrize(("environ", "words"), [
    ({"FALCON_RETRY_GKE_ATTEMPTS": "three"},
     "FALCON_RETRY_GKE_ATTEMPTS='three': expected a whole number"),
    ({"FALCON_RETRY_WAIT_MAX": "1"},
     "FALCON_RETRY_WAIT_MAX=1: backoff: max=1.0 must be at least initial=15.0"),
    ({"FALCON_RETRY_KUBERNETES_JITTER": "2"},
     "FALCON_RETRY_KUBERNETES_JITTER=2: backoff: jitter=2.0 must be between 0 and 1"),
])
def test_a_bad_retry_setting_is_one_error_naming_the_variable(environ: dict, words: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(environ)
    assert str(raised.value) == words


def test_the_cli_reports_a_bad_retry_setting_in_one_line() -> None:
    from click.testing import CliRunner

    from falcon_es.cli import main

    result = CliRunner(env={"FALCON_RETRY_GKE_INITIAL": "soon"}).invoke(main, ["chart"])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert result.stderr.strip().splitlines() == [
        "falcon-es: FALCON_RETRY_GKE_INITIAL='soon': expected a number"]


def test_the_sim_config_takes_the_throttling_faults() -> None:
    config = SimConfig.from_data({"defaults": {"create_throttled": {"first_n": 2},
                                            "submit_throttled": {"probability": 0.5}}})
    assert config.defaults.create_throttled == FaultRule(first_n=2)
    assert config.defaults.submit_throttled == FaultRule(probability=0.5)
    with pytest.raises(SimConfigError, match="create_throttled.first_n"):
        SimConfig.from_data({"defaults": {"create_throttled": {"first_n": "two"}}})
