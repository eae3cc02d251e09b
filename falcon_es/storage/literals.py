"""PyMySQL connections that write strings and datetimes into SQL faster, to the letter
as PyMySQL does.

Every value of a batch (``falcon_es.storage.batched``) becomes a literal in the query
PyMySQL sends: an append writes hundreds, most of them JSON. PyMySQL escapes a string
with ``str.translate`` over a table whose entries for ``"`` and ``'`` are two characters
long, which takes CPython's translate off its fast path for the rest of the string: a
JSON text, full of ``"``, is then escaped a character at a time in Python objects (a
sixth of the writer's driver time). Replacing each character that needs it, only when
present, is done by ``str.replace`` in C, and gives the same text. A naive datetime's
literal is its ``isoformat``, as PyMySQL's own format gives it.
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


class Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """A PyMySQL connection whose string and naive-datetime literals are made in C."""

    def escape(self, obj: Any, mapping: Any = None) -> str:
        kind = type(obj)
        if kind is str:
            if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                return str(super().escape(obj, mapping))
            return f"'{escape_text(obj)}'"
        if (kind is dt.datetime and obj.tzinfo is None
                and (mapping is None or mapping is self.encoders)
                and self.encoders.get(dt.datetime) is converters.escape_datetime):
            return f"'{obj.isoformat(' ')}'"
        return str(super().escape(obj, mapping))
