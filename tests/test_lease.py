"""Leader election on a coordination.k8s.io/v1 Lease (high availability: of
several replicas, only the Lease holder runs the loop; see docs/explanation/architecture.md).

Every elector talks through the real ``kubernetes`` client to the fake API server over
HTTPS; lease time is a virtual clock, so expiry and deadlines are exact and nothing
sleeps. The fence (``may_append``) is checked at every virtual moment the tests visit:
two candidates never may append at once.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service, register_sim_clusters
from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.app import service
from falcon_es.adapters.gcp.lease import (
    LeaseConfigError,
    LeaseElector,
    LeaseSettings,
    lease_api,
    micro_time,
)
from falcon_es.adapters.sim import SimWorld
from falcon_es.cli import main
from falcon_es.domain.clock import VirtualClock
from falcon_es.engine.loop import LOST_LEADERSHIP, LoopReport
from falcon_es.observability.health import HealthServer
from falcon_es.config.settings import Settings
from falcon_es.storage.store import EventStore
from tests.fakes.kube_server import FakeKubeServer
from tests.support.harness import reserved_cluster, sim_config
from tests.conftest import migrate

NAMESPACE, NAME = "falcon", "falcon-controller"
START = dt.datetime(2026, 11, 1, 9, 0, 0)
LEASE_PATH = r"/apis/coordination\.k8s\.io/v1/namespaces/falcon/leases/falcon-controller$"


@pytest.fixture
def lease_clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def server(lease_clock: VirtualClock) -> Iterator[FakeKubeServer]:
    with FakeKubeServer(clock=lease_clock) as fake:
        yield fake


def configuration(server: FakeKubeServer) -> client.Configuration:
    """A client configuration for the fake, as in-cluster config would give one: the
    API server's address and CA, and a bearer token."""
    config = client.Configuration(host=server.url, ca_cert_data=server.ca_pem)
    config.api_key = {"authorization": server.issue_token(dt.timedelta(days=30))}
    config.api_key_prefix = {"authorization": "Bearer"}
    return config


def candidate(server: FakeKubeServer, identity: str, clock: VirtualClock, *,
              name: str = NAME, **options: float) -> LeaseElector:
    return LeaseElector(lease_api(configuration(server)), NAMESPACE, name, identity,
                        clock=clock, **options)


def spec(server: FakeKubeServer, name: str = NAME) -> dict:
    lease = server.get("leases", name, NAMESPACE)
    assert lease is not None, f"no lease {name}"
    return lease["spec"]


def never_both(*electors: LeaseElector) -> None:
    leading = [e.identity for e in electors if e.may_append()]
    assert len(leading) <= 1, f"two candidates may append at once: {leading}"


# --------------------------------------------------------------------- one election

