"""Property tests of the pick rule over random arrival sequences (hypothesis).

The real scheduling handlers run on real ``Tick``s, ``TaskStates`` and the real
``QueueView`` projection, committed in-process (no database: the position UPDATEs go
to a recording stand-in for SQLAlchemy's connection, which also lets the test compare
the Messages written with the view). Every pick is checked against a naive reference
computed from the task states alone, priorities and aging included; and a task of
the lowest priority is shown to be picked within a bound under an adversarial stream of
tasks of the highest.
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

from falcon_es.domain import chart
from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.engine.lifecycle_index import LifecycleIndex
from falcon_es.domain.priority import PriorityPolicy
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import Ports, ReservationCapacity
from falcon_es.engine.runtime import Tick
from falcon_es.domain.queue_book import QueueBook
from falcon_es.config.settings import Settings
from falcon_es.storage.store import RecordedEvent
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from falcon_es.handlers import scheduling
from falcon_es.projections.queues import QueueView

START = dt.datetime(2026, 11, 1, 9, 0, 0)
SCHEDULING = (scheduling.requeue_from_inactive_clusters, scheduling.choose_clusters,
              scheduling.move_from_stuck_queues, scheduling.yield_busy_slots,
              scheduling.lend_stuck_slots, scheduling.fill_free_slots)
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


class FullReservations:
    """The clusters' reservations as the scheduling handlers read them: of unknown
    size (so none is one that can never serve a task), and full."""

    def capacity(self, cluster: Cluster, reservation: str) -> ReservationCapacity:
        return ReservationCapacity()

    def remaining_slices(self, cluster: Cluster, reservation: str, shape: Any) -> int:
        return 0


@dataclasses.dataclass
class Pick:
    queue: tuple[str, str]
    task_id: str
    actor: str


class World:
    """The controller's scheduling half, committed in memory."""

    def __init__(self, cluster_count: int = 2, policy: PriorityPolicy = PriorityPolicy(),
                 lang: str = "en", settings: Settings = Settings(),
                 reservation: str | None = None) -> None:
        self.now = START
        self.settings = settings
        self.tasks = TaskStates()
        self.policy = policy
        self.view = QueueView(self.tasks, lang, book=QueueBook(policy))
        self.index = LifecycleIndex(self.tasks)
        self.conn = RecordingConnection()
        self.clusters = [
            Cluster(f"c{i}", f"tpu-{i}", "p", "l", "v6e", "b", reservation, "active", START)
            for i in range(cluster_count)
        ]
        # Only reservations are read, and only where a cluster has one.
        self.ports = Ports(None, FullReservations(), None, None, None)  # type: ignore[arg-type]
        self.seq = 0
        self.serial = 0
        #: (actor, topology, priority, supply mode asked)
        self.arrivals: list[tuple[str, str, int, str | None]] = []
        self.picks: list[Pick] = []
        self.decided: list[tuple[str, ev.Event]] = []  # what the handlers emitted
        self.last_served: dict[tuple[str, str], str] = {}
        #: Each queue's pick order as the lending handler of the last tick found it.
        self.orders_before_lending: dict[tuple[str, str], list[str]] = {}

    # ------------------------------------------------------------ driving
    def arrive(self, actor: str, topology: str, priority: int = 0,
               mode: str | None = None) -> str:
        """Queue an arrival for the next tick; returns the task id it will have."""
        self.arrivals.append((actor, topology, priority, mode))
        return hashlib.sha1(str(self.serial + len(self.arrivals)).encode()).hexdigest()[:10]

    def tick(self) -> None:
        tick = Tick(self.tasks, self.now, "test")
        for actor, topology, priority, mode in self.arrivals:
            self.serial += 1
            task_id = hashlib.sha1(str(self.serial).encode()).hexdigest()[:10]
            spec = {"priority": priority, **({"supply_mode": mode} if mode else {})}
            tick.emit(task_id, ev.TaskAccepted(f"{actor}-job-{self.serial}", actor, spec,
                                               "v6e", topology, self.now))
        self.arrivals.clear()
        # The scheduling handlers read the queue book, the clusters and the task states;
        # this model has no store, so there are no ports or executor to give them.
        ctx = HandlerContext(self.settings, self.now, self.tasks, list(self.clusters), inbox=None,
                             ports=self.ports, queues=self.view.book, index=self.index,
                             executor=None)
        for handler in SCHEDULING:
            if handler is scheduling.lend_stuck_slots:
                self.orders_before_lending = {
                    key: [e.task_id for e in self.view.book.pick_order(key, self.now)]
                    for key in self.view.book.queue_keys()}
            handler(tick, ctx)
        self.decided.extend(tick.emitted)
        for stream_id, event in tick.emitted:
            if isinstance(event, ev.TaskPicked):
                self._check_pick(tick, stream_id, event)
        self._commit(tick)

    def emit(self, task_id: str, event: ev.Event) -> None:
        """Fold one event of a task, as a handler's tick would commit it."""
        tick = Tick(self.tasks, self.now, "test")
        tick.emit(task_id, event)
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
                    and state.reason == "Waiting"
                    and (state.placement.cluster_id, state.submission.topology) == key):
                waiting.append(state)
        # The bands whose earliest task has aged highest compete, by today's rule.
        earliest: dict[int, dt.datetime] = {}
        for state in waiting:
            assert state.submission.submitted_at is not None
            submitted, priority = state.submission.submitted_at, state.submission.priority
            earliest[priority] = min(earliest.get(priority, submitted), submitted)
        level = {base: self.policy.effective(base, at, self.now) for base, at in earliest.items()}
        top = max(level.values())
        assert event.effective == top and event.priority == picked.submission.priority
        assert {b["priority"]: b["effective"] for b in event.priorities} == level
        waiting = [s for s in waiting if level[s.submission.priority] == top]
        heads: dict[str, TaskState] = {}
        for state in sorted(waiting, key=lambda s: (s.submission.submitted_at, s.task_id)):
            heads.setdefault(state.submission.actor, state)
        last = self.last_served.get(key)
        eligible = [h for a, h in heads.items() if not (a == last and len(heads) > 1)]
        expected = min(eligible, key=lambda s: (s.submission.submitted_at, s.task_id))
        assert task_id == expected.task_id, (key, task_id, expected.task_id, last)
        assert picked in waiting, "a pick serves the highest effective priority"
        # FIFO within the actor, and no actor twice in a row while another waits.
        assert heads[picked.submission.actor].task_id == task_id
        if last == picked.submission.actor:
            assert len(heads) == 1, f"{last} served twice in a row while others wait in {key}"
        self.last_served[key] = picked.submission.actor
        self.picks.append(Pick(key, task_id, picked.submission.actor))

    def _check_invariants(self) -> None:
        holders: dict[tuple[str, str], list[str]] = defaultdict(list)
        for state in self.tasks.all():
            if state.holds_slot and not state.placement.borrowed_from:
                holders[(state.placement.cluster_id, state.submission.topology)].append(
                    state.task_id)
        for key, ids in holders.items():
            assert len(ids) == 1, f"queue {key} has {len(ids)} slot holders"
        self.view.book.check(self.now)


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
    shown = {key: [e.task_id for e in world.view.book.pick_order(key, world.now)]
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
    shown = [e.task_id for e in world.view.book.pick_order(key, world.now)]
    picked = drain(world)
    assert picked[key] == shown


#: Aging fast enough for a test's few minutes: 50 points a minute.
FAST_AGING = PriorityPolicy(points=50, interval_seconds=60)
PRIORITIES = (-100, 0, 0, 50, 100)

prioritised_step = st.one_of(
    st.tuples(st.just("arrive"),
              st.lists(st.tuples(st.sampled_from(ACTORS), st.sampled_from(TOPOLOGIES),
                                 st.sampled_from(PRIORITIES)), min_size=1, max_size=6)),
    st.tuples(st.just("free"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("wait"), st.integers(0, 150)),
)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(prioritised_step, min_size=1, max_size=40))
def test_priorities_and_aging_keep_every_rule(steps: list[tuple[Any, ...]]) -> None:
    """Every pick serves the band whose earliest task has aged highest, by today's rule
    within it (checked against the naive reference); the shown order is the picked one."""
    world = World(policy=FAST_AGING)
    for kind, *args in steps:
        if kind == "arrive":
            for actor, topology, priority in args[0]:
                world.arrive(actor, topology, priority)
        elif kind == "free":
            holders = world.slot_holders()
            if holders:
                world.free(holders[args[0] % len(holders)], fail=args[1])
        else:
            world.now += dt.timedelta(seconds=args[0])
        world.tick()
    shown = {key: [e.task_id for e in world.view.book.pick_order(key, world.now)]
             for key in world.view.book.waiting_queues()}
    picked = drain(world)
    for key, order in shown.items():
        assert picked[key] == order, f"queue {key}: shown {order}, picked {picked[key]}"


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(before=st.lists(st.tuples(st.sampled_from(ACTORS), st.sampled_from(PRIORITIES)),
                       max_size=8),
       stream=st.lists(st.lists(st.sampled_from(ACTORS), max_size=4), min_size=1,
                       max_size=40),
       every=st.integers(5, 90))
def test_aging_bounds_the_wait_under_a_stream_of_higher_priority(
        before: list[tuple[str, int]], stream: list[list[str]], every: int) -> None:
    """A lowest-priority task is picked at most (time to age to the highest class) plus
    one pick per task that was waiting before it (and one round-robin skip) after it
    arrives, however many highest-priority tasks keep arriving: one pick every
    ``every`` seconds, each step bringing any number of them."""
    world = World(cluster_count=1, policy=FAST_AGING)
    for actor, priority in before:
        world.arrive(actor, "2x2", priority)
    world.tick()
    world.now += dt.timedelta(seconds=1)
    victim = world.arrive("victim", "2x2", FAST_AGING.lowest)
    world.tick()
    arrived = world.now
    ahead = len(before)  # at most the tasks submitted before it, one of them in the slot
    gap = dt.timedelta(seconds=every)
    bound = FAST_AGING.time_to_top(FAST_AGING.lowest) + gap * (ahead + 2)
    steps = 0
    while world.tasks.get(victim).reason == "Waiting":
        burst = stream[steps % len(stream)]
        for actor in burst:
            world.arrive(actor, "2x2", FAST_AGING.highest)
        for task_id in world.slot_holders():
            world.free(task_id, fail=False)
        world.now += gap
        world.tick()
        steps += 1
        assert world.now - arrived <= bound, (
            f"waited {world.now - arrived} > bound {bound} ({ahead} ahead)")
