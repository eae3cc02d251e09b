"""A second controller against the same database is refused with a clear message."""

from __future__ import annotations

import pytest

from falcon_es.storage import db
from falcon_es.engine.leader import AlreadyRunning, DatabaseLock


def test_second_controller_is_refused_then_allowed_after_release(db_url: str) -> None:
    first_engine, second_engine = db.make_engine(db_url), db.make_engine(db_url)
    first = DatabaseLock(first_engine)
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning, match="already"):
            DatabaseLock(second_engine).acquire()
    finally:
        first.release()
    with DatabaseLock(second_engine):
        pass
    first_engine.dispose()
    second_engine.dispose()
