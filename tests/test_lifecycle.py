"""The task lifecycle end to end on the simulated world: every path of the
lifecycle and every failure it handles, each asserting the exact sequence of (Status,
Reason) the job table showed after each tick and the node pools left behind.

The abort table is in ``test_lifecycle_abort.py``; crash safety in ``test_crash_safety.py``.
"""

from __future__ import annotations

import re

import dataclasses
from collections.abc import Callable, Iterator

import pytest

from falcon_es.domain import manifests, naming
from falcon_es.adapters.sim.config import (
    QUOTA_AT_CREATE, DeliveryFaults, FaultRule, QuotaConfig, Span, StockoutConfig,
)
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.task_manifests import pool_labels
from falcon_es.domain.ports import NodePoolSpec
from falcon_es.config.settings import Settings, SettingsError
from falcon_es.domain.tpu import slice_shape
from tests.support.harness import (
    Harness, Harnesses, flex_cluster, reserved_cluster,
)

Make = Callable[..., Harness]

RESERVED_PATH = [("Pending", "Provisioning"), ("Pending", "WaitingForNode"),
                 ("Pending", "Dispatching"), ("Running", None)]
#: An autoscaled pool: the workload is submitted once its control plane is RUNNING,
#: and its pods wait for the nodes the autoscaler brings for them.
FLEX_PATH = [("Pending", "Provisioning"), ("Pending", "Dispatching"),
             ("Pending", "WaitingForNode"), ("Pending", "Dispatching"), ("Running", None)]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def deleted_pools(h: Harness) -> list[str]:
    return sorted(p.name for p in h.world.pools(include_deleted=True) if p.status == "DELETED")


# ------------------------------------------------------------------ lifecycle


