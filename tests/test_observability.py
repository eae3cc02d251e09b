"""Metrics, the health server and structured logs, against real appends and real HTTP."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.storage import db
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.observability import ObservabilityConfigError, ObservabilitySettings, logs
from falcon_es.observability.health import HealthError, HealthServer
from falcon_es.config.settings import Settings
from falcon_es.observability.metrics import Metrics, PoolSample, error_code, queue_figures
from falcon_es.domain.ports import QUOTA_EXCEEDED, PortError
from falcon_es.domain.clusters import Cluster
from falcon_es.storage.store import ConcurrencyError, EventStore, Meta, StreamAppend
from falcon_es.domain.task import TaskState
from falcon_es.domain.task_states import TaskStates
from tests.support.task_states import task_state
from tests.conftest import migrate

START = dt.datetime(2026, 11, 1, 9, 0, 0)
META = Meta(actor="controller")


# --------------------------------------------------------------------------- helpers


class FakeMonotonic:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (sample name, sorted labels)."""
    text = metrics.exposition().decode("utf-8")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


def accepted(topology: str = "2x2", submitted_at: dt.datetime = START) -> ev.TaskAccepted:
    return ev.TaskAccepted(name="bench", actor="user-a", spec={}, tpu_type="v6e",
                           topology=topology, submitted_at=submitted_at)


def to_dispatching(cluster: str = "edge-a", topology: str = "2x2",
                   supply_mode: str = "flex-start") -> list[ev.Event]:
    pool = f"falcon-{cluster}-{topology}"
    return [
        ev.ClusterChosen(cluster_id=f"id-{cluster}", cluster_name=cluster, topology=topology,
                         why="only-candidate", candidates=()),
        ev.TaskPicked(cluster_id=f"id-{cluster}", topology=topology, why="only-waiting",
                      candidates=(), last_actor=None),
        ev.NodePoolCreateRequested(pool_name=pool, supply_mode=supply_mode,
                                   machine_type="ct6e-standard-4t", node_count=1,
                                   reservation=None, scale_down_unneeded_seconds=600),
        ev.NodePoolReady(pool_name=pool, nodes=1),
        ev.JobSubmitRequested(job_name="job-1", pool_name=pool),
        ev.JobSubmitted(job_name="job-1", job_uid="uid-1"),
    ]


def state(task_id: str, state_name: str, cluster: str | None = "edge-a",
          topology: str = "2x2", failure: str | None = None) -> TaskState:
    return task_state(task_id, state=state_name, cluster_name=cluster, topology=topology,
                      supply_mode="reservation", failure_reason=failure)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def metered(db_url: str, clock: VirtualClock) -> Iterator[tuple[EventStore, TaskStates, Metrics]]:
    """A store whose inline projections are the task states and the metrics."""
    engine = db.make_engine(db_url)
    tasks = TaskStates()
    metrics = Metrics(tasks=tasks.all, clock=clock, process_collectors=False,
                      state_min_interval=0)
    store = EventStore(engine, clock, projections=[tasks, metrics.projection(tasks)])
    yield store, tasks, metrics
    engine.dispose()


def append(store: EventStore, stream: str, expected: int | None,
           events: Sequence[ev.Event]) -> None:
    store.append([StreamAppend(stream, expected, tuple(events), META)])


# --------------------------------------------------------------------------- transitions


