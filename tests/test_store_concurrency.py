"""Concurrent appenders: seq order is commit order, and same-stream races have one winner.

InnoDB hands out AUTO_INCREMENT values at insert time, not commit time, so a store that
relied on them would let a reader following ``seq > checkpoint`` pass over a lower seq
that commits late. These tests run real threads, each with its own engine, against the
real databases and check what a tailing reader saw against the final log.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.storage import db
from falcon_es.domain import events as ev
from falcon_es.app.application import open_app
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.store import ConcurrencyError, EventStore, Meta, StreamAppend
from falcon_es.storage.tables import JobTable, task_events

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

pytestmark = pytest.mark.slow

WRITERS = 4
TICKS_PER_WRITER = 120
STREAMS_PER_WRITER = 3
SUBMITTED = dt.datetime(2026, 11, 1, 8)


def accepted(name: str) -> ev.TaskAccepted:
    return ev.TaskAccepted(name, "user-a", {"image": "i"}, "v6e", "2x2", SUBMITTED)


def no_active(note: str) -> ev.NoActiveCluster:
    return ev.NoActiveCluster("v6e", ({"name": note, "status": "offline"},))


@dataclass
class WriterReport:
    appended: int = 0
    errors: list[BaseException] = field(default_factory=list)


def _hold_the_transaction_open(rng: random.Random) -> Callable[[Connection], None]:
    """Keep some ticks' transactions open a little longer (a few ms at most), so that
    without serialization a later seq would get the chance to commit first."""
    pause = rng.choice((0.0, 0.0, 0.0005, 0.002))

    def write(_conn: Connection) -> None:
        if pause:
            time.sleep(pause)

    return write


def _writer(url: str, clock: VirtualClock, writer: int, report: WriterReport,
            start: threading.Barrier) -> None:
    engine = db.make_engine(url, pool_size=1) if url.startswith("mysql") else db.make_engine(url)
    store = EventStore(engine, clock)
    rng = random.Random(writer)
    versions = {f"w{writer}-s{i}": 0 for i in range(STREAMS_PER_WRITER)}
    try:
        start.wait()
        for tick in range(TICKS_PER_WRITER):
            stream = rng.choice(sorted(versions))
            events: tuple[ev.Event, ...]
            if versions[stream] == 0:
                events = (accepted(stream),)
            else:
                events = tuple(no_active(f"{stream}-{tick}-{n}") for n in range(rng.randint(1, 3)))
            store.append(
                [StreamAppend(stream, versions[stream], events, Meta(actor=f"writer-{writer}"))],
                extra=[_hold_the_transaction_open(rng)],
            )
            versions[stream] += len(events)
            report.appended += len(events)
    except BaseException as error:  # reported to the test thread, which fails on it
        report.errors.append(error)
    finally:
        engine.dispose()


def test_a_tailing_reader_sees_every_event_once_in_commit_order(db_url: str, clock: VirtualClock) -> None:
    start = threading.Barrier(WRITERS + 1)
    reports = [WriterReport() for _ in range(WRITERS)]
    threads = [
        threading.Thread(target=_writer, args=(db_url, clock, w, reports[w], start), daemon=True)
        for w in range(WRITERS)
    ]
    for thread in threads:
        thread.start()

    reader_engine = db.make_engine(db_url)
    reader = EventStore(reader_engine, clock)
    seen: list[int] = []
    gaps: list[tuple[int, int]] = []
    checkpoint = 0
    start.wait()
    writers_done = False
    while True:
        writers_done = not any(t.is_alive() for t in threads)
        for batch in reader.read_batches(checkpoint, batch_size=50):
            for record in batch:
                if record.seq != checkpoint + 1:
                    gaps.append((checkpoint, record.seq))
                seen.append(record.seq)
                checkpoint = record.seq
        if writers_done:
            break
        time.sleep(0.001)
    for thread in threads:
        thread.join()

    assert [e for r in reports for e in r.errors] == []
    with reader_engine.connect() as conn:
        logged = conn.execute(sa.select(task_events.c.seq).order_by(task_events.c.seq)).scalars().all()
    reader_engine.dispose()
    total = sum(r.appended for r in reports)
    assert gaps == [], "the reader moved past a seq that committed later"
    assert len(logged) == total
    assert logged == list(range(1, total + 1))
    assert seen == logged
    assert len(set(seen)) == len(seen)


def test_each_writers_streams_keep_their_own_version_order(db_url: str, clock: VirtualClock) -> None:
    start = threading.Barrier(WRITERS)
    reports = [WriterReport() for _ in range(WRITERS)]
    threads = [
        threading.Thread(target=_writer, args=(db_url, clock, w, reports[w], start), daemon=True)
        for w in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e for r in reports for e in r.errors] == []

    store = EventStore(db.make_engine(db_url), clock)
    try:
        per_stream: dict[str, list[int]] = {}
        for record in store.read_after(0):
            per_stream.setdefault(record.stream_id, []).append(record.version)
        assert sum(len(v) for v in per_stream.values()) == sum(r.appended for r in reports)
        for stream, versions in per_stream.items():
            assert versions == list(range(1, len(versions) + 1)), stream
            assert store.read_stream(stream)[0].type_name == "TaskAccepted"
    finally:
        store.engine.dispose()


ROUNDS = 40


@dataclass
class RaceOutcome:
    won: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


def _racer(url: str, clock: VirtualClock, racer: int, gates: list[threading.Barrier],
           outcome: RaceOutcome) -> None:
    """Each round: append to the shared stream at the version both racers expect, plus
    an event to a stream of the racer's own (which must vanish with a lost race)."""
    engine = db.make_engine(url)
    store = EventStore(engine, clock)
    try:
        for round_no, gate in enumerate(gates):
            gate.wait()
            expected = store.read_stream("shared")[-1].version if round_no else 0
            gate.wait()
            shared_event = accepted(f"racer-{racer}") if round_no == 0 else no_active(
                f"racer-{racer}-round-{round_no}")
            try:
                store.append([
                    StreamAppend(f"own-{racer}-{round_no}", 0, (accepted(f"own-{racer}"),),
                                 Meta(actor=f"racer-{racer}")),
                    StreamAppend("shared", expected, (shared_event,), Meta(actor=f"racer-{racer}")),
                ])
                outcome.won.append(round_no)
            except ConcurrencyError:
                outcome.lost.append(round_no)
    except BaseException as error:  # reported to the test thread, which fails on it
        outcome.errors.append(error)
        for gate in gates:
            gate.abort()
    finally:
        engine.dispose()


