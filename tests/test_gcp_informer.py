"""The edge-cluster informer through the real ``kubernetes`` client and its watch
machinery, against the local API server (tests/fakes/kube_server.py).

The informer runs in its own threads as in production; what the tests inject is its
clock (a VirtualClock the fake server shares), its sleep (records each backoff delay
and plays what happens in the world meanwhile, never sleeps) and its random numbers.
The last test runs it end to end onto Google's Pub/Sub emulator.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from falcon_es.adapters.gcp.informer import EdgeInformer, InformerSettings, run_informer
from falcon_es.adapters.gcp.job_observations import refusal_of
from falcon_es.adapters.gcp.job_views import JOBS, PODS, JobViews
from falcon_es.adapters.gcp.kube import KubeEdgeCluster, KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import GoogleAccessTokens
from falcon_es.adapters.gcp.pubsub import PubSubBus
from falcon_es.domain.clock import VirtualClock, utcnow
from falcon_es.domain.manifests import TASK_ID_ANNOTATION
from falcon_es.domain.ports import CreateRefusal, JobObservation
from falcon_es.config.retry import Backoff
from tests.fakes import fixtures
from tests.fakes.fixtures import (
    RecordingBus,
    access_tokens,
    edge_cluster_row,
    edge_clusters_for,
    falcon_manifest,
    unique_name,
)
from tests.fakes.kube_server import FakeKubeServer

# The fixtures this module uses (pytest looks them up by name in the module).
kube_server = fixtures.kube_server
pubsub_emulator = fixtures.pubsub_emulator
pubsub_bus = fixtures.pubsub_bus

TOPIC = "falcon-edge-events"
NO_JITTER = Backoff(initial=1.0, maximum=8.0, multiplier=2.0, jitter=0.0, attempts=1)
RESYNC_SECONDS = 300


def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait (bounded) for the informer's threads to get somewhere."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Sleeps:
    """The informer's sleep: records each delay and runs the next scripted change of
    the world (what happens while the informer is disconnected). Never sleeps."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.meanwhile: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.delays.append(seconds)
            action = self.meanwhile.popleft() if self.meanwhile else None
        if action is not None:
            action()


@dataclasses.dataclass
class World:
    server: FakeKubeServer
    clock: VirtualClock
    tokens: GoogleAccessTokens
    edges: KubeEdgeClusters
    edge: KubeEdgeCluster
    bus: RecordingBus
    sleeps: Sleeps
    informer: EdgeInformer
    stop: threading.Event
    restarts: list[str]  # the reasons the informer reported, as a metrics hook hears them
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.informer.run, args=(self.stop,), daemon=True)
        self.thread.start()
        self.server.wait_for_watches(3)

    def observations(self, job_name: str | None = None) -> list[JobObservation]:
        return [JobObservation.from_data(data) for data in self.bus.data()
                if job_name is None or data["job_name"] == job_name]

    def wait_for(self, job_name: str, condition: Callable[[JobObservation], bool]
                 ) -> JobObservation:
        found: list[JobObservation] = []

        def seen(published: list[dict[str, Any]]) -> bool:
            found[:] = [o for o in (JobObservation.from_data(d) for d in published)
                        if o.job_name == job_name and condition(o)]
            return bool(found)

        self.bus.wait_for(seen)
        return found[-1]

    def requests(self, method: str = "GET", *, watch: bool, resource: str = "") -> list[Any]:
        return [r for r in list(self.server.requests)
                if r.method == method and (r.query.get("watch") == "true") == watch
                and r.path.endswith(resource)]