def test_submit_to_running_and_to_terminal_are_observed_at_commit(
    metered: tuple[EventStore, TaskStates, Metrics], clock: VirtualClock,
) -> None:
    store, tasks, metrics = metered
    append(store, "t1", 0, [accepted()])
    clock.advance(90)
    append(store, "t1", 1, to_dispatching(supply_mode="flex-start"))
    clock.advance(30)
    append(store, "t1", 7, [ev.PodsRunning(active=1, total=1)])
    clock.advance(3600)
    append(store, "t1", 8, [ev.JobSucceeded(succeeded=1)])

    running = {"cluster": "edge-a", "topology": "2x2", "supply_mode": "flex-start"}
    assert value(metrics, "falcon_task_submit_to_running_seconds_count", **running) == 1
    assert value(metrics, "falcon_task_submit_to_running_seconds_sum", **running) == 120
    assert value(metrics, "falcon_task_submit_to_running_seconds_bucket", le="120.0", **running) == 1
    assert value(metrics, "falcon_task_submit_to_running_seconds_bucket", le="60.0", **running) == 0
    done = {"status": "Succeeded", "reason": "", "topology": "2x2"}
    assert value(metrics, "falcon_task_submit_to_terminal_seconds_sum", **done) == 3720
    assert value(metrics, "falcon_events_appended_total", type="TaskAccepted") == 1
    assert value(metrics, "falcon_events_appended_total", type="PodsRunning") == 1
    assert value(metrics, "falcon_log_head_seq") == store.head()


def test_running_and_terminal_within_one_append_are_both_observed(
    metered: tuple[EventStore, TaskStates, Metrics], clock: VirtualClock,
) -> None:
    store, _, metrics = metered
    append(store, "t1", 0, [accepted()])
    clock.advance(50)
    append(store, "t1", 1, [*to_dispatching(), ev.PodsRunning(active=1, total=1),
                            ev.JobFailed(cause="exit code 3", exit_code=3)])
    assert value(metrics, "falcon_task_submit_to_running_seconds_count",
                 cluster="edge-a", topology="2x2", supply_mode="flex-start") == 1
    assert value(metrics, "falcon_task_submit_to_terminal_seconds_count",
                 status="Failed", reason="JobFailed", topology="2x2") == 1


def test_a_rejected_task_is_a_terminal_observation_with_its_reason(
    metered: tuple[EventStore, TaskStates, Metrics],
) -> None:
    store, _, metrics = metered
    append(store, "bad", 0, [ev.TaskRejected(name="x", actor="a", reason="ForbiddenField",
                                             field="privileged", detail="not allowed")])
    # Never accepted, so there is no submission time to measure from: counted as an
    # event, not as a duration.
    assert value(metrics, "falcon_events_appended_total", type="TaskRejected") == 1
    assert value(metrics, "falcon_task_submit_to_terminal_seconds_count",
                 status="Failed", reason="ForbiddenField", topology="") is None


def test_a_lost_race_is_not_counted(metered: tuple[EventStore, TaskStates, Metrics]) -> None:
    store, _, metrics = metered
    append(store, "t1", 0, [accepted()])
    with pytest.raises(ConcurrencyError):
        append(store, "t1", 0, [accepted()])
    assert value(metrics, "falcon_events_appended_total", type="TaskAccepted") == 1


def test_projection_order_does_not_change_what_is_observed(
    db_url: str, clock: VirtualClock,
) -> None:
    engine = db.make_engine(db_url)
    tasks = TaskStates()
    metrics = Metrics(tasks=tasks.all, clock=clock, process_collectors=False)
    store = EventStore(engine, clock, projections=[metrics.projection(tasks), tasks])
    try:
        append(store, "t1", 0, [accepted()])
        clock.advance(10)
        append(store, "t1", 1, [*to_dispatching(supply_mode="reservation"),
                                ev.PodsRunning(active=1, total=1)])
    finally:
        engine.dispose()
    assert value(metrics, "falcon_task_submit_to_running_seconds_sum",
                 cluster="edge-a", topology="2x2", supply_mode="reservation") == 10


# --------------------------------------------------------------------------- state at scrape time


