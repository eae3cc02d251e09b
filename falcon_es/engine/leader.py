"""Who may append: exactly one active controller, by a database lock.

``--leader-election db`` elects by a lock the database holds for a connection:
``GET_LOCK`` on MySQL/MariaDB, an exclusive ``flock`` beside the SQLite file. The lock
is a campaign like the Kubernetes Lease's (``service.serve_elected`` runs either):
a standby tries for it every retry period and takes over when it is free; the holder
checks it is still the lock's owner before each tick and before each commit
(``IS_USED_LOCK`` = its ``CONNECTION_ID()``, a round trip that also keeps the
connection alive), and stands by as soon as it is not.

The lock's connection has a session ``wait_timeout`` of ``lock_timeout`` seconds: a
holder that stops answering (frozen, partitioned) loses the lock with its connection
after that long, so it cannot block a successor for longer. The database's writer
fence (``storage.fence``) is what refuses a holder that lost the lock without
noticing yet. docs/design-notes/writer-fence.md has the timing.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.storage import db

LOCK_NAME = "falcon-es-controller"
#: Seconds between a standby's tries for the lock (and the holder's keep-alive pings,
#: at most; never more than a third of the lock timeout).
RETRY_SECONDS = 1.0

log = logging.getLogger("falcon_es.engine.leader")


class AlreadyRunning(RuntimeError):
    """Another controller holds the database lock."""


class DatabaseLock:
    """One candidate for the database lock (an ``Election`` for ``serve_elected``)."""

    def __init__(self, engine: Engine, *, identity: str = "", lock_timeout: float = 15.0,
                 retry_period: float = RETRY_SECONDS) -> None:
        self.engine = engine
        self.identity = identity or f"pid {os.getpid()}"
        self.lock_timeout = lock_timeout
        self.retry_period = min(retry_period, lock_timeout / 3)
        self._connection: sa.Connection | None = None
        self._connection_id: int | None = None
        self._file: IO[Any] | None = None
        self._held_file = False
        self._lock_name = f"{LOCK_NAME}:{engine.url.database}"
        self._guard = threading.RLock()
        self.last_error = ""
        self.holder_seen = ""

    # ------------------------------------------------------------------ acquiring
    def acquire(self) -> None:
        """Take the lock now or raise ``AlreadyRunning`` naming who holds it."""
        if not self.try_acquire():
            raise AlreadyRunning(
                f"another controller ({self.holder_seen or 'unknown'}) already holds the "
                f"controller lock on {self._where()}; stop it first, or run this one as "
                "a standby (falcon-es run waits for the lock)")

    def try_acquire(self) -> bool:
        """One try for the lock; True when this candidate holds it now."""
        with self._guard:
            if self.holding():
                return True
            if self.engine.url.get_backend_name() == "sqlite":
                return self._acquire_file(self.engine.url.database or "")
            return self._acquire_mysql()

    def _acquire_file(self, database: str) -> bool:
        if database in ("", ":memory:"):
            self._held_file = True
            return True
        path = Path(f"{database}.controller.lock")
        handle = path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            self.holder_seen = handle.read().strip() or "another process"
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(self.identity)
        handle.flush()
        self._file, self._held_file = handle, True
        return True

    def _acquire_mysql(self) -> bool:
        try:
            connection = self.engine.connect()
        except sa.exc.DBAPIError as error:
            self.last_error = db.first_line(error)
            return False
        try:
            connection.execute(sa.text("SET SESSION wait_timeout = :seconds"),
                               {"seconds": max(1, round(self.lock_timeout))})
            got = connection.execute(sa.text("SELECT GET_LOCK(:name, 0), CONNECTION_ID()"),
                                     {"name": self._lock_name}).one()
            if got[0] != 1:
                holder = connection.execute(sa.text("SELECT IS_USED_LOCK(:name)"),
                                            {"name": self._lock_name}).scalar()
                self.holder_seen = f"database connection {holder}"
                connection.close()
                return False
        except sa.exc.DBAPIError as error:
            self.last_error = db.first_line(error)
            connection.invalidate()
            connection.close()
            return False
        self._connection, self._connection_id = connection, int(got[1])
        self.last_error, self.holder_seen = "", ""
        log.info("%s acquired the controller lock %s on %s (database connection %d)",
                 self.identity, self._lock_name, self._where(), self._connection_id)
        return True

    # ------------------------------------------------------------------ the fence
    def holding(self) -> bool:
        """This candidate held the lock when it last looked (no round trip)."""
        return self._connection is not None or self._held_file

    def is_leader(self) -> bool:
        return self.holding()

    def may_append(self) -> bool:
        """Whether this candidate holds the lock now, asked of the database: the check
        before each tick and each commit, and the keep-alive of the lock's connection."""
        with self._guard:
            if self._held_file or self._connection is None:
                return self._held_file
            try:
                owner = self._connection.execute(sa.text("SELECT IS_USED_LOCK(:name)"),
                                                 {"name": self._lock_name}).scalar()
            except sa.exc.DBAPIError as error:
                self._lost(f"its database connection failed: {db.first_line(error)}")
                return False
            if owner != self._connection_id:
                self._lost(f"database connection {owner} holds it now" if owner
                           else "nobody holds it (the database released it)")
                return False
            return True

    def _lost(self, why: str) -> None:
        log.warning("%s lost the controller lock %s: %s; standing by", self.identity,
                    self._lock_name, why)
        self.last_error = why
        self._drop()

    def _drop(self) -> None:
        """Close the lock's connection for good (never back to the pool: its session
        has the lock's short wait_timeout)."""
        connection, self._connection, self._connection_id = self._connection, None, None
        if connection is not None:
            connection.invalidate()
            connection.close()

    # ------------------------------------------------------------------ the campaign
    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: a standby tries for the lock, the holder checks it (which
        pings the lock's connection well within its wait_timeout)."""
        while not stop.is_set():
            if self.holding():
                self.may_append()
            else:
                self.try_acquire()
            stop.wait(self.retry_period)

    def describe(self) -> str:
        where = f"controller lock {self._lock_name}"
        if self.holding():
            return f"leader: holding the {where} as {self.identity}"
        if self.holder_seen:
            return f"standby: the {where} is held by {self.holder_seen}"
        if self.last_error:
            return f"standby: the {where} is free or unreachable ({self.last_error})"
        return f"standby: the {where} is free, acquiring"

    def release(self) -> bool:
        """Hand the lock back (a standby takes it at its next try)."""
        with self._guard:
            held = self.holding()
            if self._connection is not None:
                try:
                    self._connection.execute(sa.text("SELECT RELEASE_LOCK(:name)"),
                                             {"name": self._lock_name})
                except sa.exc.DBAPIError:
                    pass  # closing the connection frees the lock as well
                self._drop()
            if self._file is not None:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
                self._file.close()
                self._file = None
            self._held_file = False
            return held

    def connection_id(self) -> int | None:
        """The database connection holding the lock (MySQL/MariaDB), for operators
        and tests."""
        return self._connection_id

    def _where(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def __enter__(self) -> DatabaseLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

