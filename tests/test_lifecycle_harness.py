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
from collections.abc import Callable, Mapping
from typing import Any

from falcon_es import job_rows, registry
from falcon_es.adapters.sim import (
    ClusterBehaviour, SimClusterConfig, SimConfig, SimWorld, build_sim_ports,
)
from falcon_es.adapters.sim.config import DeliveryFaults, ReservationConfig, Span
from falcon_es.bootstrap import App, build_controller, open_app
from falcon_es.clock import VirtualClock
from falcon_es.effects import EffectExecutor
from falcon_es.registry import Cluster
from falcon_es.runtime import Controller
from falcon_es.settings import Settings
from handlers import timeouts
from handlers.deprovision import needs_disposal

Step = tuple[str, str | None]

#: A quiet world: no random faults, fixed latencies, so sequences are exact.
QUIET = ClusterBehaviour(
    create_latency={"reservation": Span(60, 60), "on-demand": Span(120, 120),
                    "flex-start": Span(300, 300)},
    delete_latency=Span(30, 30),
    visibility_delay={"reservation": Span(0, 0), "on-demand": Span(0, 0),
                      "flex-start": Span(20, 20)},
    node_register_delay={"reservation": Span(20, 20), "on-demand": Span(30, 30),
                         "flex-start": Span(60, 60)},
    node_ready_lag=Span(5, 5),
)
SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2",
        "command": ["python", "train.py"], "sim": {"duration_seconds": 600}}


def sim_config(*clusters: SimClusterConfig, delivery: DeliveryFaults = DeliveryFaults(),
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


def flex_cluster(name: str = "v6e-flex", tpu_type: str = "v6e", **behaviour: Any) -> SimClusterConfig:
    return SimClusterConfig(
        name=name, project="proj", location="us-east5-b", tpu_types=(tpu_type,),
        gcs_bucket="logs-bucket", behaviour=dataclasses.replace(QUIET, **behaviour),
    )


class Harness:
    def __init__(self, db_url: str, clock: VirtualClock, config: SimConfig,
                 settings: Settings | None = None) -> None:
        self.settings = settings or Settings(db_url=db_url)
        self.clock = clock
        self.world = SimWorld(clock, config, behaviour_source=self._behaviour)
        self.ports = build_sim_ports(self.world)
        self.history: dict[str, list[Step]] = {}
        self.messages: dict[str, list[str]] = {}
        self.app: App = open_app(self.settings, clock)
        self.controller: Controller = build_controller(self.app, ports=self.ports)
        self.restarts = 0

    def _behaviour(self, task_id: str) -> Any:
        """The sim behaviour of a task's Job: its spec's ``sim`` (wired as the
        composition root does, so handlers never see it)."""
        state = self.app.tasks.get(task_id)
        return state.spec.get("sim") if state is not None else None

    # --------------------------------------------------------------- set-up
    def add_cluster(self, config: SimClusterConfig) -> Cluster:
        return registry.add_cluster(
            self.app.store, name=config.name, project=config.project or "proj",
            location=config.location or "us-east5-b", tpu_type=config.tpu_type,
            gcs_bucket=config.gcs_bucket or "logs-bucket",
            default_reservation=config.default_reservation,
        )

    def submit(self, name: str, spec: Mapping[str, Any] | None = None, *, actor: str = "user-a",
               task_id: str | None = None, **changes: Any) -> str:
        body = {**SPEC, **(spec or {}), **changes}
        return job_rows.submit(self.app.engine, name=name, actor=actor, spec=body,
                               now=self.clock.now(), task_id=task_id or name)

    def abort(self, task_id: str) -> None:
        job_rows.request_abort(self.app.engine, task_id, self.clock.now())

    # -------------------------------------------------------------- running
    @property
    def effects(self) -> EffectExecutor:
        executor = self.controller.after_commit[0].__self__  # type: ignore[attr-defined]
        assert isinstance(executor, EffectExecutor)
        return executor

    def restart(self) -> None:
        """A new process: fresh app and controller, same database, same world."""
        self.app.close()
        self.app = open_app(self.settings, self.clock)
        self.controller = build_controller(self.app, ports=self.ports)
        self.restarts += 1

    def tick(self) -> int:
        report = self.controller.tick()
        self.record()
        return report.appended

    def record(self) -> None:
        for row in job_rows.list_rows(self.app.engine):
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
            timeouts.next_due(self.app.tasks.all(), self.settings),
            self.effects.next_due(),
        ) if m is not None]
        return min(moments) if moments else None

    def step(self) -> bool:
        """One tick, then, when it left nothing to do now, a jump to the next due
        moment; False when nothing at all is left to happen."""
        appended = self.tick()
        if appended or self.effects.has_outcomes:
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
        rows_ended = all(status in ("Succeeded", "Failed", "Aborted")
                         for status, _ in self.statuses().values())
        return (rows_ended and all(s.is_terminal for s in states)
                and not any(needs_disposal(s) or s.pool_disposition == "delete-failed"
                            for s in states)
                and not self.effects.open_intents() and not self.effects.has_outcomes)

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
        return job_rows.get_row(self.app.engine, task_id)

    def statuses(self) -> dict[str, Step]:
        return {r["id"]: (r["status"], r["reason"]) for r in job_rows.list_rows(self.app.engine)}

    def live_pools(self, cluster: str | None = None) -> list[str]:
        return sorted(p.name for p in self.world.pools(cluster))

    def events(self, task_id: str) -> list[str]:
        return [r.type_name for r in self.app.store.read_stream(task_id)]

    def close(self) -> None:
        self.app.close()