def test_tasks_queues_and_pools_are_computed_from_the_current_state(clock: VirtualClock) -> None:
    states = [
        state("w1", "Pending.Waiting"),
        state("w2", "Pending.Waiting"),
        state("p1", "Pending.Provisioning"),
        state("r1", "Running"),
        state("r2", "Running", topology="4x4"),
        state("f1", "Failed", failure="NodePoolTimeout"),
        state("u1", "Pending.Waiting", cluster=None),
        TaskState("new"),
    ]
    pools = [
        PoolSample("edge-a", "falcon-p1", "2x2", "reservation", "creating", "p1",
                   created_at=START - dt.timedelta(hours=1)),
        PoolSample("edge-a", "falcon-r1", "2x2", "reservation", "active", "r1",
                   created_at=START - dt.timedelta(hours=3)),
        PoolSample("edge-a", "falcon-old", "2x2", "reservation", "deleted", None,
                   created_at=START - dt.timedelta(hours=10),
                   deleted_at=START - dt.timedelta(hours=8)),
    ]
    metrics = Metrics(tasks=lambda: states, pools=lambda: pools, clock=clock,
                      process_collectors=False)
    got = samples(metrics)

    def tasks_of(status: str, reason: str, cluster: str = "edge-a", topology: str = "2x2") -> float:
        return got.get(("falcon_tasks", (("cluster", cluster), ("reason", reason),
                                         ("status", status), ("supply_mode", "reservation"),
                                         ("topology", topology))), 0)

    assert tasks_of("Pending", "Waiting") == 2
    assert tasks_of("Pending", "Provisioning") == 1
    assert tasks_of("Failed", "NodePoolTimeout") == 1
    assert tasks_of("Running", "", topology="4x4") == 1
    assert tasks_of("Pending", "Waiting", cluster="") == 1
    assert not any(k[0] == "falcon_tasks" and ("status", "New") in k[1] for k in got)
    q = (("cluster", "edge-a"), ("topology", "2x2"))
    assert got[("falcon_queue_depth", q)] == 3
    assert got[("falcon_queue_running", q)] == 1
    assert got[("falcon_queue_acquiring", q)] == 1
    assert got[("falcon_queue_running", (("cluster", "edge-a"), ("topology", "4x4")))] == 1
    assert got[("falcon_node_pools", q[:1] + (("state", "active"), ("supply_mode", "reservation"),
                                              ("topology", "2x2")))] == 1
    assert not any(k[0] == "falcon_node_pools" and ("state", "deleted") in k[1] for k in got)
    hours = got[("falcon_node_pool_hours_total", (("cluster", "edge-a"),
                                                  ("supply_mode", "reservation"),
                                                  ("topology", "2x2")))]
    assert hours == pytest.approx(1 + 3 + 2)


def test_state_metrics_follow_changes_between_scrapes_after_the_cache_interval(
    clock: VirtualClock,
) -> None:
    states = [state("w1", "Pending.Waiting")]
    monotonic = FakeMonotonic()
    metrics = Metrics(tasks=lambda: list(states), clock=clock, process_collectors=False,
                      state_min_interval=5, monotonic=monotonic)
    assert value(metrics, "falcon_queue_depth", cluster="edge-a", topology="2x2") == 1
    states.append(state("w2", "Pending.Waiting"))
    assert value(metrics, "falcon_queue_depth", cluster="edge-a", topology="2x2") == 1
    monotonic.now += 5
    assert value(metrics, "falcon_queue_depth", cluster="edge-a", topology="2x2") == 2


def test_queue_figures_name_the_task_holding_the_slot() -> None:
    figures = queue_figures([state("w", "Pending.Waiting"), state("d", "Pending.Dispatching"),
                             state("x", "Succeeded")])
    assert [(f.cluster, f.topology, f.depth, f.running, f.acquiring_task) for f in figures] == [
        ("edge-a", "2x2", 2, 0, "d")]


def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = (Metrics(process_collectors=False) for _ in range(2))
    first.observe_call("gke", "create_node_pool", "OK", 0.2)
    assert value(first, "falcon_external_call_seconds_count",
                 api="gke", method="create_node_pool", code="OK") == 1
    assert value(second, "falcon_external_call_seconds_count",
                 api="gke", method="create_node_pool", code="OK") is None


# --------------------------------------------------------------------------- pushed facts


