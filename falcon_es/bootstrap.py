"""The one place that wires the application: engine, store, inline projections,
and (for the controller) the ports' adapters. Part of the composition root, with
the CLI; the core modules never import projections, handlers or adapters."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine

from falcon_es.runtime import Controller

from falcon_es import db
from falcon_es.clock import Clock, WallClock
from falcon_es.cluster_cache import ClusterCache
from falcon_es.ports import Ports
from falcon_es.settings import Settings
from falcon_es.store import EventStore, InlineProjection
from falcon_es.task import TaskStates
from falcon_es.projections.job_table import JobTableProjection
from falcon_es.projections.queues import QueueView


@dataclasses.dataclass
class App:
    settings: Settings
    engine: Engine
    clock: Clock
    store: EventStore
    tasks: TaskStates
    queue_view: QueueView | None = None
    #: The cluster registry as ticks read it (kept current by the store's appends).
    cluster_cache: ClusterCache | None = None

    def close(self) -> None:
        self.engine.dispose()


def open_app(settings: Settings, clock: Clock | None = None, *, engine: Engine | None = None,
             extra_projections: Callable[[TaskStates], Sequence[InlineProjection]] | None = None,
             ) -> App:
    """``extra_projections`` adds inline projections built on the task states (metrics)."""
    engine = engine or db.make_engine(settings.db_url)
    clock = clock or WallClock()
    tasks = TaskStates()
    queue_view = QueueView(tasks, settings.language)
    extra = list(extra_projections(tasks)) if extra_projections else []
    cluster_cache = ClusterCache(engine)
    store = EventStore(engine, clock, projections=[
        tasks, JobTableProjection(tasks, settings.language), queue_view, *extra,
        cluster_cache])
    return App(settings, engine, clock, store, tasks, queue_view, cluster_cache)


def load_task_states(app: App) -> None:
    """Fold the log once at start so handlers see every task's state."""
    if app.queue_view is not None:
        app.queue_view.load(app.store.read_batches(0, batch_size=5000))
        return
    for batch in app.store.read_batches(0, batch_size=5000):
        app.tasks.fold(batch)
        app.tasks.committed()


def build_controller(app: App, *, ports: Ports | None = None, handlers: tuple | None = None) -> Controller:
    """The controller loop wired to this app's store, views and ports."""
    from falcon_es.context import HandlerContext
    from falcon_es.inbox import JobInbox
    from falcon_es.registry import Cluster, list_clusters
    from falcon_es.runtime import Controller
    from falcon_es.effects import EffectExecutor
    from falcon_es.handlers import HANDLERS, timeouts
    from falcon_es.handlers.intake import INTAKE_BATCH
    from falcon_es.handlers.status import ack_folded

    inbox = JobInbox(app.engine)
    # The after-commit effect executor carries out the intents the handlers record.
    effects = EffectExecutor(app.store, app.tasks, app.settings, ports) if ports else None
    if effects is not None:
        effects.index.wake_of = timeouts.wake_of(app.settings)

    def read_clusters() -> list[Cluster]:
        if app.cluster_cache is not None:
            return app.cluster_cache.clusters()
        with app.engine.connect() as conn:
            return list_clusters(conn)

    def make_context() -> HandlerContext:
        # One poll of the upper layer's inputs per tick, shared by the intake handlers.
        return HandlerContext(app.settings, app.clock.now(), app.tasks, read_clusters(),
                              inbox.poll(INTAKE_BATCH), ports,
                              queues=app.queue_view.book if app.queue_view else None,
                              effects=effects,
                              outcomes=effects.take_outcomes() if effects else ())

    load_task_states(app)
    after_commit = (effects.after_commit, ack_folded) if effects else ()
    reloaded = (app.queue_view.resync,) if app.queue_view else ()
    return Controller(app.store, app.tasks, handlers or HANDLERS, make_context,
                      after_commit=after_commit, reloaded=reloaded,
                      controller_id=app.settings.controller_id)
