"""MySQL connections: pinged before use only after sitting idle, and a connection the
server dropped meanwhile is replaced instead of failing the caller."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from falcon_es.storage import db


def _pinged_checkouts(engine: sa.Engine) -> list[bool]:
    seen: list[bool] = []
    sa.event.listen(engine.pool, "checkout",
                    lambda _c, record, _p: seen.append(bool(record.info.get(db.PINGED))))
    return seen


def test_a_connection_back_within_the_idle_window_is_not_pinged(mysql_url: str) -> None:
    engine = db.make_engine(mysql_url)
    try:
        seen = _pinged_checkouts(engine)
        for _ in range(3):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert seen == [True, False, False], "a new connection is pinged once, then reused"
    finally:
        engine.dispose()


def test_a_connection_dropped_while_idle_is_replaced(mysql_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    engine = db.make_engine(mysql_url)
    admin = db.make_engine(mysql_url)
    try:
        with engine.connect() as conn:
            dropped = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"KILL CONNECTION {int(dropped)}")
        monkeypatch.setattr(db, "IDLE_PING_SECONDS", 0.0)  # it has now sat idle long enough
        seen = _pinged_checkouts(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar() != dropped
        assert seen and seen[-1] is True
    finally:
        engine.dispose()
        admin.dispose()


def test_sqlite_connections_are_never_pinged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = db.make_engine(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        seen = _pinged_checkouts(engine)
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        assert seen == [False]
    finally:
        engine.dispose()