def test_of_two_candidates_exactly_one_leads_and_the_lease_says_who(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    assert a.step() is True
    assert b.step() is False
    assert (a.may_append(), b.may_append()) == (True, False)
    assert spec(server) == {
        "holderIdentity": "replica-a", "leaseDurationSeconds": 15,
        "acquireTime": "2026-11-01T09:00:00.000000Z", "renewTime": "2026-11-01T09:00:00.000000Z",
        "leaseTransitions": 0,
    }
    assert b.describe() == f"standby: lease {NAMESPACE}/{NAME} is held by replica-a"
    assert a.describe() == f"leader: holding lease {NAMESPACE}/{NAME} as replica-a"


def test_the_leaders_renewals_keep_it_for_as_long_as_it_renews(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    for _ in range(60):  # two minutes of renewals every retry period
        lease_clock.advance(2)
        assert a.step() is True
        assert b.step() is False
        never_both(a, b)
    lease = spec(server)
    assert lease["holderIdentity"] == "replica-a" and lease["leaseTransitions"] == 0
    assert lease["acquireTime"] == micro_time(START)
    assert lease["renewTime"] == micro_time(START + dt.timedelta(seconds=120))


def test_a_stopped_leaders_lease_expires_and_the_standby_takes_over(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    b.step()  # b sees a's record now: the lease duration counts from here, on b's clock
    took_over_at = None
    for second in range(2, 31, 2):  # a has stopped: it never renews again
        lease_clock.advance(2)
        never_both(a, b)
        if b.step():
            took_over_at = second
            break
    assert took_over_at == 16  # the first attempt after 15 s without a renewal
    assert not a.may_append()  # a's own fence closed at its renew deadline (10 s)
    lease = spec(server)
    assert lease["holderIdentity"] == "replica-b" and lease["leaseTransitions"] == 1
    assert lease["acquireTime"] == micro_time(START + dt.timedelta(seconds=16))


def test_the_leader_fence_closes_at_the_renew_deadline_even_without_a_renewal_attempt(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    """A renewal stuck in a hung request cannot keep the fence open: it is time alone."""
    a = candidate(server, "replica-a", lease_clock)
    a.step()
    lease_clock.advance(9.9)
    assert a.may_append()
    lease_clock.advance(0.1)
    assert not a.may_append() and not a.is_leader()


@pytest.mark.parametrize(("method", "code", "reason"), [
    ("PUT", 409, "Conflict"), ("PUT", 503, "ServiceUnavailable"), ("GET", 500, "InternalError"),
    ("GET", 403, "Forbidden"),
])
def test_a_leader_whose_renewals_fail_stops_within_the_renew_deadline(
        server: FakeKubeServer, lease_clock: VirtualClock, method: str, code: int,
        reason: str) -> None:
    a = candidate(server, "replica-a", lease_clock)
    a.step()
    lease_clock.advance(2)
    a.step()
    last_renewal = lease_clock.now()
    server.inject(method, LEASE_PATH, code, reason=reason, times=1000)
    stopped_at = None
    while lease_clock.now() < last_renewal + dt.timedelta(seconds=30):
        lease_clock.advance(2)
        leading = a.step()
        if not leading:
            stopped_at = lease_clock.now()
            break
    assert stopped_at is not None and stopped_at <= last_renewal + dt.timedelta(seconds=10)
    assert not a.may_append()
    assert f"{code}" in a.last_error
    assert "unreachable" in a.describe() or "held by" in a.describe()


def test_a_partitioned_leader_stops_before_the_standby_can_start(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    """The leader loses the API server (its requests fail) while the standby still
    reaches it: the old leader's fence closes at its renew deadline, the standby takes
    over only after the lease duration, and at no moment may both append."""
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    b.step()
    a.api.api_client.configuration.host = "https://127.0.0.1:9"  # nothing listens there
    a_stopped = b_started = None
    for _ in range(20):
        lease_clock.advance(1)
        if a.step() is False and a_stopped is None:
            a_stopped = lease_clock.now()
        never_both(a, b)
        if b.step() and b_started is None:
            b_started = lease_clock.now()
        never_both(a, b)
    assert a_stopped == START + dt.timedelta(seconds=10)
    assert b_started == START + dt.timedelta(seconds=15)  # 15 s after b last saw a renew
    assert spec(server)["holderIdentity"] == "replica-b"


def test_release_lets_the_standby_take_over_at_once(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    lease_clock.advance(2)
    a.step()
    b.step()
    assert a.release() is True
    assert not a.may_append()
    released = spec(server)
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
    assert b.step() is True  # same moment: no waiting out the lease duration
    lease = spec(server)
    assert lease["holderIdentity"] == "replica-b" and lease["leaseTransitions"] == 1
    assert lease["leaseDurationSeconds"] == 15
    assert a.release() is False  # not the holder any more: nothing to hand back
    assert spec(server)["holderIdentity"] == "replica-b"


def test_a_leader_that_was_replaced_sees_the_new_holder_and_stops_at_once(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    b.step()
    lease_clock.advance(16)  # a was paused (a long GC, a frozen VM) past the lease duration
    assert b.step() is True
    assert a.step() is False and not a.may_append()
    assert "held by replica-b" in a.describe()


# --------------------------------------------------------------------- races

def race(*electors: LeaseElector) -> list[bool]:
    """Every elector attempts at the same moment, from its own thread."""
    barrier = threading.Barrier(len(electors))
    results: list[bool] = [False] * len(electors)

    def attempt(index: int) -> None:
        barrier.wait()
        results[index] = electors[index].step()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(electors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_candidates_racing_for_a_new_lease_are_decided_by_the_api_server(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    for round_number in range(8):
        name = f"race-{round_number}"
        electors = [candidate(server, f"replica-{i}", lease_clock, name=name) for i in range(3)]
        results = race(*electors)
        assert sum(results) == 1, results
        winner = electors[results.index(True)].identity
        assert spec(server, name)["holderIdentity"] == winner
    refused = [r for r in server.requests if r.method == "POST" and r.status == 409]
    assert refused, "no create ever lost a race: the test did not race"


def test_candidates_racing_for_a_released_lease_lose_on_resource_version_conflicts(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    conflicts = 0
    for round_number in range(8):
        name = f"handover-{round_number}"
        holder = candidate(server, "holder", lease_clock, name=name)
        holder.step()
        electors = [candidate(server, f"replica-{i}", lease_clock, name=name) for i in range(3)]
        for elector in electors:
            elector.step()
        holder.release()
        results = race(*electors)
        assert sum(results) == 1, results
        conflicts += sum(1 for e in electors if "409" in e.last_error)
        assert spec(server, name)["leaseTransitions"] == 1
    assert conflicts > 0, "no replace ever lost a race: the test did not race"


# --------------------------------------------------------------------- the campaign thread

def test_run_reports_each_change_of_leadership_and_leaves_the_release_to_its_owner(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    elector = candidate(server, "replica-a", lease_clock, retry_period=0.01)
    started, stopped = threading.Event(), threading.Event()
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop, started.set, stopped.set))
    thread.start()
    assert started.wait(10)
    stop.set()
    thread.join(10)
    assert stopped.is_set()
    assert spec(server)["holderIdentity"] == "replica-a"  # run() does not release
    assert elector.release() is True
    assert spec(server)["holderIdentity"] == ""


# --------------------------------------------------------------------- the wire format

def test_lease_times_go_out_as_micro_time_which_the_default_client_gets_wrong(
        server: FakeKubeServer) -> None:
    """The API server parses MicroTime with Go's fixed six-digit layout: the client's
    ``isoformat()`` of a whole second (or of a naive datetime) is refused."""
    whole_second = dt.datetime(2026, 11, 1, 9, 0, 0, tzinfo=dt.UTC)
    body = client.V1Lease(metadata=client.V1ObjectMeta(name="plain"), spec=client.V1LeaseSpec(
        holder_identity="x", lease_duration_seconds=15, renew_time=whole_second))
    plain = client.CoordinationV1Api(client.ApiClient(configuration(server)))
    with pytest.raises(ApiException) as refused:
        plain.create_namespaced_lease(NAMESPACE, body)
    assert refused.value.status == 400 and "2006-01-02T15:04:05.000000Z07:00" in refused.value.body
    created = lease_api(configuration(server)).create_namespaced_lease(NAMESPACE, body)
    assert created.spec.renew_time == whole_second
    assert spec(server, "plain")["renewTime"] == "2026-11-01T09:00:00.000000Z"


def test_an_elector_given_a_plain_client_still_writes_micro_time(
        server: FakeKubeServer, lease_clock: VirtualClock) -> None:
    plain = client.CoordinationV1Api(client.ApiClient(configuration(server)))
    elector = LeaseElector(plain, NAMESPACE, NAME, "replica-a", clock=lease_clock)
    assert elector.step() is True
    assert spec(server)["renewTime"] == "2026-11-01T09:00:00.000000Z"


# --------------------------------------------------------------------- settings

def test_lease_settings_default_and_from_the_environment() -> None:
    assert Settings.from_env({}).lease == LeaseSettings(
        name="falcon-controller", namespace="falcon", lease_duration=15.0,
        renew_deadline=10.0, retry_period=2.0)
    assert Settings.from_env({
        "FALCON_LEASE_NAME": "falcon-a", "FALCON_LEASE_NAMESPACE": "ops",
        "FALCON_LEASE_DURATION": "30", "FALCON_LEASE_RENEW_DEADLINE": "20",
        "FALCON_LEASE_RETRY_PERIOD": "4",
    }).lease == LeaseSettings(name="falcon-a", namespace="ops", lease_duration=30.0,
                              renew_deadline=20.0, retry_period=4.0)


@pytest.mark.parametrize(("environ", "words"), [
    ({"FALCON_LEASE_DURATION": "soon"}, "FALCON_LEASE_DURATION='soon': expected a number"),
    ({"FALCON_LEASE_DURATION": "10"}, "must be longer than FALCON_LEASE_RENEW_DEADLINE=10"),
    ({"FALCON_LEASE_DURATION": "15.5"}, "expected a whole number"),
    ({"FALCON_LEASE_RETRY_PERIOD": "9"}, "1.2 x FALCON_LEASE_RETRY_PERIOD=9"),
    ({"FALCON_LEASE_RENEW_DEADLINE": "-1"}, "FALCON_LEASE_RENEW_DEADLINE=-1.0: expected"),
    ({"FALCON_LEASE_RETRY_PERIOD": "nan"}, "FALCON_LEASE_RETRY_PERIOD=nan"),
])
def test_unsafe_lease_settings_name_the_variable(environ: dict, words: str) -> None:
    with pytest.raises(LeaseConfigError, match=None) as error:
        Settings.from_env(environ)
    assert words in str(error.value)


# ===================================================================== the controller side

SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2",
        "command": ["python", "train.py"]}
#: Events a task records once in a life that goes Waiting -> ... -> Succeeded.
ONCE_IN_A_LIFE = frozenset({
    "TaskAccepted", "ClusterChosen", "TaskPicked", "NodePoolCreateRequested",
    "NodePoolCreateStarted", "NodePoolReady", "NodePoolReused", "JobSubmitRequested",
    "JobSubmitted", "PodsRunning", "JobSucceeded", "NodePoolRetained",
    "NodePoolDeleteRequested", "NodePoolDeleted",
})


#: One reserved v6e cluster with fixed latencies and no faults.
QUIET_WORLD = sim_config(reserved_cluster(count=8))


def quiet_world(clock: VirtualClock, services: list[service.Service], db_url: str) -> SimWorld:
    """One simulated GKE + Kubernetes that every controller of a test talks to, as
    replicas share the real ones, its cluster registered in ``db_url``'s registry. A
    Job's simulated behaviour comes from its task's spec as whichever controller knows
    the task has it."""
    def behaviour(task_id: str) -> object:
        for svc in services:
            state = svc.app.tasks.get(task_id)
            if state is not None:
                sim = state.submission.spec.sim
                return dataclasses.asdict(sim) if sim is not None else None
        return None

    register_quiet_cluster(db_url)
    return SimWorld(clock, QUIET_WORLD, behaviour_source=behaviour)


def register_quiet_cluster(db_url: str) -> None:
    """Register the quiet world's cluster, as an operator does before the controller runs."""
    app = open_app(Settings(db_url=db_url), VirtualClock(START))
    try:
        register_sim_clusters(app, QUIET_WORLD)
    finally:
        app.close()


def submit(engine: object, task_id: str, clock: VirtualClock, seconds: int = 300) -> None:
    job_rows.submit(engine, name=task_id, actor=f"user-{task_id[-1]}",
                    spec={**SPEC, "sim": {"duration_seconds": seconds}}, now=clock.now(),
                    task_id=task_id)


class JobsCreated:
    """Every Job the simulated Kubernetes API really created (an "already exists"
    answer creates nothing), counted at the world's boundary."""

    def __init__(self, world: SimWorld, cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: collections.Counter[str] = collections.Counter()
        kube = world.cluster(cluster).kube
        create = kube.submit

        def counted(manifest: Mapping[str, Any], now: dt.datetime) -> Any:
            ref = create(manifest, now)
            self.names[ref.name] += 1
            return ref

        monkeypatch.setattr(kube, "submit", counted)


def assert_each_effect_once(store: EventStore, world: SimWorld, jobs: JobsCreated,
                            task_ids: Sequence[str]) -> None:
    for task_id in task_ids:
        records = store.read_stream(task_id)
        types = collections.Counter(r.type_name for r in records)
        twice = {t: n for t, n in types.items() if t in ONCE_IN_A_LIFE and n > 1}
        assert not twice, f"{task_id}: transitions recorded twice: {twice}"
        repeats = [r.type_name for before, r in itertools.pairwise(records)
                   if before.event == r.event]
        assert not repeats, f"{task_id}: the same event twice in a row: {repeats}"
    pools = [p.name for p in world.pools(include_deleted=True)]
    assert len(pools) == len(set(pools)), f"a pool was created twice: {sorted(pools)}"
    assert len(pools) <= len(task_ids)
    assert all(name.startswith(tuple(f"falcon-{t}-" for t in task_ids)) for name in pools)
    assert world.pools() == [], "a pool was left behind"
    assert dict(jobs.names) == {f"falcon-{t}": 1 for t in task_ids}, "a Job was created twice"


@pytest.mark.parametrize("seed", [1, 2])
def test_two_controllers_without_a_lease_duplicate_no_pool_job_or_transition(
        db_url: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fence behind the lease: two controllers on one database and one
    world, no election. Their ticks interleave in a seeded order, and in about half the
    rounds one controller's whole tick runs between the other's decisions and its
    commit, so the slower one commits on stale versions: the log refuses it
    (ConcurrencyError), it reloads and decides again. Each follows the log before a
    tick, so neither sweeps the other's pools as orphans."""
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, db_url)
    jobs = JobsCreated(world, "v6e-res", monkeypatch)
    for name in ("a", "b"):
        services.append(build_service(
            open_app(Settings(db_url=db_url, controller_id=f"falcon-{name}"), clock,
                     follow_log=True), None, RunOptions(world=world)))
    a, b = services
    tasks = [f"t{i}" for i in range(6)]
    for index, task_id in enumerate(tasks):
        submit(a.app.engine, task_id, clock, seconds=300 + 60 * index)
    racing: list[service.Service] = []
    conflicts = collections.Counter[str]()

    def race(me: service.Service, other: service.Service) -> Callable[[Any, Any], None]:
        def before_commit(tick: Any, ctx: Any) -> None:
            if racing and racing[0] is me:  # the other's whole tick lands first
                racing.clear()
                other.loop.step()
        return before_commit

    a.controller.before_commit = (*a.controller.before_commit, race(a, b))
    b.controller.before_commit = (*b.controller.before_commit, race(b, a))
    order = random.Random(seed)
    try:
        for _ in range(1000):
            turn = [a, b]
            order.shuffle(turn)
            if order.random() < 0.5:
                racing.append(turn[0])
            busy = False
            for svc in turn:
                report = svc.loop.step()
                racing.clear()
                assert report is not None
                conflicts[svc.controller.controller_id] += report.conflicts
                busy |= bool(report.appended or report.conflicts or svc.loop.has_work())
            rows = job_rows.list_rows(a.app.engine)
            if all(r["status"] == "Succeeded" for r in rows) and all(
                    s.settled() for s in services) and not world.pools():
                break
            if not busy:
                due = [d for d in (s.loop.next_due() for s in services) if d is not None]
                assert due, f"nothing due and not settled: {job_rows.list_rows(a.app.engine)}"
                clock.advance_to(max(min(due), clock.now() + dt.timedelta(milliseconds=1)))
        rows = job_rows.list_rows(a.app.engine)
        assert {r["id"]: r["status"] for r in rows} == {t: "Succeeded" for t in tasks}, [(r["id"], r["status"], r["reason"], r["message"]) for r in rows]
        assert_each_effect_once(a.app.store, world, jobs, tasks)
        assert sum(conflicts.values()) > 0, "no tick ever lost a race: the test did not race"
        writers = collections.Counter(r.meta.get("controller") for r in a.app.store.read_after(0))
        assert writers["falcon-a"] > 0 and writers["falcon-b"] > 0, writers
    finally:
        for svc in services:
            svc.close()


def leader_service(db_url: str, clock: VirtualClock, world: SimWorld, elector: LeaseElector,
                   name: str) -> service.Service:
    return build_service(
        open_app(Settings(db_url=db_url, controller_id=f"falcon-{name}"), clock, follow_log=True),
        None, RunOptions(world=world, leadership=elector))


def test_a_loop_that_lost_the_lease_stops_without_ticking(
        server: FakeKubeServer, lease_clock: VirtualClock, tmp_path: Any) -> None:
    url = fresh_sqlite(tmp_path)
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, url)
    elector = candidate(server, "replica-a", lease_clock)
    elector.step()
    svc = leader_service(url, clock, world, elector, "a")
    services.append(svc)
    submit(svc.app.engine, "t1", clock)
    try:
        assert svc.loop.run(max_ticks=1).stopped_by == "max-ticks"
        head = svc.app.store.head()
        assert head > 0
        lease_clock.advance(10)  # no renewal for the whole renew deadline
        submit(svc.app.engine, "t2", clock)
        report = svc.loop.run()
        assert (report.stopped_by, report.ticks) == (LOST_LEADERSHIP, 0)
        assert svc.app.store.head() == head
        assert job_rows.get_row(svc.app.engine, "t2")["reason"] is None  # not taken in
    finally:
        svc.close()


def test_a_tick_that_outlives_the_lease_commits_nothing(
        server: FakeKubeServer, lease_clock: VirtualClock, tmp_path: Any) -> None:
    """The fence is checked again right before the commit: a tick that started as
    leader but took past the renew deadline (a slow API, a GC pause) appends nothing."""
    url = fresh_sqlite(tmp_path)
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, url)
    elector = candidate(server, "replica-a", lease_clock)
    elector.step()
    svc = leader_service(url, clock, world, elector, "a")
    services.append(svc)
    submit(svc.app.engine, "t1", clock)
    slow = svc.loop.advance_world

    def slow_world() -> None:  # the tick's inputs take longer than the renew deadline
        lease_clock.advance(11)
        if slow is not None:
            slow()

    svc.loop.advance_world = slow_world
    head = svc.app.store.head()  # the cluster registered at start
    try:
        report = svc.loop.run()
        assert (report.stopped_by, report.ticks, report.appended) == (LOST_LEADERSHIP, 0, 0)
        assert svc.app.store.head() == head
        assert svc.app.tasks.get("t1") is None
    finally:
        svc.close()


def test_a_new_leader_catches_up_and_finishes_what_the_old_one_left_open(
        server: FakeKubeServer, lease_clock: VirtualClock, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Graceful hand-over in the middle of a task: the leader stops after a tick (its
    last commit left a node pool being created), releases the lease; the standby takes
    it at once, folds the log, re-issues the open intent (adopting the pool that
    exists), and the task ends as if one controller had run it."""
    url = fresh_sqlite(tmp_path)
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, url)
    jobs = JobsCreated(world, "v6e-res", monkeypatch)
    a, b = candidate(server, "replica-a", lease_clock), candidate(server, "replica-b", lease_clock)
    a.step()
    b.step()
    first = leader_service(url, clock, world, a, "a")
    services.append(first)
    submit(first.app.engine, "t1", clock)
    for _ in range(20):
        first.loop.step()
        state = first.app.tasks.get("t1")
        if state is not None and "NodePoolCreateRequested" in [
                r.type_name for r in first.app.store.read_stream("t1")]:
            break
    stopped = first.loop.run(stop=stopped_event())
    assert stopped.stopped_by == "signal"
    first.close()
    services.clear()
    assert a.release() and b.step()
    second = leader_service(url, clock, world, b, "b")
    services.append(second)
    try:
        summary = second.catch_up()
        assert "1 tasks folded (1 live)" in summary and "1 open intent(s) re-issued" in summary
        assert second.executor is not None and second.executor.has_outcomes
        report = second.loop.run(until_idle=True)
        assert report.stopped_by == "idle"
        assert job_rows.get_row(second.app.engine, "t1")["status"] == "Succeeded"
        assert_each_effect_once(second.app.store, world, jobs, ["t1"])
        controllers = [r.meta.get("controller") for r in second.app.store.read_stream("t1")]
        assert controllers[0] == "falcon-a" and controllers[-1] == "falcon-b"
    finally:
        second.close()


def stopped_event() -> threading.Event:
    stop = threading.Event()
    stop.set()
    return stop


def fresh_sqlite(tmp_path: Any) -> str:
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    return url


def last_event(svc: service.Service, task_id: str) -> str | None:
    records = svc.app.store.read_stream(task_id)
    return records[-1].type_name if records else None


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Bounded wait for another thread's progress (replicas run in threads here)."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_replicas_stand_by_take_over_on_release_and_report_their_role(
        server: FakeKubeServer, lease_clock: VirtualClock, tmp_path: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two replicas run ``serve_elected`` in threads. The first leads and finishes the
    first task while the second stands by (ready, role standby, naming the holder).
    Stopping the first (SIGTERM) finishes its tick, releases the lease, and the second
    takes over at once, catches up from the log and finishes the next task."""
    caplog.set_level("INFO")
    url = fresh_sqlite(tmp_path)
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, url)
    electors = {name: candidate(server, f"replica-{name}", lease_clock, retry_period=0.02)
                for name in ("a", "b")}
    healths = {name: HealthServer(max_tick_age=60) for name in ("a", "b")}
    stops = {name: threading.Event() for name in ("a", "b")}
    reports: dict[str, LoopReport] = {}

    def replica(name: str) -> None:
        def build(leadership: Any) -> service.Service:
            svc = build_service(
                open_app(Settings(db_url=url, controller_id=f"falcon-{name}"), clock,
                         follow_log=True),
                None, RunOptions(world=world, leadership=leadership, tick_seconds=0.01))
            services.append(svc)
            return svc

        reports[name] = service.serve_elected(build, electors[name], until_idle=False,
                                              stop=stops[name], health=healths[name])

    engine = db.make_engine(url)
    submit(engine, "t1", clock)
    first = threading.Thread(target=replica, args=("a",))
    first.start()
    wait_until(lambda: electors["a"].is_leader(), "replica a leads")
    second = threading.Thread(target=replica, args=("b",))
    second.start()
    try:
        wait_until(lambda: bool(services) and last_event(services[0], "t1") == "NodePoolDeleted",
                   "t1 succeeds and its pool is deleted under replica a")
        assert job_rows.get_row(engine, "t1")["status"] == "Succeeded"
        standby = json.loads(healths["b"].readyz().body)
        assert standby == {"ready": True, "role": "standby", "database": "ok",
                           "caught_up": True,
                           "detail": f"standby: lease {NAMESPACE}/{NAME} is held by replica-a"}
        assert json.loads(healths["a"].readyz().body)["role"] == "leader"
        stops["a"].set()
        first.join(30)
        assert reports["a"].stopped_by == "signal"
        submit(engine, "t2", clock)
        wait_until(lambda: job_rows.get_row(engine, "t2")["status"] == "Succeeded",
                   "t2 succeeds under replica b")
        leader = json.loads(healths["b"].readyz().body)
        # t1 ended and holds nothing: the new leader folds the live streams only.
        assert leader["role"] == "leader" and leader["detail"].startswith("caught up: 0 tasks")
    finally:
        for stop in stops.values():
            stop.set()
        first.join(30)
        second.join(30)
        engine.dispose()
    assert reports["b"].stopped_by == "signal"
    assert spec(server)["holderIdentity"] == ""  # b released it on the way out
    assert spec(server)["leaseTransitions"] == 1  # a created it; b took it over once
    by = {task: {r.meta.get("controller") for r in services[-1].app.store.read_stream(task)}
          for task in ("t1", "t2")}
    assert by == {"t1": {"falcon-a"}, "t2": {"falcon-b"}}
    logged = caplog.text
    assert "standby: lease falcon/falcon-controller is held by replica-a" in logged
    assert "caught up: 0 tasks folded (0 live)" in logged and "taking new work" in logged


def test_serve_catches_up_before_it_says_ready_or_takes_new_work(tmp_path: Any) -> None:
    url = fresh_sqlite(tmp_path)
    clock = VirtualClock(START)
    services: list[service.Service] = []
    world = quiet_world(clock, services, url)
    first = build_service(open_app(Settings(db_url=url), clock), None, RunOptions(world=world))
    services.append(first)
    submit(first.app.engine, "t1", clock)
    while "NodePoolCreateRequested" not in [r.type_name
                                            for r in first.app.store.read_stream("t1")]:
        first.loop.step()
    first.close()  # the process dies with the pool create's outcome unrecorded
    services.clear()
    restarted = build_service(open_app(Settings(db_url=url), clock), None,
                              RunOptions(world=world))
    services.append(restarted)
    submit(restarted.app.engine, "t2", clock)
    health = HealthServer(max_tick_age=60)
    try:
        assert json.loads(health.readyz().body)["ready"] is False
        report = service.serve(restarted, until_idle=False, stop=stopped_event(),
                               health=health)
        assert report.ticks == 0  # stopped before any new work
        ready = json.loads(health.readyz().body)
        assert ready["ready"] is True and ready["role"] == "standby"  # serve has ended
        assert ready["detail"].startswith("caught up: 1 tasks folded (1 live)")
        assert ready["detail"].endswith("1 open intent(s) re-issued")
        assert restarted.executor is not None and restarted.executor.has_outcomes
        assert restarted.app.tasks.get("t2") is None  # new work waits for the first tick
    finally:
        restarted.close()


# --------------------------------------------------------------------- the command line

def test_run_with_a_lease_outside_kubernetes_is_one_clear_line(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    url = fresh_sqlite(tmp_path)
    result = CliRunner().invoke(main, ["--db", url, "run", "--leader-election", "lease"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "falcon-es: --leader-election lease needs the Kubernetes API of the cluster it runs "
        "in (Service host/port is not set.); outside Kubernetes use --leader-election db"]


def test_run_refuses_unsafe_lease_timing_before_anything_starts(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FALCON_LEASE_RENEW_DEADLINE", "20")
    url = fresh_sqlite(tmp_path)
    result = CliRunner().invoke(main, ["--db", url, "run", "--leader-election", "lease"])
    assert result.exit_code == 2
    assert "FALCON_LEASE_DURATION=15 must be longer than FALCON_LEASE_RENEW_DEADLINE=20" in (
        result.output)


@pytest.mark.parametrize("election", ["none", "db"])
def test_run_without_a_lease_finishes_tasks(tmp_path: Any, election: str) -> None:
    url = fresh_sqlite(tmp_path)
    register_quiet_cluster(url)
    engine = db.make_engine(url)
    submit(engine, "r1", VirtualClock(START))
    result = CliRunner().invoke(main, ["--db", url, "run", "--until-idle",
                                       "--leader-election", election])
    assert result.exit_code == 0, result.output
    assert f"leader election: {election})" in result.output
    assert "stopped (idle)" in result.output
    assert job_rows.get_row(engine, "r1")["status"] == "Succeeded"
    engine.dispose()


def test_sigterm_ends_the_controller_cleanly_with_exit_zero(tmp_path: Any) -> None:
    """The pod's termination: SIGTERM to a running controller process ends it cleanly
    (exit 0) well within a termination grace period."""
    url = fresh_sqlite(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "falcon_es", "--db", url, "run", "--tick", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        started = process.stderr.readline()
        assert "controller running" in started, started
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
        assert process.returncode == 0, rest
        assert time.monotonic() - sent < 10
        assert "stopped (signal)" in rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
