"""What the upper layer does to the ``job`` table: insert Pending rows, request aborts.

The CLI's ``task`` commands use these so a standalone install behaves like production.
Each takes the ``JobTable`` of the settings' mapping (``app.job``); without one, the
table of Falcon-ES's own names (the demo's, the tests'). Rows read come back keyed by
Falcon-ES's column names whatever the table calls them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.domain import statuses
from falcon_es.jobtable.job_reads import decoded
from falcon_es.storage.tables import JobTable

TERMINAL = tuple(sorted(statuses.TERMINAL_STATUSES))


class JobRowError(LookupError):
    """A job-table request that cannot be carried out (names the task and why)."""


def submit(
    engine: Engine, *, name: str, actor: str, spec: Mapping[str, Any], now: dt.datetime,
    task_id: str | None = None, job: JobTable | None = None,
) -> str:
    task_id = task_id or uuid.uuid4().hex
    job = job or JobTable()
    with engine.begin() as conn:
        conn.execute(job.table.insert().values(
            id=task_id, name=name, actor=actor, spec=dict(spec), status=statuses.PENDING,
            reason=None, message=None, created_at=now, updated_at=now,
        ))
    return task_id


@dataclasses.dataclass(frozen=True)
class NewTask:
    """One task of ``submit_many``: what the upper layer writes into a new row."""
    name: str
    actor: str
    spec: Mapping[str, Any]


def submit_many(engine: Engine, tasks: Sequence[NewTask], now: dt.datetime, *,
                job: JobTable | None = None) -> list[str]:
    """Insert a Pending row for every task in one transaction, all of them or none (a
    sweep is never half submitted), with one multi-row statement; returns their ids in
    the order given.

    The rows share one ``created_at``, and the scheduler breaks that tie by id (FIFO
    is by submission time, then id): the ids are one random 24-hex-digit prefix and the
    position in 8, so they sort, and the tasks are served, in the order given."""
    batch = uuid.uuid4().hex[:24]
    ids = [f"{batch}{position:08x}" for position in range(len(tasks))]
    if not tasks:
        return ids
    job = job or JobTable()
    with engine.begin() as conn:
        conn.execute(job.table.insert(), [
            {"id": task_id, "name": task.name, "actor": task.actor, "spec": dict(task.spec),
             "status": statuses.PENDING, "reason": None, "message": None,
             "created_at": now, "updated_at": now}
            for task_id, task in zip(ids, tasks)])
    return ids


def request_abort(engine: Engine, task_id: str, now: dt.datetime, *,
                  job: JobTable | None = None) -> str:
    """Set Aborting as the upper layer does; returns the status the task had."""
    job = job or JobTable()
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(job.c.status.label("status")).where(job.c.id == task_id)
            .with_for_update()
        ).first()
        if row is None:
            raise JobRowError(f"task {task_id!r} does not exist")
        if row.status in TERMINAL:
            raise JobRowError(f"task {task_id} has already ended ({row.status}); nothing to abort")
        if row.status == statuses.ABORTING:
            return row.status
        conn.execute(job.table.update().where(job.c.id == task_id).values(
            status=statuses.ABORTING, aborting_at=now, updated_at=now,
        ))
    return row.status


def request_priority(engine: Engine, task_id: str, priority: int, requester: str,
                     now: dt.datetime, *, job: JobTable) -> None:
    """Ask for a waiting task's priority to change, as the upper layer does: write the
    priority wanted, when and by whom into the row's priority columns (the controller
    reads them at its next tick). Refused when the table has no such columns or the
    row is not waiting (``priority`` is checked against the range by the caller)."""
    if not job.mapping.priority_requests:
        raise JobRowError(
            f"the job table {job.mapping.qualified} takes no priority requests: add the "
            "columns priority, priority_requested_at and priority_requested_by (falcon-es "
            "db check shows them) and set FALCON_JOB_PRIORITY_REQUESTS=true")
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(job.c.status.label("status"), job.c.reason.label("reason"))
            .where(job.c.id == task_id).with_for_update()
        ).first()
        if row is None:
            raise JobRowError(f"task {task_id!r} does not exist")
        if row.status != statuses.PENDING or row.reason != statuses.PendingReason.WAITING:
            shown = row.status if row.reason is None else f"{row.status}/{row.reason}"
            detail = ("not taken in yet; give the priority in its spec" if row.status ==
                      statuses.PENDING and row.reason is None else
                      "it has ended" if row.status in TERMINAL else "no longer waiting")
            raise JobRowError(f"task {task_id} is {shown} ({detail}); only a waiting task's "
                              "priority can change")
        conn.execute(job.table.update().where(job.c.id == task_id).values(
            priority=priority, priority_requested_at=now, priority_requested_by=requester,
            updated_at=now,
        ))


#: The upper layer's own columns, read as the driver gives them: it may have stored
#: what is not JSON or not a time there, and reading a row must not fail because of it.
_AS_STORED = frozenset({"name", "actor", "spec", "created_at", "aborting_at"})
_TIMES = ("created_at", "aborting_at")


def _rows_query(job: JobTable) -> sa.Select[Any]:
    """Every column Falcon-ES uses, under Falcon-ES's names."""
    columns = [(sa.type_coerce(c, sa.Text) if c.key in _AS_STORED else c).label(c.key)
               for c in job.table.columns]
    return sa.select(*columns)


def _as_dict(row: Any) -> dict[str, Any]:
    return decoded(dict(row._mapping), _TIMES)


def list_rows(engine: Engine, *, status: str | None = None, limit: int | None = None,
              job: JobTable | None = None) -> list[dict[str, Any]]:
    job = job or JobTable()
    query = _rows_query(job).order_by(job.c.created_at, job.c.id)
    if status:
        query = query.where(job.c.status == status)
    if limit:
        query = query.limit(limit)
    with engine.connect() as conn:
        return [_as_dict(r) for r in conn.execute(query)]


def get_row(engine: Engine, task_id: str, *, job: JobTable | None = None) -> dict[str, Any]:
    job = job or JobTable()
    with engine.connect() as conn:
        row = conn.execute(_rows_query(job).where(job.c.id == task_id)).first()
    if row is None:
        raise JobRowError(f"task {task_id!r} does not exist")
    return _as_dict(row)
