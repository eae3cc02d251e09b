"""``falcon-es task``: act as the upper layer does on its job table (submit a Pending
row, list and show rows, request an abort or a priority change), to try Falcon-ES
without that layer. Requests go through the job table, as the upper layer's do: the
controller is the log's single writer and its inbox picks them up."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from falcon_es.cli.common import (
    EXIT_DATABASE, Failure, cell, database_problem, emit, engine_of, friendly, job_of,
    jsonable, settings_of,
)
from falcon_es.domain.clock import utcnow
from falcon_es.config.db_urls import driver_target

if TYPE_CHECKING:
    from falcon_es.jobtable import job_rows
    from falcon_es.domain.spec import SpecLimits
    from falcon_es.storage.tables import JobTable

TASK_COLUMNS = ("id", "name", "actor", "status", "reason", "message", "created_at")


@click.group("task")
def task_group() -> None:
    """Act as the upper layer: submit, list, show and abort tasks, change a waiting
    task's priority."""


#: What a task takes besides its spec, in a spec file and as options.
IDENTITY = ("name", "actor")
#: The spec fields a task cannot do without (the options that give them are named alike).
REQUIRED_SPEC = ("tpu_type", "topology", "image")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One task as a spec file holds it: where it is (for the messages), its object, and
    whether it comes from a file at all (``task submit`` with options only)."""
    where: str
    data: Any
    in_file: bool = True


def read_spec_file(path: str) -> list[Entry]:
    """The tasks of a spec file (``-``: standard input): one JSON object, a JSON list of
    objects, or JSON lines (one object a line, blank lines skipped). An entry is named by
    its line (JSON lines) or its index in the list, so a message can point at it."""
    label = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise Failure(f"spec file {label}: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise Failure(f"spec file {label}: not UTF-8 text ({error.reason})") from error
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if not _looks_like_json_lines(text):
            raise Failure(f"spec file {label}: not valid JSON at line {error.lineno} "
                          f"column {error.colno}: {error.msg}") from error
        return _json_lines(label, text)
    except (ValueError, RecursionError) as error:  # JSON, but not what Python can hold
        raise Failure(f"spec file {label}: cannot be read ({_first_line(error)})") from error
    if isinstance(document, dict):
        return [Entry(f"spec file {label}", document)]
    if isinstance(document, list):
        return [Entry(f"spec file {label}: index {i}", item) for i, item in enumerate(document)]
    raise Failure(f"spec file {label}: expected a JSON object, a JSON list of objects or JSON "
                  f"lines, found {_kind(document)}")


def _first_line(error: BaseException) -> str:
    """An error's text, short enough for one line of a message."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _looks_like_json_lines(text: str) -> bool:
    """Whether a text that is not one JSON document starts with a line that is: then it
    is read line by line, and a broken line is reported by its own number."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        json.loads(first)
    except (ValueError, RecursionError):
        return False
    return True


def _json_lines(label: str, text: str) -> list[Entry]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append(Entry(f"spec file {label}: line {number}", json.loads(line)))
        except json.JSONDecodeError as error:
            raise Failure(f"spec file {label}: line {number}: not valid JSON at column "
                          f"{error.colno}: {error.msg}") from error
        except (ValueError, RecursionError) as error:
            raise Failure(f"spec file {label}: line {number}: cannot be read "
                          f"({_first_line(error)})") from error
    return entries


def _kind(value: object) -> str:
    """A JSON value's kind as JSON names it."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def new_task(entry: Entry, options: Mapping[str, Any], limits: SpecLimits,
             job: JobTable) -> job_rows.NewTask:
    """The task an entry describes, with the options given on the command line applied
    over it, checked as the controller will check it (so a sweep with one bad entry is
    refused before any of it is written). Raises ``Failure`` naming the entry."""
    if not isinstance(entry.data, dict):
        raise Failure(f"{entry.where}: expected a JSON object, found {_kind(entry.data)}")
    data = {**entry.data, **{k: v for k, v in options.items() if v is not None}}
    missing = [k for k in (*IDENTITY, *REQUIRED_SPEC) if k not in data]
    if missing:
        flags = ", ".join(f"--{m.replace('_', '-')}" for m in missing)
        raise Failure(f"{entry.where}: missing {', '.join(missing)} (fields of the entry, or "
                      f"the options {flags})" if entry.in_file else
                      f"{entry.where}: missing {flags} (or put them in --spec-file)")
    for field in IDENTITY:
        value = data[field]
        source = f"--{field}" if options.get(field) is not None else field
        if not isinstance(value, str):
            raise Failure(f"{entry.where}: {source} must be a string, found {_kind(value)}")
        limit = _column_length(job, field)
        if not value or len(value) > limit:
            raise Failure(f"{entry.where}: {source} is empty" if not value else
                          f"{entry.where}: {source} is longer than {limit} characters")
    spec = {k: v for k, v in data.items() if k not in IDENTITY}
    from falcon_es.jobtable import job_rows
    from falcon_es.domain.spec import SpecError, parse_spec

    try:
        parse_spec(spec, limits)
    except SpecError as error:
        raise Failure(f"{entry.where}: {error} ({error.reason})") from error
    return job_rows.NewTask(name=data["name"], actor=data["actor"], spec=spec)