def make_world(*, resync_seconds: float = RESYNC_SECONDS, watch_timeout_seconds: int = 290,
               **server_options: Any) -> World:
    clock = VirtualClock(utcnow())
    server = FakeKubeServer(clock=clock, **server_options).start()
    tokens = access_tokens(server, clock=clock, refresh_margin_seconds=300)
    edges = edge_clusters_for(server, tokens=tokens)
    edge = edges.for_cluster(edge_cluster_row())
    bus, sleeps, restarts = RecordingBus(), Sleeps(), []
    informer = EdgeInformer(
        edge, bus, clock=clock, sleep=sleeps, rng=random.Random(7),
        settings=InformerSettings(topic=TOPIC, resync_seconds=resync_seconds, jobsets=False,
                                  watch_timeout_seconds=watch_timeout_seconds,
                                  backoff=NO_JITTER),
        restarted=restarts.append)
    return World(server, clock, tokens, edges, edge, bus, sleeps, informer, threading.Event(),
                 restarts)


def close_world(world: World) -> None:
    world.stop.set()
    if world.thread is not None:
        world.thread.join(timeout=10)
        assert not world.thread.is_alive(), "the informer did not stop"
    world.edges.close()
    world.server.stop()


@pytest.fixture
def world() -> Iterator[World]:
    created = make_world()
    yield created
    close_world(created)


def submit(world: World, task_id: str, topology: str = "2x2", **options: Any) -> str:
    return world.edge.submit_job(falcon_manifest(task_id, topology, **options)).name


# --------------------------------------------------------------- what is published

def test_initial_list_publishes_falcons_jobs_with_their_pods(world: World) -> None:
    job = submit(world, "task-1")
    (pod,) = world.server.start_pods(job)
    world.edge.batch.create_namespaced_job(world.edge.namespace, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "not-ours", "labels": {"app": "other"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "busybox"}]}}},
    })
    world.start()

    seen = world.wait_for(job, lambda o: len(o.pods) == 1)

    assert (seen.cluster_name, seen.task_id, seen.completions) == ("edge-a", "task-1", 1)
    assert seen.pods[0].name == pod and seen.pods[0].phase == "Pending"
    assert seen.job_uid == world.server.get("jobs", job)["metadata"]["uid"]
    topic, _, key, attributes = world.bus.published[-1]
    assert (topic, key) == (TOPIC, seen.job_uid)
    assert attributes == {
        "cluster": "edge-a", "job": job, "job_uid": seen.job_uid, "task_id": "task-1",
        "resource_version": str(seen.resource_version),
        "kube_resource_version": str(max(
            int(world.server.get(kind, name)["metadata"]["resourceVersion"])
            for kind, name in (("jobs", job), ("pods", pod)))),
    }
    assert {o.job_name for o in world.observations()} == {job}


def test_a_job_from_start_to_success(world: World) -> None:
    world.start()
    job = submit(world, "task-2")
    world.server.add_node("gke-node-1", "falcon-task-2-2x2")
    (pod,) = world.server.start_pods(job)
    world.server.run_pod(pod, "gke-node-1")
    running = world.wait_for(job, lambda o: o.active == 1)
    world.server.finish_pod(pod, 0)
    done = world.wait_for(job, lambda o: o.condition == "Complete"
                          and [p.phase for p in o.pods] == ["Succeeded"])

    assert running.pods[0].phase == "Running"
    assert (done.active, done.succeeded, done.failed) == (0, 1, 0)
    assert done.pods[0].phase == "Succeeded" and done.pods[0].exit_code == 0
    versions = [o.resource_version for o in world.observations(job)]
    assert versions == sorted(set(versions))  # each view of the Job newer than the last


def test_pod_troubles_are_in_the_observation(world: World) -> None:
    world.start()
    job = submit(world, "task-3", "4x4")
    leader, second, third, _ = world.server.start_pods(job)
    world.server.unschedulable(leader, "0/3 nodes are available: 3 Insufficient "
                                       "google.com/tpu.")
    world.server.wait_container(second, "ErrImagePull", "image not found")
    world.server.finish_pod(third, 137, reason="OOMKilled")

    # The two watches deliver independently: wait for the view that has it all.
    seen = world.wait_for(job, lambda o: o.condition == "Failed" and [
        p.reason for p in o.pods][:3] == ["Unschedulable", "ErrImagePull", "OOMKilled"])

    by_name = {p.name: p for p in seen.pods}
    assert (by_name[leader].reason, by_name[leader].message) == (
        "Unschedulable", "0/3 nodes are available: 3 Insufficient google.com/tpu.")
    assert (by_name[second].reason, by_name[second].message) == ("ErrImagePull",
                                                                 "image not found")
    assert (by_name[third].phase, by_name[third].reason, by_name[third].exit_code) == (
        "Failed", "OOMKilled", 137)
    assert seen.failed == 1
    assert seen.pods[0].name == leader  # index order: the leader first


