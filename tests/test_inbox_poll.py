"""The poll of every tick reads new rows and abort requests in one statement, in a form
of its own per dialect: each must give the new rows oldest first (a tie on created_at
by id) and the abort requests by id, whatever order the table holds them in."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from falcon_es.domain import chart
from falcon_es.jobtable import inbox
from falcon_es.storage.tables import JobTable
from tests.test_inbox_scan import engine  # noqa: F401 (the fixture)

START = dt.datetime(2026, 11, 1, 8, 0, 0)


def add(engine: sa.Engine, rows: list[tuple[str, str, str | None, int]]) -> None:
    """(id, status, reason, created_at in seconds after START) rows, inserted in the
    order given."""
    with engine.begin() as conn:
        for row_id, status, reason, seconds in rows:
            at = START + dt.timedelta(seconds=seconds)
            conn.execute(JobTable().table.insert().values(
                id=row_id, name="job", actor="a", spec={}, status=status, reason=reason,
                created_at=at, updated_at=at,
                aborting_at=at if status == chart.ABORTING else None))


def test_new_rows_oldest_first_and_aborts_by_id(engine: sa.Engine) -> None:
    add(engine, [
        ("n-c", chart.PENDING, None, 5), ("n-a", chart.PENDING, None, 5),
        ("n-z", chart.PENDING, None, 1), ("n-b", chart.PENDING, None, 5),
        ("w-1", chart.PENDING, "Waiting", 0), ("r-1", chart.RUNNING, None, 0),
        ("x-2", chart.ABORTING, "Waiting", 0), ("x-3", chart.ABORTING, None, 9),
        ("x-1", chart.ABORTING, None, 3),
    ])
    poll = inbox.JobInbox(engine, JobTable()).poll()
    assert [r.id for r in poll.new_rows()] == ["n-z", "n-a", "n-b", "n-c"]
    assert [r.id for r in poll.abort_rows()] == ["x-1", "x-2", "x-3"]
    assert poll.abort_rows()[0].aborting_at == START + dt.timedelta(seconds=3)


def test_a_full_poll_holds_the_oldest_the_newest_and_the_aborts(engine: sa.Engine) -> None:
    add(engine, [(f"n-{n}", chart.PENDING, None, 10 - n) for n in range(5)]
        + [("x-1", chart.ABORTING, None, 0)])
    poll = inbox.JobInbox(engine, JobTable()).poll(limit=2)
    # The two oldest, then the newest of the others (``NEWEST_ROWS``), newest first.
    assert [r.id for r in poll.new_rows(limit=2)] == ["n-4", "n-3", "n-0", "n-1", "n-2"]
    assert [r.id for r in poll.abort_rows()] == ["x-1"]


def test_an_empty_poll(engine: sa.Engine) -> None:
    add(engine, [("w-1", chart.PENDING, "Waiting", 0), ("r-1", chart.RUNNING, None, 0)])
    poll = inbox.JobInbox(engine, JobTable()).poll()
    assert (poll.new_rows(), poll.abort_rows(), poll.bad_rows()) == ([], [], [])
