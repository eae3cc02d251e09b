"""Composition root for a running controller: the app, the chosen backend's ports,
the controller and its loop, wired in one place (``run``, ``demo``, ``simulate`` and
the benchmarks all start here)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from falcon_es import registry
from falcon_es.bootstrap import App, build_controller, open_app
from falcon_es.clock import Clock, VirtualClock, WallClock, utcnow
from falcon_es.effects import POOL_WATCH, EffectExecutor
from falcon_es.follow import LogFollower
from falcon_es.loop import (
    LOST_LEADERSHIP,
    Leadership,
    Loop,
    LoopReport,
    leadership_fence,
)
from falcon_es.observability.metered import metered_ports
from falcon_es.ports import Ports
from falcon_es.runtime import Controller, TickReport
from falcon_es.settings import Settings

BACKENDS = ("sim", "gcp")


class BackendError(ValueError):
    """The backend cannot be built from this configuration (says what is missing)."""


@dataclasses.dataclass
class Service:
    app: App
    ports: Ports
    controller: Controller
    loop: Loop
    world: object | None = None  # the SimWorld when backend is sim

    @property
    def effects(self) -> EffectExecutor | None:
        for step in self.controller.after_commit:
            owner = getattr(step, "__self__", None)
            if isinstance(owner, EffectExecutor):
                return owner
        return None

    def settled(self) -> bool:
        """Every task ended, every pool decided, no effect left open or queued.

        The loop asks after every tick that found nothing to do: the live-task count and
        the executor's index answer "not yet" without looking at every task; the full
        look runs only when they say "settled" (so a stale index cannot stop a loop)."""
        from falcon_es.handlers.deprovision import needs_disposal

        effects = self.effects
        tasks = self.app.tasks
        if effects is not None:
            if tasks.live_count() or effects.has_outcomes:
                return False
            index = effects.index
            index.ensure()
            for task_id in index.ids(POOL_WATCH):
                state = tasks.get(task_id)
                if state is not None and (needs_disposal(state)
                                          or state.pool_disposition == "delete-failed"):
                    return False
        for state in tasks.all():
            if not state.is_terminal or needs_disposal(state):
                return False
            if state.pool_disposition == "delete-failed":
                return False
        return effects is None or (not effects.open_intents() and not effects.has_outcomes)

    def catch_up(self) -> str:
        """Before any new work: the log is folded (``start`` did that); re-issue the
        intents a crash or a previous leader left without an outcome, so recording
        their outcomes is the first thing the first tick does. Returns a summary for
        the logs and for readiness."""
        effects = self.effects
        reissued = len(effects.open_intents()) if effects is not None else 0
        if effects is not None and not effects.has_outcomes:
            ctx = self.controller.make_context()
            for step in self.controller.after_commit:
                step(ctx, [])
        states = self.app.tasks.all()
        live = sum(1 for state in states if not state.is_terminal)
        return (f"caught up: {len(states)} tasks folded ({live} live) up to log position "
                f"{self.app.store.head()}, {reissued} open intent(s) re-issued")

    def close(self) -> None:
        self.app.close()


def sim_world(clock: VirtualClock | Clock, config_path: str | Path | None, seed: int | None,
              app: App) -> object:
    from falcon_es.adapters.sim import SimWorld, load_sim_config
    from falcon_es.adapters.sim.world import behaviour_from_tasks

    config = load_sim_config(config_path)
    return SimWorld(clock, config, seed=seed, behaviour_source=behaviour_from_tasks(app.tasks))


def register_world_clusters(app: App, world: object) -> list[registry.Cluster]:
    """Register the simulated world's clusters that the registry does not know yet."""
    added = []
    with app.engine.connect() as conn:
        known = {c.name for c in registry.list_clusters(conn)}
    for config in world.config.clusters:  # type: ignore[attr-defined]
        if config.name in known:
            continue
        added.append(registry.add_cluster(
            app.store, name=config.name, project=config.project or "falcon-sim",
            location=config.location or "us-central1-a", tpu_type=config.tpu_type,
            gcs_bucket=config.gcs_bucket or "falcon-sim-logs",
            default_reservation=config.default_reservation,
        ))
    return added


