"""The edge-events subscription the status handler pulls is configurable
(FALCON_EDGE_EVENTS_SUBSCRIPTION) on the sim backend as on the gcp one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.jobtable import job_rows
from falcon_es.storage import registry
from falcon_es.app import service
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from tests.conftest import migrate

SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2",
        "sim": {"duration_seconds": 60}}


def test_a_renamed_subscription_still_receives_the_simulated_informers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'falcon.db'}"
    migrate(url)
    settings = Settings.from_env({"FALCON_DB_URL": url,
                                  "FALCON_EDGE_EVENTS_SUBSCRIPTION": "falcon-edge-events-ctl"})
    svc = build_service(open_app(settings, VirtualClock(dt.datetime(2026, 11, 1))), None,
                        RunOptions(seed=4))
    registry.add_cluster(svc.app.store, name="v6e-a", project="p", location="us-east5-b",
                         tpu_type="v6e", gcs_bucket="logs", default_reservation="v6e-a-r")
    try:
        job_rows.submit(svc.app.engine, task_id="s1", name="s1", actor="a", spec=SPEC,
                        now=dt.datetime(2026, 11, 1))
        report = svc.loop.run(until_idle=True, max_ticks=2000)
        row = job_rows.get_row(svc.app.engine, "s1")
    finally:
        svc.close()
    assert report.stopped_by == "idle"
    assert row["status"] == "Succeeded"
    assert svc.ports.bus.backlog("falcon-edge-events-ctl") == 0  # type: ignore[attr-defined]
