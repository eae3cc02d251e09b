"""The composition root: the one place that builds the application.

``open_app`` builds the store with its inline projections (task states, job table,
queue view, lifecycle index, cluster cache) for every command that reads or appends;
``build_service`` builds a running controller on top: the chosen backend's ports, the
effect executor, the handlers, the controller and its loop, every part set at
construction. ``run``, ``demo``, ``simulate``, the benchmarks and the test harness all
start here; the core modules never import handlers, projections or adapters.

On the sim backend the world simulates the clusters of the registry and registers
none: ``demo``, ``simulate`` and ``bench`` register the clusters of their world file
themselves (``register_sim_clusters``) before they build the service.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from falcon_es.domain.clusters import Cluster
from falcon_es.storage import db, registry
from falcon_es.domain.clock import Clock, VirtualClock, WallClock, utcnow
from falcon_es.engine.cluster_cache import ClusterCache
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.effects import EffectExecutor
from falcon_es.engine.follow import LogFollower
from falcon_es.handlers import HANDLERS, timeouts
from falcon_es.handlers.intake import INTAKE_BATCH
from falcon_es.handlers.status import ack_folded
from falcon_es.jobtable.inbox import JobInbox
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.engine.live_set import LiveSet
from falcon_es.engine.loop import Leadership, Loop, Script, leadership_fence
from falcon_es.domain.ports import Ports
from falcon_es.projections.job_table import (
    JobTableProjection, RefusedRowsProjection, RowCheckProjection,
)
from falcon_es.projections.queues import QueueView
from falcon_es.engine.reservation_reads import ReservationReads
from falcon_es.engine.runtime import AfterCommit, Controller, Handler, Tick, TickReport
from falcon_es.domain.queue_book import QueueBook
from falcon_es.app.service import Service
from falcon_es.config.settings import PUBSUB_BUS, SIM_BUS, Settings
from falcon_es.storage.store import EventStore, InlineProjection, RecordedEvent
from falcon_es.storage.tables import JobTable
from falcon_es.domain.task import TaskStates

if TYPE_CHECKING:
    from falcon_es.adapters.sim import SimConfig, SimWorld
    from falcon_es.adapters.sim.persist import WorldStore
    from falcon_es.observability.metrics import Metrics

log = logging.getLogger("falcon_es.app.bootstrap")
BACKENDS = ("sim", "gcp")
#: Where a registered cluster lives when a sim config entry does not say (demo,
#: simulate and bench register their world's clusters with these).
SIM_PROJECT, SIM_LOCATION, SIM_BUCKET = "falcon-sim", "us-central1-a", "falcon-sim-logs"


class BackendError(ValueError):
    """The backend cannot be built from this configuration (says what is missing)."""


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

    def close(self) -> None:
        self.engine.dispose()


def open_app(settings: Settings, clock: Clock | None = None, *, engine: Engine | None = None,
             metrics: Metrics | None = None, follow_log: bool = False) -> App:
    """The store and its inline projections. ``metrics`` adds its projection, so
    transition histograms and event counts follow each commit; ``follow_log`` folds
    what another writer appended before each tick (one read of the log head per
    tick), for when nothing guarantees a single writer."""
    engine = engine or db.make_engine(settings.db_url)
    clock = clock or WallClock()
    job = JobTable(settings.job_mapping)
    tasks = TaskStates()
    queue_view = QueueView(tasks, settings.language, QueueBook(settings.priorities),
                           job=job, clock=clock,
                           refresh_seconds=settings.position_refresh_seconds)
    index = LifecycleIndex(tasks, wake_of=timeouts.wake_of(settings))
    follower = LogFollower(tasks) if follow_log else None
    cluster_cache = ClusterCache(engine)
    live = LiveSet(tasks, index, create_grace_seconds=settings.create_visibility_grace_seconds)
    # Refusals before the task rows: a row refused DuplicateId is never its id's task's.
    projections: list[InlineProjection] = [
        tasks, RefusedRowsProjection(job, settings.language),
        JobTableProjection(tasks, job, settings.language),
        RowCheckProjection(tasks, job, settings.language), queue_view, index]
    if follower is not None:
        projections.append(follower)
    if metrics is not None:
        projections.append(metrics.projection(tasks))
    # Last: it judges what the append staged and evicts once the others committed.
    projections.extend((cluster_cache, live))
    store = EventStore(engine, clock, projections=projections)
    live.attach(store)
    if follower is not None:
        # The head before the fold: events appended meanwhile are read again and told
        # apart by version, never missed.
        follower.attach(store, position=store.head(), queues=queue_view, index=index,
                        live=live)
    return App(settings, engine, clock, store, tasks, queue_view, index, cluster_cache,
               live, follower, job)


def load_task_states(app: App) -> None:
    """Fold the live streams once at start (not the whole log: what has ended and
    holds nothing is not needed by any tick) so handlers see every live task's state,
    and take the positions the job table holds as written."""
    served = app.live.load()
    app.queue_view.load_live(app.tasks.all(), served)
    app.queue_view.read_written(app.engine)
    app.index.rebuild()
    app.live.settle()


def gcp_ports(settings: Settings, clock: Clock) -> Ports:
    """The ports of the gcp backend: the Google Cloud and Kubernetes clients (the sim
    backend's are its world's, built by ``build_service``)."""
    from falcon_es.adapters.gcp import build_gcp_ports

    return build_gcp_ports(settings, clock=clock)


def sim_world(clock: Clock, config: str | Path | SimConfig | None, seed: int | None,
              app: App) -> SimWorld:
    """The simulated world of ``config`` (a file, a loaded config, or None: the packaged
    default), simulating the clusters of ``app``'s registry."""
    from falcon_es.adapters.sim import SimConfig, SimWorld, behaviour_from_tasks, load_sim_config

    loaded = config if isinstance(config, SimConfig) else load_sim_config(config)
    return SimWorld(clock, loaded, seed=seed, behaviour_source=behaviour_from_tasks(app.tasks),
                    registry=app.cluster_cache.clusters)


