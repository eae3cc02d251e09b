"""The scheduling handlers, each alone: ``choose_clusters`` (which cluster a task
queues on, or why none), ``fill_free_slots`` (one task per free queue slot) and
``requeue_from_inactive_clusters`` (waiting tasks leave a cluster that went inactive)."""

from __future__ import annotations

from falcon_es.domain import events as ev
from falcon_es.handlers import scheduling
from tests.support.bench import SQLITE_ONLY, HandlerBenches, flex_cluster, reserved_cluster

pytestmark = SQLITE_ONLY


def test_a_new_task_queues_on_the_active_cluster_with_the_shorter_queue(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.choose_clusters, reserved_cluster("busy"),
                       reserved_cluster("quiet"), reserved_cluster("resting"))
    busy, quiet = bench.cluster("busy"), bench.cluster("quiet")
    bench.set_cluster_status("resting", "maintenance")
    bench.bring("queued", "waiting", cluster="busy")
    bench.bring("t1", "accepted")

    assert bench.run() == [("t1", ev.ClusterChosen(
        quiet.id, "quiet", "2x2", "queue-depth",
        ({"cluster_id": busy.id, "name": "busy", "queued": 1, "idle_pool": False},
         {"cluster_id": quiet.id, "name": "quiet", "queued": 0, "idle_pool": False})))]
    assert bench.row("t1")["cluster_id"] == quiet.id


def test_no_cluster_of_the_tpu_type_fails_the_task_naming_the_types_there_are(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.choose_clusters, reserved_cluster())
    bench.bring("t1", "accepted", tpu_type="v5p", topology="2x2x1")

    assert bench.run() == [("t1", ev.NoMatchingCluster("v5p", ("v6e",)))]
    assert (bench.row("t1")["status"], bench.row("t1")["reason"]) == (
        "Failed", "NoMatchingCluster")


def test_without_an_active_cluster_the_task_waits_and_says_so_once(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.choose_clusters, reserved_cluster("a"), reserved_cluster("b"))
    bench.set_cluster_status("a", "maintenance")
    bench.set_cluster_status("b", "offline")
    bench.bring("t1", "accepted")

    assert bench.run() == [("t1", ev.NoActiveCluster("v6e", (
        {"name": "a", "status": "maintenance"}, {"name": "b", "status": "offline"})))]
    assert bench.run() == []  # nothing changed: nothing new to say

    bench.set_cluster_status("b", "active")
    assert [type(e) for _, e in bench.run()] == [ev.ClusterChosen]


def test_a_free_slot_is_given_to_one_waiting_task_the_earliest(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.fill_free_slots, reserved_cluster())
    cluster = bench.cluster()
    bench.bring("first", "waiting", actor="user-a")
    bench.advance(1)
    bench.bring("second", "waiting", actor="user-a")

    ((task, picked),) = bench.run()

    assert task == "first"
    assert isinstance(picked, ev.TaskPicked)
    assert (picked.cluster_id, picked.topology, picked.why) == (cluster.id, "2x2", "fifo")
    assert [c["task_id"] for c in picked.candidates] == ["first"]
    assert bench.run() == []  # the slot is held until the task runs or ends
    assert bench.state("second").reason == "Waiting"


def test_waiting_tasks_leave_a_cluster_that_went_inactive_acquiring_ones_stay(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.requeue_from_inactive_clusters, reserved_cluster())
    cluster = bench.cluster()
    bench.bring("acquiring", "picked")
    bench.bring("waiting", "waiting")
    bench.set_cluster_status("v6e-res", "maintenance")

    assert bench.run() == [("waiting", ev.TaskRequeued(cluster.id, "v6e-res", "maintenance"))]
    assert bench.state("waiting").cluster_id is None
    assert bench.state("acquiring").reason == "Provisioning"


def test_a_reservation_task_goes_only_to_a_cluster_with_a_reservation(
        make_bench: HandlerBenches) -> None:
    """The shortest queue is not enough: on a cluster without a reservation the pool of
    a task that asked for one could never be created."""
    bench = make_bench(scheduling.choose_clusters, flex_cluster("flexonly"),
                       reserved_cluster("reserved"))
    reserved = bench.cluster("reserved")
    for task_id in ("r1", "r2", "r3"):
        bench.bring(task_id, "accepted", supply_mode="reservation")
    bench.bring("f1", "accepted")

    chosen = {task: event.cluster_name for task, event in bench.run()
              if isinstance(event, ev.ClusterChosen)}

    assert {t: chosen[t] for t in ("r1", "r2", "r3")} == dict.fromkeys(
        ("r1", "r2", "r3"), "reserved")
    assert bench.row("r3")["cluster_id"] == reserved.id
    assert chosen["f1"] in ("flexonly", "reserved")


def test_a_reservation_task_fails_when_no_cluster_of_its_type_has_a_reservation(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.choose_clusters, flex_cluster("flex-a"),
                       flex_cluster("flex-b"))
    bench.bring("t1", "accepted", supply_mode="reservation")

    assert bench.run() == [("t1", ev.NoMatchingCluster(
        "v6e", ("v6e",), "reservation", ("flex-a", "flex-b")))]
    row = bench.row("t1")
    assert (row["status"], row["reason"]) == ("Failed", "NoMatchingCluster")
    assert row["message"].startswith("supply mode reservation was asked for, but no v6e "
                                     "cluster has a reservation (flex-a, flex-b)")


def test_a_reservation_task_waits_while_its_reserved_clusters_are_inactive(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(scheduling.choose_clusters, flex_cluster("flexonly"),
                       reserved_cluster("reserved"))
    bench.set_cluster_status("reserved", "maintenance")
    bench.bring("t1", "accepted", supply_mode="reservation")

    assert bench.run() == [("t1", ev.NoActiveCluster(
        "v6e", ({"name": "reserved", "status": "maintenance"},)))]