def test_external_calls_count_latency_and_errors_by_code() -> None:
    monotonic = FakeMonotonic()
    metrics = Metrics(process_collectors=False, monotonic=monotonic)
    with metrics.timed_call("kubernetes", "create_job"):
        monotonic.now += 0.04
    with pytest.raises(PortError):
        with metrics.timed_call("gke", "create_node_pool"):
            monotonic.now += 2
            raise PortError(QUOTA_EXCEEDED, "Quota 'TPUS_PER_PROJECT' exceeded")
    metrics.observe_call("pubsub", "publish", "UNAVAILABLE", 0.5)
    metrics.retry_scheduled("pubsub", "publish")
    assert value(metrics, "falcon_external_call_seconds_sum",
                 api="kubernetes", method="create_job", code="OK") == pytest.approx(0.04)
    assert value(metrics, "falcon_external_call_errors_total",
                 api="kubernetes", method="create_job", code="OK") is None
    assert value(metrics, "falcon_external_call_errors_total",
                 api="gke", method="create_node_pool", code=QUOTA_EXCEEDED) == 1
    assert value(metrics, "falcon_external_call_seconds_sum",
                 api="gke", method="create_node_pool", code=QUOTA_EXCEEDED) == 2
    assert value(metrics, "falcon_external_call_errors_total",
                 api="pubsub", method="publish", code="UNAVAILABLE") == 1
    assert value(metrics, "falcon_external_call_retries_total", api="pubsub", method="publish") == 1


def test_error_codes_are_short_bounded_labels() -> None:
    import enum

    class Grpc(enum.Enum):
        RESOURCE_EXHAUSTED = 8

    class GoogleStyle(Exception):
        code = 429

    class GrpcStyle(Exception):
        def code(self) -> Grpc:
            return Grpc.RESOURCE_EXHAUSTED

    class KubernetesStyle(Exception):
        status = 410

    assert error_code(PortError("NOT_FOUND", "no pool")) == "NOT_FOUND"
    assert error_code(GoogleStyle()) == "429"
    assert error_code(GrpcStyle()) == "RESOURCE_EXHAUSTED"
    assert error_code(KubernetesStyle()) == "410"
    assert error_code(TimeoutError("read timed out")) == "TimeoutError"


def test_reservations_lag_informers_leader_and_ticks() -> None:
    monotonic = FakeMonotonic()
    metrics = Metrics(process_collectors=False, monotonic=monotonic)
    metrics.set_reservation_remaining("edge-a", "res-v6e", "2x2", 3)
    metrics.set_reservation_remaining("edge-a", "res-v6e", "2x2", 2)
    metrics.set_lag("outbox", 17)
    metrics.set_lag("job_table", -4)
    metrics.informer_restarted("edge-a", "gone")
    metrics.informer_restarted("edge-a", "gone")
    metrics.edge_observation("edge-a", "duplicate")
    metrics.set_leader(True)
    metrics.observe_tick(0.03, conflicts=1)
    metrics.observe_tick(0.02)
    metrics.observe_head(40)
    metrics.observe_head(12)
    assert value(metrics, "falcon_reservation_remaining_slices",
                 cluster="edge-a", reservation="res-v6e", topology="2x2") == 2
    assert value(metrics, "falcon_lag_events", consumer="outbox") == 17
    assert value(metrics, "falcon_lag_events", consumer="job_table") == 0
    assert value(metrics, "falcon_informer_watch_restarts_total", cluster="edge-a", reason="gone") == 2
    assert value(metrics, "falcon_edge_observations_total", cluster="edge-a", outcome="duplicate") == 1
    assert value(metrics, "falcon_leader") == 1
    assert value(metrics, "falcon_ticks_total") == 2
    assert value(metrics, "falcon_tick_conflicts_total") == 1
    assert value(metrics, "falcon_tick_duration_seconds_count") == 2
    assert value(metrics, "falcon_log_head_seq") == 40
    assert value(metrics, "falcon_last_tick_timestamp_seconds") > 0


