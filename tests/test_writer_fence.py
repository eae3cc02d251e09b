"""One writer, enforced by the database: the writer fence in the log head, the database
lock verified each tick, a lost lock handed over to a standby, and a leader frozen
inside its commit replaced within the lock's timeout (docs/design-notes/writer-fence.md)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from falcon_es.config.settings import Settings
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock, utcnow
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.leader import DatabaseLock
from falcon_es.engine.runtime import Tick, TickReport
from falcon_es.handlers import HANDLERS
from falcon_es.storage import db, fence
from falcon_es.storage.fence import FencedOut
from falcon_es.storage.store import EventStore, Meta, StreamAppend
from tests.conftest import MYSQL_SERVER, migrate, scratch_mysql
from tests.support.replicas import (
    Effects, Replica, outcomes, shared_world, submit_tasks, verify_replay, wait_until_ended,
    writers_in_order,
)

META = Meta(actor="tester")
#: Short waits, so a test sees each timeout pass in seconds: a lock wait ends after 1 s,
#: a hang after 3 s, a quiet write transaction after 2 s, a silent lock holder's lock
#: after 3 s.
QUICK = {"lock_wait_timeout": 1, "read_timeout": 3, "idle_transaction_timeout": 2,
         "lock_timeout": 3}
TASKS = 12


def accepted(name: str) -> ev.TaskAccepted:
    return ev.TaskAccepted(name, "user-a", {"image": "i"}, "v6e", "2x2", dt.datetime(2026, 11, 1, 8))


def one(stream: str) -> list[StreamAppend]:
    return [StreamAppend(stream, 0, (accepted(stream),), META)]


@pytest.fixture
def mariadb() -> Iterator[str]:
    with scratch_mysql("falcon_fence") as url:
        migrate(url)
        yield url


def test_a_stale_writers_append_is_refused_by_the_fence_and_writes_nothing(db_url: str) -> None:
    engine = db.make_engine(db_url, Settings(db_url=db_url).database)
    clock = VirtualClock(utcnow())
    try:
        first = fence.take(engine, "controller-a")
        old = EventStore(engine, clock, fence=first)
        assert old.append(one("a1"))[0].seq == 1
        second = fence.take(engine, "controller-b")
        assert second.term == first.term + 1
        with pytest.raises(FencedOut, match=f"term {second.term}, held by controller-b; "
                                            f"this controller's term {first.term}"):
            old.append(one("a2"))
        assert old.head() == 1 and old.read_stream("a2") == []
        new = EventStore(engine, clock, fence=second)
        assert new.append(one("b1"))[0].seq == 2
        # Appends made without a fence (the command line's) are not checked.
        assert EventStore(engine, clock).append(one("cli"))[0].seq == 3
        with engine.connect() as conn:
            assert fence.current(conn) == second
    finally:
        engine.dispose()


def test_a_writer_frozen_inside_its_commit_holds_the_head_no_longer_than_the_idle_timeout(
        mariadb: str) -> None:
    """The frozen writer's transaction holds the log head; the server ends it after
    idle_transaction_timeout, the successor's bounded lock waits are retried until it
    takes the fence, and the frozen writer's late commit finds its connection gone."""
    limits = Settings(db_url=mariadb, **QUICK).database
    engines = [db.make_engine(mariadb, limits) for _ in range(2)]
    clock = VirtualClock(utcnow())
    frozen, thaw = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def freeze(conn: sa.Connection) -> None:
        frozen.set()
        thaw.wait(30)

    def old_leader() -> None:
        store = EventStore(engines[0], clock, fence=fence.take(engines[0], "controller-a"))
        try:
            store.append(one("late"), extra=[freeze])
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=old_leader)
    thread.start()
    try:
        assert frozen.wait(10)
        started, waits = time.monotonic(), 0
        while True:
            try:
                successor = fence.take(engines[1], "controller-b")
                break
            except sa.exc.OperationalError as error:
                assert db.is_transient(error), error
                waits += 1
        took = time.monotonic() - started
        assert waits >= 1 and took < limits.idle_transaction_timeout + limits.lock_wait_timeout + 1
        EventStore(engines[1], clock, fence=successor).append(one("new"))
    finally:
        thaw.set()
        thread.join(30)
    assert failure and db.is_transient(failure[0]), failure
    store = EventStore(engines[1], clock)
    assert store.read_stream("late") == [] and [r.seq for r in store.read_stream("new")] == [1]
    for engine in engines:
        engine.dispose()


