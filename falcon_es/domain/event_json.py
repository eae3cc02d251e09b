"""The JSON form of event fields whose Python form differs: datetimes travel as ISO
text, tuples as lists. Generic over frozen dataclasses, so ``events`` keeps only the
event types and their registry, and any record type can share the rules."""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Callable
from typing import Any

#: (field name, from-JSON conversion) for each field that needs one.
Conversions = tuple[tuple[str, Callable[[Any], Any]], ...]


def to_json(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    return value


def conversions(cls: type) -> Conversions:
    """Fields whose JSON form differs from their Python form (datetimes, tuples)."""
    found: list[tuple[str, Callable[[Any], Any]]] = []
    for name, hint in typing.get_type_hints(cls).items():
        text = str(hint)
        if "ClassVar" in text:
            continue
        if "datetime" in text:
            found.append((name, parse_datetime))
        elif "tuple" in text:
            found.append((name, tuple))
    return tuple(found)


def parse_datetime(value: Any) -> Any:
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value
