"""Where the upper layer keeps its tasks: the job table's name and the names of the
columns Falcon-ES reads and writes in it.

The upper layer owns that table and may have named it and its columns otherwise, so
both are settings: ``FALCON_JOB_TABLE`` (``job``, or ``schema.table`` for a table in
another MySQL/MariaDB database on the same server) and ``FALCON_JOB_COLUMNS``, the
renamed columns as ``falcon_name=table_name`` pairs separated by commas
(``status=state,message=msg``). Columns not named keep Falcon-ES's name. Plain Python
(no SQLAlchemy), so reading the settings stays cheap for every command.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.config.errors import SettingsError

TABLE_VARIABLE = "FALCON_JOB_TABLE"
COLUMNS_VARIABLE = "FALCON_JOB_COLUMNS"
DEFAULT_TABLE = "job"

#: Every column Falcon-ES reads or writes in the job table, by Falcon-ES's own name.
JOB_COLUMNS = (
    "id", "name", "actor", "spec", "status", "reason", "message", "created_at",
    "updated_at", "aborting_at", "aborted_at", "cluster_id", "node_pool_name", "job_uid",
    "dispatched_at", "finished_at",
)
#: Columns the upper layer may add to ask for a waiting task's priority to change
#: (``FALCON_JOB_PRIORITY_REQUESTS=true``): the priority wanted, when it was asked (the
#: inbox reads the rows asked since its last look, by an index on this column) and who
#: asked. Falcon-ES only reads them.
PRIORITY_COLUMNS = ("priority", "priority_requested_at", "priority_requested_by")
#: A name Falcon-ES will put into SQL: what MySQL accepts unquoted (letters, digits,
#: ``_`` and ``$``, not starting with a digit), at most 64 characters as MySQL allows.
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,63}")
_IDENTIFIER_RULE = ("letters, digits, _ and $, not starting with a digit, "
                    "at most 64 characters")


class JobMappingError(SettingsError):
    """A job-table setting cannot be used; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class JobMapping:
    """The job table's name (and database, when it lives in another one) and the
    columns it names differently from Falcon-ES, as (Falcon-ES name, table's name)."""

    table: str = DEFAULT_TABLE
    schema: str | None = None
    renamed: tuple[tuple[str, str], ...] = ()
    #: Whether the table has the ``PRIORITY_COLUMNS`` (priority change requests;
    #: ``FALCON_JOB_PRIORITY_REQUESTS``, a feature switch).
    priority_requests: bool = False

    def column(self, name: str) -> str:
        """The table's name for one of Falcon-ES's columns."""
        for falcon, theirs in self.renamed:
            if falcon == name:
                return theirs
        return name

    @property
    def columns(self) -> Mapping[str, str]:
        """Falcon-ES name -> the table's name, for every column Falcon-ES uses."""
        return MappingProxyType({name: self.column(name) for name in self.used})

    @property
    def used(self) -> tuple[str, ...]:
        """Falcon-ES's names of the columns it uses in this table."""
        return (*JOB_COLUMNS, *PRIORITY_COLUMNS) if self.priority_requests else JOB_COLUMNS

    @property
    def qualified(self) -> str:
        """The table as a user writes it: ``schema.table`` or ``table``."""
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def columns_text(self) -> str:
        """The renamed columns as ``FALCON_JOB_COLUMNS`` writes them."""
        return ",".join(f"{falcon}={theirs}" for falcon, theirs in self.renamed)

    @classmethod
    def parse(cls, table: str | None, columns: str | None, *,
              priority_requests: bool = False) -> JobMapping:
        """The mapping from the two settings' text (None or empty: the defaults)."""
        schema, name = _table(table.strip() if table else "", f"{TABLE_VARIABLE}=")
        return cls(table=name, schema=schema, renamed=_columns(columns or ""),
                   priority_requests=priority_requests)

    def with_table(self, raw: str, source: str) -> JobMapping:
        """The same columns in another table (``raw`` as ``FALCON_JOB_TABLE`` takes
        it); ``source`` names where ``raw`` came from in an error (``--table ``)."""
        schema, name = _table(raw.strip(), source)
        return dataclasses.replace(self, table=name, schema=schema)


def check_table(value: Any) -> str:
    """``FALCON_JOB_TABLE`` as given, once it names a table Falcon-ES can use."""
    text = str(value or "").strip() or DEFAULT_TABLE
    _table(text, f"{TABLE_VARIABLE}=")
    return text


def check_columns(value: Any) -> str:
    """``FALCON_JOB_COLUMNS`` as given, once its pairs are columns Falcon-ES can use."""
    text = str(value or "").strip()
    _columns(text)
    return text


def _table(raw: str, source: str) -> tuple[str | None, str]:
    if not raw:
        return None, DEFAULT_TABLE
    parts = raw.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(p) for p in parts):
        raise JobMappingError(
            f"{source}{raw!r}: expected a table name or database.table "
            f"({_IDENTIFIER_RULE})")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def _columns(raw: str) -> tuple[tuple[str, str], ...]:
    renamed: dict[str, str] = {}
    for pair in (p.strip() for p in raw.split(",")):
        if not pair:
            continue
        falcon, sep, theirs = (part.strip() for part in pair.partition("="))
        if not sep or not falcon or not theirs:
            raise JobMappingError(
                f"{COLUMNS_VARIABLE}={raw!r}: expected falcon_name=table_name pairs "
                f"separated by commas, found {pair!r}")
        if falcon not in (*JOB_COLUMNS, *PRIORITY_COLUMNS):
            raise JobMappingError(
                f"{COLUMNS_VARIABLE}={raw!r}: {falcon!r} is not a column Falcon-ES uses; "
                f"expected one of {', '.join((*JOB_COLUMNS, *PRIORITY_COLUMNS))}")
        if falcon in renamed:
            raise JobMappingError(f"{COLUMNS_VARIABLE}={raw!r}: {falcon!r} is mapped twice")
        if not _IDENTIFIER.fullmatch(theirs):
            raise JobMappingError(
                f"{COLUMNS_VARIABLE}={raw!r}: {theirs!r} is not a column name "
                f"({_IDENTIFIER_RULE})")
        renamed[falcon] = theirs
    # MySQL compares column names without regard to case, so two columns whose names
    # differ only in case would be one column there.
    owners: dict[str, str] = {}
    for falcon in (*JOB_COLUMNS, *PRIORITY_COLUMNS):
        theirs = renamed.get(falcon, falcon).lower()
        if theirs in owners:
            raise JobMappingError(
                f"{COLUMNS_VARIABLE}={raw!r}: {owners[theirs]} and {falcon} would both be "
                f"column {renamed.get(falcon, falcon)!r}")
        owners[theirs] = falcon
    return tuple((falcon, renamed[falcon]) for falcon in (*JOB_COLUMNS, *PRIORITY_COLUMNS)
                 if falcon in renamed
                 and renamed[falcon] != falcon)
