"""``falcon-es db``: create the schema, or check the upper layer's existing job table."""

from __future__ import annotations

import sys

import click

from falcon_es import db
from falcon_es.cli.common import EXIT_PROBLEM, app_of, friendly


@click.group("db")
def db_group() -> None:
    """Create or check the database schema."""


@db_group.command("upgrade")
@click.pass_context
@friendly
def db_upgrade(ctx: click.Context) -> None:
    """Apply the migrations (creates task_events, clusters, job, ...)."""
    app = app_of(ctx)
    db.upgrade(app.engine)
    click.echo(f"database at revision {db.current_revision(app.engine)}")


@db_group.command("check")
@click.option("--table", default="job", show_default=True, help="Name of the upper layer's job table.")
@click.pass_context
@friendly
def db_check(ctx: click.Context, table: str) -> None:
    """Check that an existing job table has every column Falcon-ES reads and writes."""
    problems = db.check_job_table(app_of(ctx).engine, table)
    if not problems:
        click.echo(f"{table}: all {len(db.JOB_COLUMN_KINDS)} columns present with usable types")
        return
    for problem in problems:
        click.echo(str(problem).replace("job.", f"{table}.", 1), err=True)
    sys.exit(EXIT_PROBLEM)
