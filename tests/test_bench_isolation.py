"""One sick cluster: the gcp backend over the fake servers with one edge cluster's
Kubernetes API hung (it reads each request and never answers).

The healthy cluster's tasks reach Running about as fast as with every API answering,
ticks stay short, and the sick cluster's tasks say which API does not answer, first;
``/healthz`` stays 200 and names it, and the metrics show it. Run small and on the wall
clock: the call deadlines are real (1 s here), as the gcp backend's are.
"""

from __future__ import annotations

import datetime as dt
from http import HTTPStatus

from falcon_es.app.service import report_cluster_apis
from falcon_es.bench import isolation
from falcon_es.domain.clusters import Cluster
from falcon_es.engine.cluster_calls import ApiHealth
from falcon_es.observability.health import HealthServer
from falcon_es.observability.metrics import Metrics
from tests.fakes.sim_backed import SimBackedCloud

SILENT = "edge cluster edge-b's Kubernetes API has not answered since "


def test_a_hung_cluster_api_neither_slows_the_healthy_cluster_nor_the_ticks() -> None:
    report = isolation.isolation_benchmark(lambda world: SimBackedCloud(world).start(),
                                           tasks=2, deadline_seconds=1.0, limit_seconds=30)
    assert report["baseline"]["healthy_to_running_seconds"] is not None
    assert report["sick"]["healthy_to_running_seconds"] is not None, "edge-a never ran"
    assert report["to_running_ratio"] <= isolation.MAX_RATIO, isolation.format_report(report)
    assert report["tick_p99_seconds"] <= isolation.MAX_TICK_P99_SECONDS
    assert report["sick"]["tick_max_seconds"] < 1.0  # no tick waited for a deadline
    messages = report["sick_messages"]
    # The slot holder waits on the silent API; the task behind it waits for the slot.
    assert messages["edge-b-0"].startswith(SILENT), messages
    assert "Read timed out" in messages["edge-b-0"]
    assert messages["edge-b-1"].startswith("queued on edge-b")
    assert report["unanswered"] and report["unanswered"][0].startswith("edge-b kubernetes")
    assert report["unanswered_requests"] >= 1


def test_healthz_stays_live_and_names_the_silent_api_and_the_metrics_show_it() -> None:
    health, metrics = ApiHealth(), Metrics(process_collectors=False)
    since = dt.datetime(2026, 11, 1, 9, 0)
    sick = Cluster(id="c2", name="edge-b", project="proj", location="us-east5-b",
                   tpu_type="v5e", gcs_bucket="b", default_reservation=None, status="active", created_at=since)
    healthy = Cluster(id="c1", name="edge-a", project="proj", location="us-east5-b",
                      tpu_type="v6e", gcs_bucket="b", default_reservation=None, status="active", created_at=since)
    health.answered(healthy, "kubernetes", since)
    health.not_answered(sick, "kubernetes", since, "read timed out")
    server = HealthServer(max_tick_age=60.0)
    server.mark_tick()
    report_cluster_apis(health, "en", server, metrics)
    response = server.healthz()
    assert response.status == HTTPStatus.OK
    assert (f"{SILENT}2026-11-01 09:00 UTC: read timed out").encode() in response.body
    exposition = metrics.exposition().decode()
    assert 'falcon_cluster_api_unanswered{api="kubernetes",cluster="edge-b"} 1.0' in exposition
    assert 'falcon_cluster_api_unanswered{api="kubernetes",cluster="edge-a"} 0.0' in exposition
    assert 'falcon_cluster_api_last_answer_timestamp_seconds{api="kubernetes",cluster="edge-a"}' \
        in exposition
    health.answered(sick, "kubernetes", since + dt.timedelta(minutes=1))
    report_cluster_apis(health, "en", server, metrics)
    assert b"has not answered" not in server.healthz().body
    assert ('falcon_cluster_api_unanswered{api="kubernetes",cluster="edge-b"} 0.0'
            in metrics.exposition().decode())
