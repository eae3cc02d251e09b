"""The orphan sweep: a Falcon pool on a cluster that no task is responsible for any
more is recorded as ``OrphanPoolFound`` (the executor deletes it); pools of live
tasks, pools deprovisioning still owns, pools GKE is deleting and other people's
pools are left alone. The sweep runs every ``orphan_sweep_seconds``."""

from __future__ import annotations

from types import MappingProxyType

from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.handlers import orphans, provisioning
from falcon_es.engine.runtime import Tick
from tests.support.bench import SQLITE_ONLY, HandlerBenches, reserved_cluster

pytestmark = SQLITE_ONLY

#: The label the sweep recognises Falcon's pools by.
FALCON = MappingProxyType({"managed-by": "falcon"})
#: Pools ``add_pool`` makes are flex-start: GKE lists them 20 s after the create.
VISIBLE = 20


def test_a_falcon_pool_no_task_knows_is_an_orphan_and_nothing_else_is(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster())
    cluster = bench.cluster()
    bench.add_pool("falcon-ghost-2x2", {**FALCON, "falcon-task": "ghost"})
    bench.add_pool("training-pool", FALCON)  # not a Falcon name
    bench.add_pool("falcon-lookalike-2x2", {"falcon-task": "lookalike"})  # not labelled ours
    bench.bring("live", "create-started")  # a pool a running create is making
    bench.advance(VISIBLE)

    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-ghost-2x2", "ghost"))]


def test_pools_deprovisioning_still_owns_are_left_to_it(make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster())
    bench.bring("undecided", "succeeded")
    bench.bring("retained", "succeeded")
    bench.given("retained", ev.NodePoolRetained("falcon-retained-2x2", "someone"))
    bench.bring("deleting", "succeeded")
    bench.given("deleting", ev.NodePoolDeleteRequested("falcon-deleting-2x2"))
    bench.bring("retrying", "succeeded")
    bench.given("retrying", ev.NodePoolDeleteRequested("falcon-retrying-2x2"),
                ev.NodePoolDeleteFailed("falcon-retrying-2x2", "try again later", 1))
    bench.advance(VISIBLE)

    assert bench.run() == []


def test_a_pool_whose_delete_was_recorded_is_an_orphan_once_the_create_grace_passed(
        make_bench: HandlerBenches) -> None:
    """GKE may list a pool late (a 404 on delete counted as done): the sweep deletes it,
    but never one younger than the create-visibility grace."""
    bench = make_bench(orphans.sweep_orphans, reserved_cluster(),
                       create_visibility_grace_seconds=300, orphan_sweep_seconds=60)
    cluster = bench.cluster()
    bench.bring("t1", "succeeded")
    bench.given("t1", ev.NodePoolDeleteRequested("falcon-t1-2x2"),
                ev.NodePoolDeleted("falcon-t1-2x2"))

    bench.advance(240)
    assert bench.run() == []

    bench.advance(60)
    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-t1-2x2", "t1"))]


def test_the_sweep_looks_again_only_after_its_interval(make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster(), orphan_sweep_seconds=300)
    cluster = bench.cluster()
    bench.add_pool("falcon-first-2x2", {**FALCON, "falcon-task": "first"})
    bench.advance(VISIBLE)
    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-first-2x2", "first"))]

    bench.add_pool("falcon-second-2x2", {**FALCON, "falcon-task": "second"})
    bench.advance(VISIBLE)
    assert bench.run() == []

    bench.advance(300 - VISIBLE)  # the first one's delete is still open: not found twice
    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-second-2x2", "second"))]


def test_a_pool_gke_is_already_deleting_is_no_orphan(make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster())
    bench.add_pool("falcon-going-2x2", {**FALCON, "falcon-task": "going"})
    bench.advance(300)  # RUNNING: GKE accepts a delete now
    bench.ports.node_pools.delete(bench.cluster(), "falcon-going-2x2")

    assert bench.run() == []


