"""Inputs from the upper layer, read from its job table by indexed queries.

Every statement goes through the ``JobTable`` of the settings' mapping, and every value
read is checked before a handler sees it: the table is the upper layer's, so a column
may hold what Falcon-ES cannot use (text where a time belongs, an id longer than the
log's ``stream_id``). Such a row becomes a ``BadRow`` that intake fails on its own;
rows in a status Falcon-ES does not read are logged once each and counted, never
taken in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import logging
from collections.abc import Callable, Collection
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from falcon_es.storage import db
from falcon_es.domain import statuses
from falcon_es.domain.clock import Clock
from falcon_es.domain.events import ROW_CHECKS_STREAM
from falcon_es.domain.spec import INVALID_COLUMN, INVALID_ID
from falcon_es.storage.tables import ACTOR_LENGTH, STREAM_ID_LENGTH, JobTable, task_events
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.jobtable.ended_rows import EndedRowPages
from falcon_es.jobtable.rows import (  # noqa: F401 - the inbox's rows, read from here too
    AbortRow, BadRow, Diverged, Ignored, Inbox, NewRow, PriorityRow, RowProblem, SeenRow,
    cell_text,
)

log = logging.getLogger("falcon_es.jobtable.inbox")

#: Why a row was ignored (the ``reason`` label of ``falcon_job_rows_ignored``).
UNKNOWN_STATUS = "unknown-status"
NOT_TAKEN_IN = "not-taken-in"
ID_TOO_LONG = "id-too-long"
PRIORITY_REFUSED = "priority-refused"
#: The statuses a job row may hold: what Falcon-ES writes, and ``Aborting``, which the
#: upper layer writes too.
ROW_STATUSES = (statuses.ABORTED, statuses.ABORTING, statuses.FAILED, statuses.PENDING, statuses.RUNNING,
                statuses.SUCCEEDED)
#: How often (clock seconds) the inbox looks for rows it cannot take: an indexed scan,
#: not worth a round trip every tick.
STRAY_SCAN_SECONDS = 60.0
#: Rows created since the previous scan are looked at again less this margin: the upper
#: layer's insert may commit a while after the created_at it wrote.
STRAY_MARGIN = dt.timedelta(minutes=10)
#: What the first scan of a process looks at for rows never taken in.
STRAY_FIRST_WINDOW = dt.timedelta(days=1)
#: Rows of the scan's window one poll reads (and asks the log about) at most: the window
#: holds Falcon-ES's own recent rows too, so after a burst of submissions (100,000 taken
#: in within the window) one tick reading them all, and asking the log about each, took
#: most of a second; a page of them costs a few milliseconds, and the scan goes on
#: from where it stopped at the next poll.
STRAY_PAGE = 1000
#: Priority requests are read again this far behind the latest one seen, every
#: ``STRAY_SCAN_SECONDS``: the upper layer's update may commit a while after the time it
#: wrote (the other ticks read only those after the latest).
PRIORITY_MARGIN = dt.timedelta(minutes=10)
#: How far back the first look of a process goes for priority requests; a request the
#: log has applied already changes nothing when read again.
PRIORITY_FIRST_WINDOW = dt.timedelta(days=1)
#: Ids per ``IN (...)`` when asking the log which rows it knows.
_IDS_PER_QUERY = 500
#: The newest new rows a poll reads besides the oldest ``limit`` when those fill it:
#: however many older rows look new (an upper layer setting thousands back to
#: Pending), a row just submitted is read at the next tick. The older ones are judged ``limit`` a tick and
#: marked (a Reason written), so they stop looking new.
NEWEST_ROWS = 100
#: How often (clock seconds) the job rows of the tasks in memory are compared with
#: the log, and how many rows one tick reads: a full pass over N tasks takes
#: ceil(N / ROW_CHECK_PAGE) ticks, so a row set back, forged or rewritten is put right
#: within ROW_CHECK_SECONDS plus that many ticks (a row set back to new: at the next
#: tick, by intake). Five minutes: a pass reads every row in memory, which at a
#: minute cost the end-to-end bench (hours of virtual time) several per cent.
ROW_CHECK_SECONDS = 300.0
ROW_CHECK_PAGE = 500


@dataclasses.dataclass(frozen=True)
class _Statements:
    new_rows: sa.Select[Any]
    newest: sa.Select[Any]
    poll: sa.CompoundSelect
    unknown: sa.CompoundSelect
    #: The first page of the recent window, and each page after a (created_at, id).
    recent_first: sa.Select[Any]
    recent_next: sa.Select[Any]


def _statements(job: JobTable, dialect_name: str) -> _Statements:
    c = job.c
    new_columns = (c.id.label("id"), c.name.label("name"), c.actor.label("actor"),
                   sa.type_coerce(c.spec, sa.Text).label("spec_raw"),
                   c.created_at.label("created_at"))
    is_new = sa.and_(c.status == statuses.PENDING, c.reason.is_(None))
    new_rows = (sa.select(*new_columns).where(is_new).order_by(c.created_at, c.id)
                .limit(sa.bindparam("limit")))
    # The newest new rows, read only when the oldest fill a whole poll (see
    # ``NEWEST_ROWS``): otherwise the poll holds every new row already.
    newest = (sa.select(*new_columns).where(is_new)
              .order_by(c.created_at.desc(), c.id.desc()).limit(NEWEST_ROWS))
    # Both inputs in one statement: new rows (their own LIMIT) and every abort request,
    # told apart by ``is_abort``, each half in its own order (the new rows', then the
    # ids'). Each half fills the other's columns with typed NULLs so every column keeps
    # its result processing.
    aborts = sa.select(
        c.id.label("id"), sa.type_coerce(sa.null(), c.name.type).label("name"),
        sa.type_coerce(sa.null(), c.actor.type).label("actor"),
        sa.type_coerce(sa.null(), sa.Text).label("spec_raw"),
        sa.type_coerce(sa.null(), c.created_at.type).label("created_at"),
        c.aborting_at.label("aborting_at"), sa.literal(1).label("is_abort"),
    ).where(c.status == statuses.ABORTING)
    no_abort = (sa.type_coerce(sa.null(), c.aborting_at.type).label("aborting_at"),
                sa.literal(0).label("is_abort"))
    if dialect_name in ("mysql", "mariadb"):
        poll = _streamed_poll(new_rows.add_columns(*no_abort), aborts, c.id)
    else:
        first = new_rows.subquery("new_rows")
        poll = sa.union_all(
            sa.select(first.c.id, first.c.name, first.c.actor, first.c.spec_raw,
                      first.c.created_at, *no_abort),
            aborts,
        ).order_by(sa.literal_column("is_abort"), sa.literal_column("created_at"),
                   sa.literal_column("id"))
    recent_first, recent_next = _recent_pages(job)
    return _Statements(new_rows, newest, poll, _unknown_statuses(job), recent_first,
                       recent_next)


#: MySQL's "every row" LIMIT: a part of a UNION keeps its ORDER BY only with a LIMIT.
_EVERY_ROW = 18446744073709551615


def _streamed_poll(new_rows: sa.Select[Any], aborts: sa.Select[Any],
                   row_id: sa.ColumnElement[Any]) -> sa.CompoundSelect:
    """The poll as MySQL and MariaDB run it cheaply: ``(new rows ORDER BY ... LIMIT)
    UNION ALL (aborts ORDER BY id LIMIT every row)``, which they send part after part,
    each in its own order. The form SQLite needs (the new rows in a derived table, the
    union sorted) costs them two temporary tables a poll, on disk because of the spec
    column, and a sort: most of the server's time in a tick that finds nothing."""
    return sa.union_all(new_rows, aborts.order_by(row_id).limit(_EVERY_ROW))