def test_cluster_overview_lists_reservations_pools_and_queues(clock: VirtualClock) -> None:
    states = [state("w", "Pending.Waiting"), state("d", "Pending.Dispatching"),
              state("r", "Running", topology="4x4")]
    pools = [PoolSample("edge-a", "falcon-d", "2x2", "reservation", "creating", "d"),
             PoolSample("edge-a", "falcon-gone", "2x2", "reservation", "deleted"),
             PoolSample("edge-b", "falcon-idle", "2x2", "flex-start", "idle-retained")]
    metrics = Metrics(tasks=lambda: states, pools=lambda: pools, clock=clock,
                      process_collectors=False)
    metrics.set_reservation_remaining("edge-a", "res-a", "2x2", 4)
    clusters = [Cluster("1", "edge-a", "p", "us-east5-b", "v6e", "b", "res-a", "active", START),
                Cluster("2", "edge-b", "p", "us-east5-b", "v6e", "b", None, "maintenance", START)]
    overview = metrics.cluster_overview(clusters)
    assert overview[0] == {
        "name": "edge-a", "tpu_type": "v6e", "status": "active", "default_reservation": "res-a",
        "reservation_remaining": [{"reservation": "res-a", "topology": "2x2", "slices": 4,
                                   "observed_at": START.isoformat()}],
        "pools": [{"name": "falcon-d", "topology": "2x2", "supply_mode": "reservation",
                   "state": "creating", "owner_task": "d"}],
        "queues": [{"topology": "2x2", "depth": 2, "running": 0, "acquiring_task": "d"},
                   {"topology": "4x4", "depth": 0, "running": 1, "acquiring_task": None}],
    }
    assert overview[1]["pools"][0]["state"] == "idle-retained"
    assert overview[1]["queues"] == [] and overview[1]["reservation_remaining"] == []


# --------------------------------------------------------------------------- health server


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def monotonic() -> FakeMonotonic:
    return FakeMonotonic()


@pytest.fixture
def health(monotonic: FakeMonotonic) -> Iterator[HealthServer]:
    metrics = Metrics(process_collectors=False)
    metrics.set_leader(False)
    server = HealthServer(host="127.0.0.1", port=0, max_tick_age=30, monotonic=monotonic,
                          metrics=metrics.exposition,
                          clusters=lambda: [{"name": "edge-a", "queues": []}])
    server.start()
    yield server
    server.stop()


def test_healthz_follows_the_loops_ticks(health: HealthServer, monotonic: FakeMonotonic) -> None:
    status, _, body = get(health.url + "/healthz")
    assert (status, body.strip()) == (200, "ok: started, no tick yet, 0.0s ago")
    monotonic.now += 31
    status, _, body = get(health.url + "/healthz")
    assert status == 503 and "no tick yet, 31.0s ago (limit 30s)" in body
    health.mark_tick()
    monotonic.now += 10
    status, _, body = get(health.url + "/healthz")
    assert (status, body.strip()) == (200, "ok: last tick 10.0s ago")
    monotonic.now += 25
    assert get(health.url + "/healthz")[0] == 503


def test_readyz_waits_for_catch_up_and_reports_the_role(health: HealthServer) -> None:
    status, content_type, body = get(health.url + "/readyz")
    assert status == 503 and content_type.startswith("application/json")
    assert json.loads(body) == {"ready": False, "role": "standby", "database": "ok",
                                "caught_up": False,
                                "detail": "starting: catching up with the log"}
    health.set_ready(True, "caught up at seq 120; 2 intents re-issued")
    status, _, body = get(health.url + "/readyz")
    assert status == 200 and json.loads(body)["role"] == "standby"
    health.set_leader(True)
    assert json.loads(get(health.url + "/readyz")[2])["role"] == "leader"


def test_readyz_fails_when_the_database_is_unreachable(monotonic: FakeMonotonic, tmp_path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path}/missing/dir/falcon.db")

    def database_check() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    with HealthServer(host="127.0.0.1", port=0, database_check=database_check,
                      monotonic=monotonic) as server:
        server.set_ready(True)
        status, _, body = get(server.url + "/readyz")
    engine.dispose()
    report = json.loads(body)
    assert status == 503 and report["ready"] is False
    assert report["database"].startswith("unreachable: ")
    assert "unable to open database file" in report["database"]


