"""Capacity ends: a calendar-mode reservation has an end, when Compute deletes it and the
VMs that consume it. A task whose timeout would outlast it is not started on it (it
waits, or goes to a cluster that can take it, its Message naming the end); a reservation
that is gone fails the task with a clear Reason; the end under a running task is a
disruption named as such. On the simulated world, which models both ends."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from falcon_es.adapters.sim import SimConfig, SimConfigError, SimWorld, build_sim_ports
from falcon_es.adapters.sim.config import SimClusterConfig, Span
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import INVALID, NOT_FOUND, NodePoolSpec, PortError, ReservationCapacity
from falcon_es.domain.tpu import slice_shape
from falcon_es.domain.spec import SUPPLY_MODES
from falcon_es.projections import replay
from falcon_es.projections.explain import explain, render
from tests.support.harness import Harness, reserved_cluster
from falcon_es.domain.clock import VirtualClock

Make = Callable[..., Harness]
HOUR = 3600


def calendar_cluster(clock: VirtualClock, ends_in_seconds: float, name: str = "v6e-cal",
                     **behaviour: Any) -> SimClusterConfig:
    """A cluster whose default reservation ends ``ends_in_seconds`` from now."""
    config = reserved_cluster(name, **behaviour)
    ends_at = clock.now() + dt.timedelta(seconds=ends_in_seconds)
    return dataclasses.replace(config, reservations=tuple(
        dataclasses.replace(r, ends_at=ends_at) for r in config.reservations))


def _replays_clean(h: Harness) -> bool:
    """The job table rebuilt from the log is the live one (``replay --verify``)."""
    return replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def _ends(clock: VirtualClock, seconds: float) -> str:
    return (clock.now() + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds") + "Z"


# ----------------------------------------------------------- the sim's reservation


def _world(ends_at: str) -> dict[str, Any]:
    return {"clusters": {"cal": {"project": "proj", "location": "us-east5-b",
                                 "tpu_types": ["v6e"], "default_reservation": "cal-r",
                                 "reservations": [{"name": "cal-r", "count": 4,
                                                   "ends_at": ends_at}]}}}


def test_the_sim_reads_the_end_and_answers_404_after_it(clock: VirtualClock) -> None:
    ends_at = clock.now() + dt.timedelta(hours=1)
    world = SimWorld(clock, SimConfig.from_data(_world(ends_at.isoformat() + "Z")), seed=1)
    ports = build_sim_ports(world)
    cluster = Cluster("id-cal", "cal", "proj", "us-east5-b", "v6e", "bucket", "cal-r", "active",
                      clock.now())
    assert ports.reservations.capacity(cluster, "cal-r") == ReservationCapacity(None, 4, ends_at)
    clock.advance(HOUR)
    with pytest.raises(PortError) as gone:
        ports.reservations.capacity(cluster, "cal-r")
    assert gone.value.code == NOT_FOUND
    with pytest.raises(PortError) as refused:
        ports.node_pools.create(NodePoolSpec(cluster, "falcon-p", slice_shape("v6e", "2x2"),
                                             "reservation", "cal-r", 600, {}))
    assert refused.value.code == INVALID and "cal-r not found" in refused.value.message


def test_the_sim_config_refuses_an_end_that_is_not_a_time() -> None:
    with pytest.raises(SimConfigError, match=r"clusters.cal.reservations\[0\].ends_at: 'soon' "
                                             r"is not an RFC 3339 time"):
        SimConfig.from_data(_world("soon"))


# ------------------------------------------------------------------ end to end


def test_a_task_whose_timeout_fits_before_the_end_runs_on_the_reservation(
        make: Make, clock: VirtualClock) -> None:
    h = make(calendar_cluster(clock, 10 * HOUR))
    h.submit("t1", timeout_seconds=2 * HOUR)
    h.run()
    assert h.statuses()["t1"] == ("Succeeded", None)
    assert "TaskPicked" in h.events("t1")


def test_a_task_that_cannot_finish_before_the_end_is_not_started_and_says_why(
        make: Make, clock: VirtualClock) -> None:
    ends = _ends(clock, HOUR)
    h = make(calendar_cluster(clock, HOUR))
    h.submit("t1", timeout_seconds=2 * HOUR)
    h.run(lambda: bool(h.messages.get("t1")) and "ends at" in h.messages["t1"][-1],
          max_seconds=600)
    assert h.messages["t1"][-1] == (
        f"waiting for an active v6e cluster: v6e-cal (reservation v6e-cal-r ends at {ends}, "
        "before a run of up to 7200s would)")
    assert h.statuses()["t1"] == ("Pending", "Waiting")
    assert "TaskPicked" not in h.events("t1") and not h.live_pools()
    assert _replays_clean(h)


def test_a_task_goes_to_a_cluster_whose_reservation_outlasts_its_timeout(
        make: Make, clock: VirtualClock) -> None:
    h = make(calendar_cluster(clock, HOUR, name="v6e-a"), calendar_cluster(clock, 9 * HOUR,
                                                                          name="v6e-b"))
    h.submit("t1", timeout_seconds=2 * HOUR)
    h.run()
    assert h.statuses()["t1"] == ("Succeeded", None)
    chosen = [r.event for r in h.app.store.read_stream("t1") if r.type_name == "ClusterChosen"]
    assert [e.cluster_name for e in chosen] == ["v6e-b"]


def test_a_queued_task_whose_turn_comes_too_close_to_the_end_is_requeued(
        make: Make, clock: VirtualClock) -> None:
    """Placed while it fitted, picked only once the slot holder's slow pool is done with
    (created or given up): by then its timeout would outlast the reservation, so it is not
    picked there."""
    slow = MappingProxyType({mode: Span(HOUR / 2, HOUR / 2) for mode in SUPPLY_MODES})
    h = make(calendar_cluster(clock, 3 * HOUR, create_latency=slow))
    h.submit("first", timeout_seconds=HOUR)
    h.submit("second", timeout_seconds=int(2.75 * HOUR))
    h.run(lambda: "TaskRequeued" in h.events("second") and "ends at" in h.messages["second"][-1],
          max_steps=20_000, max_seconds=HOUR)
    assert "TaskPicked" not in h.events("second")
    assert h.statuses()["second"] == ("Pending", "Waiting")
    assert _replays_clean(h)
    assert h.messages["second"][-1].startswith(
        "waiting for an active v6e cluster: v6e-cal (reservation v6e-cal-r ends at ")


def test_a_reservation_that_is_gone_fails_the_task_with_a_clear_reason(
        make: Make, clock: VirtualClock) -> None:
    h = make(calendar_cluster(clock, -60))  # ended a minute ago: Compute answers 404
    h.submit("t1", timeout_seconds=HOUR)
    h.run()
    assert h.statuses()["t1"] == ("Failed", "ReservationGone")
    assert h.messages["t1"][-1] == (
        "reservation v6e-cal-r of cluster v6e-cal is gone (Compute has no such reservation; "
        "it deletes a calendar-mode one at its end): The resource "
        "'projects/proj/zones/us-east5-b/reservations/v6e-cal-r' was not found "
        "(reservation v6e-cal-r not found in project proj zone us-east5-b)")
    said = "\n".join(render(explain("t1", h.app.store.read_stream("t1"))))
    assert "reservation v6e-cal-r of cluster v6e-cal is gone" in said
    assert _replays_clean(h)


def test_the_end_under_a_running_task_is_a_disruption_named_as_such(
        make: Make, clock: VirtualClock) -> None:
    """It fitted when picked, but its pool took a while and its run outlasts the end:
    Compute deletes the VMs, the pods are evicted with DisruptionTarget, and the Message
    names the reservation's end, not the workload."""
    h = make(calendar_cluster(clock, HOUR))
    h.submit("t1", timeout_seconds=HOUR - 60, sim={"duration_seconds": HOUR - 30})
    h.run(lambda: any(m.startswith("disrupted: ") for m in h.messages.get("t1", ())),
          max_steps=20_000, max_seconds=2 * HOUR)
    ended = [m for m in h.messages["t1"] if m.startswith("disrupted: ")]
    assert ("(calendar-mode reservation v6e-cal-r of cluster v6e-cal has ended (Compute "
            "deletes it, and the VMs that consume it, at the end of its period): "
            "DisruptionTarget DeletionByPodGC: node gke-") in ended[0]
    assert "reached the end of calendar-mode reservation v6e-cal-r" in ended[0]
    assert "JobFailed" not in h.events("t1")
    h.run()  # its recreated pods wait for nodes that do not come: it ends at its timeout
    assert h.statuses()["t1"] == ("Failed", "Timeout") and _replays_clean(h)
