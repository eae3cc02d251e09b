"""Pods the Job controller is refused creating (FailedCreate), end to end on the
simulated world: the ``create-denied`` outcome makes an admission webhook deny every
pod of the Job. The Message shows the denial at once, root cause first; past the grace
the task fails JobSubmitFailed in the webhook's words, its Job is deleted and its pool
deleted or handed over; the grace counts from the log, across a restart."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator

import pytest

from falcon_es.adapters.sim.config import SimConfig, SimConfigError
from falcon_es.adapters.sim.kube_api import DENIAL, DENYING_WEBHOOK
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.domain.spec import SpecError, parse_spec
from tests.support.harness import Harness, Harnesses, flex_cluster, reserved_cluster

Make = Callable[..., Harness]

DISPATCHED = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
              ("Pending", "Dispatching")]
REFUSED = f"pods of Job falcon-t1 cannot be created: Error creating: {DENIAL}"


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def refused_at(h: Harness, task_id: str) -> dt.datetime:
    """When the log first recorded the task's refusal (the grace counts from it)."""
    return next(r.recorded_at for r in h.app.store.read_stream(task_id)
                if r.type_name == "PodsRefused")


def test_a_denied_job_shows_the_webhook_at_once_then_fails_after_the_grace(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "create-denied"})
    h.run()

    assert h.history["t1"] == [*DISPATCHED, ("Failed", "JobSubmitFailed")]
    # The first observation after the submit puts the webhook's refusal in the Message.
    submitting = h.messages["t1"].index("submitting Job falcon-t1")
    assert h.messages["t1"][submitting + 1] == REFUSED
    assert DENYING_WEBHOOK in REFUSED
    assert h.row("t1")["message"] == (
        f"pods of Job falcon-t1 refused for 600s: Error creating: {DENIAL}; Job deleted; "
        "node pool falcon-t1-2x2 deleted")
    # The controller's retries are the same words: one PodsRefused in the log.
    events = h.events("t1")
    assert events.count("PodsRefused") == 1
    assert events[-5:] == ["JobSubmitFailed", "JobDeleteRequested", "NodePoolDeleteRequested",
                           "JobDeleted", "NodePoolDeleted"]
    assert (h.row("t1")["finished_at"] - refused_at(h, "t1")) == dt.timedelta(seconds=600)
    assert h.world.job_state("v6e-res", "falcon-t1") is None and h.live_pools() == []


def test_a_denied_job_on_an_autoscaled_pool_is_seen_though_no_node_ever_comes(
        make: Make) -> None:
    """Flex-start: the workload is submitted before the pool has nodes, and with its
    pods refused the autoscaler has nothing to scale for: the refusal is the cause
    shown, and fails the task after the grace (no wait for nodes hides it)."""
    h = make(flex_cluster())
    h.submit("t1", sim={"outcome": "create-denied"})
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Failed", "JobSubmitFailed")]
    assert REFUSED in h.messages["t1"]
    assert h.row("t1")["message"].startswith(
        f"pods of Job falcon-t1 refused for 600s: Error creating: {DENIAL}")
    assert [p.registered for p in h.world.pools(include_deleted=True)] == [0]
    assert h.live_pools() == []


def test_the_grace_is_a_setting(make: Make, db_url: str) -> None:
    h = make(reserved_cluster(), settings=Settings(db_url=db_url, failed_create_grace_seconds=90))
    h.submit("t1", sim={"outcome": "create-denied"})
    h.run()
    assert h.history["t1"] == [*DISPATCHED, ("Failed", "JobSubmitFailed")]
    assert (h.row("t1")["finished_at"] - refused_at(h, "t1")) == dt.timedelta(seconds=90)
    assert h.row("t1")["message"].startswith("pods of Job falcon-t1 refused for 90s: ")


def test_the_grace_survives_a_restart(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "create-denied"})
    h.run(lambda: "PodsRefused" in h.events("t1"))
    first = refused_at(h, "t1")
    h.run_for(400)
    h.restart()
    h.run()
    assert h.history["t1"] == [*DISPATCHED, ("Failed", "JobSubmitFailed")]
    assert h.row("t1")["finished_at"] - first == dt.timedelta(seconds=600)
    assert h.events("t1").count("PodsRefused") == 1


def test_the_pool_of_a_denied_task_is_handed_over(make: Make) -> None:
    h = make(reserved_cluster(count=1))
    h.submit("a", sim={"outcome": "create-denied"})
    h.submit("b", sim={"duration_seconds": 60})
    h.run()
    assert h.history["a"] == [*DISPATCHED, ("Failed", "JobSubmitFailed")]
    assert h.history["b"][-3:] == [("Pending", "Dispatching"), ("Running", None),
                                   ("Succeeded", None)]
    assert h.row("a")["message"].endswith("; Job deleted; node pool falcon-a-2x2 handed over to b")
    # The pool was handed over only once the denied Job was gone.
    assert h.events("a").index("JobDeleted") < h.events("a").index("NodePoolRetained")
    assert h.row("b")["node_pool_name"] == "falcon-a-2x2"
    assert h.live_pools() == []


def test_create_denied_is_a_sim_outcome_of_specs_and_of_the_config() -> None:
    assert parse_spec({"image": "python:3.12", "tpu_type": "v6e", "topology": "2x2",
                       "sim": {"outcome": "create-denied"}}).sim.outcome == "create-denied"
    assert SimConfig.from_data({"jobs": {"outcome": "create-denied"}}).jobs.outcome == (
        "create-denied")
    with pytest.raises(SpecError) as spec_error:
        parse_spec({"image": "python:3.12", "tpu_type": "v6e", "topology": "2x2",
                    "sim": {"outcome": ["create-denied"]}})
    assert spec_error.value.field == "sim.outcome"
    with pytest.raises(SimConfigError) as config_error:
        SimConfig.from_data({"jobs": {"outcome": "denied"}}, "world.json")
    words = str(config_error.value)
    assert "\n" not in words and words.startswith("sim config world.json: jobs.outcome: ")
    assert "create-denied" in words
