"""The application: the store with its inline projections (task states, job table,
queue view, lifecycle index, cluster cache, live set), opened by every command that
reads or appends, and the one a controller is built on (``bootstrap.build_service``).
Its own module, so what a service names (``Service.app``) needs not import the
builder."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from falcon_es.config.settings import Settings
from falcon_es.domain.clock import Clock, WallClock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.queue_book import QueueBook
from falcon_es.domain.task_states import TaskStates
from falcon_es.engine.cluster_cache import ClusterCache
from falcon_es.engine.follow import LogFollower
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.live_set import LiveSet
from falcon_es.handlers import timeouts
from falcon_es.projections.job_table import (
    JobTableProjection, RefusedRowsProjection, RowCheckProjection,
)
from falcon_es.projections.queues import Predictions, QueueView
from falcon_es.storage import db, fence
from falcon_es.storage.store import EventStore, InlineProjection
from falcon_es.storage.tables import JobTable

if TYPE_CHECKING:
    from falcon_es.observability.metrics import Metrics

log = logging.getLogger("falcon_es.app.application")


@dataclasses.dataclass(frozen=True)
class App:
    settings: Settings
    engine: Engine
    clock: Clock
    store: EventStore
    tasks: TaskStates
    #: The scheduler's queues and the waiting positions in the job table.
    queue_view: QueueView
    #: Which tasks each lifecycle handler looks at, who holds each pool, what is due.
    index: LifecycleIndex
    #: The cluster registry as ticks read it (kept current by the store's appends).
    cluster_cache: ClusterCache
    #: Which streams stay in memory and are folded at start (kept in each append).
    live: LiveSet
    #: Folds what another writer appended (only when nothing guarantees one writer).
    follower: LogFollower | None = None
    #: The upper layer's job table, under the settings' names.
    job: JobTable = dataclasses.field(default_factory=JobTable)
    #: The process's metrics, whose projection follows each commit (None: not measured).
    metrics: Metrics | None = None

    @property
    def clusters(self) -> Callable[[], list[Cluster]]:
        """The registered clusters as ticks read them (what a simulated world simulates)."""
        return self.cluster_cache.clusters

    def close(self) -> None:
        try:
            self.live.write_waiting()
        except Exception as error:  # noqa: BLE001 - the next start retires them anyway
            log.warning("the live set's waiting rows were not written at close: %s",
                        db.first_line(error))
        self.engine.dispose()


def open_app(settings: Settings, clock: Clock | None = None, *, engine: Engine | None = None,
             metrics: Metrics | None = None, follow_log: bool = False,
             predictions: Predictions | None = None, fenced_as: str | None = None) -> App:
    """The store and its inline projections. ``metrics`` adds its projection, so
    transition histograms and event counts follow each commit; ``follow_log`` folds
    what another writer appended before each tick (one read of the log head per
    tick), for when nothing guarantees a single writer; ``predictions`` is told every
    expected start the queue view writes (``simulate`` and ``bench e2e`` measure
    the estimates with it); ``fenced_as`` begins an elected controller's term: it takes
    the log's writer fence under that name, and every append of this app is refused
    once another controller has taken it since (``storage.fence``)."""
    engine = engine or db.make_engine(settings.database.db_url, settings.database)
    clock = clock or WallClock()
    job = JobTable(settings.job_mapping, db.message_room(engine, settings.job_mapping))
    tasks = TaskStates()
    queue_view = QueueView(tasks, settings.job_table.language, QueueBook(settings.scheduling.priorities),
                           job=job, clock=clock,
                           refresh_seconds=settings.scheduling.position_refresh_seconds,
                           predictions=predictions)
    index = LifecycleIndex(tasks, wake_of=timeouts.wake_of(settings))
    follower = LogFollower(tasks) if follow_log else None
    cluster_cache = ClusterCache(engine)
    live = LiveSet(tasks, index, create_grace_seconds=settings.lifecycle.create_visibility_grace_seconds,
                   served_with_each_append=follow_log)
    language = settings.job_table.language
    # Refusals before the task rows: a row refused DuplicateId is never its id's task's.
    projections: list[InlineProjection] = [
        tasks, RefusedRowsProjection(job, language), JobTableProjection(tasks, job, language),
        RowCheckProjection(tasks, job, language), queue_view, index]
    if follower is not None:
        projections.append(follower)
    if metrics is not None:
        projections.append(metrics.projection(tasks))
    # Last: it judges what the append staged and evicts once the others committed.
    projections.extend((cluster_cache, live))
    store = EventStore(engine, clock, projections=projections,
                       fence=fence.take(engine, fenced_as) if fenced_as is not None else None)
    live.attach(store)
    if follower is not None:
        # The head before the fold: events appended meanwhile are read again and told
        # apart by version, never missed.
        follower.attach(store, position=store.head(), queues=queue_view, index=index,
                        live=live)
    return App(settings, engine, clock, store, tasks, queue_view, index, cluster_cache,
               live, follower, job, metrics)


def load_task_states(app: App) -> None:
    """Fold the live streams once at start (not the whole log: what has ended and
    holds nothing is not needed by any tick) so handlers see every live task's state,
    and take the positions the job table holds as written."""
    served = app.live.load()
    app.queue_view.load_live(app.tasks.all(), served)
    app.queue_view.read_written(app.engine)
    app.index.rebuild()
    app.live.settle()
