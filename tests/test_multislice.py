"""Multi-slice tasks end to end on the simulated world: N pools and a JobSet, the
reservation counted in slices, the leader's cause before the followers' refusal, the
JobSet's restarts and failure, abort, timeout and the orphan sweep with N pools."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from types import MappingProxyType

import pytest

from falcon_es.domain import events as ev
from falcon_es.domain import task, task_states
from falcon_es.adapters.sim.config import Span, StockoutConfig
from falcon_es.domain.clock import VirtualClock
from falcon_es.projections import replay
from falcon_es.projections.messages import task_message as project_message
from falcon_es.projections.node_pools import pool_samples
from falcon_es.config.settings import Settings
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
    # 8 VMs reserved, 4 in use: one 4x4 slice free, two needed (4 in all could never
    # serve the task, which would fail at cluster choice)
    h = make(reserved_cluster(count=8, in_use=4))
    submit(h)
    h.run_for(30)
    assert h.statuses()["t1"] == ("Pending", "ClusterBusy")
    assert ("reservation_remaining_slices=1 reservation_needed_slices=2"
            in h.row("t1")["message"])
    assert h.world.pools(include_deleted=True) == []  # no partial create holds a slice


def _busy_behind_a(make: Make, settings: Settings, a_seconds: int,
                   *, other_queue: bool = False) -> Harness:
    """Two 4x4 slices in the reservation; "a" runs on one for ``a_seconds``, and the
    two-slice task "ms" is picked after it: one slice free, two needed. ``other_queue``:
    "a" takes the same four VMs as two 2x4 slices of two 4-chip VMs each (Multislice
    runs only on multi-host slices), so no pool of ms's queue is left when it ends."""
    h = make(reserved_cluster(count=8), settings=settings)
    if other_queue:
        h.submit("a", topology="2x4", slices=2, sim={"duration_seconds": a_seconds})
    else:
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
    """FALCON_MULTISLICE_PARTIAL_CREATE: one 4x4 slice of two is free while "a" (a
    task of another queue, on the same VMs) runs; the task creates that one, holds it
    in ClusterBusy, and creates the other once a's pools are deleted."""
    h = _busy_behind_a(make, Settings(db_url=db_url, multislice_partial_create=True), 600,
                       other_queue=True)
    assert ("reservation_remaining_slices=0 reservation_needed_slices=1"
            in h.row("ms")["message"])
    assert "falcon-ms-4x4" in h.live_pools()  # one slice held
    assert "falcon-ms-4x4-s1" not in h.live_pools()
    h.run()
    assert h.history["ms"] == [("Pending", "Provisioning"), ("Pending", "ClusterBusy"),
                               *RESERVED_PATH, ("Succeeded", None)]
    assert h.row("ms")["message"] == ("succeeded (8 pod(s)); "
                                      "node pools falcon-ms-4x4, falcon-ms-4x4-s1 deleted")
    assert _create_requests(h) == [(0, 1), (1, 0)]
    assert h.live_pools() == []


