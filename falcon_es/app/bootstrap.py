"""The composition root: the one place that builds a running controller.

``build_service(app, ports, options)`` builds it on an opened application
(``falcon_es.app.application``): the chosen backend's ports (the sim world's, wired by
``falcon_es.adapters.sim.wiring``, or the Google clients, by
``falcon_es.adapters.gcp.wiring``), the effect executor, the handlers, the controller
and its loop, every part set here and none changed afterwards. ``RunOptions`` is how it
runs; ``Settings`` (on the app) is what an operator configured. ``run``, ``demo``,
``simulate``, the benchmarks and the test harness all start here; the core modules
never import handlers, projections or adapters.

On the sim backend the world simulates the clusters of the registry and registers
none: ``demo``, ``simulate`` and ``bench`` register the clusters of their world file
themselves (``register_sim_clusters``) before they build the service.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from falcon_es.app.application import App, load_task_states
from falcon_es.app.service import Service
from falcon_es.config.settings import PUBSUB_BUS, SIM_BUS, Settings
from falcon_es.domain.clock import Clock, VirtualClock, WallClock, utcnow
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import Ports
from falcon_es.engine.cluster_calls import ApiHealth, ClusterCalls, health_recorded
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.effects import EffectExecutor
from falcon_es.engine.loop import Leadership, Loop, Script, leadership_fence
from falcon_es.engine.observed import ObservedReads, observed_ports
from falcon_es.engine.reservation_reads import ReservationReads
from falcon_es.engine.runtime import AfterCommit, Controller, Handler, Tick, TickReport
from falcon_es.handlers import HANDLERS
from falcon_es.handlers.intake import INTAKE_BATCH
from falcon_es.handlers.status import ack_folded
from falcon_es.domain.ports import JobObservation
from falcon_es.jobtable.inbox import JobInbox
from falcon_es.storage.store import RecordedEvent

if TYPE_CHECKING:
    from falcon_es.adapters.sim import SimConfig, SimWorld
    from falcon_es.adapters.sim.persist import WorldStore

__all__ = ["BACKENDS", "BackendError", "RunOptions", "build_service", "register_sim_clusters"]
BACKENDS = ("sim", "gcp")


class BackendError(ValueError):
    """The backend cannot be built from this configuration (says what is missing)."""


def gcp_ports(settings: Settings, clock: Clock) -> Ports:
    """The ports of the gcp backend: the Google Cloud and Kubernetes clients (the sim
    backend's are its world's, built by ``build_service``)."""
    from falcon_es.adapters.gcp import build_gcp_ports

    return build_gcp_ports(settings, clock=clock)


def register_sim_clusters(app: App, config: SimConfig) -> list[Cluster]:
    """The clusters ``config`` describes registered in ``app``'s registry
    (``falcon_es.adapters.sim.wiring.register_sim_clusters``; imported when called, so
    the commands that never simulate do not load the simulator)."""
    from falcon_es.adapters.sim.wiring import register_sim_clusters as register

    return register(app, config)


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
    relay = EdgeRelay(world.bus, world.config.delivery.topic, pubsub, settings.bus.edge_events_topic)
    return dataclasses.replace(ports, bus=StagingBus(pubsub, ports.bus)), relay


def _also(step: Callable[[], object],
          on_tick: Callable[[TickReport], None] | None) -> Callable[[TickReport], None]:
    """``on_tick`` with ``step`` run first, after every tick."""

    def after_tick(report: TickReport) -> None:
        step()
        if on_tick is not None:
            on_tick(report)

    return after_tick


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a controller runs, beside its settings: the backend and its world, the pace
    of the loop, who may append, and what a test or a command adds to each tick."""

    backend: str = "sim"
    #: On the sim backend, pace the virtual world by the wall clock.
    realtime: bool = False
    #: The simulated world's config (a file, a loaded config, None: the packaged one).
    sim_config: str | Path | SimConfig | None = None
    seed: int | None = None
    #: Wall seconds between ticks when nothing is due.
    tick_seconds: float = 1.0
    #: A simulated world to run in (several controllers, or several leadership terms,
    #: on one world); None: a new one, or the one saved in the database.
    world: SimWorld | None = None
    #: ``world`` is the world of an earlier leadership term, whose app is closed: it
    #: goes on with this controller's task states and registry.
    world_continues: bool = False
    #: > 0: the simulated world is kept in the database (loaded from there when
    #: ``world`` is None), saved in each commit and compacted every that many saves.
    sim_snapshot_every: int = 0
    #: Fences the loop and every commit with a lease.
    leadership: Leadership | None = None
    handlers: Sequence[Handler] = HANDLERS
    #: Run after each commit ahead of the effect executor (a test's crash points).
    before_effects: Sequence[AfterCommit] = ()
    on_tick: Callable[[TickReport], None] | None = None
    #: The upper layer of a run that ends when its script does (demo, simulate, bench).
    script: Script | None = None
    resolution: float = 0.0
    #: Run each cluster's calls on its own workers, off the tick's thread (None: on the
    #: gcp backend on the wall clock; the sim's in-process calls need no isolating,
    #: and a virtual clock's runs stay deterministic with calls made in the tick).
    isolate_clusters: bool | None = None

    def isolates(self, clock: Clock) -> bool:
        if self.isolate_clusters is not None:
            return self.isolate_clusters
        return self.backend == "gcp" and not isinstance(clock, VirtualClock)

    def clock(self) -> Clock:
        """The clock an app for these options runs on: the wall's on the gcp backend
        (or when ``realtime``), else a virtual one starting now."""
        return WallClock() if self.realtime or self.backend == "gcp" else VirtualClock(utcnow())


