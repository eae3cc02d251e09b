"""Inputs from the upper layer, read from the ``job`` table by indexed queries."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es import chart
from falcon_es.tables import job


@dataclasses.dataclass(frozen=True)
class NewRow:
    id: str
    name: str
    actor: str
    spec_raw: Any  # text as stored: decoding it is validation's job
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class AbortRow:
    id: str
    aborting_at: dt.datetime | None


class JobInbox:
    """New rows are ``Pending`` with no Reason yet (the projection sets one on intake);
    abort requests are rows in ``Aborting``. Both use the (status, reason) index."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        query = (
            sa.select(job.c.id, job.c.name, job.c.actor,
                      sa.type_coerce(job.c.spec, sa.Text).label("spec_raw"), job.c.created_at)
            .where(job.c.status == chart.PENDING, job.c.reason.is_(None))
            .order_by(job.c.created_at, job.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [NewRow(r.id, r.name, r.actor, r.spec_raw, r.created_at)
                    for r in conn.execute(query)]

    def abort_rows(self) -> list[AbortRow]:
        query = sa.select(job.c.id, job.c.aborting_at).where(job.c.status == chart.ABORTING)
        with self.engine.connect() as conn:
            return [AbortRow(r.id, r.aborting_at) for r in conn.execute(query)]
