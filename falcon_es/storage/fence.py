"""The writers' fence: a term number in the log head row, taken by each elected
controller when its term begins and checked inside every append it makes.

An election (a Kubernetes Lease, a database lock) says who *should* append; only the
database can refuse the one that no longer should but has not noticed yet (a process
frozen past its lease, a lock lost with its connection). ``take`` raises the term and
names the holder in one transaction; an append by the holder moves the log head only
``WHERE fence_term = <its term>``, in the statement that locks the head row, so a
stale writer's append changes nothing and raises ``FencedOut``. Appends made without
a fence (the command line's, an unelected controller's) are not checked.
The scheme and its timing: docs/design-notes/writer-fence.md.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage.tables import FENCE_HOLDER_LENGTH, log_head


@dataclasses.dataclass(frozen=True)
class Fence:
    """One holder's term: its appends are taken while the log head's term is this one."""

    term: int
    holder: str


class FencedOut(RuntimeError):
    """Another controller took the fence after this one's term began: nothing was
    appended, and this controller must stop writing."""


def take(engine: Engine, holder: str) -> Fence:
    """Begin a term: the log head's term goes up by one and names ``holder``. It waits
    for the head row like an append does (a bounded lock wait on MySQL/MariaDB), so it
    returns only once no append of the previous term can still commit."""
    with engine.begin() as conn:
        conn.execute(log_head.update().where(log_head.c.id == 1).values(
            fence_term=log_head.c.fence_term + 1,
            fence_holder=holder[:FENCE_HOLDER_LENGTH]))
        return current(conn)


def current(conn: Connection) -> Fence:
    """The term the log head holds now, and its holder ("" before any was taken)."""
    row = conn.execute(sa.select(log_head.c.fence_term, log_head.c.fence_holder)
                       .where(log_head.c.id == 1)).one()
    return Fence(int(row.fence_term), row.fence_holder or "")


def refusal(conn: Connection, mine: Fence) -> FencedOut:
    """The error of an append whose term is over, naming who holds the fence now."""
    now = current(conn)
    return FencedOut(f"the log's writer fence is at term {now.term}, held by "
                     f"{now.holder or 'nobody'}; this controller's term {mine.term} "
                     f"({mine.holder}) is over: nothing was appended")
