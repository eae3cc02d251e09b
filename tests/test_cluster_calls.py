"""Calls on behalf of a cluster: each cluster's own bounded workers, one attempt per call
within its deadline, answers fetched for the handlers, and the score of who answers.

Real clients against the fake servers (tests/fakes) where a call crosses the wire;
``ClusterCalls`` and ``ObservedReads`` with plain callables where only the threading
is at stake. Waits are bounded by events, never by sleeping.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest
from google.auth.credentials import AnonymousCredentials

from falcon_es.adapters.gcp.gke import GkeNodePools
from falcon_es.domain import events as ev
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import AWAITING, RETRYABLE, NodeCounts, PortError, Ports
from falcon_es.domain.task import evolve, new_state
from falcon_es.engine.cluster_calls import ApiHealth, ClusterCalls, health_recorded
from falcon_es.engine.observed import ObservedReads, observed_ports
from falcon_es.projections.messages import task_message
from tests.fakes import gke_server
from tests.fakes.fixtures import edge_cluster_row, edge_clusters_for
from tests.fakes.kube_server import FakeKubeServer

#: Wall seconds a test waits for something that happens in milliseconds.
PATIENCE = 10.0
START = dt.datetime(2026, 11, 1, 9, 0, 0)


def cluster(name: str) -> Cluster:
    return dataclasses.replace(edge_cluster_row(), id=f"id-{name}", name=name)


# ------------------------------------------------------------ the per-cluster bound

def test_a_cluster_whose_calls_hang_holds_only_its_own_workers() -> None:
    calls = ClusterCalls(per_cluster=2)
    sick, healthy = cluster("sick"), cluster("healthy")
    release = threading.Event()
    lock = threading.Lock()
    running, most = [0], [0]
    healthy_done = threading.Event()

    def hung() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(PATIENCE)
        with lock:
            running[0] -= 1

    try:
        for _ in range(5):
            calls.submit(sick, hung)
        calls.submit(healthy, healthy_done.set)
        assert healthy_done.wait(PATIENCE)  # not behind the sick cluster's calls
        assert calls.queued(sick.id) == 5
        assert most[0] == 2  # the bound: two at once, the rest wait their turn
    finally:
        release.set()
        calls.close()


def test_inline_calls_run_at_once_on_the_callers_thread() -> None:
    calls = ClusterCalls(per_cluster=1, inline=True)
    ran_on: list[threading.Thread] = []
    calls.submit(cluster("a"), lambda: ran_on.append(threading.current_thread()))
    assert ran_on == [threading.current_thread()]


# ------------------------------------------------------------ each call costs its deadline once

@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    server = FakeKubeServer().start()
    yield server
    server.stop()


def test_a_kubernetes_api_that_never_answers_costs_one_attempt_and_one_deadline(
        kube: FakeKubeServer) -> None:
    """urllib3 would retry a read timeout three times (Configuration.retries unset):
    the edge clients make one attempt, which ends at the read deadline."""
    edges = edge_clusters_for(kube, request_timeout_seconds=(2.0, 0.3))
    try:
        edge = edges.for_cluster(edge_cluster_row())
        assert edge.node_counts("falcon-t1-2x2") == NodeCounts(0, 0)  # token fetched
        kube.hang()
        started = time.monotonic()
        with pytest.raises(PortError) as raised:
            edge.node_counts("falcon-t1-2x2")
        took = time.monotonic() - started
    finally:
        edges.close()
    assert raised.value.code == RETRYABLE and raised.value.unanswered
    assert "Read timed out" in raised.value.message
    assert kube.unanswered == [("GET", "/api/v1/nodes")]
    assert took < 1.2  # one read deadline (0.3 s), not four


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_gke_calls_are_not_retried_by_the_client(transport: str) -> None:
    """google-cloud-container retries UNAVAILABLE by default on reads; the adapter turns
    that off, so a failed call is one attempt and the controller's own backoff paces
    the next."""
    fake = gke_server.FakeGke()
    row = edge_cluster_row()
    fake.add_cluster(row.project, row.location, row.name)
    fake.fail_next("GetNodePool", "UNAVAILABLE", "the service is currently unavailable")
    serve = gke_server.serve_rest if transport == "rest" else gke_server.serve_grpc
    with serve(fake) as endpoint:
        pools = GkeNodePools(credentials=AnonymousCredentials(), api_endpoint=endpoint,
                             transport=transport, timeout=5.0)
        try:
            with pytest.raises(PortError) as raised:
                pools.get(row, "falcon-t1-2x2")
        finally:
            pools.close()
    assert raised.value.code == RETRYABLE
    assert [method for method, _ in fake.calls].count("GetNodePool") == 1


# ------------------------------------------------------------ answers for the handlers

class _Nodes:
    """An edge cluster whose node counts are answered when the test lets them."""

    def __init__(self) -> None:
        self.asked = 0
        self.gate = threading.Event()
        #: The API does not answer: each call ends at its deadline with nothing.
        self.silent = False

    def node_counts(self, pool_name: str) -> NodeCounts:
        self.asked += 1
        if self.silent or not self.gate.wait(PATIENCE):
            raise PortError(RETRYABLE, "read timed out", unanswered=True)
        return NodeCounts(registered=4, ready=3)


class _Edges:
    def __init__(self, edge: _Nodes) -> None:
        self.edge = edge

    def for_cluster(self, c: Cluster) -> _Nodes:
        return self.edge


def _ports(edge: _Nodes, clock: VirtualClock) -> Ports:
    return Ports(node_pools=None, reservations=None, edges=_Edges(edge),  # type: ignore[arg-type]
                 bus=None, clock=clock)  # type: ignore[arg-type]


def test_a_read_is_awaited_then_answered_from_the_clusters_workers() -> None:
    clock = VirtualClock(START)
    edge = _Nodes()
    calls = ClusterCalls(per_cluster=1)
    reads = ObservedReads(_ports(edge, clock), calls, max_age_seconds=2.0)
    ports = observed_ports(reads)
    sick = cluster("a")
    try:
        for _ in range(3):  # asked once, however often a tick asks meanwhile
            with pytest.raises(PortError) as raised:
                ports.edges.for_cluster(sick).node_counts("p")
            assert raised.value.code == AWAITING
        calls.landed.clear()
        edge.gate.set()
        assert calls.landed.wait(PATIENCE)
        assert ports.edges.for_cluster(sick).node_counts("p") == NodeCounts(4, 3)
        assert edge.asked == 1
        clock.advance(3)  # older than the answer's age: asked again
        with pytest.raises(PortError):
            ports.edges.for_cluster(sick).node_counts("p")
        assert calls.landed.wait(PATIENCE)
        reads.effect_done(sick.id)  # an effect on the cluster outdates what was read
        with pytest.raises(PortError) as raised:
            ports.edges.for_cluster(sick).node_counts("p")
        assert raised.value.code == AWAITING
    finally:
        edge.gate.set()
        calls.close()


def test_handlers_cannot_make_effects_through_the_answers() -> None:
    reads = ObservedReads(_ports(_Nodes(), VirtualClock(START)), ClusterCalls(per_cluster=1),
                          max_age_seconds=2.0)
    with pytest.raises(RuntimeError, match="effect executor"):
        observed_ports(reads).edges.for_cluster(cluster("a")).delete_job("falcon-t1")


# ------------------------------------------------------------ who answers

def test_the_health_score_keeps_the_start_of_a_silent_spell_until_an_answer() -> None:
    clock = VirtualClock(START)
    edge = _Nodes()
    health = ApiHealth()
    ports = health_recorded(_ports(edge, clock), health)
    sick = cluster("edge-b")
    edge.gate.set()
    ports.edges.for_cluster(sick).node_counts("p")
    assert health.unanswered() == [] and not health.ever_unanswered
    edge.silent = True
    for _ in range(2):
        with pytest.raises(PortError):
            ports.edges.for_cluster(sick).node_counts("p")
        clock.advance(10)
    [spell] = health.unanswered()
    assert (spell.cluster, spell.api, spell.since, spell.error) == (
        "edge-b", "kubernetes", START, "read timed out")
    assert health.ever_unanswered
    edge.silent = False
    ports.edges.for_cluster(sick).node_counts("p")
    assert health.unanswered() == []
    assert health.last_answers() == {("edge-b", "kubernetes"): START + dt.timedelta(seconds=20)}


def test_an_unanswered_api_leads_the_message_and_the_old_one_comes_back() -> None:
    state = new_state("t1")
    for event in (ev.TaskAccepted("t1", "a", {}, "v6e", "2x2", START),
                  ev.ClusterChosen("c1", "edge-b", "2x2", "only-candidate", ()),
                  ev.TaskPicked("c1", "2x2", "fifo", (), None),
                  ev.NodePoolCreateRequested("falcon-t1-2x2", "reservation", "ct6e", 1,
                                             "r", 600),
                  ev.NodePoolCreateStarted("falcon-t1-2x2", "op-1")):
        state = evolve(state, event, START)
    before = task_message(state)
    silent = evolve(state, ev.ClusterApiUnanswered("edge-b", "kubernetes", START, "timed out"),
                    START)
    assert task_message(silent) == ("edge cluster edge-b's Kubernetes API has not answered "
                                    "since 2026-11-01 09:00 UTC: timed out")
    assert silent.state == state.state
    answered = evolve(silent, ev.ClusterApiUnanswered("edge-b", "kubernetes", None), START)
    assert task_message(answered) == before