def test_racing_writers_to_one_stream_have_exactly_one_winner_and_no_partial_write(
    db_url: str, clock: VirtualClock,
) -> None:
    gates = [threading.Barrier(2) for _ in range(ROUNDS)]
    outcomes = [RaceOutcome(), RaceOutcome()]
    threads = [
        threading.Thread(target=_racer, args=(db_url, clock, r, gates, outcomes[r]), daemon=True)
        for r in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes[0].errors + outcomes[1].errors == []

    for round_no in range(ROUNDS):
        winners = [r for r in (0, 1) if round_no in outcomes[r].won]
        losers = [r for r in (0, 1) if round_no in outcomes[r].lost]
        assert len(winners) == 1 and len(losers) == 1, f"round {round_no}: {winners=} {losers=}"

    store = EventStore(db.make_engine(db_url), clock)
    try:
        shared = store.read_stream("shared")
        assert [r.version for r in shared] == list(range(1, ROUNDS + 1))
        for round_no, record in enumerate(shared):
            (winner,) = [r for r in (0, 1) if round_no in outcomes[r].won]
            assert record.meta["actor"] == f"racer-{winner}"
        for racer in (0, 1):
            for round_no in range(ROUNDS):
                own = store.read_stream(f"own-{racer}-{round_no}")
                assert len(own) == (1 if round_no in outcomes[racer].won else 0)
        assert store.head() == 2 * ROUNDS
        with store.engine.connect() as conn:
            seqs = conn.execute(sa.select(task_events.c.seq).order_by(task_events.c.seq)).scalars().all()
        assert seqs == list(range(1, 2 * ROUNDS + 1)), "a lost race must not burn seq numbers"
    finally:
        store.engine.dispose()


def test_the_losing_controller_keeps_neither_the_event_nor_the_job_row_change(
    db_url: str, clock: VirtualClock,
) -> None:
    """Two full apps (store + TaskStates + job-table projection) race on one task."""
    apps = [open_app(Settings(db_url=db_url), clock) for _ in (0, 1)]
    try:
        with apps[0].engine.begin() as conn:
            conn.execute(job.insert().values(id="t", name="t", actor="user-a", status="Pending",
                                             created_at=SUBMITTED))
        apps[0].store.append([StreamAppend("t", 0, (accepted("t"),), Meta(actor="setup"))])
        apps[1].tasks.fold(apps[1].store.read_stream("t"))
        apps[1].tasks.committed()

        gate = threading.Barrier(2)
        results: list[str] = ["", ""]

        def race(index: int) -> None:
            app = apps[index]
            gate.wait()
            try:
                app.store.append([StreamAppend("t", 1, (no_active(f"app-{index}"),),
                                               Meta(actor=f"app-{index}"))])
                results[index] = "won"
            except ConcurrencyError:
                results[index] = "lost"

        threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == ["lost", "won"]
        winner, loser = results.index("won"), results.index("lost")
        with apps[0].engine.connect() as conn:
            message = conn.execute(sa.select(job.c.message).where(job.c.id == "t")).scalar_one()
        assert f"app-{winner}" in message and f"app-{loser}" not in message
        assert apps[winner].tasks.get("t").version == 2
        assert apps[loser].tasks.get("t").version == 1, "the loser's staged fold was discarded"
    finally:
        for app in apps:
            app.close()


def test_readers_are_not_blocked_by_an_append_in_flight(db_url: str, clock: VirtualClock) -> None:
    """WAL (SQLite) and READ COMMITTED (MySQL) let a reader see the last committed log
    while an append holds the write lock; a reader must not queue behind the writer."""
    writer = EventStore(db.make_engine(db_url), clock)
    reader = EventStore(db.make_engine(db_url), clock)
    writer.append([StreamAppend("first", 0, (accepted("first"),), Meta(actor="w"))])
    inside, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold(_conn: Connection) -> None:
        inside.set()
        release.wait(30)

    def append_and_hold() -> None:
        try:
            writer.append([StreamAppend("second", 0, (accepted("second"),), Meta(actor="w"))],
                          extra=[hold])
        except BaseException as error:  # reported to the test thread, which fails on it
            failures.append(error)

    thread = threading.Thread(target=append_and_hold, daemon=True)
    thread.start()
    try:
        assert inside.wait(30)
        began = time.monotonic()
        assert reader.head() == 1
        assert [r.stream_id for r in reader.read_after(0)] == ["first"]
        assert reader.read_stream("second") == []
        assert time.monotonic() - began < 5, "the reader waited for the writer's lock"
    finally:
        release.set()
        thread.join()
        assert failures == []
    assert reader.head() == 2
    writer.engine.dispose()
    reader.engine.dispose()
