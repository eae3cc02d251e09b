"""Who may append: exactly one active controller.

In Kubernetes a Lease elects the leader (``falcon_es.adapters.gcp``); with the embedded
default there is no election, so a second controller started by mistake against the
same database is refused by a database-level lock held for the process lifetime:
``GET_LOCK`` on MySQL/MariaDB, an exclusive ``flock`` beside the SQLite file. The log's
optimistic concurrency stays the fence behind either.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

LOCK_NAME = "falcon-es-controller"


class AlreadyRunning(RuntimeError):
    """Another controller holds the database lock."""


class DatabaseLock:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: sa.Connection | None = None
        self._file: IO[Any] | None = None
        self._lock_name = LOCK_NAME

    def acquire(self) -> None:
        backend = self.engine.url.get_backend_name()
        if backend == "sqlite":
            self._acquire_file(self.engine.url.database or "")
        else:
            self._acquire_mysql()

    def _acquire_file(self, database: str) -> None:
        if database in ("", ":memory:"):
            return
        path = Path(f"{database}.controller.lock")
        handle = path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise AlreadyRunning(
                f"another controller ({holder}) is already running against {database}; "
                "stop it first (only one controller may own the log)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._file = handle

    def _acquire_mysql(self) -> None:
        connection = self.engine.connect()
        self._lock_name = f"{LOCK_NAME}:{self.engine.url.database}"
        got = connection.execute(
            sa.text("SELECT GET_LOCK(:name, 0)"), {"name": self._lock_name}
        ).scalar()
        if got != 1:
            holder = connection.execute(
                sa.text("SELECT IS_USED_LOCK(:name)"), {"name": self._lock_name}
            ).scalar()
            connection.close()
            raise AlreadyRunning(
                f"another controller (database connection {holder}) already holds the "
                f"controller lock on {self.engine.url.render_as_string(hide_password=True)}; "
                "stop it first, or run several replicas with --leader-election lease"
            )
        self._connection = connection

    def release(self) -> None:
        if self._connection is not None:
            self._connection.execute(
                sa.text("SELECT RELEASE_LOCK(:name)"), {"name": self._lock_name}
            )
            self._connection.close()
            self._connection = None
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> DatabaseLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
