"""``falcon-es task``: act as the upper layer does on its job table (submit a Pending
row, list and show rows, request an abort), to try Falcon-ES without that layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from falcon_es import job_rows
from falcon_es.cli.common import Failure, app_of, cell, emit, friendly, jsonable

TASK_COLUMNS = ("id", "name", "actor", "status", "reason", "message", "created_at")


@click.group("task")
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
@friendly
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
    app = app_of(ctx)
    for option, value in (("actor", actor), ("name", name)):
        column_type = app.job.c[option].type
        if not isinstance(column_type, sa.String) or column_type.length is None:
            raise TypeError(f"job.{option} is not a string column of a fixed length")
        limit = column_type.length
        if len(value) > limit:
            raise Failure(f"task submit: --{option} is longer than {limit} characters")
    task_id = job_rows.submit(app.engine, name=name, actor=actor, spec=spec,
                              now=app.clock.now(), job=app.job)
    click.echo(json.dumps({"id": task_id}) if as_json else task_id)


@task_group.command("list")
@click.option("--status", default=None, help="Only tasks in this status.")
@click.option("--limit", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def task_list(ctx: click.Context, status: str | None, limit: int | None, as_json: bool) -> None:
    """List tasks with their Status / Reason / Message."""
    app = app_of(ctx)
    rows = job_rows.list_rows(app.engine, status=status, limit=limit, job=app.job)
    emit(rows, as_json, None if as_json else TASK_COLUMNS)


@task_group.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def task_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one task's row."""
    app = app_of(ctx)
    row = job_rows.get_row(app.engine, task_id, job=app.job)
    if as_json:
        click.echo(json.dumps(jsonable(row), indent=2, ensure_ascii=False))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            click.echo(f"{key.ljust(width)}  {cell(value)}")


@task_group.command("abort")
@click.argument("task_id")
@click.pass_context
@friendly
def task_abort(ctx: click.Context, task_id: str) -> None:
    """Request an abort (sets Aborting and aborting_at, as the upper layer does)."""
    app = app_of(ctx)
    before = job_rows.request_abort(app.engine, task_id, app.clock.now(), job=app.job)
    click.echo(f"{task_id}: Aborting (was {before})")
