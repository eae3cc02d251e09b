"""The simulated world (the ``sim`` backend of every port), on a virtual clock.

Each test builds a small world from a config dict with fixed latencies, drives it
through the ports exactly as handlers would, and moves time only with the clock.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from falcon_es.domain import events as ev
from falcon_es.adapters.sim import (
    SIM_ANNOTATION, SimConfig, SimConfigError, SimWorld, behaviour_from_tasks, build_sim_ports,
    load_sim_config,
)
from falcon_es.adapters.sim.config import ReservationSize
from falcon_es.domain.clock import VirtualClock
from falcon_es.app.simulate import simulate_world_path
from falcon_es.domain.ports import (
    ALREADY_EXISTS, FAILED, INVALID, NOT_FOUND, QUOTA_EXCEEDED, RETRYABLE, STOCKOUT, EdgeCluster,
    JobObservation, NodePoolSpec, PortError, Ports,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.spec import SimBehaviour, parse_spec
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.task_states import TaskStates
from falcon_es.domain.tpu import slice_shape

START = dt.datetime(2026, 11, 1, 9, 0, 0)
EDGE = "falcon-edge-events"

BASE: dict[str, Any] = {
    "defaults": {
        "create_latency_seconds": {"reservation": 60, "on-demand": 120, "flex-start": 300},
        "delete_latency_seconds": 30,
        "visibility_delay_seconds": {"reservation": 0, "on-demand": 0, "flex-start": 20},
        "node_register_seconds": 10,
        "node_ready_lag_seconds": 5,
        "quota": {"failure_after_seconds": 15},
    },
    "clusters": {
        "east": {"project": "proj-a", "location": "us-east5-b", "tpu_types": ["v6e"],
                 "default_reservation": "res-a",
                 "reservations": [{"name": "res-a", "count": 12, "in_use": 4},
                                  {"name": "res-8t", "count": 8, "machine_type": "ct6e-standard-8t"}]},
        "flex": {"project": "proj-b", "location": "us-central1-c", "tpu_types": ["v7x"]},
    },
    "jobs": {"pod_start_seconds": 5, "duration_seconds": 100},
}


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_cluster(name: str, **changes: Any) -> dict[str, Any]:
    """BASE with one cluster's entry changed."""
    data = copy.deepcopy(BASE)
    data["clusters"][name].update(copy.deepcopy(changes))
    return data


class Sim:
    """A world, its ports and a clock, plus the shorthands the tests share."""

    def __init__(self, config: Mapping[str, Any] | None = None, seed: int = 1, **kwargs: Any) -> None:
        self.clock = VirtualClock(START)
        self.world = SimWorld(self.clock, SimConfig.from_data(config or BASE), seed=seed, **kwargs)
        self.ports: Ports = build_sim_ports(self.world)
        self.east = cluster("east", "v6e", "proj-a", "us-east5-b")
        self.flex = cluster("flex", "v7x", "proj-b", "us-central1-c")

    def at(self, seconds: float) -> None:
        """Move the clock to START + seconds (forward only)."""
        self.clock.advance_to(START + dt.timedelta(seconds=seconds))
        self.world.step()

    def create(self, c: Cluster, name: str, topology: str, mode: str,
               reservation: str | None = None, scale_down: int = 600) -> Any:
        labels = {"managed-by": "falcon", "falcon-task": name.removeprefix("falcon-"),
                  "falcon-topology": topology, "falcon-supply-mode": mode}
        return self.ports.node_pools.create(NodePoolSpec(
            c, name, slice_shape(c.tpu_type, topology), mode, reservation, scale_down, labels))

    def edge(self, c: Cluster) -> EdgeCluster:
        return self.ports.edges.for_cluster(c)

    def drain(self) -> list[JobObservation]:
        """Pull and ack everything deliverable now."""
        messages = self.ports.bus.pull(EDGE)
        self.ports.bus.ack(EDGE, [m.id for m in messages])
        return [JobObservation.from_data(m.data) for m in messages]

    def run(self, limit: int = 500) -> list[JobObservation]:
        """Play the world to quiet, collecting every observation as it is delivered."""
        seen = self.drain()
        for _ in range(limit):
            if self.world.advance_to_next_due() is None:
                return seen
            seen += self.drain()
        raise AssertionError("the world never went quiet")


def cluster(name: str, tpu: str, project: str, location: str,
            reservation: str | None = None) -> Cluster:
    return Cluster(f"id-{name}", name, project, location, tpu, "bucket", reservation, "active", START)


def job(name: str, pool: str | None, *, task: str = "t1", hosts: int = 1, chips: str = "4",
        sim: Mapping[str, Any] | None = None, tolerate: bool = True, backoff: int | None = 0,
        ttl: int | None = None) -> dict[str, Any]:
    """A Job shaped like the dispatch handler's (selectors, TPU request, toleration)."""
    selector = {"cloud.google.com/gke-tpu-topology": "2x2"} if pool is None else {
        "cloud.google.com/gke-nodepool": pool}
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "nodeSelector": selector,
        "containers": [{"name": "task", "image": "us-docker.pkg.dev/p/r/train:1",
                        "resources": {"limits": {"google.com/tpu": chips},
                                      "requests": {"google.com/tpu": chips}}}],
    }
    if tolerate:
        pod["tolerations"] = [{"key": "google.com/tpu", "operator": "Exists",
                               "effect": "NoSchedule"}]
    spec: dict[str, Any] = {"completions": hosts, "parallelism": hosts, "template": {"spec": pod}}
    if backoff is not None:
        spec["backoffLimit"] = backoff
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    metadata: dict[str, Any] = {"name": name, "labels": {"managed-by": "falcon", "falcon-task": task},
                                "annotations": {"falcon/task-id": task}}
    if sim is not None:
        metadata["annotations"][SIM_ANNOTATION] = json.dumps(sim)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def phases(observation: JobObservation) -> list[tuple[str, str | None]]:
    return [(p.phase, p.reason) for p in observation.pods]


def ready_pool(sim: Sim, name: str = "falcon-a", topology: str = "2x2") -> None:
    """A reservation pool on ``east`` with its nodes Ready (create + 60 + 10 + 5 s)."""
    sim.create(sim.east, name, topology, "reservation", "res-a")
    sim.at(sim_seconds(sim) + 75)


def sim_seconds(sim: Sim) -> float:
    return (sim.clock.now() - START).total_seconds()


# ------------------------------------------------------------------ config


def test_an_empty_config_is_a_world_and_the_packaged_default_names_no_cluster() -> None:
    """The packaged default describes how any registered cluster behaves; the clusters
    themselves are the registry's."""
    assert SimConfig.from_data({}).clusters == ()
    packaged = load_sim_config()
    assert packaged.clusters == ()
    assert packaged.defaults.default_reservation_size == ReservationSize(16, 0, None)
    assert packaged.defaults.delete_failures.probability == 0.05


def test_the_simulate_world_keys_its_clusters_by_name() -> None:
    world = load_sim_config(simulate_world_path())
    by_name = {c.name: c for c in world.clusters}
    assert list(by_name) == ["v6e-reserved", "v7x-reserved", "v7x-flex"]  # the file's order
    assert by_name["v6e-reserved"].default_reservation == "v6e-res"
    assert by_name["v6e-reserved"].reservation("v6e-res").count == 16
    assert by_name["v7x-flex"].behaviour.stockout.first_n == 1
    # a per-cluster override changes only the keys it names
    assert by_name["v7x-flex"].behaviour.stockout.supply_modes == ("flex-start",)


