"""Cluster choice, queues and the pick rule, end to end through the controller on both
databases. Slots are freed by appending the events the provisioning and status
handlers would append (NodePoolReused + PodsRunning, NodePoolFailed, ...)."""

from __future__ import annotations

import datetime as dt
import itertools
import re

import pytest
from freezegun import freeze_time

from falcon_es.domain import events as ev
from falcon_es.jobtable import job_rows
from falcon_es.storage import registry
from falcon_es.app.application import App, load_task_states, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import WallClock
from falcon_es.domain.clusters import Cluster
from falcon_es.engine.runtime import Controller
from falcon_es.config.settings import Settings
from falcon_es.storage.store import Meta, StreamAppend
from falcon_es.handlers import intake, scheduling

SCHEDULING = (
    intake.accept_new_rows, intake.notice_abort_requests,
    scheduling.requeue_from_inactive_clusters, scheduling.choose_clusters,
    scheduling.move_from_stuck_queues, scheduling.yield_busy_slots,
    scheduling.fill_free_slots,
)


def add_cluster(app: App, name: str, tpu_type: str = "v6e", status: str = "active") -> Cluster:
    return registry.add_cluster(app.store, name=name, project="proj", location="us-east5-a",
                                tpu_type=tpu_type, gcs_bucket="logs", status=status)


def submit(app: App, actor: str, name: str, topology: str = "2x2", tpu_type: str = "v6e") -> str:
    spec = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": tpu_type, "topology": topology}
    task_id = job_rows.submit(app.engine, name=name, actor=actor, spec=spec, now=app.clock.now())
    if hasattr(app.clock, "advance"):
        app.clock.advance(1)
    return task_id


def controller(app: App) -> Controller:
    return build_service(app, None, RunOptions(handlers=SCHEDULING)).controller


def append(app: App, task_id: str, *events: ev.Event) -> None:
    """What another handler (provisioning, status, abort) would have appended."""
    state = app.tasks.get(task_id)
    assert state is not None
    app.store.append([StreamAppend(task_id, state.version, events, Meta(actor="test"))])


def run(app: App, task_id: str) -> None:
    append(app, task_id, ev.NodePoolReused("falcon-pool", None, "reservation"),
           ev.PodsRunning(1, 1))


def types(app: App, task_id: str) -> list[str]:
    return [r.type_name for r in app.store.read_stream(task_id)]


def last(app: App, task_id: str, type_name: str) -> ev.Event:
    return [r.event for r in app.store.read_stream(task_id) if r.type_name == type_name][-1]


def position(message: str | None) -> str | None:
    """The position part of a waiting task's Message (what follows it says why it
    waits and when it is expected to start: tested on its own)."""
    return re.split("; |；", message)[0] if message is not None else None


def row(app: App, task_id: str) -> dict:
    return job_rows.get_row(app.engine, task_id)


def status(app: App, task_id: str) -> tuple[str, str | None]:
    r = row(app, task_id)
    return r["status"], r["reason"]


# --------------------------------------------------------------------- cluster choice


def test_accepted_task_is_queued_and_picked_in_the_same_tick(app: App) -> None:
    cluster = add_cluster(app, "tpu-a")
    ctl = controller(app)
    task = submit(app, "user-a", "profiling-v6e")
    ctl.tick()
    assert types(app, task) == ["TaskAccepted", "ClusterChosen", "TaskPicked"]
    chosen = last(app, task, "ClusterChosen")
    assert (chosen.cluster_name, chosen.why) == ("tpu-a", "only-candidate")
    picked = last(app, task, "TaskPicked")
    assert (picked.why, picked.last_actor, picked.actors_waiting) == ("only-waiting", None, 1)
    assert status(app, task) == ("Pending", "Provisioning")
    assert row(app, task)["cluster_id"] == cluster.id


def test_no_cluster_of_that_tpu_type_fails_listing_registered_types(app: App) -> None:
    add_cluster(app, "big-v7x", tpu_type="v7x")
    add_cluster(app, "old-v5p", tpu_type="v5p", status="offline")
    ctl = controller(app)
    task = submit(app, "user-a", "needs-v6e")
    other = submit(app, "user-b", "fine-v7x", topology="2x2x1", tpu_type="v7x")
    ctl.tick()
    assert status(app, task) == ("Failed", "NoMatchingCluster")
    assert row(app, task)["message"] == (
        "no cluster serves TPU type v6e; registered TPU types: v5p, v7x")
    assert status(app, other) == ("Pending", "Provisioning")


