"""The writers' fence: ``log_head.fence_term`` and ``log_head.fence_holder``.

An elected controller takes the fence when its term begins (the term goes up by one)
and every append it makes updates the log head only while the term is still its own,
so a controller whose lease or lock has passed to another cannot append even if it
does not know yet (``falcon_es.storage.fence``). Rerunnable: each column is added only
when it is missing.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: The longest holder name kept (``storage.tables.FENCE_HOLDER_LENGTH`` when written).
HOLDER_LENGTH = 255


def _columns() -> set[str]:
    return {c["name"] for c in sa.inspect(op.get_bind()).get_columns("log_head")}


def upgrade() -> None:
    present = _columns()
    if "fence_term" not in present:
        op.add_column("log_head", sa.Column("fence_term", sa.BigInteger, nullable=False,
                                            server_default="0"))
    if "fence_holder" not in present:
        op.add_column("log_head", sa.Column("fence_holder", sa.String(HOLDER_LENGTH),
                                            nullable=True))


def downgrade() -> None:
    present = _columns()
    with op.batch_alter_table("log_head") as batch:
        for column in ("fence_holder", "fence_term"):
            if column in present:
                batch.drop_column(column)
