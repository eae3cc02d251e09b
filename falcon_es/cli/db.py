"""``falcon-es db``: migrate Falcon-ES's own tables, or check the upper layer's job table.

``db upgrade`` never creates, alters or drops the job table (the upper layer's); with
``--create-job-table`` it creates one from Falcon-ES's definition when there is none.
Without the flag and without a job table it says so, prints the DDL to create one and
exits 1: a controller could not run on that database yet.
"""

from __future__ import annotations

import sys

import click

from falcon_es.storage import db
from falcon_es.cli.common import EXIT_DATABASE, EXIT_PROBLEM, Failure, app_of, friendly
from falcon_es.config.job_mapping import JobMappingError
from falcon_es.storage.tables import JobTable


@click.group("db")
def db_group() -> None:
    """Migrate Falcon-ES's tables; check the upper layer's job table."""


@db_group.command("upgrade")
@click.option("--create-job-table", is_flag=True,
              help="Also create the job table (Falcon-ES's definition, under the "
                   "FALCON_JOB_TABLE / FALCON_JOB_COLUMNS names) if there is none: for "
                   "the demo, tests, benchmarks or a first evaluation.")
@click.pass_context
@friendly
def db_upgrade(ctx: click.Context, create_job_table: bool) -> None:
    """Apply the migrations of Falcon-ES's own tables (task_events, clusters, ...);
    the job table is the upper layer's and is never altered."""
    app = app_of(ctx)
    try:
        db.upgrade(app.engine)
    except db.MigrationConflict as error:
        raise Failure(f"db upgrade stopped: {error}", EXIT_DATABASE) from error
    click.echo(f"database at revision {db.current_revision(app.engine)}")
    table = app.job.mapping.qualified
    if db.has_job_table(app.engine, app.job):
        click.echo(f"job table {table}: present, left as it is "
                   "(falcon-es db check checks its columns and indexes)")
        return
    if create_job_table:
        db.create_job_table(app.engine, app.job)
        click.echo(f"job table {table}: created")
        return
    click.echo(
        f"falcon-es: no job table {table!r}: Falcon-ES's own tables are migrated, but it "
        "never creates the upper layer's table unasked; create it with the statements "
        "below (the upper layer may add columns of its own), set FALCON_JOB_TABLE and "
        "FALCON_JOB_COLUMNS to the table it has, or run: falcon-es db upgrade "
        "--create-job-table", err=True)
    click.echo(db.job_table_ddl(app.job, app.engine.dialect))
    sys.exit(EXIT_PROBLEM)


@db_group.command("check")
@click.option("--table", default=None,
              help="The upper layer's job table (default: FALCON_JOB_TABLE, else job; "
                   "database.table for one in another database).")
@click.pass_context
@friendly
def db_check(ctx: click.Context, table: str | None) -> None:
    """Check that the job table has every column Falcon-ES reads and writes (under
    the FALCON_JOB_COLUMNS names), and list the indexes its queries want there."""
    app = app_of(ctx)
    job = app.job
    if table is not None:
        try:
            job = JobTable(job.mapping.with_table(table, "--table "))
        except JobMappingError as error:
            raise Failure(str(error)) from error
    name = job.mapping.qualified
    problems = db.check_job_table(app.engine, job)
    if not db.has_job_table(app.engine, job):
        for problem in problems:
            click.echo(str(problem), err=True)
        click.echo("to create it (falcon-es db upgrade --create-job-table does):", err=True)
        click.echo(db.job_table_ddl(job, app.engine.dialect))
        sys.exit(EXIT_PROBLEM)
    if not problems:
        click.echo(f"{name}: all {len(job.column_kinds)} columns present with usable types")
    for problem in problems:
        click.echo(str(problem), err=True)
    for note in db.width_notes(app.engine, job):
        click.echo(f"note: {note}")
    _print_index_advice(db.index_advice(app.engine, job), name)
    if problems:
        sys.exit(EXIT_PROBLEM)


def _print_index_advice(advice: list[db.IndexAdvice], table: str) -> None:
    """One line per wanted index (present: what serves it; missing: the statement to
    add it), as recommendations: Falcon-ES never adds an index to the table."""
    missing = sum(1 for a in advice if a.served_by is None)
    click.echo(f"indexes Falcon-ES's queries want on {table} "
               f"({'all present' if not missing else f'{missing} missing'}; "
               "recommendations, never added by Falcon-ES):")
    for item in advice:
        columns = ", ".join(item.columns)
        if item.served_by is not None:
            click.echo(f"  present  ({columns}) as {item.served_by}: {item.wanted.serves}")
        else:
            click.echo(f"  missing  ({columns}): {item.wanted.serves}")
            click.echo(f"           {item.ddl}")