def _priority_requests(job: JobTable) -> sa.Select[Any]:
    """The priority requests made after ``since``, oldest first; the columns as the
    driver gives them (``_text``, ``as_timestamp`` check them)."""
    c = job.c
    return (sa.select(c.id, sa.type_coerce(c.priority, sa.types.NullType),
                      sa.type_coerce(c.priority_requested_at, sa.types.NullType),
                      sa.type_coerce(c.priority_requested_by, sa.types.NullType))
            .where(c.priority_requested_at
                   > sa.bindparam("since", type_=c.priority_requested_at.type))
            .order_by(c.priority_requested_at, c.id))


def _priority_value(raw: object) -> int | str | None:
    """A stored priority: a whole number (also as digits in a text column), a class
    name, or None; anything else as its text, for the refusal to show."""
    if isinstance(raw, bool) or raw is None:
        return None if raw is None else str(raw)
    if isinstance(raw, int):
        return raw
    text = cell_text(raw)
    if text is None:
        return str(raw)
    stripped = text.strip()
    try:
        return int(stripped)
    except ValueError:
        return stripped


def _unknown_statuses(job: JobTable) -> sa.CompoundSelect:
    """Rows whose status is none of ``ROW_STATUSES`` (one index range per gap between
    them, as an index serves ranges where it cannot serve NOT IN)."""
    c = job.c
    ordered = sorted(ROW_STATUSES)
    gaps = [c.status < ordered[0], c.status > ordered[-1], c.status.is_(None),
            *(sa.and_(c.status > low, c.status < high)
              for low, high in itertools.pairwise(ordered))]
    return sa.union_all(*(sa.select(c.id.label("id"), c.status.label("status")).where(gap)
                          for gap in gaps))


