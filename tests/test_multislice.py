"""Multi-slice tasks end to end on the simulated world: N pools and a JobSet, the
reservation counted in slices, the leader's cause before the followers' refusal, the
JobSet's restarts and failure, abort, timeout and the orphan sweep with N pools."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from falcon_es import events as ev
from falcon_es.adapters.sim.config import Span, StockoutConfig
from falcon_es.clock import VirtualClock
from falcon_es.settings import Settings
from tests.support.harness import Harness, Harnesses, flex_cluster, reserved_cluster

Make = Callable[..., Harness]

RESERVED_PATH = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                 ("Pending", "Dispatching"), ("Running", None)]
POOLS = ["falcon-t1-4x4", "falcon-t1-4x4-s1"]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def submit(h: Harness, task_id: str = "t1", **changes: object) -> None:
    h.submit(task_id, topology="4x4", slices=2, **changes)


def test_two_slices_run_on_two_pools_as_one_jobset_to_succeeded(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    submit(h)
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert "8/8 active" in h.messages["t1"]
    assert h.messages["t1"][-1] == ("succeeded (8 pod(s)); "
                                    "node pools falcon-t1-4x4, falcon-t1-4x4-s1 deleted")
    pools = h.world.pools(include_deleted=True)
    assert sorted(p.name for p in pools) == POOLS
    assert all(p.labels["falcon-task"] == "t1" and p.reservation == "v6e-res-r" for p in pools)
    assert {p.status for p in pools} == {"DELETED"} and h.live_pools() == []
    assert h.row("t1")["node_pool_name"] == "falcon-t1-4x4"
    events = h.events("t1")
    assert events.count("NodePoolCreateRequested") == 1 and "JobSubmitted" in events


def test_a_flex_start_jobset_scales_one_pool_per_slice_from_zero(make: Make) -> None:
    """The autoscaler sees the pending pods of the JobSet's child Jobs, which name their
    pools only by node affinity (the allowed pools): each slice's pool scales from 0,
    one per child (exclusive placement), the first one after a stockout."""
    h = make(flex_cluster(stockout=StockoutConfig(first_n=1, duration=Span(1200, 1200))))
    submit(h)
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode"), ("Pending", "Dispatching"),
                               ("Running", None), ("Succeeded", None)]
    assert h.messages["t1"][-1].startswith("succeeded (8 pod(s))")
    awaited = [m for m in h.messages["t1"] if "expected node(s) registered" in m]
    assert "cluster autoscaler" in awaited[0] and "0/8 expected node(s)" in awaited[0]
    pools = h.world.pools(include_deleted=True)
    assert sorted(p.name for p in pools) == POOLS
    assert {p.supply_mode for p in pools} == {"flex-start"} and h.live_pools() == []


def test_too_few_slices_in_the_reservation_wait_with_both_numbers_and_hold_nothing(
        make: Make) -> None:
    h = make(reserved_cluster(count=4))  # one 4x4 slice free, two needed
    submit(h)
    h.run_for(30)
    assert h.statuses()["t1"] == ("Pending", "ClusterBusy")
    assert ("reservation_remaining_slices=1 reservation_needed_slices=2"
            in h.row("t1")["message"])
    assert h.world.pools(include_deleted=True) == []  # no partial create holds a slice


def _busy_behind_a(make: Make, settings: Settings, a_seconds: int) -> Harness:
    """Two 4x4 slices in the reservation; "a" runs on one for ``a_seconds``, and the
    two-slice task "ms" is picked after it: one slice free, two needed."""
    h = make(reserved_cluster(count=8), settings=settings)
    h.submit("a", topology="4x4", sim={"duration_seconds": a_seconds})
    h.clock.advance(1)
    submit(h, "ms", sim={"duration_seconds": 60})
    h.run(until=lambda: h.statuses()["ms"] == ("Pending", "ClusterBusy"))
    return h


def _create_requests(h: Harness) -> list[tuple[int, int]]:
    return [(e.event.first_slice, e.event.upto) for e in h.app.store.read_stream("ms")
            if isinstance(e.event, ev.NodePoolCreateRequested)]


def test_with_partial_create_the_slices_that_fit_are_created_and_held_for_the_rest(
        make: Make, db_url: str) -> None:
    """FALCON_MULTISLICE_PARTIAL_CREATE: one 4x4 slice of two is free while "a" runs;
    the task creates that one, holds it in ClusterBusy, and creates the other once
    a's pool is deleted."""
    h = _busy_behind_a(make, Settings(db_url=db_url, multislice_partial_create=True), 600)
    assert ("reservation_remaining_slices=0 reservation_needed_slices=1"
            in h.row("ms")["message"])
    assert sorted(h.live_pools()) == ["falcon-a-4x4", "falcon-ms-4x4"]  # one slice held
    h.run()
    assert h.history["ms"] == [("Pending", "Waiting"), ("Pending", "Provisioning"),
                               ("Pending", "ClusterBusy"), *RESERVED_PATH,
                               ("Succeeded", None)]
    assert h.row("ms")["message"] == ("succeeded (8 pod(s)); "
                                      "node pools falcon-ms-4x4, falcon-ms-4x4-s1 deleted")
    assert _create_requests(h) == [(0, 1), (1, 0)]
    assert h.live_pools() == []


