"""Property tests of the pick rule over random arrival sequences (hypothesis).

The real scheduling handlers run on real ``Tick``s, ``TaskStates`` and the real
``QueueView`` projection, committed in-process (no database: the position UPDATEs go
to a recording stand-in for SQLAlchemy's connection, which also lets the test compare
the Messages written with the view). Every pick is checked against a naive reference
computed from the task states alone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from falcon_es import chart
from falcon_es import events as ev
from falcon_es.context import HandlerContext
from falcon_es.lifecycle_index import LifecycleIndex
from falcon_es.registry import Cluster
from falcon_es.runtime import Tick
from falcon_es.settings import Settings
from falcon_es.store import RecordedEvent
from falcon_es.task import TaskState, TaskStates
from falcon_es.handlers import scheduling
from falcon_es.projections.queues import QueueView

START = dt.datetime(2026, 11, 1, 9, 0, 0)
SCHEDULING = (scheduling.requeue_from_inactive_clusters, scheduling.choose_clusters,
              scheduling.fill_free_slots)
TOPOLOGIES = ("2x2", "2x4")
ACTORS = ("ann", "bob", "cid", "dee")


class RecordingConnection:
    """Stands in for a SQLAlchemy connection (with SQLite's dialect, which names and
    quotes the job table's columns): keeps the last Message per row id."""

    dialect = sqlite.dialect()

    def __init__(self) -> None:
        self.messages: dict[str, str] = {}
        self.statements = 0

    def execute(self, statement: Any, params: list[dict[str, Any]]) -> None:
        self.statements += 1
        for row in params:
            self.messages[row["b_id"]] = row["b_message"]

    def exec_driver_sql(self, statement: str, params: list[tuple[str, str, str]]) -> None:
        """SQLite's driver-level form: (message, id, status) per row."""
        assert statement.startswith("UPDATE job SET message=?"), statement
        self.statements += 1
        for message, task_id, status in params:
            assert status == chart.PENDING
            self.messages[task_id] = message


@dataclasses.dataclass
class Pick:
    queue: tuple[str, str]
    task_id: str
    actor: str


class World:
    """The controller's scheduling half, committed in memory."""

    def __init__(self, cluster_count: int = 2) -> None:
        self.now = START
        self.tasks = TaskStates()
        self.view = QueueView(self.tasks)
        self.index = LifecycleIndex(self.tasks)
        self.conn = RecordingConnection()
        self.clusters = [
            Cluster(f"c{i}", f"tpu-{i}", "p", "l", "v6e", "b", None, "active", START)
            for i in range(cluster_count)
        ]
        self.seq = 0
        self.serial = 0
        self.arrivals: list[tuple[str, str]] = []  # (actor, topology) for the next tick
        self.picks: list[Pick] = []
        self.last_served: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------ driving
    def arrive(self, actor: str, topology: str) -> None:
        self.arrivals.append((actor, topology))

    def tick(self) -> None:
        tick = Tick(self.tasks, self.now, "test")
        for actor, topology in self.arrivals:
            self.serial += 1
            task_id = hashlib.sha1(str(self.serial).encode()).hexdigest()[:10]
            tick.emit(task_id, ev.TaskAccepted(f"{actor}-job-{self.serial}", actor, {}, "v6e",
                                               topology, self.now))
        self.arrivals.clear()
        # The scheduling handlers read the queue book, the clusters and the task states;
        # this model has no store, so there are no ports or executor to give them.
        ctx = HandlerContext(Settings(), self.now, self.tasks, list(self.clusters), inbox=None,
                             ports=None, queues=self.view.book, index=self.index,
                             executor=None)
        for handler in SCHEDULING:
            handler(tick, ctx)
        for stream_id, event in tick.emitted:
            if isinstance(event, ev.TaskPicked):
                self._check_pick(tick, stream_id, event)
        self._commit(tick)

    def free(self, task_id: str, *, fail: bool) -> None:
        """Move a slot holder on, as provisioning and status handlers would."""
        tick = Tick(self.tasks, self.now, "test")
        if fail:
            tick.emit(task_id, ev.NodePoolFailed("falcon-pool", "stockout"))
        else:
            tick.emit(task_id, ev.NodePoolReused("falcon-pool", None, "reservation"))
            tick.emit(task_id, ev.PodsRunning(1, 1))
        self._commit(tick)

    def set_status(self, index: int, status: str) -> None:
        self.clusters[index] = dataclasses.replace(self.clusters[index], status=status)

    def slot_holders(self) -> list[str]:
        return sorted(s.task_id for s in self.tasks.all() if s.holds_slot)

    def _commit(self, tick: Tick) -> None:
        records = []
        for append in tick.appends():
            version = append.expected_version or 0
            for event in append.events:
                self.seq += 1
                version += 1
                records.append(RecordedEvent(self.seq, append.stream_id, version, event, {},
                                             self.now))
        self.tasks.fold(records)
        self.view.apply(self.conn, records)  # type: ignore[arg-type]
        self.tasks.committed()
        self.view.committed()
        self._check_invariants()

    # ------------------------------------------------------------ the reference
    def _check_pick(self, tick: Tick, task_id: str, event: ev.TaskPicked) -> None:
        """The pick must be the one a naive reading of the rule gives."""
        key = (event.cluster_id, event.topology)
        picked = tick.state(task_id)
        assert picked is not None and picked.reason == "Provisioning"
        ids = {s.task_id for s in self.tasks.all()} | {s.task_id for s in tick.touched()}
        waiting = [picked]
        for other in ids - {task_id}:
            state = tick.state(other)
            if (state is not None and state.status == chart.PENDING
                    and state.reason == "Waiting" and (state.cluster_id, state.topology) == key):
                waiting.append(state)
        heads: dict[str, TaskState] = {}
        for state in sorted(waiting, key=lambda s: (s.submitted_at, s.task_id)):
            heads.setdefault(state.actor, state)
        last = self.last_served.get(key)
        eligible = [h for a, h in heads.items() if not (a == last and len(heads) > 1)]
        expected = min(eligible, key=lambda s: (s.submitted_at, s.task_id))
        assert task_id == expected.task_id, (key, task_id, expected.task_id, last)
        # FIFO within the actor, and no actor twice in a row while another waits.
        assert heads[picked.actor].task_id == task_id
        if last == picked.actor:
            assert len(heads) == 1, f"{last} served twice in a row while others wait in {key}"
        self.last_served[key] = picked.actor
        self.picks.append(Pick(key, task_id, picked.actor))

    def _check_invariants(self) -> None:
        holders: dict[tuple[str, str], list[str]] = defaultdict(list)
        for state in self.tasks.all():
            if state.holds_slot:
                holders[(state.cluster_id, state.topology)].append(state.task_id)
        for key, ids in holders.items():
            assert len(ids) == 1, f"queue {key} has {len(ids)} slot holders"
        self.view.book.check()


def drain(world: World) -> dict[tuple[str, str], list[str]]:
    """No more arrivals: free every slot until every task has been picked."""
    picked: dict[tuple[str, str], list[str]] = defaultdict(list)
    start = len(world.picks)
    for _ in range(10_000):
        if not world.view.book.waiting_total():
            break
        for task_id in world.slot_holders():
            world.free(task_id, fail=False)
        world.tick()
    for pick in world.picks[start:]:
        picked[pick.queue].append(pick.task_id)
    return picked


step = st.one_of(
    st.tuples(st.just("arrive"),
              st.lists(st.tuples(st.sampled_from(ACTORS), st.sampled_from(TOPOLOGIES)),
                       min_size=1, max_size=6)),
    st.tuples(st.just("free"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("status"), st.integers(0, 1),
              st.sampled_from(("active", "maintenance", "offline"))),
    st.tuples(st.just("wait"), st.integers(0, 2)),
)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=40))
def test_random_arrivals_keep_every_rule(steps: list[tuple[Any, ...]]) -> None:
    world = World()
    for kind, *args in steps:
        if kind == "arrive":
            for actor, topology in args[0]:
                world.arrive(actor, topology)
        elif kind == "free":
            holders = world.slot_holders()
            if holders:
                world.free(holders[args[0] % len(holders)], fail=args[1])
        elif kind == "status":
            world.set_status(args[0], args[1])
        else:
            world.now += dt.timedelta(seconds=args[0])
        world.tick()

    # Arrivals stop; every cluster is back. What the view shows is what happens.
    world.set_status(0, "active")
    world.set_status(1, "active")
    world.tick()
    shown = {key: [e.task_id for e in world.view.book.pick_order(key)]
             for key in world.view.book.waiting_queues()}
    for key, order in shown.items():
        for position, task_id in enumerate(order, start=1):
            assert world.conn.messages[task_id].startswith(f"#{position},")
    picked = drain(world)
    assert not world.view.book.waiting_total(), "every waiting task is eventually picked"
    for key, order in shown.items():
        assert picked[key] == order, f"queue {key}: shown {order}, picked {picked[key]}"
    waiting_left = [s for s in world.tasks.all() if s.reason == "Waiting"]
    assert waiting_left == []


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(ACTORS), st.integers(0, 3)), min_size=1, max_size=60))
def test_one_queue_order_matches_picks_with_ties(arrivals: list[tuple[str, int]]) -> None:
    """Many arrivals in the same second (ties broken by id) into one queue."""
    world = World(cluster_count=1)
    for actor, gap in arrivals:
        world.arrive(actor, "2x2")
        if gap:
            world.tick()
            world.now += dt.timedelta(seconds=gap - 1)
    world.tick()
    key = ("c0", "2x2")
    shown = [e.task_id for e in world.view.book.pick_order(key)]
    picked = drain(world)
    assert picked[key] == shown
