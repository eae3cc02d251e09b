"""The sim backend simulates the clusters of the user's registry: exactly those, as
registered, behaving as the sim config says for each by name (or as its defaults), from
the first tick after one is registered; it never registers a cluster itself."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.adapters.sim import SimConfig
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.cluster_cache import ClusterCache
from falcon_es.domain.ports import NOT_FOUND, PortError
from falcon_es.app.service import Service
from falcon_es.config.settings import Settings
from falcon_es.domain.tpu import slice_shape
from tests.support.bench import SQLITE_ONLY

START = dt.datetime(2026, 11, 1, 9, 0, 0)
IMAGE = "us-docker.pkg.dev/p/r/train:1"


def spec(tpu_type: str, topology: str, seconds: int = 300) -> dict[str, Any]:
    return {"image": IMAGE, "tpu_type": tpu_type, "topology": topology,
            "sim": {"duration_seconds": seconds}}


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, *args])


def add(url: str, name: str, tpu_type: str, *extra: str) -> None:
    result = cli(url, "cluster", "add", name, "--project", "proj-1", "--location",
                 "us-east5-b", "--tpu-type", tpu_type, "--gcs-bucket", "logs", *extra)
    assert result.exit_code == 0, result.output


def registered(url: str) -> list[dict[str, Any]]:
    result = cli(url, "cluster", "list", "--json")
    assert result.exit_code == 0, result.output
    return list(json.loads(result.stdout))


def types_of(svc: Service, task_id: str) -> list[str]:
    return [r.type_name for r in svc.app.store.read_stream(task_id)]


def served(url: str, config: Mapping[str, Any], app: App | None = None) -> Service:
    """A controller on the sim backend of ``config``, on the registry of ``url``."""
    app = app or open_app(Settings(db_url=url), VirtualClock(START))
    return build_service(app, None, RunOptions(sim_config=SimConfig.from_data(config, "w.json")))


#: Nothing here is dialect-specific: the registry and the world are what is tested.
pytestmark = SQLITE_ONLY


@pytest.fixture
def url(db_url: str) -> str:
    """A migrated, empty SQLite database (``db_url``, on SQLite only)."""
    return db_url


def test_run_simulates_the_one_registered_cluster_and_registers_no_other(url: str) -> None:
    """A user with one v6e cluster: its task runs there; a v7x task finds no v7x cluster
    (the sim's own example clusters are not added behind the user's back)."""
    add(url, "mine", "v6e", "--reservation", "mine-r")
    (mine,) = registered(url)
    engine = db.make_engine(url)
    job_rows.submit(engine, task_id="v6e-task", name="a", actor="alice",
                    spec=spec("v6e", "2x2"), now=START)
    job_rows.submit(engine, task_id="v7x-task", name="b", actor="alice",
                    spec=spec("v7x", "2x2x1"), now=START)
    result = cli(url, "run", "--until-idle")
    assert result.exit_code == 0, result.output
    assert "stopped (idle)" in result.output
    assert [c["name"] for c in registered(url)] == ["mine"]
    ran = job_rows.get_row(engine, "v6e-task")
    assert (ran["status"], ran["cluster_id"]) == ("Succeeded", mine["id"])
    unplaced = job_rows.get_row(engine, "v7x-task")
    assert (unplaced["status"], unplaced["reason"]) == ("Failed", "NoMatchingCluster")
    engine.dispose()


def test_the_config_shapes_the_cluster_it_names_and_the_others_get_its_defaults(
        url: str) -> None:
    """``small``'s entry gives it a 4-VM reservation, so its second 4x4 slice waits in
    ClusterBusy for the first; ``plain`` is not named, so its default reservation has the
    documented default size (16 VMs) and both its slices run at once."""
    add(url, "small", "v6e", "--reservation", "small-r")
    add(url, "plain", "v7x", "--reservation", "plain-r")
    svc = served(url, {"clusters": {"small": {
        "reservations": [{"name": "small-r", "count": 4}]}}})
    try:
        for task_id, tpu_type, topology in (("s1", "v6e", "4x4"), ("s2", "v6e", "4x4"),
                                            ("p1", "v7x", "2x2x2"), ("p2", "v7x", "2x2x2")):
            job_rows.submit(svc.app.engine, task_id=task_id, name=task_id, actor=task_id,
                            spec=spec(tpu_type, topology, 1800), now=START)
        report = svc.loop.run(until_idle=True, max_ticks=5000)
        assert report.stopped_by == "idle"
        rows = {r["id"]: r["status"] for r in job_rows.list_rows(svc.app.engine)}
        assert rows == dict.fromkeys(("s1", "s2", "p1", "p2"), "Succeeded")
        world = svc.world
        assert world is not None
        assert world.simulated() == ["plain", "small"]
        usage = world.reservation_usage("small", "small-r")
        assert usage is not None and usage.count == 4
        default = world.reservation_usage("plain", "plain-r")
        assert default is not None and (default.count, default.in_use) == (16, 0)
        waited = [t for t in ("s1", "s2", "p1", "p2")
                  if "ReservationInsufficient" in types_of(svc, t)]
        assert len(waited) == 1 and waited[0].startswith("s")
    finally:
        svc.close()


def test_a_cluster_registered_while_the_controller_runs_is_simulated_from_then_on(
        url: str) -> None:
    """Another process (``falcon-es cluster add``) registers a v7x cluster while the
    controller serves a v6e one; once the controller's registry cache reads it again (at
    most ``MAX_AGE_SECONDS`` of wall time later; the test moves that clock), v7x work
    runs on the new cluster, with its entry's behaviour."""
    add(url, "first", "v6e")
    wall = [0.0]
    opened = open_app(Settings(db_url=url), VirtualClock(START))
    app = dataclasses.replace(opened, cluster_cache=ClusterCache(
        opened.engine, monotonic=lambda: wall[0]))
    svc = served(url, {"clusters": {"later": {"reservations": [{"name": "later-r",
                                                                  "count": 2}]}}}, app)
    try:
        job_rows.submit(svc.app.engine, task_id="t1", name="t1", actor="a",
                        spec=spec("v6e", "2x2"), now=START)
        assert svc.loop.run(until_idle=True, max_ticks=3000).stopped_by == "idle"
        add(url, "later", "v7x", "--reservation", "later-r")
        wall[0] += 60
        job_rows.submit(svc.app.engine, task_id="t2", name="t2", actor="a",
                        spec=spec("v7x", "2x2x2"), now=svc.loop.clock.now())
        assert svc.loop.run(until_idle=True, max_ticks=3000).stopped_by == "idle"
        later = {c["name"]: c["id"] for c in registered(url)}["later"]
        row = job_rows.get_row(svc.app.engine, "t2")
        assert (row["status"], row["cluster_id"]) == ("Succeeded", later)
        world = svc.world
        assert world is not None and world.simulated() == ["first", "later"]
        usage = world.reservation_usage("later", "later-r")
        assert usage is not None and usage.count == 2  # its entry, not the default 16
    finally:
        svc.close()