def test_an_aborted_partial_create_deletes_the_slices_it_holds(make: Make, db_url: str) -> None:
    h = _busy_behind_a(make, Settings(db_url=db_url, multislice_partial_create=True), 3000)
    h.abort("ms")
    h.run(until=lambda: "deleted" in (h.row("ms")["message"] or ""))
    assert h.row("ms")["message"] == ("aborted while Pending/ClusterBusy; "
                                      "node pool falcon-ms-4x4 deleted")
    assert h.live_pools() == ["falcon-a-4x4"]


def test_without_partial_create_the_same_task_waits_holding_nothing(
        make: Make, db_url: str) -> None:
    h = _busy_behind_a(make, Settings(db_url=db_url), 600)
    assert ("reservation_remaining_slices=1 reservation_needed_slices=2"
            in h.row("ms")["message"])
    assert h.live_pools() == ["falcon-a-4x4"]
    h.run()
    assert h.statuses()["ms"] == ("Succeeded", None)
    assert _create_requests(h) == [(0, 0)]


def test_the_leaders_cause_leads_and_the_followers_refusal_follows(make: Make) -> None:
    """The seed's scenario: the leader pod cannot be scheduled for lack of TPUs; the
    JobSet webhook refuses its followers with "follower pod node selector not set"."""
    h = make(reserved_cluster(count=16))
    submit(h, sim={"outcome": "unschedulable"}, timeout_seconds=900)
    h.run(until=lambda: "follower" in (h.row("t1")["message"] or ""))
    message = h.row("t1")["message"]
    assert h.statuses()["t1"] == ("Pending", "Dispatching")
    assert message.startswith("pods pending: leader pod falcon-t1-slice-0-0-"), message
    leader = message.index("Insufficient google.com/tpu")
    follower = message.index("follower pod node selector not set")
    assert leader < follower and "expected, transient" in message
    h.run()
    assert h.statuses()["t1"] == ("Failed", "Timeout")  # never JobSubmitFailed: transient
    assert h.live_pools() == [] and h.world.cluster("v6e-res").kube.jobs == {}


def test_a_failing_slice_restarts_the_jobset_then_fails_it_with_the_root_cause(
        make: Make) -> None:
    h = make(reserved_cluster(count=16))
    submit(h, max_restarts=1, sim={"outcome": "oom", "duration_seconds": 60})
    h.run()
    assert h.statuses()["t1"] == ("Failed", "JobFailed")
    assert any("JobSet restarted 1 time(s)" in m for m in h.messages["t1"])
    assert h.row("t1")["message"].startswith(
        "OOMKilled (exit code 137) (JobSet failed: ReachedMaxRestarts after 1 restart(s))")
    assert h.live_pools() == []


def test_abort_deletes_the_jobset_and_every_pool(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    submit(h, sim={"duration_seconds": 5000})
    h.run(until=lambda: h.statuses()["t1"] == ("Running", None))
    kube = h.world.cluster("v6e-res").kube
    assert sorted(kube.jobs) == ["falcon-t1-slice-0", "falcon-t1-slice-1"]
    h.abort("t1")
    h.run()
    assert h.statuses()["t1"] == ("Aborted", None)
    assert kube.jobs == {} and kube.jobsets.jobsets == {} and kube.services == {}
    assert h.live_pools() == []


def test_a_timeout_deletes_the_jobset_and_every_pool_and_names_them(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    submit(h, sim={"duration_seconds": 5000}, timeout_seconds=1200)
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Failed", "Timeout")]
    assert h.row("t1")["message"] == ("timed out after 1200s; Job deleted; "
                                      "node pools falcon-t1-4x4, falcon-t1-4x4-s1 deleted")
    kube = h.world.cluster("v6e-res").kube
    assert kube.jobs == {} and kube.jobsets.jobsets == {} and kube.services == {}
    assert h.live_pools() == []
    deleted = [e for e in h.app.store.read_stream("t1") if e.type_name == "NodePoolDeleted"]
    assert [e.event.slice_pools for e in deleted] == [("falcon-t1-4x4-s1",)]


def test_the_orphan_sweep_spares_the_pools_of_a_running_multi_slice_task(make: Make) -> None:
    h = make(reserved_cluster(count=16))
    submit(h, sim={"duration_seconds": 3000})
    h.run(until=lambda: h.statuses()["t1"] == ("Running", None))
    h.run_for(1200)  # several sweeps
    assert h.statuses()["t1"] == ("Running", None)
    assert sorted(h.live_pools()) == POOLS
