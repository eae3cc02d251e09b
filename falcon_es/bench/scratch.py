"""A scratch database on a MySQL/MariaDB server, shared by the benchmarks: each one
measures on a database nobody else uses and leaves nothing behind; and the job table
they create there."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from falcon_es.config.job_mapping import JobMapping
from falcon_es.storage.tables import JobTable


def bench_mapping(mapping: JobMapping) -> JobMapping:
    """The job-table names a benchmark runs with: the settings' table and column names
    (so a renamed mapping is what gets measured), in the benchmark's scratch database
    whichever database the mapping names."""
    return dataclasses.replace(mapping, schema=None)


def bench_job_table(mapping: JobMapping) -> JobTable:
    return JobTable(bench_mapping(mapping))


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
