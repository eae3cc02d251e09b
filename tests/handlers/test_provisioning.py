"""The provisioning handler: a task holding its queue's slot gets a pool -- a retained
one of its queue, or a new one from its supply mode -- and the create is followed to
ready nodes."""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.handlers import provisioning
from tests.support.bench import (
    SQLITE_ONLY, HandlerBenches, reserved_cluster, without_jitter,
)

pytestmark = SQLITE_ONLY


def test_a_picked_task_asks_for_a_pool_from_the_clusters_reservation(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(provisioning.provision, reserved_cluster())
    bench.bring("t1", "picked")

    assert bench.run() == [("t1", ev.NodePoolCreateRequested(
        pool_name="falcon-t1-2x2", supply_mode="reservation", machine_type="ct6e-standard-4t",
        node_count=1, reservation="v6e-res-r", scale_down_unneeded_seconds=600))]


def test_a_reservation_too_small_waits_in_cluster_busy_with_the_numbers_and_retries_later(
        make_bench: HandlerBenches) -> None:
    """Too few free slices is a wait, never a silent switch to another supply mode; the
    capacity is read again after the ``wait`` backoff (15 s first, without jitter)."""
    bench = make_bench(provisioning.provision, reserved_cluster(count=4, in_use=4),
                       retry=without_jitter())
    bench.bring("t1", "picked")

    assert bench.run() == [("t1", ev.ReservationInsufficient("v6e-res-r", 0, 1, 1))]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Pending", "ClusterBusy")
    assert row["message"].startswith(
        "reservation v6e-res-r has 0 slice(s) free, 1 needed (reservation_remaining_slices=0 "
        "reservation_needed_slices=1); retry 1, waiting since ")

    bench.advance(14)
    assert bench.run() == []
    bench.advance(1)
    assert bench.run() == [("t1", ev.ReservationInsufficient("v6e-res-r", 0, 1, 2))]


def test_tasks_competing_for_the_last_slice_in_one_tick_the_earlier_one_wins(
        make_bench: HandlerBenches) -> None:
    """The reservation read cannot see creates granted earlier in the same tick (the
    executor issues them after the commit): the handler counts them itself."""
    bench = make_bench(provisioning.provision, reserved_cluster(count=1))
    bench.bring("early", "picked", topology="1x1")
    bench.advance(1)
    bench.bring("late", "picked")

    emitted = bench.run()

    assert [(task, type(e)) for task, e in emitted] == [
        ("early", ev.NodePoolCreateRequested), ("late", ev.ReservationInsufficient)]
    assert emitted[1][1] == ev.ReservationInsufficient("v6e-res-r", 0, 1, 1)


def test_a_pool_retained_for_the_task_is_reused_instead_of_creating_one(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(provisioning.provision, reserved_cluster(count=1))
    bench.bring("old", "succeeded")
    bench.given("old", ev.NodePoolRetained("falcon-old-2x2", "new"))
    bench.advance(90)  # the pool is RUNNING on the world
    bench.bring("new", "picked")

    assert bench.run() == [("new", ev.NodePoolReused("falcon-old-2x2", "old", "reservation",
                                                         "ct6e-standard-4t"))]
    assert bench.state("new").pool.name == "falcon-old-2x2"


def test_a_retained_pool_gone_while_idle_is_given_up_and_a_new_one_asked_for(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(provisioning.provision, reserved_cluster())
    bench.bring("old", "succeeded")
    bench.given("old", ev.NodePoolRetained("falcon-old-2x2", "new"))
    bench.advance(90)
    bench.ports.node_pools.delete(bench.cluster(), "falcon-old-2x2")  # someone deleted it
    bench.advance(60)
    bench.bring("new", "picked")

    assert bench.run() == [
        ("old", ev.NodePoolDeleteRequested("falcon-old-2x2")),
        ("new", ev.NodePoolCreateRequested("falcon-new-2x2", "reservation", "ct6e-standard-4t",
                                           1, "v6e-res-r", 600))]


def test_the_create_is_followed_until_every_node_is_ready(make_bench: HandlerBenches) -> None:
    """The quiet world's reservation pool: operation done and RUNNING after 60 s, its
    one node registered at 80 s and Ready at 85 s."""
    bench = make_bench(provisioning.provision, reserved_cluster(), retry=without_jitter())
    bench.bring("t1", "create-started")

    assert bench.run() == []  # the create operation is still running

    bench.advance(70)
    assert bench.run() == [("t1", ev.NodesNotReady("falcon-t1-2x2", 0, 1, 1, 0))]
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == ("Pending", "WaitingForNode")

    bench.advance(15)  # the look again is due (15 s), the node is Ready
    assert bench.run() == [("t1", ev.NodePoolReady("falcon-t1-2x2", 1))]
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == ("Pending", "Dispatching")

