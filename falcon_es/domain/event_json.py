"""The JSON form of event fields whose Python form differs: datetimes travel as ISO
text, tuples as lists. Generic over frozen dataclasses, so ``events`` keeps only the
event types and their registry, and any record type can share the rules."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import typing
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
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


def _datetime_text(value: Any) -> Any:
    """What ``to_json`` makes of a datetime, for the encoder (which lists tuples itself)."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _fields_encoder() -> Callable[[Any], str]:
    """``json.dumps`` with the standard library's own C encoder built once, not once a
    call (building it cost twice what encoding an event's few fields does); the pure
    Python encoder where the C one is missing. Either gives ``json.dumps``'s text."""
    if c_make_encoder is None:
        return json.JSONEncoder(default=_datetime_text).encode
    # JSONEncoder().iterencode's own arguments: no circular check (fields are trees),
    # ASCII escaping, no indent, the default separators, unsorted, no skipped keys,
    # NaN allowed.
    chunks = c_make_encoder(None, _datetime_text, encode_basestring_ascii, None, ": ", ", ",
                            False, False, True)
    return lambda fields: "".join(chunks(fields, 0))


#: The JSON text of a record's fields (an event's instance dict, a meta dict): the same
#: text, byte for byte, as ``json.dumps`` of the fields each passed through ``to_json``
#: (tuples become lists, datetimes ISO text), without building the converted dict.
fields_text = _fields_encoder()


def _value_decoder() -> Callable[[str], Any]:
    """``json.loads`` of stored data by the standard library's own C scanner, called
    directly: ``loads`` wraps it in a decoder that matches whitespace with regular
    expressions on both sides, a third of a replay's decoding. Text the scanner does
    not take whole (whitespace around it, anything malformed) goes to ``json.loads``,
    which decodes it or says what is wrong, as before."""
    decoder: Any = json.JSONDecoder()  # ``scan_once`` is not in the type stubs
    scan: Callable[[str, int], tuple[Any, int]] = decoder.scan_once
    loads = json.loads

    def value_of(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except (StopIteration, ValueError):
            return loads(text)
        return value if end == len(text) else loads(text)

    return value_of


#: The value of a stored JSON text, as ``json.loads`` gives it (the replay's decoder).
json_value = _value_decoder()


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