def test_cluster_overrides_merge_over_defaults() -> None:
    config = SimConfig.from_data(with_cluster("flex", create_latency_seconds={"flex-start": [5, 9]}))
    flex, east = config.cluster("flex").behaviour, config.cluster("east").behaviour
    assert (flex.create_latency["flex-start"].low, flex.create_latency["flex-start"].high) == (5, 9)
    assert flex.create_latency["reservation"].low == 60  # from defaults
    assert east.create_latency["flex-start"].low == 300


@pytest.mark.parametrize(("data", "words"), [
    ({"clusterz": []}, "clusterz: unknown key"),
    ({"clusters": {"a": {"reservations": [{"name": "r", "count": -1}]}}},
     "clusters.a.reservations[0].count: -1 is below 0"),
    ({"clusters": {"a": {"reservations": [{"name": "r", "count": 2, "in_use": 3}]}}},
     "clusters.a.reservations[0].in_use: 3 exceeds count 2"),
    ({"clusters": [{"name": "a"}]}, "clusters: expected an object keyed by cluster name"),
    ({"clusters": {"a": []}}, "clusters.a: expected an object, found a list"),
    ({"clusters": {"a": {"name": "a"}}}, "clusters.a.name: unknown key"),
    ({"clusters": {"a": {"stockout": 0.5}}},
     "clusters.a.stockout: expected an object, found a number"),
    ({"clusters": {"a": {"stockout": {"probability": "often"}}}},
     "clusters.a.stockout.probability: expected a probability"),
    ({"clusters": {"a": {"create_latency_seconds": {"flex-start": [1, 2, 3]}}}},
     "clusters.a.create_latency_seconds.flex-start: expected seconds or [low, high]"),
    ({"clusters": {"a": {"default_reservation_size": 16}}},
     "clusters.a.default_reservation_size: expected an object, found a number"),
    ({"defaults": {"default_reservation_size": {"count": 2, "in_use": 5}}},
     "defaults.default_reservation_size.in_use: 5 exceeds count 2"),
    ({"defaults": {"create_latency_seconds": {"spot": 3}}},
     "defaults.create_latency_seconds.spot: not a supply mode"),
    ({"defaults": {"delete_latency_seconds": [9, 3]}}, "high is below low"),
    ({"delivery": {"duplicate_probability": 2}}, "delivery.duplicate_probability"),
    ({"jobs": {"outcome": "explode"}}, "jobs.outcome: 'explode'"),
    ({"defaults": {"quota": {"autoscaled_at": "never"}}},
     "defaults.quota.autoscaled_at: 'never'; expected one of scale-up, create"),
    ({"clusters": {"a": {"tpu_types": ["v9"]}}}, "clusters.a.tpu_types[0]"),
])
def test_a_bad_config_names_the_place_and_the_problem(data: dict[str, Any], words: str) -> None:
    with pytest.raises(SimConfigError) as caught:
        SimConfig.from_data(data, "w.json")
    assert str(caught.value).startswith("sim config w.json: ")
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_config_file_errors_say_which_file_and_line(tmp_path: Path) -> None:
    broken = tmp_path / "world.json"
    broken.write_text('{"seed": 1,\n "clusters": [}')
    with pytest.raises(SimConfigError, match=r"world.json: not valid JSON \(line 2"):
        load_sim_config(broken)
    with pytest.raises(SimConfigError, match="cannot read"):
        load_sim_config(tmp_path / "missing.json")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(BASE))
    assert [c.name for c in load_sim_config(good).clusters] == ["east", "flex"]
    duplicated = tmp_path / "twice.json"
    duplicated.write_text('{"clusters": {"a": {}, "a": {"system_nodes": 1}}}')
    with pytest.raises(SimConfigError, match="'a' is given twice in one object"):
        load_sim_config(duplicated)


# -------------------------------------------------------------- node pools


def test_create_follows_the_operation_to_running_then_nodes_register_and_become_ready() -> None:
    sim = Sim()
    op = sim.create(sim.east, "falcon-a", "4x4", "reservation", "res-a")
    assert not op.done and op.id.startswith("operation-")
    assert sim.ports.node_pools.get(sim.east, "falcon-a").status == "PROVISIONING"
    assert sim.world.next_due() == START + dt.timedelta(seconds=60)
    sim.at(60)
    assert sim.ports.node_pools.get_operation(sim.east, op.id).done
    info = sim.ports.node_pools.get(sim.east, "falcon-a")
    assert (info.status, info.node_count) == ("RUNNING", 4)
    edge = sim.edge(sim.east)
    assert (edge.node_counts("falcon-a").registered, edge.node_counts("falcon-a").ready) == (0, 0)
    sim.at(70)
    assert (edge.node_counts("falcon-a").registered, edge.node_counts("falcon-a").ready) == (4, 0)
    sim.at(75)
    assert edge.node_counts("falcon-a").ready == 4
    assert sim.world.next_due() is None
    with pytest.raises(PortError) as caught:
        sim.ports.node_pools.get_operation(sim.east, "operation-nope")
    assert caught.value.code == NOT_FOUND


def test_a_just_created_flex_pool_404s_inside_the_visibility_window() -> None:
    sim = Sim()
    sim.create(sim.flex, "falcon-f", "2x2x2", "flex-start")
    for second in (0, 10, 19.9):
        sim.at(second)
        with pytest.raises(PortError) as caught:
            sim.ports.node_pools.get(sim.flex, "falcon-f")
        assert caught.value.code == NOT_FOUND
        assert "Not found: projects/proj-b/locations/us-central1-c/clusters/flex/nodePools/falcon-f" \
            in caught.value.message
        assert sim.ports.node_pools.list(sim.flex) == []
    # the name is taken all the same: a second create must adopt, not duplicate
    with pytest.raises(PortError) as caught:
        sim.create(sim.flex, "falcon-f", "2x2x2", "flex-start")
    assert caught.value.code == ALREADY_EXISTS
    sim.at(20)
    assert sim.ports.node_pools.get(sim.flex, "falcon-f").status == "PROVISIONING"
    assert [p.name for p in sim.ports.node_pools.list(sim.flex)] == ["falcon-f"]


def test_create_of_an_existing_pool_is_already_exists() -> None:
    sim = Sim()
    sim.create(sim.east, "falcon-a", "2x2", "on-demand")
    with pytest.raises(PortError) as caught:
        sim.create(sim.east, "falcon-a", "2x2", "on-demand")
    assert caught.value.code == ALREADY_EXISTS
    assert "Already exists: projects/proj-a/locations/us-east5-b/clusters/east/nodePools/falcon-a" \
        in caught.value.message


@pytest.mark.parametrize(("name", "labels", "tpu", "words"), [
    ("Falcon-A", {}, "v6e", "Invalid value for field 'node_pool.name'"),
    ("falcon-" + "x" * 40, {}, "v6e", "no longer than 40"),
    ("falcon-a", {"falcon-task": "bad value!"}, "v6e", "a valid label must be"),
    ("falcon-a", {}, "v7x", "is not available in zone us-east5-b"),
])
def test_the_api_refuses_bad_names_labels_and_foreign_tpu_types(
        name: str, labels: dict[str, str], tpu: str, words: str) -> None:
    sim = Sim()
    topology = "2x2" if tpu == "v6e" else "2x2x1"
    with pytest.raises(PortError) as caught:
        sim.ports.node_pools.create(NodePoolSpec(
            sim.east, name, slice_shape(tpu, topology), "on-demand", None, 600, labels))
    assert caught.value.code == INVALID
    assert words in caught.value.message


