"""The inbox's scan for job rows it will never take in reads its window a page a poll:
the window holds Falcon-ES's own recent rows too (every waiting row after a burst of
submissions), and one tick reading them all took most of a second at 100,000."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sized

import pytest
import sqlalchemy as sa

from falcon_es.domain import chart
from falcon_es.storage import db
from falcon_es.jobtable import inbox
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.storage.store import EventStore, Meta, StreamAppend
from falcon_es.storage.tables import JobTable

START = dt.datetime(2026, 11, 1, 8, 0, 0)
PAGE = 3


@pytest.fixture
def engine(bare_db_url: str) -> Iterator[sa.Engine]:
    """Each dialect: the values the next page starts from are the driver's own."""
    engine = db.make_engine(bare_db_url)
    db.upgrade(engine)
    db.create_job_table(engine, JobTable())
    yield engine
    engine.dispose()


def add_rows(engine: sa.Engine, clock: VirtualClock, ids: list[str], *, stray: str,
             created: dict[str, dt.datetime]) -> None:
    """Running rows created at ``created``: the log knows all but ``stray``."""
    job = JobTable()
    with engine.begin() as conn:
        conn.execute(job.table.insert(), [
            {"id": i, "name": "job", "actor": "a", "status": chart.RUNNING, "spec": {},
             "created_at": created[i], "updated_at": created[i]} for i in ids])
    EventStore(engine, clock).append([StreamAppend(i, 0, (ev.JobSucceeded(1),), Meta(actor="t"))
                                      for i in ids if i != stray])


def page_reads(engine: sa.Engine) -> list[int]:
    """Per statement on the job table with a LIMIT (a poll's page), 1; per question to
    the log, the ids asked."""
    seen: list[int] = []

    def count(conn: object, cursor: object, statement: str, params: Sized, *_: object) -> None:
        if "FROM job" in statement and "LIMIT" in statement and "coalesce" in statement:
            seen.append(1)
        elif "FROM task_events" in statement and "IN (" in statement:
            seen.append(len(params) - 1)  # the ids, and the version

    reader = db.read_only(engine)  # reads have a pool of their own
    for reading in (engine,) if reader.pool is engine.pool else (engine, reader):
        sa.event.listen(reading, "before_cursor_execute", count)
    return seen


def test_the_scan_reads_its_window_a_page_a_poll_and_reports_a_stray_once(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox, "STRAY_PAGE", PAGE)
    clock = VirtualClock(START + dt.timedelta(minutes=5))
    ids = [f"r{n}" for n in range(7)]
    # r2, r3 and r4 share their created_at across the first page's end: the next page
    # must go on after r2 within that moment, not after the moment.
    seconds = {"r0": 0, "r1": 1, "r2": 2, "r3": 2, "r4": 2, "r5": 3, "r6": 4}
    created = {i: START + dt.timedelta(seconds=s) for i, s in seconds.items()}
    add_rows(engine, clock, ids, stray="r3", created=created)
    ignored: list[str] = []
    job_inbox = inbox.JobInbox(engine, JobTable(), clock=clock, ignored=ignored.append)
    reads = page_reads(engine)

    job_inbox.poll()  # r0, r1, r2
    assert ignored == []
    assert reads == [1, PAGE]  # one page read, its rows asked about in the log
    reads.clear()
    job_inbox.poll()  # r3 (the stray), r4, r5
    assert ignored == [inbox.NOT_TAKEN_IN]
    assert reads == [1, PAGE]
    reads.clear()
    job_inbox.poll()  # r6: fewer than a page, the scan's last
    assert reads == [1, 1]
    reads.clear()
    clock.advance(inbox.STRAY_SCAN_SECONDS - 1)
    job_inbox.poll()  # no scan is due
    assert reads == []
    clock.advance(1)
    for _ in range(3):  # the next scan: rows the log knows are not asked about again
        job_inbox.poll()
    # Three pages; only r3, which the log does not know, is asked about again.
    assert reads == [1, 1, 1, 1]
    assert ignored == [inbox.NOT_TAKEN_IN]  # reported once