def kill(connection_id: int, url: str) -> None:
    """``KILL <id>``: what a server, proxy or operator ending the lock's idle
    connection does to it."""
    admin = sa.create_engine(MYSQL_SERVER + "/", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"KILL {int(connection_id)}")
    finally:
        admin.dispose()


def test_the_lock_is_verified_each_tick_and_a_lost_one_is_taken_by_the_standby(
        mariadb: str) -> None:
    engines = [db.make_engine(mariadb) for _ in range(2)]
    first = DatabaseLock(engines[0], identity="a", lock_timeout=3)
    second = DatabaseLock(engines[1], identity="b", lock_timeout=3)
    try:
        assert first.try_acquire() and first.may_append()
        assert not second.try_acquire()
        assert "held by database connection" in second.describe()
        kill(first.connection_id() or 0, mariadb)
        assert not first.may_append()  # the next tick's check: stand by at once
        assert first.describe().startswith("standby")
        assert second.try_acquire() and second.may_append()
        assert not first.try_acquire()
    finally:
        first.release()
        second.release()
        for engine in engines:
            engine.dispose()


def baseline(count: int) -> dict[str, tuple[str, str | None]]:
    """How ``count`` tasks end under one undisturbed controller."""
    with scratch_mysql("falcon_fence_base") as url:
        migrate(url)
        clock = VirtualClock(utcnow())
        world = shared_world(clock, url)
        submit_tasks(url, count, clock)
        only = Replica("only", url, world, clock, Settings(db_url=url, **QUICK),
                       until_idle=True).start()
        only.join(120)
        assert only.error is None and only.report is not None
        assert only.report.stopped_by == "idle"
        return outcomes(url)


def assert_one_writer_at_a_time(url: str, effects: Effects, base: dict[str, Any]) -> None:
    assert writers_in_order(url) == ["falcon-a", "falcon-b"]
    assert outcomes(url) == base
    assert effects.created_twice() == {}
    assert verify_replay(url) == []


