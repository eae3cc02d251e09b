"""The writer's literals: the same text PyMySQL's own escaping gives, for any string and
naive datetime, and values that come back from MariaDB as they went in (batched, so
every one of them is a literal in the query)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql import converters
from pymysql.constants import SERVER_STATUS
from sqlalchemy.engine import Engine

from falcon_es.storage import batched, db, literals, transaction_ends
from tests.conftest import scratch_mysql

#: Text rich in what MySQL string literals escape, between runs of any other text.
_AWKWARD = st.lists(st.sampled_from(list("\\\0\n\r\x1a'\"%"))
                    | st.text(st.characters(exclude_categories=("Cs",)), max_size=3),
                    max_size=20).map("".join)


@given(_AWKWARD)
def test_a_string_is_escaped_as_pymysql_escapes_it(text: str) -> None:
    assert literals.escape_text(text) == converters.escape_string(text)


@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)))
def test_a_naive_datetime_literal_is_pymysqls(moment: dt.datetime) -> None:
    assert (literals.Connection.escape(_Unconnected(), moment)
            == converters.escape_datetime(moment))


class _Unconnected(literals.Connection):
    """Just enough of a connection to make literals: backslash escapes on, PyMySQL's
    own encoders."""

    def __init__(self) -> None:  # no server to connect to
        self.server_status = 0
        self.encoders = dict(converters.encoders)
        self.encoding = "utf8mb4"
        self.own_literals = True


def test_every_literal_is_pymysqls() -> None:
    connection = _Unconnected()
    aware = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc)
    for value in (None, 7, -2**70, 2.5, True, b"\x00'", aware, dt.date(2026, 1, 2), ("a", 1),
                  "it's", dt.datetime(2026, 1, 2, 3, 4, 5)):
        assert connection.escape(value) == pymysql_escape(connection, value)


def test_a_caller_encoder_or_no_backslash_escapes_leaves_every_literal_to_pymysql() -> None:
    quoting = _Unconnected()
    quoting.server_status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
    assert quoting.escape("it's \\") == "'it''s \\'"


def test_a_connection_given_encoders_of_its_own_leaves_literals_to_them(engine: Engine) -> None:
    url = engine.url
    quoted = {**converters.conversions, int: lambda value, _mapping=None: f"'{value}'"}
    connection = literals.Connection(host=url.host, port=url.port or 3306, user=url.username,
                                     password=url.password or "", database=url.database,
                                     conv=quoted)
    try:
        assert not connection.own_literals
        assert connection.escape(7) == "'7'"
    finally:
        connection.close()


def pymysql_escape(connection: literals.Connection, value: object) -> str:
    return str(super(literals.Connection, connection).escape(value))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with scratch_mysql("falcon_literals") as url:
        engine = db.make_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE texts (k INTEGER PRIMARY KEY, v TEXT, "
                                 "at DATETIME(6)) CHARACTER SET utf8mb4")
        yield engine
        engine.dispose()


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.tuples(_AWKWARD, st.datetimes(min_value=dt.datetime(1000, 1, 1),
                                                      max_value=dt.datetime(9999, 12, 31))),
                       min_size=1, max_size=8))
def test_values_written_in_a_batch_read_back_unchanged(
        engine: Engine, values: list[tuple[str, dt.datetime]]) -> None:
    with engine.begin() as conn, batched.collecting(conn):
        writer = conn.connection.dbapi_connection
        assert isinstance(writer, transaction_ends.Connection) and writer.own_literals
        batched.send(conn, "DELETE FROM texts")
        batched.send_rows(conn, "INSERT INTO texts (k, v, at) VALUES", "(%s, %s, %s)",
                          [(i, text, at) for i, (text, at) in enumerate(values)])
    with engine.connect() as conn:
        back = conn.execute(sa.text("SELECT v, at FROM texts ORDER BY k")).all()
    assert [tuple(row) for row in back] == values
