"""Times as database drivers return them, made the naive UTC datetimes Falcon-ES keeps.

Plain Python (no SQLAlchemy): the intake reads the upper layer's columns with it, and
so do the command line's reads that go through the driver alone
(``falcon_es.jobtable.job_reads``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any


def as_timestamp(value: Any) -> dt.datetime | None:
    """A DATETIME as the driver returns it: text on SQLite (SQLAlchemy's storage
    format, which ``fromisoformat`` reads; so does a text column holding ISO times), a
    datetime from PyMySQL. A time with a zone becomes naive UTC, as Falcon-ES keeps
    times; None for what is not a time at all (for the caller to refuse)."""
    if type(value) is dt.datetime:
        return value if value.tzinfo is None else _naive_utc(value)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is None else _naive_utc(parsed)
    return None


def _naive_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