def saved_sim_world(clock: Clock, config: str | Path | SimConfig | None, seed: int | None,
                    app: App, store: WorldStore) -> SimWorld:
    """The world ``store`` saved in ``app``'s database, on ``clock`` (moved up to the
    world's moment), else a new one (``sim_world``) saved there from now on."""
    from falcon_es.adapters.sim import behaviour_from_tasks
    from falcon_es.adapters.sim.persist import SavedWorldError

    try:
        world = store.load(clock, behaviour_source=behaviour_from_tasks(app.tasks),
                           registry=app.cluster_cache.clusters)
    except SavedWorldError as error:
        raise BackendError(str(error)) from error
    if world is None:
        world = sim_world(clock, config, seed, app)
        store.attach(world)
        _note_unregistered(app, world)
    else:
        log.info("going on in the simulated world saved in the database (its clock at %s, "
                 "%d cluster(s) simulated); --sim-config and --seed apply to a new world only",
                 world.now().isoformat(sep=" "), len(world.simulated()))
    return world


def staging_ports(settings: Settings, world: SimWorld,
                  ports: Ports) -> tuple[Ports, Callable[[], object]]:
    """The sim backend's ports with Pub/Sub as the bus the outside sees (a staging
    world): the ops stream is published to Pub/Sub, and the relay (to be called after
    each tick) publishes there every edge observation the simulated informers deliver.
    The controller still pulls the edge events from the simulated bus, on the world's
    clock."""
    from falcon_es.adapters.gcp.wiring import pubsub_bus
    from falcon_es.adapters.staging import EdgeRelay, StagingBus

    pubsub = pubsub_bus(settings)
    relay = EdgeRelay(world.bus, world.config.delivery.topic, pubsub, settings.edge_events_topic)
    return dataclasses.replace(ports, bus=StagingBus(pubsub, ports.bus)), relay


def _also(step: Callable[[], object],
          on_tick: Callable[[TickReport], None] | None) -> Callable[[TickReport], None]:
    """``on_tick`` with ``step`` run first, after every tick."""

    def after_tick(report: TickReport) -> None:
        step()
        if on_tick is not None:
            on_tick(report)

    return after_tick


def continue_world(world: SimWorld, app: App) -> None:
    """A later leadership term goes on in the world of the term before: the world's Jobs
    take their behaviour from this term's task states, and it simulates this term's
    view of the registry (the earlier term's app is closed)."""
    from falcon_es.adapters.sim import behaviour_from_tasks

    world.behaviour_source = behaviour_from_tasks(app.tasks)
    world.registry = app.cluster_cache.clusters