@pytest.mark.parametrize("restart", [False, True])
def test_a_partial_create_takes_the_pool_a_task_of_its_queue_leaves_before_the_task_behind(
        make: Make, db_url: str, restart: bool) -> None:
    """Three 4x4 slices: "a" and "b" run on two, the two-slice task "ms" creates the
    third and holds it in ClusterBusy, and "w" waits behind it. When a ends, its pool
    is retained for ms, which holds the slot and lacks one slice: it takes the pool
    for that slice and starts its JobSet at once, without waiting for b; w gets
    nothing before ms has its turn, then one of ms's pools. The restart (while ms holds
    its slice) shows that a controller rebuilt from the live tasks finds the same
    taker."""
    h = make(reserved_cluster(count=12),
             settings=Settings(db_url=db_url, multislice_partial_create=True))
    h.submit("a", topology="4x4", sim={"duration_seconds": 1200})
    h.clock.advance(1)
    h.submit("b", topology="4x4", sim={"duration_seconds": 5000})
    h.clock.advance(1)
    submit(h, "ms", sim={"duration_seconds": 60})
    h.run(until=lambda: h.statuses()["ms"] == ("Pending", "ClusterBusy")
          and "NodePoolCreateStarted" in h.events("ms"))
    assert h.statuses()["a"] == ("Running", None)
    assert sorted(h.live_pools()) == ["falcon-a-4x4", "falcon-b-4x4", "falcon-ms-4x4"]
    h.clock.advance(1)
    h.submit("w", topology="4x4", sim={"duration_seconds": 60})
    if restart:
        h.run_for(30)
        assert h.statuses()["a"] == ("Running", None)
        assert h.statuses()["ms"] == ("Pending", "ClusterBusy")
        h.restart()
    h.run(until=lambda: h.statuses()["ms"] == ("Running", None))
    assert h.statuses()["a"] == ("Succeeded", None)
    assert h.statuses()["b"] == ("Running", None)  # ms did not wait for b's slice
    retained = [e.event for e in h.app.store.read_stream("a")
                if isinstance(e.event, ev.NodePoolRetained)]
    assert retained == [ev.NodePoolRetained("falcon-a-4x4", "ms")]
    taken = [e.event for e in h.app.store.read_stream("ms")
             if isinstance(e.event, ev.NodePoolTaken)]
    assert taken == [ev.NodePoolTaken("falcon-a-4x4", "a", "reservation")]
    assert _create_requests(h) == [(0, 1)]  # its second slice was never created
    events = h.events("ms")
    assert events[events.index("NodePoolTaken") + 1] == "NodePoolReady"  # no slice missing
    kube = h.world.cluster("v6e-res").kube
    assert {job.pool for job in kube.jobs.values()
            if job.name.startswith("falcon-ms")} == {"falcon-ms-4x4", "falcon-a-4x4"}
    assert h.statuses()["w"][0] == "Pending"
    assert not {"NodePoolReused", "NodePoolCreateRequested"} & set(h.events("w"))
    h.run()
    assert {t: h.statuses()[t] for t in ("a", "b", "ms", "w")} == {
        t: ("Succeeded", None) for t in ("a", "b", "ms", "w")}
    assert h.row("ms")["message"] == ("succeeded (8 pod(s)); node pool falcon-ms-4x4 handed "
                                      "over to w; node pool falcon-a-4x4 deleted")
    assert [(e.event.pool_name, e.event.from_task) for e in h.app.store.read_stream("w")
            if isinstance(e.event, ev.NodePoolReused)] == [("falcon-ms-4x4", "ms")]
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