def test_reservation_happy_path(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert h.messages["t1"][-1] == "succeeded (1 pod(s)); node pool falcon-t1-2x2 deleted"
    assert "1/1 active" in h.messages["t1"]
    (pool,) = h.world.pools(include_deleted=True)
    assert (pool.name, pool.supply_mode, pool.reservation) == ("falcon-t1-2x2", "reservation",
                                                               "v6e-res-r")
    assert pool.scale_down_unneeded_seconds == 600
    assert pool.labels["managed-by"] == "falcon" and pool.labels["falcon-task"] == "t1"
    row = h.row("t1")
    assert row["node_pool_name"] == "falcon-t1-2x2" and row["job_uid"]
    assert row["dispatched_at"] < row["finished_at"]
    assert h.live_pools() == []


def test_flex_start_is_the_default_without_a_reservation_and_scales_down_late(make: Make) -> None:
    h = make(flex_cluster())
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [*FLEX_PATH, ("Succeeded", None)]
    (pool,) = h.world.pools(include_deleted=True)
    assert (pool.supply_mode, pool.reservation, pool.scale_down_unneeded_seconds) == (
        "flex-start", None, 6 * 3600)
    assert h.live_pools() == []


def test_task_supply_mode_overrides_the_cluster_default(make: Make) -> None:
    h = make(reserved_cluster(count=0))
    h.submit("t1", supply_mode="on-demand")
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    (pool,) = h.world.pools(include_deleted=True)
    assert (pool.supply_mode, pool.reservation, pool.scale_down_unneeded_seconds) == (
        "on-demand", None, 600)
    assert "ReservationInsufficient" not in h.events("t1")


def test_multi_host_slice_runs_one_pod_per_host(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("big", topology="4x4")
    h.run()
    assert h.history["big"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert "4/4 active" in h.messages["big"]
    assert h.messages["big"][-1].startswith("succeeded (4 pod(s))")
    (pool,) = h.world.pools(include_deleted=True)
    assert (pool.hosts, pool.machine_type) == (4, "ct6e-standard-4t")


def test_a_multi_host_job_has_its_headless_service_until_the_job_expires(
        make: Make, db_url: str) -> None:
    h = make(reserved_cluster(), settings=Settings(db_url=db_url,
                                                    job_ttl_seconds_after_finished=600))
    h.submit("big", topology="4x4")
    h.run(lambda: h.statuses().get("big", ("", None))[0] == "Running")
    service = h.world.service("v6e-res", "falcon-big")
    assert service is not None and service.owner_uids == (h.row("big")["job_uid"],)

    h.run()
    assert h.history["big"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert h.world.service("v6e-res", "falcon-big") is not None  # the Job is still there

    h.run(lambda: h.world.job_state("v6e-res", "falcon-big") is None)  # its TTL

    assert h.world.service("v6e-res", "falcon-big") is None


def test_pool_is_handed_over_to_the_next_task_of_its_topology(make: Make) -> None:
    h = make(reserved_cluster(count=1))
    for name in ("a", "b", "c"):
        h.submit(name, sim={"duration_seconds": 120})
    h.run()
    assert h.history["a"] == [*RESERVED_PATH, ("Succeeded", None)]
    busy_then_reuse = [("Pending", "Waiting"), ("Pending", "ClusterBusy"),
                       ("Pending", "Dispatching"), ("Running", None), ("Succeeded", None)]
    assert h.history["b"] == busy_then_reuse
    assert h.history["c"] == busy_then_reuse
    assert h.messages["a"][-1] == "succeeded (1 pod(s)); node pool falcon-a-2x2 handed over to b"
    assert h.messages["b"][-1] == "succeeded (1 pod(s)); node pool falcon-a-2x2 handed over to c"
    assert h.messages["c"][-1] == "succeeded (1 pod(s)); node pool falcon-a-2x2 deleted"
    assert h.events("b")[3:5] == ["ReservationInsufficient", "ReservationInsufficient"]
    assert "NodePoolReused" in h.events("b") and "NodePoolCreateRequested" not in h.events("b")
    # One pool served all three tasks, one Job at a time, and is gone at the end.
    assert [p.name for p in h.world.pools(include_deleted=True)] == ["falcon-a-2x2"]
    assert h.row("c")["node_pool_name"] == "falcon-a-2x2"
    assert h.live_pools() == []


def test_a_task_id_that_is_no_valid_name_still_runs_end_to_end(make: Make) -> None:
    task_id = "Team A/run #7: ünïcode"
    h = make(reserved_cluster())
    h.submit("odd", task_id=task_id)
    h.run()
    assert h.history[task_id] == [*RESERVED_PATH, ("Succeeded", None)]
    pool = naming.pool_name(task_id, "2x2")
    assert h.row(task_id)["message"] == f"succeeded (1 pod(s)); node pool {pool} deleted"
    (created,) = h.world.pools(include_deleted=True)
    assert created.name == pool and created.labels["falcon-task"] == naming.task_label(task_id)


# ------------------------------------------------------------------ exceptions


def test_reservation_too_small_waits_in_cluster_busy_and_never_falls_back(make: Make) -> None:
    h = make(reserved_cluster(count=4, in_use=4))
    h.submit("t1")
    h.run_for(1800)
    assert h.history["t1"] == [("Pending", "ClusterBusy")]
    assert h.messages["t1"][0].startswith(
        "reservation v6e-res-r has 0 slice(s) free, 1 needed (reservation_remaining_slices=0 "
        "reservation_needed_slices=1); retry 1, waiting since ")
    # About ten tries in 30 minutes of backoff (15 s doubling to 300 s), not a busy loop;
    # those that found the same numbers are recorded only at checkpoints.
    recorded = [r.event.attempt for r in h.app.store.read_after(0)
                if r.type_name == "ReservationInsufficient"]
    assert recorded == [1, 2, 4, 8]
    assert h.world.pools(include_deleted=True) == []  # no silent fallback to another supply


def test_reservation_capacity_freed_by_another_task_lets_the_busy_one_start(make: Make) -> None:
    h = make(reserved_cluster(count=4))
    h.submit("wide", topology="4x4", sim={"duration_seconds": 200})
    h.clock.advance(1)  # submitted later: the wide one wins the reservation
    h.submit("small", topology="2x2")
    h.run()
    assert h.history["wide"] == [*RESERVED_PATH, ("Succeeded", None)]
    assert h.history["small"] == [("Pending", "ClusterBusy"), *RESERVED_PATH,
                                  ("Succeeded", None)]
    assert h.live_pools() == []


def test_quota_error_fails_with_the_apis_words_and_the_error_pool_is_deleted(make: Make) -> None:
    """A fixed-size pool makes its VMs at create: its create operation fails for quota."""
    h = make(flex_cluster(quota=QuotaConfig(first_n=1)))
    h.submit("t1", supply_mode="on-demand")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Failed", "NodePoolFailed")]
    message = h.row("t1")["message"]
    assert "Quota 'TPUS_PER_TPU_FAMILY' exceeded" in message
    assert message.endswith("node pool falcon-t1-2x2 deleted")
    assert h.live_pools() == []


def test_flex_start_quota_checked_at_create_fails_like_a_fixed_size_pool(make: Make) -> None:
    """Whether GKE checks the quota at a 0-node pool's create is not documented: under
    that reading the flex-start task fails as an on-demand one does."""
    h = make(flex_cluster(quota=QuotaConfig(first_n=1, autoscaled_at=QUOTA_AT_CREATE)))
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Failed", "NodePoolFailed")]
    assert "Quota 'TPUS_PER_TPU_FAMILY' exceeded" in h.row("t1")["message"]
    assert h.live_pools() == []


FLEX_QUOTA_WORDS = ("cluster autoscaler FailedScaleUp: Node scale up in zones us-east5-b "
                    "associated with this pod failed: GCE quota exceeded. Pod is at risk of "
                    "not being scheduled.")


def test_flex_start_quota_at_scale_up_waits_with_the_autoscalers_words_then_times_out(
        make: Make, db_url: str) -> None:
    """The default reading: the pool is created, its scale-ups fail for quota, and the
    task waits for nodes with the autoscaler's quota words first, as for a stockout."""
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600,
                        retain_waiting_pool=False)
    h = make(flex_cluster(quota=QuotaConfig(first_n=1)), settings=settings)
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode"), ("Failed", "NodePoolTimeout")]
    waiting = [m for m in h.messages["t1"] if "expected node(s) registered" in m]
    assert waiting[0].startswith(FLEX_QUOTA_WORDS)
    message = h.row("t1")["message"]
    assert message.startswith(FLEX_QUOTA_WORDS)
    assert message.endswith("node pool falcon-t1-2x2 not ready after 3600s; node pool "
                            "falcon-t1-2x2 deleted")
    assert h.live_pools() == []


def test_flex_start_quota_at_scale_up_keeps_the_pool_when_nobody_else_waits(
        make: Make, db_url: str) -> None:
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600)
    h = make(flex_cluster(quota=QuotaConfig(first_n=1)), settings=settings)
    h.submit("t1")
    h.run_for(3 * 3600)
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode")]
    assert h.row("t1")["message"].startswith(FLEX_QUOTA_WORDS)
    assert any("kept after 3600s without nodes" in m for m in h.messages["t1"])


def test_stockout_waits_for_nodes_with_counts_then_runs(make: Make) -> None:
    h = make(flex_cluster(stockout=StockoutConfig(first_n=1, duration=Span(1200, 1200))))
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [*FLEX_PATH, ("Succeeded", None)]
    waiting = [m for m in h.messages["t1"] if "expected node(s) registered" in m]
    # Root cause first: the autoscaler's stockout words, then the pool's counts.
    assert waiting[0].startswith(
        "cluster autoscaler FailedScaleUp: Node scale up in zones us-east5-b associated "
        "with this pod failed: GCE out of resources")
    assert waiting[0].endswith("node pool falcon-t1-2x2 control-plane RUNNING but 0/1 "
                               "expected node(s) registered (Ready=0); the workload is "
                               "submitted and waits for the cluster autoscaler")
    assert "1/1 expected node(s) registered (Ready=0)" in waiting[-1]
    assert h.live_pools() == []


def test_stockout_for_good_times_out_and_deletes_the_pool_without_retention(
        make: Make, db_url: str) -> None:
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600,
                        retain_waiting_pool=False)
    h = make(flex_cluster(stockout=StockoutConfig(first_n=1, duration=None)), settings=settings)
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode"), ("Failed", "NodePoolTimeout")]
    message = h.row("t1")["message"]
    assert message.startswith("cluster autoscaler FailedScaleUp: Node scale up in zones "
                              "us-east5-b associated with this pod failed: GCE out of resources")
    assert message.endswith("0/1 expected node(s) registered (Ready=0); node pool "
                            "falcon-t1-2x2 not ready after 3600s; node pool falcon-t1-2x2 "
                            "deleted")
    assert h.live_pools() == []
    assert h.world.job_state("v6e-flex", "falcon-t1") is None  # the workload went too


def test_stockout_for_good_keeps_the_pool_when_nobody_else_waits(make: Make,
                                                                 db_url: str) -> None:
    """Single-tenant retention (the default): past the deadline the pool stays and GKE
    keeps trying, until the user aborts."""
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600)
    h = make(flex_cluster(stockout=StockoutConfig(first_n=1, duration=None)), settings=settings)
    h.submit("t1")
    h.run_for(3 * 3600)
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Pending", "Dispatching"),
                               ("Pending", "WaitingForNode")]
    assert "GCE out of resources" in h.row("t1")["message"]
    assert any("kept after 3600s without nodes" in m for m in h.messages["t1"])
    assert h.live_pools() == ["falcon-t1-2x2"]
    h.abort("t1")
    h.run()
    assert h.history["t1"][-1] == ("Aborted", None)
    assert h.live_pools() == []
    assert h.world.job_state("v6e-flex", "falcon-t1") is None