def test_readyz_is_ok_against_a_live_database(db_url: str, monotonic: FakeMonotonic) -> None:
    engine = db.make_engine(db_url)

    def database_check() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    with HealthServer(host="127.0.0.1", port=0, database_check=database_check,
                      monotonic=monotonic) as server:
        server.set_ready(True)
        server.set_leader(True)
        status, _, body = get(server.url + "/readyz")
    engine.dispose()
    assert status == 200
    assert json.loads(body)["database"] == "ok"


def test_metrics_and_clusters_endpoints(health: HealthServer) -> None:
    status, content_type, body = get(health.url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert "falcon_leader 0.0" in body
    status, content_type, body = get(health.url + "/clusters")
    assert status == 200 and json.loads(body) == [{"name": "edge-a", "queues": []}]
    status, _, body = get(health.url + "/nope")
    assert status == 404 and "/healthz, /readyz, /metrics, /clusters" in body


def test_unwired_and_failing_sources_answer_without_killing_the_server(
    monotonic: FakeMonotonic,
) -> None:
    def broken() -> list[dict]:
        raise RuntimeError("database is locked")

    with HealthServer(host="127.0.0.1", port=0, monotonic=monotonic, clusters=broken) as server:
        assert get(server.url + "/metrics")[0] == 404
        status, _, body = get(server.url + "/clusters")
        assert status == 503
        assert json.loads(body) == {"error": "cluster overview failed: database is locked"}
        assert get(server.url + "/healthz")[0] == 200


def test_stop_frees_the_port_and_a_taken_port_is_a_clear_error(monotonic: FakeMonotonic) -> None:
    server = HealthServer(host="127.0.0.1", port=0, monotonic=monotonic)
    port = server.start()
    with pytest.raises(HealthError, match=f"cannot listen on 127.0.0.1:{port}"):
        HealthServer(host="127.0.0.1", port=port).start()
    server.stop()
    server.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    with pytest.raises(HealthError, match="not running"):
        _ = server.port


# --------------------------------------------------------------------------- settings


def test_observability_settings_from_the_environment() -> None:
    settings = Settings.from_env({
        "FALCON_HEALTH_PORT": "9090", "FALCON_LOG_FORMAT": "JSON",
        "FALCON_HEALTH_MAX_TICK_AGE": "45", "FALCON_LOG_LEVEL": "debug",
    }).observability
    assert settings == ObservabilitySettings(health_host="0.0.0.0", health_port=9090,
                                             max_tick_age_seconds=45.0, log_format="json",
                                             log_level="DEBUG")
    assert Settings.from_env({}).observability == ObservabilitySettings()


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"FALCON_HEALTH_PORT": "http"}, "FALCON_HEALTH_PORT='http': expected a port number"),
        ({"FALCON_HEALTH_PORT": "70000"}, "FALCON_HEALTH_PORT='70000'"),
        ({"FALCON_HEALTH_MAX_TICK_AGE": "0"}, "FALCON_HEALTH_MAX_TICK_AGE='0': expected a positive"),
        ({"FALCON_LOG_FORMAT": "xml"}, "FALCON_LOG_FORMAT='xml': expected one of json, text"),
    ],
)
def test_bad_observability_settings_name_the_variable(environ: dict, words: str) -> None:
    with pytest.raises(ObservabilityConfigError, match=words):
        Settings.from_env(environ)


# --------------------------------------------------------------------------- logs


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("falcon_es.test_observability")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)
    logger.propagate = True


def test_json_logs_are_one_object_per_line_with_the_context_fields(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.JsonFormatter())
    logger.info("node pool %s ready", "falcon-t1", extra={
        "task_id": "t1", "cluster": "edge-a", "pool": "falcon-t1",
        "event_type": "NodePoolReady", "seq": 42})
    logger.warning("plain")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "node pool falcon-t1 ready"
    assert (first["level"], first["logger"]) == ("INFO", "falcon_es.test_observability")
    assert {k: first[k] for k in ("task_id", "cluster", "pool", "event_type", "seq")} == {
        "task_id": "t1", "cluster": "edge-a", "pool": "falcon-t1",
        "event_type": "NodePoolReady", "seq": 42}
    assert dt.datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert set(second) == {"time", "level", "logger", "message"}


