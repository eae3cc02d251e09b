"""Stored positions of asynchronous log consumers (outbox publisher, ...)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.storage.tables import checkpoints


def read(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        value = conn.execute(
            sa.select(checkpoints.c.position).where(checkpoints.c.name == name)
        ).scalar()
    return int(value or 0)


def advance(engine: Engine, name: str, position: int, now: dt.datetime) -> None:
    """Move the checkpoint forward only (a slower writer never moves it back)."""
    with engine.begin() as conn:
        updated = conn.execute(
            checkpoints.update()
            .where(checkpoints.c.name == name, checkpoints.c.position < position)
            .values(position=position, updated_at=now)
        ).rowcount
        if updated == 0:
            exists = conn.execute(
                sa.select(checkpoints.c.position).where(checkpoints.c.name == name)
            ).first()
            if exists is None:
                conn.execute(checkpoints.insert().values(name=name, position=position, updated_at=now))
