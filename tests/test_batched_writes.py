"""Writes sent together: on MariaDB the queued writes of a transaction reach the server
in one query, take effect in order, and an error of any of them raises where the
caller is and rolls the whole transaction back; on SQLite each runs at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.storage import batched, db


@pytest.fixture
def engine(bare_db_url: str) -> Iterator[Engine]:
    engine = db.make_engine(bare_db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE pairs (k VARCHAR(20) PRIMARY KEY, v INTEGER)")
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE pairs")
    engine.dispose()


def _mark(engine: Engine) -> str:
    return "?" if engine.dialect.name == "sqlite" else "%s"


def _rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT k, v FROM pairs").all())


def _statements_sent(engine: Engine) -> list[str]:
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute",
                    lambda _c, _cur, statement, *_rest: sent.append(statement))
    return sent


def test_queued_writes_take_effect_in_order(engine: Engine) -> None:
    m = _mark(engine)
    sent = _statements_sent(engine)
    with engine.begin() as conn, batched.collecting(conn):
        batched.send_rows(conn, "INSERT INTO pairs (k, v) VALUES", f"({m}, {m})",
                          [("a", 1), ("b", 2), ("c", 3)])
        assert batched.send(conn, f"UPDATE pairs SET v = v * 10 WHERE k <> {m}", ["c"]) is (
            None if batched.takes_batches(conn) else 2)
        batched.send(conn, f"DELETE FROM pairs WHERE k = {m}", ["a"])
    assert _rows(engine) == {"b": 20, "c": 3}
    writes = [s for s in sent if not s.startswith(("BEGIN", "SELECT"))]
    # MariaDB: the three writes in one query; SQLite: each at once.
    assert len(writes) == (1 if engine.dialect.name == "mysql" else 3)


def test_an_error_of_a_later_statement_raises_and_rolls_everything_back(engine: Engine) -> None:
    m = _mark(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", ("taken", 0))
    with pytest.raises(sa.exc.IntegrityError, match="taken"):
        with engine.begin() as conn, batched.collecting(conn):
            batched.send(conn, f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", ["fresh", 1])
            batched.send(conn, f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", ["taken", 2])
            batched.send(conn, f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", ["after", 3])
    assert _rows(engine) == {"taken": 0}
    # The connection is usable afterwards: no answer was left unread.
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM pairs").scalar_one() == 1


def test_a_statement_past_the_queue_goes_after_what_waits_there(engine: Engine) -> None:
    m = _mark(engine)
    with engine.begin() as conn, batched.collecting(conn):
        batched.send(conn, f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", ["a", 1])
        # A Core statement and a read see the queued write: it was sent before them.
        conn.execute(sa.text("UPDATE pairs SET v = v + 1 WHERE k = :k"), {"k": "a"})
        assert conn.exec_driver_sql("SELECT v FROM pairs").scalar_one() == 2
        batched.send(conn, f"UPDATE pairs SET v = v * 10 WHERE k = {m}", ["a"])
    assert _rows(engine) == {"a": 20}


def test_outside_a_batch_a_write_runs_at_once_and_says_what_it_matched(engine: Engine) -> None:
    m = _mark(engine)
    with engine.begin() as conn:
        batched.send_rows(conn, "INSERT INTO pairs (k, v) VALUES", f"({m}, {m})",
                          [("a", 1), ("b", 2)])
        assert batched.send(conn, f"UPDATE pairs SET v = {m}", [7]) == 2
    assert _rows(engine) == {"a": 7, "b": 7}


def test_a_long_queue_is_sent_before_it_outgrows_one_packet(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batched, "FLUSH_CHARACTERS", 200)
    m = _mark(engine)
    sent = _statements_sent(engine)
    with engine.begin() as conn, batched.collecting(conn):
        for n in range(20):
            batched.send(conn, f"INSERT INTO pairs (k, v) VALUES ({m}, {m})", [f"k{n:02d}", n])
    assert len(_rows(engine)) == 20
    writes = [s for s in sent if s.startswith("INSERT")]
    if engine.dialect.name == "mysql":
        assert 1 < len(writes) < 20
        assert all(len(s) < 200 + 60 for s in writes)
    else:
        assert len(writes) == 20


def test_the_reader_pool_takes_one_statement_per_query(bare_db_url: str) -> None:
    """Only the writer's connections take batches: reads have nothing to batch."""
    engine = db.make_engine(bare_db_url)
    try:
        with db.read_only(engine).connect() as conn:
            assert not batched.takes_batches(conn)
        with engine.connect() as conn:
            assert batched.takes_batches(conn) == (engine.dialect.name == "mysql")
    finally:
        engine.dispose()


def test_batches_can_be_turned_off_for_a_proxy_that_refuses_them(bare_db_url: str) -> None:
    """``FALCON_DB_BATCH_WRITES=false``: every write goes alone, in a batch's block too."""
    from falcon_es.config.settings import Settings

    limits = Settings.of(db_url=bare_db_url, batch_writes=False).database
    engine = db.make_engine(bare_db_url, limits)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE solo (k VARCHAR(20) PRIMARY KEY)")
        sent = _statements_sent(engine)
        m = _mark(engine)
        with engine.begin() as conn, batched.collecting(conn):
            assert not batched.takes_batches(conn)
            batched.send(conn, f"INSERT INTO solo (k) VALUES ({m})", ["a"])
            batched.send(conn, f"INSERT INTO solo (k) VALUES ({m})", ["b"])
        assert len([s for s in sent if s.startswith("INSERT")]) == 2
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE solo")
        engine.dispose()