def test_retention_is_a_setting_with_a_clear_error() -> None:
    assert Settings.from_env({}).features.retain_waiting_pool is True
    assert Settings.from_env({"FALCON_RETAIN_WAITING_POOL": "false"}).features.retain_waiting_pool is False
    assert Settings.from_env({"FALCON_RETAIN_WAITING_POOL": "1"}).features.retain_waiting_pool is True
    with pytest.raises(SettingsError, match="FALCON_RETAIN_WAITING_POOL='maybe': expected "
                                            "true or false"):
        Settings.from_env({"FALCON_RETAIN_WAITING_POOL": "maybe"})


def test_retention_ends_when_a_task_of_another_topology_waits(make: Make,
                                                             db_url: str) -> None:
    settings = Settings(db_url=db_url, flex_start_provisioning_timeout_seconds=3600)
    h = make(flex_cluster(stockout=StockoutConfig(first_n=2, duration=None)), settings=settings)
    h.submit("t1")
    h.run_for(2 * 3600)
    assert h.statuses()["t1"] == ("Pending", "WaitingForNode")
    h.submit("t2", topology="2x4")  # its own queue: it waits for the same capacity
    h.run(lambda: h.statuses()["t1"][0] == "Failed")
    assert h.history["t1"][-1] == ("Failed", "NodePoolTimeout")
    assert h.statuses()["t2"] == ("Pending", "WaitingForNode")
    h.abort("t2")
    h.run()
    assert h.live_pools() == []