def start(
    settings: Settings, *, backend: str = "sim", sim_config: str | Path | None = None,
    seed: int | None = None, clock: Clock | None = None, realtime: bool = False,
    register_clusters: bool = True, tick_seconds: float = 1.0,
    on_tick: Callable[[TickReport], None] | None = None, gcp_ports: Ports | None = None,
    metrics: Any = None, world: object | None = None, leadership: Leadership | None = None,
    follow_log: bool = False,
) -> Service:
    """Wire a controller. ``metrics`` (an ``observability.Metrics``) adds its inline
    projection so transition histograms and event counts follow each commit. ``world``
    reuses a simulated world (several controllers on one world); ``leadership`` fences
    the loop and every commit with a lease; ``follow_log`` folds what another writer
    appended before each tick (one read of the log head per tick), for when nothing
    guarantees a single writer."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if clock is None:
        clock = WallClock() if realtime or backend == "gcp" else VirtualClock(utcnow())
    followers: list[LogFollower] = []

    def extra(tasks: Any) -> list[Any]:
        if follow_log:
            followers.append(LogFollower(tasks))
        return [*followers, *([metrics.projection(tasks)] if metrics is not None else [])]

    app = open_app(settings, clock, extra_projections=extra)
    for follower in followers:
        follower.attach(app.store, position=app.store.head(), queues=app.queue_view)
    if backend == "sim":
        world = world or sim_world(clock, sim_config, seed, app)
        # The status handler pulls settings.edge_events_subscription, on either backend:
        # attach it to the topic the simulated informers publish to.
        world.bus.subscribe(world.config.delivery.topic,  # type: ignore[attr-defined]
                            settings.edge_events_subscription)
        ports: Ports = world.ports()  # type: ignore[attr-defined]
        if register_clusters:
            register_world_clusters(app, world)
    else:
        world = None
        if gcp_ports is None:
            raise BackendError("backend gcp: no GCP ports were configured")
        ports = gcp_ports
    if metrics is not None:
        ports = metered_ports(ports, metrics)
    controller = build_controller(app, ports=ports)
    if metrics is not None:
        controller.after_commit = (*controller.after_commit, metrics.edge_observations_folded)
    if leadership is not None:
        controller.before_commit = (*controller.before_commit, leadership_fence(leadership))
    service = Service(app, ports, controller, loop=None, world=world)  # type: ignore[arg-type]
    for follower in followers:
        follower.index = service.effects.index if service.effects is not None else None
    service.loop = Loop(
        controller=controller, clock=clock, due_sources=_due_sources(service),
        has_work=lambda: bool(service.effects and service.effects.has_outcomes),
        settled=service.settled, on_tick=on_tick, tick_seconds=tick_seconds,
        advance_world=getattr(world, "step", None), leadership=leadership,
        follow_log=followers[0].catch_up if followers else None,
    )
    return service


def _due_sources(service: Service) -> list[Callable[[], dt.datetime | None]]:
    from falcon_es.handlers import timeouts

    effects = service.effects
    sources: list[Callable[[], dt.datetime | None]] = [
        # Only the tasks the executor's index says can have a deadline or a retry.
        (lambda: timeouts.next_due_of(effects)) if effects is not None
        else (lambda: timeouts.next_due(service.app.tasks.all(), service.app.settings)),
    ]
    if effects is not None:
        sources.append(effects.next_due)
    if service.ports.next_due is not None:
        sources.append(service.ports.next_due)
    return sources


log = logging.getLogger("falcon_es.service")

#: Publish the ops stream at least this often (wall seconds) even without new events.
OUTBOX_INTERVAL_SECONDS = 5.0


def serve(svc: Service, *, until_idle: bool, stop: threading.Event, metrics: Any = None,
          health: Any = None, ops_topic: str | None = None) -> LoopReport:
    """Run the loop as a service: mark health, feed metrics, publish the ops stream
    after commits, and on stop flush the outbox before returning."""
    from falcon_es.handlers import outbox

    last_publish = 0.0

    def publish(force: bool = False) -> None:
        nonlocal last_publish
        if ops_topic is None:
            return
        now = time.monotonic()
        if not force and now - last_publish < OUTBOX_INTERVAL_SECONDS:
            return
        outbox.publish_pending(svc.app.store, svc.ports.bus, ops_topic)
        last_publish = now
        if metrics is not None:
            metrics.set_lag("outbox", outbox.lag(svc.app.store))

    def on_tick(report: TickReport) -> None:
        if health is not None:
            health.mark_tick()
        if metrics is not None:
            metrics.observe_tick(report.seconds, conflicts=report.conflicts)
        publish(force=False)

    svc.loop.on_tick = on_tick
    if health is not None:
        health.set_ready(False, "catching up: re-issuing the open intents of the folded log")
    summary = svc.catch_up()
    log.info("%s; taking new work", summary)
    if health is not None:
        health.mark_tick()
        health.set_leader(True)
        health.set_ready(True, summary)
    if metrics is not None:
        metrics.set_leader(True)
    try:
        report = svc.loop.run(until_idle=until_idle, stop=stop)
    finally:
        try:
            publish(force=True)
        except Exception as error:  # a failed flush must not hide why the loop ended
            log.warning("could not flush the ops stream on shutdown: %s", error)
        if health is not None:
            health.set_leader(False)
        if metrics is not None:
            metrics.set_leader(False)
    return report


class Election(Leadership, Protocol):
    """A lease campaign (``adapters.gcp.lease.LeaseElector``) as ``serve_elected`` uses it."""

    retry_period: float

    def run(self, stop: threading.Event) -> None: ...

    def release(self) -> bool: ...

    def describe(self) -> str: ...


def serve_elected(build: Callable[[Leadership], Service], election: Election, *,
                  until_idle: bool, stop: threading.Event, metrics: Any = None,
                  health: Any = None, ops_topic: str | None = None) -> LoopReport:
    """Serve as one of several replicas: stand by until this one holds the lease, then
    build the controller (a fresh fold of the log, so whatever the previous leader
    appended is in it), catch up and serve until stopped or the lease is lost; after a
    loss, stand by again. The campaign runs in its own thread so renewals go on while
    a tick or the fold runs. On stop: the current tick finishes, the outbox is
    flushed, and only then is the lease released, so a standby takes over at once
    without ever overlapping this replica's last commit."""
    total = LoopReport()
    campaign_stop = threading.Event()
    campaign = threading.Thread(target=election.run, args=(campaign_stop,),
                                name="falcon-lease", daemon=True)
    campaign.start()
    standing_by = ""
    try:
        while not stop.is_set():
            if not election.may_append():
                standing_by = _stand_by(election, standing_by, health, metrics)
                stop.wait(min(election.retry_period, 1.0))
                continue
            standing_by = ""
            log.info("%s; folding the log before taking new work", election.describe())
            svc = build(election)
            try:
                report = serve(svc, until_idle=until_idle, stop=stop, metrics=metrics,
                               health=health, ops_topic=ops_topic)
            finally:
                svc.close()
            total.ticks += report.ticks
            total.appended += report.appended
            total.conflicts += report.conflicts
            if report.stopped_by != LOST_LEADERSHIP:
                total.stopped_by = report.stopped_by
                return total
            log.warning("lease lost after %d ticks: appending stopped; standing by",
                        report.ticks)
        total.stopped_by = "signal"
        return total
    finally:
        campaign_stop.set()
        campaign.join(timeout=CAMPAIGN_JOIN_SECONDS)
        election.release()
        if health is not None:
            health.set_leader(False)


#: How long shutdown waits for a lease request in flight before releasing anyway.
CAMPAIGN_JOIN_SECONDS = 10.0


def _stand_by(election: Election, said: str, health: Any, metrics: Any) -> str:
    """A standby is alive and ready (it serves probes and metrics and takes over from
    the log); say once per change who holds the lease."""
    detail = election.describe()
    if health is not None:
        health.mark_tick()
        health.set_leader(False)
        health.set_ready(True, detail)
    if metrics is not None:
        metrics.set_leader(False)
    if detail != said:
        log.info("%s", detail)
    return detail