def test_list_carries_labels_and_the_pool_records_its_scale_down_time() -> None:
    sim = Sim()
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a", scale_down=600)
    sim.create(sim.east, "falcon-b", "2x2", "on-demand", scale_down=21600)
    pools = {p.name: p for p in sim.ports.node_pools.list(sim.east)}
    assert pools["falcon-a"].labels == {"managed-by": "falcon", "falcon-task": "a",
                                        "falcon-topology": "2x2", "falcon-supply-mode": "reservation"}
    assert pools["falcon-b"].labels["falcon-supply-mode"] == "on-demand"
    assert sim.world.pool("east", "falcon-a").scale_down_unneeded_seconds == 600
    assert sim.world.pool("east", "falcon-b").scale_down_unneeded_seconds == 21600
    assert sim.world.pool("east", "falcon-a").reservation == "res-a"


# ------------------------------------------------------------ reservations


def test_reservation_remaining_counts_the_vms_that_exist_and_live_pools_hold_them() -> None:
    sim = Sim()
    shape = slice_shape("v6e", "4x4")  # 4 hosts
    remaining = lambda: sim.ports.reservations.remaining_slices(sim.east, "res-a", shape)  # noqa: E731
    assert remaining() == 2  # (12 - 4 in use) // 4
    sim.create(sim.east, "falcon-a", "4x4", "reservation", "res-a")
    sim.create(sim.east, "falcon-b", "4x4", "reservation", "res-a")
    # Compute's inUseCount counts VMs that exist: pools being created are not in it yet
    # (their VMs are allocated, which the next test shows), so a reader sees room.
    assert remaining() == 2
    usage = sim.world.reservation_usage("east", "res-a")
    assert (usage.count, usage.in_use, usage.held_by_pools, usage.remaining) == (12, 4, 8, 0)
    sim.at(75)  # both pools' VMs are up
    assert remaining() == 0
    # a full path names the same reservation
    assert sim.ports.reservations.remaining_slices(
        sim.east, "projects/proj-a/zones/us-east5-b/reservations/res-a", slice_shape("v6e", "2x2")) == 0
    assert sim.ports.node_pools.delete(sim.east, "falcon-a") is not None
    assert remaining() == 0  # still held while deleting
    sim.at(105)
    assert remaining() == 1


def test_a_create_beyond_the_reservation_fails_its_operation_with_stockout_words() -> None:
    sim = Sim()
    sim.create(sim.east, "falcon-a", "4x4", "reservation", "res-a")
    sim.create(sim.east, "falcon-b", "4x4", "reservation", "res-a")
    op = sim.create(sim.east, "falcon-c", "4x4", "reservation", "res-a")
    sim.at(15)
    done = sim.ports.node_pools.get_operation(sim.east, op.id)
    assert done.done and done.error_code == STOCKOUT
    assert "Specified reservation 'res-a' does not have available resources" in done.error
    assert "0 available" in done.error
    failed = sim.ports.node_pools.get(sim.east, "falcon-c")
    assert failed.status == "ERROR" and failed.status_message == done.error


def test_unknown_reservation_is_not_found_and_another_machine_type_offers_nothing() -> None:
    sim = Sim()
    with pytest.raises(PortError) as caught:
        sim.ports.reservations.remaining_slices(sim.east, "nope", slice_shape("v6e", "2x2"))
    assert caught.value.code == NOT_FOUND
    assert "reservation nope not found in project proj-a zone us-east5-b" in caught.value.message
    assert "projects/proj-a/zones/us-east5-b/reservations/nope" in caught.value.message
    assert sim.ports.reservations.remaining_slices(sim.east, "res-8t", slice_shape("v6e", "2x2")) == 0
    assert sim.ports.reservations.remaining_slices(sim.east, "res-8t", slice_shape("v6e", "2x4")) == 8
    with pytest.raises(PortError) as caught:
        sim.create(sim.east, "falcon-a", "2x2", "reservation", "nope")
    assert caught.value.code == INVALID and "reservation nope not found" in caught.value.message


# ------------------------------------------------------- quota and stockouts


def test_quota_errors_fail_the_operation_with_gke_words_and_leave_an_error_pool() -> None:
    """A fixed-size pool makes its VMs at create: the quota bites its create operation."""
    sim = Sim(merged(BASE, {"defaults": {"quota": {"first_n": 1}}}))
    first = sim.create(sim.flex, "falcon-q", "2x2x2", "on-demand")
    second = sim.create(sim.flex, "falcon-r", "2x2x2", "on-demand")
    sim.at(15)
    failed = sim.ports.node_pools.get_operation(sim.flex, first.id)
    assert failed.done and failed.error_code == QUOTA_EXCEEDED
    assert failed.error.startswith("Insufficient quota to satisfy the request:")
    assert "Quota 'TPUS_PER_TPU_FAMILY' exceeded" in failed.error
    assert "in region us-central1" in failed.error
    sim.at(20)
    assert sim.ports.node_pools.get(sim.flex, "falcon-q").status == "ERROR"
    assert not sim.ports.node_pools.get_operation(sim.flex, second.id).done
    sim.at(300)
    assert sim.ports.node_pools.get_operation(sim.flex, second.id).error is None
    assert sim.ports.node_pools.get(sim.flex, "falcon-r").status == "RUNNING"


QUOTA_WORDS = ("cluster autoscaler FailedScaleUp: Node scale up in zones us-central1-c "
               "associated with this pod failed: GCE quota exceeded. Pod is at risk of not "
               "being scheduled.")


def test_an_autoscaled_pool_is_refused_for_quota_at_each_scale_up_not_at_create() -> None:
    """A flex-start pool has no VMs at create: its create succeeds, and the quota rule's
    refusal is the autoscaler's FailedScaleUp on the pending pods, for the pool's life."""
    sim = Sim(merged(BASE, {"defaults": {"quota": {"first_n": 1}}}))
    edge = sim.edge(sim.flex)
    created = sim.create(sim.flex, "falcon-q", "2x2x2", "flex-start")
    sim.at(300)
    assert sim.ports.node_pools.get_operation(sim.flex, created.id).error is None
    assert sim.ports.node_pools.get(sim.flex, "falcon-q").status == "RUNNING"
    edge.submit_job(job("falcon-t1", "falcon-q", hosts=2))
    sim.at(301)
    diagnosis = edge.diagnose_pending("falcon-t1")
    assert diagnosis is not None and diagnosis.startswith(QUOTA_WORDS)
    assert diagnosis.index("GCE quota exceeded") < diagnosis.index("Unschedulable")
    # another pool coming and going frees chips, but a refused pool stays refused
    sim.create(sim.flex, "falcon-r", "2x2x1", "on-demand")
    sim.at(500)
    sim.ports.node_pools.delete(sim.flex, "falcon-r")
    sim.at(3600)
    assert edge.node_counts("falcon-q").registered == 0
    assert edge.diagnose_pending("falcon-t1").startswith(QUOTA_WORDS)


