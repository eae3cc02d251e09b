"""Migration steps that look at what exists before they act, for every migration file.

On MySQL/MariaDB, DDL is not transactional: each CREATE commits on its own, so a
migration interrupted midway (a lost connection, a killed process, a step that failed)
leaves the tables it had created behind, and Alembic has not recorded the revision.
The next ``db upgrade`` runs the same migration again from its first step; with these
steps it carries on where the last run stopped. An object that exists already is
checked (a table must have the columns the step would give it) rather than created
again, so a table of the same name that is not the one intended is reported, not
silently taken for it.

A new migration (``versions/NNNN_*.py``, ``down_revision`` the last one) uses these
steps for its DDL in the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from falcon_es.storage.db import MigrationConflict

__all__ = ["MigrationConflict", "add_column", "create_index", "create_table", "drop_column",
           "drop_table", "insert_missing"]


def _inspector() -> sa.Inspector:
    # A fresh inspector each time: an inspector caches what it has read, and each
    # step changes what exists.
    return sa.inspect(op.get_bind())


def create_table(name: str, *elements: Any) -> bool:
    """CREATE TABLE unless it exists (True when created). An existing table must have
    every column of ``elements``; its constraints and types are left as they are."""
    inspector = _inspector()
    if not inspector.has_table(name):
        op.create_table(name, *elements)
        return True
    present = {column["name"].lower() for column in inspector.get_columns(name)}
    wanted = [e.name for e in elements if isinstance(e, sa.Column)]
    missing = [column for column in wanted if column.lower() not in present]
    if missing:
        raise MigrationConflict(
            f"table {name} exists without column(s) {', '.join(missing)}: it is not the "
            f"table this migration creates; rename or drop it, then run db upgrade again")
    return False


def create_index(name: str, table: str, columns: Sequence[str], *, unique: bool = False) -> bool:
    """CREATE INDEX unless an index of that name exists on the table (True when created)."""
    if any(index["name"] == name for index in _inspector().get_indexes(table)):
        return False
    op.create_index(name, table, list(columns), unique=unique)
    return True


def insert_missing(table: sa.TableClause, rows: Sequence[Mapping[str, Any]], key: str) -> int:
    """Insert the rows whose ``key`` value the table does not hold yet (seed rows a
    previous run may have inserted already); returns how many were inserted."""
    bind = op.get_bind()
    wanted = [row[key] for row in rows]
    present = set(bind.execute(
        sa.select(table.c[key]).where(table.c[key].in_(wanted))).scalars())
    missing = [dict(row) for row in rows if row[key] not in present]
    if missing:
        op.bulk_insert(table, missing)
    return len(missing)


def drop_table(name: str) -> bool:
    """DROP TABLE if it exists (True when dropped)."""
    if not _inspector().has_table(name):
        return False
    op.drop_table(name)
    return True


def _has_column(table: str, column: str) -> bool:
    return any(c["name"].lower() == column.lower() for c in _inspector().get_columns(table))


def add_column(table: str, column: sa.Column[Any]) -> bool:
    """ALTER TABLE ADD COLUMN unless the table has it (True when added)."""
    if _has_column(table, column.name):
        return False
    op.add_column(table, column)
    return True


def drop_column(table: str, column: str) -> bool:
    """DROP COLUMN if the table has it (True when dropped); batch mode, so SQLite
    builds the table anew where it cannot drop in place."""
    if not _has_column(table, column):
        return False
    with op.batch_alter_table(table) as batch:
        batch.drop_column(column)
    return True