@pytest.mark.parametrize("restart", [False, True])
def test_a_partial_create_still_in_flight_takes_the_pool_a_task_of_its_queue_leaves(
        make: Make, db_url: str, restart: bool) -> None:
    """Three 4x4 slices: "a" and "b" run on two, and the two-slice task "ms", picked
    once b runs, asks to create the third (the only one with room) and holds the slot in
    Provisioning while that create runs; "w" waits behind it. a ends during the create:
    its pool is retained for ms, which takes it at once for its missing slice, asks the
    reservation for nothing more, and is ready (both pools, eight nodes) as soon as its
    own slice is, then runs its JobSet on both pools; w gets neither before ms is done.

    Timing: reservation creates take 600 s here (60 s elsewhere), so a starts at about
    660 s, b at about 1320 s, and ms's create runs from then to about 1920 s; a runs
    1000 s and so ends at about 1660 s, with the create some 340 s under way and some
    260 s still to go. The restart (during ms's create, before a ends) shows that a
    controller rebuilt from the live tasks finds the same taker."""
    latency = MappingProxyType({"reservation": Span(600, 600), "on-demand": Span(120, 120),
                                "flex-start": Span(300, 300)})
    h = make(reserved_cluster(count=12, create_latency=latency),
             settings=Settings(db_url=db_url, multislice_partial_create=True))
    h.submit("a", topology="4x4", sim={"duration_seconds": 1000})
    h.clock.advance(1)
    h.submit("b", topology="4x4", sim={"duration_seconds": 5000})
    h.clock.advance(1)
    submit(h, "ms", sim={"duration_seconds": 60})
    h.clock.advance(1)
    h.submit("w", topology="4x4", sim={"duration_seconds": 60})
    h.run(until=lambda: "NodePoolCreateStarted" in h.events("ms"))
    assert _create_requests(h) == [(0, 1)]  # room for one slice of two
    if restart:
        h.run_for(30)
        assert h.statuses()["a"] == ("Running", None)
        assert h.statuses()["ms"] == ("Pending", "Provisioning")
        h.restart()
    h.run(until=lambda: "NodePoolTaken" in h.events("ms"))
    assert h.statuses()["a"] == ("Succeeded", None)
    assert h.statuses()["ms"] == ("Pending", "Provisioning")
    events = h.events("ms")
    assert events[events.index("NodePoolCreateStarted") + 1:] == ["NodePoolTaken"]
    assert {p.name: p.status for p in h.world.pools()}["falcon-ms-4x4"] == "PROVISIONING"
    retained = [e.event for e in h.app.store.read_stream("a")
                if isinstance(e.event, ev.NodePoolRetained)]
    assert retained == [ev.NodePoolRetained("falcon-a-4x4", "ms")]
    taken = [e.event for e in h.app.store.read_stream("ms")
             if isinstance(e.event, ev.NodePoolTaken)]
    assert taken == [ev.NodePoolTaken("falcon-a-4x4", "a", "reservation")]
    h.run(until=lambda: h.statuses()["ms"] == ("Running", None))
    assert h.statuses()["b"] == ("Running", None)  # ms did not wait for b's slice
    ready = [e.event for e in h.app.store.read_stream("ms")
             if isinstance(e.event, ev.NodePoolReady)]
    assert ready == [ev.NodePoolReady("falcon-ms-4x4", 8)]  # both slices' nodes
    assert _create_requests(h) == [(0, 1)]  # its second slice was never asked for
    assert "ReservationInsufficient" not in h.events("ms")
    assert sorted(h.live_pools()) == ["falcon-a-4x4", "falcon-b-4x4", "falcon-ms-4x4"]
    kube = h.world.cluster("v6e-res").kube
    assert {job.pool for job in kube.jobs.values()
            if job.name.startswith("falcon-ms")} == {"falcon-ms-4x4", "falcon-a-4x4"}
    assert h.statuses()["w"][0] == "Pending"
    assert not {"NodePoolReused", "NodePoolTaken", "NodePoolCreateRequested"} & set(
        h.events("w"))
    h.run()
    assert {t: h.statuses()[t] for t in ("a", "b", "ms", "w")} == {
        t: ("Succeeded", None) for t in ("a", "b", "ms", "w")}
    assert h.row("ms")["message"] == ("succeeded (8 pod(s)); node pool falcon-ms-4x4 handed "
                                      "over to w; node pool falcon-a-4x4 deleted")
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


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
    # ms waits for room, so no pool is kept for it: a's pool goes when a ends, and ms
    # then creates both of its slices.
    assert "NodePoolRetained" not in h.events("a") and "NodePoolTaken" not in h.events("ms")
    assert _create_requests(h) == [(0, 0)]
    assert h.row("ms")["message"] == ("succeeded (8 pod(s)); "
                                      "node pools falcon-ms-4x4, falcon-ms-4x4-s1 deleted")


def test_the_leaders_cause_leads_and_the_followers_refusal_follows(make: Make) -> None:
    """The seed's scenario: the leader pod cannot be scheduled for lack of TPUs; the
    JobSet webhook refuses its followers, which carry the accelerator and topology
    selectors but not the pool's: "follower pod node selector for topology domain not
    found. missing selector: cloud.google.com/gke-nodepool"."""
    h = make(reserved_cluster(count=16))
    submit(h, sim={"outcome": "unschedulable"}, timeout_seconds=900)
    h.run(until=lambda: "follower" in (h.row("t1")["message"] or ""))
    message = h.row("t1")["message"]
    assert h.statuses()["t1"] == ("Pending", "Dispatching")
    assert message.startswith("pods pending: leader pod falcon-t1-slice-0-0-"), message
    leader = message.index("Insufficient google.com/tpu")
    follower = message.index("follower pod node selector for topology domain not found. "
                             "missing selector: cloud.google.com/gke-nodepool")
    assert leader < follower and "expected, transient" in message
    h.run()
    assert h.statuses()["t1"] == ("Failed", "Timeout")  # never JobSubmitFailed: transient
    assert h.live_pools() == [] and h.world.cluster("v6e-res").kube.jobs == {}


