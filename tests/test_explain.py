"""``falcon-es explain``: a task's causal chain from its log, root cause first, for the
seed's JobSet scenario, for waiting tasks and for every kind of end."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.projections.explain import LiveLook, Node, explain, render
from falcon_es.adapters.sim.config import StockoutConfig
from tests.support.harness import Harness, Harnesses, flex_cluster, reserved_cluster

Make = Callable[..., Harness]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def chain(node: Node) -> list[Node]:
    """The links from the root down (each node has at most one child)."""
    links = [node]
    while links[-1].children:
        (child,) = links[-1].children
        links.append(child)
    return links


def tree_of(h: Harness, task_id: str, **options: Any) -> Node:
    return explain(task_id, h.app.store.read_stream(task_id), **options)


def cli_json(h: Harness, task_id: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["--db", h.settings.database.db_url, "explain", task_id, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_the_seeds_chain_from_tpu_capacity_down_to_the_follower_refusal(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", topology="4x4", slices=2, sim={"outcome": "unschedulable"})
    h.run(until=lambda: "follower" in (h.row("t1")["message"] or ""))
    links = chain(tree_of(h, "t1"))
    texts = [n.text for n in links]
    assert texts[0] == "too little TPU capacity for the pod (Insufficient google.com/tpu)"
    assert texts[1].startswith("leader pod falcon-t1-slice-0-0-")
    assert "mutating pod webhook" in texts[2] and "without a node selector" in texts[2]
    # Falcon's followers have node selectors (accelerator, topology), so the webhook's
    # refusal is the "missing selector" one (jobset pod_webhook.go, PR 636)
    assert texts[3] == ("the follower pods have no node selector on the leader's node pool "
                        "(cloud.google.com/gke-nodepool)")
    assert texts[4].endswith("follower pod node selector for topology domain not found. "
                             "missing selector: cloud.google.com/gke-nodepool")
    assert texts[-1] == "task is Pending/Dispatching"
    assert all(n.source for n in links) and links[0].at is not None
    assert links[4].source == "edge: FailedCreate on the child Job"
    as_cli = cli_json(h, "t1")
    assert as_cli["text"] == texts[0] and as_cli["children"][0]["text"] == texts[1]
    lines = render(tree_of(h, "t1"))
    assert lines[0].startswith("too little TPU capacity") and lines[1].startswith("└─ leader")


def test_a_flex_start_stockout_shows_each_cause_once_and_the_jobset_trap(make: Make) -> None:
    """Two slices on two flex-start pools in a stockout: the autoscaler's FailedScaleUp
    leads (not the backoff note that follows it), once, and the followers' refusal is
    the webhook trap it is."""
    h = make(flex_cluster(stockout=StockoutConfig(probability=1.0, duration=None)))
    h.submit("t1", topology="4x4", slices=2)
    h.run(until=lambda: "follower" in (h.row("t1")["message"] or ""))
    h.run_for(600)
    assert h.statuses()["t1"] == ("Pending", "WaitingForNode")
    message = h.row("t1")["message"]
    assert message.startswith("cluster autoscaler FailedScaleUp: ") and "GCE out of resources" in message
    assert "in backoff after failed scale-up" not in message
    pools = h.world.cluster("v6e-flex").gke.pools.values()
    # the autoscaler's newest word on the pods is its backoff note, not the cause
    assert any(p.autoscaler_event == ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 "
                                      "in backoff after failed scale-up") for p in pools)
    texts = [n.text for n in chain(tree_of(h, "t1"))]
    assert texts[0].startswith("cluster autoscaler FailedScaleUp: ")
    assert sum(t.startswith("cluster autoscaler") for t in texts) == 1
    trap = next(i for i, t in enumerate(texts) if "mutating pod webhook" in t)
    assert texts[trap + 1].startswith("the follower pods have no node selector on the leader's")
    assert "missing selector: cloud.google.com/gke-nodepool" in texts[trap + 2]
    assert texts[-1] == "task is Pending/WaitingForNode"


def test_a_waiting_task_is_told_its_position_and_who_holds_the_slot(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("first", sim={"duration_seconds": 5000})
    h.run_for(5)
    h.submit("second", actor="user-b")
    h.run_for(5)
    assert h.statuses()["second"] == ("Pending", "Waiting")
    result = CliRunner().invoke(main, ["--db", h.settings.database.db_url, "explain", "second"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "is held by user-a: first (Pending/" in lines[0]
    assert "position #1 of 1" in lines[1]
    assert lines[-1].endswith("[job table @ " + lines[-1].split("@ ")[1])
    assert "task is Pending/Waiting" in lines[-1]


def test_cluster_busy_names_both_slice_numbers(make: Make) -> None:
    # 8 VMs reserved, 4 in use: one slice free of the two needed (a reservation of 4 in
    # all could never serve the task: it would fail at cluster choice).
    h = make(reserved_cluster(count=8, in_use=4))
    h.submit("t1", topology="4x4", slices=2)
    h.run_for(30)
    (root, outcome) = chain(tree_of(h, "t1"))
    assert "reservation_remaining_slices=1 reservation_needed_slices=2" in root.text
    assert root.source.startswith("log: ReservationInsufficient")
    assert outcome.text == "task is Pending/ClusterBusy"


@pytest.mark.parametrize("spec,root,outcome", [
    ({"sim": {"outcome": "oom", "duration_seconds": 30}},
     "pod failed: OOMKilled (exit code 137)", "task is Failed/JobFailed"),
    ({"topology": "9x9"}, "invalid task spec: topology: ", "task is Failed/InvalidTopology"),
    ({"sim": {"duration_seconds": 30}}, "every pod completed (1)", "task is Succeeded"),
    ({"sim": {"outcome": "unschedulable"}, "timeout_seconds": 300},
     "pods pending" , "task is Failed/Timeout"),
])
def test_every_ending_has_a_chain(make: Make, spec: dict[str, Any], root: str,
                                  outcome: str) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", **spec)
    h.run()
    links = chain(tree_of(h, "t1"))
    assert links[-1].text == outcome
    if root == "pods pending":
        assert links[-2].text == "timed out after 300s" and len(links) >= 3
    else:
        assert links[0].text.startswith(root)


def test_a_live_look_comes_first(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", sim={"duration_seconds": 5000})
    h.run(until=lambda: h.statuses()["t1"] == ("Running", None))
    look = LiveLook(workload=None, pools=("falcon-t1-2x2: RUNNING, 1/1 nodes Ready",),
                    reservation="v6e-res-r: 15 slice(s) of 2x2 free", at=h.clock.now())
    links = chain(tree_of(h, "t1", live=look))
    assert [n.source for n in links[:2]] == ["live: Compute", "live: GKE"]
    assert links[-1].text == "task is Running" and links[-2].text == "1/1 pods running"


def test_an_unknown_task_is_a_clear_error(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    result = CliRunner().invoke(main, ["--db", h.settings.database.db_url, "explain", "nope"])
    assert result.exit_code != 0 and "nope" in result.output
