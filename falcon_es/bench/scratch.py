"""A scratch database on a MySQL/MariaDB server, shared by the benchmarks: each one
measures on a database nobody else uses and leaves nothing behind."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa


class ScratchDatabaseError(RuntimeError):
    """The server refused to create the scratch database (raised before it is used)."""


@contextmanager
def scratch_mysql_database(url: str | sa.URL, prefix: str) -> Iterator[str]:
    """A new utf8mb4 database on the server ``url`` names (any database in it is
    ignored), named ``<prefix>_<pid>_<random>``; yields its URL and drops it afterwards."""
    server = sa.engine.make_url(url).set(database=None, query={})
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    except sa.exc.OperationalError as error:
        admin.dispose()
        raise ScratchDatabaseError(
            f"{server.render_as_string(hide_password=True)}: cannot create a scratch "
            f"database ({error.orig})") from None
    try:
        yield server.set(database=name, query={"charset": "utf8mb4"}).render_as_string(
            hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()