def test_an_autoscaled_pool_is_refused_at_create_when_gke_checks_quota_there() -> None:
    """The other reading (GKE's docs do not say): the 0-node pool's create fails."""
    sim = Sim(merged(BASE, {"defaults": {"quota": {"first_n": 1, "autoscaled_at": "create"}}}))
    created = sim.create(sim.flex, "falcon-q", "2x2x2", "flex-start")
    sim.at(15)
    failed = sim.ports.node_pools.get_operation(sim.flex, created.id)
    assert failed.done and failed.error_code == QUOTA_EXCEEDED
    assert "Quota 'TPUS_PER_TPU_FAMILY' exceeded" in failed.error


def test_the_chip_limit_counts_an_autoscaled_pools_nodes_and_a_refusal_clears_when_freed() -> None:
    sim = Sim(merged(BASE, {"defaults": {"quota": {"tpu_chip_limit": 8,
                                                   "failure_after_seconds": 1}}}))
    edge = sim.edge(sim.flex)
    sim.create(sim.flex, "falcon-a", "2x2x2", "flex-start", scale_down=600)  # 8 chips
    sim.create(sim.flex, "falcon-b", "2x2x1", "flex-start")  # 4 chips
    sim.at(300)  # both RUNNING with no nodes: no chips in use yet
    assert sim.world.cluster("flex").gke.quota_chips_in_use() == 0
    edge.submit_job(job("falcon-t1", "falcon-a", hosts=2,
                        sim={"outcome": "succeed", "duration_seconds": 100}))
    assert sim.world.cluster("flex").gke.quota_chips_in_use() == 8  # its scale-up is under way
    edge.submit_job(job("falcon-t2", "falcon-b", hosts=1, task="t2"))
    assert edge.diagnose_pending("falcon-t2").startswith(QUOTA_WORDS)
    # a fixed-size pool counts against the same chips
    over = sim.create(sim.flex, "falcon-c", "2x2x1", "on-demand")
    sim.at(301)
    assert sim.ports.node_pools.get_operation(sim.flex, over.id).error_code == QUOTA_EXCEEDED
    # its failure freed no chip that helps: the autoscaler's retry is refused again
    assert sim.world.cluster("flex").gke.pools["falcon-b"].autoscaler_event_count == 2
    sim.at(316)  # falcon-a's nodes Ready, t1 runs 320..420
    assert edge.node_counts("falcon-a").ready == 2
    assert edge.node_counts("falcon-b").registered == 0
    sim.at(1019)  # falcon-a unneeded since 420: scaled down at 1020
    assert edge.node_counts("falcon-b").registered == 0
    sim.at(1021)  # the chips are free: the autoscaler retries falcon-b's scale-up
    assert "TriggeredScaleUp" in edge.diagnose_pending("falcon-t2")
    sim.at(1021 + 15)
    assert edge.node_counts("falcon-b").ready == 1


def test_a_tpu_chip_limit_is_an_explicit_quota_rule_and_reservations_need_no_quota() -> None:
    sim = Sim(merged(BASE, {"defaults": {"quota": {"tpu_chip_limit": 8, "failure_after_seconds": 1}}}))
    ok = sim.create(sim.flex, "falcon-a", "2x2x2", "on-demand")  # 8 chips
    over = sim.create(sim.flex, "falcon-b", "2x2x1", "on-demand")  # 4 more
    sim.at(1)
    assert sim.ports.node_pools.get_operation(sim.flex, over.id).error_code == QUOTA_EXCEEDED
    assert "Limit: 8.0 in region us-central1" in sim.ports.node_pools.get_operation(sim.flex, over.id).error
    assert not sim.ports.node_pools.get_operation(sim.flex, ok.id).done
    reserved = sim.create(sim.east, "falcon-c", "4x4", "reservation", "res-a")
    sim.at(60)
    assert sim.ports.node_pools.get_operation(sim.east, reserved.id).error is None


def test_a_flex_start_stockout_keeps_the_pool_running_with_no_nodes_until_it_resolves() -> None:
    sim = Sim(with_cluster("flex", stockout={"first_n": 1, "duration_seconds": 600}))
    edge = sim.edge(sim.flex)
    sim.create(sim.flex, "falcon-f", "2x2x2", "flex-start")
    edge.submit_job(job("falcon-t1", "falcon-f", hosts=2))
    sim.at(300)
    assert sim.ports.node_pools.get(sim.flex, "falcon-f").status == "RUNNING"
    sim.at(899)
    assert edge.node_counts("falcon-f").registered == 0
    diagnosis = edge.diagnose_pending("falcon-t1")
    # root cause first (the autoscaler's event on the pod), the scheduling symptom after
    assert diagnosis.startswith(
        "cluster autoscaler FailedScaleUp: Node scale up in zones us-central1-c associated "
        "with this pod failed: GCE out of resources")
    assert diagnosis.index("GCE out of resources") < diagnosis.index(
        "Unschedulable: 0/3 nodes are available")
    assert sim.world.pool("flex", "falcon-f").stocked_out
    sim.at(910)  # 300 + 600 + 10 to register
    assert (edge.node_counts("falcon-f").registered, edge.node_counts("falcon-f").ready) == (2, 0)
    assert "2/2 nodes registered, 0 Ready" in edge.diagnose_pending("falcon-t1")
    sim.at(915)
    assert edge.node_counts("falcon-f").ready == 2
    assert edge.diagnose_pending("falcon-t1") is None  # scheduled, containers starting
    assert not sim.world.pool("flex", "falcon-f").stocked_out
    # the next flex pool is not stocked out (first_n = 1), but gets nodes only for pods
    sim.create(sim.flex, "falcon-g", "2x2x1", "flex-start")
    sim.at(915 + 300 + 600)
    assert edge.node_counts("falcon-g").registered == 0
    edge.submit_job(job("falcon-t2", "falcon-g", hosts=1))
    assert "TriggeredScaleUp: pod triggered scale-up" in edge.diagnose_pending("falcon-t2")
    sim.at(915 + 300 + 600 + 15)
    assert sim.edge(sim.flex).node_counts("falcon-g").ready == 1


def test_an_autoscaled_pool_scales_down_after_its_unneeded_time() -> None:
    """Cluster autoscaler: nodes unneeded for the pool's scale-down-unneeded time go;
    a pod pending for the pool again brings them back."""
    sim = Sim(with_cluster("flex"))
    edge = sim.edge(sim.flex)
    sim.create(sim.flex, "falcon-f", "2x2x1", "flex-start", scale_down=600)
    sim.at(300)
    assert edge.node_counts("falcon-f").registered == 0  # RUNNING, no pods: no nodes
    edge.submit_job(job("falcon-t1", "falcon-f", hosts=1,
                        sim={"outcome": "succeed", "duration_seconds": 100}))
    sim.at(316)  # registered at 310, Ready at 315, the pod bound
    assert edge.node_counts("falcon-f").ready == 1
    sim.at(1015)  # the pod ran 320..420: unneeded since 420, for 595 s
    assert edge.node_counts("falcon-f").registered == 1
    sim.at(1021)
    assert edge.node_counts("falcon-f").registered == 0
    edge.submit_job(job("falcon-t2", "falcon-f", hosts=1))
    sim.at(1021 + 15)
    assert edge.node_counts("falcon-f").ready == 1


def test_a_stockout_for_good_never_brings_nodes_and_leaves_nothing_due() -> None:
    sim = Sim(with_cluster("flex", stockout={"probability": 1.0, "duration_seconds": None}))
    sim.create(sim.flex, "falcon-f", "2x2x1", "flex-start")
    sim.at(300)
    assert sim.ports.node_pools.get(sim.flex, "falcon-f").status == "RUNNING"
    assert sim.world.next_due() is None
    sim.at(86400)
    assert sim.edge(sim.flex).node_counts("falcon-f").registered == 0