def build_service(app: App, ports: Ports | None = None,
                  options: RunOptions = RunOptions()) -> Service:
    """A controller on ``app``, ready to run, every part set here. ``ports`` are the
    ports to run on instead of the backend's own (the gcp clients built once for every
    leadership term, or a test's fault-injecting wrapper of the sim's)."""
    if options.backend not in BACKENDS:
        raise BackendError(f"backend {options.backend!r}: expected one of "
                           f"{', '.join(BACKENDS)}")
    backend = (_sim_backend(app, ports, options) if options.backend == "sim"
               else _gcp_backend(app, ports))
    ports = backend.ports
    if app.metrics is not None:
        from falcon_es.observability.metered import metered_ports

        ports = metered_ports(ports, app.metrics)
    load_task_states(app)
    calls = ClusterCalls(per_cluster=app.settings.calls.per_cluster,
                         inline=not options.isolates(app.clock))
    api_health = ApiHealth()
    ports = health_recorded(ports, api_health)
    reads = ObservedReads(ports, calls, app.settings.calls.answer_max_age_seconds)
    executor = EffectExecutor(app.store, app.tasks, app.settings, ports, app.index,
                              orphans_from=app.live.orphan_start, calls=calls, reads=reads)
    inbox = _inbox(app)
    controller = _controller(app, inbox, reads, executor, options, backend.world_store,
                             api_health)
    loop = _loop(app, ports, executor, controller, backend, options, calls, inbox)
    return Service(app=app, ports=ports, index=app.index, executor=executor,
                   controller=controller, loop=loop, world=backend.world,
                   api_health=api_health, calls=calls)


@dataclasses.dataclass(frozen=True)
class _Backend:
    """What the chosen backend gives the controller: its ports, and on the sim backend
    its world, the store that keeps it and a step to run after each tick."""

    ports: Ports
    world: SimWorld | None = None
    world_store: WorldStore | None = None
    after_tick: Callable[[], object] | None = None


def _sim_backend(app: App, ports: Ports | None, options: RunOptions) -> _Backend:
    from falcon_es.adapters.sim import wiring
    from falcon_es.adapters.sim.persist import WorldStore

    settings, world, world_store = app.settings, options.world, None
    try:
        if world is None and options.sim_snapshot_every > 0:
            world_store = WorldStore(app.engine, compact_every=options.sim_snapshot_every)
            world = wiring.saved_sim_world(app.clock, options.sim_config, options.seed, app,
                                           world_store)
        elif world is None:
            world = wiring.new_sim_world(app.clock, options.sim_config, options.seed, app)
        elif options.world_continues:
            wiring.continue_world(world, app)
    except wiring.SimWorldError as error:
        raise BackendError(str(error)) from error
    # The status handler pulls the edge-events subscription on either backend: attach
    # it to the topic the simulated informers publish to.
    world.bus.subscribe(world.config.delivery.topic, settings.bus.edge_events_subscription)
    ports = ports or world.ports()
    if settings.bus.kind == PUBSUB_BUS:
        ports, relay = staging_ports(settings, world, ports)
        return _Backend(ports, world, world_store, relay)
    return _Backend(ports, world, world_store)


