"""The ``falcon-es`` command line (also ``python -m falcon_es``).

Human-readable tables by default, ``--json`` for scripts. Exit codes: 0 success,
1 the command ran and found a problem (a replay difference, a failed check),
2 bad input, 3 the database cannot be used.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import sqlalchemy as sa
from tabulate import tabulate

from falcon_es import chart, db, job_rows, registry
from falcon_es.bootstrap import App, open_app
from falcon_es.settings import Settings, SettingsError
from falcon_es.store import RecordedEvent
from falcon_es.tables import job
from falcon_es.adapters.sim.config import SimConfigError
from falcon_es.tpu import TopologyError

EXIT_PROBLEM, EXIT_BAD_INPUT, EXIT_DATABASE = 1, 2, 3
F = TypeVar("F", bound=Callable[..., Any])


class Failure(click.ClickException):
    """One clear line for the user, and an exit code that means something."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        # click declares exit_code a ClassVar but reads it from the raised instance.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"falcon-es: {self.message}", err=True)


def _friendly(func: F) -> F:
    """Turn the errors users can cause into one line each, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (registry.RegistryError, job_rows.JobRowError, SettingsError, SimConfigError,
                db.DatabaseUrlError, TopologyError) as error:
            raise Failure(str(error)) from error
        except sa.exc.OperationalError as error:
            raise Failure(_database_problem(error), EXIT_DATABASE) from error
        except sa.exc.ProgrammingError as error:
            raise Failure(_database_problem(error), EXIT_DATABASE) from error
        except sa.exc.DataError as error:
            raise Failure(f"the database refused a value: {_first_line(error)}") from error

    return wrapper  # type: ignore[return-value]


def _first_line(error: sa.exc.DBAPIError) -> str:
    return (str(error.orig) if error.orig else str(error)).strip().splitlines()[0]


def _database_problem(error: sa.exc.DBAPIError) -> str:
    text = _first_line(error)
    if "no such table" in text or "doesn't exist" in text:
        return f"the database has no Falcon-ES schema ({text}); run: falcon-es db upgrade"
    return f"database error: {text}"


def _app(ctx: click.Context) -> App:
    app: App | None = ctx.obj.get("app")
    if app is None:
        app = open_app(ctx.obj["settings"])
        ctx.obj["app"] = app
        ctx.call_on_close(app.close)
    return app





def _emit(rows: Sequence[Mapping[str, Any]], as_json: bool, columns: Sequence[str] | None = None) -> None:
    if as_json:
        click.echo(json.dumps([_jsonable(r) for r in rows], indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("(none)")
        return
    columns = columns or list(rows[0].keys())
    click.echo(tabulate([[_cell(r.get(c)) for c in columns] for r in rows], headers=columns))


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def _cell(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", envvar="FALCON_DB_URL", default=None,
              help="Database URL (default sqlite:///falcon.db; MySQL: mysql+pymysql://...).")
@click.option("--lang", type=click.Choice(["en", "zh"]), default=None,
              help="Language of rendered Messages (default FALCON_LANG or en).")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, lang: str | None) -> None:
    """Falcon-ES: event-sourced TPU resource manager for GKE."""
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        raise Failure(str(error)) from error
    overrides: dict[str, Any] = {}
    if db_url:
        overrides["db_url"] = db_url
    if lang:
        overrides["language"] = lang
    ctx.obj = {"settings": Settings(**{**settings.__dict__, **overrides})}


# ----------------------------------------------------------------------- db


@main.group("db")
def db_group() -> None:
    """Create or check the database schema."""


@db_group.command("upgrade")
@click.pass_context
@_friendly
def db_upgrade(ctx: click.Context) -> None:
    """Apply the migrations (creates task_events, clusters, job, ...)."""
    app = _app(ctx)
    db.upgrade(app.engine)
    click.echo(f"database at revision {db.current_revision(app.engine)}")


@db_group.command("check")
@click.option("--table", default="job", show_default=True, help="Name of the upper layer's job table.")
@click.pass_context
@_friendly
def db_check(ctx: click.Context, table: str) -> None:
    """Check that an existing job table has every column Falcon-ES reads and writes."""
    problems = db.check_job_table(_app(ctx).engine, table)
    if not problems:
        click.echo(f"{table}: all {len(db.JOB_COLUMN_KINDS)} columns present with usable types")
        return
    for problem in problems:
        click.echo(str(problem).replace("job.", f"{table}.", 1), err=True)
    sys.exit(EXIT_PROBLEM)


# ----------------------------------------------------------------------- clusters


@main.group("cluster")
def cluster_group() -> None:
    """Register clusters and change their status."""


@cluster_group.command("add")
@click.argument("name")
@click.option("--project", required=True)
@click.option("--location", required=True, help="Zone or region of the GKE cluster.")
@click.option("--tpu-type", required=True)
@click.option("--gcs-bucket", required=True, help="Bucket for task logs.")
@click.option("--reservation", default=None, help="Default reservation for its pools.")
@click.option("--status", default="active", type=click.Choice(registry.CLUSTER_STATUSES))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def cluster_add(ctx: click.Context, name: str, project: str, location: str, tpu_type: str,
                gcs_bucket: str, reservation: str | None, status: str, as_json: bool) -> None:
    """Register a GKE cluster."""
    cluster = registry.add_cluster(
        _app(ctx).store, name=name, project=project, location=location, tpu_type=tpu_type,
        gcs_bucket=gcs_bucket, default_reservation=reservation, status=status,
    )
    if as_json:
        click.echo(json.dumps(cluster.as_dict(), indent=2))
    else:
        click.echo(f"registered {cluster.name} ({cluster.tpu_type}, {cluster.status}) id {cluster.id}")


@cluster_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def cluster_list(ctx: click.Context, as_json: bool) -> None:
    """List registered clusters."""
    with _app(ctx).engine.connect() as conn:
        rows = [c.as_dict() for c in registry.list_clusters(conn)]
    _emit(rows, as_json, ["name", "tpu_type", "status", "project", "location",
                          "default_reservation", "gcs_bucket", "id"])


@cluster_group.command("set-status")
@click.argument("name")
@click.argument("status", type=click.Choice(registry.CLUSTER_STATUSES))
@click.pass_context
@_friendly
def cluster_set_status(ctx: click.Context, name: str, status: str) -> None:
    """Set a cluster active, in maintenance or offline."""
    cluster = registry.set_status(_app(ctx).store, name, status)
    click.echo(f"{cluster.name} is {cluster.status}")


# ----------------------------------------------------------------------- tasks


@main.group("task")
def task_group() -> None:
    """Act as the upper layer: submit, list, show and abort tasks."""


def _read_spec_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise Failure(f"spec file {path}: {error.strerror}") from error
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as error:
        raise Failure(f"spec file {path}: not valid JSON at line {error.lineno} "
                      f"column {error.colno}: {error.msg}") from error
    if not isinstance(spec, dict):
        raise Failure(f"spec file {path}: expected a JSON object, found {type(spec).__name__}")
    return spec


@task_group.command("submit")
@click.option("--actor", required=True, help="Who submits (FIFO and round-robin key).")
@click.option("--name", required=True, help="Display name of the task.")
@click.option("--tpu-type")
@click.option("--topology")
@click.option("--image")
@click.option("--command", "command", multiple=True, help="Repeat for each argv element.")
@click.option("--supply-mode", type=click.Choice(["reservation", "on-demand", "flex-start"]))
@click.option("--timeout", "timeout", type=int, help="Seconds from dispatch to timeout.")
@click.option("--spec-file", type=click.Path(dir_okay=False), help="A JSON task spec.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def task_submit(ctx: click.Context, actor: str, name: str, tpu_type: str | None,
                topology: str | None, image: str | None, command: tuple[str, ...],
                supply_mode: str | None, timeout: int | None, spec_file: str | None,
                as_json: bool) -> None:
    """Insert a Pending row, as the upper layer does; prints the task id."""
    spec: dict[str, Any] = _read_spec_file(spec_file) if spec_file else {}
    flags = {"tpu_type": tpu_type, "topology": topology, "image": image,
             "command": list(command) or None, "supply_mode": supply_mode,
             "timeout_seconds": timeout}
    spec.update({k: v for k, v in flags.items() if v is not None})
    missing = [k for k in ("tpu_type", "topology", "image") if k not in spec]
    if missing:
        raise Failure("task submit: missing " + ", ".join(
            f"--{m.replace('_', '-')}" for m in missing) + " (or put them in --spec-file)")
    for option, value in (("actor", actor), ("name", name)):
        column_type = job.c[option].type
        if not isinstance(column_type, sa.String) or column_type.length is None:
            raise TypeError(f"job.{option} is not a string column of a fixed length")
        limit = column_type.length
        if len(value) > limit:
            raise Failure(f"task submit: --{option} is longer than {limit} characters")
    app = _app(ctx)
    task_id = job_rows.submit(app.engine, name=name, actor=actor, spec=spec, now=app.clock.now())
    click.echo(json.dumps({"id": task_id}) if as_json else task_id)


TASK_COLUMNS = ("id", "name", "actor", "status", "reason", "message", "created_at")


@task_group.command("list")
@click.option("--status", default=None, help="Only tasks in this status.")
@click.option("--limit", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def task_list(ctx: click.Context, status: str | None, limit: int | None, as_json: bool) -> None:
    """List tasks with their Status / Reason / Message."""
    rows = job_rows.list_rows(_app(ctx).engine, status=status, limit=limit)
    _emit(rows, as_json, None if as_json else TASK_COLUMNS)


@task_group.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def task_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one task's row."""
    row = job_rows.get_row(_app(ctx).engine, task_id)
    if as_json:
        click.echo(json.dumps(_jsonable(row), indent=2, ensure_ascii=False))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            click.echo(f"{key.ljust(width)}  {_cell(value)}")