def test_a_failing_slice_restarts_the_jobset_then_fails_it_with_the_root_cause(
        make: Make) -> None:
    """An exit code the spec names worth a retry restarts the JobSet until
    max_restarts; the workload's other exit codes (an OOM kill) fail it at once."""
    h = make(reserved_cluster(count=16))
    submit(h, max_restarts=1, retry_exit_codes=[42],
           sim={"outcome": "fail", "exit_code": 42, "duration_seconds": 60})
    submit(h, "t2", max_restarts=1, sim={"outcome": "oom", "duration_seconds": 60})
    h.run()
    assert h.statuses()["t1"] == ("Failed", "JobFailed")
    assert any("JobSet restarted 1 time(s)" in m for m in h.messages["t1"])
    assert h.row("t1")["message"].startswith(
        "exit code 42 (JobSet failed: ReachedMaxRestarts after 1 restart(s))")
    assert h.statuses()["t2"] == ("Failed", "JobFailed")
    assert not any("JobSet restarted" in m for m in h.messages["t2"])
    assert h.row("t2")["message"].startswith(
        "OOMKilled (exit code 137) (JobSet failed: FailJobSetFailurePolicyAction after 0 "
        "restart(s))")
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


# ----------------------------------------------------------------- hand-over, per pool


def _two_waiting_behind_two_slices(make: Make) -> Harness:
    """The reservation's two 4x4 slices run the two-slice task "ms"; the single-slice
    tasks "s1" and "s2" wait behind it."""
    h = make(reserved_cluster(count=8))
    submit(h, "ms", sim={"duration_seconds": 600})
    h.clock.advance(1)
    h.submit("s1", topology="4x4", sim={"duration_seconds": 60})
    h.clock.advance(1)
    h.submit("s2", topology="4x4", sim={"duration_seconds": 60})
    return h


def test_each_pool_of_an_ended_multi_slice_task_goes_to_its_own_waiting_task(
        make: Make) -> None:
    """The reservation holds two 4x4 slices, both the two-slice task's: the two
    single-slice tasks behind it wait, and when it ends each of its pools is handed to
    one of them, which start on it without creating a pool."""
    h = _two_waiting_behind_two_slices(make)
    h.run()
    assert {t: h.statuses()[t] for t in ("ms", "s1", "s2")} == {
        t: ("Succeeded", None) for t in ("ms", "s1", "s2")}
    assert h.row("ms")["message"] == (
        "succeeded (8 pod(s)); node pool falcon-ms-4x4 handed over to s1; "
        "node pool falcon-ms-4x4-s1 handed over to s2")
    reused = {t: [(e.event.pool_name, e.event.from_task) for e in h.app.store.read_stream(t)
                  if isinstance(e.event, ev.NodePoolReused)] for t in ("s1", "s2")}
    assert reused == {"s1": [("falcon-ms-4x4", "ms")], "s2": [("falcon-ms-4x4-s1", "ms")]}
    assert "NodePoolCreateRequested" not in h.events("s1") + h.events("s2")
    assert h.row("s1")["message"] == "succeeded (4 pod(s)); node pool falcon-ms-4x4 deleted"
    assert h.row("s2")["message"] == "succeeded (4 pod(s)); node pool falcon-ms-4x4-s1 deleted"
    assert sorted(p.name for p in h.world.pools(include_deleted=True)) == [
        "falcon-ms-4x4", "falcon-ms-4x4-s1"]
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_restart_between_the_two_hand_overs_leaves_each_pool_to_one_task(
        make: Make) -> None:
    """The controller restarts once s1 has taken one pool and the other still waits for
    s2: the holder's own stream says which pool it no longer answers for, so the new
    controller hands the other to s2 and neither deletes nor re-homes the first."""
    h = _two_waiting_behind_two_slices(make)
    h.run(until=lambda: "NodePoolReused" in h.events("s1"))
    assert h.events("ms")[-1] == "NodePoolHandedOver"
    assert "NodePoolReused" not in h.events("s2")
    h.restart()
    h.run()
    assert {t: h.statuses()[t] for t in ("ms", "s1", "s2")} == {
        t: ("Succeeded", None) for t in ("ms", "s1", "s2")}
    assert h.events("ms").count("NodePoolHandedOver") == 2
    assert "NodePoolDeleteRequested" not in h.events("ms")
    assert h.events("ms").count("NodePoolRetained") == 2  # never re-homed
    assert h.live_pools() == []