DENIED = ('Error creating: admission webhook "tpu-policy.example.com" denied the request: '
          "pods requesting google.com/tpu must carry a cost-center label")


def test_pods_refused_by_a_webhook_are_in_the_observation_until_pods_are_created(
        world: World) -> None:
    world.start()
    job = submit(world, "task-12")
    for _ in range(3):  # the Job controller's retries, aggregated by its event recorder
        world.server.record_event("Job", job, "FailedCreate", DENIED)
    world.server.record_event("Job", job, "SuccessfulDelete", "Deleted pod: x", event_type="Normal")

    refused = world.wait_for(job, lambda o: o.refusal is not None and o.refusal.count == 3)

    assert refused.refusal == CreateRefusal(DENIED, 3) and refused.pods == ()
    (event,) = world.server.names("events")[:1]
    assert world.server.get("events", event)["count"] == 3  # one event, counted
    world.clock.advance(5)  # the webhook lets the next create through
    (pod,) = world.server.start_pods(job)
    world.server.record_event("Job", job, "SuccessfulCreate", f"Created pod: {pod}",
                              event_type="Normal")
    cleared = world.wait_for(job, lambda o: o.refusal is None and len(o.pods) == 1)
    assert cleared.resource_version > refused.resource_version
    watched = world.requests(watch=True, resource="/events")
    assert watched and all(r.query["fieldSelector"] == "involvedObject.kind=Job"
                           for r in watched)


def test_a_refusal_lasts_while_no_pod_was_created_after_it() -> None:
    def event(reason: str, at: str, rv: int, message: str = DENIED,
              count: int = 1) -> dict[str, Any]:
        return {"reason": reason, "message": message, "count": count, "lastTimestamp": at,
                "metadata": {"resourceVersion": str(rv)}}

    created = event("SuccessfulCreate", "2026-11-01T09:00:05Z", 10, "Created pod: p-1")
    assert refusal_of([]) is None and refusal_of([created]) is None
    # Some pods created, then the quota ran out: the refusal is current.
    later = event("FailedCreate", "2026-11-01T09:00:07Z", 12, count=2)
    assert refusal_of([created, later]) == CreateRefusal(DENIED, 2)
    # Created after the refusal: it cleared; in the same second, the later write wins.
    assert refusal_of([later, event("SuccessfulCreate", "2026-11-01T09:00:09Z", 13)]) is None
    assert refusal_of([later, event("SuccessfulCreate", "2026-11-01T09:00:07Z", 14)]) is None
    assert refusal_of([event("SuccessfulCreate", "2026-11-01T09:00:07Z", 11), later]) == (
        CreateRefusal(DENIED, 2))
    # events.k8s.io-style timing (no lastTimestamp) reads the same way.
    series = {"reason": "FailedCreate", "message": DENIED, "count": 1,
              "series": {"lastObservedTime": "2026-11-01T09:01:00.000000Z"},
              "metadata": {"resourceVersion": "20"}}
    assert refusal_of([created, series]) == CreateRefusal(DENIED, 1)
    # Mixed precision: a microsecond later in the same second is later.
    precise = {**series, "series": {"lastObservedTime": "2026-11-01T09:00:05.250000Z"}}
    assert refusal_of([created, precise]) == CreateRefusal(DENIED, 1)