def test_none_active_keeps_waiting_names_them_and_moves_on_when_one_is_active(db_url: str) -> None:
    with freeze_time("2026-11-02 08:00:00") as frozen:
        app = open_app(Settings(db_url=db_url), WallClock())
        try:
            add_cluster(app, "tpu-a", status="maintenance")
            add_cluster(app, "tpu-b", status="offline")
            ctl = controller(app)
            task = submit(app, "user-a", "patient")
            frozen.tick(dt.timedelta(seconds=5))
            ctl.tick()
            assert status(app, task) == ("Pending", "Waiting")
            assert row(app, task)["message"] == (
                "waiting for an active v6e cluster: tpu-a (maintenance), tpu-b (offline)")
            for _ in range(3):
                frozen.tick(dt.timedelta(seconds=30))
                ctl.tick()
            assert types(app, task) == ["TaskAccepted", "NoActiveCluster"], "idempotent"
            registry.set_status(app.store, "tpu-b", "maintenance")
            ctl.tick()
            assert types(app, task) == ["TaskAccepted", "NoActiveCluster", "NoActiveCluster"]
            assert row(app, task)["message"].endswith("tpu-b (maintenance)")
            registry.set_status(app.store, "tpu-a", "active")
            frozen.tick(dt.timedelta(seconds=30))
            ctl.tick()
            assert types(app, task)[-2:] == ["ClusterChosen", "TaskPicked"]
            assert last(app, task, "ClusterChosen").cluster_name == "tpu-a"
            assert status(app, task) == ("Pending", "Provisioning")
            assert row(app, task)["updated_at"] == dt.datetime(2026, 11, 2, 8, 2, 5)
        finally:
            app.close()


def test_fewest_queued_wins_and_ties_break_by_name(app: App) -> None:
    add_cluster(app, "tpu-b")
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    first, second, third = (submit(app, "u", f"t{i}") for i in range(3))
    ctl.tick()
    one, two, three = (last(app, t, "ClusterChosen") for t in (first, second, third))
    assert (one.cluster_name, one.why) == ("tpu-a", "tie-break")
    assert [c["queued"] for c in one.candidates] == [0, 0]
    assert (two.cluster_name, two.why) == ("tpu-b", "queue-depth")
    assert [(c["name"], c["queued"]) for c in two.candidates] == [("tpu-a", 1), ("tpu-b", 0)]
    assert (three.cluster_name, three.why) == ("tpu-a", "tie-break")
    # Queue depth is per topology: another topology starts from empty queues.
    other = submit(app, "u", "wide", topology="2x4")
    ctl.tick()
    assert last(app, other, "ClusterChosen").candidates[0]["queued"] == 0


def test_an_idle_retained_pool_of_the_topology_wins_over_queue_depth(app: App) -> None:
    add_cluster(app, "tpu-a")
    add_cluster(app, "tpu-b")
    ctl = controller(app)
    t1, t2, t3 = (submit(app, "u", f"t{i}") for i in range(3))
    ctl.tick()
    assert [last(app, t, "ClusterChosen").cluster_name for t in (t1, t2, t3)] == [
        "tpu-a", "tpu-b", "tpu-a"]
    # t1 ends on tpu-a and its pool is handed over to t3; t2 ends on tpu-b, pool deleted.
    run(app, t1)
    append(app, t1, ev.JobSucceeded(1), ev.NodePoolRetained("falcon-pool-a", t3))
    run(app, t2)
    append(app, t2, ev.JobSucceeded(1), ev.NodePoolDeleteRequested("falcon-pool-b"))
    ctl.tick()  # t3 takes tpu-a's slot
    assert status(app, t3) == ("Pending", "Provisioning")
    t4 = submit(app, "u", "t4")
    ctl.tick()
    chosen = last(app, t4, "ClusterChosen")
    assert (chosen.cluster_name, chosen.why) == ("tpu-a", "idle-pool")
    assert [(c["name"], c["queued"], c["idle_pool"]) for c in chosen.candidates] == [
        ("tpu-a", 1, True), ("tpu-b", 0, False)]
    # Once t3 reuses the pool it is no longer idle: depth decides again.
    append(app, t3, ev.NodePoolReused("falcon-pool-a", t1, "reservation"))
    t5 = submit(app, "u", "t5")
    ctl.tick()
    assert (last(app, t5, "ClusterChosen").cluster_name,
            last(app, t5, "ClusterChosen").why) == ("tpu-b", "queue-depth")


# --------------------------------------------------------------------- the pick rule


