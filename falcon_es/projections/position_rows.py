"""Writing position Messages into the upper layer's job table, in bulk, never over a
row that is no longer Pending (an abort the upper layer wrote)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.domain import chart
from falcon_es.projections.messages import fit_message
from falcon_es.storage import batched
from falcon_es.storage.tables import JobSql, JobTable, MessageRoom


def position_update(job: JobTable) -> sa.Update:
    """The batched refresh: never touches a row that is no longer Pending (an abort)."""
    return (
        job.table.update()
        .where(job.c.id == sa.bindparam("b_id"), job.c.status == chart.PENDING)
        .values(message=sa.bindparam("b_message"))
    )


#: Rows per statement of the MySQL/MariaDB form (PyMySQL's executemany of an UPDATE
#: is one round trip per row; a joined derived table carries many rows per trip).
MYSQL_CHUNK = 500


def _mysql_update(count: int, names: JobSql) -> str:
    """UPDATE ... JOIN (SELECT id, message UNION ALL ...) for ``count`` rows, with the
    same guard: only rows still Pending (PyMySQL ``format`` parameters: id, message per
    row, then the status)."""
    selects = " UNION ALL ".join(
        "SELECT %s AS id, %s AS message" if n == 0 else "SELECT %s, %s" for n in range(count)
    )
    table, col = names.table, names.columns
    return (f"UPDATE {table} JOIN ({selects}) AS moved ON {table}.{col['id']} = moved.id "
            f"SET {table}.{col['message']} = moved.message "
            f"WHERE {table}.{col['status']} = %s")


def write_positions(conn: Connection, rows: Sequence[tuple[str, str]],
                    update: sa.Update | None = None, *, job: JobTable) -> int:
    """Write (task id, Message) rows in bulk: one executemany UPDATE on SQLite, joined
    multi-row UPDATEs of ``MYSQL_CHUNK`` rows on MySQL/MariaDB. Returns the rows sent."""
    if not rows:
        return 0
    if job.message_room != MessageRoom():  # narrower than a TEXT: a Message may not fit
        rows = [(task_id, fit_message(m, job.message_room) or "") for task_id, m in rows]
    if conn.dialect.name in ("mysql", "mariadb"):
        # Sent to the driver as is: parsing a text() of a thousand bind names cost more
        # than the statement.
        for start in range(0, len(rows), MYSQL_CHUNK):
            chunk = rows[start:start + MYSQL_CHUNK]
            batched.send(conn, _mysql_update(len(chunk), job.sql(conn.dialect)),
                         (*(value for row in chunk for value in row), chart.PENDING))
        return len(rows)
    if update is None and conn.dialect.name == "sqlite":
        # The driver's own executemany: the statement needs no compiling and the rows
        # (plain strings) no bind processing, which per row cost more than the UPDATE.
        conn.exec_driver_sql(_sqlite_position_update(job.sql(conn.dialect)),
                             [(message, task_id, chart.PENDING) for task_id, message in rows])
        return len(rows)
    conn.execute(update if update is not None else position_update(job),
                 [{"b_id": task_id, "b_message": m} for task_id, m in rows])
    return len(rows)


def _sqlite_position_update(names: JobSql) -> str:
    """``position_update`` as SQLite compiles it (qmark parameters: message, id, status)."""
    table, col = names.table, names.columns
    return (f"UPDATE {table} SET {col['message']}=? "
            f"WHERE {table}.{col['id']} = ? AND {table}.{col['status']} = ?")


def waiting_messages(job: JobTable) -> sa.Select[Any]:
    """The Messages the job table holds for waiting tasks (read once at start)."""
    return sa.select(job.c.id.label("id"), job.c.message.label("message")).where(
        job.c.status == chart.PENDING, job.c.reason == chart.PendingReason.WAITING)
