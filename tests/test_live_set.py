"""The live set: a finished task leaves the controller's memory once it holds nothing,
a controller starts by folding the live streams only, and everything a tick needs
(queues and who they served last, pool holders and handovers, the orphan sweep, the
intake's "already known" check) works from that set; an existing log is given its
live set by the migration."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence

import pytest
import sqlalchemy as sa
from alembic import command

from falcon_es.domain.clusters import Cluster
from falcon_es.storage import db, registry
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.ports import NodePoolSpec
from falcon_es.config.settings import Settings
from falcon_es.storage.store import EventStore, Meta, StreamAppend
from falcon_es.storage.tables import JobTable, checkpoints, last_served, live_streams

#: The job table under Falcon-ES's own names (what the tests create).
job = JobTable().table
from falcon_es.engine.task_manifests import pool_labels
from falcon_es.domain.tpu import slice_shape
from falcon_es.engine import live_set
from falcon_es.app.application import App, load_task_states, open_app
from tests.support.harness import Harness, Harnesses, reserved_cluster

Make = Callable[..., Harness]


@pytest.fixture
def make(db_url: str, clock: VirtualClock) -> Iterator[Make]:
    harnesses = Harnesses(db_url, clock)
    yield harnesses
    harnesses.close()


def live_rows(h: Harness) -> dict[str, int]:
    with h.app.engine.connect() as conn:
        return dict(conn.execute(sa.select(live_streams.c.stream_id, live_streams.c.fold_from)).all())


def in_memory(h: Harness) -> set[str]:
    return {s.task_id for s in h.app.tasks.all()}


def cluster_of(h: Harness, name: str = "v6e-res") -> Cluster:
    with h.app.engine.connect() as conn:
        found = registry.find_cluster(conn, name)
    assert found is not None
    return found


# ------------------------------------------------------------------ leaving memory


def test_finished_tasks_leave_memory_and_a_restart_folds_only_the_live_ones(make: Make) -> None:
    h = make(reserved_cluster())
    for name in ("d1", "d2"):
        h.submit(name)
    h.run()
    assert h.statuses() == {"d1": ("Succeeded", None), "d2": ("Succeeded", None)}
    assert in_memory(h) == set() and live_rows(h) == {}

    h.submit("long", sim={"duration_seconds": 7200})
    h.submit("queued", topology="2x4")
    h.run(lambda: h.statuses()["long"] == ("Running", None))
    assert set(live_rows(h)) == in_memory(h) == {"long", "queued"}

    h.restart()
    h.tick()
    assert in_memory(h) == {"long", "queued"}
    h.run()
    assert h.history["long"][-2:] == [("Running", None), ("Succeeded", None)]
    assert h.statuses()["queued"] == ("Succeeded", None)
    assert in_memory(h) == set() and live_rows(h) == {}
    assert h.events("d1")[-1] == "NodePoolDeleted"  # the log keeps everything
    assert h.live_pools() == []


@pytest.mark.parametrize("crash", [False, True], ids=["closed", "crashed"])
def test_a_handed_over_pool_stays_with_its_holder_across_a_restart(
        make: Make, db_url: str, crash: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make(reserved_cluster(count=1),
             settings=Settings(db_url=db_url, orphan_sweep_seconds=60))
    h.submit("a", sim={"duration_seconds": 120})
    h.submit("b", sim={"duration_seconds": 3600})
    h.run(lambda: h.statuses()["b"] == ("Running", None))
    assert "NodePoolReused" in h.events("b")
    # a handed its pool over and holds nothing: it left memory with the commit of the
    # reuse; its row may wait for the next write of retired rows, and a restart that
    # folds it sees the pool taken (its taker's row is there too) and retires it again.
    assert in_memory(h) == {"b"} and set(live_rows(h)) <= {"a", "b"}
    assert set(live_rows(h)) - {"b"} == h.app.live.retiring()
    if crash:  # the process dies: nothing that waited is written at close
        monkeypatch.setattr(h.app.live, "write_waiting", lambda: None)
        with h.app.engine.begin() as conn:  # a's row, as a crash right after the reuse leaves it
            conn.execute(live_streams.insert().prefix_with(
                "OR IGNORE" if conn.dialect.name == "sqlite" else "IGNORE"),
                {"stream_id": "a", "fold_from": 1})

    h.restart()
    h.tick()
    cluster = cluster_of(h)
    assert h.service.index.holder((cluster.id, "falcon-a-2x2")) == "b"
    assert "a" not in in_memory(h)
    h.run()
    assert h.history["b"][-1] == ("Succeeded", None)
    assert h.messages["b"][-1] == "succeeded (1 pod(s)); node pool falcon-a-2x2 deleted"
    assert h.app.store.read_stream(f"orphans:{cluster.id}") == []  # swept, never an orphan
    assert in_memory(h) == set() and live_rows(h) == {}


def test_a_creator_that_deleted_its_young_pool_lingers_so_the_sweep_spares_it_across_a_restart(
        make: Make, db_url: str) -> None:
    """GKE may list a pool late: the sweep never deletes one younger than the create
    grace, also when its creator ended and a controller restarted in between."""
    settings = Settings(db_url=db_url, orphan_sweep_seconds=60,
                        create_visibility_grace_seconds=600)
    h = make(reserved_cluster(), settings=settings)
    h.submit("t1", sim={"duration_seconds": 30})
    h.run(lambda: "NodePoolDeleted" in h.events("t1"))
    assert "t1" in h.app.live.lingering() and set(live_rows(h)) == {"t1"}

    h.restart()
    cluster = cluster_of(h)
    late = NodePoolSpec(cluster, "falcon-t1-2x2", slice_shape("v6e", "2x2"), "on-demand",
                        None, 600, pool_labels("t1", "2x2", "reservation"))
    h.ports.node_pools.create(late)
    h.run_for(120)
    assert "falcon-t1-2x2" in h.live_pools()  # inside the grace: spared
    assert in_memory(h) == {"t1"}
    h.run_for(700)
    assert h.live_pools() == []
    found = [e.type_name for e in (r.event for r in h.app.store.read_stream(f"orphans:{cluster.id}"))]
    assert found == ["OrphanPoolFound", "OrphanPoolDeleted"]
    assert in_memory(h) == set() and live_rows(h) == {}


# ------------------------------------------------------------------ intake


def test_a_row_of_a_task_that_left_memory_is_never_taken_in_twice(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1")
    h.run()
    events = h.events("t1")
    assert "t1" not in in_memory(h)
    with h.app.engine.begin() as conn:  # the upper layer puts the row back, as new
        conn.execute(job.update().where(job.c.id == "t1").values(status="Pending", reason=None))
    for _ in range(3):
        h.tick()
    assert h.events("t1") == events
    assert "t1" not in in_memory(h)


def test_an_abort_of_a_task_that_left_memory_is_ignored_on_its_real_state(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("t1")
    h.run()
    assert "t1" not in in_memory(h)
    with h.app.engine.begin() as conn:  # the upper layer writes Aborting, row ended or not
        conn.execute(job.update().where(job.c.id == "t1").values(
            status="Aborting", aborting_at=h.clock.now()))
    h.tick()
    assert h.events("t1")[-1] == "AbortIgnored"
    assert h.statuses()["t1"] == ("Succeeded", None)
    assert "t1" not in in_memory(h) and live_rows(h) == {}


# ------------------------------------------------------------------ queues


def test_who_a_queue_served_last_survives_a_restart_after_that_task_left(make: Make) -> None:
    h = make(reserved_cluster())
    h.submit("a1", actor="user-a")
    h.run()
    assert "a1" not in in_memory(h)
    cluster = cluster_of(h)
    with h.app.engine.connect() as conn:
        assert conn.execute(sa.select(last_served)).all() == [(cluster.id, "2x2", "user-a")]

    h.restart()
    h.submit("a2", actor="user-a")
    h.clock.advance(1)
    h.submit("b1", actor="user-b")
    h.tick()
    picked = [r.event for r in h.app.store.read_stream("b1") if r.type_name == "TaskPicked"]
    assert [(p.why, p.last_actor) for p in picked] == [("round-robin", "user-a")]
    assert h.statuses()["a2"] == ("Pending", "Waiting")
    assert h.row("a2")["message"].startswith("#1, next in line; slot held by user-b: b1")


# ------------------------------------------------------------------ the migration

SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}
AT = dt.datetime(2026, 11, 1, 8)


def accepted(actor: str) -> ev.TaskAccepted:
    return ev.TaskAccepted("train", actor, SPEC, "v6e", "2x2", AT)


def to_dispatching(pool: str) -> tuple[ev.Event, ...]:
    return (ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ()),
            ev.TaskPicked("c-1", "2x2", "only-waiting", (), None),
            ev.NodePoolCreateRequested(pool, "reservation", "ct6e-standard-4t", 1, "r", 600),
            ev.NodePoolCreateStarted(pool, "op-1"), ev.NodePoolReady(pool, 1))


def running(job_name: str, pool: str) -> tuple[ev.Event, ...]:
    return (ev.JobSubmitRequested(job_name, pool), ev.JobSubmitted(job_name, f"uid-{job_name}"),
            ev.PodsRunning(1, 1))


def history() -> list[tuple[str, Sequence[ev.Event]]]:
    """Streams as the controller wrote them, in the order their appends committed."""
    return [
        ("done", (accepted("user-a"), *to_dispatching("falcon-done"),
                  *running("falcon-done", "falcon-done"), ev.JobSucceeded(1),
                  ev.NodePoolDeleteRequested("falcon-done"), ev.NodePoolDeleted("falcon-done"))),
        ("rejected", (ev.TaskRejected("bad", "user-a", "InvalidSpec", "spec", "not JSON"),)),
        ("giver", (accepted("user-a"), *to_dispatching("falcon-giver"),
                   *running("falcon-giver", "falcon-giver"), ev.JobSucceeded(1),
                   ev.NodePoolRetained("falcon-giver", "taker"))),
        ("taker", (accepted("user-b"), ev.ClusterChosen("c-1", "gke-a", "2x2", "idle-pool", ()),
                   ev.TaskPicked("c-1", "2x2", "fifo", (), "user-a"),
                   ev.NodePoolReused("falcon-giver", "giver", "reservation"),
                   *running("falcon-taker", "falcon-giver"))),
        ("keeper", (accepted("user-a"), *to_dispatching("falcon-keeper"),
                    ev.JobSubmitRequested("falcon-keeper", "falcon-keeper"),
                    ev.JobSubmitted("falcon-keeper", "uid-k"), ev.JobSucceeded(1),
                    ev.NodePoolRetained("falcon-keeper", "waiter"))),
        ("waiter", (accepted("user-c"),
                    ev.ClusterChosen("c-1", "gke-a", "2x2", "only-candidate", ()))),
        ("orphans:c-1", (ev.OrphanPoolFound("c-1", "falcon-x", None),
                         ev.OrphanPoolFound("c-1", "falcon-y", None),
                         ev.OrphanPoolDeleted("c-1", "falcon-x"))),
        ("cluster:c-1", (ev.ClusterRegistered("c-1", "gke-a", "p", "l", "v6e", "b", None,
                                              "active"),)),
    ]


def test_the_migration_gives_an_existing_log_its_live_set_and_can_run_again(
        db_url: str, clock: VirtualClock) -> None:
    engine = db.make_engine(db_url)
    try:
        config = db.alembic_config(engine)
        with engine.begin() as conn:  # a database as it was before the live set
            conn.execute(sa.text("DROP TABLE live_streams"))
            conn.execute(sa.text("DROP TABLE last_served"))
        command.stamp(config, "0001")
        store = EventStore(engine, clock)  # no projections: the tables are not there
        for stream_id, events in history():
            clock.advance(60)
            store.append([StreamAppend(stream_id, 0, tuple(events), Meta(actor="controller"))])

        # done ended holding nothing, rejected never held anything, giver's pool was
        # taken over; falcon-y is still an open orphan (the stream's second event).
        expected_live = {"taker": 1, "keeper": 1, "waiter": 1, "orphans:c-1": 2}
        for _ in range(2):  # the second time over tables and rows a first run left
            db.upgrade(engine)
            with engine.connect() as conn:
                live = dict(conn.execute(sa.select(live_streams.c.stream_id,
                                                   live_streams.c.fold_from)).all())
                served = conn.execute(sa.select(last_served)).all()
            assert live == expected_live
            # done (user-a), giver (user-a), taker (user-b), then keeper (user-a).
            assert served == [("c-1", "2x2", "user-a")]
            command.stamp(config, "0001")
        db.upgrade(engine)
    finally:
        engine.dispose()


def test_a_controller_started_on_a_migrated_log_folds_its_live_set(
        db_url: str, clock: VirtualClock) -> None:
    from falcon_es.app.application import load_task_states, open_app

    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE live_streams"))
            conn.execute(sa.text("DROP TABLE last_served"))
        command.stamp(db.alembic_config(engine), "0001")
        store = EventStore(engine, clock)
        for stream_id, events in history():
            clock.advance(60)
            store.append([StreamAppend(stream_id, 0, tuple(events), Meta(actor="controller"))])
        db.upgrade(engine)
    finally:
        engine.dispose()
    app = open_app(Settings(db_url=db_url), clock)
    try:
        load_task_states(app)
        assert {s.task_id for s in app.tasks.all()} == {"taker", "keeper", "waiter"}
        assert app.index.holder(("c-1", "falcon-giver")) == "taker"
        assert app.queue_view.book.last_actor(("c-1", "2x2")) == "user-a"
        assert app.queue_view.book.idle_pool_queues() == frozenset({("c-1", "2x2")})
        assert app.live.orphan_start("orphans:c-1") == 2
    finally:
        app.close()


def test_the_live_rows_are_written_in_the_append_itself(db_url: str, clock: VirtualClock) -> None:
    """A tick that rolls back leaves the table as it was: the rows commit with the events."""
    from falcon_es.app.application import open_app

    app = open_app(Settings(db_url=db_url), clock)
    try:
        app.store.append([StreamAppend("t1", 0, (accepted("user-a"),), Meta(actor="x"))])
        with pytest.raises(RuntimeError):
            app.store.append([StreamAppend("t2", 0, (accepted("user-a"),), Meta(actor="x"))],
                             extra=[_explode])
        with app.engine.connect() as conn:
            assert dict(conn.execute(sa.select(live_streams)).all()) == {"t1": 1}
        rejected = ev.TaskRejected("bad", "user-a", "InvalidSpec", "spec", "not JSON")
        app.store.append([StreamAppend("t3", 0, (rejected,), Meta(actor="x"))])
        assert "t3" not in app.tasks
        with app.engine.connect() as conn:
            assert dict(conn.execute(sa.select(live_streams)).all()) == {"t1": 1}
    finally:
        app.close()


def _explode(conn: sa.Connection) -> None:
    raise RuntimeError("a later write of the tick failed")


def test_another_writers_event_on_a_stream_that_left_memory_is_read_whole_quietly(
        db_url: str, clock: VirtualClock, caplog: pytest.LogCaptureFixture) -> None:
    from falcon_es.app.application import load_task_states, open_app

    mine = open_app(Settings(db_url=db_url), clock, follow_log=True)
    other = open_app(Settings(db_url=db_url), clock)
    try:
        load_task_states(mine)
        rejected = ev.TaskRejected("bad", "user-a", "InvalidSpec", "spec", "not JSON")
        mine.store.append([StreamAppend("t1", 0, (rejected,), Meta(actor="x"))])
        assert "t1" not in mine.tasks
        other.live.recall(["t1"])  # as the other writer's intake would, for an abort
        other.store.append([StreamAppend("t1", 1, (ev.AbortIgnored("Failed"),),
                                         Meta(actor="upper-layer"))])
        assert mine.follower is not None
        with caplog.at_level("ERROR", logger="falcon_es.engine.follow"):
            mine.follower.catch_up()
        assert "never folded" not in caplog.text
        assert mine.follower.position == mine.store.head()
        assert "t1" not in mine.tasks  # folded again, and it still holds nothing
    finally:
        mine.close()
        other.close()


# ------------------------------------------------------------------ who a queue served, lazily


def served_rows(engine: sa.engine.Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.select(last_served))]


def served_through(engine: sa.engine.Engine) -> int | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(checkpoints.c.position).where(
            checkpoints.c.name == live_set.SERVED_CHECKPOINT)).scalar()


def pick(store: EventStore, task_id: str, actor: str, *, cluster_id: str = "c-1") -> int:
    """A task accepted and picked in one append; the seq of its pick."""
    recorded = store.append([StreamAppend(task_id, 0, (
        accepted(actor), ev.ClusterChosen(cluster_id, "gke-a", "2x2", "only-candidate", ()),
        ev.TaskPicked(cluster_id, "2x2", "only-waiting", (), None)), Meta(actor="controller"))])
    return recorded[-1].seq


def two_picks(db_url: str, clock: VirtualClock) -> App:
    """A controller that picked t1 (user-a), then a second later t2 (user-b), in one
    queue: the first pick is in ``last_served``, the second waits."""
    app = open_app(Settings(db_url=db_url), clock)
    pick(app.store, "t1", "user-a")
    clock.advance(1)
    pick(app.store, "t2", "user-b")
    return app


def started(db_url: str, clock: VirtualClock) -> App:
    """A controller started on the database, its live set folded."""
    app = open_app(Settings(db_url=db_url), clock)
    load_task_states(app)
    return app


def test_picks_reach_last_served_lazily_with_the_seq_they_hold_every_pick_through(
        db_url: str, clock: VirtualClock) -> None:
    app = open_app(Settings(db_url=db_url), clock)
    try:
        # No checkpoint yet: the first pick writes its row and the checkpoint at once.
        first = pick(app.store, "t1", "user-a")
        assert served_rows(app.engine) == [("c-1", "2x2", "user-a")]
        assert served_through(app.engine) == first
        clock.advance(1)
        pick(app.store, "t2", "user-b")
        clock.advance(live_set.LAZY_WRITE_SECONDS - 1)
        pick(app.store, "t3", "user-c", cluster_id="c-2")
        assert served_rows(app.engine) == [("c-1", "2x2", "user-a")]  # waiting
        assert served_through(app.engine) == first
        clock.advance(1)  # the oldest waiting pick is LAZY_WRITE_SECONDS old now
        last = pick(app.store, "t4", "user-d", cluster_id="c-3")
        assert sorted(served_rows(app.engine)) == [
            ("c-1", "2x2", "user-b"), ("c-2", "2x2", "user-c"), ("c-3", "2x2", "user-d")]
        assert served_through(app.engine) == last
    finally:
        app.close()


def test_a_start_reads_the_picks_after_the_checkpoint_that_a_crash_left_unwritten(
        db_url: str, clock: VirtualClock) -> None:
    app = two_picks(db_url, clock)
    app.store.append([StreamAppend("t2", 3, (
        ev.AbortRequested(clock.now(), "Pending/Provisioning"), ev.TaskAborted("Pending")),
        Meta(actor="user-b"))])
    assert "t2" not in app.tasks  # it left memory: only the log knows its actor
    app.engine.dispose()  # the process dies: nothing waiting is written
    assert served_rows(app.engine) == [("c-1", "2x2", "user-a")]

    again = started(db_url, clock)
    try:
        assert again.live.served() == {("c-1", "2x2"): "user-b"}
        assert again.queue_view.book.last_actor(("c-1", "2x2")) == "user-b"
        again.close()  # a closing app writes what waits, through the head
        assert served_rows(again.engine) == [("c-1", "2x2", "user-b")]
        assert served_through(again.engine) == again.store.head()
    finally:
        again.close()


def test_while_another_writer_may_append_each_append_writes_its_picks(
        db_url: str, clock: VirtualClock) -> None:
    app = open_app(Settings(db_url=db_url), clock, follow_log=True)
    try:
        pick(app.store, "t1", "user-a")
        clock.advance(1)
        pick(app.store, "t2", "user-b")
        assert served_rows(app.engine) == [("c-1", "2x2", "user-b")]
    finally:
        app.close()


def test_a_lost_race_reads_who_was_served_again_and_writes_each_pick_from_then_on(
        db_url: str, clock: VirtualClock) -> None:
    app = open_app(Settings(db_url=db_url), clock)
    other = open_app(Settings(db_url=db_url), clock)
    try:
        pick(app.store, "t1", "user-a")
        clock.advance(1)
        pick(app.store, "t2", "user-b")  # waits here
        clock.advance(1)
        pick(other.store, "t3", "user-c")  # the other writer's, after it in the log
        app.live.resync([])  # what a lost race to that writer calls
        assert app.live.served() == {("c-1", "2x2"): "user-c"}
        clock.advance(1)
        pick(app.store, "t4", "user-c", cluster_id="c-2")
        assert sorted(served_rows(app.engine)) == [("c-1", "2x2", "user-c"),
                                                   ("c-2", "2x2", "user-c")]
    finally:
        other.close()
        app.close()


def test_a_long_log_without_picks_moves_the_checkpoint(
        db_url: str, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_set, "SERVED_TAIL_EVENTS", 5)
    app = open_app(Settings(db_url=db_url), clock)
    try:
        first = pick(app.store, "t1", "user-a")
        version = 3
        for _ in range(3):
            clock.advance(1)
            recorded = app.store.append([StreamAppend("t1", version, (
                ev.ReservationInsufficient("r", 0, 1, 1),) * 2, Meta(actor="controller"))])
            version += 2
        assert served_through(app.engine) == recorded[-1].seq > first
    finally:
        app.close()


def test_picks_a_start_read_from_the_log_are_written_once_they_waited_long_enough(
        db_url: str, clock: VirtualClock) -> None:
    app = two_picks(db_url, clock)
    app.engine.dispose()  # the process dies with user-b's pick unwritten

    again = started(db_url, clock)
    try:
        version = 3
        for _ in range(2):  # appends without picks: the read pick waits from the first
            clock.advance(live_set.LAZY_WRITE_SECONDS / 2)
            again.store.append([StreamAppend("t1", version, (
                ev.ReservationInsufficient("r", 0, 1, 1),), Meta(actor="controller"))])
            version += 1
        assert served_rows(again.engine) == [("c-1", "2x2", "user-a")]
        clock.advance(live_set.LAZY_WRITE_SECONDS / 2)
        last = again.store.append([StreamAppend("t1", version, (
            ev.ReservationInsufficient("r", 0, 1, 1),), Meta(actor="controller"))])
        assert served_rows(again.engine) == [("c-1", "2x2", "user-b")]
        assert served_through(again.engine) == last[-1].seq
    finally:
        again.close()
