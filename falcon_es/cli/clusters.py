"""Clusters: ``falcon-es cluster add|list|set-status|set-node-location`` to register
them and change their status or node zone, and ``falcon-es clusters`` for what each one holds now (reservation,
pools, queues), folded from the log and optionally asked of GKE and Compute."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from falcon_es.domain.clusters import CLUSTER_STATUSES, Cluster, cluster_stream
from falcon_es.storage import registry
from falcon_es.cli.common import app_of, emit, engine_of, friendly, gcp_backend
from falcon_es.config.settings import Settings
from falcon_es.domain.task import TaskState

if TYPE_CHECKING:
    from falcon_es.observability.metrics import Metrics, PoolSample
    from falcon_es.storage.store import EventStore


@click.group("cluster")
def cluster_group() -> None:
    """Register clusters and change their status."""


@cluster_group.command("add")
@click.argument("name")
@click.option("--project", required=True)
@click.option("--location", required=True,
              help="The GKE cluster's own location: its region (regional cluster) or zone "
                   "(zonal cluster), as in projects/P/locations/LOCATION/clusters/NAME.")
@click.option("--node-location", default=None,
              help="The zone its TPU pools and reservations are in; required for a "
                   "regional cluster, a zonal cluster's is its location.")
@click.option("--tpu-type", required=True)
@click.option("--gcs-bucket", required=True, help="Bucket for task logs.")
@click.option("--reservation", default=None, help="Default reservation for its pools.")
@click.option("--status", default="active", type=click.Choice(CLUSTER_STATUSES))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def cluster_add(ctx: click.Context, name: str, project: str, location: str,
                node_location: str | None, tpu_type: str, gcs_bucket: str,
                reservation: str | None, status: str, as_json: bool) -> None:
    """Register a GKE cluster."""
    cluster = registry.add_cluster(
        app_of(ctx).store, name=name, project=project, location=location, tpu_type=tpu_type,
        gcs_bucket=gcs_bucket, default_reservation=reservation, status=status,
        node_location=node_location,
    )
    if as_json:
        click.echo(json.dumps(cluster.as_dict(), indent=2))
    else:
        click.echo(f"registered {cluster.name} ({cluster.tpu_type}, {cluster.status}) id "
                   f"{cluster.id}: {cluster.kind} cluster {cluster.location}, TPU pools in "
                   f"{cluster.node_zone}")


@cluster_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def cluster_list(ctx: click.Context, as_json: bool) -> None:
    """List registered clusters."""
    with engine_of(ctx).connect() as conn:
        rows = [c.as_dict() for c in registry.list_clusters(conn)]
    emit(rows, as_json, ["name", "tpu_type", "status", "project", "location",
                         "node_location", "default_reservation", "gcs_bucket", "id"])


@cluster_group.command("set-status")
@click.argument("name")
@click.argument("status", type=click.Choice(CLUSTER_STATUSES))
@click.pass_context
@friendly
def cluster_set_status(ctx: click.Context, name: str, status: str) -> None:
    """Set a cluster active, in maintenance or offline."""
    cluster = registry.set_status(app_of(ctx).store, name, status)
    click.echo(f"{cluster.name} is {cluster.status}")


@cluster_group.command("set-node-location")
@click.argument("name")
@click.argument("zone")
@click.pass_context
@friendly
def cluster_set_node_location(ctx: click.Context, name: str, zone: str) -> None:
    """Set the zone a cluster's new TPU pools and reservation reads use."""
    cluster = registry.set_node_location(app_of(ctx).store, name, zone)
    click.echo(f"{cluster.name} ({cluster.kind} {cluster.location}): TPU pools in "
               f"{cluster.node_zone}")