# ----------------------------------------------------------------- deletes


def test_injected_delete_failures_are_retryable_then_the_delete_goes_through() -> None:
    sim = Sim(merged(BASE, {"defaults": {"delete_failures": {"first_n": 2}}}))
    ready_pool(sim)
    errors = []
    for _ in range(2):
        with pytest.raises(PortError) as caught:
            sim.ports.node_pools.delete(sim.east, "falcon-a")
        errors.append(caught.value)
    assert [e.code for e in errors] == [RETRYABLE, RETRYABLE]
    assert all("Too many operations" in e.message or "incompatible operation" in e.message
               for e in errors)
    op = sim.ports.node_pools.delete(sim.east, "falcon-a")
    assert op is not None and not op.done
    assert sim.ports.node_pools.get(sim.east, "falcon-a").status == "STOPPING"
    # deleting again while it is being deleted names the same operation
    assert sim.ports.node_pools.delete(sim.east, "falcon-a").id == op.id
    sim.at(sim_seconds(sim) + 30)
    assert sim.ports.node_pools.get_operation(sim.east, op.id).done
    with pytest.raises(PortError) as caught:
        sim.ports.node_pools.get(sim.east, "falcon-a")
    assert caught.value.code == NOT_FOUND
    assert sim.ports.node_pools.delete(sim.east, "falcon-a") is None  # gone: done
    assert sim.world.pools("east", include_deleted=True)[0].status == "DELETED"


def test_deleting_a_pool_still_being_created_is_a_retryable_precondition() -> None:
    sim = Sim()
    op = sim.create(sim.east, "falcon-a", "2x2", "on-demand")
    with pytest.raises(PortError) as caught:
        sim.ports.node_pools.delete(sim.east, "falcon-a")
    assert caught.value.code == RETRYABLE
    assert f"Operation {op.id} is currently creating node pool falcon-a" in caught.value.message
    assert sim.ports.node_pools.delete(sim.east, "never-made") is None


def test_the_concurrent_operations_limit_answers_with_gke_429_words() -> None:
    sim = Sim(merged(BASE, {"defaults": {"max_concurrent_operations": 1}}))
    sim.create(sim.east, "falcon-a", "2x2", "on-demand")
    with pytest.raises(PortError) as caught:
        sim.create(sim.east, "falcon-b", "2x2", "on-demand")
    assert caught.value.code == RETRYABLE
    assert "hits the concurrent operations quota 1" in caught.value.message
    sim.at(120)
    sim.create(sim.east, "falcon-b", "2x2", "on-demand")


# --------------------------------------------------------------------- Jobs


def test_a_job_waits_for_its_pool_then_runs_and_succeeds_with_rising_resource_versions() -> None:
    sim = Sim()
    edge = sim.edge(sim.east)
    sim.create(sim.east, "falcon-a", "4x4", "reservation", "res-a")
    ref = edge.submit_job(job("falcon-t1", "falcon-a", hosts=4))
    assert (ref.name, ref.task_id) == ("falcon-t1", "t1")
    assert edge.get_job("falcon-t1") == ref
    seen = sim.run()
    versions = [o.resource_version for o in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert all(o.job_uid == ref.uid and o.task_id == "t1" for o in seen)
    assert phases(seen[0]) == [("Pending", "Unschedulable")] * 4
    assert "0/3 nodes are available: 3 node(s) didn't match" in seen[0].pods[0].message
    running = next(o for o in seen if o.active == 4)
    assert running.observed_at == START + dt.timedelta(seconds=80)  # ready at 75, started +5
    assert phases(running) == [("Running", None)] * 4
    final = seen[-1]
    assert (final.condition, final.succeeded, final.active, final.completions) == ("Complete", 4, 0, 4)
    assert final.observed_at == START + dt.timedelta(seconds=180)
    assert {p.exit_code for p in final.pods} == {0}
    assert sim.world.job_state("east", "falcon-t1").condition == "Complete"


def test_submit_of_an_existing_job_is_already_exists_and_uids_are_deterministic() -> None:
    first, second = Sim(seed=5), Sim(seed=5)
    refs = [s.edge(s.east).submit_job(job("falcon-t1", "falcon-a")) for s in (first, second)]
    assert refs[0].uid == refs[1].uid
    with pytest.raises(PortError) as caught:
        first.edge(first.east).submit_job(job("falcon-t1", "falcon-a"))
    assert caught.value.code == ALREADY_EXISTS
    assert caught.value.message == 'jobs.batch "falcon-t1" already exists'
    assert Sim(seed=6).edge(first.east).submit_job(job("falcon-t1", "falcon-a")).uid != refs[0].uid


@pytest.mark.parametrize(("manifest_change", "words"), [
    ({"metadata": {"name": ""}}, "metadata.name: Required value"),
    ({"metadata": {"name": "Falcon_T1"}}, "a lowercase RFC 1123 label"),
    ({"kind": "Pod"}, "expected batch/v1 Job"),
    ({"spec": {"template": {"spec": {"containers": []}}}}, "spec.template.spec.containers"),
    ({"spec": {"backoffLimit": -1}}, "spec.backoffLimit"),
    ({"metadata": {"annotations": {SIM_ANNOTATION: "{oops"}}}, "not JSON"),
    ({"metadata": {"annotations": {SIM_ANNOTATION: '{"outcome": "explode"}'}}}, "outcome 'explode'"),
])
def test_a_malformed_job_is_refused_with_kubernetes_words(manifest_change: dict[str, Any],
                                                         words: str) -> None:
    sim = Sim()
    with pytest.raises(PortError) as caught:
        sim.edge(sim.east).submit_job(merged(job("falcon-t1", "falcon-a"), manifest_change))
    assert caught.value.code == INVALID
    assert caught.value.message.startswith('Job.batch "')
    assert words in caught.value.message


def test_oom_kills_the_pod_with_exit_code_137_and_fails_the_job() -> None:
    sim = Sim()
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", sim={"outcome": "oom",
                                                                    "duration_seconds": 30}))
    final = sim.run()[-1]
    assert final.condition == "Failed" and final.failed == 1
    assert [(p.phase, p.reason, p.exit_code) for p in final.pods] == [("Failed", "OOMKilled", 137)]
    assert final.observed_at == START + dt.timedelta(seconds=75 + 5 + 30)


def test_a_failing_command_ends_with_its_exit_code() -> None:
    sim = Sim()
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a",
                                      sim={"outcome": "fail", "exit_code": 3}))
    final = sim.run()[-1]
    assert final.condition == "Failed"
    assert [(p.phase, p.reason, p.exit_code) for p in final.pods] == [("Failed", "Error", 3)]


def test_backoff_limit_retries_a_failed_pod_before_the_job_fails() -> None:
    sim = Sim()
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", backoff=1,
                                      sim={"outcome": "fail", "exit_code": 2,
                                           "duration_seconds": 10}))
    seen = sim.run()
    first_failure = next(o for o in seen if o.failed == 1)
    assert first_failure.condition is None
    final = seen[-1]
    assert (final.condition, final.failed) == ("Failed", 2)
    assert [p.phase for p in final.pods] == ["Failed", "Failed"]
    assert len({p.name for p in final.pods}) == 2  # the replacement is a new pod