def test_a_deleted_job_is_forgotten(world: World) -> None:
    world.start()
    job = submit(world, "task-4")
    world.server.start_pods(job)
    world.wait_for(job, lambda o: len(o.pods) == 1)

    uid = world.edge.get_job(job).uid
    world.edge.delete_job(job)
    eventually(lambda: uid not in world.informer.views.job_uids(), "the deletion")
    count = len(world.observations(job))
    other = submit(world, "task-5")  # later changes: none of them about the deleted Job
    world.wait_for(other, lambda o: True)

    assert len(world.observations(job)) == count
    assert world.informer.views.job_uids() == [world.edge.get_job(other).uid]


# ------------------------------------------------------------ reconnect and relist

def test_a_dropped_watch_reconnects_with_backoff_and_resumes(world: World) -> None:
    world.start()
    job = submit(world, "task-6")
    world.wait_for(job, lambda o: True)
    world.sleeps.meanwhile.append(lambda: world.server.start_pods(job))

    world.server.drop_watches()
    world.wait_for(job, lambda o: len(o.pods) == 1)  # changed while disconnected: not missed

    eventually(lambda: world.server.open_watches() == 3, "the three watches back")
    assert world.sleeps.delays == [1.0, 1.0, 1.0]
    assert len(world.requests(watch=False)) == 3  # resumed, not listed again
    resumed = world.requests(watch=True)[3:]
    assert resumed and all(r.query["resourceVersion"] not in ("", "0") for r in resumed)


def test_failing_reconnects_back_off_exponentially_then_reset(world: World) -> None:
    world.start()
    world.server.inject("GET", r"/pods$", 503, times=3, watch=True)

    world.server.drop_watches()
    eventually(lambda: world.server.open_watches() == 3 and len(world.sleeps.delays) == 6,
               "the pod watch to come back after the drop and three refusals")
    assert sorted(world.sleeps.delays) == [1.0, 1.0, 1.0, 2.0, 4.0, 8.0]
    assert world.restarts == ["error"] * 6

    world.clock.advance(121)  # two quiet minutes: the next failure starts over
    world.server.drop_watches()
    eventually(lambda: len(world.sleeps.delays) == 9, "the second drop's backoff")
    assert world.sleeps.delays[6:] == [1.0, 1.0, 1.0]


def test_410_gone_on_resume_lists_again(world: World) -> None:
    world.start()
    job = submit(world, "task-7")
    world.wait_for(job, lambda o: True)

    def meanwhile() -> None:
        world.server.start_pods(job)
        world.server.compact(expire_open_watches=False)

    world.sleeps.meanwhile.append(meanwhile)
    world.server.drop_watches()
    world.wait_for(job, lambda o: len(o.pods) == 1)

    eventually(lambda: world.informer.stats.gone >= 1, "a 410 Gone")
    assert len(world.requests(watch=False)) > 3  # listed again


def test_410_on_an_open_watch_lists_again_at_once(world: World) -> None:
    world.start()
    job = submit(world, "task-8")
    world.wait_for(job, lambda o: True)

    world.server.compact()
    eventually(lambda: world.informer.stats.gone == 3 and world.server.open_watches() == 3,
               "the three watches to list again and resume")

    assert world.sleeps.delays == []
    assert world.restarts == ["gone", "gone", "gone"]
    assert len(world.requests(watch=False)) == 6
    world.server.start_pods(job)
    world.wait_for(job, lambda o: len(o.pods) == 1)


def test_resync_lists_again_and_republishes_every_job(world: World) -> None:
    world.start()
    job = submit(world, "task-9")
    last = world.wait_for(job, lambda o: True)
    published = len(world.bus.published)

    world.clock.advance(RESYNC_SECONDS + 1)  # the server ends the watches on its timeout
    eventually(lambda: world.informer.stats.resyncs == 3, "the three resyncs")
    eventually(lambda: len(world.bus.published) > published, "the republish")

    again = world.observations(job)[-1]
    assert again.resource_version == last.resource_version  # the same view, a duplicate
    assert dataclasses.replace(again, observed_at=last.observed_at) == last
    assert len(world.requests(watch=False)) == 6