@task_group.command("abort")
@click.argument("task_id")
@click.pass_context
@_friendly
def task_abort(ctx: click.Context, task_id: str) -> None:
    """Request an abort (sets Aborting and aborting_at, as the upper layer does)."""
    app = _app(ctx)
    before = job_rows.request_abort(app.engine, task_id, app.clock.now())
    click.echo(f"{task_id}: Aborting (was {before})")


# ----------------------------------------------------------------------- the log


@main.command("chart")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid")
def chart_command(fmt: str) -> None:
    """Print the task state chart (Mermaid or DOT)."""
    click.echo(chart.to_mermaid() if fmt == "mermaid" else chart.to_dot())


def _event_row(record: RecordedEvent) -> dict[str, Any]:
    return {
        "seq": record.seq, "stream_id": record.stream_id, "version": record.version,
        "recorded_at": record.recorded_at, "type": record.type_name,
        "data": record.event.to_data(), "causation_id": record.meta.get("causation_id"),
        "correlation_id": record.meta.get("correlation_id"), "actor": record.meta.get("actor"),
    }


@main.command("history")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def history(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """A task's events in order: time, type, data, causation and actor."""
    app = _app(ctx)
    records = app.store.read_stream(task_id)
    if not records:
        row = job_rows.get_row(app.engine, task_id)
        raise Failure(f"task {task_id} has no events in the log yet (status {row['status']}: "
                      "the controller has not taken it in)", EXIT_PROBLEM)
    rows = [_event_row(r) for r in records]
    _emit(rows, as_json, None if as_json else
          ["version", "recorded_at", "type", "actor", "causation_id", "data"])


@main.command("events")
@click.option("--after", type=int, default=0, help="Start after this seq.")
@click.option("--follow", is_flag=True, help="Keep printing new events as they commit.")
@click.option("--poll", type=float, default=1.0, help="Seconds between polls with --follow.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@_friendly
def events_command(ctx: click.Context, after: int, follow: bool, poll: float, as_json: bool) -> None:
    """Tail the log."""
    store = _app(ctx).store
    position = after
    while True:
        for record in store.read_after(position):
            row = _event_row(record)
            if as_json:
                click.echo(json.dumps(_jsonable(row), ensure_ascii=False))
            else:
                click.echo(f"{row['seq']:>8}  {_cell(row['recorded_at'])}  {row['stream_id']}"
                           f"  v{row['version']}  {row['type']}  {json.dumps(row['data'], ensure_ascii=False)}")
            position = record.seq
        if not follow:
            return
        try:
            time.sleep(poll)
        except KeyboardInterrupt:
            return


@main.command("replay")
@click.option("--verify", "mode", flag_value="verify", help="Rebuild into scratch and diff with live.")
@click.option("--rebuild", "mode", flag_value="rebuild", help="Rebuild the live projections in place.")
@click.option("--until", "until", default=None, help="A seq or an ISO time: the state as of then.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def replay(ctx: click.Context, mode: str | None, until: str | None, as_json: bool) -> None:
    """Replay the log: verify, rebuild, or time-travel (--until)."""
    from falcon_es.projections import replay as rp

    app = _app(ctx)
    lang = app.settings.language
    if until is not None:
        seq = _position(app, until)
        states, queues = rp.fold_views(app.store, lang, until=seq)
        rows = rp.state_rows(states, lang, queues)
        if as_json:
            _emit(rows, True)
        else:
            click.echo(f"state as of seq {seq}")
            _emit(rows, False, ["id", "name", "actor", "status", "reason", "message", "updated_at"])
        return
    if mode == "rebuild":
        states, queues = rp.fold_views(app.store, lang)
        with app.engine.begin() as conn:
            count = rp.rebuild(conn, states, lang, queues)
        click.echo(f"rebuilt {count} job rows from {app.store.head()} events")
        return
    if mode == "verify":
        differences = rp.verify(app.engine, app.store, lang)
        if as_json:
            click.echo(json.dumps([_jsonable(d.__dict__) for d in differences], indent=2))
        elif differences:
            for difference in differences:
                click.echo(str(difference))
        if differences:
            click.echo(f"replay differs from the live projections in {len(differences)} value(s)", err=True)
            sys.exit(EXIT_PROBLEM)
        if not as_json:
            click.echo(f"replay of {app.store.head()} events matches the live projections")
        return
    raise Failure("replay: choose --verify, --rebuild or --until SEQ|ISO-TIME")


def _position(app: App, until: str) -> int:
    if until.isdigit():
        return int(until)
    try:
        moment = dt.datetime.fromisoformat(until)
    except ValueError:
        raise Failure(f"--until {until!r}: expected a seq number or an ISO time "
                      "such as 2026-11-29T12:00:00") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return app.store.seq_at(moment)


@main.command("queues")
@click.option("--json", "as_json", is_flag=True)
@click.option("--show", type=int, default=3, show_default=True,
              help="Waiting tasks listed per queue in the table.")
@click.pass_context
@_friendly
def queues_command(ctx: click.Context, as_json: bool, show: int) -> None:
    """The (cluster, topology) queues, folded from the log: slot holder, waiting tasks
    in pick order, running count, actor served last."""
    from falcon_es.projections import replay as rp
    from falcon_es.projections.queues import queue_rows, unplaced_rows

    app = _app(ctx)
    _, view = rp.fold_views(app.store, app.settings.language)
    with app.engine.connect() as conn:
        clusters = {c.id: c for c in registry.list_clusters(conn)}
    rows = queue_rows(view, clusters)
    unplaced = unplaced_rows(view)
    if as_json:
        click.echo(json.dumps({"queues": rows, "unplaced": unplaced}, indent=2, ensure_ascii=False))
        return
    table = []
    for row in rows:
        holder = row["slot_holder"]
        waiting = [f"#{w['position']} {w['actor']}: {w['name']}" for w in row["waiting"][:show]]
        if row["waiting_count"] > show:
            waiting.append(f"... {row['waiting_count'] - show} more")
        table.append({
            "cluster": row["cluster"] or row["cluster_id"],
            "status": row["cluster_status"] or "",
            "topology": row["topology"],
            "slot": f"{holder['actor']}: {holder['name']} ({holder['reason'] or holder['status']})"
            if holder else "free",
            "waiting": row["waiting_count"],
            "running": row["running"],
            "last served": row["last_actor"] or "",
            "next": "\n".join(waiting),
        })
    _emit(table, False)
    if unplaced:
        click.echo(f"\n{len(unplaced)} task(s) waiting for an active cluster: " + ", ".join(
            f"{u['actor']}: {u['name']} ({u['tpu_type']})" for u in unplaced[:show])
            + (" ..." if len(unplaced) > show else ""))


# ----------------------------------------------------------------------- benchmarks


@main.command("run")
@click.option("--backend", type=click.Choice(["sim", "gcp"]), default="sim", show_default=True,
              envvar="FALCON_BACKEND")
@click.option("--sim-config", type=click.Path(dir_okay=False), default=None,
              help="JSON description of the simulated world (default: the packaged one).")
@click.option("--seed", type=int, default=None, help="Seed of the simulated world.")
@click.option("--until-idle", is_flag=True, help="Stop once every task is terminal and nothing is due.")
@click.option("--tick", "tick_seconds", type=float, default=1.0, show_default=True,
              help="Wall seconds between ticks when nothing is due.")
@click.option("--realtime", is_flag=True, help="Pace the sim backend by the wall clock.")
@click.option("--health/--no-health", default=None,
              help="Serve /healthz /readyz /metrics /clusters (default: on with --backend gcp).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              envvar="FALCON_LOG_FORMAT", help="Log lines as text or one JSON object each.")
@click.option("--ops-topic", default=None, envvar="FALCON_TASK_EVENTS_TOPIC",
              help="Publish every event to this topic (default: falcon-task-events with gcp).")
@click.option("--leader-election", type=click.Choice(["lease", "none", "db"]), default=None,
              envvar="FALCON_LEADER_ELECTION",
              help="Who may append when several replicas run: a Kubernetes Lease "
                   "(FALCON_LEASE_NAME/NAMESPACE/DURATION/RENEW_DEADLINE/RETRY_PERIOD), a "
                   "database lock that refuses a second controller, or none (default: lease "
                   "in a Kubernetes cluster with --backend gcp, else db).")
@click.option("--in-process-informers/--no-in-process-informers", default=False,
              envvar="FALCON_IN_PROCESS_INFORMERS",
              help="With --backend gcp, also watch every active registered cluster from this "
                   "process (instead of falcon-es informer Deployments).")
@click.pass_context
@_friendly
def run_command(ctx: click.Context, backend: str, sim_config: str | None, seed: int | None,
                until_idle: bool, tick_seconds: float, realtime: bool, health: bool | None,
                log_format: str | None, ops_topic: str | None,
                leader_election: str | None, in_process_informers: bool = False) -> None:
    """The controller loop; stops cleanly on SIGINT/SIGTERM after the current tick."""
    import signal
    import threading

    from falcon_es import bootstrap, service
    from falcon_es.leader import AlreadyRunning, DatabaseLock
    from falcon_es.observability import ObservabilitySettings
    from falcon_es.observability.health import HealthServer
    from falcon_es.observability.logs import configure_logging
    from falcon_es.observability.metrics import Metrics
    from falcon_es.ports import TASK_EVENTS_TOPIC
    from falcon_es.registry import list_clusters

    settings: Settings = ctx.obj["settings"]
    observability = ObservabilitySettings.from_env()
    configure_logging(log_format or observability.log_format, observability.log_level)
    running: dict[str, Any] = {}
    election = leader_election or _default_leader_election(backend)
    elector = _lease_elector() if election == "lease" else None
    metrics = Metrics(tasks=lambda: running["svc"].app.tasks.all() if running and (
        elector is None or elector.is_leader()) else [])
    gcp_ports = _gcp_ports(settings) if backend == "gcp" else None

    def build(leadership: Any = None) -> service.Service:
        try:
            built = bootstrap.build_service(
                settings, backend=backend, sim_config=sim_config, seed=seed,
                realtime=realtime, tick_seconds=tick_seconds, metrics=metrics,
                ports=gcp_ports, world=running.get("world"), leadership=leadership,
                follow_log=election != "db")
        except bootstrap.BackendError as error:
            raise Failure(str(error)) from error
        if built.world is not None:  # a later leadership term goes on in the same world
            from falcon_es.adapters.sim.world import behaviour_from_tasks

            built.world.behaviour_source = behaviour_from_tasks(built.app.tasks)
        running.update(svc=built, world=built.world)
        return built

    # With a lease, a replica builds its controller (folds the log) only once it leads.
    svc = build() if elector is None else None
    probe_engine = svc.app.engine if svc is not None else db.make_engine(settings.db_url)
    lock = DatabaseLock(probe_engine) if election == "db" else None
    try:
        if lock is not None:
            lock.acquire()
    except AlreadyRunning as error:
        if svc is not None:
            svc.close()
        raise Failure(str(error), EXIT_PROBLEM) from error
    server = None
    if health if health is not None else backend == "gcp":
        def database_check() -> None:
            with probe_engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))

        def clusters() -> list[dict[str, Any]]:
            with probe_engine.connect() as conn:
                return metrics.cluster_overview(list_clusters(conn))

        server = HealthServer(host=observability.health_host, port=observability.health_port,
                              max_tick_age=observability.max_tick_age_seconds,
                              database_check=database_check, metrics=metrics.exposition,
                              clusters=clusters)
        server.start()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    informers = (_in_process_informers(settings, gcp_ports, probe_engine, stop, metrics)
                 if in_process_informers and gcp_ports is not None else [])
    topic = ops_topic or (TASK_EVENTS_TOPIC if backend == "gcp" else None)
    click.echo(f"falcon-es: controller running ({backend} backend, "
               f"{'virtual' if backend == 'sim' and not realtime else 'wall'} clock, "
               f"leader election: {election}"
               f"{f' as {elector.identity}' if elector is not None else ''})", err=True)
    try:
        if elector is not None:
            report = service.serve_elected(build, elector, until_idle=until_idle, stop=stop,
                                           metrics=metrics, health=server, ops_topic=topic)
        else:
            if svc is None:  # built above whenever there is no elector
                raise RuntimeError("no controller was built to serve")
            report = service.serve(svc, until_idle=until_idle, stop=stop, metrics=metrics,
                                   health=server, ops_topic=topic)
    finally:
        stop.set()  # in-process informers end with the loop
        for informer in informers:
            informer.join(timeout=30)
        if lock is not None:
            lock.release()
        if server is not None:
            server.stop()
        if svc is not None:
            svc.close()
        else:
            probe_engine.dispose()
    click.echo(f"falcon-es: stopped ({report.stopped_by}) after {report.ticks} ticks, "
               f"{report.appended} events", err=True)


def _default_leader_election(backend: str) -> str:
    """A lease where several replicas can run (in a Kubernetes cluster, real backends);
    elsewhere the database lock, which refuses a second controller started by mistake."""
    import os

    return "lease" if backend == "gcp" and os.environ.get("KUBERNETES_SERVICE_HOST") else "db"


def _lease_elector() -> Any:
    from falcon_es.adapters.gcp.lease import (
        LeaseConfigError,
        LeaseElector,
        LeaseSettings,
        LeaseUnavailable,
        in_cluster_api,
    )

    try:
        lease = LeaseSettings.from_env()
        return LeaseElector.from_settings(in_cluster_api(), lease)
    except (LeaseConfigError, LeaseUnavailable) as error:
        raise Failure(str(error)) from error


def _gcp_ports(settings: Settings) -> Any:
    from falcon_es.adapters.gcp import build_gcp_ports

    return build_gcp_ports(settings)


def _in_process_informers(settings: Settings, ports: Any, engine: sa.engine.Engine,
                          stop: Any, metrics: Any) -> list[Any]:
    """An informer thread per active registered cluster, sharing the controller's
    Kubernetes clients and Pub/Sub bus (clusters registered later need a restart)."""
    from falcon_es.adapters.gcp.wiring import start_informers

    with engine.connect() as conn:
        active = [c for c in registry.list_clusters(conn) if c.status == "active"]
    return start_informers(active, ports.edges, ports.bus, settings, stop, metrics=metrics)


@main.command("demo")
@click.option("--db-file", type=click.Path(dir_okay=False), default="falcon-demo.db",
              show_default=True, help="SQLite file to (re)create for the demo.")
@click.option("--seed", type=int, default=None, help="Seed of the simulated world.")
@click.option("--live/--no-live", default=None,
              help="Redraw the table in place (default: when stdout is a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print only the summary, as JSON.")
@click.pass_context
@_friendly
def demo_command(ctx: click.Context, db_file: str, seed: int | None, live: bool | None,
                 as_json: bool) -> None:
    """Three simulated clusters, a dozen tasks, every kind of outcome, in seconds."""
    from falcon_es import demo

    live = sys.stdout.isatty() if live is None else live
    echo = (lambda _line: None) if as_json else click.echo
    summary = demo.run_demo(Path(db_file).resolve(), seed=seed,
                            lang=ctx.obj["settings"].language, echo=echo, live=live and not as_json)
    if as_json:
        click.echo(demo.summary_json(summary))


@main.command("simulate")
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="JSON description of the simulated world (default: the packaged one).")
@click.option("--tasks", type=int, default=200, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_friendly
def simulate_command(config: str | None, tasks: int, seed: int, as_json: bool) -> None:
    """What-if at scale in virtual time: throughput, waits, pool reuse, pool hours."""
    from falcon_es import simulate

    if tasks <= 0:
        raise Failure(f"--tasks {tasks}: expected a positive number of tasks")
    report = simulate.run_simulation(config=config, tasks=tasks, seed=seed)
    click.echo(json.dumps(report, indent=2) if as_json else simulate.format_report(report))


@main.group("bench")
def bench_group() -> None:
    """Benchmarks, reported as ratios against a baseline measured in the same run."""


@bench_group.command("store")
@click.option("--db", "db_url", default=None,
              help="Database kind to measure: a scratch database on this MySQL/MariaDB "
                   "server, or a scratch SQLite file beside this one (default: a temporary "
                   "SQLite file). The database itself is not touched.")
@click.option("--events", "count", type=click.IntRange(min=1), default=20_000, show_default=True)
@click.option("--tick", type=click.IntRange(min=1), default=100, show_default=True,
              help="Events per tick transaction.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def bench_store(ctx: click.Context, db_url: str | None, count: int, tick: int,
                as_json: bool) -> None:
    """Append with inline projection vs raw INSERTs; replay vs raw scan."""
    from falcon_es.bench import store as bench

    settings: Settings = ctx.obj["settings"]
    if db_url:
        db.make_engine(db_url).dispose()  # a bad URL is reported before any work starts
        settings = dataclasses.replace(settings, db_url=db_url)
    report = bench.store_benchmark(settings, events=count, tick=tick)
    click.echo(json.dumps(report, indent=2) if as_json else bench.format_report(report))


@bench_group.command("scheduler")
@click.option("--sizes", default="1000,10000,100000", show_default=True,
              help="Waiting tasks per run, comma-separated.")
@click.option("--server", default=None,
              help="A MySQL/MariaDB server URL (mysql+pymysql://user@host:3306) to run in "
                   "scratch databases there; default: temporary SQLite files.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def bench_scheduler(sizes: str, server: str | None, as_json: bool) -> None:
    """Pick decision cost, a tick filling every slot, position refresh vs raw UPDATE."""
    from falcon_es.bench import scheduler as bench
    from falcon_es.handlers import intake, scheduling

    try:
        counts = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise Failure(f"--sizes {sizes!r}: expected whole numbers separated by commas") from None
    if not counts or min(counts) < 2:
        raise Failure(f"--sizes {sizes!r}: expected at least one size of 2 or more")
    handlers = (intake.accept_new_rows, scheduling.requeue_from_inactive_clusters,
                scheduling.choose_clusters, scheduling.fill_free_slots)
    report = bench.scheduler_benchmark(handlers, sizes=counts, server=server,
                                       progress=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(report, indent=2) if as_json else bench.format_report(report))


@bench_group.command("e2e")
@click.option("--tasks", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--db", "db_urls", multiple=True, metavar="URL",
              help="Where to run: 'sqlite' (a fresh temporary file, the default), a new "
                   "SQLite file URL, or a MySQL/MariaDB server URL (a scratch database "
                   "there, dropped afterwards). Repeat to run on several.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--burst", type=click.IntRange(min=1), default=None,
              help="Tasks the upper layer submits at once (default: the bench's bursts; "
                   "--burst N >= --tasks submits everything up front).")
@click.option("--burst-every", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Virtual seconds between bursts.")
@click.option("--resolution", type=click.FloatRange(min=0), default=None,
              help="The loop's virtual-time step in seconds (0: exact jumps).")
@click.option("--world", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A sim config to run in instead of the bench world.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def bench_e2e(tasks: int, db_urls: tuple[str, ...], seed: int, burst: int | None,
              burst_every: float | None, resolution: float | None, world: str | None,
              as_json: bool) -> None:
    """Tasks through their whole lifecycle on the sim backend: wall time, tasks/s,
    database round trips per task, peak memory, ticks, final Status/Reason."""
    from falcon_es.bench import e2e

    options: dict[str, Any] = {"burst": burst, "burst_every": burst_every,
                               "resolution": resolution}
    options = {k: v for k, v in options.items() if v is not None}
    reports = []
    for url in db_urls or ("sqlite",):
        target = None if url == "sqlite" else url
        if target is not None:
            db.make_engine(target).dispose()  # a bad URL is reported before any work starts
        try:
            reports.append(e2e.e2e_benchmark(
                tasks=tasks, db_url=target, seed=seed, world=world,
                progress=lambda m: click.echo(m, err=True), **options))
        except e2e.BenchInputError as error:
            raise Failure(str(error)) from error
        except e2e.BenchError as error:
            raise Failure(str(error), EXIT_PROBLEM) from error
        if not as_json:
            click.echo(e2e.format_report(reports[-1]))
    if as_json:
        click.echo(e2e.report_json(reports))


# ----------------------------------------------------------------------- gcp backend

#: Seconds between the informer process's liveness marks (well inside the probe's limit).
INFORMER_HEARTBEAT_SECONDS = 5.0


@main.command("informer")
@click.option("--cluster", "names", multiple=True, required=True, metavar="NAME",
              help="A registered cluster to watch; repeat for several (one thread each).")
@click.option("--health/--no-health", default=True, show_default=True,
              help="Serve /healthz and /readyz on FALCON_HEALTH_HOST:FALCON_HEALTH_PORT.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              envvar="FALCON_LOG_FORMAT", help="Log lines as text or one JSON object each.")
@click.pass_context
@_friendly
def informer_command(ctx: click.Context, names: tuple[str, ...], health: bool,
                     log_format: str | None) -> None:
    """Watch Falcon's Jobs and Pods on edge clusters and publish every change to the
    edge-events topic: an informer as a process of its own (stops on SIGINT/SIGTERM)."""
    import signal
    import threading

    from falcon_es.adapters.gcp import wiring
    from falcon_es.observability import ObservabilitySettings
    from falcon_es.observability.health import HealthServer
    from falcon_es.observability.logs import configure_logging
    from falcon_es.observability.metrics import Metrics
    from falcon_es.ports import PortError

    settings: Settings = ctx.obj["settings"]
    observability = ObservabilitySettings.from_env()
    configure_logging(log_format or observability.log_format, observability.log_level)
    with _app(ctx).engine.connect() as conn:
        found = {name: registry.find_cluster(conn, name) for name in dict.fromkeys(names)}
    unknown = [name for name, cluster in found.items() if cluster is None]
    if unknown:
        raise Failure(f"informer: no registered cluster named {', '.join(unknown)} "
                      "(see falcon-es cluster list)")
    backend = wiring.build_gcp_backend(settings)
    clusters = [cluster for cluster in found.values() if cluster is not None]
    try:
        for cluster in clusters:  # endpoint and CA now: a wrong cluster fails at start
            backend.edges.for_cluster(cluster)
    except PortError as error:
        backend.close()
        raise Failure(f"informer: {error.message}", EXIT_PROBLEM) from error
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = None
    metrics = Metrics()
    if health:
        server = HealthServer(host=observability.health_host, port=observability.health_port,
                              max_tick_age=observability.max_tick_age_seconds,
                              metrics=metrics.exposition)
        server.start()
    threads = wiring.start_informers(clusters, backend.edges, backend.bus, settings, stop,
                                     metrics=metrics)
    if server is not None:
        server.set_ready(True, f"watching {', '.join(found)}")
    click.echo(f"falcon-es: informer watching {', '.join(found)} (namespace "
               f"{settings.job_namespace}) -> topic {settings.edge_events_topic}", err=True)
    heartbeat = min(INFORMER_HEARTBEAT_SECONDS, observability.max_tick_age_seconds / 3)
    ended = []
    try:
        while not stop.is_set():
            ended = [thread.name for thread in threads if not thread.is_alive()]
            if ended:
                break
            if server is not None:
                server.mark_tick()
            stop.wait(heartbeat)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if server is not None:
            server.stop()
        backend.close()
    if ended:
        raise Failure(f"informer: {', '.join(ended)} ended unexpectedly (see the log)",
                      EXIT_PROBLEM)
    click.echo("falcon-es: informer stopped", err=True)


@main.command("doctor")
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


def _database_check(settings: Settings) -> tuple[Any, list[registry.Cluster]]:
    """The database line of ``doctor`` and, when it is usable, the registered clusters."""
    from alembic.script import ScriptDirectory

    from falcon_es.adapters.gcp.doctor import FAIL, OK, Check

    try:
        shown = sa.engine.make_url(settings.db_url).render_as_string(hide_password=True)
        engine = db.make_engine(settings.db_url)
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
        return Check("database", shown, FAIL, _first_line(error),
                     "check FALCON_DB_URL and that the server accepts connections from "
                     "here"), []
    finally:
        engine.dispose()
    return Check("database", shown, OK, f"reachable, schema at revision {revision}, "
                                        f"{len(clusters)} cluster(s) registered"), clusters


@main.command("clusters")
@click.option("--live", is_flag=True,
              help="Also ask GKE for each cluster's node pools and Compute for the "
                   "reservation's remaining slices (gcp backend credentials).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_friendly
def clusters_command(ctx: click.Context, live: bool, as_json: bool) -> None:
    """Per cluster: reservation remaining, active pools with topology, queue depths and
    running counts, folded from the log (--live adds what GKE and Compute say now)."""
    from falcon_es.observability.metrics import Metrics
    from falcon_es.projections import replay as rp
    from falcon_es.projections.node_pools import DELETED, pool_samples

    app = _app(ctx)
    states = rp.fold_log(app.store)
    with app.engine.connect() as conn:
        clusters = registry.list_clusters(conn)
    pools = pool_samples(states, {c.id: c for c in clusters})
    metrics = Metrics(tasks=states.all, pools=lambda: pools, process_collectors=False)
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
    _emit(rows, False)


def _live_cluster_views(settings: Settings, clusters: Sequence[registry.Cluster],
                        pools: Sequence[Any], tasks: Sequence[Any],
                        metrics: Any) -> dict[str, dict[str, Any]]:
    """GKE's node pools and Compute's remaining slices per cluster, read now (failures
    are reported per cluster, not fatal)."""
    from falcon_es.adapters.gcp import build_gcp_backend
    from falcon_es.observability.metrics import queue_figures
    from falcon_es.ports import PortError
    from falcon_es.tpu import slice_shape

    backend = build_gcp_backend(settings)
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
                        slices = backend.reservations.remaining_slices(
                            cluster, cluster.default_reservation,
                            slice_shape(cluster.tpu_type, topology))
                    except PortError as error:
                        errors.append(f"reservation {topology}: {error.message}")
                        continue
                    metrics.set_reservation_remaining(cluster.name, cluster.default_reservation,
                                                      topology, slices)
            views[cluster.name] = {"live_pools": live_pools, "errors": errors}
    finally:
        backend.close()
    return views


def run() -> None:
    main(prog_name="falcon-es")


if __name__ == "__main__":
    run()
