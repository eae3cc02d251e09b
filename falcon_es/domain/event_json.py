"""The JSON form of event fields whose Python form differs: datetimes travel as ISO
text, tuples as lists. Generic over frozen dataclasses, so ``events`` keeps only the
event types and their registry, and any record type can share the rules."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import typing
from collections.abc import Callable
from typing import Any

#: (field name, from-JSON conversion) for each field that needs one.
Conversions = tuple[tuple[str, Callable[[Any], Any]], ...]
#: Builds a record from its data in JSON form.
Reader = Callable[[dict[str, Any]], Any]


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


def reader(cls: type, conversions: Conversions) -> Reader:
    """``cls(**data)`` of data in JSON form (``conversions`` applied first), worked out
    once a class: without the frozen ``__init__`` when it only stores its arguments (no
    ``__post_init__``) and the data name exactly its fields (``__init__`` otherwise
    fills in defaults or refuses), and without a copy of the data when nothing in it
    needs converting."""
    names = (None if hasattr(cls, "__post_init__")
             else frozenset(f.name for f in dataclasses.fields(cls)))
    if conversions:
        return functools.partial(_converted, cls, conversions, names)
    if names is None:
        return functools.partial(_by_init, cls)
    return functools.partial(_filled, cls, names)


def _by_init(cls: type, data: dict[str, Any]) -> Any:
    return cls(**data)


def _filled(cls: type, names: frozenset[str], data: dict[str, Any]) -> Any:
    if data.keys() == names:
        record: Any = object.__new__(cls)
        record.__dict__.update(data)
        return record
    return cls(**data)


def _converted(cls: type, conversions: Conversions, names: frozenset[str] | None,
               data: dict[str, Any]) -> Any:
    out = dict(data)
    for name, convert in conversions:
        value = out.get(name)
        if value is not None:
            out[name] = convert(value)
    if names is None or out.keys() != names:
        return cls(**out)
    record: Any = object.__new__(cls)
    object.__setattr__(record, "__dict__", out)  # a copy of its own: no second one
    return record
