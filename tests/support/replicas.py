"""Controllers elected by the database lock, run as ``falcon-es run`` runs them
(``service.serve_elected``) in threads of the test, on one simulated world.

A test starts one or two ``Replica`` objects on a database, makes the database or a
replica misbehave, and then compares what the log and the job table say with a run
of one undisturbed controller (``outcomes``), and that no pool or Job was created
twice (``Effects``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from falcon_es.adapters.sim import SimWorld
from falcon_es.app import service
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.config.settings import Settings
from falcon_es.domain.clock import VirtualClock, utcnow
from falcon_es.engine.leader import DatabaseLock
from falcon_es.engine.loop import LoopReport
from falcon_es.engine.runtime import Handler, TickReport
from falcon_es.handlers import HANDLERS
from falcon_es.jobtable import job_rows
from falcon_es.jobtable.job_rows import NewTask
from falcon_es.observability.health import HealthServer
from falcon_es.projections import replay
from falcon_es.storage import db
from falcon_es.storage.store import EventStore
from falcon_es.storage.tables import JobTable
from tests.support.harness import reserved_cluster, sim_config

WORLD = sim_config(reserved_cluster(count=16))
SPEC: Mapping[str, Any] = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                           "topology": "2x2", "command": ["python", "train.py"]}


def shared_world(clock: VirtualClock, url: str) -> SimWorld:
    """One simulated GKE + Kubernetes every replica of a test talks to, its cluster
    registered as an operator registers it before a controller runs."""
    app = open_app(Settings(db_url=url), clock)
    try:
        register_sim_clusters(app, WORLD)
    finally:
        app.close()
    return SimWorld(clock, WORLD)


def submit_tasks(url: str, count: int, clock: VirtualClock) -> list[str]:
    """``count`` tasks of varied run times, submitted as the upper layer submits them;
    their names (``t000``...), which are the same in every run of a test."""
    engine = db.make_engine(url)
    names = [f"t{n:03d}" for n in range(count)]
    try:
        job_rows.submit_many(engine, [
            NewTask(name=name, actor=f"user-{n % 3}",
                    spec={**SPEC, "sim": {"duration_seconds": 120 + 60 * (n % 5)}})
            for n, name in enumerate(names)], clock.now())
    finally:
        engine.dispose()
    return names


class Effects:
    """Every Job the simulated Kubernetes API really created, counted at the world's
    boundary (an "already exists" answer creates nothing)."""

    def __init__(self, world: SimWorld, monkeypatch: pytest.MonkeyPatch) -> None:
        self.world = world
        self.jobs: collections.Counter[str] = collections.Counter()
        kube = world.cluster(WORLD.clusters[0].name).kube
        create = kube.submit

        def counted(manifest: Mapping[str, Any], now: Any) -> Any:
            ref = create(manifest, now)
            self.jobs[ref.name] += 1
            return ref

        monkeypatch.setattr(kube, "submit", counted)

    def created_twice(self) -> dict[str, int]:
        pools = collections.Counter(p.name for p in self.world.pools(include_deleted=True))
        return {name: n for name, n in (pools + self.jobs).items() if n > 1}


@dataclasses.dataclass
class Replica:
    """One controller process, played by a thread: ``serve_elected`` with the database
    lock as its election, building each term as ``falcon-es run`` does."""

    name: str
    url: str
    world: SimWorld
    clock: VirtualClock
    settings: Settings
    handlers: Sequence[Handler] = HANDLERS
    on_tick: Callable[[TickReport], None] | None = None
    until_idle: bool = False
    lock_class: type[DatabaseLock] = DatabaseLock
    #: Seconds between this replica's tries for the lock while it stands by.
    retry_period: float = 0.05
    health: HealthServer | None = None
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    report: LoopReport | None = None
    error: BaseException | None = None
    terms: int = 0

    def __post_init__(self) -> None:
        self.settings = self.settings.overridden(database={"controller_id": f"falcon-{self.name}"})
        self.engine = db.make_engine(self.url, self.settings.database)
        self.election = self.lock_class(self.engine, identity=f"controller-{self.name}",
                                        lock_timeout=self.settings.database.lock_timeout,
                                        retry_period=self.retry_period)
        self.thread = threading.Thread(target=self._serve, name=f"replica-{self.name}",
                                       daemon=True)

    def start(self) -> Replica:
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"replica {self.name} did not end in {timeout}s"

    def halt(self) -> None:
        self.stop.set()
        if self.thread.ident is not None:
            self.thread.join(30)
        self.engine.dispose()

    def _build(self, leadership: Any) -> service.Service:
        app = open_app(self.settings, self.clock, fenced_as=self.election.identity)
        self.terms += 1
        options = RunOptions(world=self.world, world_continues=True, leadership=leadership,
                             tick_seconds=0.01, handlers=self.handlers, on_tick=self.on_tick)
        try:
            return build_service(app, None, options)
        except BaseException:
            app.close()
            raise

    def _database_check(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def _serve(self) -> None:
        try:
            self.report = service.serve_elected(
                self._build, self.election, until_idle=self.until_idle, stop=self.stop,
                health=self.health, outage_limit=self.settings.database.outage_limit,
                database_check=self._database_check)
        except BaseException as error:  # the test asserts there was none
            self.error = error


def outcomes(url: str) -> dict[str, tuple[str, str | None]]:
    """Each task's Status and Reason in the job table, by the task's name."""
    engine = db.make_engine(url)
    job = JobTable()
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(job.c.name, job.c.status, job.c.reason)).all()
    finally:
        engine.dispose()
    return {row.name: (row.status, row.reason) for row in rows}


def wait_until_ended(url: str, count: int, timeout: float = 120.0) -> None:
    """Until each of ``count`` tasks has ended (Succeeded or Failed) in the job table."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = [s for s, _ in outcomes(url).values() if s in ("Succeeded", "Failed")]
        if len(ended) == count:
            return
        time.sleep(0.1)
    raise AssertionError(f"not every task ended within {timeout}s: {outcomes(url)}")


def writers_in_order(url: str) -> list[str]:
    """The controller of every event a controller appended, in seq order (consecutive
    repeats folded: one entry per run of one writer; the registry's events, written
    by the operator's command, name none)."""
    store = EventStore(db.make_engine(url), VirtualClock(utcnow()))
    try:
        order: list[str] = []
        for record in store.read_after(0):
            who = str(record.meta.get("controller", ""))
            if who and (not order or order[-1] != who):
                order.append(who)
        return order
    finally:
        store.engine.dispose()


def verify_replay(url: str) -> list[Any]:
    """``falcon-es replay --verify``'s differences (none when the views match the log)."""
    app = open_app(Settings(db_url=url), VirtualClock(utcnow()))
    try:
        return replay.verify(app.engine, app.store, "en", job=app.job)
    finally:
        app.close()