def test_a_multi_slice_task_holds_every_pool_of_its_group_and_no_more(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster())
    cluster = bench.cluster()
    bench.bring("ms", "running", topology="4x4", slices=2)
    labels = {**FALCON, "falcon-task": "ms"}
    bench.add_pool("falcon-ms-4x4-s1", labels, topology="4x4")
    bench.add_pool("falcon-ms-4x4-s2", labels, topology="4x4")  # beyond its two slices
    bench.advance(VISIBLE)

    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-ms-4x4-s2", "ms"))]


def test_every_pool_of_a_deleted_group_listed_again_is_an_orphan_after_the_grace(
        make_bench: HandlerBenches) -> None:
    bench = make_bench(orphans.sweep_orphans, reserved_cluster(),
                       create_visibility_grace_seconds=300, orphan_sweep_seconds=60)
    cluster = bench.cluster()
    bench.bring("t1", "succeeded", topology="4x4", slices=2)
    bench.add_pool("falcon-t1-4x4-s1", {**FALCON, "falcon-task": "t1"}, topology="4x4")
    others = ("falcon-t1-4x4-s1",)
    bench.given("t1", ev.NodePoolDeleteRequested("falcon-t1-4x4", others),
                ev.NodePoolDeleted("falcon-t1-4x4", others))

    bench.advance(240)
    assert bench.run() == []

    bench.advance(60)
    assert bench.run() == [
        (f"orphans:{cluster.id}", ev.OrphanPoolFound(cluster.id, name, "t1"))
        for name in ("falcon-t1-4x4", "falcon-t1-4x4-s1")]


def test_a_retained_pool_of_a_group_is_spared_and_its_deleted_sibling_swept(
        make_bench: HandlerBenches) -> None:
    """A two-slice task handed one pool over and deleted the other: the retained one is
    deprovisioning's while its taker waits; the other, its delete recorded but still
    listed, is an orphan once the create grace passed."""
    bench = make_bench(orphans.sweep_orphans, reserved_cluster(),
                       create_visibility_grace_seconds=300, orphan_sweep_seconds=60)
    cluster = bench.cluster()
    bench.bring("ms", "succeeded", slices=2, topology="4x4")
    bench.add_pool("falcon-ms-4x4-s1", {**FALCON, "falcon-task": "ms"})
    bench.given("ms", ev.NodePoolRetained("falcon-ms-4x4-s1", "waiting"),
                ev.NodePoolDeleteRequested("falcon-ms-4x4"), ev.NodePoolDeleted("falcon-ms-4x4"))
    bench.bring("waiting", "waiting", topology="4x4")

    bench.advance(300)
    assert bench.run() == [(f"orphans:{cluster.id}",
                            ev.OrphanPoolFound(cluster.id, "falcon-ms-4x4", "ms"))]



def provision_then_sweep(tick: Tick, ctx: HandlerContext) -> None:
    """The two handlers in the order a tick runs them: a hand-over, then a sweep."""
    provisioning.provision(tick, ctx)
    orphans.sweep_orphans(tick, ctx)


def test_a_pool_of_a_group_handed_over_in_this_tick_is_its_takers(
        make_bench: HandlerBenches) -> None:
    """The sweep reads holders as of the last commit: a pool the holder's stream says
    it handed over in this very tick is the taker's, and the taker runs on it."""
    bench = make_bench(provision_then_sweep, reserved_cluster(),
                       create_visibility_grace_seconds=300, orphan_sweep_seconds=60)
    bench.bring("ms", "succeeded", slices=2, topology="4x4")
    bench.add_pool("falcon-ms-4x4-s1", {**FALCON, "falcon-task": "ms"})
    bench.given("ms", ev.NodePoolRetained("falcon-ms-4x4", "s1"),
                ev.NodePoolRetained("falcon-ms-4x4-s1", "s2"))
    bench.bring("s1", "picked", topology="4x4")
    bench.bring("s2", "waiting", topology="4x4")
    bench.advance(300)

    assert bench.run() == [
        ("s1", ev.NodePoolReused("falcon-ms-4x4", "ms", "reservation", "ct6e-standard-4t")),
        ("ms", ev.NodePoolHandedOver("falcon-ms-4x4", "s1")),
    ]
