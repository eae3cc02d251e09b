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
from falcon_es.engine.loop import (
    DATABASE_UNAVAILABLE, FENCED_OUT, LOST_LEADERSHIP, Leadership, Loop, LoopReport,
)
from falcon_es.storage import db
from falcon_es.storage.fence import FencedOut
from falcon_es.domain.ports import Ports
from falcon_es.engine.runtime import Controller, TickReport
from falcon_es.domain.task_states import TaskStates

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
    """A campaign (``adapters.gcp.lease.LeaseElector``, ``engine.leader.DatabaseLock``,
    ``Unelected``) as ``serve_elected`` uses it."""

    retry_period: float
    #: Who this candidate is (the writer fence's holder while it leads).
    identity: str

    def is_leader(self) -> bool:
        """Leading as last seen (no round trip): what the metrics show."""

    def run(self, stop: threading.Event) -> None: ...

    def release(self) -> bool: ...

    def describe(self) -> str: ...


class Unelected:
    """No election (``--leader-election none``): this process may always append, and
    the log's optimistic concurrency is the only guard against another writer."""

    retry_period = 1.0
    identity = ""

    def may_append(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return True

    def run(self, stop: threading.Event) -> None:
        """Nothing to campaign for."""

    def release(self) -> bool:
        return False

    def describe(self) -> str:
        return "no leader election: appending"


class DatabaseOutage(RuntimeError):
    """The database stayed unreachable (or hung) longer than the outage limit."""


#: The first pause after the database blinked, and the longest (doubling in between).
FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS = 0.25, 5.0


@dataclasses.dataclass
class Outage:
    """How long the database has been failing, and the pause before the next try:
    doubling from ``FIRST_RETRY_SECONDS`` to ``MAX_RETRY_SECONDS``; past ``limit``
    seconds the process gives up (its restarter takes over)."""

    limit: float
    since: float | None = None
    pause: float = FIRST_RETRY_SECONDS
    monotonic: Callable[[], float] = time.monotonic

    def failed(self, error: str) -> float:
        """Another failure: the pause before the next try, or ``DatabaseOutage``."""
        now = self.monotonic()
        if self.since is None:
            self.since, self.pause = now, FIRST_RETRY_SECONDS
        else:
            self.pause = min(self.pause * 2, MAX_RETRY_SECONDS)
        if now - self.since > self.limit:
            raise DatabaseOutage(f"the database has not answered for {now - self.since:.0f}s "
                                 f"(FALCON_DB_OUTAGE_LIMIT={self.limit:g}): {error}")
        return self.pause

    def ended(self) -> None:
        self.since = None

    def seconds(self) -> float:
        return 0.0 if self.since is None else self.monotonic() - self.since


def serve_elected(build: Callable[[Leadership], Service], election: Election, *,
                  until_idle: bool, stop: threading.Event, metrics: Metrics | None = None,
                  health: HealthServer | None = None, ops_topic: str | None = None,
                  outage_limit: float = 300.0,
                  database_check: Callable[[], None] | None = None) -> LoopReport:
    """Serve as one of several replicas: stand by until this one holds the lease (or
    the database lock), then build the controller (a fresh fold of the log, so
    whatever the previous leader appended is in it), catch up and serve until stopped,
    the lease is lost or the database's writer fence refuses an append; then stand
    by again. The campaign runs in its own thread so renewals go on while a tick or
    the fold runs. On stop: the current tick finishes, the outbox is flushed, and only
    then is the lease released, so a standby takes over at once without ever
    overlapping this replica's last commit.

    A database that blinks does not end the process: the term is built again, with
    backoff, once the database answers (effects are idempotent, so the ticks simply
    run again from the log); /readyz fails meanwhile, and only an outage longer than
    ``outage_limit`` seconds raises ``DatabaseOutage``. A standby asks
    ``database_check`` each time it looks at the election, so an outage is measured
    (and ended) there too: one that began at start, or took the database lock with it."""
    total = LoopReport()
    campaign_stop = threading.Event()
    campaign = threading.Thread(target=election.run, args=(campaign_stop,),
                                name="falcon-election", daemon=True)
    campaign.start()
    standing_by = ""
    outage = Outage(outage_limit)
    try:
        while not stop.is_set():
            if not election.may_append():
                if not _answers(database_check, outage, health, stop):
                    continue
                standing_by = _stand_by(election, standing_by, health, metrics)
                stop.wait(min(election.retry_period, 1.0))
                continue
            standing_by = ""
            report = _term(build, election, until_idle=until_idle, stop=stop,
                           metrics=metrics, health=health, ops_topic=ops_topic)
            total.ticks += report.ticks
            total.appended += report.appended
            total.conflicts += report.conflicts
            if report.ticks:
                outage.ended()
            if report.stopped_by == DATABASE_UNAVAILABLE:
                _database_down(outage, report.error, health, stop)
                continue
            if report.stopped_by == FENCED_OUT:
                # Another controller's term began: whatever this one still holds is
                # handed back, and it campaigns again as a standby.
                log.warning("%s; standing by", report.error)
                election.release()
                continue
            if report.stopped_by != LOST_LEADERSHIP:
                total.stopped_by = report.stopped_by
                return total
            log.warning("leadership lost after %d ticks: appending stopped; standing by",
                        report.ticks)
        total.stopped_by = "signal"
        return total
    finally:
        campaign_stop.set()
        campaign.join(timeout=CAMPAIGN_JOIN_SECONDS)
        election.release()
        if health is not None:
            health.set_leader(False)


def _term(build: Callable[[Leadership], Service], election: Election, *, until_idle: bool,
          stop: threading.Event, metrics: Metrics | None, health: HealthServer | None,
          ops_topic: str | None) -> LoopReport:
    """One term: build (fold, take the fence), catch up and serve. A database that
    blinks while it is built ends it like one that blinks during a tick."""
    log.info("%s; folding the log before taking new work", election.describe())
    try:
        svc = build(election)
        try:
            return serve(svc, until_idle=until_idle, stop=stop, metrics=metrics,
                         health=health, ops_topic=ops_topic)
        finally:
            svc.close()
    except FencedOut as error:
        return LoopReport(stopped_by=FENCED_OUT, error=str(error))
    except Exception as error:
        if not db.is_transient(error):
            raise
        return LoopReport(stopped_by=DATABASE_UNAVAILABLE, error=db.first_line(error))


def _answers(database_check: Callable[[], None] | None, outage: Outage,
             health: HealthServer | None, stop: threading.Event) -> bool:
    """Whether the database answers a standby now (ending any outage); else the outage
    goes on (or begins) as if a term had failed."""
    if database_check is None:
        return True
    try:
        database_check()
    except Exception as error:
        if not db.is_transient(error):
            raise
        _database_down(outage, db.first_line(error), health, stop)
        return False
    outage.ended()
    return True


def _database_down(outage: Outage, error: str, health: HealthServer | None,
                   stop: threading.Event) -> None:
    """Not ready, say why in the database's words, and wait before the next try."""
    pause = outage.failed(error)
    detail = (f"database unavailable for {outage.seconds():.0f}s: {error}; "
              f"retrying in {pause:g}s")
    log.warning("%s", detail)
    if health is not None:
        health.mark_tick()  # alive: the process is retrying, not stuck
        health.set_leader(False)
        health.set_ready(False, detail)
    stop.wait(pause)


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
