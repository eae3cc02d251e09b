"""What a cluster's reservation can serve decides where a task goes.

Never-fits is said, not retried: a task whose request no registered reservation of its
candidate clusters can ever serve (another machine type, or more VMs than the
reservation holds in total) fails at cluster choice naming both sides, or goes to a
cluster that can serve it. A waiting holder moves: a ClusterBusy slot holder that holds
nothing moves, like a waiting task of its queue, to another active cluster of its TPU
type whose queue is free and whose reservation has room for it now."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator


from falcon_es.adapters.sim.config import ReservationConfig
from falcon_es.projections.explain import explain
from falcon_es.domain.tpu import slice_shape
from falcon_es.projections import replay
from tests.support.harness import Harness, reserved_cluster

Make = Callable[..., Harness]


def _of_machine(name: str, count: int, machine_type: str) -> object:
    cluster = reserved_cluster(name, count=count)
    return dataclasses.replace(cluster, reservations=(
        ReservationConfig(f"{name}-r", count, 0, machine_type),))


def test_another_machine_type_fails_at_cluster_choice_naming_both_sides(make: Make) -> None:
    h = make(_of_machine("r4t", 8, "ct6e-standard-4t"))
    h.submit("t1", topology="1x1")  # one ct6e-standard-1t VM
    h.run()
    assert h.history["t1"] == [("Failed", "NoMatchingCluster")]
    assert h.row("t1")["message"] == (
        "no v6e cluster's reservation can ever serve 1x1, which needs 1 VM(s) of "
        "ct6e-standard-1t: reservation r4t-r of r4t holds 8 VM(s) of ct6e-standard-4t")
    assert "ReservationInsufficient" not in h.events("t1")
    assert h.world.pools(include_deleted=True) == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_more_vms_than_the_reservation_holds_fails(make: Make) -> None:
    h = make(_of_machine("small", 2, "ct6e-standard-4t"))
    h.submit("wide", topology="4x4")
    h.run()
    hosts = slice_shape("v6e", "4x4").hosts
    assert h.history["wide"] == [("Failed", "NoMatchingCluster")]
    assert h.row("wide")["message"] == (
        f"no v6e cluster's reservation can ever serve 4x4, which needs {hosts} VM(s) of "
        "ct6e-standard-4t: reservation small-r of small holds 2 VM(s) of ct6e-standard-4t")
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_task_goes_to_the_cluster_that_can_serve_it(make: Make) -> None:
    """The cluster that cannot serve it has the shorter queue; it goes to the other."""
    h = make(_of_machine("a-r8t", 8, "ct6e-standard-8t"), reserved_cluster("b-res", count=8))
    h.submit("busy", sim={"duration_seconds": 600})
    h.run(lambda: "ClusterChosen" in h.events("busy"))
    h.submit("t1", sim={"duration_seconds": 60})
    h.run()
    chosen = [r.event for r in h.app.store.read_stream("t1") if r.type_name == "ClusterChosen"]
    assert [c.cluster_name for c in chosen] == ["b-res"]
    assert h.history["t1"][-1] == ("Succeeded", None)


def _moves(h: Harness, task_id: str) -> list[tuple[str, str, str]]:
    return [(r.event.from_cluster_name, r.event.to_cluster_name, r.event.holder_reason)
            for r in h.app.store.read_stream(task_id) if r.type_name == "TaskMoved"]


def test_a_cluster_busy_holder_moves_to_where_the_reservation_has_room(make: Make) -> None:
    h = make(reserved_cluster("a-full", count=4, in_use=4), reserved_cluster("b-room", count=16))
    h.submit("t1", sim={"duration_seconds": 60})
    h.run(lambda: h.statuses()["t1"] == ("Pending", "ClusterBusy"))
    busy_at = h.clock.now()
    h.run()
    assert h.history["t1"][:2] == [("Pending", "ClusterBusy"), ("Pending", "Provisioning")]
    events = h.events("t1")
    assert events[events.index("TaskMoved"):][:2] == ["TaskMoved", "TaskPicked"]
    assert h.history["t1"][-1] == ("Succeeded", None)
    assert _moves(h, "t1") == [("a-full", "b-room", "ClusterBusy")]
    moved = next(r for r in h.app.store.read_stream("t1") if r.type_name == "TaskMoved")
    waited = (moved.recorded_at - busy_at).total_seconds()
    assert 900 <= waited <= 900 + 330  # FALCON_REPLACE_AFTER_SECONDS, then its next try
    assert [p.name for p in h.world.pools(include_deleted=True)] == ["falcon-t1-2x2"]
    assert h.live_pools("a-full") == []
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_holder_stays_where_no_other_reservation_has_room(make: Make) -> None:
    h = make(reserved_cluster("a-full", count=4, in_use=4),
             reserved_cluster("b-full", count=4, in_use=4))
    h.submit("t1")
    h.run_for(3600)
    assert h.statuses()["t1"] == ("Pending", "ClusterBusy")
    assert _moves(h, "t1") == []


def test_a_waiting_task_does_not_move_to_a_cluster_that_can_never_serve_it(make: Make) -> None:
    """The queue's holder is stuck in ClusterBusy on a full reservation; the only other
    cluster's reservation holds another machine type: the task behind it stays."""
    h = make(reserved_cluster("a-full", count=4, in_use=4), _of_machine("b-8t", 8,
                                                                         "ct6e-standard-8t"))
    h.submit("holder")
    h.clock.advance(1)
    h.submit("behind")
    h.run_for(3600)
    assert h.statuses()["behind"] == ("Pending", "Waiting")
    assert _moves(h, "behind") == [] and _moves(h, "holder") == []


def test_explain_names_both_sides_of_a_never_fits(make: Make) -> None:
    h = make(_of_machine("r4t", 8, "ct6e-standard-4t"))
    h.submit("t1", topology="1x1")
    h.run()
    tree = explain("t1", h.app.store.read_stream("t1"))
    texts = [node.text for node in _walk(tree)]
    assert any("reservation r4t-r of r4t holds 8 VM(s) of ct6e-standard-4t" in t for t in texts)


def _walk(node: object) -> Iterator[object]:
    yield node
    for child in getattr(node, "children", ()):
        yield from _walk(child)