def _taking_behind_h(make: Make, db_url: str, **changes: object) -> Harness:
    """Three 4x4 slices in the reservation: "a" runs 20 s and ends while "h" creates its
    pool, so a's pool is retained for the two-slice task "ms" waiting behind h."""
    h = make(reserved_cluster(count=12), settings=Settings(db_url=db_url))
    h.submit("a", topology="4x4", sim={"duration_seconds": 20})
    h.clock.advance(1)
    h.submit("h", topology="4x4", sim={"duration_seconds": 600})
    h.clock.advance(1)
    submit(h, "ms", **{"sim": {"duration_seconds": 60}, **changes})
    return h


def test_a_multi_slice_task_takes_a_retained_pool_and_creates_the_other(
        make: Make, db_url: str) -> None:
    """The reservation has three 4x4 slices. "a" runs on one and ends while "h" creates
    its own: a's pool is retained for the two-slice task "ms" waiting behind h, which,
    picked once h runs, takes it and creates only its second slice in the same tick,
    then runs its JobSet on both."""
    h = _taking_behind_h(make, db_url)
    h.run(until=lambda: "NodePoolTaken" in h.events("ms"))
    assert h.statuses()["ms"] == ("Pending", "Provisioning")
    assert h.events("ms")[-2:] == ["NodePoolTaken", "NodePoolCreateRequested"]
    h.run(until=lambda: h.statuses()["ms"] == ("Running", None))
    taken = [e.event for e in h.app.store.read_stream("ms")
             if isinstance(e.event, ev.NodePoolTaken)]
    assert taken == [ev.NodePoolTaken("falcon-a-4x4", "a", "reservation")]
    assert _create_requests(h) == [(1, 0)]
    assert sorted(h.live_pools()) == ["falcon-a-4x4", "falcon-h-4x4", "falcon-ms-4x4-s1"]
    kube = h.world.cluster("v6e-res").kube
    assert {job.pool for job in kube.jobs.values()} >= {"falcon-a-4x4", "falcon-ms-4x4-s1"}
    h.run()
    assert h.statuses()["ms"] == ("Succeeded", None)
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


@pytest.mark.parametrize("phase", ["Provisioning", "Running"])
def test_abort_of_a_task_on_a_taken_pool_and_a_created_one_deletes_both(
        make: Make, db_url: str, phase: str) -> None:
    """Aborted while its own slice's create is in flight (the abort waits for it) or
    while running: both pools go, the taken one and the created one, named in the
    Message."""
    h = _taking_behind_h(make, db_url)
    if phase == "Provisioning":
        h.run(until=lambda: "NodePoolCreateStarted" in h.events("ms"))
    else:
        h.run(until=lambda: h.statuses()["ms"] == ("Running", None))
    h.abort("ms")
    h.run()
    assert h.statuses()["ms"] == ("Aborted", None)
    assert h.row("ms")["message"] == (f"aborted while Pending/{phase}; " if phase != "Running"
                                      else "aborted while Running; ") + (
        "node pools falcon-a-4x4, falcon-ms-4x4-s1 deleted")
    assert h.live_pools() == []


