"""A cluster's GKE location and the zone of its TPU pools, as the registry keeps them
(docs/design-notes/regional-clusters.md): registration rules, the CLI's one-line refusals,
and a registry written before the zone was kept (migration 0005, both dialects)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from click.testing import CliRunner, Result

from falcon_es.app.application import open_app
from falcon_es.cli import EXIT_BAD_INPUT, main
from falcon_es.config.settings import Settings
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.clusters import RegistryError, node_location_for
from falcon_es.storage import db, registry
from falcon_es.storage.tables import clusters

START = dt.datetime(2026, 11, 1, 9, 0)


def cli(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", db_url, *args])


def add(db_url: str, name: str, location: str, *extra: str) -> Result:
    return cli(db_url, "cluster", "add", name, "--project", "proj-1", "--location", location,
               "--tpu-type", "v6e", "--gcs-bucket", "logs", *extra)


def refusal(result: Result) -> str:
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def test_a_regional_cluster_is_registered_with_its_node_zone(db_url: str) -> None:
    said = add(db_url, "gke-r", "us-central1", "--node-location", "us-central1-b")
    assert said.exit_code == 0, said.output
    assert said.stdout.rstrip().endswith(
        ": regional cluster us-central1, TPU pools in us-central1-b")
    (row,) = json.loads(cli(db_url, "cluster", "list", "--json").stdout)
    assert (row["location"], row["node_location"]) == ("us-central1", "us-central1-b")


def test_a_zonal_clusters_node_zone_is_its_location(db_url: str) -> None:
    assert add(db_url, "gke-z", "us-east5-b").exit_code == 0
    (row,) = json.loads(cli(db_url, "cluster", "list", "--json").stdout)
    assert (row["location"], row["node_location"]) == ("us-east5-b", "us-east5-b")


def test_a_regional_cluster_without_a_node_zone_is_refused_naming_the_flag(db_url: str) -> None:
    line = refusal(add(db_url, "gke-r", "us-central1"))
    assert line == ("falcon-es: cluster gke-r is regional (us-central1): give the zone its "
                    "TPU pools go in with --node-location ZONE (e.g. us-central1-a)")
    assert json.loads(cli(db_url, "cluster", "list", "--json").stdout) == []


@pytest.mark.parametrize("location, node_location, words", [
    ("us-central1", "us-east5-a", "zone us-east5-a is not in the cluster's region us-central1"),
    ("us-central1", "us-central1", "--node-location 'us-central1' is not a zone"),
    ("us-east5-b", "us-east5-a", "cluster gke-x is zonal (us-east5-b): its nodes are in "
                                 "us-east5-b, not us-east5-a"),
    ("l", None, "location 'l' is neither a zone (us-central1-a) nor a region (us-central1)"),
])
def test_registration_refuses_zones_gke_would_not_take(location: str, node_location: str | None,
                                                        words: str) -> None:
    with pytest.raises(RegistryError) as refused:
        node_location_for("gke-x", location, node_location)
    assert words in str(refused.value)


def test_a_registry_written_before_the_node_zone_keeps_working(bare_db_url: str) -> None:
    """Rows and ClusterRegistered events from revision 0004: the zonal row gets its zone
    as node zone; the regional one (which could never create a pool in one zone) has
    none until ``cluster set-node-location`` gives it one."""
    engine = db.make_engine(bare_db_url)
    try:
        db.upgrade(engine, "0004")
        with engine.begin() as conn:
            for name, location in (("old-z", "us-east5-b"), ("old-r", "us-central1")):
                conn.exec_driver_sql(
                    "INSERT INTO clusters (id, name, project, location, tpu_type, gcs_bucket, "
                    "default_reservation, status, created_at) VALUES "
                    f"('id-{name}', '{name}', 'p', '{location}', 'v6e', 'b', 'res-1', 'active', "
                    "'2026-11-01 09:00:00')")
        db.upgrade(engine)
        db.upgrade(engine)  # rerunnable
    finally:
        engine.dispose()
    old_event = ev.decode("ClusterRegistered", 1, {
        "cluster_id": "id-old-z", "name": "old-z", "project": "p", "location": "us-east5-b",
        "tpu_type": "v6e", "gcs_bucket": "b", "default_reservation": "res-1",
        "status": "active"})
    assert isinstance(old_event, ev.ClusterRegistered) and old_event.node_location is None

    app = open_app(Settings(db_url=bare_db_url), VirtualClock(START))
    try:
        with app.engine.connect() as conn:
            zonal, regional = (registry.find_cluster(conn, n) for n in ("old-z", "old-r"))
        assert zonal is not None and regional is not None
        assert (zonal.kind, zonal.node_zone) == ("zonal", "us-east5-b")
        assert (regional.kind, regional.node_zone) == ("regional", None)
        fixed = registry.set_node_location(app.store, "old-r", "us-central1-c")
        assert fixed.node_zone == "us-central1-c"
        with app.engine.connect() as conn:
            assert conn.execute(clusters.select().where(clusters.c.name == "old-r")
                                ).one().node_location == "us-central1-c"
        (changed,) = [r.event for r in app.store.read_stream(fixed.stream_id)]
        assert changed == ev.ClusterNodeLocationSet("id-old-r", "old-r", None, "us-central1-c")
    finally:
        app.close()


def test_set_node_location_from_the_cli(db_url: str) -> None:
    assert add(db_url, "gke-r", "us-central1", "--node-location", "us-central1-a").exit_code == 0
    moved = cli(db_url, "cluster", "set-node-location", "gke-r", "us-central1-f")
    assert moved.stdout == "gke-r (regional us-central1): TPU pools in us-central1-f\n"
    assert refusal(cli(db_url, "cluster", "set-node-location", "gke-r", "europe-west4-a")) == (
        "falcon-es: cluster gke-r: zone europe-west4-a is not in the cluster's region "
        "us-central1")
