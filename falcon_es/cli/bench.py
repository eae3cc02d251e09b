"""``falcon-es bench``: the benchmarks of the store, the scheduler, the whole
lifecycle, a restart and the command line's start, each reported against a baseline
measured in the same run so the figures compare across machines."""

from __future__ import annotations

import json
from typing import Any

import click

from falcon_es.storage import db
from falcon_es.cli.common import EXIT_DATABASE, EXIT_PROBLEM, Failure, friendly
from falcon_es.config.db_urls import DEFAULT_URL
from falcon_es.config.settings import Settings


@click.group("bench")
def bench_group() -> None:
    """Benchmarks, reported as ratios against a baseline measured in the same run."""


def _measured_on(ctx: click.Context, db_url: str | None) -> Settings:
    """The settings with the database kind ``--db`` names (checked before any work
    starts, so a bad URL is reported at once); ``sqlite`` names temporary SQLite files,
    as it does for ``bench e2e``."""
    settings: Settings = ctx.obj["settings"]
    if not db_url:
        return settings
    if db_url == "sqlite":
        return settings.overridden(database={"db_url": DEFAULT_URL})
    db.make_engine(db_url).dispose()
    return settings.overridden(database={"db_url": db_url})


@bench_group.command("store")
@click.option("--db", "db_url", default=None,
              help="Database kind to measure: a scratch database on this MySQL/MariaDB "
                   "server, or a scratch SQLite file beside this one ('sqlite', the "
                   "default: a temporary SQLite file). The database itself is not touched.")
@click.option("--events", "count", type=click.IntRange(min=1), default=20_000, show_default=True)
@click.option("--tick", type=click.IntRange(min=1), default=100, show_default=True,
              help="Events per tick transaction.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def bench_store(ctx: click.Context, db_url: str | None, count: int, tick: int,
                as_json: bool) -> None:
    """Append with inline projection vs raw INSERTs; replay vs raw scan."""
    from falcon_es.bench import store as bench

    report = bench.store_benchmark(_measured_on(ctx, db_url), events=count, tick=tick)
    click.echo(json.dumps(report, indent=2) if as_json else bench.format_report(report))


@bench_group.command("scheduler")
@click.option("--sizes", default="1000,10000,100000", show_default=True,
              help="Waiting tasks per run, comma-separated.")
@click.option("--server", default=None,
              help="A MySQL/MariaDB server URL (mysql+pymysql://user@host:3306) to run in "
                   "scratch databases there; default: temporary SQLite files.")
@click.option("--json", "as_json", is_flag=True)
@friendly
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


@bench_group.command("restart")
@click.option("--db", "db_url", default=None,
              help="Database kind to measure: scratch databases on this MySQL/MariaDB "
                   "server, or scratch SQLite files beside this one ('sqlite', the "
                   "default: temporary SQLite files). The database itself is not touched.")
@click.option("--history", type=click.IntRange(min=0), default=1_000_000, show_default=True,
              help="Finished tasks in the log before the live ones.")
@click.option("--live", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Live tasks (waiting, acquiring, running) in both cases.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Measurements per case (each in a process of its own; the best counts).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def bench_restart(ctx: click.Context, db_url: str | None, history: int, live: int,
                  rounds: int, as_json: bool) -> None:
    """Start-up time and peak memory with a long history in the log vs none."""
    from falcon_es.bench import restart as bench

    report = bench.restart_benchmark(_measured_on(ctx, db_url), history=history, live=live,
                                     rounds=rounds, progress=lambda m: click.echo(m, err=True))
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
              help="A sim config to run in instead of the bench world (the run "
                   "registers its clusters).")
@click.option("--eta", is_flag=True,
              help="Also measure the Waiting message's expected starts against the "
                   "moments the tasks were picked (every estimate is held until the "
                   "run ends: the memory figures grow with it).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def bench_e2e(ctx: click.Context, tasks: int, db_urls: tuple[str, ...], seed: int,
              burst: int | None, burst_every: float | None, resolution: float | None,
              world: str | None, eta: bool, as_json: bool) -> None:
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
                progress=lambda m: click.echo(m, err=True),
                job_mapping=ctx.obj["settings"].job_mapping, eta=eta, **options))
        except e2e.BenchInputError as error:
            raise Failure(str(error)) from error
        except e2e.BenchError as error:
            raise Failure(str(error), EXIT_PROBLEM) from error
        if not as_json:
            click.echo(e2e.format_report(reports[-1]))
    if as_json:
        click.echo(e2e.report_json(reports))


@bench_group.command("cli")
@click.option("--runs", type=click.IntRange(min=1), default=9, show_default=True,
              help="Rounds of the commands, each in a fresh interpreter.")
@click.option("--tasks", type=click.IntRange(min=0), default=100, show_default=True,
              help="Rows in the job table that task list prints.")
@click.option("--sweep", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Tasks of the batch submit.")
@click.option("--server", default=None,
              help="A MySQL/MariaDB server URL (mysql+pymysql://user@host:3306) to run in a "
                   "scratch database there; default: a temporary SQLite file.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def bench_cli(runs: int, tasks: int, sweep: int, server: str | None, as_json: bool) -> None:
    """How fast task list and task submit answer, against python -c pass."""
    from falcon_es.bench import cli as bench
    from falcon_es.bench.scratch import ScratchDatabaseError

    if server:
        db.make_engine(server).dispose()  # a bad URL is reported before any work starts
    try:
        report = bench.cli_benchmark(runs=runs, tasks=tasks, sweep=sweep, server=server)
    except ScratchDatabaseError as error:
        raise Failure(str(error), EXIT_DATABASE) from error
    except bench.BenchCommandError as error:
        raise Failure(str(error), EXIT_PROBLEM) from error
    click.echo(json.dumps(report, indent=2) if as_json else bench.format_report(report))


@bench_group.command("isolation")
@click.option("--tasks", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tasks submitted to each of the two clusters.")
@click.option("--deadline", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds each call may take (the calls' connect and read timeouts).")
@click.option("--limit", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Wall seconds a run may take before it is reported unfinished.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def bench_isolation(tasks: int, deadline: float, limit: float, as_json: bool) -> None:
    """One edge cluster's Kubernetes API hung: the healthy cluster's time to Running and
    the tick p99, against the same run with every API answering (the gcp backend over
    the test suite's fake servers: run it from a source checkout)."""
    from falcon_es.bench import isolation as bench

    report = bench.isolation_benchmark(_fake_cloud(), tasks=tasks, deadline_seconds=deadline,
                                       limit_seconds=limit)
    click.echo(json.dumps(report, indent=2) if as_json else bench.format_report(report))
    if not bench.on_target(report):
        raise Failure("the isolation targets were missed (time to Running ratio <= 1.5, "
                      "tick p99 <= 1 s)", EXIT_PROBLEM)


def _fake_cloud() -> Any:
    """The fake GKE, Compute and Kubernetes servers of the test suite (tests/fakes),
    found beside the package in a source checkout."""
    import importlib
    import sys
    from pathlib import Path

    import falcon_es

    root = Path(falcon_es.__file__).resolve().parent.parent
    if not (root / "tests" / "fakes" / "sim_backed.py").exists():
        raise Failure("bench isolation runs over the test suite's fake servers "
                      "(tests/fakes): run it from a source checkout of Falcon-ES")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    fakes = importlib.import_module("tests.fakes.sim_backed")  # not the package's: untyped
    return lambda world: fakes.SimBackedCloud(world).start()