def test_a_timeout_of_a_task_on_a_taken_pool_and_a_created_one_deletes_both(
        make: Make, db_url: str) -> None:
    h = _taking_behind_h(make, db_url, sim={"duration_seconds": 5000}, timeout_seconds=1200)
    h.run()
    assert h.statuses()["ms"] == ("Failed", "Timeout")
    assert h.row("ms")["message"] == ("timed out after 1200s; Job deleted; "
                                      "node pools falcon-a-4x4, falcon-ms-4x4-s1 deleted")
    assert [e.event.from_task for e in h.app.store.read_stream("ms")
            if isinstance(e.event, ev.NodePoolTaken)] == ["a"]
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []



def test_the_node_pool_view_shows_each_pool_of_a_group_with_its_own_fate() -> None:
    """An ended two-slice task that took one pool of "a", handed one pool over and
    deleted the other: each pool is listed with the task answering for it now."""
    at = dt.datetime(2026, 11, 1, 9)
    spec = {"slices": 2}
    ms = task.fold("ms", [(e, at) for e in (
        ev.TaskAccepted("ms", "user-a", spec, "v6e", "4x4", at),
        ev.ClusterChosen("c-1", "v6e-res", "4x4", "only-candidate", ()),
        ev.TaskPicked("c-1", "4x4", "only-waiting", (), None),
        ev.NodePoolTaken("falcon-a-4x4", "a", "reservation"),
        ev.NodePoolCreateRequested("falcon-ms-4x4", "reservation", "ct6e-standard-4t", 4,
                                   "v6e-res-r", 60, slices=2, first_slice=1),
        ev.NodePoolCreateStarted("falcon-ms-4x4", "op-1"),
        ev.NodePoolReady("falcon-a-4x4", 8),
        ev.JobSubmitRequested("falcon-ms", "falcon-a-4x4"),
        ev.JobSubmitted("falcon-ms", "uid-ms"),
        ev.JobSucceeded(8, 2),
        ev.NodePoolRetained("falcon-ms-4x4-s1", "w"),
        ev.NodePoolDeleteRequested("falcon-a-4x4"),
    )])
    assert ms.node_pools == ("falcon-a-4x4", "falcon-ms-4x4-s1")
    assert project_message(ms) == ("succeeded (8 pod(s)); node pool falcon-ms-4x4-s1 handed "
                                   "over to w; deleting node pool falcon-a-4x4")
    samples = pool_samples(task_states.TaskStates([ms]), {})
    assert {(s.name, s.state, s.owner_task) for s in samples} == {
        ("falcon-a-4x4", "deleting", "ms"), ("falcon-ms-4x4-s1", "idle-retained", "ms")}


def test_a_pool_taken_after_a_partial_create_stands_for_the_next_slice() -> None:
    """A three-slice partial create made its first slice, took a's pool for the second
    and created the third: its pools in slice order are its own, a's, and its own
    third (the group's second name stays unused), so the JobSet and the hand-over see
    each slice's pool."""
    at = dt.datetime(2026, 11, 1, 9)
    request = {"pool_name": "falcon-ms-4x4", "supply_mode": "reservation",
               "machine_type": "ct6e-standard-4t", "node_count": 4,
               "reservation": "v6e-res-r", "scale_down_unneeded_seconds": 60, "slices": 3}
    ms = task.fold("ms", [(e, at) for e in (
        ev.TaskAccepted("ms", "user-a", {"slices": 3}, "v6e", "4x4", at),
        ev.ClusterChosen("c-1", "v6e-res", "4x4", "only-candidate", ()),
        ev.TaskPicked("c-1", "4x4", "only-waiting", (), None),
        ev.NodePoolCreateRequested(**request, first_slice=0, upto=1),
        ev.NodePoolCreateStarted("falcon-ms-4x4", "op-1"),
        ev.ReservationInsufficient("v6e-res-r", 0, 2, 1),
        ev.NodePoolTaken("falcon-a-4x4", "a", "reservation"),
        ev.NodePoolCreateRequested(**request, first_slice=2, upto=0),
    )])
    assert ms.node_pools == ("falcon-ms-4x4", "falcon-a-4x4", "falcon-ms-4x4-s2")
    assert ms.held_pools == ms.node_pools and ms.took == (("falcon-a-4x4", "a"),)
    assert ms.pool.slices_requested == 3