def _recent_pages(job: JobTable) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """Recent rows in a status other than the two Falcon-ES reads (its own rows among
    them, which the log tells apart), ``STRAY_PAGE`` at a time in (created_at, id)
    order: the first page from ``since``, and the page after the last row read
    (``after_at``, ``after_id``, as the driver gave them), whose index range starts
    there, so the pages of a scan read each row once. The created_at read back is the
    driver's value: it only marks where the next page starts."""
    c = job.c
    written = [s for s in ROW_STATUSES if s != statuses.ABORTING]
    page = sa.select(
        c.id.label("id"), c.status.label("status"), c.reason.label("reason"),
        sa.type_coerce(c.created_at, sa.types.NullType).label("created_at"),
    ).where(
        # The status test goes through COALESCE so that no index serves it: SQLite's
        # planner (no statistics) otherwise prefers the (status, reason) index, where IN
        # matches nearly every row of a long history, to the created_at range of a
        # day's rows.
        sa.func.coalesce(c.status, "").in_(written),
        sa.or_(c.status != statuses.PENDING, c.reason.is_not(None)),
    ).order_by(c.created_at, c.id).limit(STRAY_PAGE)
    # The driver's values go back as they came (no bind processing: the columns are
    # compared untyped), and the page after a row has that row's created_at as its only
    # lower bound (it is at least ``since``): given two, SQLite's planner may start the
    # range at the lower.
    created_at = sa.type_coerce(c.created_at, sa.types.NullType)
    row_id = sa.type_coerce(c.id, sa.types.NullType)
    after_at = sa.bindparam("after_at", type_=sa.types.NullType())
    following = page.where(created_at >= after_at, sa.or_(
        created_at > after_at, row_id > sa.bindparam("after_id", type_=sa.types.NullType())))
    return page.where(c.created_at >= sa.bindparam("since", type_=c.created_at.type)), following