def test_a_404_inside_the_visibility_grace_keeps_looking(make: Make) -> None:
    slow_to_show = {"reservation": Span(0, 0), "on-demand": Span(0, 0),
                    "flex-start": Span(400, 400)}
    h = make(flex_cluster(visibility_delay=slow_to_show))
    h.submit("t1")
    h.run()
    # Once GKE shows the pool RUNNING the workload goes in; its nodes come for its pods.
    assert h.history["t1"] == [*FLEX_PATH, ("Succeeded", None)]
    assert "NodePoolNotVisible" in h.events("t1")
    assert "node pool falcon-t1-2x2 not visible yet; looking again (attempt 1)" in h.messages["t1"]


def test_a_404_beyond_the_grace_fails_the_pool(make: Make, db_url: str) -> None:
    never = {"reservation": Span(0, 0), "on-demand": Span(0, 0), "flex-start": Span(10**6, 10**6)}
    settings = Settings(db_url=db_url, create_visibility_grace_seconds=600)
    h = make(flex_cluster(visibility_delay=never), settings=settings)
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [("Pending", "Provisioning"), ("Failed", "NodePoolFailed")]
    assert "still not found" in h.row("t1")["message"]
    assert h.live_pools() == []  # deleted although GKE never showed it


def test_reservation_supply_on_a_cluster_without_reservation_fails_clearly(make: Make) -> None:
    h = make(flex_cluster())
    h.submit("t1", supply_mode="reservation")
    h.run()
    # Refused at cluster choice: no cluster of the type has a reservation, so no pool is
    # ever asked for (before, the task queued there and its pool create failed).
    assert h.history["t1"] == [("Failed", "NoMatchingCluster")]
    assert h.row("t1")["message"] == (
        "supply mode reservation was asked for, but no v6e cluster has a reservation "
        "(v6e-flex)")
    assert h.world.pools(include_deleted=True) == []