def _gcp_backend(app: App, ports: Ports | None) -> _Backend:
    if app.settings.bus.kind == SIM_BUS:
        raise BackendError("FALCON_BUS=sim with the gcp backend: the edge clusters' "
                           "informers publish to Pub/Sub, so the gcp backend's bus is "
                           "Pub/Sub (unset FALCON_BUS or set it to pubsub)")
    return _Backend(ports or gcp_ports(app.settings, app.clock))


def _inbox(app: App) -> JobInbox:
    metrics = app.metrics
    return JobInbox(app.engine, app.job, clock=app.clock,
                    ignored=metrics.job_row_ignored if metrics is not None else None,
                    diverged=metrics.job_row_diverged if metrics is not None else None,
                    quiet_seconds=app.settings.job_table.quiet_poll_seconds)


def _controller(app: App, inbox: JobInbox, reads: ObservedReads, executor: EffectExecutor,
                options: RunOptions, world_store: WorldStore | None,
                api_health: ApiHealth) -> Controller:
    metrics, leadership = app.metrics, options.leadership
    settings = app.settings
    reservation_reads = ReservationReads(settings.lifecycle.reservation_read_seconds)
    # The handlers read the clusters through the answers the clusters' workers fetch.
    ports = observed_ports(reads)
    held: dict[str, JobObservation] = {}

    def make_context() -> HandlerContext:
        # One poll of the upper layer's inputs per tick, shared by the intake handlers.
        return HandlerContext(settings, app.clock.now(), app.tasks,
                              app.cluster_cache.clusters(), inbox.poll(INTAKE_BATCH), ports,
                              queues=app.queue_view.book, index=app.index, executor=executor,
                              outcomes=executor.take_outcomes(), retired=app.live,
                              reservation_reads=reservation_reads, api_health=api_health,
                              held_observations=held)

    def refresh_positions(ctx: HandlerContext, recorded: Sequence[RecordedEvent]) -> None:
        # Position Messages due when no append came to carry them (the interval of a
        # queue ran out): written behind the same lease fence as a tick's commit.
        if leadership is None or leadership.may_append():
            app.queue_view.refresh_due(app.engine)

    after_commit: list[AfterCommit] = [*options.before_effects, executor.after_commit, ack_folded,
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
    return Controller(app.store, app.tasks, options.handlers, make_context,
                      after_commit=after_commit, before_commit=before_commit,
                      reloaded=(app.queue_view.resync, app.index.resync, app.live.resync),
                      controller_id=settings.database.controller_id)


def _loop(app: App, ports: Ports, executor: EffectExecutor, controller: Controller,
          backend: _Backend, options: RunOptions, calls: ClusterCalls,
          inbox: JobInbox) -> Loop:
    index, world = app.index, backend.world
    on_tick = (_also(backend.after_tick, options.on_tick) if backend.after_tick is not None
               else options.on_tick)
    due_sources = [index.next_wake, executor.next_due, app.queue_view.next_refresh]
    if ports.next_due is not None:
        due_sources.append(ports.next_due)

    def settled() -> bool:
        return Service.settled_state(app.tasks, index, executor)

    return Loop(
        controller=controller, clock=app.clock, due_sources=due_sources,
        has_work=lambda: executor.has_outcomes, settled=settled, on_tick=on_tick,
        tick_seconds=options.tick_seconds,
        advance_world=world.step if world is not None else None,
        leadership=options.leadership,
        follow_log=app.follower.catch_up if app.follower is not None else None,
        script=options.script, resolution=options.resolution,
        wake=None if calls.inline else calls.landed, follow_up=inbox.following_up,
    )