def test_killing_the_lock_connection_hands_over_without_two_writers(
        mariadb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's lapsed lock: the first controller's lock connection is killed under
    it; it notices at its next tick and stands by (it does not exit), the second takes
    the lock and the fence, and no event of the first follows the second's first."""
    base = baseline(TASKS)
    clock = VirtualClock(utcnow())
    world = shared_world(clock, mariadb)
    effects = Effects(world, monkeypatch)
    submit_tasks(mariadb, TASKS, clock)
    killed = threading.Event()
    ticks = 0

    def kill_at_tick_20(report: TickReport) -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 20:
            kill(first.election.connection_id() or 0, mariadb)
            killed.set()

    settings = Settings(db_url=mariadb, **QUICK)
    first = Replica("a", mariadb, world, clock, settings, on_tick=kill_at_tick_20,
                    retry_period=1.0).start()
    second = None
    try:
        assert killed.wait(60)
        second = Replica("b", mariadb, world, clock, settings).start()
        wait_until_ended(mariadb, TASKS)
        assert first.thread.is_alive() and not first.election.holding()
    finally:
        if second is not None:
            second.halt()
        first.halt()
    assert first.error is None and second is not None and second.error is None
    assert_one_writer_at_a_time(mariadb, effects, base)


def test_a_leader_frozen_inside_its_commit_is_replaced_within_the_lock_timeout(
        mariadb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first controller freezes (as under SIGSTOP) inside the commit of its 20th
    tick: its write transaction holds the log head and nothing pings its lock. The
    server ends both connections (idle_transaction_timeout, the lock's wait_timeout),
    the standby takes over within the lock timeout, and when the old leader thaws its
    late commit is refused; it stands by."""
    base = baseline(TASKS)
    clock = VirtualClock(utcnow())
    world = shared_world(clock, mariadb)
    effects = Effects(world, monkeypatch)
    submit_tasks(mariadb, TASKS, clock)
    process_frozen, thaw = threading.Event(), threading.Event()
    frozen_at: list[float] = []
    commits = 0

    class FreezableLock(DatabaseLock):
        """The lock of a process that can be stopped: a stopped process pings nothing."""

        def may_append(self) -> bool:
            while process_frozen.is_set():
                thaw.wait(0.01)
            return super().may_append()

    def freeze_in_the_20th_commit(tick: Tick, ctx: HandlerContext) -> None:
        nonlocal commits
        if tick.emitted:  # a tick with nothing to append opens no transaction
            commits += 1
        if commits == 20 and tick.emitted:
            tick.write(lambda conn: freeze())

    def freeze() -> None:
        frozen_at.append(time.monotonic())
        process_frozen.set()
        thaw.wait(60)
        process_frozen.clear()

    settings = Settings(db_url=mariadb, **QUICK)
    first = Replica("a", mariadb, world, clock, settings, lock_class=FreezableLock,
                    handlers=(*HANDLERS, freeze_in_the_20th_commit), retry_period=1.0).start()
    second = Replica("b", mariadb, world, clock, settings)
    try:
        for _ in range(6000):
            if frozen_at:
                break
            time.sleep(0.01)
        assert frozen_at, "the first controller never reached its 20th commit"
        second.start()
        for _ in range(3000):
            if "falcon-b" in writers_in_order(mariadb):
                break
            time.sleep(0.01)
        took_over = time.monotonic() - frozen_at[0]
        assert took_over < settings.database.lock_timeout + 3, took_over
        thaw.set()
        wait_until_ended(mariadb, TASKS)
        assert first.thread.is_alive() and not first.election.holding()
    finally:
        thaw.set()
        second.halt()
        first.halt()
    assert first.error is None and second.error is None
    assert_one_writer_at_a_time(mariadb, effects, base)


def test_the_migration_adds_the_fence_to_an_existing_log_head_and_can_be_undone(
        bare_db_url: str) -> None:
    engine = db.make_engine(bare_db_url)
    try:
        db.upgrade(engine, "0004")
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE log_head SET last_seq = 7")
        db.upgrade(engine)
        db.upgrade(engine)  # rerunnable
        with engine.connect() as conn:
            assert fence.current(conn) == fence.Fence(0, "")
            assert conn.exec_driver_sql("SELECT last_seq FROM log_head").scalar() == 7
        assert fence.take(engine, "controller-a") == fence.Fence(1, "controller-a")
        command.downgrade(db.alembic_config(engine), "0004")
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("log_head")}
        assert columns == {"id", "last_seq"}
    finally:
        engine.dispose()



class Unaware:
    """An election whose holder has not noticed its term is over (a lease holder on a
    clock running late, a lock whose loss no check has seen yet): it says it may
    append until told to hand back what it holds."""

    def __init__(self, engine: sa.Engine, *, identity: str, **_: Any) -> None:
        self.identity, self.retry_period = identity, 0.05
        self.released = threading.Event()

    def may_append(self) -> bool:
        return not self.released.is_set()

    def is_leader(self) -> bool:
        return self.may_append()

    def run(self, stop: threading.Event) -> None:
        """Nothing to campaign for."""

    def release(self) -> bool:
        self.released.set()
        return True

    def describe(self) -> str:
        return f"leader as {self.identity}, as far as it knows"


def test_a_leader_that_has_not_noticed_its_term_ended_is_refused_and_stands_by(
        db_url: str) -> None:
    """Another controller's term begins under a running one that still believes it
    leads: its next append is refused by the fence, it appends nothing more, hands its
    election back and stands by (the process goes on)."""
    clock = VirtualClock(utcnow())
    world = shared_world(clock, db_url)
    submit_tasks(db_url, 4, clock)
    other = db.make_engine(db_url)
    taken: list[int] = []

    def successor_after_the_first_commit(report: TickReport) -> None:
        if len(taken) == 0 and report.appended:
            taken.append(fence.take(other, "controller-b").term)
            taken.append(EventStore(other, clock).head())

    first = Replica("a", db_url, world, clock, Settings(db_url=db_url, **QUICK),
                    lock_class=Unaware, on_tick=successor_after_the_first_commit).start()  # type: ignore[arg-type]
    try:
        assert first.election.released.wait(30)  # type: ignore[attr-defined]
        time.sleep(0.2)
        assert first.thread.is_alive()
    finally:
        first.halt()
        other.dispose()
    assert first.error is None and first.report is not None
    assert first.report.stopped_by == "signal"
    store = EventStore(db.make_engine(db_url), clock)
    mine = [r.seq for r in store.read_after(0) if r.meta.get("controller") == "falcon-a"]
    assert mine and max(mine) <= taken[1] == store.head()
    store.engine.dispose()