def test_an_image_that_cannot_be_pulled_keeps_the_pod_pending_with_the_reason() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", sim={"outcome": "image-pull-error"}))
    sim.at(sim_seconds(sim) + 5)
    pulled = sim.drain()[-1]
    assert phases(pulled) == [("Pending", "ErrImagePull")]
    assert 'Failed to pull image "us-docker.pkg.dev/p/r/train:1"' in pulled.pods[0].message
    assert edge.diagnose_pending("falcon-t1").startswith(
        f"pod {pulled.pods[0].name}: ErrImagePull: Failed to pull image")
    sim.at(sim_seconds(sim) + 20)
    backoff = sim.drain()[-1]
    assert phases(backoff) == [("Pending", "ImagePullBackOff")]
    assert backoff.condition is None and backoff.resource_version > pulled.resource_version
    assert sim.world.next_due() is None  # it stays that way until someone deletes the Job


def test_an_unschedulable_job_stays_pending_with_a_failed_scheduling_message() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", sim={"outcome": "unschedulable"}))
    seen = sim.run()
    assert phases(seen[-1]) == [("Pending", "Unschedulable")]
    message = seen[-1].pods[0].message
    assert message.startswith("0/4 nodes are available: 1 Insufficient memory, 3 node(s) didn't match")
    assert "preemption: 0/4 nodes are available" in message
    diagnosis = edge.diagnose_pending("falcon-t1")
    assert diagnosis == f"pod {seen[-1].pods[0].name} Unschedulable: {message}"


def test_a_pod_without_the_tpu_toleration_never_lands_on_tpu_nodes() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", tolerate=False))
    sim.run()
    assert "1 node(s) had untolerated taint {google.com/tpu: present}" in edge.diagnose_pending("falcon-t1")


def test_a_job_asking_more_chips_than_a_vm_has_is_insufficient_tpu() -> None:
    sim = Sim()
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", chips="8"))
    assert "1 Insufficient google.com/tpu" in sim.run()[-1].pods[0].message


def test_a_busy_pool_is_the_root_cause_and_deleting_the_job_frees_its_nodes() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", sim={"duration_seconds": 10_000}))
    edge.submit_job(job("falcon-t2", "falcon-a", task="t2"))
    sim.at(sim_seconds(sim) + 10)
    assert edge.diagnose_pending("falcon-t2").startswith(
        "node pool falcon-a is busy: its nodes run pods of Job falcon-t1")
    sim.drain()
    edge.delete_job("falcon-t1")
    edge.delete_job("falcon-t1")  # not found is fine
    assert edge.get_job("falcon-t1") is None
    seen = sim.run()
    assert {o.job_name for o in seen} == {"falcon-t2"}  # nothing more about the deleted Job
    assert seen[-1].condition == "Complete"


def test_a_pool_deleted_under_a_running_job_fails_its_pods() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", sim={"duration_seconds": 10_000}))
    sim.at(sim_seconds(sim) + 10)
    sim.ports.node_pools.delete(sim.east, "falcon-a")
    final = sim.run()[-1]
    assert final.condition == "Failed"
    assert final.pods[0].reason == "DeletionByPodGC"
    assert "deleted with node pool falcon-a" in final.pods[0].message


def multi_host_job(name: str, pool: str, *, hosts: int, **options: Any) -> dict[str, Any]:
    """``job`` with the pods' subdomain the renderer gives a multi-host Job."""
    manifest = job(name, pool, hosts=hosts, **options)
    manifest["metadata"]["namespace"] = "falcon-jobs"
    manifest["spec"]["completionMode"] = "Indexed"
    manifest["spec"]["template"]["spec"]["subdomain"] = name
    return manifest


def test_a_multi_host_job_has_its_headless_service_until_the_job_is_deleted() -> None:
    sim = Sim()
    edge = sim.edge(sim.east)
    sim.create(sim.east, "falcon-a", "4x4", "reservation", "res-a")
    ref = edge.submit_job(multi_host_job("falcon-t1", "falcon-a", hosts=4))

    service = sim.world.service("east", "falcon-t1")
    assert service is not None
    assert (service.owner_uids, service.task_label, service.headless) == ((ref.uid,), "t1", True)
    assert dict(service.selector) == {"job-name": "falcon-t1"}
    assert sim.run()[-1].condition == "Complete"
    assert sim.world.service("east", "falcon-t1") is not None  # the Job is still there

    edge.delete_job("falcon-t1")

    assert sim.world.service("east", "falcon-t1") is None


def test_the_ttl_controller_takes_the_service_along_with_the_job() -> None:
    sim = Sim()
    edge = sim.edge(sim.east)
    ready_pool(sim, "falcon-a", "4x4")
    edge.submit_job(multi_host_job("falcon-t1", "falcon-a", hosts=4, ttl=60,
                                   sim={"duration_seconds": 10}))
    sim.run()
    assert edge.get_job("falcon-t1") is None
    assert sim.world.service("east", "falcon-t1") is None


def test_a_single_host_job_has_no_service() -> None:
    sim = Sim()
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a"))
    assert sim.world.service("east", "falcon-t1") is None


def test_a_same_named_service_of_someone_else_fails_the_submit_and_withdraws_the_job() -> None:
    sim = Sim()
    sim.world.cluster("east").kube.create_service({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "falcon-t1", "namespace": "falcon-jobs",
                     "labels": {"falcon-task": "someone-else"}},
        "spec": {"selector": {"app": "web"}}})

    with pytest.raises(PortError) as refused:
        sim.edge(sim.east).submit_job(multi_host_job("falcon-t1", "falcon-a", hosts=4))

    assert refused.value.code == FAILED
    assert refused.value.message == (
        'services "falcon-t1" already exists in namespace falcon-jobs on cluster east and '
        "belongs to task someone-else; Job falcon-t1 needs that name for its workers to find "
        "each other, so it was deleted again")
    assert sim.edge(sim.east).get_job("falcon-t1") is None
    assert sim.world.service("east", "falcon-t1").task_label == "someone-else"
    assert sim.run() == []  # nothing is published about the withdrawn Job


