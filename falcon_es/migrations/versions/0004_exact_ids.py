"""Exact ids: the log's ``stream_id`` and ``live_streams.stream_id`` compare as bytes.

MySQL/MariaDB created them under the database's default collation, which is case- and
accent-insensitive (and pads trailing spaces): ``Task-A`` and ``task-a``, or ``resume``
and ``résumé``, were one stream there, so two rows an upper layer with a binary id
column tells apart collided as if another writer had raced. This converts both columns
of an existing log in place to a binary collation without padding (``ALTER ... MODIFY``
keeps every row: ids that were distinct under the old collation stay distinct under a
stricter one). SQLite compares text as bytes already, so nothing changes there.

Rerunnable: MODIFY to the same definition changes nothing.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: The binary collations, best first: no padding (MariaDB, MySQL 8), then padding.
BINARY_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")
#: The columns converted: every column keyed by a task id.
ID_COLUMNS = (("task_events", "stream_id"), ("live_streams", "stream_id"))


def binary_collation(conn: sa.Connection) -> str:
    """The first of ``BINARY_COLLATIONS`` this server has."""
    present = set(conn.exec_driver_sql("SHOW COLLATION WHERE Charset = 'utf8mb4'").scalars())
    return next(c for c in BINARY_COLLATIONS if c in present)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    collation = binary_collation(bind)
    for table, column in ID_COLUMNS:
        bind.exec_driver_sql(f"ALTER TABLE {table} MODIFY {column} VARCHAR(64) "
                             f"CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL")


def downgrade() -> None:
    """Back to the database's default collation (fails, as it should, when the log
    holds two ids that collation takes for one)."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    for table, column in ID_COLUMNS:
        bind.exec_driver_sql(f"ALTER TABLE {table} MODIFY {column} VARCHAR(64) "
                             f"CHARACTER SET utf8mb4 NOT NULL")