def test_job_submit_failure_fails_the_task_and_deprovisions(make: Make) -> None:
    h = make(reserved_cluster())
    registered = next(c for c in _clusters(h) if c.name == "v6e-res")
    intruder = manifests.render_job(
        task_id="someone-else", spec={"image": "busybox"}, shape=slice_shape("v6e", "2x2"),
        pool_name="elsewhere", placement=manifests.JobPlacement("falcon-jobs", "sa", "b"))
    intruder["metadata"]["name"] = naming.job_name("t1")
    h.ports.edges.for_cluster(registered).submit_job(intruder)
    h.submit("t1")
    h.run(lambda: h.settled())
    assert h.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "JobSubmitFailed")]
    assert h.row("t1")["message"] == (
        "Job falcon-t1 could not be submitted: a Job named falcon-t1 already exists and is not "
        "this task's (falcon-task=someone-else); node pool falcon-t1-2x2 deleted")
    assert h.live_pools() == []


def test_a_service_name_taken_by_someone_else_fails_the_submit_and_deprovisions(
        make: Make) -> None:
    h = make(reserved_cluster())
    h.world.cluster("v6e-res").kube.create_service({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "falcon-big", "namespace": "falcon-jobs",
                     "labels": {"falcon-task": "someone-else"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
    h.submit("big", topology="4x4")
    h.run(lambda: h.settled())
    assert h.history["big"] == [*RESERVED_PATH[:3], ("Failed", "JobSubmitFailed")]
    assert h.row("big")["message"] == (
        'Job falcon-big could not be submitted: services "falcon-big" already exists in '
        "namespace falcon-jobs on cluster v6e-res and belongs to task someone-else; Job "
        "falcon-big needs that name for its workers to find each other, so it was deleted "
        "again; node pool falcon-big-4x4 deleted")
    assert h.world.job_state("v6e-res", "falcon-big") is None
    assert h.live_pools() == []


def test_oom_fails_with_the_pods_root_cause(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "oom", "duration_seconds": 60})
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Failed", "JobFailed")]
    assert re.fullmatch(r"OOMKilled \(exit code 137\); log: gs://logs-bucket/logs/t1/"
                        r"falcon-t1-0-[a-z0-9]{5}\.log; node pool falcon-t1-2x2 deleted",
                        h.row("t1")["message"])


def test_exit_code_fails_with_the_code(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "fail", "exit_code": 3, "duration_seconds": 60})
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Failed", "JobFailed")]
    assert re.fullmatch(r"exit code 3; log: gs://logs-bucket/logs/t1/falcon-t1-0-[a-z0-9]{5}\.log; "
                        r"node pool falcon-t1-2x2 deleted", h.row("t1")["message"])


def test_image_pull_failure_fails_and_deletes_the_job(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "image-pull-error"})
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "JobFailed")]
    assert h.row("t1")["message"].startswith('ErrImagePull: Failed to pull image "us-docker')
    assert h.events("t1")[-5:] == ["JobFailed", "JobDeleteRequested", "NodePoolDeleteRequested",
                                   "JobDeleted", "NodePoolDeleted"]
    assert h.world.job_state("v6e-res", "falcon-t1") is None


