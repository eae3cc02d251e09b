"""The event log, its head and checkpoints, the cluster registry and the job table.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
JSON = sa.JSON().with_variant(mysql.JSON(), "mysql", "mariadb")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
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
    op.create_index("ix_task_events_recorded_at", "task_events", ["recorded_at"])
    op.create_table(
        "log_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(
        sa.table("log_head", sa.column("id", sa.Integer), sa.column("last_seq", sa.BigInteger)),
        [{"id": 1, "last_seq": 0}],
    )
    op.create_table(
        "checkpoints",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
    )
    op.create_table(
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
    op.create_table(
        "job",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("spec", JSON, nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=True),
        sa.Column("aborting_at", TIMESTAMP, nullable=True),
        sa.Column("aborted_at", TIMESTAMP, nullable=True),
        sa.Column("cluster_id", sa.String(36), nullable=True),
        sa.Column("node_pool_name", sa.String(64), nullable=True),
        sa.Column("job_uid", sa.String(64), nullable=True),
        sa.Column("dispatched_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
    )
    op.create_index("ix_job_status_reason", "job", ["status", "reason"])
    op.create_index("ix_job_created_at", "job", ["created_at"])


def downgrade() -> None:
    op.drop_table("job")
    op.drop_table("clusters")
    op.drop_table("checkpoints")
    op.drop_table("log_head")
    op.drop_table("task_events")