def test_round_robin_across_actors_fifo_within_and_positions_follow_it(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    a1, a2, a3 = (submit(app, "user-a", f"a{i}") for i in (1, 2, 3))
    b1 = submit(app, "user-b", "b1")
    c1 = submit(app, "user-c", "c1")
    ctl.tick()
    assert status(app, a1) == ("Pending", "Provisioning")
    assert last(app, a1, "TaskPicked").why == "fifo"
    # a1 was served last: b1 is next although a2 was submitted earlier.
    assert position(row(app, b1)["message"]) == "#1, next in line"
    assert position(row(app, a2)["message"]) == "#2, 1 ahead (user-b: b1)"
    assert position(row(app, c1)["message"]) == "#3, 2 ahead (user-b: b1, user-a: a2)"
    assert position(row(app, a3)["message"]) == "#4, 3 ahead (user-b: b1, user-a: a2, user-c: c1)"
    order = []
    holder = a1
    for _ in range(4):
        run(app, holder)
        ctl.tick()
        holder = next(t for t in (a2, a3, b1, c1) if status(app, t)[1] == "Provisioning"
                      and t not in order)
        order.append(holder)
    assert order == [b1, a2, c1, a3]
    picked_b1 = last(app, b1, "TaskPicked")
    assert (picked_b1.why, picked_b1.last_actor) == ("round-robin", "user-a")
    assert [(c["actor"], c.get("skipped")) for c in picked_b1.candidates] == [
        ("user-a", "served last"), ("user-b", None), ("user-c", None)]
    assert last(app, a3, "TaskPicked").why == "only-waiting"


def test_one_actor_alone_is_served_again_and_again(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    tasks = [submit(app, "solo", f"s{i}") for i in range(3)]
    ctl.tick()
    for previous, following in itertools.pairwise(tasks):
        run(app, previous)
        ctl.tick()
        assert status(app, following) == ("Pending", "Provisioning")
        assert last(app, following, "TaskPicked").why in ("fifo", "only-waiting")


def test_one_tick_fills_every_free_slot_and_queues_never_block_each_other(app: App) -> None:
    add_cluster(app, "tpu-a")
    add_cluster(app, "tpu-b")
    ctl = controller(app)
    first = [submit(app, "u", f"{topology}-{i}", topology=topology)
             for topology in ("2x2", "2x4") for i in range(2)]
    ctl.tick()
    assert all(status(app, t) == ("Pending", "Provisioning") for t in first), "4 queues, 4 picks"
    later = [submit(app, "v", f"{topology}-late", topology=topology)
             for topology in ("2x2", "2x4") for _ in range(2)]
    ctl.tick()
    assert all(status(app, t) == ("Pending", "Waiting") for t in later)
    # Free only one queue: only that queue picks; the others keep their holder.
    holder = first[0]
    queue = (row(app, holder)["cluster_id"], "2x2")
    run(app, holder)
    ctl.tick()
    picked = [t for t in later if status(app, t)[1] == "Provisioning"]
    assert len(picked) == 1 and (row(app, picked[0])["cluster_id"], "2x2") == queue


def test_the_slot_is_held_until_running_or_terminal(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    t1, t2, t3, t4 = (submit(app, "u", f"t{i}") for i in range(4))
    ctl.tick()
    append(app, t1, ev.ReservationInsufficient("res", 0, 1, 1))
    ctl.tick()
    assert status(app, t2) == ("Pending", "Waiting"), "ClusterBusy holds the slot"
    append(app, t1, ev.NodePoolReused("falcon-pool", None, "reservation"))
    ctl.tick()
    assert status(app, t2) == ("Pending", "Waiting"), "Dispatching holds the slot"
    append(app, t1, ev.PodsRunning(1, 1))
    ctl.tick()
    assert status(app, t2) == ("Pending", "Provisioning"), "Running frees it"
    append(app, t2, ev.NodePoolFailed("falcon-pool-2", "stockout"))
    ctl.tick()
    assert status(app, t3) == ("Pending", "Provisioning"), "Failed frees it"
    # A slot holder being aborted keeps the slot until the abort has finished.
    job_rows.request_abort(app.engine, t3, app.clock.now())
    ctl.tick()
    assert status(app, t3) == ("Aborting", None)
    assert status(app, t4) == ("Pending", "Waiting")
    append(app, t3, ev.TaskAborted("Pending/Provisioning"))
    ctl.tick()
    assert status(app, t4) == ("Pending", "Provisioning")


def test_a_waiting_task_aborted_leaves_the_queue(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    t1, t2, t3 = (submit(app, "u", f"t{i}") for i in range(3))
    ctl.tick()
    job_rows.request_abort(app.engine, t2, app.clock.now())
    ctl.tick()
    app.clock.advance(app.settings.scheduling.position_refresh_seconds)
    ctl.tick()  # t3 moved up when t2 left: written once the queue's interval is over
    assert position(row(app, t3)["message"]) == "#1, next in line"
    run(app, t1)
    ctl.tick()
    assert status(app, t3) == ("Pending", "Provisioning")
    assert status(app, t2) == ("Aborting", None)


# --------------------------------------------------------------------- re-queue


def test_maintenance_requeues_waiting_tasks_and_leaves_the_others(app: App) -> None:
    add_cluster(app, "tpu-a")
    add_cluster(app, "tpu-b")
    ctl = controller(app)
    t1, t2, t3, t4 = (submit(app, "u", f"t{i}") for i in range(4))
    ctl.tick()
    on_a = [t for t in (t1, t2, t3, t4) if last(app, t, "ClusterChosen").cluster_name == "tpu-a"]
    acquiring, waiting = on_a
    run(app, t2)  # t2 (on tpu-b) is running there
    registry.set_status(app.store, "tpu-a", "maintenance")
    ctl.tick()
    assert types(app, waiting)[-3:] == ["TaskRequeued", "ClusterChosen", "TaskPicked"]
    requeued = last(app, waiting, "TaskRequeued")
    assert (requeued.from_cluster_name, requeued.cluster_status) == ("tpu-a", "maintenance")
    assert last(app, waiting, "ClusterChosen").cluster_name == "tpu-b"
    assert status(app, acquiring) == ("Pending", "Provisioning"), "acquiring stays"
    assert "TaskRequeued" not in types(app, acquiring)
    assert status(app, t2) == ("Running", None)


def test_requeue_with_no_other_active_cluster_waits_then_moves_on(app: App) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    t1, t2 = submit(app, "u", "t1"), submit(app, "u", "t2")
    ctl.tick()
    registry.set_status(app.store, "tpu-a", "offline")
    ctl.tick()
    assert types(app, t2)[-2:] == ["TaskRequeued", "NoActiveCluster"]
    assert row(app, t2)["message"] == "waiting for an active v6e cluster: tpu-a (offline)"
    assert row(app, t2)["cluster_id"] is None
    run(app, t1)
    ctl.tick()
    assert status(app, t2) == ("Pending", "Waiting"), "no pick on an offline cluster"
    registry.set_status(app.store, "tpu-a", "active")
    ctl.tick()
    assert types(app, t2)[-2:] == ["ClusterChosen", "TaskPicked"]


# --------------------------------------------------------------------- restart


def test_a_restarted_controller_remembers_who_was_served_last(app: App, db_url: str) -> None:
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    a1, a2 = submit(app, "user-a", "a1"), submit(app, "user-a", "a2")
    b1 = submit(app, "user-b", "b1")
    ctl.tick()
    run(app, a1)
    fresh = open_app(Settings(db_url=db_url), app.clock)
    try:
        controller(fresh).tick()
        assert status(fresh, b1) == ("Pending", "Provisioning")
        assert last(fresh, b1, "TaskPicked").why == "round-robin"
        assert status(fresh, a2) == ("Pending", "Waiting")
        assert position(row(fresh, a2)["message"]) == "#1, next in line"
    finally:
        fresh.close()


def test_a_tick_that_fails_leaves_no_trace_in_the_book(app: App) -> None:
    add_cluster(app, "tpu-a")

    def explode(tick: object, ctx: object) -> None:
        raise RuntimeError("a later handler failed")

    ctl = build_service(app, None, RunOptions(handlers=(*SCHEDULING, explode))).controller
    task = submit(app, "u", "t")
    with pytest.raises(RuntimeError):
        ctl.tick()
    assert types(app, task) == []
    ctl.handlers = SCHEDULING
    ctl.tick()
    assert types(app, task) == ["TaskAccepted", "ClusterChosen", "TaskPicked"]
    assert last(app, task, "ClusterChosen").candidates[0]["queued"] == 0
    assert last(app, task, "TaskPicked").last_actor is None, "the failed pick was rolled back"


def test_a_tick_that_lost_a_race_leaves_the_book_where_the_winner_put_the_tasks(
        app: App, db_url: str, clock) -> None:
    """Another writer moved a slot holder to Running; this controller's next tick was
    decided on the old version, the log refused it, and the reload must move the task
    in the queue book too, or the slot it freed would stay taken."""
    add_cluster(app, "tpu-a")
    ctl = controller(app)
    first, second = submit(app, "u", "t1"), submit(app, "u", "t2")
    ctl.tick()
    assert status(app, first) == ("Pending", "Provisioning")
    assert status(app, second) == ("Pending", "Waiting")

    other = open_app(Settings(db_url=db_url), clock)
    try:
        load_task_states(other)
        run(other, first)  # the winner: the pod runs, the slot is free
    finally:
        other.close()
    stale: list[str] = []

    def decide_on_the_old_version(tick, ctx) -> None:  # type: ignore[no-untyped-def]
        if not stale:
            stale.append(first)
            tick.emit(first, ev.ReservationInsufficient("res-a", 0, 1, 1))

    ctl.handlers = (*SCHEDULING, decide_on_the_old_version)
    assert ctl.tick().conflicts == 1
    assert app.tasks.get(first).status == "Running"
    ctl.tick()
    assert status(app, second) == ("Pending", "Provisioning")
    assert types(app, second)[-1] == "TaskPicked"
