"""The timeline page: its model folded from a log (the demo's, and small logs written
here), and the page parsed for the bars it must hold. The browser's view of it is
tests/test_timeline_browser.py."""

from __future__ import annotations

import datetime as dt
import html.parser
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from falcon_es.app.demo import DEMO_START, run_demo
from falcon_es.cli import EXIT_PROBLEM, main
from falcon_es.domain import events as ev
from falcon_es.domain.clock import WallClock
from falcon_es.projections.timeline import HELD, IDLE, PROVISIONING, Page, Window, build
from falcon_es.projections.timeline_page import render
from falcon_es.storage import db
from falcon_es.storage.store import EventStore, RecordedEvent
from tests.support.harness import reserved_cluster
from tests.test_cli import one_line_failure
from tests.test_lifecycle import Make, make  # noqa: F401 (the fixture)

T0 = dt.datetime(2026, 3, 1, 8, 0)


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    run_demo(path, echo=lambda _line: None)
    return f"sqlite:///{path}"


def demo_page(db_url: str, window: Window = Window()) -> Page:
    return build(EventStore(db.make_engine(db_url), WallClock()).read_after(0), window)


class Elements(html.parser.HTMLParser):
    """Every element's tag and attributes, and whether anything asks the network."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def with_class(self, name: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.found if name in (a.get("class") or "").split()]


def parsed(text: str) -> Elements:
    elements = Elements()
    elements.feed(text)
    return elements


def record(seq: int, task: str, event: ev.Event, minutes: float) -> RecordedEvent:
    return RecordedEvent(seq, task, seq, event, {}, T0 + dt.timedelta(minutes=minutes))


def accepted(name: str, actor: str) -> ev.TaskAccepted:
    return ev.TaskAccepted(name, actor, {"image": "i", "tpu_type": "v6e", "topology": "2x2"},
                           "v6e", "2x2", T0)


def chosen() -> ev.ClusterChosen:
    return ev.ClusterChosen("c1", "gke-a", "2x2", "only-candidate", ())


def handover_log() -> Sequence[RecordedEvent]:
    """a creates pool p (ready at 8), runs 10..30 and retains it for b; b takes it at 40,
    runs 41..50 and fails; the pool is deleted at 55: provisioning, held by a, idle,
    held by b, idle (its delete)."""
    create = ev.NodePoolCreateRequested("p", "reservation", "ct6e-standard-4t", 1, "r", 600)
    steps: list[tuple[str, ev.Event, float]] = [
        ("a", accepted("first", "alice"), 0), ("a", chosen(), 0),
        ("b", accepted("second", "bob"), 1), ("b", chosen(), 1),
        ("a", ev.TaskPicked("c1", "2x2", "fifo", (), None), 1), ("a", create, 1),
        ("a", ev.NodePoolCreateStarted("p", "op-1"), 1), ("a", ev.NodePoolReady("p", 1), 8),
        ("a", ev.JobSubmitRequested("job-a", "p"), 8), ("a", ev.JobSubmitted("job-a", "u1"), 8),
        ("a", ev.PodsRunning(1, 1), 10), ("a", ev.JobSucceeded(1), 30),
        ("a", ev.NodePoolRetained("p", "b"), 30),
        ("b", ev.TaskPicked("c1", "2x2", "fifo", (), "alice"), 40),
        ("b", ev.NodePoolReused("p", "a", "reservation"), 40),
        ("b", ev.JobSubmitRequested("job-b", "p"), 40), ("b", ev.JobSubmitted("job-b", "u2"), 40),
        ("b", ev.PodsRunning(1, 1), 41), ("b", ev.JobFailed("exit code 1", 1), 50),
        ("b", ev.NodePoolDeleteRequested("p"), 50), ("b", ev.NodePoolDeleted("p"), 55),
    ]
    return [record(seq, task, event, minutes)
            for seq, (task, event, minutes) in enumerate(steps, start=1)]


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def test_a_pool_is_cut_into_who_held_it_when() -> None:
    page = build(handover_log())
    (bar,) = page.clusters["gke-a"]
    assert (bar.name, bar.supply_mode, bar.start, bar.end, bar.deleted) == (
        "p", "reservation", at(1), at(55), True)
    assert [(s.kind, s.task_id, s.start, s.end) for s in bar.segments] == [
        (PROVISIONING, "a", at(1), at(8)), (HELD, "a", at(8), at(30)), (IDLE, None, at(30), at(40)),
        (HELD, "b", at(40), at(50)), (IDLE, None, at(50), at(55))]
    assert bar.handovers == ((at(40), "a", "b"),)
    rows = {t.task_id: t for t in page.tasks}
    assert (rows["a"].started, rows["a"].ended, rows["a"].outcome) == (at(10), at(30), "Succeeded")
    assert (rows["b"].actor, rows["b"].started, rows["b"].outcome) == (
        "bob", at(41), "Failed/JobFailed")
    assert rows["b"].wait_seconds(at(60)) == 41 * 60  # submitted at T0


def test_a_window_clips_and_a_cluster_filters() -> None:
    page = build(handover_log(), Window(since=at(20), until=at(45)))
    (bar,) = page.clusters["gke-a"]
    assert [(s.kind, s.start, s.end) for s in bar.segments] == [
        (HELD, at(20), at(30)), (IDLE, at(30), at(40)), (HELD, at(40), at(45))]
    assert (page.start, page.end) == (at(20), at(45))
    assert build(handover_log(), Window(cluster="gke-b")).pools == []
    assert build(handover_log(), Window(until=at(0.5))).pools == []  # before the create


def test_a_pool_not_deleted_runs_to_the_end() -> None:
    log = [r for r in handover_log() if not isinstance(r.event, ev.NodePoolDeleted)]
    (bar,) = build(log, now=at(70)).clusters["gke-a"]
    assert (bar.end, bar.deleted, bar.segments[-1].kind, bar.segments[-1].end) == (
        at(70), False, IDLE, at(70))


def test_the_demo_page_holds_every_pool_and_task(demo_db: str) -> None:
    page = demo_page(demo_db)
    assert sorted(page.clusters) == ["v6e-reserved", "v7x-flex", "v7x-reserved"]
    assert len(page.pools) == 10  # the demo's summary: 10 created, 1 handed over
    assert len(page.tasks) == 11  # t06 was rejected: it never waited
    handed = [b for b in page.pools if b.handovers]
    assert [(b.name, [(h[1], h[2]) for h in b.handovers]) for b in handed] == [
        ("falcon-t07-4x4", [("t07", "t08")])]
    assert [s.task_id for s in handed[0].segments if s.kind == HELD] == ["t07", "t08"]
    assert all(b.deleted for b in page.pools)
    modes = {b.name: b.supply_mode for b in page.pools}
    assert modes["falcon-t01-2x2x1"] == "flex-start" and modes["falcon-t02-2x2"] == "reservation"
    elements = parsed(render(page))
    pools = elements.with_class("pool")
    assert sorted(p["data-pool"] or "" for p in pools) == sorted(b.name for b in page.pools)
    assert len(elements.with_class("task")) == 11
    assert len(elements.with_class("handover")) == 1
    held = elements.with_class("held")
    assert len(held) == sum(1 for b in page.pools for s in b.segments if s.kind == HELD)
    assert {p["data-mode"] for p in pools} == {"reservation", "flex-start"}
    assert not [a for _, a in elements.found if a.get("src") or
                (a.get("href") or "").startswith("http")], "the page must need no network"


def test_the_page_says_who_held_it_on_hover(demo_db: str) -> None:
    text = render(demo_page(demo_db))
    assert "falcon-t07-4x4: held by t08 train-4x4-b (actor bob, Succeeded)" in text
    assert "t03 oom-v6e (actor carol, Failed/JobFailed) on v6e-reserved/2x2" in text
    assert "hand-over 2026-01-05 09:39:40: t07 to t08" in text


def test_a_pool_passed_along_three_tasks_on_each_dialect(make: Make, db_url: str,
                                                        tmp_path: Path) -> None:
    """The log of a real run (SQLite and MariaDB), read back by ``falcon-es timeline``:
    one pool held by a, b and c in turn, two hand-overs."""
    h = make(reserved_cluster(count=1))
    for name in ("a", "b", "c"):
        h.submit(name, sim={"duration_seconds": 120})
    h.run()
    out = tmp_path / "three.html"
    result = CliRunner().invoke(main, ["--db", db_url, "timeline", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = build(h.app.store.read_after(0))
    (bar,) = page.pools
    assert [s.task_id for s in bar.segments if s.kind == HELD] == ["a", "b", "c"]
    assert [(h_[1], h_[2]) for h_ in bar.handovers] == [("a", "b"), ("b", "c")]
    elements = parsed(out.read_text())
    assert [p["data-pool"] for p in elements.with_class("pool")] == ["falcon-a-2x2"]
    assert len(elements.with_class("handover")) == 2 and len(elements.with_class("task")) == 3


def test_timeline_command_writes_the_page(demo_db: str, tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    result = CliRunner().invoke(main, ["--db", demo_db, "timeline", "-o", str(out),
                                       "--cluster", "v7x-flex",
                                       "--since", (DEMO_START + dt.timedelta(minutes=5)).isoformat()])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{out}: 2 node pool(s) on 1 cluster(s), 2 task(s)"
    elements = parsed(out.read_text())
    assert {p["data-cluster"] for p in elements.with_class("pool")} == {"v7x-flex"}
    one_line_failure(CliRunner().invoke(main, ["--db", demo_db, "timeline", "-o", str(out),
                                               "--cluster", "nope"]),
                     EXIT_PROBLEM, "--cluster nope: no node pool or task")
    one_line_failure(CliRunner().invoke(main, ["--db", demo_db, "timeline", "-o", str(out),
                                               "--since", "later"]), 2, "--since 'later'")


def test_simulate_html_adds_the_waits_per_actor_and_queue(tmp_path: Path) -> None:
    out = tmp_path / "sim.html"
    result = CliRunner().invoke(main, ["simulate", "--tasks", "12", "--html", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    elements = parsed(text)
    assert len(elements.with_class("task")) == 12
    assert elements.with_class("pool")
    assert "Wait to Running (s) per actor" in text and "per queue (cluster/topology)" in text
    assert len(elements.with_class("dist")) >= 2
