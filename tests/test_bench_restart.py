"""``falcon-es bench restart``: the history it writes is what a controller writes (a
replay finds the job table consistent with it, and none of it is live), a controller
on it folds the live tasks only, and the benchmark reports both cases."""

from __future__ import annotations

import sqlalchemy as sa
from click.testing import CliRunner

from falcon_es.storage import db
from falcon_es.bench import restart
from falcon_es.app.application import open_app
from falcon_es.cli import main
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable, live_streams

#: The job table under Falcon-ES's own names (what the tests create).
job = JobTable().table
from falcon_es.projections import replay


def test_the_history_is_consistent_and_only_the_live_tasks_are_folded(db_url: str) -> None:
    written = restart.populate(db_url, history=300, live=40)
    assert written["history_tasks"] == 300
    app = open_app(Settings(db_url=db_url))
    try:
        assert replay.verify(app.engine, app.store, "en", job=app.job) == []
        with app.engine.connect() as conn:
            live = set(conn.execute(sa.select(live_streams.c.stream_id)).scalars())
            statuses = dict(conn.execute(
                sa.select(job.c.status, sa.func.count()).group_by(job.c.status)).all())
    finally:
        app.close()
    assert live == {f"live-{n:05d}" for n in range(40)}
    assert statuses["Succeeded"] > statuses["Failed"] > 0 and statuses["Aborted"] > 0
    assert statuses["Pending"] + statuses["Running"] == 40
    measured = restart.measure(db_url)
    assert measured["tasks_in_memory"] == 40
    assert measured["first_tick_seconds"] > measured["fold_seconds"] > 0


def test_the_benchmark_reports_both_cases_as_ratios() -> None:
    report = restart.restart_benchmark(Settings(), history=200, live=20, rounds=1)
    assert report["written"]["with"]["history_tasks"] == 200
    assert report["written"]["without"]["history_tasks"] == 0
    # The same live work in both cases, whatever the first tick does with it (its
    # acquiring tasks started hours ago: they time out and, their pools gone, leave).
    in_memory = {case: report["best"][case]["tasks_in_memory"] for case in ("with", "without")}
    assert in_memory["with"] == in_memory["without"] and 0 < in_memory["with"] <= 20
    assert report["first_tick_ratio"] > 0 and report["peak_rss_ratio"] > 0
    assert "ratios (with / without)" in restart.format_report(report)


def test_the_command_refuses_a_negative_history() -> None:
    result = CliRunner().invoke(main, ["bench", "restart", "--history", "-1"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
