"""Disruptions are not the workload's failure, end to end on the
simulated world: GKE repairs the nodes of a running multi-host slice (the sim outcome
``node-repair``: every VM of the slice recreated once, midway through the run, its pods
evicted with the ``DisruptionTarget`` condition), the Job's pod failure policy ignores
the evicted pods and recreates them, and the task then completes, with the disruption
leading its Message while it lasts and said in its history and ``explain``. The
workload's own exit codes still fail it at once, unless the spec names them worth a
retry."""

from __future__ import annotations

from collections.abc import Callable


from falcon_es.config.settings import Settings
from falcon_es.projections.explain import explain, render
from tests.support.harness import Harness, reserved_cluster

Make = Callable[..., Harness]

RESERVED_PATH = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                 ("Pending", "Dispatching"), ("Running", None)]


def tree(h: Harness, task_id: str) -> str:
    return "\n".join(render(explain(task_id, h.app.store.read_stream(task_id))))


def test_a_node_repair_under_a_running_multi_host_task_is_survived(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("big", topology="4x4", sim={"duration_seconds": 600, "outcome": "node-repair"})
    h.run()
    assert h.history["big"] == [*RESERVED_PATH, ("Succeeded", None)]
    disrupted = [m for m in h.messages["big"] if m.startswith("disrupted: ")]
    assert disrupted and disrupted[0].startswith("disrupted: 4 pod(s) killed on node gke-")
    assert ("(DisruptionTarget EvictionByEvictionAPI: Eviction API: evicting); not the "
            "workload's failure: the Job recreates them (disruption 1 of this task)"
            in disrupted[0])
    assert h.messages["big"][-1].startswith("succeeded (4 pod(s))")
    events = h.events("big")
    assert events.count("WorkloadDisrupted") == 1 and "JobFailed" not in events
    # while the slice is repaired the disruption leads: no "0/4 active" hides it
    assert events.index("WorkloadDisrupted") < len(events) - 1
    text = tree(h, "big")
    assert text.splitlines()[0].startswith("disruption 1: 4 pod(s) killed on node gke-")
    assert "task is Succeeded" in text
    assert h.live_pools() == []


def test_a_node_repair_under_a_multi_slice_task_is_survived(make: Make, db_url: str) -> None:
    h = make(reserved_cluster(count=8), settings=Settings(db_url=db_url))
    h.submit("ms", topology="4x4", slices=2,
             sim={"duration_seconds": 600, "outcome": "node-repair"})
    h.run()
    assert h.history["ms"][-1] == ("Succeeded", None)
    assert "JobFailed" not in h.events("ms")
    assert any(m.startswith("disrupted: ") for m in h.messages["ms"])
    assert "(JobSet restarted" not in " ".join(h.messages["ms"])
    # both slices repaired at once: one disruption, all eight pods
    assert h.events("ms").count("WorkloadDisrupted") >= 1
    assert not any("disruption 2" in m for m in h.messages["ms"])


def test_the_workloads_own_exit_code_fails_at_once(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", topology="4x4", max_restarts=3, retry_exit_codes=[42],
             sim={"duration_seconds": 60, "outcome": "fail", "exit_code": 3})
    h.run()
    assert h.history["t1"][-1] == ("Failed", "JobFailed")
    assert h.row("t1")["message"].startswith("exit code 3")


def test_a_retryable_exit_code_is_retried_up_to_max_restarts(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", max_restarts=1, retry_exit_codes=[42],
             sim={"duration_seconds": 60, "outcome": "fail", "exit_code": 42})
    h.run()
    assert h.history["t1"][-1] == ("Failed", "JobFailed")
    assert h.row("t1")["message"].startswith("exit code 42")
    # the first attempt's pod is replaced (backoffLimit 1): it ran twice
    assert h.messages["t1"].count("1/1 active") == 2
