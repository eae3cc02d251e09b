"""The head's move in the append's one query (MySQL/MariaDB): once a store knows where
its last append left the head, the next append's head move is queued with its writes,
and moves the head only from there (and only in the store's fence term). Anything else
stops the query before it wrote a row, whatever the server's ``sql_mode``, and the
append runs once more reading the head, which names what happened."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.config.settings import Settings
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.storage import db, fence
from falcon_es.storage import store as store_module
from falcon_es.storage.fence import FencedOut
from falcon_es.storage.store import ConcurrencyError, EventStore, Meta, StreamAppend
from tests.conftest import migrate, scratch_mysql

META = Meta(actor="tester")
START = dt.datetime(2026, 11, 1, 8)
#: The start of the head move that reads the head, and of the one that expects it.
READS_HEAD, EXPECTS_HEAD = "UPDATE log_head SET last_seq = LAST_INSERT_ID(", \
    "UPDATE log_head SET last_seq = IF("


def accepted(stream: str) -> ev.TaskAccepted:
    return ev.TaskAccepted(stream, "user-a", {"image": "i"}, "v6e", "2x2", START)


def first(stream: str, events: int = 1) -> list[StreamAppend]:
    """A new stream's first ``events`` events."""
    more = tuple(ev.ClusterChosen("c-1", "gke-a", "2x2", "queue-depth", ())
                 for _ in range(events - 1))
    return [StreamAppend(stream, 0, (accepted(stream), *more), META)]


@pytest.fixture
def mariadb() -> Iterator[str]:
    with scratch_mysql("falcon_head") as url:
        migrate(url)
        yield url


def _engine(url: str, sql_mode: str | None = None, **settings: object) -> Engine:
    engine = db.make_engine(url, Settings(db_url=url, **settings).database)
    if sql_mode is not None:
        sa.event.listen(engine, "connect", lambda dbapi_conn, _record: dbapi_conn.cursor()
                        .execute(f"SET SESSION sql_mode = '{sql_mode}'"))
    return engine


def _sent(engine: Engine, *, probes: bool = False) -> list[str]:
    """Every query the engine's writer sends from now on (a batch is one), the store's
    one question whether the server raises on an overflow left out unless ``probes``."""
    sent: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if probes or statement != store_module._OVERFLOW_PROBE:
            sent.append(statement)
    sa.event.listen(engine, "before_cursor_execute", note)
    return sent


def _log(engine: Engine) -> list[tuple[int, str, int]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(
            "SELECT seq, stream_id, version FROM task_events ORDER BY seq")]


def test_once_the_head_is_known_an_append_is_one_query(mariadb: str) -> None:
    engine = _engine(mariadb)
    store = EventStore(engine, VirtualClock(START))
    try:
        store.append(first("a", 2))
        sent = _sent(engine, probes=True)
        assert [r.seq for r in store.append(first("b", 3))] == [3, 4, 5]
        # The first such append asks once whether the server raises on an overflow.
        assert sent[0] == store_module._OVERFLOW_PROBE
        assert len(sent) == 2 and sent[1].startswith(EXPECTS_HEAD)
        del sent[:]
        assert [r.seq for r in store.append(first("c"))] == [6]
        assert len(sent) == 1 and sent[0].startswith(EXPECTS_HEAD)
        assert store.head() == 6
        assert _log(engine) == [(1, "a", 1), (2, "a", 2), (3, "b", 1), (4, "b", 2), (5, "b", 3),
                                (6, "c", 1)]
    finally:
        engine.dispose()


@pytest.mark.parametrize("sql_mode", ["", "STRICT_TRANS_TABLES", "TRADITIONAL"])
def test_a_head_moved_by_another_writer_costs_a_second_try_never_a_wrong_seq(
        mariadb: str, sql_mode: str) -> None:
    engine, other_engine = _engine(mariadb, sql_mode), _engine(mariadb, sql_mode)
    clock = VirtualClock(START)
    mine, other = EventStore(engine, clock), EventStore(other_engine, clock)
    try:
        mine.append(first("a"))
        other.append(first("b", 2))
        sent = _sent(engine)
        assert [r.seq for r in mine.append(first("c", 2))] == [4, 5]
        # The query expecting the head at 1 stopped at its first statement; the second
        # try read the head.
        assert sent[0].startswith(EXPECTS_HEAD) and sent[1].startswith(READS_HEAD)
        assert _log(engine) == [(1, "a", 1), (2, "b", 1), (3, "b", 2), (4, "c", 1), (5, "c", 2)]
        del sent[:]
        mine.append(first("d"))
        assert len(sent) == 1 and sent[0].startswith(EXPECTS_HEAD)
    finally:
        engine.dispose()
        other_engine.dispose()


def test_a_fence_taken_meanwhile_refuses_the_append_as_before(mariadb: str) -> None:
    engine = _engine(mariadb)
    clock = VirtualClock(START)
    try:
        mine = EventStore(engine, clock, fence=fence.take(engine, "controller-a"))
        mine.append(first("a"))
        taken = fence.take(engine, "controller-b")
        with pytest.raises(FencedOut, match=f"term {taken.term}, held by controller-b"):
            mine.append(first("b"))
        assert _log(engine) == [(1, "a", 1)] and mine.head() == 1
    finally:
        engine.dispose()


def test_a_failed_append_forgets_the_head(mariadb: str) -> None:
    engine = _engine(mariadb)
    store = EventStore(engine, VirtualClock(START))
    try:
        store.append(first("a"))
        with pytest.raises(ConcurrencyError, match="stream a: expected version 0, found 1"):
            store.append(first("a"))
        sent = _sent(engine)
        store.append(first("b"))
        assert sent[0].startswith(READS_HEAD)
        assert _log(engine) == [(1, "a", 1), (2, "b", 1)]
    finally:
        engine.dispose()


def test_with_batches_off_every_append_reads_the_head(mariadb: str) -> None:
    engine = _engine(mariadb, batch_writes=False)
    store = EventStore(engine, VirtualClock(START))
    try:
        store.append(first("a"))
        sent = _sent(engine)
        store.append(first("b"))
        assert sent[0].startswith(READS_HEAD) and not any(
            s.startswith(EXPECTS_HEAD) for s in sent)
        assert _log(engine) == [(1, "a", 1), (2, "b", 1)]
    finally:
        engine.dispose()


def test_a_server_that_would_not_raise_on_an_overflow_always_has_the_head_read(
        mariadb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No server at hand clips an overflowing sum instead of raising; the store asks with
    # a sum that does not overflow, as it would be answered there.
    monkeypatch.setattr(store_module, "_OVERFLOW_PROBE", "SELECT 9223372036854775806 + %s")
    engine = _engine(mariadb)
    store = EventStore(engine, VirtualClock(START))
    try:
        store.append(first("a"))
        sent = _sent(engine)
        store.append(first("b"))
        store.append(first("c"))
        assert [s for s in sent if s.startswith("UPDATE log_head")] == [
            s for s in sent if s.startswith(READS_HEAD)] and len(sent) >= 2
        assert _log(engine) == [(1, "a", 1), (2, "b", 1), (3, "c", 1)]
    finally:
        engine.dispose()