class JobInbox:
    """New rows are ``Pending`` with no Reason yet (the projection sets one on intake);
    abort requests are rows in ``Aborting``. Both use the (status, reason) index.

    Reads begin deferred (``db.read_only``): on SQLite a poll must not take the write
    lock the controller's own appends need. With a ``clock``, a poll also looks (every
    ``STRAY_SCAN_SECONDS``) for rows it will never take, and logs and counts each once
    per process (``ignored``); a scan reads its window ``STRAY_PAGE`` rows a poll, so
    no tick carries a whole window of recent rows."""

    def __init__(self, engine: Engine, job: JobTable, *, clock: Clock | None = None,
                 ignored: Ignored | None = None, diverged: Diverged | None = None,
                 quiet_seconds: float = 0.0) -> None:
        self.engine = engine
        #: After a poll that found no new row, how long polls answer empty without a
        #: read (with a clock): see ``poll``.
        self._quiet = dt.timedelta(seconds=quiet_seconds)
        self._quiet_until: dt.datetime | None = None
        self._following_up = False
        self._diverged = diverged
        #: The row check: when the next pass starts, the ids its pass has still to
        #: read, and the (task, finding) already recorded (None: not read from the
        #: log yet).
        self._next_check: dt.datetime | None = None
        self._to_check: list[str] = []
        self._findings: set[tuple[str, str]] | None = None
        #: Per task in memory, the spec text its row held at the last check when that
        #: text read as the accepted spec: parsing every spec at every pass cost more
        #: than the rest of the check together. Kept for the tasks of the pass only.
        self._specs_seen: dict[str, Any] = {}
        self.job = job
        self.reader = db.read_only(engine)
        self._ended = EndedRowPages(self.reader, job, clock)
        self.clock = clock
        self._ignored = ignored
        self._statements = _statements(job, engine.dialect.name)
        self._compiled: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {}
        self._next_scan: dt.datetime | None = None
        self._scanned_from: dt.datetime | None = None
        #: (row id, why) already logged and counted.
        self._reported: set[tuple[str, str]] = set()
        #: Rows of the last scan's window the log knows: not asked about again while
        #: they stay in the window (the set holds that window's rows only, and those of
        #: the scan under way).
        self._known: set[str] = set()
        #: The scan under way: where its window starts, the (created_at, id) of the last
        #: row it read (None: none yet) and the rows of its window read so far.
        self._scan_since: dt.datetime | None = None
        self._scan_after: tuple[Any, Any] | None = None
        self._scan_seen: set[str] = set()
        #: The latest priority request time read, and the refused requests of the
        #: window it starts (logged once each; the dict holds that window only).
        self._priority_mark: dt.datetime | None = None
        self._priority_rescan: dt.datetime | None = None
        self._priority_refused: dict[tuple[str, dt.datetime], None] = {}
        self._priority_query = _priority_requests(job) if job.mapping.priority_requests else None

    def following_up(self, following: bool) -> None:
        """Whether the next poll is a tick's that follows the last at once (``poll``)."""
        self._following_up = following

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        sql, names, fixed = self._driver_sql("new_rows", self._statements.new_rows)
        values = {**fixed, "limit": limit}
        params: Any = tuple(values[name] for name in names) if names else values
        with self.reader.connect() as conn:
            rows = conn.exec_driver_sql(sql, params).all()
        return [r for r in (_new_row(*row) for row in rows) if isinstance(r, NewRow)]

    def bad_rows(self) -> list[BadRow]:
        return self.poll().bad_rows()

    def abort_rows(self) -> list[AbortRow]:
        return self.poll().abort_rows()

    def priority_rows(self) -> list[PriorityRow]:
        """The priority requests made after the latest one read (and, every
        ``STRAY_SCAN_SECONDS``, after it less ``PRIORITY_MARGIN``, for updates that
        commit late): one index range on ``priority_requested_at``, however large the
        table. A request read again changes nothing once applied; one whose tick's
        append failed is read again at the next rescan. The latest is never taken past
        the clock, so a request dated in the future cannot hide the ones after it."""
        if self._priority_query is None:
            return []
        mark = self._priority_mark
        now = self.clock.now() if self.clock is not None else None
        rescan = now is None or self._priority_rescan is None or now >= self._priority_rescan
        if mark is not None:
            since = mark - PRIORITY_MARGIN if rescan else mark
        elif now is not None:
            since = now - PRIORITY_FIRST_WINDOW
        else:
            since = dt.datetime(1970, 1, 1)
        if rescan and now is not None:
            self._priority_rescan = now + dt.timedelta(seconds=STRAY_SCAN_SECONDS)
        with self.reader.connect() as conn:
            rows = conn.execute(self._priority_query, {"since": since}).all()
        found: list[PriorityRow] = []
        for row_id, priority, requested_at, requested_by in rows:
            when = as_timestamp(requested_at)
            task_id = cell_text(row_id)
            if when is None or task_id is None:
                continue
            mark = when if mark is None or when > mark else mark
            found.append(PriorityRow(task_id, _priority_value(priority), when,
                                     cell_text(requested_by) or "upper-layer"))
        if mark is not None:
            mark = min(mark, now) if now is not None else mark
            self._priority_mark = mark
            floor = mark - PRIORITY_MARGIN
            self._priority_refused = {k: None for k in self._priority_refused if k[1] >= floor}
        return found

    def priority_refused(self, row: PriorityRow, why: str) -> None:
        """Log a refused request once (it is read again while inside the margin)."""
        key = (row.id, row.requested_at)
        if key in self._priority_refused:
            return
        self._priority_refused[key] = None
        log.warning("priority request of %s for task %s (%s) refused: %s", row.requested_by,
                    row.id, row.priority, why, extra={"task_id": row.id[:STREAM_ID_LENGTH]})
        if self._ignored is not None:
            self._ignored(PRIORITY_REFUSED)

    def poll(self, limit: int = 1000) -> InboxPoll:
        """Both inputs as of now, in one statement: what a tick reads (each tick polls
        once instead of once per input). Sent as the driver's SQL, compiled once: every
        tick polls, and compiling, caching and result processing cost more than the
        query when there is nothing new.

        A tick that follows the last at once (``following_up``), within
        ``quiet_seconds`` of the clock after a poll that found no new row, answers
        empty without reading: such ticks carry what the tick before set off, and what
        the upper layer wrote meanwhile waits for the next tick, at most that long.
        They were half the polls, and a poll was half the controller's round trips."""
        now = self.clock.now() if self.clock is not None else None
        if (self._following_up and now is not None and self._quiet_until is not None
                and now < self._quiet_until):
            return InboxPoll(self, limit, [], [], [])
        sql, names, fixed = self._driver_sql("poll", self._statements.poll)
        values = {**fixed, "limit": limit}
        params: Any = tuple(values[name] for name in names) if names else values
        new: list[NewRow] = []
        bad: list[BadRow] = []
        aborts: list[AbortRow] = []
        with self.reader.connect() as conn:
            rows = conn.exec_driver_sql(sql, params).all()
        read = [row[:5] for row in rows if not row[6]]
        for row_id, _, _, _, _, aborting_at, is_abort in rows:
            if is_abort:
                abort = self._abort_row(row_id, aborting_at)
                if abort is not None:
                    aborts.append(abort)
        if len(read) >= limit:
            read += self._newest({row[0] for row in read})
        for row_id, name, actor, spec_raw, created_at in read:
            taken = _new_row(row_id, name, actor, spec_raw, created_at)
            if isinstance(taken, NewRow):
                new.append(taken)
            else:
                bad.append(taken)
        if now is not None:
            self._scan_strays(now)
            quiet = self._quiet and not read
            self._quiet_until = now + self._quiet if quiet else None
        return InboxPoll(self, limit, new, bad, aborts, self.priority_rows())

    # ------------------------------------------------------------ the row check
    def rows_to_check(self, task_ids: Callable[[], Collection[str]]) -> list[str]:
        """The next page of task ids whose rows the row check compares with the log:
        a pass over every task in memory (``task_ids``, asked at its start) every
        ``ROW_CHECK_SECONDS``, ``ROW_CHECK_PAGE`` ids a tick."""
        if not self._to_check:
            now = self.clock.now() if self.clock is not None else None
            if now is None or (self._next_check is not None and now < self._next_check):
                return []
            self._next_check = now + dt.timedelta(seconds=ROW_CHECK_SECONDS)
            self._to_check = sorted(task_ids(), reverse=True)
            kept = set(self._to_check)
            self._specs_seen = {t: raw for t, raw in self._specs_seen.items() if t in kept}
        page = self._to_check[-ROW_CHECK_PAGE:]
        del self._to_check[-ROW_CHECK_PAGE:]
        return page

    def rows_of(self, task_ids: Collection[str]) -> dict[str, SeenRow]:
        """These tasks' rows as they are now, by id (a task without a row is absent).
        Sent as the driver's SQL, like the poll: SQLAlchemy's compiling and result
        processing cost more than the read."""
        found: dict[str, SeenRow] = {}
        ids = sorted(task_ids)
        with self.reader.connect() as conn:
            for start in range(0, len(ids), _IDS_PER_QUERY):
                chunk = ids[start:start + _IDS_PER_QUERY]
                rows = conn.exec_driver_sql(self._rows_of_sql(len(chunk)), tuple(chunk)).all()
                for row_id, status, reason, created_at, spec_raw in rows:
                    text_id = cell_text(row_id)
                    if text_id is not None:
                        found[text_id] = SeenRow(text_id, status, reason,
                                                 as_timestamp(created_at), spec_raw)
        return found

    def ended_rows_to_check(self) -> list[SeenRow]:
        """The next page of the pass over the whole table (``EndedRowPages``): what
        the row check reads for the tasks that left memory."""
        return self._ended.next_page()

    def _rows_of_sql(self, count: int) -> str:
        """SELECT id, status, reason, created_at, spec ... WHERE id IN (count marks)."""
        names = self.job.sql(self.engine.dialect)
        col = names.columns
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        return (f"SELECT {col['id']}, {col['status']}, {col['reason']}, {col['created_at']}, "
                f"{col['spec']} FROM {names.table} WHERE {col['id']} IN "
                f"({', '.join([mark] * count)})")

    def spec_unchanged(self, task_id: str, raw: Any) -> bool:
        """Whether this task's row holds the spec text it held when last found to read
        as the accepted spec (``spec_seen``): then it need not be parsed again."""
        return task_id in self._specs_seen and self._specs_seen[task_id] == raw

    def spec_seen(self, task_id: str, raw: Any) -> None:
        """This task's row holds spec text that reads as the accepted spec."""
        self._specs_seen[task_id] = raw

    def first_finding(self, task_id: str, found: str) -> bool:
        """True the first time this finding of this task is asked about, also across
        restarts (the findings the log records are read once); counts it then."""
        if self._findings is None:
            self._findings = _findings_recorded(self.reader)
        key = (task_id, found)
        if key in self._findings:
            return False
        self._findings.add(key)
        if self._diverged is not None:
            self._diverged(found)
        return True

    def _newest(self, read: set[Any]) -> list[Any]:
        """The newest ``NEWEST_ROWS`` new rows not among ``read``: asked only when the
        oldest filled a whole poll, so no number of older rows hides a new one."""
        sql, names, fixed = self._driver_sql("newest", self._statements.newest)
        params: Any = tuple(fixed[name] for name in names) if names else fixed
        with self.reader.connect() as conn:
            rows = conn.exec_driver_sql(sql, params).all()
        return [row for row in rows if row[0] not in read]

    def _driver_sql(self, key: str, statement: sa.Select[Any] | sa.CompoundSelect,
                    ) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        """A statement as this dialect's SQL text, the names of its positional
        parameters (empty for named ones) and the values of those that never change.
        Its rows come back as the driver gives them, for ``_new_row`` to check: a
        column of the wrong type must fail its row, not the whole read."""
        compiled_sql = self._compiled.get(key)
        if compiled_sql is None:
            compiled = statement.compile(dialect=self.engine.dialect)
            names = tuple(compiled.positiontup or ()) if compiled.positional else ()
            compiled_sql = (str(compiled), names, dict(compiled.params))
            self._compiled[key] = compiled_sql
        return compiled_sql

    def _abort_row(self, row_id: Any, aborting_at: Any) -> AbortRow | None:
        """An abort request; a time that cannot be read is left out (the abort is what
        matters), a row whose id the log cannot hold is reported and skipped."""
        task_id = cell_text(row_id)
        if task_id is None or len(task_id) > STREAM_ID_LENGTH:
            self._report(str(row_id), ID_TOO_LONG,
                         "job row %s: abort ignored: its id is %d characters, longer than "
                         "the %d of Falcon-ES's log", str(row_id), len(str(row_id)),
                         STREAM_ID_LENGTH)
            return None
        return AbortRow(task_id, as_timestamp(aborting_at))

    # ------------------------------------------------------------ rows never taken in
    def _scan_strays(self, now: dt.datetime) -> None:
        """One page of the scan for rows never taken in: a new scan every
        ``STRAY_SCAN_SECONDS`` (its rows of unknown status, few, read whole; then its
        window of recent rows from the previous scan's start less ``STRAY_MARGIN``), or
        the next page of the scan under way. Once the last page is read, ``_known``
        keeps that window's rows only."""
        if self._scan_since is None:
            if self._next_scan is not None and now < self._next_scan:
                return
            self._scan_since = (self._scanned_from - STRAY_MARGIN
                                if self._scanned_from is not None else now - STRAY_FIRST_WINDOW)
            self._next_scan = now + dt.timedelta(seconds=STRAY_SCAN_SECONDS)
            self._scanned_from = now
            self._scan_after = None
            self._scan_seen = set()
            with self.reader.connect() as conn:
                unknown = [(str(r.id), r.status)
                           for r in conn.execute(self._statements.unknown)]
            for row_id, status in unknown:
                self._report(row_id, UNKNOWN_STATUS,
                             "job row %s ignored: status %r is not one Falcon-ES knows "
                             "(new rows are Pending, aborts Aborting)", row_id, status)
        statements = self._statements
        with self.reader.connect() as conn:
            if self._scan_after is None:
                rows = conn.execute(statements.recent_first, {"since": self._scan_since}).all()
            else:
                after_at, after_id = self._scan_after
                rows = conn.execute(statements.recent_next,
                                    {"after_at": after_at, "after_id": after_id}).all()
            # A row refused for its id (Failed/InvalidId) has no stream of its own.
            recent = [(str(r.id), r.status, r.reason) for r in rows
                      if not (r.status == statuses.FAILED and r.reason == INVALID_ID)]
            asked = [row_id for row_id, _, _ in recent if row_id not in self._known]
            self._known |= _streams_known(conn, asked)
        self._scan_seen.update(row_id for row_id, _, _ in recent)
        if len(rows) < STRAY_PAGE:  # the window's last page
            self._known &= self._scan_seen
            self._scan_since = None
            self._scan_seen = set()
        else:
            self._scan_after = (rows[-1].created_at, rows[-1].id)
        for row_id, status, reason in recent:
            if row_id not in self._known:
                shown = status if reason is None else f"{status}/{reason}"
                self._report(row_id, NOT_TAKEN_IN,
                             "job row %s ignored: it is %s but Falcon-ES never took it in "
                             "(a new row is Pending with no Reason)", row_id, shown)

    def _report(self, row_id: str, why: str, message: str, *args: object) -> None:
        """Log and count a row once per process."""
        if (row_id, why) in self._reported:
            return
        self._reported.add((row_id, why))
        log.warning(message, *args, extra={"task_id": row_id[:STREAM_ID_LENGTH]})
        if self._ignored is not None:
            self._ignored(why)


