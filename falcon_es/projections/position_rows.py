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
#: is one round trip per row; one statement carries many rows per trip). Its CASE
#: grows with rows times rows: at 250 rows it still cost the server 0.7 of a join
#: to a derived table of the rows, at 500 as much.
MYSQL_CHUNK = 200


def _mysql_update(count: int, names: JobSql) -> str:
    """UPDATE ... SET message = CASE id WHEN ... END WHERE id IN (...) for ``count``
    rows, with the same guard: only rows still Pending (PyMySQL ``format`` parameters:
    id, message per row, the ids again, then the status). A join to a derived table of
    the rows cost MySQL/MariaDB more: planning each of its SELECTs, then building it."""
    table, col = names.table, names.columns
    row_id = f"{table}.{col['id']}"
    whens = " ".join(["WHEN %s THEN %s"] * count)
    return (f"UPDATE {table} SET {table}.{col['message']} = CASE {row_id} {whens} END "
            f"WHERE {row_id} IN ({', '.join(['%s'] * count)}) "
            f"AND {table}.{col['status']} = %s")


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
                         (*(value for row in chunk for value in row),
                          *(task_id for task_id, _ in chunk), chart.PENDING))
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
