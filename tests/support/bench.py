"""One handler at a time on the simulated world: the per-handler tests' bench.

A per-handler test reads "given these events in a task's log (and this world), when
this handler runs one tick, then it emitted exactly these events". ``HandlerBench``
holds an app on a database, a quiet ``SimWorld`` with the clusters asked for
(registered in the registry too), and a controller running that one handler; its
small API is all the tests in ``tests/handlers/`` use besides the domain types
(events, ``TaskState``, the ports' data types).

Everything that knows how the application is wired (``open_app``,
``build_service``, how the outbox is driven) lives in this module and nowhere else in those
tests, so a change to the wiring is adapted here once.

What a tick is here: one ``Controller.tick`` of a controller built as the product
builds it, with only the given handler. Its after-commit steps run as well (the effect
executor carries out whatever intents are open, on the sim world; the status
handler's acknowledgements), but no ``record_outcomes`` handler runs, so the
outcomes of those effects never reach the log: a test sees exactly what its handler
decided.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from falcon_es.domain import events as ev
from falcon_es.jobtable import job_rows
from falcon_es.domain import naming
from falcon_es.storage import registry
from falcon_es.adapters.sim import (
    SimClusterConfig, SimWorld, behaviour_from_tasks, build_sim_ports,
)
from falcon_es.app.application import App, open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine import outbox
from falcon_es.domain.ports import (
    TASK_EVENTS_TOPIC, Bus, BusMessage, CreateRefusal, JobObservation, NodePoolSpec, Operation,
    PodObservation, Ports,
)
from falcon_es.domain.clusters import Cluster
from falcon_es.config.retry import DEFAULT_BACKOFFS, RetryPolicies
from falcon_es.engine.runtime import Controller, Handler
from falcon_es.config.settings import Settings
from falcon_es.engine.task_manifests import pool_labels
from falcon_es.domain.spec import SpecLimits, parse_spec
from falcon_es.storage.store import Meta, RecordedEvent, StreamAppend
from falcon_es.domain.task import TaskState, fold
from falcon_es.domain.tpu import slice_shape
from tests.support.harness import SPEC, flex_cluster, reserved_cluster, sim_config

__all__ = ["Emitted", "HandlerBench", "HandlerBenches", "SQLITE_ONLY", "STEPS",
           "flex_cluster", "reserved_cluster", "without_jitter"]

#: For a test module whose handler reads no SQL of its own: its tests run on SQLite
#: only (``pytestmark = SQLITE_ONLY``), not on both dialects of ``db_url``.
SQLITE_ONLY = pytest.mark.parametrize("db_url", ("sqlite",), indirect=True)

#: What a tick appended: (stream id, event), in the order the log holds them.
Emitted = tuple[str, ev.Event]

#: The actor of the events a test puts in the log itself.
GIVEN_ACTOR = "test:given"

#: The steps ``bring`` takes a task through, in order (each one's events below).
STEPS = ("accepted", "waiting", "picked", "create-requested", "create-started",
         "pool-ready", "submit-requested", "submitted", "running", "succeeded")


def without_jitter() -> RetryPolicies:
    """The default retry policies with no jitter, so a test can say exactly when a
    retry is due (initial delays: gke 10 s, compute 5 s, kubernetes 1 s, wait 15 s)."""
    return RetryPolicies({api: dataclasses.replace(backoff, jitter=0.0)
                          for api, backoff in DEFAULT_BACKOFFS.items()})


class HandlerBench:
    """An app, a sim world and a controller that runs only ``handler`` (None: no
    handler, for what is not a tick handler, such as the outbox publisher)."""

    def __init__(self, clock: VirtualClock, handler: Handler | None,
                 clusters: Sequence[SimClusterConfig], settings: Settings) -> None:
        self.clock = clock
        self.settings = settings
        self._app: App = open_app(settings, clock)
        self.world = SimWorld(clock, sim_config(*clusters),
                              behaviour_source=behaviour_from_tasks(self._app.tasks))
        #: The sim backend's ports: tests set the world up through them (a pool that
        #: exists, an operation to follow) and read it back.
        self.ports: Ports = build_sim_ports(self.world)
        self._clusters = {config.name: self._register(config) for config in clusters}
        self._controller: Controller | None = None
        if handler is not None:
            self._controller = build_service(
                self._app, self.ports, RunOptions(world=self.world, handlers=(handler,))).controller

    def _register(self, config: SimClusterConfig) -> Cluster:
        return registry.add_cluster(
            self._app.store, name=config.name, project=config.project or "proj",
            location=config.location or "us-east5-b", tpu_type=config.tpu_type,
            gcs_bucket=config.gcs_bucket or "logs-bucket",
            default_reservation=config.default_reservation, node_location=config.node_location)

    # ------------------------------------------------------------------ given
    def cluster(self, name: str | None = None) -> Cluster:
        """A registered cluster (the only one when ``name`` is None)."""
        if name is None:
            (only,) = self._clusters.values()
            return only
        return self._clusters[name]

    def set_cluster_status(self, name: str, status: str) -> Cluster:
        """An operator's ``cluster set-status`` (active, maintenance, offline)."""
        cluster = self._clusters[name] = registry.set_status(self._app.store, name, status)
        return cluster

    def given(self, task_id: str, *events: ev.Event) -> TaskState:
        """Append ``events`` to the task's stream (at its current version) through the
        store, as a committed tick of this controller would have: the controller's
        own views (its lifecycle index) count them too."""
        state = self._folded(task_id)
        self._app.store.append([StreamAppend(
            task_id, state.version if state else 0, events, Meta(actor=GIVEN_ACTOR))])
        return self.state(task_id)

    def bring(self, task_id: str, to: str, *, cluster: str | None = None,
              actor: str = "user-a", **spec: Any) -> TaskState:
        """A new task taken through ``STEPS`` up to ``to`` by the events the handlers
        of those steps record (its ``job`` row inserted first, as the upper layer
        would). ``spec`` changes the default spec (v6e 2x2, 600 s of sim work).

        The pool create is the one step that touches the world: at
        ``create-started`` the task's pool is created on the sim world as the effect
        executor would create it, and the log names that create's operation. The
        world is not moved on: the pool is still PROVISIONING until the test
        advances the clock (in the quiet world a reservation pool is RUNNING after
        60 s, its node Ready after 85 s; flex-start takes 300 s and 365 s).
        """
        if to not in STEPS:
            raise ValueError(f"unknown step {to!r}; steps: {', '.join(STEPS)}")
        if self._app.tasks.get(task_id) is not None:
            raise ValueError(f"task {task_id} is in the log already")
        body = {**SPEC, "command": list(SPEC["command"]), "sim": dict(SPEC["sim"]), **spec}
        job_rows.submit(self._app.engine, name=task_id, actor=actor, spec=body,
                        now=self.clock.now(), task_id=task_id, job=self._app.job)
        parsed = parse_spec(body, SpecLimits(self.settings.lifecycle.default_timeout_seconds,
                                             self.settings.lifecycle.max_timeout_seconds,
                                             self.settings.lifecycle.max_slices))
        state = self.given(task_id, ev.TaskAccepted(task_id, actor, parsed.to_data(),
                                                    parsed.tpu_type, parsed.topology,
                                                    self.clock.now()))
        if to == "accepted":
            return state
        target = self.cluster(cluster)
        for step in STEPS[STEPS.index("waiting"): STEPS.index(to) + 1]:
            state = self.given(task_id, *self._step(step, state, target))
        return state

    def _step(self, step: str, state: TaskState, cluster: Cluster) -> tuple[ev.Event, ...]:
        """The events that take ``state`` through ``step`` of ``STEPS`` on ``cluster``."""
        shape = state.shape
        pool = naming.pool_name(state.task_id, state.submission.topology)
        job = naming.job_name(state.task_id)
        supply_mode = state.submission.spec.supply_mode or (
            "reservation" if cluster.default_reservation else "flex-start")
        match step:
            case "waiting":
                return (ev.ClusterChosen(cluster.id, cluster.name, state.submission.topology,
                                         "only-candidate",
                                         ({"cluster_id": cluster.id, "name": cluster.name,
                                           "queued": 0, "idle_pool": False},)),)
            case "picked":
                return (ev.TaskPicked(cluster.id, state.submission.topology, "only-waiting", (),
                                      None, 1),)
            case "create-requested":
                return (ev.NodePoolCreateRequested(
                    pool, supply_mode, shape.machine_type, shape.hosts,
                    cluster.default_reservation if supply_mode == "reservation" else None,
                    self._scale_down_seconds(supply_mode), slices=state.slices),)
            case "create-started":
                return (ev.NodePoolCreateStarted(pool, self.create_pool(state.task_id).id),)
            case "pool-ready":
                return (ev.NodePoolReady(pool, shape.hosts),)
            case "submit-requested":
                return (ev.JobSubmitRequested(job, pool),)
            case "submitted":
                return (ev.JobSubmitted(job, f"uid-{state.task_id}"),)
            case "running":
                return (ev.PodsRunning(shape.hosts, shape.hosts, 1),)
            case "succeeded":
                return (ev.JobSucceeded(shape.hosts, 2),)
        raise ValueError(f"unknown step {step!r}")

    def _scale_down_seconds(self, supply_mode: str) -> int:
        return {"reservation": self.settings.lifecycle.scale_down_reservation_seconds,
                "on-demand": self.settings.lifecycle.scale_down_on_demand_seconds,
                "flex-start": self.settings.lifecycle.scale_down_flex_start_seconds}[supply_mode]

    def create_pool(self, task_id: str) -> Operation:
        """Create the task's pool on the sim world as the effect executor carries out
        its ``NodePoolCreateRequested`` (same name, shape, supply mode and labels);
        returns the create operation."""
        state = self.state(task_id)
        request = state.pool.request
        assert request is not None
        cluster = self._cluster_by_id(state.placement.cluster_id)
        supply_mode = request.supply_mode
        return self.ports.node_pools.create(NodePoolSpec(
            cluster=cluster, name=request.pool_name,
            shape=state.shape,
            supply_mode=supply_mode,
            reservation=request.reservation,
            scale_down_unneeded_seconds=request.scale_down_unneeded_seconds,
            labels=pool_labels(task_id, state.submission.topology, supply_mode)))

    def add_pool(self, name: str, labels: Mapping[str, str], *, cluster: str | None = None,
                 topology: str = "2x2", supply_mode: str = "flex-start") -> Operation:
        """A pool on the sim world that no log names (someone else's, or a Falcon pool
        whose task the log does not know)."""
        target = self.cluster(cluster)
        return self.ports.node_pools.create(NodePoolSpec(
            cluster=target, name=name, shape=slice_shape(target.tpu_type, topology),
            supply_mode=supply_mode, reservation=None, scale_down_unneeded_seconds=600,
            labels=dict(labels)))

    def submit(self, task_id: str, spec: Mapping[str, Any] | None = None, *,
               actor: str = "user-a") -> str:
        """A new ``job`` row, as the upper layer inserts it (the default spec unless
        ``spec`` is given, taken as it is)."""
        body = dict(spec) if spec is not None else {
            **SPEC, "command": list(SPEC["command"]), "sim": dict(SPEC["sim"])}
        return job_rows.submit(self._app.engine, name=task_id, actor=actor, spec=body,
                               now=self.clock.now(), task_id=task_id, job=self._app.job)

    def request_abort(self, task_id: str) -> None:
        """Set the row to Aborting, as the upper layer does."""
        job_rows.request_abort(self._app.engine, task_id, self.clock.now(), job=self._app.job)

    def observe(self, task_id: str, *, resource_version: int,
                pods: Sequence[PodObservation] = (), condition: str | None = None,
                active: int = 0, succeeded: int = 0, failed: int = 0,
                completions: int = 1, observed_at: dt.datetime | None = None,
                job_uid: str | None = None, refusal: CreateRefusal | None = None,
                ) -> JobObservation:
        """Publish what an informer of the task's cluster saw of its Job on the
        edge-events topic (the Job's name and uid from the task's log unless
        ``job_uid`` says otherwise)."""
        state = self.state(task_id)
        observation = JobObservation(
            cluster_name=state.placement.cluster_name or "", job_name=state.job.name or "",
            job_uid=job_uid if job_uid is not None else (state.job.uid or ""),
            task_id=naming.task_label(task_id), resource_version=resource_version,
            active=active, succeeded=succeeded, failed=failed, completions=completions,
            pods=tuple(pods), observed_at=observed_at or self.clock.now(),
            condition=condition, refusal=refusal)
        self.ports.bus.publish(self.settings.bus.edge_events_topic, observation.to_data(),
                               ordering_key=task_id,
                               attributes={"cluster": observation.cluster_name})
        return observation

    def backlog(self) -> int:
        """Edge observations published and not acknowledged yet."""
        return self.world.bus.backlog(self.settings.bus.edge_events_subscription)

    # ------------------------------------------------------------------- time
    def advance(self, seconds: float) -> None:
        """Move the virtual clock and play what the world does meanwhile."""
        self.world.advance(seconds)

    # ------------------------------------------------------------------- when
    def run(self) -> list[Emitted]:
        """One tick of the handler; the events it appended, in log order."""
        if self._controller is None:
            raise RuntimeError("this bench runs no handler")
        head = self._app.store.head()
        self._controller.tick()
        return [(r.stream_id, r.event) for r in self._records_after(head)]

    def publish_outbox(self, topic: str = TASK_EVENTS_TOPIC, *, bus: Bus | None = None,
                       batch_size: int = 1000, limit: int | None = None) -> int:
        """One pass of the ops-stream publisher, as the service runs it after ticks
        (on the sim bus unless ``bus`` is given); how many events it published."""
        return outbox.publish_pending(self._app.store, bus or self.ports.bus, topic,
                                      batch_size=batch_size, limit=limit)

    def outbox_lag(self) -> int:
        """How many stored events the ops stream has not published yet."""
        return outbox.lag(self._app.store)

    def subscribe(self, topic: str, name: str) -> str:
        """A subscription on a sim bus topic (it receives later publishes only)."""
        self.world.bus.subscribe(topic, name)
        return name

    def pull_all(self, subscription: str) -> list[BusMessage]:
        """Everything deliverable on the subscription now, acknowledged."""
        messages: list[BusMessage] = []
        while batch := self.ports.bus.pull(subscription):
            messages.extend(batch)
            self.ports.bus.ack(subscription, [m.id for m in batch])
        return messages

    # ------------------------------------------------------------------- then
    def state(self, task_id: str) -> TaskState:
        """The task's state as the controller folded it (for a task that has left its
        memory, having ended holding nothing: as its stream folds)."""
        state = self._folded(task_id)
        if state is None:
            raise LookupError(f"task {task_id} is not in the log")
        return state

    def _folded(self, task_id: str) -> TaskState | None:
        state = self._app.tasks.get(task_id)
        if state is not None:
            return state
        records = self._app.store.read_stream(task_id)
        return fold(task_id, [(r.event, r.recorded_at) for r in records]) if records else None

    def row(self, task_id: str) -> dict[str, Any]:
        """The task's ``job`` row as the upper layer reads it."""
        return job_rows.get_row(self._app.engine, task_id, job=self._app.job)

    def log(self, stream_id: str) -> list[ev.Event]:
        """The stream's stored events, oldest first."""
        return [r.event for r in self._app.store.read_stream(stream_id)]

    def head(self) -> int:
        """The log's last seq."""
        return self._app.store.head()

    def records(self, after: int = 0) -> list[RecordedEvent]:
        """The stored events after seq ``after``, in seq order."""
        return list(self._records_after(after))

    def close(self) -> None:
        self._app.close()

    # -------------------------------------------------------------- internals
    def _records_after(self, seq: int) -> Iterator[RecordedEvent]:
        return self._app.store.read_after(seq)

    def _cluster_by_id(self, cluster_id: str | None) -> Cluster:
        return next(c for c in self._clusters.values() if c.id == cluster_id)


class HandlerBenches:
    """Makes benches on one database and one clock and closes each at the end (the
    ``make_bench`` fixture)."""

    def __init__(self, db_url: str, clock: VirtualClock) -> None:
        self.db_url = db_url
        self.clock = clock
        self._made: list[HandlerBench] = []

    def __call__(self, handler: Handler | None, *clusters: SimClusterConfig,
                 **settings: Any) -> HandlerBench:
        """A bench running ``handler`` on ``clusters``; ``settings`` are ``Settings``
        fields that differ from the defaults."""
        bench = HandlerBench(self.clock, handler, clusters,
                             Settings(db_url=self.db_url, **settings))
        self._made.append(bench)
        return bench

    def close(self) -> None:
        for bench in self._made:
            bench.close()