def test_a_config_naming_an_unregistered_cluster_says_so_and_simulates_only_the_registry(
        url: str, tmp_path: Path) -> None:
    """A config entry whose name the registry lacks (a typo, or a cluster not added yet)
    registers nothing: ``run`` logs one line naming it and the registered clusters."""
    add(url, "gke-east", "v6e")
    world = tmp_path / "world.json"
    world.write_text(json.dumps({"clusters": {"gke-eats": {"system_nodes": 1}}}))
    result = cli(url, "run", "--until-idle", "--sim-config", str(world))
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "gke-eats" in line]
    assert len(said) == 1, result.output
    assert (f"sim config {world} describes cluster gke-eats, which is not registered: it is "
            "simulated once registered (falcon-es cluster add gke-eats ...); registered: "
            "gke-east") in said[0]
    assert "WARNING" in said[0]
    assert [c["name"] for c in registered(url)] == ["gke-east"]


def test_the_registry_says_where_a_cluster_is_and_a_config_that_disagrees_is_told(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The entry's identity fields are what demo/simulate/bench would register; the
    world simulates the registered cluster (its project and zone in every API answer)
    and logs each field that disagrees."""
    add(url, "mine", "v6e", "--reservation", "mine-r")
    caplog.set_level(logging.INFO, logger="falcon_es")
    svc = served(url, {"clusters": {"mine": {"project": "elsewhere", "tpu_type": "v6e",
                                             "location": "us-east5-b"}}})
    try:
        (cluster,) = svc.app.cluster_cache.clusters()
        with pytest.raises(PortError) as caught:
            svc.ports.reservations.remaining_slices(cluster, "other-r", slice_shape("v6e", "2x2"))
        assert caught.value.code == NOT_FOUND
        assert "projects/proj-1/zones/us-east5-b/reservations/other-r" in caught.value.message
        free = svc.ports.reservations.remaining_slices(cluster, "mine-r", slice_shape("v6e", "2x2"))
        assert free == 16  # the registered default reservation, default size, 1 VM a slice
    finally:
        svc.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "sim config w.json: clusters.mine.project is 'elsewhere' but the registry has "
        "'proj-1'; simulating the registered cluster (a config's project only says what "
        "demo, simulate and bench register)"]
    infos = [r.getMessage() for r in caplog.records if r.getMessage().startswith("simulating")]
    assert infos == ["simulating cluster mine (proj-1, us-east5-b, v6e, reservation mine-r) "
                     "with its entry in w.json"]


def test_a_default_reservation_the_config_says_does_not_exist_is_not_found(url: str) -> None:
    """``default_reservation_size: null``: Compute has no such reservation, so the
    task's reservation read fails as not found, as against a deleted reservation."""
    add(url, "gone", "v6e", "--reservation", "gone-r")
    svc = served(url, {"clusters": {"gone": {"default_reservation_size": None}}})
    try:
        (cluster,) = svc.app.cluster_cache.clusters()
        with pytest.raises(PortError) as caught:
            svc.ports.reservations.remaining_slices(cluster, "gone-r", slice_shape("v6e", "2x2"))
        assert caught.value.code == NOT_FOUND
    finally:
        svc.close()


def test_a_behaviour_in_the_wrong_shape_stops_run_with_one_line_naming_it(
        url: str, tmp_path: Path) -> None:
    add(url, "gke-east", "v6e")
    world = tmp_path / "world.json"
    world.write_text(json.dumps({"clusters": {"gke-east": {"stockout": {"probability": "often"}}}}))
    result = cli(url, "run", "--until-idle", "--sim-config", str(world))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"falcon-es: sim config {world}: clusters.gke-east.stockout.probability: expected a "
        "probability between 0 and 1, found 'often'"]