def _findings_recorded(reader: Engine) -> set[tuple[str, str]]:
    """(task id, finding) of every ``JobRowDiverged`` in the log."""
    with reader.connect() as conn:
        rows = conn.execute(sa.select(task_events.c.data).where(
            task_events.c.stream_id == ROW_CHECKS_STREAM)).scalars().all()
    found = set()
    for data in rows:
        decoded = json.loads(data) if isinstance(data, (str, bytes)) else data
        found.add((str(decoded["task_id"]), str(decoded["found"])))
    return found


def _streams_known(conn: sa.Connection, ids: Collection[str]) -> set[str]:
    """Which of these ids name a stream in the log (its first event, by the unique
    (stream_id, version) index). Asked with the ids as values rather than joined:
    the job table's collation need not be the log's."""
    fitting = sorted({i for i in ids if len(i) <= STREAM_ID_LENGTH})
    known: set[str] = set()
    for start in range(0, len(fitting), _IDS_PER_QUERY):
        chunk = fitting[start:start + _IDS_PER_QUERY]
        known.update(conn.execute(
            sa.select(task_events.c.stream_id)
            .where(task_events.c.stream_id.in_(chunk), task_events.c.version == 1)
        ).scalars())
    return known


def _new_row(row_id: Any, name: Any, actor: Any, spec_raw: Any,
             created_at: Any) -> NewRow | BadRow:
    """A new row as intake takes it, or what is wrong with it (the first column found
    wrong, in the order id, name, actor, created_at)."""
    task_id = cell_text(row_id)
    task_name, task_actor = cell_text(name), cell_text(actor)
    problem: RowProblem | None = None
    if task_id is None:
        problem = RowProblem(INVALID_ID, "id", f"expected text, found {_shown(row_id)}")
        task_id = str(row_id)
    elif len(task_id) > STREAM_ID_LENGTH:
        problem = RowProblem(INVALID_ID, "id", f"{len(task_id)} characters, longer than the "
                             f"{STREAM_ID_LENGTH} of Falcon-ES's log")
    elif task_name is None:
        problem = RowProblem(INVALID_COLUMN, "name", f"expected text, found {_shown(name)}")
    elif task_actor is None:
        problem = RowProblem(INVALID_COLUMN, "actor", f"expected text, found {_shown(actor)}")
    elif len(task_actor) > ACTOR_LENGTH:
        problem = RowProblem(INVALID_COLUMN, "actor", f"{len(task_actor)} characters, longer "
                             f"than the {ACTOR_LENGTH} Falcon-ES keeps")
    when = as_timestamp(created_at)
    if problem is None and when is None:
        problem = RowProblem(INVALID_COLUMN, "created_at",
                             f"expected a date and time, found {_shown(created_at)}")
    if problem is not None or when is None:
        return BadRow(task_id, task_name or "", task_actor or "",
                      problem or RowProblem(INVALID_COLUMN, "created_at", "unreadable"))
    return NewRow(task_id, task_name or "", task_actor or "", spec_raw, when)


