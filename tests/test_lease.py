"""Leader election on a coordination.k8s.io/v1 Lease (issue 6, high availability).

Every elector talks through the real ``kubernetes`` client to the fake API server over
HTTPS; lease time is a virtual clock, so expiry and deadlines are exact and nothing
sleeps. The fence (``may_append``) is checked at every virtual moment the tests visit:
two candidates never may append at once.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from falcon_es.adapters.gcp.lease import (
    LeaseConfigError,
    LeaseElector,
    LeaseSettings,
    lease_api,
    micro_time,
)
from falcon_es.clock import VirtualClock
from tests.fakes.kube_server import FakeKubeServer

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
    assert LeaseSettings.from_env({}) == LeaseSettings(
        "falcon-controller", "falcon", 15.0, 10.0, 2.0)
    assert LeaseSettings.from_env({
        "FALCON_LEASE_NAME": "falcon-a", "FALCON_LEASE_NAMESPACE": "ops",
        "FALCON_LEASE_DURATION": "30", "FALCON_LEASE_RENEW_DEADLINE": "20",
        "FALCON_LEASE_RETRY_PERIOD": "4",
    }) == LeaseSettings("falcon-a", "ops", 30.0, 20.0, 4.0)


@pytest.mark.parametrize(("environ", "words"), [
    ({"FALCON_LEASE_DURATION": "soon"}, "FALCON_LEASE_DURATION='soon': expected a number"),
    ({"FALCON_LEASE_DURATION": "10"}, "must be longer than FALCON_LEASE_RENEW_DEADLINE=10"),
    ({"FALCON_LEASE_DURATION": "15.5"}, "expected a whole number"),
    ({"FALCON_LEASE_RETRY_PERIOD": "9"}, "1.2 x FALCON_LEASE_RETRY_PERIOD=9"),
    ({"FALCON_LEASE_RENEW_DEADLINE": "-1"}, "FALCON_LEASE_RENEW_DEADLINE=-1.0: expected a "
                                            "positive"),
    ({"FALCON_LEASE_RETRY_PERIOD": "nan"}, "FALCON_LEASE_RETRY_PERIOD=nan"),
])
def test_unsafe_lease_settings_name_the_variable(environ: dict, words: str) -> None:
    with pytest.raises(LeaseConfigError, match=None) as error:
        LeaseSettings.from_env(environ)
    assert words in str(error.value)