def _column_length(job: JobTable, column: str) -> int:
    import sqlalchemy as sa

    column_type = job.c[column].type
    if not isinstance(column_type, sa.String) or column_type.length is None:
        raise TypeError(f"job.{column} is not a string column of a fixed length")
    return column_type.length


@task_group.command("submit")
@click.option("--actor", help="Who submits (FIFO and round-robin key).")
@click.option("--name", help="Display name of the task.")
@click.option("--tpu-type")
@click.option("--topology")
@click.option("--image")
@click.option("--command", "command", multiple=True, help="Repeat for each argv element.")
@click.option("--supply-mode", type=click.Choice(["reservation", "on-demand", "flex-start"]))
@click.option("--timeout", "timeout", type=int, help="Seconds from dispatch to timeout.")
@click.option("--spec-file", type=click.Path(dir_okay=False, allow_dash=True),
              help="One task (a JSON object) or many (a JSON list of objects, or JSON "
                   "lines); '-' reads standard input.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.pass_context
@friendly
def task_submit(ctx: click.Context, actor: str | None, name: str | None, tpu_type: str | None,
                topology: str | None, image: str | None, command: tuple[str, ...],
                supply_mode: str | None, timeout: int | None, spec_file: str | None,
                as_json: bool) -> None:
    """Insert Pending rows, as the upper layer does; prints each task's id, one a line.

    Each task of --spec-file is an object with the task spec's fields and the task's
    name and actor; the options given apply to every task and win over the file. Every
    task is checked first and all are inserted in one transaction, or none."""
    options = {"actor": actor, "name": name, "tpu_type": tpu_type, "topology": topology,
               "image": image, "command": list(command) or None, "supply_mode": supply_mode,
               "timeout_seconds": timeout}
    entries = read_spec_file(spec_file) if spec_file else [Entry("task submit", {}, in_file=False)]
    if not entries:
        raise Failure(f"spec file {spec_file}: no tasks in it; nothing submitted")

    settings = settings_of(ctx)
    limits = settings.spec_limits
    job = job_of(ctx)
    tasks = [new_task(entry, options, limits, job) for entry in entries]
    from falcon_es.jobtable import job_rows

    ids = job_rows.submit_many(engine_of(ctx), tasks, utcnow(), job=job_of(ctx))
    for task_id, task in zip(ids, tasks):
        click.echo(json.dumps({"id": task_id, "name": task.name, "actor": task.actor},
                              ensure_ascii=False) if as_json else task_id)


@task_group.command("list")
@click.option("--status", default=None, help="Only tasks in this status.")
@click.option("--limit", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def task_list(ctx: click.Context, status: str | None, limit: int | None, as_json: bool) -> None:
    """List tasks with their Status / Reason / Message."""
    target = driver_target(settings_of(ctx).database.db_url)
    if target is None:
        from falcon_es.jobtable import job_rows

        rows = job_rows.list_rows(engine_of(ctx), status=status, limit=limit, job=job_of(ctx))
    else:
        from falcon_es.jobtable import job_reads

        with _driver_errors():
            rows = job_reads.list_rows(target, settings_of(ctx).job_mapping, status=status,
                                       limit=limit)
    emit(rows, as_json, None if as_json else TASK_COLUMNS)


@task_group.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def task_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one task's row, and what the log recorded of it (a spec changed after
    acceptance: the accepted spec runs; a row deleted or reused while the task ran)."""
    from falcon_es.jobtable import job_reads

    target = driver_target(settings_of(ctx).database.db_url)
    if target is None:
        import sqlalchemy as sa

        from falcon_es.domain.events import ROW_CHECKS_STREAM
        from falcon_es.jobtable import job_rows
        from falcon_es.storage.tables import task_events

        row = job_rows.get_row(engine_of(ctx), task_id, job=job_of(ctx))
        with engine_of(ctx).connect() as conn:
            stored = conn.execute(sa.select(task_events.c.data).where(
                task_events.c.stream_id == ROW_CHECKS_STREAM).order_by(task_events.c.seq))
            notes = job_reads.notes_of(task_id, stored.scalars())
    else:
        with _driver_errors():
            try:
                row = job_reads.get_row(target, settings_of(ctx).job_mapping, task_id)
            except job_reads.TaskMissing as error:
                raise Failure(str(error)) from error
            notes = job_reads.row_notes(target, task_id)
    if notes:
        row = {**row, "notes": notes}
    if as_json:
        click.echo(json.dumps(jsonable(row), indent=2, ensure_ascii=False))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            click.echo(f"{key.ljust(width)}  {cell(value)}")


@contextlib.contextmanager
def _driver_errors() -> Iterator[None]:
    """A read the database refused, as one line (what ``friendly`` makes of the same
    error through SQLAlchemy)."""
    from falcon_es.jobtable.job_reads import JobReadError

    try:
        yield
    except JobReadError as error:
        raise Failure(database_problem(error.text), EXIT_DATABASE) from error


@task_group.command("abort")
@click.argument("task_id")
@click.pass_context
@friendly
def task_abort(ctx: click.Context, task_id: str) -> None:
    """Request an abort (sets Aborting and aborting_at, as the upper layer does)."""
    from falcon_es.jobtable import job_rows

    before = job_rows.request_abort(engine_of(ctx), task_id, utcnow(), job=job_of(ctx))
    click.echo(f"{task_id}: Aborting (was {before})")


@task_group.command("set-priority")
@click.argument("task_id")
@click.argument("priority")
@click.option("--requester", default=None,
              help="Who asks (recorded in the PriorityChanged event; default: the OS user).")
@click.pass_context
@friendly
def task_set_priority(ctx: click.Context, task_id: str, priority: str,
                      requester: str | None) -> None:
    """Change a waiting task's priority: a whole number within the configured range or
    a class name (FALCON_PRIORITY_CLASSES). Written to the job table's priority columns
    as the upper layer does; the controller applies it at its next tick."""
    import getpass

    from falcon_es.jobtable import job_rows
    from falcon_es.domain.priority import PriorityError

    policy = settings_of(ctx).scheduling.priorities
    try:
        value = policy.resolve(int(priority) if priority.lstrip("+-").isdigit() else priority)
    except PriorityError as error:
        raise Failure(f"priority {error}") from error
    who = requester or getpass.getuser()
    job_rows.request_priority(engine_of(ctx), task_id, value, who, utcnow(), job=job_of(ctx))
    click.echo(f"{task_id}: priority {value} requested by {who} (the controller applies it "
               "at its next tick)")