def test_unschedulable_pods_show_the_upstream_cause_then_time_out(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"outcome": "unschedulable"}, timeout_seconds=900)
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH[:3], ("Failed", "Timeout")]
    pending = [m for m in h.messages["t1"] if m.startswith("pods pending: ")]
    assert pending and "Unschedulable: 0/" in pending[-1]
    message = h.row("t1")["message"]
    assert message.startswith("timed out after 900s; Job deleted (pods were pending: pod falcon-t1")
    assert h.world.job_state("v6e-res", "falcon-t1") is None and h.live_pools() == []


def test_running_past_its_timeout_fails_and_the_job_is_deleted(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1", sim={"duration_seconds": 5000}, timeout_seconds=1200)
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Failed", "Timeout")]
    assert h.row("t1")["message"] == ("timed out after 1200s; Job deleted; "
                                      "node pool falcon-t1-2x2 deleted")
    row = h.row("t1")
    assert (row["finished_at"] - row["dispatched_at"]).total_seconds() == pytest.approx(1200, abs=1)
    assert h.world.job_state("v6e-res", "falcon-t1") is None and h.live_pools() == []


def test_delete_failures_retry_into_the_message_and_status_follows_the_job(make: Make) -> None:
    h = make(reserved_cluster(delete_failures=FaultRule(first_n=2)))
    h.submit("t1")
    h.run()
    assert h.history["t1"] == [*RESERVED_PATH, ("Succeeded", None)]
    failures = [m for m in h.messages["t1"] if "failed (attempt" in m]
    assert [m.split("(attempt ")[1][0] for m in failures] == ["1", "2"]
    assert failures[0].startswith("succeeded (1 pod(s)); deleting node pool falcon-t1-2x2 failed")
    assert h.messages["t1"][-1] == "succeeded (1 pod(s)); node pool falcon-t1-2x2 deleted"
    assert h.live_pools() == []


@pytest.mark.parametrize("delivery", [
    DeliveryFaults(),
    DeliveryFaults(late_probability=0.5, max_late_seconds=40, duplicate_probability=0.5,
                   reorder_probability=0.5),
], ids=["in-order", "late-duplicated-reordered"])
def test_late_duplicate_and_reordered_observations_change_nothing(
        make: Make, delivery: DeliveryFaults) -> None:
    h = make(reserved_cluster(), delivery=delivery)
    for index, (topology, outcome) in enumerate(
            [("2x2", "succeed"), ("2x4", "oom"), ("4x4", "succeed"), ("1x1", "fail")]):
        h.submit(f"t{index}", topology=topology,
                 sim={"duration_seconds": 100, "outcome": outcome, "exit_code": 2})
    h.run()
    assert {t: (h.history[t][-1], h.row(t)["message"].split("; ")[0]) for t in h.history} == {
        "t0": (("Succeeded", None), "succeeded (1 pod(s))"),
        "t1": (("Failed", "JobFailed"), "OOMKilled (exit code 137)"),
        "t2": (("Succeeded", None), "succeeded (4 pod(s))"),
        "t3": (("Failed", "JobFailed"), "exit code 2"),
    }
    for task_id in h.history:
        assert h.history[task_id][-2] == ("Running", None)  # never regressed to Pending
    assert h.live_pools() == []


def test_orphan_pools_are_deleted_outside_the_grace(make: Make, db_url: str) -> None:
    settings = Settings(db_url=db_url, orphan_sweep_seconds=60,
                        create_visibility_grace_seconds=600)
    h = make(reserved_cluster(), settings=settings)
    registered = next(c for c in _clusters(h) if c.name == "v6e-res")
    shape = slice_shape("v6e", "2x2")
    stray = NodePoolSpec(registered, "falcon-ghost-2x2", shape, "on-demand", None, 600,
                         pool_labels("ghost", "2x2", "on-demand"))
    foreign = dataclasses.replace(stray, name="team-b-pool", labels={"owner": "team-b"})
    h.ports.node_pools.create(stray)
    h.ports.node_pools.create(foreign)
    h.submit("t1", sim={"duration_seconds": 30})
    h.run(lambda: h.statuses()["t1"][0] == "Succeeded" and "falcon-t1-2x2" not in h.live_pools())
    # The task's own pool went through deprovisioning; recreate one under its name.
    h.ports.node_pools.create(dataclasses.replace(stray, name="falcon-t1-2x2",
                                                  labels=pool_labels("t1", "2x2", "reservation")))
    h.run_for(120)
    assert "falcon-t1-2x2" in h.live_pools()  # inside the grace: spared
    assert "falcon-ghost-2x2" not in h.live_pools()
    h.run_for(700)
    assert h.live_pools() == ["team-b-pool"]  # only what Falcon does not manage is left
    stream = [r.event for r in h.app.store.read_stream(f"orphans:{registered.id}")]
    found = [(e.type_name, e.pool_name) for e in stream]
    assert found == [
        ("OrphanPoolFound", "falcon-ghost-2x2"), ("OrphanPoolDeleted", "falcon-ghost-2x2"),
        ("OrphanPoolFound", "falcon-t1-2x2"), ("OrphanPoolDeleted", "falcon-t1-2x2"),
    ]


def _clusters(h: Harness) -> list:
    from falcon_es.storage.registry import list_clusters

    with h.app.engine.connect() as conn:
        return list_clusters(conn)


def test_a_failed_job_seen_before_its_failed_pod_waits_for_the_root_cause(make: Make) -> None:
    """An informer's Job and Pod watches deliver independently: a Job reported Failed
    with no failed pod in view is held (unacked) until the pod's reason arrives."""
    from falcon_es.domain.ports import EDGE_EVENTS_TOPIC, JobObservation, PodObservation

    h = make(reserved_cluster())
    h.submit("t1", sim={"duration_seconds": 3600})
    h.run(lambda: h.statuses()["t1"] == ("Running", None))
    row = h.row("t1")
    base = dict(cluster_name="v6e-res", job_name="falcon-t1", job_uid=row["job_uid"],
                task_id="t1", active=0, succeeded=0, failed=1, completions=1,
                condition="Failed")
    torn = JobObservation(resource_version=10_000, pods=(), observed_at=h.clock.now(), **base)
    h.world.bus.publish(EDGE_EVENTS_TOPIC, torn.to_data())
    h.tick()
    assert h.statuses()["t1"] == ("Running", None)
    whole = JobObservation(
        resource_version=10_001, observed_at=h.clock.now(),
        pods=(PodObservation("falcon-t1-0", "Failed", "OOMKilled", 137),), **base)
    h.world.bus.publish(EDGE_EVENTS_TOPIC, whole.to_data())
    h.tick()
    assert h.statuses()["t1"] == ("Failed", "JobFailed")
    assert h.row("t1")["message"].startswith("OOMKilled (exit code 137)")


def test_two_queues_sharing_a_reservation_never_overcommit_it_across_ticks(make: Make) -> None:
    """Compute's inUseCount counts VMs that exist, so while the 4x4's pool is being
    created a reader sees the whole reservation free. The 2x4 of another queue, asked
    for a tick later, waits in ClusterBusy instead of creating a pool that cannot get
    its VMs, and runs once the 4x4's pool is gone."""
    h = make(reserved_cluster(count=4))  # the 4x4's 4 VMs, or the 2x4's 1 VM
    h.submit("big", topology="4x4")
    h.run_for(10)  # the 4x4's create is in flight, none of its VMs is up
    assert h.statuses()["big"] == ("Pending", "Provisioning")
    h.submit("small", topology="2x4")
    h.run_for(30)
    assert h.statuses()["small"] == ("Pending", "ClusterBusy")
    assert "has 0 slice(s) free, 1 needed" in h.row("small")[
        "message"], h.row("small")["message"]
    h.run()

    assert h.history["big"][-1] == ("Succeeded", None)
    assert h.history["small"][-1] == ("Succeeded", None)
    assert ("Failed", "NodePoolFailed") not in h.history["small"]
    created = [p.name for p in h.world.pools(include_deleted=True)]
    assert sorted(created) == ["falcon-big-4x4", "falcon-small-2x4"]  # no failed create
