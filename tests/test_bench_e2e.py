"""The end-to-end lifecycle benchmark at a few hundred tasks, on SQLite and MariaDB:
the report has its figures and every task ended. Not a timed test (the figures of a
10,000-task run are the benchmark's own business)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.conftest import MYSQL_SERVER
from falcon_es.domain import chart
from falcon_es.bench import e2e
from falcon_es.cli import main

TASKS = 300
#: Small bursts close together keep the run to a few virtual hours and a few seconds.
SMALL_RUN = {"burst": 100, "burst_every": 120.0}
FIGURES = ("wall_seconds", "tasks_per_second", "cpu_seconds", "ticks", "events",
           "ms_per_tick", "statements", "commits", "rollbacks", "round_trips",
           "round_trips_per_task", "peak_rss_mib", "rss_growth_mib", "virtual_hours",
           "position_rows")


@pytest.fixture(params=["sqlite", "mysql"])
def server(request: pytest.FixtureRequest) -> str | None:
    """Where the bench makes its scratch database: a temporary SQLite file (None) or
    a new database on the MariaDB server (dropped afterwards)."""
    return None if request.param == "sqlite" else MYSQL_SERVER


def test_every_task_ends_and_the_report_has_its_figures(server: str | None) -> None:
    report = e2e.e2e_benchmark(tasks=TASKS, db_url=server, seed=3, **SMALL_RUN)

    assert report["backend"] == ("sqlite" if server is None else "mysql")
    assert report["tasks"] == TASKS and report["bursts"] == 3
    assert report["all_terminal"] is True
    final = report["final"]
    assert sum(final.values()) == TASKS
    assert {key.split("/")[0] for key in final} <= chart.TERMINAL_STATUSES
    # The seeded plan makes every kind of ending: success, Job failures, timeouts,
    # invalid specs and aborts.
    assert final["Succeeded"] > TASKS // 2
    assert {"Failed/JobFailed", "Failed/Timeout", "Failed/InvalidTopology", "Aborted"} <= set(final)
    multi_slice = report["multi_slice"]  # two pools and a JobSet each, some restarting
    assert multi_slice.get("Succeeded", 0) > 0 and sum(multi_slice.values()) < TASKS
    for figure in FIGURES:
        assert isinstance(report[figure], (int, float)) and report[figure] >= 0, figure
    assert report["ticks"] > 0 and report["events"] >= 4 * TASKS
    assert report["round_trips"] >= report["statements"] + report["commits"] > 0
    # Every round trip is put down to a site: the handlers and projections by name, the
    # log's own append, the job table's poll.
    sites = report["round_trips_per_task_by_site"]
    assert sum(sites.values()) == pytest.approx(report["round_trips_per_task"], abs=0.01 * len(sites))
    # MySQL/MariaDB carry the append's writes in one batch: the projections' statements
    # are reported as carried there (SQLite sends each alone).
    # So is the append's COMMIT, the batch's last statement.
    carried = report["batched_statements_per_task_by_site"]
    if report["backend"] == "sqlite":
        assert "projection JobTableProjection" in sites and not carried
        assert "storage.store:EventStore._write (commit)" in sites
    else:
        assert "projection JobTableProjection" in carried and "storage.batched:flush" in sites
        assert "storage.store:EventStore._write (commit)" in carried
        assert not {"projection JobTableProjection", "storage.store:EventStore._write (commit)"} & set(sites)
    assert any(site.startswith("handler intake.") for site in sites)
    # Only MySQL connections are pinged, and only after sitting idle (none does here).
    assert report["pool_pings"] == 0 and report["pool_checkouts"] > 0
    assert report["target"]["met"] is None, "the 60 s target is judged at 10,000 tasks only"
    lines = e2e.format_report(report).splitlines()
    assert lines[0].startswith(f"e2e lifecycle bench on {report['backend']}: {TASKS} tasks")
    assert lines[-1].startswith("final: ")
    assert report["eta_relative_error"] is None, "measured on request only"


def test_the_bench_measures_the_expected_starts_on_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    result = CliRunner().invoke(main, ["bench", "e2e", "--tasks", "120", "--db", url,
                                       "--burst", "60", "--burst-every", "60", "--eta"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    heading = next(i for i, line in enumerate(lines)
                   if line.startswith("expected start vs pick, relative error ("))
    assert lines[heading + 1].lstrip().startswith("at submit         median ")
    assert lines[heading + 2].lstrip().startswith("at every refresh  median ")
    report = e2e.e2e_benchmark(tasks=120, seed=1, eta=True, burst=60, burst_every=60.0)
    eta = report["eta_relative_error"]
    # The bursts fill queues faster than slots pass: most tasks wait and are told when.
    assert eta["tasks_picked"] == 120 - report["final"].get("Failed/InvalidTopology", 0)
    assert 60 <= eta["tasks_with_estimate"] <= eta["tasks_picked"]
    assert eta["at_every_refresh"]["count"] > eta["at_submit"]["count"]
    assert 0 <= eta["at_submit"]["median"] <= eta["at_submit"]["p90"]


def test_the_scratch_mysql_database_is_dropped_afterwards() -> None:
    admin = sa.create_engine(MYSQL_SERVER + "/")
    try:
        def scratch() -> set[str]:
            # This process's scratch databases only: another process's bench on the
            # same server comes and goes on its own.
            with admin.connect() as conn:
                return {name for (name,) in conn.exec_driver_sql("SHOW DATABASES")
                        if name.startswith(f"falcon_e2e_{os.getpid()}_")}

        before = scratch()
        e2e.e2e_benchmark(tasks=20, db_url=MYSQL_SERVER, **SMALL_RUN)
        assert scratch() == before
    finally:
        admin.dispose()


def test_cli_runs_the_bench_and_prints_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    result = CliRunner().invoke(main, ["bench", "e2e", "--tasks", "40", "--db", url,
                                       "--burst", "20", "--burst-every", "60", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == 40 and sum(report["final"].values()) == 40
    assert report["resolution_seconds"] == e2e.DEFAULT_RESOLUTION


def test_cli_refuses_a_database_file_that_is_not_fresh(tmp_path: Path) -> None:
    used = tmp_path / "used.db"
    used.write_bytes(b"")
    result = CliRunner().invoke(main, ["bench", "e2e", "--tasks", "10",
                                       "--db", f"sqlite:///{used}"])
    assert result.exit_code == 2
    assert "the file exists; the benchmark needs a fresh one" in result.output


def test_the_same_seed_plans_the_same_tasks() -> None:
    first, again = e2e.plan_tasks(200, 5), e2e.plan_tasks(200, 5)
    assert first == again
    assert first != e2e.plan_tasks(200, 6)
    assert {p.kind for p in first} == {kind for kind, _ in e2e.KINDS}
