"""``task list`` and ``task show`` through the database's own driver (sqlite3 or
PyMySQL), without SQLAlchemy.

These are the commands an upper layer or a person scripts in a loop, and importing
SQLAlchemy alone takes about as long as the whole command may (0.25 s on a small
machine). The rows come back as ``falcon_es.jobtable.job_rows`` returns them through
SQLAlchemy: every column Falcon-ES uses, under Falcon-ES's names (the settings'
mapping applied), the spec decoded where it is JSON and the times as datetimes where
they are times (anything else as stored). A URL ``falcon_es.config.db_urls`` does not
recognise is read through ``job_rows`` instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from falcon_es.config.db_urls import MysqlTarget, SqliteTarget
from falcon_es.config.job_mapping import JOB_COLUMNS, JobMapping
from falcon_es.domain.timestamps import as_timestamp

#: ``falcon_es.domain.events.ROW_CHECKS_STREAM``, written out: importing the events
#: would cost ``task show`` the start-up time this module exists to save.
ROW_CHECKS_STREAM = "intake:rows"
_TIMES = ("created_at", "updated_at", "aborting_at", "aborted_at", "dispatched_at",
          "finished_at")


class JobReadError(Exception):
    """The database refused the read; ``text`` is the driver's own first line."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any]) -> Any: ...
    def fetchall(self) -> Sequence[Sequence[Any]]: ...


class TaskMissing(LookupError):
    """No row of that id."""


def _select(mapping: JobMapping, mysql: bool) -> str:
    quote = "`" if mysql else '"'
    names = mapping.columns
    columns = ", ".join(f"{quote}{names[c]}{quote}" for c in JOB_COLUMNS)
    table = f"{quote}{mapping.table}{quote}"
    if mapping.schema:
        table = f"{quote}{mapping.schema}{quote}.{table}"
    return f"SELECT {columns} FROM {table}"


def list_rows(target: SqliteTarget | MysqlTarget, mapping: JobMapping, *,
              status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Every row (or those in ``status``), oldest first, at most ``limit``."""
    mysql = isinstance(target, MysqlTarget)
    mark = "%s" if mysql else "?"
    quote = "`" if mysql else '"'
    names = mapping.columns
    sql = _select(mapping, mysql)
    params: list[Any] = []
    if status:
        sql += f" WHERE {quote}{names['status']}{quote} = {mark}"
        params.append(status)
    sql += f" ORDER BY {quote}{names['created_at']}{quote}, {quote}{names['id']}{quote}"
    if limit:
        sql += f" LIMIT {mark}"
        params.append(limit)
    with _cursor(target) as cursor:
        cursor.execute(sql, params)
        return [_as_dict(row) for row in cursor.fetchall()]


def get_row(target: SqliteTarget | MysqlTarget, mapping: JobMapping,
            task_id: str) -> dict[str, Any]:
    """The row of ``task_id``; ``TaskMissing`` when there is none."""
    mysql = isinstance(target, MysqlTarget)
    quote = "`" if mysql else '"'
    sql = (f"{_select(mapping, mysql)} WHERE {quote}{mapping.columns['id']}{quote} = "
           f"{'%s' if mysql else '?'}")
    with _cursor(target) as cursor:
        cursor.execute(sql, [task_id])
        rows = cursor.fetchall()
    if not rows:
        raise TaskMissing(f"task {task_id!r} does not exist")
    return _as_dict(rows[0])


def row_notes(target: SqliteTarget | MysqlTarget, task_id: str) -> list[str]:
    """What the log recorded of this task's job row (``JobRowDiverged`` details, the
    latest of each finding): a spec changed after acceptance, a row deleted or reused."""
    mysql = isinstance(target, MysqlTarget)
    sql = f"SELECT data FROM task_events WHERE stream_id = {'%s' if mysql else '?'} ORDER BY seq"
    with _cursor(target) as cursor:
        cursor.execute(sql, [ROW_CHECKS_STREAM])
        rows = cursor.fetchall()
    return notes_of(task_id, (row[0] for row in rows))


def notes_of(task_id: str, stored: Iterable[Any]) -> list[str]:
    """The latest detail of each finding about ``task_id`` among stored event data."""
    latest: dict[str, str] = {}
    for data in stored:
        found = json.loads(data) if isinstance(data, (str, bytes)) else data
        if found.get("task_id") == task_id:
            latest[str(found["found"])] = str(found["detail"])
    return list(latest.values())


def _as_dict(row: Sequence[Any]) -> dict[str, Any]:
    return decoded(dict(zip(JOB_COLUMNS, row)), _TIMES)


def decoded(values: dict[str, Any], times: Sequence[str]) -> dict[str, Any]:
    """A job row as the CLI shows it, whichever path read it: its spec decoded and its
    ``times`` as datetimes where they can be (anything else as stored)."""
    for name in times:
        values[name] = as_timestamp(values[name]) or values[name]
    raw = values.get("spec")
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            values["spec"] = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or JSON Python cannot hold
            values["spec"] = raw
    return values


@contextmanager
def _cursor(target: SqliteTarget | MysqlTarget) -> Iterator[_Cursor]:
    """A cursor of a connection opened for this read and closed after it; a driver
    error becomes ``JobReadError``."""
    if isinstance(target, SqliteTarget):
        import sqlite3

        try:
            lite = sqlite3.connect(target.path)
        except sqlite3.Error as error:
            raise JobReadError(str(error)) from error
        try:
            yield lite.cursor()
        except sqlite3.Error as error:
            raise JobReadError(str(error)) from error
        finally:
            lite.close()
        return
    import pymysql

    try:
        conn = pymysql.connect(host=target.host, port=target.port, user=target.user or "",
                               password=target.password or "", database=target.database,
                               charset=target.charset)
    except pymysql.err.MySQLError as error:
        raise JobReadError(_mysql_text(error)) from error
    try:
        with conn.cursor() as cursor:
            yield cursor
    except pymysql.err.MySQLError as error:
        raise JobReadError(_mysql_text(error)) from error
    finally:
        conn.close()


def _mysql_text(error: Exception) -> str:
    """PyMySQL's (code, message) as SQLAlchemy shows it."""
    return str(error)
