"""A controller on the simulated world, for the lifecycle and crash-safety tests.

``Harness`` owns one ``SimWorld`` (virtual clock, seed) and a controller on a database;
``restart()`` drops the controller and its app and builds fresh ones on the same
database and the same world, as a process restart would. After every tick it records
each task's (Status, Reason) from the job table when it changed, so a test can assert
the exact sequence a user of the table saw. Time only moves by jumping to the next
moment anything is due (the world's next change, a deadline, a retry).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from falcon_es.jobtable import job_rows
from falcon_es.storage import registry
from falcon_es.adapters.sim import (
    ClusterBehaviour, SimClusterConfig, SimConfig, SimWorld, build_sim_ports,
)
from falcon_es.adapters.sim.config import DeliveryFaults, ReservationConfig, Span
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.effects import EffectExecutor
from falcon_es.domain.task_intents import task_intents
from falcon_es.domain.ports import (
    JOB_KIND, BusMessage, JobRef, NodeCounts, NodePoolInfo, NodePoolSpec, Operation, Ports,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.engine.runtime import Controller, Handler, Tick
from falcon_es.app.service import Service
from falcon_es.config.settings import Settings
from falcon_es.handlers import HANDLERS
from falcon_es.domain.handover import needs_disposal

Step = tuple[str, str | None]
T = TypeVar("T")

#: A quiet world: no random faults, fixed latencies, so sequences are exact.
QUIET = ClusterBehaviour(
    create_latency=MappingProxyType({"reservation": Span(60, 60), "on-demand": Span(120, 120),
                                     "flex-start": Span(300, 300)}),
    delete_latency=Span(30, 30),
    visibility_delay=MappingProxyType({"reservation": Span(0, 0), "on-demand": Span(0, 0),
                                       "flex-start": Span(20, 20)}),
    node_register_delay=MappingProxyType({"reservation": Span(20, 20),
                                          "on-demand": Span(30, 30),
                                          "flex-start": Span(60, 60)}),
    node_ready_lag=Span(5, 5),
)
NO_FAULTS = DeliveryFaults()
SPEC: Mapping[str, Any] = MappingProxyType({
    "image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2",
    "command": ("python", "train.py"), "sim": MappingProxyType({"duration_seconds": 600}),
})


def sim_config(*clusters: SimClusterConfig, delivery: DeliveryFaults = NO_FAULTS,
               seed: int = 7) -> SimConfig:
    return SimConfig(seed=seed, clusters=clusters, defaults=QUIET, delivery=delivery)


def reserved_cluster(name: str = "v6e-res", tpu_type: str = "v6e", count: int = 16,
                     in_use: int = 0, **behaviour: Any) -> SimClusterConfig:
    return SimClusterConfig(
        name=name, project="proj", location="us-east5-b", tpu_types=(tpu_type,),
        gcs_bucket="logs-bucket", default_reservation=f"{name}-r",
        reservations=(ReservationConfig(f"{name}-r", count, in_use),),
        behaviour=dataclasses.replace(QUIET, **behaviour),
    )


def flex_cluster(name: str = "v6e-flex", tpu_type: str = "v6e",
                 **behaviour: Any) -> SimClusterConfig:
    return SimClusterConfig(
        name=name, project="proj", location="us-east5-b", tpu_types=(tpu_type,),
        gcs_bucket="logs-bucket", behaviour=dataclasses.replace(QUIET, **behaviour),
    )


class Crash(Exception):
    """The controller process dies at this point (nothing after it runs)."""


@dataclasses.dataclass
class CrashPlan:
    """Where the next crash happens, and a log of the effects that really happened.

    Crash points: after the n-th handler call that decided something (before its tick
    commits), after the n-th commit that wrote events (before its effects), and before
    or after the n-th state-changing port call. Counters run across restarts.
    """

    handler_at: int | None = None
    commit_at: int | None = None
    effect_at: int | None = None
    effect_when: str = "before"  # before | after
    effect_named: tuple[str, str] | None = None  # crash at this (call, name) instead
    handlers_seen: int = 0
    commits_seen: int = 0
    effects_seen: int = 0
    done: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (call, name)
    crashes: list[str] = dataclasses.field(default_factory=list)  # where each crash hit

    def crash(self, kind: str, where: str) -> Crash:
        self.crashes.append(kind)
        return Crash(where)

    def handler_decided(self) -> None:
        self.handlers_seen += 1
        if self.handler_at == self.handlers_seen:
            self.handler_at = None
            raise self.crash("handler", f"after handler decision {self.handlers_seen}")

    def committed(self, ctx: Any, recorded: Sequence[Any]) -> None:
        if not recorded:
            return
        self.commits_seen += 1
        if self.commit_at == self.commits_seen:
            self.commit_at = None
            raise self.crash("commit", f"after commit {self.commits_seen}, before its effects")

    def effect(self, call: str, name: str, perform: Callable[[], T]) -> T:
        self.effects_seen += 1
        here = self.effect_at == self.effects_seen or self.effect_named == (call, name)
        if here and self.effect_when == "before":
            self.effect_at = self.effect_named = None
            raise self.crash("before", f"before effect {self.effects_seen} ({call} {name})")
        result = perform()
        self.done.append((call, name))
        if here:
            self.effect_at = self.effect_named = None
            raise self.crash("after", f"after effect {self.effects_seen} ({call} {name})")
        return result


class _CrashingNodePools:
    def __init__(self, inner: Any, plan: CrashPlan) -> None:
        self._inner, self._plan = inner, plan

    def create(self, spec: NodePoolSpec) -> Operation:
        return self._plan.effect("create-pool", spec.name, lambda: self._inner.create(spec))

    def delete(self, cluster: Cluster, name: str) -> Operation | None:
        return self._plan.effect("delete-pool", name, lambda: self._inner.delete(cluster, name))

    def get_operation(self, cluster: Cluster, operation_id: str) -> Operation:
        return self._inner.get_operation(cluster, operation_id)

    def get(self, cluster: Cluster, name: str) -> NodePoolInfo:
        return self._inner.get(cluster, name)

    def list(self, cluster: Cluster) -> list[NodePoolInfo]:
        return self._inner.list(cluster)


class _CrashingEdge:
    def __init__(self, inner: Any, plan: CrashPlan) -> None:
        self._inner, self._plan = inner, plan

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef:
        name = manifest["metadata"]["name"]
        return self._plan.effect("submit-job", name, lambda: self._inner.submit_job(manifest))

    def delete_job(self, name: str, kind: str = JOB_KIND) -> None:
        self._plan.effect("delete-job", name, lambda: self._inner.delete_job(name, kind))

    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None:
        return self._inner.get_job(name, kind)

    def node_counts(self, pool_name: str) -> NodeCounts:
        return self._inner.node_counts(pool_name)

    def diagnose_pending(self, job_name: str) -> str | None:
        return self._inner.diagnose_pending(job_name)


class _CrashingEdges:
    def __init__(self, inner: Any, plan: CrashPlan) -> None:
        self._inner, self._plan = inner, plan

    def for_cluster(self, cluster: Cluster) -> _CrashingEdge:
        return _CrashingEdge(self._inner.for_cluster(cluster), self._plan)


class _CrashingBus:
    def __init__(self, inner: Any, plan: CrashPlan) -> None:
        self._inner, self._plan = inner, plan

    def publish(self, topic: str, data: Mapping[str, Any], *, ordering_key: str = "",
                attributes: Mapping[str, str] | None = None) -> str:
        return self._inner.publish(topic, data, ordering_key=ordering_key, attributes=attributes)

    def pull(self, subscription: str, max_messages: int = 1000) -> Sequence[BusMessage]:
        return self._inner.pull(subscription, max_messages)

    def ack(self, subscription: str, message_ids: Sequence[str]) -> None:
        self._plan.effect("ack", f"{len(message_ids)} message(s)",
                          lambda: self._inner.ack(subscription, message_ids))


def crashing_ports(ports: Ports, plan: CrashPlan) -> Ports:
    """The sim ports with a process death injected around every state-changing call (a
    fake of the outside world's connection, not of any Falcon code)."""
    return dataclasses.replace(
        ports, node_pools=_CrashingNodePools(ports.node_pools, plan),
        edges=_CrashingEdges(ports.edges, plan), bus=_CrashingBus(ports.bus, plan))


def _watched(handler: Handler, plan: CrashPlan) -> Handler:
    def run(tick: Tick, ctx: Any) -> None:
        before = len(tick.emitted)
        handler(tick, ctx)
        if len(tick.emitted) > before:
            plan.handler_decided()
    run.__name__ = getattr(handler, "__name__", "handler")
    return run


class Harness:
    def __init__(self, db_url: str, clock: VirtualClock, config: SimConfig,
                 settings: Settings | None = None, plan: CrashPlan | None = None) -> None:
        self.settings = settings or Settings(db_url=db_url)
        self.clock = clock
        self.world = SimWorld(clock, config, behaviour_source=self._behaviour)
        self.plan = plan
        sim_ports = build_sim_ports(self.world)
        self.ports = crashing_ports(sim_ports, plan) if plan else sim_ports
        self.history: dict[str, list[Step]] = {}
        self.messages: dict[str, list[str]] = {}
        self.app: App = self._open_app()
        self.service: Service = self._service()
        self.controller: Controller = self.service.controller
        self.restarts = 0
        self.ticks_since_start = 0
        self.recording = True

    def _open_app(self) -> App:
        """The app a (re)started process opens on this harness's database."""
        return open_app(self.settings, self.clock)

    def rebuild(self) -> None:
        """A new controller on the current app, world and ports (after a subclass
        changed one of them)."""
        self.service = self._service()
        self.controller = self.service.controller

    def _service(self) -> Service:
        """The controller as the bootstrap builds it, on this harness's world and ports;
        with a crash plan, every handler and commit is a crash point."""
        plan = self.plan
        handlers = HANDLERS if plan is None else tuple(_watched(h, plan) for h in HANDLERS)
        return build_service(self.app, self.ports, RunOptions(
            world=self.world, handlers=handlers,
            before_effects=(plan.committed,) if plan is not None else ()))

    def _behaviour(self, task_id: str) -> Any:
        """The sim behaviour of a task's Job: its spec's ``sim`` (wired as the
        composition root does, so handlers never see it)."""
        state = self.app.tasks.get(task_id)
        sim = state.submission.spec.sim if state is not None else None
        return dataclasses.asdict(sim) if sim is not None else None

    # --------------------------------------------------------------- set-up
    def add_cluster(self, config: SimClusterConfig) -> Cluster:
        return registry.add_cluster(
            self.app.store, name=config.name, project=config.project or "proj",
            location=config.location or "us-east5-b", tpu_type=config.tpu_type,
            gcs_bucket=config.gcs_bucket or "logs-bucket",
            default_reservation=config.default_reservation,
            node_location=config.node_location,
        )

    def submit(self, name: str, spec: Mapping[str, Any] | None = None, *, actor: str = "user-a",
               task_id: str | None = None, **changes: Any) -> str:
        body = {**SPEC, "command": list(SPEC["command"]), "sim": dict(SPEC["sim"]),
                **(spec or {}), **changes}
        return job_rows.submit(self.app.engine, name=name, actor=actor, spec=body,
                               now=self.clock.now(), task_id=task_id or name, job=self.app.job)

    def abort(self, task_id: str) -> None:
        job_rows.request_abort(self.app.engine, task_id, self.clock.now(), job=self.app.job)

    # -------------------------------------------------------------- running
    @property
    def executor(self) -> EffectExecutor:
        return self.service.executor

    def restart(self, *, died: bool = False) -> None:
        """A new process: fresh app and controller, same database, same world.
        ``died``: the old one did not close (what a closing app writes is not written)."""
        if died:
            self.app.engine.dispose()
        else:
            self.app.close()
        self.app = self._open_app()
        self.rebuild()
        self.restarts += 1
        self.ticks_since_start = 0

    def tick(self) -> int:
        try:
            report = self.controller.tick()
        except Crash:
            self.record()  # the tick may have committed before the process died
            raise
        self.ticks_since_start += 1
        if report.appended:
            self.record()
        return report.appended

    def record(self) -> None:
        if not self.recording:
            return
        for row in job_rows.list_rows(self.app.engine, job=self.app.job):
            step = (row["status"], row["reason"])
            seen = self.history.setdefault(row["id"], [])
            if not seen or seen[-1] != step:
                seen.append(step)
            said = self.messages.setdefault(row["id"], [])
            if row["message"] and (not said or said[-1] != row["message"]):
                said.append(row["message"])

    def next_due(self) -> dt.datetime | None:
        moments = [m for m in (
            self.world.next_due(),
            self.service.index.next_wake(),
            self.executor.next_due(),
        ) if m is not None]
        return min(moments) if moments else None

    def step(self) -> bool:
        """One tick, then, when it left nothing to do now, a jump to the next due
        moment; False when nothing at all is left to happen."""
        appended = self.tick()
        if appended or self.executor.has_outcomes:
            return True
        due = self.next_due()
        if due is None:
            return False
        self.clock.advance_to(max(due, self.clock.now() + dt.timedelta(milliseconds=1)))
        self.world.step()
        return True

    def settled(self) -> bool:
        """Every task ended, every pool decided and no effect left open."""
        states = self.app.tasks.all()
        if (self.ticks_since_start == 0 or self.executor.has_outcomes
                or self.executor.open_intents()
                or any(not s.is_terminal or needs_disposal(s) or task_intents(s)
                       or s.pool.disposition == "delete-failed" for s in states)):
            return False
        return all(status in ("Succeeded", "Failed", "Aborted")
                   for status, _ in self.statuses().values())

    def run(self, until: Callable[[], bool] | None = None, *, max_steps: int = 5000,
            max_seconds: float = 7 * 24 * 3600) -> None:
        """Step until ``until()`` holds (default: ``settled()``)."""
        deadline = self.clock.now() + dt.timedelta(seconds=max_seconds)
        for _ in range(max_steps):
            if until is not None and until():
                return
            if self.clock.now() > deadline:
                break
            if until is None and self.settled():
                return
            self.step()
        raise AssertionError(f"not settled after {max_steps} steps at {self.clock.now()}: "
                             f"{self.statuses()}")

    def run_for(self, seconds: float) -> None:
        end = self.clock.now() + dt.timedelta(seconds=seconds)
        self.run(lambda: self.clock.now() >= end)

    # ------------------------------------------------------------- reading
    def row(self, task_id: str) -> dict[str, Any]:
        return job_rows.get_row(self.app.engine, task_id, job=self.app.job)

    def statuses(self) -> dict[str, Step]:
        return {r["id"]: (r["status"], r["reason"]) for r in job_rows.list_rows(self.app.engine, job=self.app.job)}

    def live_pools(self, cluster: str | None = None) -> list[str]:
        return sorted(p.name for p in self.world.pools(cluster))

    def events(self, task_id: str) -> list[str]:
        return [r.type_name for r in self.app.store.read_stream(task_id)]

    def close(self) -> None:
        self.app.close()


class Harnesses:
    """Makes harnesses on one database and one clock, each with its clusters
    registered, and closes every one of them at the end (the ``make`` fixtures)."""

    def __init__(self, db_url: str, clock: VirtualClock) -> None:
        self.db_url = db_url
        self.clock = clock
        self._made: list[Harness] = []

    def __call__(self, *clusters: SimClusterConfig, delivery: DeliveryFaults = NO_FAULTS,
                 settings: Settings | None = None, plan: CrashPlan | None = None) -> Harness:
        harness = Harness(self.db_url, self.clock, sim_config(*clusters, delivery=delivery),
                          settings or Settings(db_url=self.db_url), plan=plan)
        for cluster in clusters:
            harness.add_cluster(cluster)
        self._made.append(harness)
        return harness

    def close(self) -> None:
        for harness in self._made:
            harness.close()
