"""Names that cannot collide and ownership decided on the full task id.

``job-2026-07-01/user4883@example.com`` and ``job-2026-07-01/user8747@example.com``
once got the same pool, Job and label names (28 bits of hash); the second task's
pool create adopted the first task's live pool because ownership was read off the
shortened label. These tests pin the new names, their limits, the ownership rule and
that objects made the old way are still recognised; the same two ids run at once on
the gcp adapter and the fake servers in ``test_gcp_e2e.py`` and ``test_gcp_kube.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from falcon_es.domain import naming
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import NodePoolSpec
from falcon_es.domain.tpu import TPU_TYPES, slice_shape
from falcon_es.engine.task_manifests import (
    POOL_OWNER_LABEL, POOL_TASK_LABEL, pool_labels, pool_owner,
)
from falcon_es.storage.registry import list_clusters
from tests.support.harness import Crash, CrashPlan, Harness, reserved_cluster

Make = Callable[..., Harness]

FIRST = "job-2026-07-01/user4883@example.com"
SECOND = "job-2026-07-01/user8747@example.com"
LONGEST_TOPOLOGY = max((t for kind in TPU_TYPES.values() for t in kind.topologies), key=len)


# ------------------------------------------------------------------ the names

def test_the_two_ids_that_collided_get_names_of_their_own() -> None:
    # What the old names gave both of them: the same label, hence the same pool and Job.
    assert naming.legacy_task_label(FIRST) == naming.legacy_task_label(SECOND)
    for name in (naming.short_task_id, naming.job_name, naming.task_label, naming.log_dir,
                 naming.owner_digest, lambda t: naming.pool_name(t, "2x2")):
        assert name(FIRST) != name(SECOND)


def test_names_keep_their_limits_with_the_longest_topology_and_most_slices() -> None:
    long_id = "x" * 300 + "/@"
    pools = naming.pool_group(naming.pool_name(long_id, LONGEST_TOPOLOGY), 99)
    assert max(len(p) for p in pools) <= naming.MAX_POOL_NAME
    job = naming.job_name(long_id)
    # A JobSet's pod host name <jobset>-slice-<i>-<index> and an Indexed Job's pod
    # name <job>-<index>-<5 chars> are DNS labels too.
    assert len(f"{job}-slice-99-1535") <= 63 and len(f"{job}-1535-abcde") <= 63
    assert len(naming.task_label(long_id)) <= naming.MAX_LABEL_VALUE
    assert len(naming.owner_digest(long_id)) == 52  # 256 bits, a valid label value


def test_the_hash_bits_are_what_the_reference_page_states() -> None:
    hashed = naming.short_task_id(FIRST)
    assert len(hashed.rsplit("-", 1)[1]) * 5 == 65
    assert len(naming.task_label(FIRST).rsplit("-", 1)[1]) * 5 == 130
    # An id used as it is is shorter than any hashed form, so never equals one.
    assert naming.MAX_VERBATIM_ID < naming.NAME_HASH_CHARS
    assert naming.short_task_id("job-42") == "job-42"
    assert naming.short_task_id("a" * 13) != "a" * 13


# -------------------------------------------------------------- ownership

def test_ownership_is_decided_on_the_full_id_never_the_label() -> None:
    shared = naming.legacy_task_label(FIRST)
    assert naming.owned_by(naming.OwnerMarks(task_id=FIRST, label=shared), FIRST)
    assert not naming.owned_by(naming.OwnerMarks(task_id=FIRST, label=shared), SECOND)
    first_pool = pool_owner(pool_labels(FIRST, "2x2", "reservation"))
    assert naming.owned_by(first_pool, FIRST) and not naming.owned_by(first_pool, SECOND)
    assert not naming.owned_by(naming.OwnerMarks(), FIRST)


def test_objects_made_before_the_full_id_was_written_are_recognised_by_their_old_label() -> None:
    old_pool = pool_owner({POOL_TASK_LABEL: naming.legacy_task_label("t-0f1e2d3c4b5a6978")})
    assert naming.owned_by(old_pool, "t-0f1e2d3c4b5a6978")
    assert not naming.owned_by(old_pool, "t-0f1e2d3c4b5a6979")
    old_job = naming.OwnerMarks(label="job-42")
    assert naming.owned_by(old_job, "job-42") and not naming.owned_by(old_job, "job-43")


# ------------------------------------------------------------ end to end on the sim

def test_the_two_ids_run_at_once_on_one_cluster_and_topology_to_succeeded(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("first", task_id=FIRST)
    h.submit("second", task_id=SECOND)
    h.run()
    assert h.statuses() == {FIRST: ("Succeeded", None), SECOND: ("Succeeded", None)}
    pools = {p.name: dict(p.labels) for p in h.world.pools(include_deleted=True)}
    assert sorted(pools) == sorted(naming.pool_name(t, "2x2") for t in (FIRST, SECOND))
    assert {labels[POOL_OWNER_LABEL] for labels in pools.values()} == {
        naming.owner_digest(FIRST), naming.owner_digest(SECOND)}


def _registered(h: Harness) -> Cluster:
    with h.app.engine.connect() as conn:
        (cluster,) = list_clusters(conn)
    return cluster


def _pool_under_the_tasks_name(h: Harness, task_id: str, labels: dict[str, str]) -> None:
    h.ports.node_pools.create(NodePoolSpec(
        _registered(h), naming.pool_name(task_id, "2x2"), slice_shape("v6e", "2x2"),
        "reservation", "v6e-res-r", 60, labels))


def test_a_pool_made_the_old_way_is_adopted_by_its_task(make: Make) -> None:
    """A controller made the pool before the change and died before it recorded the
    create: the pool carries only the label of that time, and the controller that
    starts again re-issues the create, finds the pool and adopts it."""
    pool = naming.pool_name(FIRST, "2x2")
    plan = CrashPlan(effect_named=("create-pool", pool), effect_when="after")
    h = make(reserved_cluster(), plan=plan)
    h.submit("first", task_id=FIRST)
    with pytest.raises(Crash):
        h.run()
    made = h.world.cluster("v6e-res").gke.pools[pool]
    made.labels = {**{k: v for k, v in made.labels.items() if k != POOL_OWNER_LABEL},
                   POOL_TASK_LABEL: naming.legacy_task_label(FIRST)}
    h.restart()
    h.run()
    assert h.statuses()[FIRST] == ("Succeeded", None)
    assert [p.name for p in h.world.pools(include_deleted=True)] == [pool]  # not made again


def test_a_pool_of_another_task_under_the_tasks_name_is_never_adopted(make: Make) -> None:
    h = make(reserved_cluster())
    theirs = pool_labels(FIRST, "2x2", "reservation")
    _pool_under_the_tasks_name(h, SECOND, theirs)
    h.submit("second", task_id=SECOND)
    h.run(lambda: h.settled())
    assert h.statuses()[SECOND][0] == "Failed"
    assert (f"a node pool named {naming.pool_name(SECOND, '2x2')} already exists on v6e-res "
            "and is not this task's") in h.row(SECOND)["message"]
