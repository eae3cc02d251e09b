"""SQLAlchemy Core table definitions shared by the store and the projections.

The migrations in ``schema/`` create these tables; this module only describes them so
queries are written once. Times are stored as naive UTC with microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

metadata = sa.MetaData()

#: DATETIME(6) on MySQL so recorded_at keeps microseconds; SQLite stores text anyway.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: LONGTEXT-backed JSON on MySQL/MariaDB, TEXT on SQLite.
Json = sa.JSON().with_variant(mysql.JSON(), "mysql", "mariadb")

task_events = sa.Table(
    "task_events", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
              autoincrement=False),
    sa.Column("stream_id", sa.String(64), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("data", Json, nullable=False),
    sa.Column("meta", Json, nullable=False),
    sa.Column("recorded_at", Timestamp, nullable=False),
    sa.UniqueConstraint("stream_id", "version", name="uq_task_events_stream_version"),
)

#: One row (id=1) holding the last assigned seq. Appenders lock it FOR UPDATE so that
#: seq order is commit order on MySQL too.
log_head = sa.Table(
    "log_head", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
)

#: Position of each asynchronous consumer (outbox publisher, rebuilt views).
checkpoints = sa.Table(
    "checkpoints", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

#: The streams a starting controller folds (``falcon_es.live_set``): every task stream
#: that still holds something (not ended, an open intent, a pool whose fate is open or
#: that waits retained for another task) and every orphan stream with an orphan whose
#: delete is open. Kept in the append's own transaction, so a controller that starts
#: folds these streams instead of the whole log. ``fold_from`` is the first version
#: it reads (1 for a task; an orphan stream's oldest open orphan).
live_streams = sa.Table(
    "live_streams", metadata,
    sa.Column("stream_id", sa.String(64), primary_key=True),
    sa.Column("fold_from", sa.Integer, nullable=False),
)

#: Per (cluster, topology) queue, the actor served last (its latest ``TaskPicked``):
#: the pick rule makes that actor yield, and the task it picked may have left the
#: live set long ago. Kept in the append's own transaction, like ``live_streams``.
last_served = sa.Table(
    "last_served", metadata,
    sa.Column("cluster_id", sa.String(36), primary_key=True),
    sa.Column("topology", sa.String(32), primary_key=True),
    sa.Column("actor", sa.String(128), nullable=False),
)

clusters = sa.Table(
    "clusters", metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("location", sa.String(64), nullable=False),
    sa.Column("tpu_type", sa.String(32), nullable=False),
    sa.Column("gcs_bucket", sa.String(255), nullable=False),
    sa.Column("default_reservation", sa.String(255), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
)

job = sa.Table(
    "job", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("spec", Json, nullable=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reason", sa.String(64), nullable=True),
    sa.Column("message", sa.Text, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=True),
    sa.Column("aborting_at", Timestamp, nullable=True),
    sa.Column("aborted_at", Timestamp, nullable=True),
    sa.Column("cluster_id", sa.String(36), nullable=True),
    sa.Column("node_pool_name", sa.String(64), nullable=True),
    sa.Column("job_uid", sa.String(64), nullable=True),
    sa.Column("dispatched_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Index("ix_job_status_reason", "status", "reason"),
    sa.Index("ix_job_created_at", "created_at"),
)

#: The columns Falcon-ES reads or writes in the upper layer's job table, and the
#: SQLAlchemy type family each must have (checked by ``falcon-es db check``).
JOB_COLUMN_KINDS: Mapping[str, type[sa.types.TypeEngine]] = MappingProxyType({
    "id": sa.String, "name": sa.String, "actor": sa.String, "spec": sa.JSON,
    "status": sa.String, "reason": sa.String, "message": sa.Text,
    "created_at": sa.DateTime, "updated_at": sa.DateTime, "aborting_at": sa.DateTime,
    "aborted_at": sa.DateTime, "cluster_id": sa.String, "node_pool_name": sa.String,
    "job_uid": sa.String, "dispatched_at": sa.DateTime, "finished_at": sa.DateTime,
})
