"""Stored positions of asynchronous log consumers (outbox publisher, ...), and of the
views written lazily up to a seq (the live set's ``last_served``)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import batched
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


def position(conn: Connection, name: str) -> int | None:
    """The checkpoint's position as ``conn`` sees it (None: there is none yet)."""
    value = conn.execute(
        sa.select(checkpoints.c.position).where(checkpoints.c.name == name)).scalar()
    return None if value is None else int(value)


def send(conn: Connection, name: str, position: int, now: dt.datetime) -> None:
    """Set the checkpoint within the transaction under way on ``conn`` (queued with its
    writes where they are, ``batched``), written whether or not it exists yet."""
    sqlite = conn.dialect.name == "sqlite"
    mark = "?" if sqlite else "%s"
    # SQLite keeps a timestamp as the text SQLAlchemy's DateTime writes there.
    at: object = now.isoformat(" ", "microseconds") if sqlite else now
    batched.send_rows(conn, "INSERT INTO checkpoints (name, position, updated_at) VALUES",
                      f"({mark}, {mark}, {mark})", [(name, position, at)],
                      "ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
                      "updated_at = excluded.updated_at" if sqlite else
                      "ON DUPLICATE KEY UPDATE position = VALUES(position), "
                      "updated_at = VALUES(updated_at)")