def _shown(value: Any) -> str:
    """A value for a Message: short, with its type when it is not text."""
    if value is None:
        return "nothing (NULL)"
    text = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return text if isinstance(value, str) else f"{text} ({type(value).__name__})"


class InboxPoll:
    """One poll's rows, answering like the inbox it came from; asked for more new rows
    than a full poll holds, it reads them from the inbox."""

    def __init__(self, inbox: JobInbox, limit: int, new: list[NewRow], bad: list[BadRow],
                 aborts: list[AbortRow], priorities: list[PriorityRow] | None = None) -> None:
        self.inbox = inbox
        self.limit = limit
        self._new = new
        self._bad = bad
        self._aborts = aborts
        self._priorities = priorities or []

    def following_up(self, following: bool) -> None:
        """Whether the next poll is a tick's that follows the last at once (``poll``)."""
        self._following_up = following

    def new_rows(self, limit: int = 1000) -> list[NewRow]:
        """Asked for the poll's limit or more, every new row it read: the oldest and
        the newest ``NEWEST_ROWS`` (which no number of older rows may hide)."""
        if limit > self.limit and len(self._new) + len(self._bad) >= self.limit:
            return self.inbox.new_rows(limit)
        return list(self._new) if limit >= self.limit else self._new[:limit]

    def bad_rows(self) -> list[BadRow]:
        return list(self._bad)

    def abort_rows(self) -> list[AbortRow]:
        return list(self._aborts)

    def priority_rows(self) -> list[PriorityRow]:
        return list(self._priorities)

    def priority_refused(self, row: PriorityRow, why: str) -> None:
        self.inbox.priority_refused(row, why)

    def rows_to_check(self, task_ids: Callable[[], Collection[str]]) -> list[str]:
        return self.inbox.rows_to_check(task_ids)

    def rows_of(self, task_ids: Collection[str]) -> dict[str, SeenRow]:
        return self.inbox.rows_of(task_ids)

    def ended_rows_to_check(self) -> list[SeenRow]:
        return self.inbox.ended_rows_to_check()

    def first_finding(self, task_id: str, found: str) -> bool:
        return self.inbox.first_finding(task_id, found)

    def spec_unchanged(self, task_id: str, raw: Any) -> bool:
        return self.inbox.spec_unchanged(task_id, raw)

    def spec_seen(self, task_id: str, raw: Any) -> None:
        self.inbox.spec_seen(task_id, raw)