def _waiting_behind_a_and_b(make: Make, settings: Settings | None = None) -> Harness:
    """The reservation's two 4x4 slices run "a" (300 s) and "b" (5000 s); the two-slice
    task "ms" is picked behind them and waits for room."""
    h = make(reserved_cluster(count=8), settings=settings)
    h.submit("a", topology="4x4", sim={"duration_seconds": 300})
    h.clock.advance(1)
    h.submit("b", topology="4x4", sim={"duration_seconds": 5000})
    h.clock.advance(1)
    submit(h, "ms", sim={"duration_seconds": 60})
    return h


def test_abort_while_waiting_for_room_holds_and_deletes_nothing_of_its_own(
        make: Make) -> None:
    """b holds one of the reservation's two slices: when a ends, the two-slice task
    waiting for room is promised no pool (a's pool is deleted), takes none and creates
    none, and still waits with both numbers. Aborted, it has nothing to delete."""
    h = _waiting_behind_a_and_b(make)
    h.run(until=lambda: h.statuses()["a"] == ("Succeeded", None)
          and h.live_pools() == ["falcon-b-4x4"])
    h.run_for(600)
    assert h.statuses()["ms"] == ("Pending", "ClusterBusy")
    assert ("reservation_remaining_slices=1 reservation_needed_slices=2"
            in h.row("ms")["message"])
    assert "NodePoolRetained" not in h.events("a")
    h.abort("ms")
    h.run(until=lambda: h.statuses()["ms"] == ("Aborted", None))
    assert h.row("ms")["message"] == "aborted while Pending/ClusterBusy"
    assert not {"NodePoolTaken", "NodePoolCreateRequested"} & set(h.events("ms"))
    assert h.live_pools() == ["falcon-b-4x4"]


@pytest.mark.parametrize("partial", [False, True])
def test_a_busy_holder_keeps_its_slot_from_a_higher_priority_task_only_while_it_holds_pools(
        make: Make, db_url: str, partial: bool) -> None:
    """Preemption takes the slot only from a ClusterBusy holder that holds nothing, as
    one always does by default; with FALCON_MULTISLICE_PARTIAL_CREATE it creates the
    slice that fits once a ends and holds it, and yielding would carry that pool back to
    Waiting."""
    h = _waiting_behind_a_and_b(make, Settings(db_url=db_url, multislice_partial_create=partial))
    h.run(until=lambda: h.statuses()["a"] == ("Succeeded", None)
          and h.statuses()["ms"] == ("Pending", "ClusterBusy") and (
              not partial or "NodePoolCreateStarted" in h.events("ms")))
    h.submit("urgent", topology="4x4", priority="high", sim={"duration_seconds": 60})
    h.run_for(1200)
    assert ("SlotYielded" in h.events("ms")) is not partial
    if partial:
        assert h.statuses()["ms"] == ("Pending", "ClusterBusy")
        assert sorted(h.live_pools()) == ["falcon-b-4x4", "falcon-ms-4x4"]
    else:
        assert h.statuses()["urgent"] == ("Succeeded", None)
        assert "NodePoolCreateRequested" not in h.events("ms")


