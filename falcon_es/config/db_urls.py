"""Database URLs without SQLAlchemy: the default, and what a command needs to open
the database with its driver alone.

Reading the settings and answering ``task list`` must not import SQLAlchemy (its import
alone takes most of the time a command may take), so the URLs those paths need are
read here with the standard library. Anything this module does not recognise
(``driver_target`` returns None) goes through SQLAlchemy as before.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_URL = "sqlite:///falcon.db"
#: Query parameters of a MySQL/MariaDB URL the driver-only path understands.
_MYSQL_OPTIONS = frozenset({"charset"})


@dataclasses.dataclass(frozen=True)
class SqliteTarget:
    """A SQLite database file (``:memory:`` for none)."""

    path: str


@dataclasses.dataclass(frozen=True)
class MysqlTarget:
    """A MySQL/MariaDB server and database, as PyMySQL's ``connect`` takes them."""

    host: str
    port: int
    user: str | None
    password: str | None
    database: str | None
    charset: str = "utf8mb4"


def driver_target(url: str) -> SqliteTarget | MysqlTarget | None:
    """Where ``url`` points, for a plain driver connection: ``sqlite:///path`` (no
    query) or ``mysql+pymysql://user:password@host:port/database[?charset=...]``; None
    for any other URL (its command then opens it through SQLAlchemy)."""
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        if not rest.startswith("/") or "?" in rest:
            return None
        path = rest[1:]
        return SqliteTarget(path or ":memory:")
    if scheme not in ("mysql+pymysql", "mariadb+pymysql"):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError:
        return None
    options = dict(parse_qsl(parts.query))
    if not parts.hostname or set(options) - _MYSQL_OPTIONS or parts.fragment:
        return None
    database = unquote(parts.path.lstrip("/")) or None
    return MysqlTarget(
        host=parts.hostname, port=port,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=database, charset=options.get("charset", "utf8mb4"))