def test_a_failed_publish_is_repeated_at_the_resync(world: World) -> None:
    job = submit(world, "task-10")
    world.bus.refuse_next = 1
    world.start()
    eventually(lambda: world.informer.stats.publish_failures == 1, "the refused publish")
    assert world.observations(job) == []

    world.clock.advance(RESYNC_SECONDS + 1)
    seen = world.wait_for(job, lambda o: True)

    assert seen.task_id == "task-10"


# ----------------------------------------------------------------------- the token

def test_a_watch_outlives_its_token() -> None:
    """Tokens live 600 s here and the server ends a watch when the token that opened it
    expires; the informer resumes with a token refreshed before expiry, no 401 ever."""
    world = make_world(token_lifetime_seconds=600, end_watch_at_token_expiry=True,
                       resync_seconds=3600, watch_timeout_seconds=3000)
    try:
        world.start()
        job = submit(world, "task-11")
        world.wait_for(job, lambda o: True)
        first_watches = len(world.requests(watch=True))

        world.clock.advance(400)  # 200 s left: inside the refresh margin, still valid
        world.server.start_pods(job)
        world.wait_for(job, lambda o: len(o.pods) == 1)
        world.clock.advance(250)  # expired: the server ends the three watches
        eventually(lambda: len(world.requests(watch=True)) >= first_watches + 3
                   and world.server.open_watches() == 3, "the watches to resume")
        world.server.start_pods(job, 1)
        world.wait_for(job, lambda o: len(o.pods) == 2)

        assert world.server.watch_endings.count("token-expired") == 3
        assert not [r for r in world.server.requests if r.status == 401]
        assert world.tokens.refreshes == 2
        assert len(world.server.tokens_used("/apis/")) == 2
        assert world.sleeps.delays == []  # a normal resume: no backoff
    finally:
        close_world(world)


# -------------------------------------------------------------- versions (the cache)

COMPLETE = [{"type": "Complete", "status": "True"}]
FAILED = [{"type": "Failed", "status": "True"}]


def _job(rv: int, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "falcon-t", "uid": "job-1", "resourceVersion": str(rv),
                         "annotations": {TASK_ID_ANNOTATION: "t"}},
            "spec": {"completions": 1}, "status": status}


def _pod(rv: int, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "falcon-t-0-abcde", "uid": "pod-1", "resourceVersion": str(rv),
                         "ownerReferences": [{"kind": "Job", "uid": "job-1", "controller": True}]},
            "status": {"phase": phase}}


def test_a_job_update_ahead_of_its_pods_is_held_until_they_arrive_with_a_newer_version() -> None:
    clock = VirtualClock(utcnow())
    views = JobViews("edge-a", clock)
    views.replace(PODS, [_pod(101, "Pending")], 101)
    views.replace(JOBS, [_job(100)], 102)
    first = views.observe("job-1")
    assert first is not None and first.pods[0].phase == "Pending"
    views.published("job-1", first.resource_version)

    # The job controller's update (rv 111) arrives before the pod event that caused it:
    # "succeeded: 1" with a pod still Pending would be a torn view, so it is held.
    views.apply(JOBS, "MODIFIED", _job(111, succeeded=1, conditions=COMPLETE))
    assert views.observe("job-1") is None
    assert views.apply(PODS, "MODIFIED", _pod(110, "Succeeded")) == ["job-1"]
    fresh = views.observe("job-1")
    assert views.apply(PODS, "MODIFIED", _pod(110, "Succeeded")) == []  # replayed: nothing new

    assert fresh is not None and fresh.pods[0].phase == "Succeeded" and fresh.succeeded == 1
    assert first.resource_version < fresh.resource_version
    views.published("job-1", fresh.resource_version)
    assert views.observe("job-1") is None
    assert views.observe("job-1", republish=True) == dataclasses.replace(
        fresh, observed_at=clock.now())

    # A restarted informer (fresh lists) outranks whatever the last process published.
    restarted = JobViews("edge-a", clock)
    restarted.replace(JOBS, [_job(111, succeeded=1, conditions=COMPLETE)], 112)
    restarted.replace(PODS, [_pod(110, "Succeeded")], 112)
    again = restarted.observe("job-1")
    assert again is not None and again.resource_version > fresh.resource_version


