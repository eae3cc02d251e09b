"""What every ``falcon-es`` command shares: one line and a meaningful exit code for
the errors a user can cause, tables or JSON for the output, and the database, the log,
the application and the gcp backend built in one place each.

Exit codes: 0 success, 1 the command ran and found a problem (a replay difference, a
failed check), 2 bad input, 3 the database cannot be used.

Every command starts by importing this module, so it imports only click: what builds
the database, the log or the application is imported by the function that builds it,
and a command that only reads the job table never loads the controller's modules.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

if TYPE_CHECKING:  # types only: each is imported by the function that builds it
    from sqlalchemy.engine import Engine
    from sqlalchemy.exc import DBAPIError

    from falcon_es.adapters.gcp.wiring import GcpBackend
    from falcon_es.app.application import App
    from falcon_es.domain.ports import Ports
    from falcon_es.config.settings import Settings
    from falcon_es.storage.store import EventStore
    from falcon_es.storage.tables import JobTable

EXIT_PROBLEM, EXIT_BAD_INPUT, EXIT_DATABASE = 1, 2, 3
P = ParamSpec("P")
R = TypeVar("R")


class Failure(click.ClickException):
    """One clear line for the user, and an exit code that means something."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        # click declares exit_code a ClassVar but reads it from the raised instance.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"falcon-es: {self.message}", err=True)


#: The errors a user can cause (module, class): each becomes one line and exit code 2.
USER_ERRORS = (
    ("falcon_es.storage.registry", "RegistryError"), ("falcon_es.jobtable.job_rows", "JobRowError"),
    ("falcon_es.config.settings", "SettingsError"), ("falcon_es.adapters.sim.config", "SimConfigError"),
    ("falcon_es.storage.db", "DatabaseUrlError"), ("falcon_es.domain.tpu", "TopologyError"),
)


def loaded_classes(names: Sequence[tuple[str, str]]) -> tuple[type[BaseException], ...]:
    """The classes named whose modules this process has imported. An exception can only
    come from a module that was imported, so a command catches the errors of every
    module without importing any of them (the sim world's config, the registry)."""
    found = (getattr(sys.modules[module], name, None) for module, name in names
             if module in sys.modules)
    # getattr finds nothing in a module whose import failed before defining the class.
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def friendly(func: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors users can cause into one line each, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Exception as error:
            failure = _failure_of(error)
            if failure is None:
                raise
            raise failure from error

    return wrapper


def _failure_of(error: Exception) -> Failure | None:
    if isinstance(error, loaded_classes(USER_ERRORS)):
        return Failure(str(error))
    if "sqlalchemy.exc" not in sys.modules:  # not a database error, then
        return None
    from sqlalchemy import exc

    if isinstance(error, (exc.OperationalError, exc.ProgrammingError)):
        return Failure(_database_problem(error), EXIT_DATABASE)
    if isinstance(error, (exc.DataError, exc.IntegrityError)):
        return Failure(f"the database refused a value: {first_line(error)}")
    return None


def first_line(error: DBAPIError) -> str:
    """The driver's own words, without SQLAlchemy's statement and parameters."""
    return (str(error.orig) if error.orig else str(error)).strip().splitlines()[0]


def _database_problem(error: DBAPIError) -> str:
    return database_problem(first_line(error))


def database_problem(text: str) -> str:
    """The driver's words about a database it cannot use, with what to do when the
    schema is missing."""
    if "no such table" in text or "doesn't exist" in text:
        return f"the database has no Falcon-ES schema ({text}); run: falcon-es db upgrade"
    return f"database error: {text}"


# ----------------------------------------------------------------------- what commands build


def engine_of(ctx: click.Context) -> Engine:
    """The database of this invocation, opened on first use (``--help`` never connects)
    and disposed with the context: all that the commands reading or writing tables
    directly need (the job table, the registry), without the log's projections."""
    engine: Engine | None = ctx.obj.get("engine")
    if engine is None:
        from falcon_es.storage import db

        engine = db.make_engine(settings_of(ctx).database.db_url)
        ctx.obj["engine"] = engine
        ctx.call_on_close(engine.dispose)
    return engine


def store_of(ctx: click.Context) -> EventStore:
    """The log alone, for the commands that only read it (``history``, ``events``,
    ``queues``): they fold what they show themselves, so no inline projection is built."""
    from falcon_es.domain.clock import WallClock
    from falcon_es.storage.store import EventStore

    return EventStore(engine_of(ctx), WallClock())


def app_of(ctx: click.Context) -> App:
    """The application of this invocation (the store with its inline projections, for
    commands that append to the log or rebuild what it projects), opened on first use
    on this invocation's database and closed with the context."""
    app: App | None = ctx.obj.get("app")
    if app is None:
        from falcon_es.app.application import open_app

        app = open_app(settings_of(ctx), engine=engine_of(ctx))
        ctx.obj["app"] = app
        ctx.call_on_close(app.close)
    return app


def job_of(ctx: click.Context) -> JobTable:
    """The upper layer's job table under the names of this invocation's mapping
    (``FALCON_JOB_TABLE``, ``FALCON_JOB_COLUMNS``)."""
    from falcon_es.storage.tables import JobTable

    return JobTable(settings_of(ctx).job_mapping)


def settings_of(ctx: click.Context) -> Settings:
    """The settings of this invocation: the environment with the global flags applied."""
    settings: Settings = ctx.obj["settings"]
    return settings


def gcp_ports(settings: Settings) -> Ports:
    """The ports of ``run --backend gcp``, built once for every leadership term."""
    from falcon_es.app.bootstrap import gcp_ports as build_gcp_ports
    from falcon_es.domain.clock import WallClock

    return build_gcp_ports(settings, WallClock())


def gcp_backend(settings: Settings) -> GcpBackend:
    """The gcp backend's clients themselves, for commands that use some of them directly
    (the informer's watches, ``clusters --live``); the caller closes it."""
    from falcon_es.adapters.gcp import build_gcp_backend

    return build_gcp_backend(settings)


# ----------------------------------------------------------------------- output


def emit(rows: Sequence[Mapping[str, Any]], as_json: bool, columns: Sequence[str] | None = None) -> None:
    """Rows as a table for people, or as a JSON list for scripts (``--json``)."""
    if as_json:
        click.echo(json.dumps([jsonable(r) for r in rows], indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("(none)")
        return
    columns = columns or list(rows[0].keys())
    click.echo(table_text(columns, [[cell(r.get(c)) for c in columns] for r in rows]))


def table_text(headers: Sequence[str], table: Sequence[Sequence[object]]) -> str:
    """A plain text table: a header, a rule of dashes, a line per row, two spaces
    between columns; a column of numbers aligned right, any other left, text shown as
    written (a name such as "12e4" stays one). Written here rather than imported:
    loading a table library cost a listing a tenth of its time."""
    texts = [[_table_cell(value) for value in row] for row in table]
    right = [bool(table) and all(_is_number(row[i]) for row in table)
             for i in range(len(headers))]
    widths = [max([len(h), *(len(row[i]) for row in texts)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(text.rjust(width) if is_right else text.ljust(width)
                         for text, width, is_right in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, texts)])


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table_cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with its times in ISO form, which ``json.dumps`` cannot write itself."""
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def cell(value: object) -> object:
    """A value as a table shows it: times to the second, nothing for None, JSON for
    nested values."""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return value
