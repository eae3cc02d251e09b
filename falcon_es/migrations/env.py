"""Alembic environment: runs migrations on the engine handed over by ``falcon_es.storage.db``."""

from __future__ import annotations

from alembic import context

from falcon_es.storage.db import make_engine
from falcon_es.config.settings import Settings


def run_migrations() -> None:
    engine = context.config.attributes.get("engine") or make_engine(Settings.from_env().database.db_url)
    with engine.begin() as connection:
        context.configure(connection=connection, render_as_batch=True)
        context.run_migrations()


run_migrations()
