"""A running controller and how it is served: alone, or as one of several replicas
behind a lease. ``bootstrap.build_service`` builds the ``Service``; ``serve`` and
``serve_elected`` run it with health, metrics and the ops stream."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from falcon_es.engine.cluster_calls import ApiHealth, ClusterCalls
from falcon_es.engine.effects import EffectExecutor
from falcon_es.domain.handover import needs_disposal
from falcon_es.domain.intents import PoolDisposition
from falcon_es.engine.lifecycle_index import Group, LifecycleIndex
from falcon_es.engine.loop import LOST_LEADERSHIP, Leadership, Loop, LoopReport
from falcon_es.domain.ports import Ports
from falcon_es.engine.runtime import Controller, TickReport
from falcon_es.domain.task import TaskStates

if TYPE_CHECKING:  # a service names what it was built of
    from falcon_es.adapters.sim import SimWorld
    from falcon_es.app.application import App
    from falcon_es.observability.health import HealthServer
    from falcon_es.observability.metrics import Metrics


@dataclasses.dataclass(frozen=True)
class Service:
    app: App
    ports: Ports
    index: LifecycleIndex
    executor: EffectExecutor
    controller: Controller
    loop: Loop
    #: The simulated world, on the sim backend.
    world: SimWorld | None = None
    #: Which cluster APIs answer (for /healthz and the metrics).
    api_health: ApiHealth = dataclasses.field(default_factory=ApiHealth)
    #: Each cluster's workers (closed with the service).
    calls: ClusterCalls | None = None

    def settled(self) -> bool:
        """Every task ended, every pool decided, no effect left open or queued."""
        return self.settled_state(self.app.tasks, self.index, self.executor)

    @staticmethod
    def settled_state(tasks: TaskStates, index: LifecycleIndex,
                      executor: EffectExecutor) -> bool:
        """The loop asks after every tick that found nothing to do: the live-task count
        and the index answer "not yet" without looking at every task; the full look
        runs only when they say "settled" (so a stale index cannot stop a loop)."""
        if tasks.live_count() or executor.has_outcomes:
            return False
        for task_id in index.ids(Group.POOL_WATCH):
            state = tasks.get(task_id)
            if state is not None and (needs_disposal(state) or state.pool.disposition
                                      == PoolDisposition.DELETE_FAILED):
                return False
        for state in tasks.all():
            if not state.is_terminal or needs_disposal(state):
                return False
            if state.pool.disposition == PoolDisposition.DELETE_FAILED:
                return False
        return not executor.open_intents() and not executor.has_outcomes

    def catch_up(self) -> str:
        """Before any new work: the log is folded (the bootstrap did that); re-issue the
        intents a crash or a previous leader left without an outcome, so recording
        their outcomes is the first thing the first tick does. Returns a summary for
        the logs and for readiness."""
        executor = self.executor
        reissued = len(executor.open_intents())
        if not executor.has_outcomes:
            ctx = self.controller.make_context()
            for step in self.controller.after_commit:
                step(ctx, [])
        states = self.app.tasks.all()
        live = sum(1 for state in states if not state.is_terminal)
        return (f"caught up: {len(states)} tasks folded ({live} live) up to log position "
                f"{self.app.store.head()}, {reissued} open intent(s) re-issued")

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close()
        self.app.close()


log = logging.getLogger("falcon_es.app.service")

#: Publish the ops stream at least this often (wall seconds) even without new events.
OUTBOX_INTERVAL_SECONDS = 5.0


def serve(svc: Service, *, until_idle: bool, stop: threading.Event,
          metrics: Metrics | None = None, health: HealthServer | None = None,
          ops_topic: str | None = None) -> LoopReport:
    """Run the loop as a service: mark health, feed metrics, publish the ops stream
    after commits, and on stop flush the outbox before returning."""
    from falcon_es.engine import outbox

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
        report_cluster_apis(svc.api_health, svc.app.settings.job_table.language, health,
                            metrics)
        publish(force=False)

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
        report = svc.loop.run(until_idle=until_idle, stop=stop, on_tick=on_tick)
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


def report_cluster_apis(api_health: ApiHealth, language: str, health: HealthServer | None,
                        metrics: Metrics | None) -> None:
    """The cluster APIs that do not answer, in /healthz's detail (the process stays
    live: the other clusters are served) and in the metrics."""
    if not api_health.ever_unanswered:
        return
    from falcon_es.projections.messages import render

    spells = api_health.unanswered()
    if health is not None:
        health.set_unanswered([render("ClusterApiUnanswered", {
            "cluster": s.cluster, "api": s.api, "since": s.since.isoformat(),
            "error": s.error}, language) for s in spells])
    if metrics is not None:
        metrics.observe_cluster_apis(api_health.last_answers(),
                                     [(s.cluster, s.api) for s in spells])


class Election(Leadership, Protocol):
    """A lease campaign (``adapters.gcp.lease.LeaseElector``) as ``serve_elected`` uses it."""

    retry_period: float

    def run(self, stop: threading.Event) -> None: ...

    def release(self) -> bool: ...

    def describe(self) -> str: ...


def serve_elected(build: Callable[[Leadership], Service], election: Election, *,
                  until_idle: bool, stop: threading.Event, metrics: Metrics | None = None,
                  health: HealthServer | None = None,
                  ops_topic: str | None = None) -> LoopReport:
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


def _stand_by(election: Election, said: str, health: HealthServer | None,
              metrics: Metrics | None) -> str:
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
