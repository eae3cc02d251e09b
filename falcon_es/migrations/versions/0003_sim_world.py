"""The sim backend's world beside the log: ``sim_worlds`` (one row per world),
``sim_world_objects`` (its compacted snapshot) and ``sim_world_changes`` (the objects
each save changed since), so ``run --backend sim`` goes on in the same world after a
restart. Rerunnable: each table is created only when it is missing.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from falcon_es.migrations.steps import create_table, drop_table

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def upgrade() -> None:
    create_table(
        "sim_worlds",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("snapshot_seq", sa.BigInteger, nullable=False),
        sa.Column("moment", TIMESTAMP, nullable=False),
        sa.Column("objects", sa.Integer, nullable=False),
    )
    create_table(
        "sim_world_objects",
        sa.Column("world", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(255), nullable=False),
        sa.Column("blob", BLOB, nullable=False),
    )
    create_table(
        "sim_world_changes",
        sa.Column("world", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("key", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(255), nullable=False),
        sa.Column("blob", BLOB, nullable=True),
    )


def downgrade() -> None:
    drop_table("sim_world_changes")
    drop_table("sim_world_objects")
    drop_table("sim_worlds")