def test_two_multi_slice_tasks_sharing_a_reservation_too_small_for_both_never_hold_while_waiting(
        make: Make) -> None:
    """Two queues (4x4, four VMs a slice, and 2x4, two 4-chip VMs a slice) share a
    reservation of eight VMs: "a" (4x4, 120 s) and "b" (2x4, 3000 s) run one slice
    each, and behind them "m4" (two 4x4 slices, eight VMs) and "m2" (two 2x4 slices,
    four VMs) need twelve.
    When a ends, m4 could take its pool but has no room for its second slice, so it
    takes nothing and a's pool goes: whenever either waits for room it holds no pool,
    neither keeps back what the other needs, and both run to the end."""
    h = make(reserved_cluster(count=8))
    h.submit("a", topology="4x4", sim={"duration_seconds": 120})
    h.submit("b", topology="2x4", machine_type="ct6e-standard-4t",
             sim={"duration_seconds": 3000})
    h.clock.advance(1)
    h.submit("m4", topology="4x4", slices=2, sim={"duration_seconds": 300})
    h.submit("m2", topology="2x4", slices=2, sim={"duration_seconds": 300})
    seen: set[str] = set()

    def holding_while_busy() -> bool:
        for t in ("m4", "m2"):
            if h.statuses()[t] == ("Pending", "ClusterBusy"):
                seen.add(t)
                assert not {"NodePoolTaken", "NodePoolCreateRequested"} & set(h.events(t)), t
        return False

    h.run(until=lambda: holding_while_busy() or (
        h.statuses()["m4"][0] == h.statuses()["m2"][0] == "Succeeded"))
    assert seen == {"m4", "m2"}
    h.run()
    assert h.statuses()["m4"] == h.statuses()["m2"] == ("Succeeded", None)
    assert h.live_pools() == []


@pytest.mark.parametrize("restart", [False, True])
def test_a_pool_retained_for_a_task_that_finds_no_room_is_given_up(
        make: Make, db_url: str, restart: bool) -> None:
    """Two 4x4 slices: a's pool was retained for the waiting two-slice task "ms"; picked
    once h runs on the other slice, ms could take it but has no room for its second
    slice, so it takes nothing, waits in ClusterBusy, and the pool (no other task
    waits) is deleted, also across a restart; ms creates both slices once h ends."""
    h = make(reserved_cluster(count=8), settings=Settings(db_url=db_url))
    h.submit("a", topology="4x4", sim={"duration_seconds": 20})
    h.clock.advance(1)
    h.submit("h", topology="4x4", sim={"duration_seconds": 600})
    h.clock.advance(1)
    submit(h, "ms", sim={"duration_seconds": 60})
    h.run(until=lambda: h.statuses()["ms"] == ("Pending", "ClusterBusy"))
    assert ("reservation_remaining_slices=0 reservation_needed_slices=1"
            in h.row("ms")["message"])
    assert "NodePoolRetained" in h.events("a")
    if restart:
        h.restart()
    h.run(until=lambda: "NodePoolDeleteRequested" in h.events("a"))
    assert h.statuses()["ms"] == ("Pending", "ClusterBusy")
    h.run()
    assert h.statuses()["ms"] == ("Succeeded", None)
    assert "NodePoolTaken" not in h.events("ms")
    assert _create_requests(h) == [(0, 0)]
    assert h.live_pools() == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_task_waiting_for_room_looks_at_idle_pools_only_when_it_tries_again(
        make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """a's pool is retained for the single-slice task "w" waiting behind the two-slice
    holder "ms", which has no room while b runs: ms looks at that pool (a GKE call)
    only when its reservation backoff ends, not every tick, and takes none of it."""
    h = _waiting_behind_a_and_b(make)
    h.run(until=lambda: h.statuses()["ms"] == ("Pending", "ClusterBusy"))
    h.submit("w", topology="4x4", sim={"duration_seconds": 60})
    h.run(until=lambda: "NodePoolRetained" in h.events("a"))
    looks: list[str] = []
    pools = h.ports.node_pools
    get = pools.get

    def counted(cluster: object, name: str) -> object:
        looks.append(name)
        return get(cluster, name)

    monkeypatch.setattr(pools, "get", counted)
    # A try reads the reservation; those that find the same numbers record no event,
    # so the reads are the tries.
    reads: list[str] = []
    reservations = h.ports.reservations
    remaining = reservations.remaining_slices

    def read(cluster: object, reservation: str, shape: object) -> int:
        reads.append(reservation)
        return remaining(cluster, reservation, shape)

    monkeypatch.setattr(reservations, "remaining_slices", read)
    h.run_for(1800)
    tries = len(reads)
    assert h.statuses()["ms"] == ("Pending", "ClusterBusy")
    assert "NodePoolTaken" not in h.events("ms")
    assert 0 < looks.count("falcon-a-4x4") <= tries
