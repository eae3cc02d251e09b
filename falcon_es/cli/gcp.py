"""The gcp backend's own commands: ``falcon-es informer`` (the process that watches
the edge clusters and publishes what changes) and ``falcon-es doctor`` (everything
running against real GCP needs, checked one line each with its fix)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click
import sqlalchemy as sa

from falcon_es.domain.clusters import Cluster
from falcon_es.storage import db, registry
from falcon_es.cli.common import EXIT_PROBLEM, Failure, app_of, first_line, friendly, gcp_backend
from falcon_es.cli.process import (
    configure_logs,
    start_health_server,
    stop_on_signals,
    stop_threads,
)
from falcon_es.config.settings import Settings

if TYPE_CHECKING:
    from falcon_es.adapters.gcp.doctor import Check

#: Seconds between the informer process's liveness marks (well inside the probe's limit).
INFORMER_HEARTBEAT_SECONDS = 5.0


@click.command("informer")
@click.option("--cluster", "names", multiple=True, required=True, metavar="NAME",
              help="A registered cluster to watch; repeat for several (one thread each).")
@click.option("--health/--no-health", default=True, show_default=True,
              help="Serve /healthz and /readyz on FALCON_HEALTH_HOST:FALCON_HEALTH_PORT.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="Log lines as text or one JSON object each (default: FALCON_LOG_FORMAT).")
@click.pass_context
@friendly
def informer_command(ctx: click.Context, names: tuple[str, ...], health: bool,
                     log_format: str | None) -> None:
    """Watch Falcon's Jobs and Pods on edge clusters and publish every change to the
    edge-events topic: an informer as a process of its own (stops on SIGINT/SIGTERM)."""
    from falcon_es.adapters.gcp import wiring
    from falcon_es.observability.metrics import Metrics
    from falcon_es.domain.ports import PortError

    settings: Settings = ctx.obj["settings"]
    observability = configure_logs(settings, log_format)
    with app_of(ctx).engine.connect() as conn:
        found = {name: registry.find_cluster(conn, name) for name in dict.fromkeys(names)}
    unknown = [name for name, cluster in found.items() if cluster is None]
    if unknown:
        raise Failure(f"informer: no registered cluster named {', '.join(unknown)} "
                      "(see falcon-es cluster list)")
    backend = gcp_backend(settings)
    clusters = [cluster for cluster in found.values() if cluster is not None]
    try:
        for cluster in clusters:  # endpoint and CA now: a wrong cluster fails at start
            backend.edges.for_cluster(cluster)
    except PortError as error:
        backend.close()
        raise Failure(f"informer: {error.message}", EXIT_PROBLEM) from error
    stop = stop_on_signals()
    server = None
    metrics = Metrics()
    if health:
        server = start_health_server(observability, metrics)
    threads = wiring.start_informers(clusters, backend.edges, backend.bus, settings, stop,
                                     metrics=metrics)
    if server is not None:
        server.set_ready(True, f"watching {', '.join(found)}")
    click.echo(f"falcon-es: informer watching {', '.join(found)} (namespace "
               f"{settings.lifecycle.job_namespace}) -> topic {settings.bus.edge_events_topic}", err=True)
    heartbeat = min(INFORMER_HEARTBEAT_SECONDS, observability.max_tick_age_seconds / 3)
    ended: list[str] = []
    try:
        while not stop.is_set():
            ended = [thread.name for thread in threads if not thread.is_alive()]
            if ended:
                break
            if server is not None:
                server.mark_tick()
            stop.wait(heartbeat)
    finally:
        stop_threads(stop, threads)
        if server is not None:
            server.stop()
        backend.close()
    if ended:
        raise Failure(f"informer: {', '.join(ended)} ended unexpectedly (see the log)",
                      EXIT_PROBLEM)
    click.echo("falcon-es: informer stopped", err=True)


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="The checks as a JSON list.")
@click.pass_context
def doctor_command(ctx: click.Context, as_json: bool) -> None:
    """Check what running against real GCP needs, one line each with the fix for a
    failure: the database, the credentials, each registered cluster (GKE, Workload
    Identity, GCS FUSE, Kubernetes API, node pools, reservation) and the Pub/Sub
    topics and subscription. Exit 1 when a check fails."""
    from falcon_es.adapters.gcp.doctor import Doctor

    settings: Settings = ctx.obj["settings"]
    database, clusters = _database_check(settings)
    checks = [database, *Doctor(settings).run(clusters)]
    if as_json:
        click.echo(json.dumps([check.as_dict() for check in checks], indent=2))
    else:
        for check in checks:
            click.echo(check.line())
        failed = sum(1 for check in checks if check.failed)
        click.echo(f"{len(checks)} checks, {failed} failed" if failed else
                   f"{len(checks)} checks, all passed")
    if any(check.failed for check in checks):
        sys.exit(EXIT_PROBLEM)


def _database_check(settings: Settings) -> tuple[Check, list[Cluster]]:
    """The database line of ``doctor`` and, when it is usable, the registered clusters."""
    from alembic.script import ScriptDirectory

    from falcon_es.adapters.gcp.doctor import FAIL, OK, Check

    try:
        shown = sa.engine.make_url(settings.database.db_url).render_as_string(hide_password=True)
        engine = db.make_engine(settings.database.db_url)
    except (db.DatabaseUrlError, sa.exc.ArgumentError) as error:
        return Check("database", "FALCON_DB_URL", FAIL, str(error),
                     "set FALCON_DB_URL (or --db) to a mysql+pymysql:// or sqlite:/// URL"), []
    fix = "falcon-es db upgrade"
    try:
        revision = db.current_revision(engine)
        head = ScriptDirectory.from_config(db.alembic_config(engine)).get_current_head()
        if revision != head:
            found = f"at revision {revision}" if revision else "without the Falcon-ES schema"
            return Check("database", shown, FAIL, f"reachable, {found}; this version needs "
                                                  f"{head}", fix), []
        with engine.connect() as conn:
            clusters = registry.list_clusters(conn)
    except sa.exc.DBAPIError as error:
        return Check("database", shown, FAIL, first_line(error),
                     "check FALCON_DB_URL and that the server accepts connections from "
                     "here"), []
    finally:
        engine.dispose()
    return Check("database", shown, OK, f"reachable, schema at revision {revision}, "
                                        f"{len(clusters)} cluster(s) registered"), clusters
