"""What every ``falcon-es`` command shares: one line and a meaningful exit code for
the errors a user can cause, tables or JSON for the output, and the application and
the gcp backend built in one place each.

Exit codes: 0 success, 1 the command ran and found a problem (a replay difference, a
failed check), 2 bad input, 3 the database cannot be used.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, ParamSpec, TypeVar

import click
import sqlalchemy as sa
from tabulate import tabulate

from falcon_es import db, job_rows, registry
from falcon_es.adapters.sim.config import SimConfigError
from falcon_es.bootstrap import App, open_app
from falcon_es.ports import Ports
from falcon_es.settings import Settings, SettingsError
from falcon_es.tpu import TopologyError

if TYPE_CHECKING:  # the Google and Kubernetes clients load only when a command needs them
    from falcon_es.adapters.gcp.wiring import GcpBackend

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


def friendly(func: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors users can cause into one line each, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (registry.RegistryError, job_rows.JobRowError, SettingsError, SimConfigError,
                db.DatabaseUrlError, TopologyError) as error:
            raise Failure(str(error)) from error
        except sa.exc.OperationalError as error:
            raise Failure(_database_problem(error), EXIT_DATABASE) from error
        except sa.exc.ProgrammingError as error:
            raise Failure(_database_problem(error), EXIT_DATABASE) from error
        except sa.exc.DataError as error:
            raise Failure(f"the database refused a value: {first_line(error)}") from error

    return wrapper


def first_line(error: sa.exc.DBAPIError) -> str:
    """The driver's own words, without SQLAlchemy's statement and parameters."""
    return (str(error.orig) if error.orig else str(error)).strip().splitlines()[0]


def _database_problem(error: sa.exc.DBAPIError) -> str:
    text = first_line(error)
    if "no such table" in text or "doesn't exist" in text:
        return f"the database has no Falcon-ES schema ({text}); run: falcon-es db upgrade"
    return f"database error: {text}"


# ----------------------------------------------------------------------- what commands build


def app_of(ctx: click.Context) -> App:
    """The application of this invocation, opened on first use (commands that never
    touch the database, such as ``--help``, never connect) and closed with the context."""
    app: App | None = ctx.obj.get("app")
    if app is None:
        app = open_app(ctx.obj["settings"])
        ctx.obj["app"] = app
        ctx.call_on_close(app.close)
    return app


def gcp_ports(settings: Settings) -> Ports:
    """The ports of ``run --backend gcp``, built once for every leadership term."""
    from falcon_es.bootstrap import build_ports
    from falcon_es.clock import WallClock

    ports, _ = build_ports(settings, "gcp", WallClock())
    return ports


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
    click.echo(tabulate([[cell(r.get(c)) for c in columns] for r in rows], headers=columns))


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