def register_sim_clusters(app: App, config: SimConfig) -> list[Cluster]:
    """Register the clusters ``config`` describes that the registry does not know yet,
    with the entry's project, location, TPU type, bucket and default reservation (where
    the entry leaves one out: ``SIM_PROJECT``, ``SIM_LOCATION``, ``SIM_BUCKET``). For the
    commands that bring their own world (``demo``, ``simulate``, ``bench``): a
    controller on the sim backend simulates what the registry has and registers none."""
    from falcon_es.adapters.sim import SimConfigError

    with app.engine.connect() as conn:
        known = {c.name for c in registry.list_clusters(conn)}
    added = []
    for entry in config.clusters:
        if entry.name in known:
            continue
        if not entry.tpu_type:
            raise SimConfigError(f"sim config {config.source}: clusters.{entry.name}: no "
                                 "tpu_type, so the cluster cannot be registered")
        added.append(registry.add_cluster(
            app.store, name=entry.name, project=entry.project or SIM_PROJECT,
            location=entry.location or SIM_LOCATION, tpu_type=entry.tpu_type,
            gcs_bucket=entry.gcs_bucket or SIM_BUCKET,
            default_reservation=entry.default_reservation,
        ))
    return added


def _note_unregistered(app: App, world: SimWorld) -> None:
    """One line per cluster the sim config describes but the registry lacks: a name
    that differs by a typo would otherwise leave a cluster on the defaults unseen."""
    registered = [c.name for c in app.cluster_cache.clusters()]
    for name in world.config.unregistered(registered):
        log.warning("sim config %s describes cluster %s, which is not registered: it is "
                    "simulated once registered (falcon-es cluster add %s ...); registered: %s",
                    world.config.source, name, name, ", ".join(registered) or "none",
                    extra={"cluster": name})


