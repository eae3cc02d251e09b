"""The writer's MySQL/MariaDB connections end a transaction only when one may be open:
no ROLLBACK when the pool takes back a connection whose transaction committed, no
second COMMIT after a batch that ended with its own; a connection that ran anything
since its last end still ends it. Counted by the server itself (its session status)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.bench.round_trips import StatementCounter
from falcon_es.storage import batched, db
from tests.conftest import scratch_mysql


@pytest.fixture
def engine() -> Iterator[Engine]:
    """The writer on one connection, so every step is the same server session."""
    with scratch_mysql("falcon_ends") as url:
        engine = db.make_engine(url, pool_size=1, max_overflow=0)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE pairs (k VARCHAR(20) PRIMARY KEY, v INTEGER)")
        yield engine
        engine.dispose()


def _ends(engine: Engine) -> tuple[int, int]:
    """(COMMITs, ROLLBACKs) the session ran so far. Reading them is a statement: the
    connection's return after it sends one ROLLBACK, counted by the next reading."""
    with engine.connect() as conn:
        found = dict(conn.exec_driver_sql(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Com_commit', 'Com_rollback')").all())
    return int(found["Com_commit"]), int(found["Com_rollback"])


def _since(engine: Engine, before: tuple[int, int]) -> tuple[int, int]:
    commits, rollbacks = _ends(engine)
    return commits - before[0], rollbacks - before[1] - 1  # the reading's own ROLLBACK


def _rows(engine: Engine) -> dict[str, int]:
    with db.read_only(engine).connect() as conn:
        return dict(conn.exec_driver_sql("SELECT k, v FROM pairs").all())


def test_a_committed_transaction_goes_back_to_the_pool_without_a_rollback(
        engine: Engine) -> None:
    before = _ends(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO pairs (k, v) VALUES (%s, %s)", ("a", 1))
    assert _since(engine, before) == (1, 0)
    assert _rows(engine) == {"a": 1}


def test_a_connection_that_ran_anything_since_its_last_end_still_ends_it(
        engine: Engine) -> None:
    """A read opens a transaction (autocommit is off): giving the connection back
    rolls it back, or the next user would inherit it."""
    before = _ends(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT COUNT(*) FROM pairs").scalar_one()
    assert _since(engine, before) == (0, 1)


def test_a_batch_ending_in_its_commit_is_the_transaction_s_only_commit(engine: Engine) -> None:
    before = _ends(engine)
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute",
                    lambda _c, _cur, statement, *_rest: sent.append(statement))
    with engine.begin() as conn, batched.collecting(conn):
        batched.send(conn, "INSERT INTO pairs (k, v) VALUES (%s, %s)", ["a", 1])
        batched.send(conn, "UPDATE pairs SET v = v + 1 WHERE k = %s", ["a"])
        batched.end_with_commit(conn)
    assert len(sent) == 1 and sent[0].endswith("COMMIT")
    assert _since(engine, before) == (1, 0)
    assert _rows(engine) == {"a": 2}


def test_a_batch_that_fails_before_its_commit_commits_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO pairs (k, v) VALUES (%s, %s)", ("taken", 0))
    before = _ends(engine)
    with pytest.raises(sa.exc.IntegrityError, match="taken"):
        with engine.begin() as conn, batched.collecting(conn):
            batched.send(conn, "INSERT INTO pairs (k, v) VALUES (%s, %s)", ["fresh", 1])
            batched.send(conn, "INSERT INTO pairs (k, v) VALUES (%s, %s)", ["taken", 2])
            batched.end_with_commit(conn)
    assert _since(engine, before) == (0, 1)  # the server stopped at the error: rolled back
    assert _rows(engine) == {"taken": 0}
    with engine.begin() as conn:  # and the connection goes on
        conn.exec_driver_sql("INSERT INTO pairs (k, v) VALUES (%s, %s)", ("next", 3))
    assert _rows(engine) == {"taken": 0, "next": 3}


def test_round_trips_count_the_pool_s_rollback_only_where_it_is_sent(engine: Engine) -> None:
    """A plain PyMySQL engine's pool rolls back every connection given back: a round
    trip the count includes; the writer's sends none after a commit."""
    plain = sa.create_engine(engine.url)
    try:
        for each, rollbacks in ((plain, 1), (engine, 0)):
            with StatementCounter(each) as counter:
                with each.begin() as conn:
                    conn.exec_driver_sql("UPDATE pairs SET v = 0")
            assert (counter.commits, counter.rollbacks) == (1, rollbacks)
    finally:
        plain.dispose()
