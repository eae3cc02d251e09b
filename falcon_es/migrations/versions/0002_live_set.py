"""The live set: ``live_streams`` (the streams a starting controller folds) and
``last_served`` (who each queue served last), filled from the log already there.

Rerunnable: each table is created only when it is missing (MySQL/MariaDB commit DDL at
once, so an interrupted run can leave one behind), and the rows are derived from the
log afresh on every run, replacing whatever an interrupted run wrote.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import contextlib

import sqlalchemy as sa
from alembic import op

from falcon_es.engine import live_set
from falcon_es.domain.clock import utcnow
from falcon_es.config.settings import Settings

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: Rows per INSERT while filling the tables.
CHUNK = 1000


def upgrade() -> None:
    bind = op.get_bind()
    existing = set(sa.inspect(bind).get_table_names())
    if "live_streams" not in existing:
        op.create_table(
            "live_streams",
            sa.Column("stream_id", sa.String(64), primary_key=True),
            sa.Column("fold_from", sa.Integer, nullable=False),
        )
    if "last_served" not in existing:
        op.create_table(
            "last_served",
            sa.Column("cluster_id", sa.String(36), primary_key=True),
            sa.Column("topology", sa.String(32), primary_key=True),
            sa.Column("actor", sa.String(128), nullable=False),
        )
    _fill(bind)


def _fill(conn: sa.Connection) -> None:
    """Fold the log once and write its live set (the default create grace: a task that
    ended holding nothing within it of its pool's creation stays live for now)."""
    live_streams = sa.table("live_streams", sa.column("stream_id", sa.String),
                            sa.column("fold_from", sa.Integer))
    last_served = sa.table("last_served", sa.column("cluster_id", sa.String),
                           sa.column("topology", sa.String), sa.column("actor", sa.String))
    conn.execute(live_streams.delete())
    conn.execute(last_served.delete())
    live, served = live_set.from_log(
        lambda: contextlib.nullcontext(conn), now=utcnow(),
        create_grace_seconds=Settings().lifecycle.create_visibility_grace_seconds)
    rows = [{"stream_id": s, "fold_from": v} for s, v in sorted(live.items())]
    for first in range(0, len(rows), CHUNK):
        conn.execute(live_streams.insert(), rows[first:first + CHUNK])
    if served:
        conn.execute(last_served.insert(), [
            {"cluster_id": c, "topology": t, "actor": a} for (c, t), a in sorted(served.items())])


def downgrade() -> None:
    op.drop_table("last_served")
    op.drop_table("live_streams")