def build_service(
    settings: Settings, *, backend: str = "sim", sim_config: str | Path | SimConfig | None = None,
    seed: int | None = None, clock: Clock | None = None, realtime: bool = False,
    tick_seconds: float = 1.0,
    on_tick: Callable[[TickReport], None] | None = None, ports: Ports | None = None,
    metrics: Metrics | None = None, world: SimWorld | None = None,
    sim_snapshot_every: int = 0,
    leadership: Leadership | None = None, follow_log: bool = False,
    handlers: Sequence[Handler] = HANDLERS, app: App | None = None,
    before_effects: Sequence[AfterCommit] = (), script: Script | None = None,
    resolution: float = 0.0,
) -> Service:
    """A controller, ready to run. ``world`` reuses a simulated world (several
    controllers, or several leadership terms, on one world); ``ports`` are the ports to
    run on instead of the backend's own (the gcp clients built once for every term, or
    a test's fault-injecting wrapper of the sim's); ``sim_snapshot_every`` > 0 keeps
    the simulated world in the database (loaded from there when ``world`` is None),
    saved in each commit and compacted every that many saves;
    ``leadership`` fences the loop and
    every commit with a lease; ``app`` is an app opened already (one whose registry was
    set up first: demo, simulate, bench, a test); ``before_effects`` run after each commit ahead of the effect
    executor (a test's crash points); ``script`` is the upper layer of a run that ends
    when its script does (demo, simulate, bench)."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if clock is None:
        clock = app.clock if app is not None else (
            WallClock() if realtime or backend == "gcp" else VirtualClock(utcnow()))
    if app is None:
        app = open_app(settings, clock, metrics=metrics, follow_log=follow_log)
    world_store: WorldStore | None = None
    if backend == "sim":
        if world is None and sim_snapshot_every > 0:
            from falcon_es.adapters.sim.persist import WorldStore

            world_store = WorldStore(app.engine, compact_every=sim_snapshot_every)
            world = saved_sim_world(clock, sim_config, seed, app, world_store)
        elif world is None:
            world = sim_world(clock, sim_config, seed, app)
            _note_unregistered(app, world)
        # The status handler pulls settings.edge_events_subscription on either backend:
        # attach it to the topic the simulated informers publish to.
        world.bus.subscribe(world.config.delivery.topic, settings.edge_events_subscription)
        ports = ports or world.ports()
        if settings.bus == PUBSUB_BUS:
            ports, relay = staging_ports(settings, world, ports)
            on_tick = _also(relay, on_tick)
    else:
        world = None
        if settings.bus == SIM_BUS:
            raise BackendError("FALCON_BUS=sim with the gcp backend: the edge clusters' "
                               "informers publish to Pub/Sub, so the gcp backend's bus is "
                               "Pub/Sub (unset FALCON_BUS or set it to pubsub)")
        if ports is None:
            ports = gcp_ports(settings, clock)
    if metrics is not None:
        from falcon_es.observability.metered import metered_ports

        ports = metered_ports(ports, metrics)
    load_task_states(app)
    executor = EffectExecutor(app.store, app.tasks, settings, ports, app.index,
                              orphans_from=app.live.orphan_start)
    controller = _controller(app, ports, executor, handlers, before_effects=before_effects,
                             metrics=metrics, leadership=leadership, world_store=world_store)
    loop = _loop(app, ports, executor, controller, world, clock, leadership=leadership,
                 on_tick=on_tick, tick_seconds=tick_seconds, script=script,
                 resolution=resolution)
    return Service(app=app, ports=ports, index=app.index, executor=executor,
                   controller=controller, loop=loop, world=world)


def _controller(app: App, ports: Ports, executor: EffectExecutor,
                handlers: Sequence[Handler], *, before_effects: Sequence[AfterCommit],
                metrics: Metrics | None, leadership: Leadership | None,
                world_store: WorldStore | None = None) -> Controller:
    inbox = JobInbox(app.engine, app.job, clock=app.clock,
                     ignored=metrics.job_row_ignored if metrics is not None else None,
                     diverged=metrics.job_row_diverged if metrics is not None else None)
    settings = app.settings
    reservation_reads = ReservationReads(settings.reservation_read_seconds)

    def make_context() -> HandlerContext:
        # One poll of the upper layer's inputs per tick, shared by the intake handlers.
        return HandlerContext(settings, app.clock.now(), app.tasks,
                              app.cluster_cache.clusters(), inbox.poll(INTAKE_BATCH), ports,
                              queues=app.queue_view.book, index=app.index, executor=executor,
                              outcomes=executor.take_outcomes(), retired=app.live,
                              reservation_reads=reservation_reads)

    def refresh_positions(ctx: HandlerContext, recorded: Sequence[RecordedEvent]) -> None:
        # Position Messages due when no append came to carry them (the interval of a
        # queue ran out): written behind the same lease fence as a tick's commit.
        if leadership is None or leadership.may_append():
            app.queue_view.refresh_due(app.engine)

    after_commit: list[AfterCommit] = [*before_effects, executor.after_commit, ack_folded,
                                       refresh_positions]
    if metrics is not None:
        after_commit.append(metrics.edge_observations_folded)
    before_commit: list[Handler] = [leadership_fence(leadership)] if leadership is not None else []
    if world_store is not None:
        store = world_store

        def save_world(tick: Tick, ctx: HandlerContext) -> None:
            # The world as it stands, written with the tick's events or not at all.
            tick.write(store.save)

        before_commit.append(save_world)
    return Controller(app.store, app.tasks, handlers, make_context,
                      after_commit=after_commit, before_commit=before_commit,
                      reloaded=(app.queue_view.resync, app.index.resync, app.live.resync),
                      controller_id=settings.controller_id)


def _loop(app: App, ports: Ports, executor: EffectExecutor, controller: Controller,
          world: SimWorld | None, clock: Clock, *, leadership: Leadership | None,
          on_tick: Callable[[TickReport], None] | None, tick_seconds: float,
          script: Script | None, resolution: float) -> Loop:
    index = app.index
    due_sources = [index.next_wake, executor.next_due, app.queue_view.next_refresh]
    if ports.next_due is not None:
        due_sources.append(ports.next_due)

    def settled() -> bool:
        return Service.settled_state(app.tasks, index, executor)

    return Loop(
        controller=controller, clock=clock, due_sources=due_sources,
        has_work=lambda: executor.has_outcomes, settled=settled, on_tick=on_tick,
        tick_seconds=tick_seconds, advance_world=world.step if world is not None else None,
        leadership=leadership,
        follow_log=app.follower.catch_up if app.follower is not None else None,
        script=script, resolution=resolution,
    )
