"""PyMySQL connections that write values into SQL faster, to the letter as PyMySQL does.

Every value of a batch (``falcon_es.storage.batched``) becomes a literal in the query
PyMySQL sends: an append writes hundreds, most of them JSON. PyMySQL escapes a string
with ``str.translate`` over a table whose entries for ``"`` and ``'`` are two characters
long, which takes CPython's translate off its fast path for the rest of the string: a
JSON text, full of ``"``, is then escaped a character at a time in Python objects (a
sixth of the writer's driver time). Replacing each character that needs it, only when
present, is done by ``str.replace`` in C, and gives the same text. A naive datetime's
literal is its ``isoformat``, as PyMySQL's own format gives it; an integer's its
``str`` and None's ``NULL``, without PyMySQL's dispatch through its encoders (four calls
a value).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pymysql
from pymysql import converters
from pymysql.constants import SERVER_STATUS

#: What PyMySQL's escape table replaces, the backslash first (so that the backslashes
#: the others put in are not doubled).
_REPLACED = (("\\", "\\\\"), ("\0", "\\0"), ("\n", "\\n"), ("\r", "\\r"), ("\x1a", "\\Z"),
             ("'", "\\'"), ('"', '\\"'))


def escape_text(text: str) -> str:
    """``text`` escaped as PyMySQL's ``converters.escape_string`` escapes it (without
    the quotes), with backslash escapes on."""
    for char, escaped in _REPLACED:
        if char in text:
            text = text.replace(char, escaped)
    return text


#: The types whose literals are made here while the connection's encoders for them are
#: PyMySQL's own (a caller's ``conv`` may have replaced them: then PyMySQL makes all).
_OWN = (str, int, type(None), dt.datetime)
_NO_BACKSLASH_ESCAPES = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES


class Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """A PyMySQL connection whose literals of strings, integers, NULL and naive
    datetimes are made in C, the rest by PyMySQL."""

    #: Whether the encoders of ``_OWN`` are PyMySQL's defaults (set once connected).
    own_literals = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own_literals = all(self.encoders.get(kind) is converters.encoders[kind]
                                for kind in _OWN)

    def escape(self, obj: Any, mapping: Any = None) -> str:
        if self.own_literals and (mapping is None or mapping is self.encoders):
            kind = type(obj)
            if kind is str:
                if not self.server_status & _NO_BACKSLASH_ESCAPES:
                    return f"'{escape_text(obj)}'"
            elif kind is int:
                return str(obj)
            elif obj is None:
                return "NULL"
            elif kind is dt.datetime and obj.tzinfo is None:
                return f"'{obj.isoformat(' ')}'"
        return str(super().escape(obj, mapping))