def test_json_logs_carry_the_exception(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.JsonFormatter())
    try:
        raise ValueError("connect to mysql+pymysql://falcon:hunter2@db:3306/falcon failed")
    except ValueError:
        logger.exception("tick failed", extra={"task_id": "t9"})
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "ERROR" and entry["task_id"] == "t9"
    assert "ValueError" in entry["exception"]
    assert "hunter2" not in stream.getvalue()
    assert "mysql+pymysql://falcon:***@db:3306/falcon" in entry["exception"]


def test_text_logs_are_readable_and_list_the_context(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.TextFormatter())
    logger.info("dispatched", extra={"task_id": "t1", "cluster": "edge-a"})
    line = stream.getvalue().strip()
    assert line.endswith("INFO falcon_es.test_observability: dispatched  task_id=t1 cluster=edge-a")


@pytest.mark.parametrize(
    ("secret_text", "kept", "secret"),
    [
        ("db at mysql+pymysql://falcon:s3cr3t@10.0.0.5:3306/falcon", "falcon:***@10.0.0.5", "s3cr3t"),
        ("db at mysql+pymysql://falcon:p@ss:w0rd@db/falcon", "falcon:***@db/falcon", "w0rd"),
        ("proxy https://u:pw-123@proxy.local:3128", "u:***@proxy.local", "pw-123"),
        ("headers {'Authorization': 'Bearer ya29.a0AfH6SMBx-secret'}", "'Authorization': 'Bearer ***'",
         "a0AfH6SMBx"),
        ("header: Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***", "dXNlcjpwYXNz"),
        ("GET /api/v1/jobs?token=abc.def&watch=1", "token=***&watch=1", "abc.def"),
        ("POST access_token=zzz123 refresh_token=rrr999", "access_token=***", "rrr999"),
        ('{"password": "hunter2", "user": "falcon"}', '"password": "***"', "hunter2"),
        ("creds {'client_secret': 'cs-42'}", "'client_secret': '***'", "cs-42"),
        ("id token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "[jwt ***]", "c2lnbmF0dXJl"),
        ("bare ya29.c.b0Aaekm1K-token-text", "ya29.***", "b0Aaekm1K"),
        ("key -----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY----- end",
         "[private key ***] end", "MIIEv"),
        ("signed url ?X-Goog-Signature=0a1b2c&X-Goog-Date=20261101", "X-Goog-Signature=***", "0a1b2c"),
    ],
)
def test_credentials_never_reach_the_log(secret_text: str, kept: str, secret: str) -> None:
    redacted = logs.redact(secret_text)
    assert secret not in redacted
    assert kept in redacted


@pytest.mark.parametrize(
    "harmless",
    [
        "https://container.googleapis.com/v1/projects/p/locations/l/clusters/c:443",
        "mysql+pymysql://root@127.0.0.1:3306/falcon",
        "ordering key=task-1 published",
        "task t1 needs 4 of 2 remaining slices",
    ],
)
def test_redaction_leaves_ordinary_text_alone(harmless: str) -> None:
    assert logs.redact(harmless) == harmless


def test_credentials_in_arguments_and_extra_are_redacted(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.TextFormatter())
    logger.info("connecting to %s", "postgresql://u:topsecret@h/db",
                extra={"cluster": "https://x:tok3n@edge-a"})
    output = stream.getvalue()
    assert "topsecret" not in output and "tok3n" not in output


def test_the_redacting_filter_protects_handlers_with_other_formatters(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(logs.RedactingFilter())
    logger.info("using %s", "Authorization: Bearer abc.def.ghi-secret")
    assert stream.getvalue().strip() == "using Authorization: Bearer ***"


def test_configure_logging_installs_one_handler_in_the_chosen_format() -> None:
    root = logging.getLogger()
    level = root.level
    stream = io.StringIO()
    try:
        logs.configure_logging("json", stream=io.StringIO())
        handler = logs.configure_logging("json", level="debug", stream=stream)
        assert [h for h in root.handlers if h.get_name() == "falcon-es"] == [handler]
        logging.getLogger("falcon_es.x").debug("db %s", "mysql://a:b@c/d", extra={"seq": 7})
        entry = json.loads(stream.getvalue())
        assert entry["message"] == "db mysql://a:***@c/d" and entry["seq"] == 7
        assert root.level == logging.DEBUG
        text_handler = logs.configure_logging("text", stream=stream)
        assert isinstance(text_handler.formatter, logs.TextFormatter)
    finally:
        for existing in [h for h in root.handlers if h.get_name() == "falcon-es"]:
            root.removeHandler(existing)
        root.setLevel(level)


def test_configure_logging_refuses_an_unknown_format_or_level() -> None:
    with pytest.raises(logs.LogFormatError, match="log format 'yaml': expected one of json, text"):
        logs.configure_logging("yaml")
    with pytest.raises(logs.LogFormatError, match="log level 'LOUD'"):
        logs.configure_logging("text", "loud")


# ------------------------------------------------------- external calls, end to end


def test_every_external_call_of_a_running_service_is_metered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ports the service wires are metered at the boundary: each GKE, Compute,
    Kubernetes and Pub/Sub call of a task's life is timed under the API's own method
    name, a throttled create counts as an error with its code and as a retry."""
    from falcon_es.storage import db, registry
    from falcon_es.jobtable import job_rows
    from falcon_es.app import service
    from falcon_es.config.settings import Settings

    world = tmp_path / "world.json"
    world.write_text(json.dumps({
        "seed": 3,
        "defaults": {"create_throttled": {"first_n": 1}},
        "clusters": {"v6e-res": {"reservations": [{"name": "r", "count": 4, "in_use": 0}]}},
        "delivery": {"late_probability": 0, "duplicate_probability": 1.0},
    }))
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    metrics = Metrics(clock=VirtualClock(START))
    svc = build_service(open_app(Settings(db_url=url), VirtualClock(START), metrics=metrics),
                        None, RunOptions(sim_config=world))
    registry.add_cluster(svc.app.store, name="v6e-res", project="p", location="us-east5-b",
                         tpu_type="v6e", gcs_bucket="logs", default_reservation="r")
    try:
        job_rows.submit(svc.app.engine, task_id="m1", name="m1", actor="a",
                        spec={"image": "i", "tpu_type": "v6e", "topology": "2x2"}, now=START)
        report = svc.loop.run(until_idle=True, max_ticks=3000)
        assert report.stopped_by == "idle"
        assert job_rows.get_row(svc.app.engine, "m1")["status"] == "Succeeded"
    finally:
        svc.close()
    calls = {labels["method"]: count for (name, labels_tuple), count in samples(metrics).items()
             if name == "falcon_external_call_seconds_count"
             for labels in [dict(labels_tuple)]}
    for method in ("create_node_pool", "get_operation", "get_reservation", "create_job",
                   "list_nodes", "delete_node_pool", "pull"):
        assert calls.get(method, 0) >= 1, (method, calls)
    assert value(metrics, "falcon_external_call_errors_total", api="gke",
                 method="create_node_pool", code="RETRYABLE") == 1
    assert value(metrics, "falcon_external_call_retries_total", api="gke",
                 method="create_node_pool") == 1
    # Every observation is delivered twice: each second copy is stale, or, once the
    # task has ended, about a task no longer followed.
    outcomes = {outcome: value(metrics, "falcon_edge_observations_total", cluster="v6e-res",
                               outcome=outcome) or 0
                for outcome in ("applied", "stale", "unknown-task", "held", "malformed")}
    assert outcomes["applied"] >= 2  # Running, then Succeeded
    assert outcomes["stale"] >= 1
    assert outcomes["stale"] + outcomes["unknown-task"] == outcomes["applied"], outcomes