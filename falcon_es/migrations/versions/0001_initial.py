"""The event log, its head and checkpoints, and the cluster registry.

Every step checks what exists (``falcon_es.migrations.steps``), so a run interrupted on
MySQL/MariaDB, where each CREATE commits on its own, completes when run again. The job
table is the upper layer's and no migration touches it (a database migrated by an
earlier release keeps the job table that release created here).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from falcon_es.migrations.steps import create_index, create_table, drop_table, insert_missing

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
JSON = sa.JSON().with_variant(mysql.JSON(), "mysql", "mariadb")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    create_table(
        "task_events",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("stream_id", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.Column("meta", JSON, nullable=False),
        sa.Column("recorded_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("stream_id", "version", name="uq_task_events_stream_version"),
    )
    create_index("ix_task_events_recorded_at", "task_events", ["recorded_at"])
    create_table(
        "log_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    insert_missing(
        sa.table("log_head", sa.column("id", sa.Integer), sa.column("last_seq", sa.BigInteger)),
        [{"id": 1, "last_seq": 0}], key="id",
    )
    create_table(
        "checkpoints",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
    )
    create_table(
        "clusters",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("location", sa.String(64), nullable=False),
        sa.Column("tpu_type", sa.String(32), nullable=False),
        sa.Column("gcs_bucket", sa.String(255), nullable=False),
        sa.Column("default_reservation", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "status IN ('active', 'maintenance', 'offline')", name="ck_clusters_status"
        ),
    )


def downgrade() -> None:
    """Drops Falcon-ES's own tables; the job table stays, as it is the upper layer's."""
    drop_table("clusters")
    drop_table("checkpoints")
    drop_table("log_head")
    drop_table("task_events")
