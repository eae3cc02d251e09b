"""The scheduler benchmark runs end to end (tiny sizes; the figures are not asserted)."""

from __future__ import annotations

import dataclasses

from click.testing import CliRunner

from falcon_es.bench import scheduler as bench
from falcon_es.cli import main
from falcon_es.handlers import intake, scheduling

HANDLERS = (intake.accept_new_rows, scheduling.requeue_from_inactive_clusters,
            scheduling.choose_clusters, scheduling.fill_free_slots)


def test_benchmark_reports_every_figure() -> None:
    report = bench.scheduler_benchmark(HANDLERS, sizes=(100, 200))
    assert [r["waiting"] for r in report["sizes"]] == [100, 200]
    for size in report["sizes"]:
        assert size["tick_picks"] == bench.CLUSTERS * len(bench.TOPOLOGIES)
        assert size["pick_us"] > 0 and size["refresh_rows"] > 0
        assert size["raw_rows_per_s"] > 0 and size["refresh_ratio"] > 0
    assert set(report["targets"]) == {"pick_us_at_largest <= 1000",
                                      "decision growth <= log n growth", "refresh_ratio >= 0.5",
                                      "no position Message older than the interval"}
    assert report["targets"]["no position Message older than the interval"]
    assert report["decide_growth"] > 0 and report["pick_growth"] > 0
    assert "growth 100 -> 200: decision x" in bench.format_report(report)


def test_steady_picking_respects_the_refresh_interval() -> None:
    """Two intervals of picking: each row is rewritten once per interval at the moment
    of its slice (the rows read back change 30 s apart, never sooner), no sampled Message is ever older than
    the interval, and far fewer rows are written per pick than a queue holds."""
    report = bench.scheduler_benchmark(HANDLERS, sizes=(400,))
    (size,) = report["sizes"]
    steady = size["steady"]
    assert steady["interval_seconds"] == 30
    assert steady["picks"] > 0 and steady["sampled"] > 0
    assert 0 < steady["max_age_seconds"] <= 30
    assert steady["min_change_gap_seconds"] == 30
    # The rewrite is spread over the interval a slice at a time, never one big tick.
    assert steady["refresh_ticks"] > 2 * 10
    assert steady["refresh_tick_rows_max"] < size["refresh_rows"]
    assert steady["tick_ms_max"] >= steady["tick_ms_p99"] >= steady["tick_ms_median"] > 0
    assert 0 <= steady["slowest_tick_rows"] <= steady["refresh_tick_rows_max"]
    assert size["rows_per_pick"] < size["refresh_rows"] / 2


def test_cli_rejects_bad_sizes() -> None:
    result = CliRunner().invoke(main, ["bench", "scheduler", "--sizes", "ten"])
    assert result.exit_code == 2
    assert "--sizes 'ten': expected whole numbers" in result.output


def test_benchmark_runs_in_scratch_databases_on_mariadb() -> None:
    from tests.conftest import MYSQL_SERVER

    report = bench.scheduler_benchmark(HANDLERS, sizes=(100, 200), server=MYSQL_SERVER)
    assert report["backend"] == "mysql"
    assert all(size["raw_rows_per_s"] > 0 for size in report["sizes"])


def test_the_tick_target_is_on_the_slowest_tick() -> None:
    """A median well within the target does not meet it when one tick is over."""
    steady = bench.SteadyReport(
        interval_seconds=30, pick_every_seconds=1, picks=20, position_rows=10,
        pick_tick_ms_median=5, pick_tick_ms_max=5, pick_ticks=1, refresh_tick_ms_max=5,
        refresh_ticks=1, refresh_tick_rows_max=10, tick_ms_median=5, tick_ms_p99=5,
        tick_ms_max=bench.TICK_TARGET_MS + 1, slowest_tick_rows=0, max_age_seconds=0,
        min_change_gap_seconds=None, sampled=1)
    assert not steady.tick_target_met()
    assert dataclasses.replace(steady, tick_ms_max=bench.TICK_TARGET_MS).tick_target_met()


def test_the_p99_is_the_nearest_rank() -> None:
    ticks = [float(n) for n in range(1, 201)]  # 1 .. 200 ms
    assert bench._percentile(ticks, 0.99) == 198.0
    assert bench._percentile([], 0.99) == 0.0
    assert bench._percentile([7.0], 0.99) == 7.0
