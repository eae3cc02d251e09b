"""The zone a cluster's TPU pools go in: ``clusters.node_location``.

Before it, one ``location`` served as the cluster's GKE location, its pools' zone and
its reservations' zone, which only a zonal cluster could satisfy. A row written then
keeps working: a zonal location is also its node zone, so it is copied; a regional
row stays NULL (its pools and reservation reads are refused, naming the flag, and
``doctor`` says so) until the cluster is given a zone with
``falcon-es cluster set-node-location``. Rerunnable: the column is added only when
missing and only NULL rows are filled.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from falcon_es.domain.clusters import is_zone
from falcon_es.migrations.steps import add_column, drop_column

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_CLUSTERS = sa.table("clusters", sa.column("id", sa.String), sa.column("location", sa.String),
                     sa.column("node_location", sa.String))


def upgrade() -> None:
    add_column("clusters", sa.Column("node_location", sa.String(64), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_CLUSTERS.c.id, _CLUSTERS.c.location)
                        .where(_CLUSTERS.c.node_location.is_(None))).all()
    for cluster_id, location in rows:
        if is_zone(location):
            bind.execute(_CLUSTERS.update().where(_CLUSTERS.c.id == cluster_id)
                         .values(node_location=location))


def downgrade() -> None:
    drop_column("clusters", "node_location")