def test_a_held_job_is_published_once_the_pods_watch_passes_it_without_its_pod() -> None:
    """Its pod was deleted before the pods watch saw it finish: once the watch has
    delivered everything up to the Job's resourceVersion (here a bookmark), the Job's
    own counts are all there is, and it is published."""
    views = JobViews("edge-a", VirtualClock(utcnow()))
    views.replace(PODS, [_pod(101, "Running")], 101)
    views.replace(JOBS, [_job(100)], 102)
    views.apply(JOBS, "MODIFIED", _job(120, failed=1, conditions=FAILED))
    assert views.observe("job-1") is None
    assert views.advance(PODS, 119) == []
    assert views.advance(PODS, 125) == ["job-1"]
    published = views.observe("job-1")
    assert published is not None and published.failed == 1
    assert published.pods[0].phase == "Running"


# --------------------------------------------------------------- the CLI entry point

def test_run_informer_stops_promptly_and_reports(kube_server: FakeKubeServer) -> None:
    edges = edge_clusters_for(kube_server)
    stop, bus = threading.Event(), RecordingBus()
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(run_informer(
        edge_cluster_row(), edges, bus, stop, settings=InformerSettings(topic=TOPIC))))
    runner.start()
    kube_server.wait_for_watches(5)  # Jobs, pods, events, JobSets, events on JobSets

    stop.set()
    runner.join(timeout=5)

    assert not runner.is_alive()
    (stats,) = result
    assert (stats.lists, stats.watches) == (5, 5)
    edges.close()


def test_end_to_end_onto_the_pubsub_emulator(pubsub_bus: PubSubBus) -> None:
    topic, subscription = unique_name("edge-events"), unique_name("controller")
    pubsub_bus.create_topic(topic)
    pubsub_bus.create_subscription(subscription, topic, message_ordering=False)
    world = make_world()
    world.informer = EdgeInformer(world.edge, pubsub_bus, clock=world.clock, sleep=world.sleeps,
                                  settings=InformerSettings(topic=topic))
    try:
        world.start()
        job = submit(world, "task-12")
        world.server.add_node("gke-node-12", "falcon-task-12-2x2")
        (pod,) = world.server.start_pods(job)
        world.server.run_pod(pod, "gke-node-12")
        world.server.finish_pod(pod, 0)

        latest: dict[str, JobObservation] = {}
        deadline = time.monotonic() + 20
        while not any(o.condition == "Complete" and [p.phase for p in o.pods] == ["Succeeded"]
                      for o in latest.values()):
            assert time.monotonic() < deadline, f"no Complete observation: {latest}"
            messages = pubsub_bus.pull(subscription)
            for message in messages:
                observation = JobObservation.from_data(message.data)
                assert message.attributes["resource_version"] == str(
                    observation.resource_version)
                current = latest.get(observation.job_uid)
                if current is None or observation.resource_version > current.resource_version:
                    latest[observation.job_uid] = observation
            pubsub_bus.ack(subscription, [m.id for m in messages])

        (final,) = latest.values()
        assert (final.job_name, final.succeeded, final.pods[0].phase) == (job, 1, "Succeeded")
    finally:
        close_world(world)


def test_a_terminated_container_reports_when_it_finished() -> None:
    """``finishedAt`` travels with the pod, so the controller can blame the pod of a
    slice that failed first."""
    from falcon_es.adapters.gcp.job_observations import pod_observation

    pod = {"metadata": {"name": "falcon-t1-1-abcde"}, "status": {
        "phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {
            "exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-01T09:20:01Z"}}}]}}

    observed = pod_observation(pod)

    assert (observed.reason, observed.exit_code, observed.finished_at) == (
        "OOMKilled", 137, "2026-11-01T09:20:01Z")