@click.command("clusters")
@click.option("--live", is_flag=True,
              help="Also ask GKE for each cluster's node pools and Compute for the "
                   "reservation's remaining slices (gcp backend credentials).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def clusters_command(ctx: click.Context, live: bool, as_json: bool) -> None:
    """Per cluster: reservation remaining, active pools with topology, queue depths and
    running counts, folded from the log (--live adds what GKE and Compute say now)."""
    from falcon_es.observability.metrics import Metrics
    from falcon_es.projections import replay as rp
    from falcon_es.projections.node_pools import DELETED, pool_samples

    app = app_of(ctx)
    states = rp.fold_log(app.store)
    with app.engine.connect() as conn:
        clusters = registry.list_clusters(conn)
    pools = pool_samples(states, {c.id: c for c in clusters})
    metrics = Metrics(tasks=states.all, pools=lambda: pools, process_collectors=False)
    _recorded_reads(app.store, clusters, metrics)
    live_views = (_live_cluster_views(ctx.obj["settings"], clusters, pools, states.all(), metrics)
                  if live else {})
    overview = metrics.cluster_overview(clusters)
    for entry in overview:
        entry.update(live_views.get(entry["name"], {}))
    if as_json:
        click.echo(json.dumps(overview, indent=2, ensure_ascii=False))
        return
    rows = []
    for entry in overview:
        reservation = entry["default_reservation"] or ""
        remaining = [f"{r['topology']}: {r['slices']} slice(s) free"
                     for r in entry["reservation_remaining"]]
        rows.append({
            "cluster": entry["name"], "tpu": entry["tpu_type"], "status": entry["status"],
            "reservation": "\n".join([reservation, *remaining]).strip(),
            "pools": "\n".join(f"{p['name']} {p['topology']} {p['state']} ({p['owner_task']})"
                               for p in entry["pools"] if p["state"] != DELETED),
            "queues": "\n".join(f"{q['topology']}: {q['depth']} pending, {q['running']} running"
                                for q in entry["queues"]),
            **({"live pools": "\n".join(
                f"{p['name']} {p['status']} {p['topology']}" for p in entry["live_pools"])
                + "".join(f"\n{e}" for e in entry["errors"])} if live else {}),
        })
    emit(rows, False)


def _recorded_reads(store: EventStore, clusters: Sequence[Cluster],
                    metrics: Metrics) -> None:
    """The controller's last scheduled read of each cluster's reservation, per topology,
    from the cluster's stream (``ReservationRead``, recorded when a value changed)."""
    from falcon_es.domain.events import ReservationRead

    for cluster in clusters:
        for record in store.read_stream(cluster_stream(cluster.id)):
            read = record.event
            if isinstance(read, ReservationRead) and read.reservation == cluster.default_reservation:
                metrics.set_reservation_remaining(cluster.name, read.reservation, read.topology,
                                                  read.slices, observed_at=record.recorded_at)


def _live_cluster_views(settings: Settings, clusters: Sequence[Cluster],
                        pools: Sequence[PoolSample], tasks: Sequence[TaskState],
                        metrics: Metrics) -> dict[str, dict[str, Any]]:
    """GKE's node pools and Compute's remaining slices per cluster, read now (failures
    are reported per cluster, not fatal)."""
    from falcon_es.observability.metrics import queue_figures
    from falcon_es.domain.ports import PortError
    from falcon_es.engine.reservation_reads import reserved_shape

    backend = gcp_backend(settings)
    queues = queue_figures(tasks)
    views: dict[str, dict[str, Any]] = {}
    try:
        for cluster in clusters:
            errors: list[str] = []
            live_pools: list[dict[str, Any]] = []
            try:
                for info in backend.node_pools.list(cluster):
                    if info.labels.get("managed-by") != "falcon":
                        continue
                    live_pools.append({"name": info.name, "status": info.status,
                                       "topology": info.labels.get("falcon-topology", ""),
                                       "node_count": info.node_count,
                                       "in_log": any(p.cluster == cluster.name
                                                     and p.name == info.name for p in pools)})
            except PortError as error:
                errors.append(f"node pools: {error.message}")
            topologies = sorted({p.topology for p in pools if p.cluster == cluster.name}
                                | {q.topology for q in queues if q.cluster == cluster.name})
            if cluster.default_reservation:
                for topology in topologies:
                    try:
                        shape = reserved_shape(backend.reservations, cluster,
                                               cluster.default_reservation, topology)
                        slices = backend.reservations.remaining_slices(
                            cluster, cluster.default_reservation, shape)
                    except PortError as error:
                        errors.append(f"reservation {topology}: {error.message}")
                        continue
                    metrics.set_reservation_remaining(cluster.name, cluster.default_reservation,
                                                      topology, slices)
            views[cluster.name] = {"live_pools": live_pools, "errors": errors}
    finally:
        backend.close()
    return views