def test_a_service_of_the_task_left_by_an_earlier_job_is_replaced() -> None:
    sim = Sim()
    sim.world.cluster("east").kube.create_service({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "falcon-t1", "namespace": "falcon-jobs",
                     "labels": {"managed-by": "falcon", "falcon-task": "t1"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": "falcon-t1", "uid": "an-earlier-job"}]},
        "spec": {"clusterIP": "None", "selector": {"job-name": "falcon-t1"}}})

    ref = sim.edge(sim.east).submit_job(multi_host_job("falcon-t1", "falcon-a", hosts=4))

    assert sim.world.service("east", "falcon-t1").owner_uids == (ref.uid,)


def test_ttl_seconds_after_finished_removes_the_finished_job() -> None:
    sim = Sim()
    ready_pool(sim)
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-t1", "falcon-a", ttl=60, sim={"duration_seconds": 10}))
    sim.at(sim_seconds(sim) + 15)
    assert edge.get_job("falcon-t1") is not None
    sim.at(sim_seconds(sim) + 60)
    assert edge.get_job("falcon-t1") is None


def test_behaviour_comes_from_the_source_when_the_job_carries_no_annotation() -> None:
    specs = {"t-oom": {"outcome": "oom", "duration_seconds": 5},
             "t-exit": SimBehaviour(7.0, "fail", 9)}
    sim = Sim(behaviour_source=specs.get)
    ready_pool(sim, "falcon-a")
    ready_pool(sim, "falcon-b")
    ready_pool(sim, "falcon-c")
    edge = sim.edge(sim.east)
    edge.submit_job(job("falcon-oom", "falcon-a", task="t-oom"))
    edge.submit_job(job("falcon-exit", "falcon-b", task="t-exit"))
    edge.submit_job(job("falcon-plain", "falcon-c", task="t-none"))  # config defaults
    finals = {o.job_name: o for o in sim.run()}
    assert finals["falcon-oom"].pods[0].reason == "OOMKilled"
    assert finals["falcon-exit"].pods[0].exit_code == 9
    assert finals["falcon-plain"].condition == "Complete"
    assert finals["falcon-plain"].observed_at - finals["falcon-oom"].observed_at \
        == dt.timedelta(seconds=100 - 5)


def test_behaviour_from_tasks_reads_the_accepted_spec_of_the_task() -> None:
    tasks = TaskStates()
    spec = parse_spec({"image": "busybox", "tpu_type": "v6e", "topology": "2x2",
                       "sim": {"outcome": "fail", "exit_code": 4, "duration_seconds": 20}})
    tasks.fold([RecordedEvent(1, "t-fail", 1, ev.TaskAccepted(
        "n", "actor", spec.to_data(), "v6e", "2x2", START), {}, START)])
    tasks.committed()
    sim = Sim(behaviour_source=behaviour_from_tasks(tasks))
    ready_pool(sim, "falcon-a")
    ready_pool(sim, "falcon-b")
    sim.edge(sim.east).submit_job(job("falcon-fail", "falcon-a", task="t-fail"))
    sim.edge(sim.east).submit_job(job("falcon-unknown", "falcon-b", task="t-unknown"))
    finals = {o.job_name: o for o in sim.run()}
    assert finals["falcon-fail"].pods[0].exit_code == 4
    assert finals["falcon-fail"].observed_at == START + dt.timedelta(seconds=150 + 5 + 20)
    assert finals["falcon-unknown"].condition == "Complete"  # config defaults: 100 s
    assert finals["falcon-unknown"].observed_at == START + dt.timedelta(seconds=150 + 5 + 100)


def test_the_config_job_defaults_apply_to_what_a_spec_does_not_say() -> None:
    """Intake used to write ``sim.duration_seconds=300`` into every spec, so a config
    of other durations was ignored; a spec without ``sim``, or one naming only the
    outcome, runs for the config's 100 s."""
    tasks = TaskStates()
    for number, sim in enumerate((None, {"outcome": "fail", "exit_code": 4})):
        body = {"image": "busybox", "tpu_type": "v6e", "topology": "2x2", "sim": sim}
        spec = parse_spec({k: v for k, v in body.items() if v is not None})
        tasks.fold([RecordedEvent(number + 1, f"t-{number}", 1, ev.TaskAccepted(
            "n", "actor", spec.to_data(), "v6e", "2x2", START), {}, START)])
    tasks.committed()
    sim = Sim(behaviour_source=behaviour_from_tasks(tasks))
    for number in range(2):
        ready_pool(sim, f"falcon-{number}")
    for number in range(2):
        sim.edge(sim.east).submit_job(job(f"falcon-job{number}", f"falcon-{number}",
                                          task=f"t-{number}"))
    finals = {o.job_name: o for o in sim.run()}
    assert finals["falcon-job0"].condition == "Complete"
    assert finals["falcon-job1"].pods[0].exit_code == 4
    for name in finals:
        assert finals[name].observed_at == START + dt.timedelta(seconds=150 + 5 + 100)


def test_observations_carry_the_task_id_and_job_refs_the_id_and_its_shortened_label() -> None:
    sim = Sim()
    manifest = job("falcon-t1", "falcon-a", task="upperlayerid1-4f2a9c1")
    manifest["metadata"]["annotations"]["falcon/task-id"] = "Upper/Layer id#1"
    ref = sim.edge(sim.east).submit_job(manifest)
    # Ownership is decided on the full id of the annotation, never on the label.
    assert (ref.task_id, ref.task_label) == ("Upper/Layer id#1", "upperlayerid1-4f2a9c1")
    assert sim.edge(sim.east).get_job("falcon-t1") == ref
    assert sim.drain()[0].task_id == "Upper/Layer id#1"


# ------------------------------------------------------------ delivery faults


def faulty(**delivery: float) -> Sim:
    return Sim(merged(BASE, {"delivery": delivery}))


def test_duplicated_delivery_sends_each_observation_twice_with_the_same_version() -> None:
    sim = faulty(duplicate_probability=1.0, max_late_seconds=0)
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", sim={"duration_seconds": 10}))
    seen = sim.run()
    versions = [o.resource_version for o in seen]
    assert len(versions) == 2 * len(set(versions))
    assert all(versions.count(v) == 2 for v in versions)
    assert sim.world.delivery_stats() == {"delivered": len(set(versions)),
                                          "duplicated": len(set(versions)), "reordered": 0}


def test_late_delivery_holds_observations_back_in_virtual_time() -> None:
    sim = faulty(late_probability=1.0, max_late_seconds=30)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a"))
    assert sim.drain() == []
    due = sim.world.next_due()
    assert START < due <= START + dt.timedelta(seconds=30)
    sim.clock.advance_to(due)
    assert [o.resource_version for o in sim.drain()] == [1]


def test_out_of_order_delivery_swaps_an_observation_with_the_next_one() -> None:
    sim = faulty(reorder_probability=1.0, reorder_max_hold_seconds=1000)
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", sim={"duration_seconds": 10}))
    seen = sim.run()
    versions = [o.resource_version for o in seen]
    assert sorted(versions) == list(range(1, len(versions) + 1))  # none lost
    assert versions != sorted(versions)
    assert versions[:2] == [2, 1]


def test_a_held_observation_with_no_successor_is_released_when_the_hold_ends() -> None:
    sim = faulty(reorder_probability=1.0, reorder_max_hold_seconds=50)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a"))
    assert sim.drain() == []
    assert sim.world.next_due() == START + dt.timedelta(seconds=50)
    sim.at(50)
    assert [o.resource_version for o in sim.drain()] == [1]


def test_published_observations_are_exactly_to_data_and_each_delivery_is_a_fresh_copy() -> None:
    sim = faulty(duplicate_probability=1.0, max_late_seconds=0)
    ready_pool(sim)
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a"))
    sim.at(sim_seconds(sim) + 1)
    first, second = sim.ports.bus.pull(EDGE)
    observation = JobObservation.from_data(first.data)
    assert json.dumps(first.data, sort_keys=True) == json.dumps(observation.to_data(), sort_keys=True)
    first.data["pods"][0]["phase"] = "Mangled"
    assert second.data["pods"][0]["phase"] == "Pending"
    assert first.attributes == {"cluster": "east", "job": "falcon-t1", "job_uid": observation.job_uid,
                                "task_id": "t1", "resource_version": "1"}


# --------------------------------------------------------------------- bus


def test_the_bus_redelivers_what_is_not_acked_within_the_deadline() -> None:
    sim = Sim(merged(BASE, {"bus": {"ack_deadline_seconds": 10}}))
    bus = sim.ports.bus
    first = bus.publish(EDGE, {"n": 1})
    second = bus.publish(EDGE, {"n": 2}, attributes={"k": "v"})
    pulled = bus.pull(EDGE)
    assert [(m.id, m.data, m.attributes) for m in pulled] == [
        (first, {"n": 1}, {}), (second, {"n": 2}, {"k": "v"})]
    assert bus.pull(EDGE) == []  # leased
    bus.ack(EDGE, [first])
    assert sim.world.next_due() == START + dt.timedelta(seconds=10)
    sim.at(10)
    assert [m.id for m in bus.pull(EDGE)] == [second]  # redelivered, same id
    bus.ack(EDGE, [second, "no-such-id"])
    sim.at(100)
    assert bus.pull(EDGE) == [] and sim.world.bus.backlog(EDGE) == 0


def test_the_bus_fans_out_to_every_subscription_and_refuses_unknown_names() -> None:
    sim = Sim(merged(BASE, {"bus": {"subscriptions": {EDGE: [EDGE, "audit"],
                                                       "falcon-task-events": []}}}))
    bus = sim.ports.bus
    bus.publish("falcon-task-events", {"dropped": True})  # no subscription: dropped
    message = bus.publish(EDGE, {"n": 1}, ordering_key="k")
    assert [m.id for m in bus.pull("audit")] == [message]
    assert [m.id for m in bus.pull(EDGE)] == [message]
    sim.world.bus.subscribe("falcon-task-events", "ops")
    bus.publish("falcon-task-events", {"kept": True})
    assert [m.data for m in bus.pull("ops")] == [{"kept": True}]
    with pytest.raises(PortError) as caught:
        bus.pull("nope")
    assert caught.value.code == NOT_FOUND and "Resource not found (resource=nope)" in caught.value.message
    with pytest.raises(PortError) as caught:
        bus.publish("no-topic", {})
    assert caught.value.code == NOT_FOUND
    with pytest.raises(PortError) as caught:
        bus.publish(EDGE, {"when": START})
    assert caught.value.code == INVALID


def test_pull_respects_max_messages_and_an_unread_backlog_does_not_keep_the_world_busy() -> None:
    sim = Sim()
    bus = sim.ports.bus
    ids = [bus.publish(EDGE, {"n": n}) for n in range(5)]
    assert [m.id for m in bus.pull(EDGE, max_messages=2)] == ids[:2]
    assert [m.id for m in bus.pull(EDGE, max_messages=10)] == ids[2:]
    bus.ack(EDGE, ids)
    bus.publish(EDGE, {"unread": True})
    assert sim.world.next_due() is None


# ------------------------------------------------------------ time and seeds


def test_next_due_walks_the_world_from_change_to_change() -> None:
    sim = Sim()
    assert sim.world.next_due() is None
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    moments = []
    while (moment := sim.world.advance_to_next_due()) is not None:
        moments.append((moment - START).total_seconds())
    assert moments == [60, 70, 75]
    assert sim.clock.now() == START + dt.timedelta(seconds=75)
    # nothing moves unless the clock does
    sim.edge(sim.east).submit_job(job("falcon-t1", "falcon-a", sim={"duration_seconds": 10}))
    assert sim.world.job_state("east", "falcon-t1").active == 0
    sim.world.advance(5)
    assert sim.world.job_state("east", "falcon-t1").active == 1


def scenario(seed: int, config: Mapping[str, Any]) -> list[Any]:
    """A fixed call sequence touching every random draw; returns all it observed."""
    sim = Sim(config, seed=seed)
    trace: list[Any] = []
    ops = [sim.create(sim.flex, f"falcon-f{i}", "2x2x1", "flex-start") for i in range(3)]
    ops.append(sim.create(sim.east, "falcon-r", "2x2", "reservation", "res-a"))
    edges = sim.edge(sim.flex), sim.edge(sim.east)
    refs = [edges[0].submit_job(job(f"falcon-j{i}", f"falcon-f{i}", task=f"t{i}",
                                    sim={"outcome": ["succeed", "oom", "fail"][i]}))
            for i in range(3)]
    refs.append(edges[1].submit_job(job("falcon-jr", "falcon-r", task="tr")))
    trace += [op.id for op in ops] + [r.uid for r in refs]
    for _ in range(200):
        moment = sim.world.advance_to_next_due()
        if moment is None:
            break
        for message in sim.ports.bus.pull(EDGE):
            trace.append((moment.isoformat(), message.id, json.dumps(message.data, sort_keys=True)))
            sim.ports.bus.ack(EDGE, [message.id])
        for name in ("falcon-f0", "falcon-f1", "falcon-f2"):
            counts = edges[0].node_counts(name)
            trace.append((counts.registered, counts.ready))
    trace.append([(p.name, p.status, p.created_at, p.running_at) for p in sim.world.pools()])
    return trace


def test_the_same_seed_and_calls_give_the_same_world_and_another_seed_differs() -> None:
    config = merged(BASE, {
        "defaults": {"create_latency_seconds": {"flex-start": [100, 400]},
                     "node_register_seconds": [5, 50],
                     "stockout": {"probability": 0.5, "duration_seconds": [60, 600]}},
        "jobs": {"pod_start_seconds": [1, 9], "duration_seconds": 50},
        "delivery": {"late_probability": 0.5, "max_late_seconds": 40,
                     "duplicate_probability": 0.3, "reorder_probability": 0.3},
    })
    first = scenario(11, config)
    assert len(first) > 40
    assert scenario(11, config) == first
    assert scenario(12, config) != first


def test_the_world_never_reads_the_wall_clock() -> None:
    far_past = VirtualClock(dt.datetime(2001, 1, 1))
    world = SimWorld(far_past, SimConfig.from_data(BASE))
    ports = world.ports()
    east = cluster("east", "v6e", "proj-a", "us-east5-b")
    op = ports.node_pools.create(NodePoolSpec(east, "falcon-a", slice_shape("v6e", "2x2"),
                                              "on-demand", None, 600, {}))
    assert op.id.startswith(f"operation-{int(dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)}-")
    assert world.next_due() == dt.datetime(2001, 1, 1, 0, 2)


# ---------------------------------------------------------- wiring and reports


def test_unconfigured_clusters_take_the_registry_identity_and_the_default_behaviour() -> None:
    sim = Sim()
    west = cluster("west", "v5p", "proj-w", "europe-west4-b")
    with pytest.raises(PortError) as caught:
        sim.ports.reservations.remaining_slices(west, "any", slice_shape("v5p", "2x2x1"))
    assert "reservation any not found in project proj-w zone europe-west4-b" in caught.value.message
    with pytest.raises(PortError) as caught:
        sim.ports.node_pools.create(NodePoolSpec(west, "falcon-a", slice_shape("v6e", "2x2"),
                                                 "on-demand", None, 600, {}))
    assert "offers v5p" in caught.value.message
    sim.ports.node_pools.create(NodePoolSpec(west, "falcon-a", slice_shape("v5p", "2x2x1"),
                                             "on-demand", None, 600, {}))
    assert sim.ports.node_pools.get(west, "falcon-a").status == "PROVISIONING"


def test_the_ports_bundle_exposes_next_due_and_pool_hours_add_up_by_supply_mode() -> None:
    sim = Sim()
    assert sim.ports.next_due == sim.world.next_due
    assert sim.ports.clock is sim.clock and sim.ports.bus is sim.world.bus
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    sim.create(sim.flex, "falcon-f", "2x2x1", "flex-start")
    sim.at(3600)
    sim.ports.node_pools.delete(sim.east, "falcon-a")
    sim.at(3630)
    hours = sim.world.pool_hours()
    assert hours["reservation"] == pytest.approx(3630 / 3600)
    assert hours["flex-start"] == pytest.approx(3630 / 3600)
