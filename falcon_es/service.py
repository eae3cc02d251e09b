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
from typing import Any

from falcon_es import registry
from falcon_es.bootstrap import App, build_controller, open_app
from falcon_es.clock import Clock, VirtualClock, WallClock, utcnow
from falcon_es.effects import EffectExecutor
from falcon_es.loop import Loop, LoopReport
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
        """Every task ended, every pool decided, no effect left open or queued."""
        from handlers.deprovision import needs_disposal

        effects = self.effects
        for state in self.app.tasks.all():
            if not state.is_terminal or needs_disposal(state):
                return False
            if state.pool_disposition == "delete-failed":
                return False
        return effects is None or (not effects.open_intents() and not effects.has_outcomes)

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
    metrics: Any = None,
) -> Service:
    """Wire a controller. ``metrics`` (an ``observability.Metrics``) adds its inline
    projection so transition histograms and event counts follow each commit."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if clock is None:
        clock = WallClock() if realtime or backend == "gcp" else VirtualClock(utcnow())
    extra = (lambda tasks: [metrics.projection(tasks)]) if metrics is not None else None
    app = open_app(settings, clock, extra_projections=extra)
    world = None
    if backend == "sim":
        world = sim_world(clock, sim_config, seed, app)
        ports: Ports = world.ports()  # type: ignore[attr-defined]
        if register_clusters:
            register_world_clusters(app, world)
    else:
        if gcp_ports is None:
            raise BackendError("backend gcp: no GCP ports were configured")
        ports = gcp_ports
    controller = build_controller(app, ports=ports)
    service = Service(app, ports, controller, loop=None, world=world)  # type: ignore[arg-type]
    service.loop = Loop(
        controller=controller, clock=clock, due_sources=_due_sources(service),
        has_work=lambda: bool(service.effects and service.effects.has_outcomes),
        settled=service.settled, on_tick=on_tick, tick_seconds=tick_seconds,
        advance_world=getattr(world, "step", None),
    )
    return service


def _due_sources(service: Service) -> list[Callable[[], dt.datetime | None]]:
    from handlers import timeouts

    sources: list[Callable[[], dt.datetime | None]] = [
        lambda: timeouts.next_due(service.app.tasks.all(), service.app.settings),
    ]
    if service.effects is not None:
        sources.append(service.effects.next_due)
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
    from handlers import outbox

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
        health.set_leader(True)
        health.set_ready(True, f"caught up: {len(svc.app.tasks.all())} tasks folded")
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
