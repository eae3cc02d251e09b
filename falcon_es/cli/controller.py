"""``falcon-es run``: the controller loop, on the simulated world or on GCP, alone or
as one of several replicas behind a leader election.

The calls that build and serve the controller (``bootstrap.build_service``,
``service.serve``, ``service.serve_elected``) are made here and nowhere else in the
command line.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any, cast

import click
import sqlalchemy as sa

from falcon_es.storage import db, registry
from falcon_es.cli.common import EXIT_DATABASE, Failure, friendly, gcp_ports
from falcon_es.cli.process import (
    configure_logs,
    default_leader_election,
    lease_elector,
    start_health_server,
    stop_on_signals,
    stop_threads,
)
from falcon_es.domain.ports import Ports
from falcon_es.config.settings import PUBSUB_BUS, Settings

if TYPE_CHECKING:
    from falcon_es.adapters.gcp.kube import KubeEdgeClusters
    from falcon_es.adapters.sim import SimWorld
    from falcon_es.engine.loop import Leadership
    from falcon_es.observability.metrics import Metrics
    from falcon_es.app.service import Service


@dataclasses.dataclass
class _Serving:
    """What the latest leadership term built: its controller, which the metrics read
    at scrape time, and its simulated world, which the next term goes on in (unless
    the world is kept in the database: then each term loads it from there)."""

    svc: Service | None = None
    world: SimWorld | None = None


@click.command("run")
@click.option("--backend", type=click.Choice(["sim", "gcp"]), default=None,
              help="The world the controller acts on (default: FALCON_BACKEND, else sim).")
@click.option("--sim-config", type=click.Path(dir_okay=False), default=None,
              help="How the registered clusters behave on the sim backend, keyed by cluster "
                   "name (default: the packaged defaults for every cluster).")
@click.option("--seed", type=int, default=None, help="Seed of the simulated world.")
@click.option("--sim-snapshot-every", type=click.IntRange(min=0), default=200, show_default=True,
              help="The simulated world is kept in the database, its changes written with "
                   "each commit and compacted into a snapshot every this many commits, so a "
                   "restarted controller goes on in the same world; 0: the world lives in "
                   "this process only.")
@click.option("--until-idle", is_flag=True, help="Stop once every task is terminal and nothing is due.")
@click.option("--tick", "tick_seconds", type=float, default=1.0, show_default=True,
              help="Wall seconds between ticks when nothing is due.")
@click.option("--realtime", is_flag=True, help="Pace the sim backend by the wall clock.")
@click.option("--health/--no-health", default=None,
              help="Serve /healthz /readyz /metrics /clusters (default: on with --backend gcp).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="Log lines as text or one JSON object each (default: FALCON_LOG_FORMAT).")
@click.option("--ops-topic", default=None,
              help="Publish every event to this topic (default: FALCON_TASK_EVENTS_TOPIC when "
                   "set, else falcon-task-events with gcp).")
@click.option("--bus", type=click.Choice(["sim", "pubsub"]), default=None,
              help="Where the ops stream and the edge events go: the simulated world's bus "
                   "or Pub/Sub (PUBSUB_EMULATOR_HOST, else FALCON_PUBSUB_PROJECT); default: "
                   "the backend's own. --backend sim --bus pubsub is a staging world.")
@click.option("--leader-election", type=click.Choice(["lease", "none", "db"]), default=None,
              help="Who may append when several replicas run: a Kubernetes Lease "
                   "(FALCON_LEASE_NAME/NAMESPACE/DURATION/RENEW_DEADLINE/RETRY_PERIOD), a "
                   "database lock (a second controller stands by until it is free; "
                   "FALCON_DB_LOCK_TIMEOUT), or none (default: lease in a Kubernetes cluster "
                   "with --backend gcp, else db). Either election takes the log's writer "
                   "fence, so a replica whose term is over cannot append.")
@click.option("--in-process-informers/--no-in-process-informers", default=None,
              help="With --backend gcp, also watch every active registered cluster from this "
                   "process (instead of falcon-es informer Deployments).")
@click.pass_context
@friendly
def run_command(ctx: click.Context, backend: str | None, sim_config: str | None, seed: int | None,
                sim_snapshot_every: int, until_idle: bool, tick_seconds: float, realtime: bool, health: bool | None,
                log_format: str | None, ops_topic: str | None, bus: str | None,
                leader_election: str | None, in_process_informers: bool | None = None) -> None:
    """The controller loop; stops cleanly on SIGINT/SIGTERM after the current tick."""
    from falcon_es.app import service
    from falcon_es.app.application import open_app
    from falcon_es.app.bootstrap import BackendError, RunOptions, build_service
    from falcon_es.engine.leader import DatabaseLock
    from falcon_es.observability.metrics import Metrics
    from falcon_es.storage.registry import list_clusters

    settings: Settings = ctx.obj["settings"]
    if bus is not None:
        settings = settings.overridden(bus={"kind": bus})
    backend = backend or settings.run.backend
    if backend == "sim" and sim_config is not None:
        _check_sim_config(sim_config)  # one line now, not after the election's first term
    if in_process_informers is None:
        in_process_informers = settings.features.in_process_informers
    observability = configure_logs(settings, log_format)
    serving = _Serving()
    election = leader_election or default_leader_election(settings, backend)
    probe_engine = db.make_engine(settings.database.db_url, settings.database)
    elector: service.Election = (
        lease_elector(settings) if election == "lease"
        else DatabaseLock(probe_engine,
                          identity=f"{settings.database.controller_id} (pid {os.getpid()})",
                          lock_timeout=settings.database.lock_timeout) if election == "db"
        else service.Unelected())
    # An elected controller takes the log's writer fence at the start of each term.
    fenced_as = elector.identity if election != "none" else None
    metrics = Metrics(tasks=lambda: serving.svc.app.tasks.all() if serving.svc is not None and (
        elector.is_leader()) else [])
    ports = gcp_ports(settings) if backend == "gcp" else None

    def build(leadership: Leadership | None = None) -> Service:
        # A world kept in the database is loaded from it by each term: another replica
        # may have led it meanwhile; else a later term goes on in the same world.
        world = None if sim_snapshot_every else serving.world
        options = RunOptions(backend=backend, realtime=realtime, sim_config=sim_config,
                             seed=seed, tick_seconds=tick_seconds, world=world,
                             world_continues=world is not None,
                             sim_snapshot_every=sim_snapshot_every,
                             leadership=leadership if election != "none" else None)
        app = open_app(settings, options.clock(), metrics=metrics,
                       follow_log=election == "none", fenced_as=fenced_as)
        try:
            built = build_service(app, ports, options)
        except BackendError as error:
            app.close()
            raise Failure(str(error)) from error
        serving.svc, serving.world = built, built.world
        return built

    def database_check() -> None:
        with probe_engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    server = None
    if health if health is not None else backend == "gcp":
        def clusters() -> list[dict[str, Any]]:
            with probe_engine.connect() as conn:
                return metrics.cluster_overview(list_clusters(conn))

        server = start_health_server(observability, metrics, database_check=database_check,
                                     clusters=clusters)
    stop = stop_on_signals()
    informers = (_in_process_informers(settings, ports, probe_engine, stop, metrics)
                 if in_process_informers and ports is not None else [])
    on_pubsub = backend == "gcp" or settings.bus.kind == PUBSUB_BUS
    topic = ops_topic or _ops_topic(settings, on_pubsub)
    click.echo(f"falcon-es: controller running ({backend} backend, "
               f"{'Pub/Sub bus, ' if backend == 'sim' and on_pubsub else ''}"
               f"{'virtual' if backend == 'sim' and not realtime else 'wall'} clock, "
               f"leader election: {election}"
               f"{f' as {elector.identity}' if election == 'lease' else ''})", err=True)
    try:
        report = service.serve_elected(build, elector, until_idle=until_idle, stop=stop,
                                       metrics=metrics, health=server, ops_topic=topic,
                                       outage_limit=settings.database.outage_limit,
                                       database_check=database_check)
    except service.DatabaseOutage as error:
        raise Failure(str(error), EXIT_DATABASE) from error
    finally:
        stop_threads(stop, informers)  # in-process informers end with the loop
        if server is not None:
            server.stop()
        probe_engine.dispose()
    click.echo(f"falcon-es: stopped ({report.stopped_by}) after {report.ticks} ticks, "
               f"{report.appended} events", err=True)


def _check_sim_config(path: str) -> None:
    """A sim config that cannot be read stops ``run`` with one line naming what is wrong."""
    from falcon_es.adapters.sim import SimConfigError, load_sim_config

    try:
        load_sim_config(path)
    except SimConfigError as error:
        raise Failure(str(error)) from None


def _ops_topic(settings: Settings, on_pubsub: bool) -> str | None:
    """Where the ops stream goes without ``--ops-topic``: FALCON_TASK_EVENTS_TOPIC when
    it is set (on any backend), else the default topic when the bus is Pub/Sub."""
    from falcon_es.domain.ports import TASK_EVENTS_TOPIC

    if "task_events_topic" in settings.bus.model_fields_set:
        return settings.bus.task_events_topic
    return TASK_EVENTS_TOPIC if on_pubsub else None


def _in_process_informers(settings: Settings, ports: Ports, engine: sa.engine.Engine,
                          stop: threading.Event, metrics: Metrics) -> list[threading.Thread]:
    """An informer thread per active registered cluster, sharing the controller's
    Kubernetes clients and Pub/Sub bus (clusters registered later need a restart)."""
    from falcon_es.adapters.gcp.wiring import start_informers

    with engine.connect() as conn:
        active = [c for c in registry.list_clusters(conn) if c.status == "active"]
    edges = cast("KubeEdgeClusters", ports.edges)  # build_gcp_ports: Kubernetes clients
    return start_informers(active, edges, ports.bus, settings, stop, metrics=metrics)
