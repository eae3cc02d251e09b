"""Crash safety: every change to the world is recorded as an intent before it is made,
so a controller that takes over finishes what a killed one left open.

A full lifecycle -- a pool created for one task and its Job run to success, a second
task waiting for reservation capacity (ClusterBusy) that takes the pool over, then is
aborted while running (its Job deleted, the pool deleted) -- is run once without a
crash to learn its steps. Then, for every step, a fresh run stops the controller
there: after each handler that decided something (before its tick commits), after
each commit (before its effects), and before and after each state-changing call to
GKE, Kubernetes or Pub/Sub. A new controller (new App, same database, same simulated
world) takes over, and the test shows every task still ends as in the crash-free run,
with no pool or Job created twice and no pool left behind.

A multi-slice lifecycle does the same for hand-overs of single pools: a two-slice task
takes the pool a single-slice task leaves and creates its second slice; when it ends,
one of its pools goes to the single-slice task waiting behind it, the other is deleted.
"""

from __future__ import annotations

import collections
import datetime as dt
import shutil
from pathlib import Path

import pytest

from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from tests.support.harness import Crash, CrashPlan, Harness, reserved_cluster, sim_config
from tests.conftest import migrate

START = dt.datetime(2026, 11, 1, 9, 0, 0)
CLUSTER = reserved_cluster(count=1)
#: Two 4x4 slices: the multi-slice lifecycle's reservation.
MULTISLICE_CLUSTER = reserved_cluster(count=8)
MAX_STEPS = 3000


def lifecycle(db_url: str, plan: CrashPlan, *, chain: bool = False,
              multislice: bool = False) -> Harness:
    """Run the scenario to the end, restarting the controller after every crash.

    ``chain``: after each restart, arm the next crash point (cycling through the four
    kinds) two ticks later, so one run dies many times at every kind of point.
    ``multislice``: the multi-slice lifecycle instead.
    """
    cluster = MULTISLICE_CLUSTER if multislice else CLUSTER
    h = Harness(db_url, VirtualClock(START), sim_config(cluster), Settings(db_url=db_url),
                plan=plan)
    h.add_cluster(cluster)
    if multislice:
        h.submit("a", topology="4x4", sim={"duration_seconds": 120})
        h.clock.advance(1)
        h.submit("ms", topology="4x4", slices=2, sim={"duration_seconds": 300})
        h.clock.advance(1)
        h.submit("s1", topology="4x4", sim={"duration_seconds": 60})
    else:
        h.submit("a", sim={"duration_seconds": 120})
        h.clock.advance(1)
        h.submit("b", sim={"duration_seconds": 3000})
    aborted = False
    ticks_since_restart = 0
    kinds = collections.deque(["handler", "commit", "before", "after"])
    for _ in range(MAX_STEPS):
        b = h.app.tasks.get("b")
        if not aborted and b is not None and b.status == "Running":
            h.abort("b")
            aborted = True
        if h.settled():
            return h
        if chain and ticks_since_restart == 2:
            _arm(plan, kinds[0])
            kinds.rotate(-1)
        try:
            h.step()
            ticks_since_restart += 1
        except Crash:
            h.restart(died=True)
            ticks_since_restart = 0
    raise AssertionError(f"not settled after {MAX_STEPS} steps: {h.statuses()}")


def _arm(plan: CrashPlan, kind: str) -> None:
    """Crash at the next step of ``kind``."""
    seen = {"handler": plan.handlers_seen, "commit": plan.commits_seen}.get(
        kind, plan.effects_seen)
    _arm_at(plan, kind, seen + 1)


def _arm_at(plan: CrashPlan, kind: str, point: int) -> None:
    """Crash at step ``point`` of ``kind`` (counted from the run's start)."""
    if kind == "handler":
        plan.handler_at = point
    elif kind == "commit":
        plan.commit_at = point
    else:
        plan.effect_at, plan.effect_when = point, kind


def outcome(h: Harness) -> dict[str, tuple[str, str | None]]:
    return {task: steps[-1] for task, steps in h.history.items()}


def assert_clean_end(h: Harness, expected: dict[str, tuple[str, str | None]]) -> None:
    assert outcome(h) == expected
    creates = collections.Counter(name for call, name in h.plan.done if call == "create-pool")
    submits = collections.Counter(name for call, name in h.plan.done if call == "submit-job")
    assert all(n == 1 for n in creates.values()), f"a pool was created twice: {creates}"
    assert all(n == 1 for n in submits.values()), f"a Job was submitted twice: {submits}"
    assert h.world.pools() == [], "a pool was left behind"
    assert not h.executor.open_intents()
    assert h.world.job_state("v6e-res", "falcon-b") is None, "the aborted Job still exists"


EXPECTED = {"a": ("Succeeded", None), "b": ("Aborted", None)}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite file each run starts from a copy of (migrating anew
    would cost more than the run)."""
    directory = tmp_path_factory.mktemp("template")
    _fresh_sqlite(directory)
    return directory / "falcon.db"


def _copy(template: Path, directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, directory / "falcon.db")
    return f"sqlite:///{directory / 'falcon.db'}"


@pytest.fixture(scope="module")
def reference(template: Path, tmp_path_factory: pytest.TempPathFactory) -> CrashPlan:
    """The crash-free run: its outcome and how many steps of each kind it took."""
    plan = CrashPlan()
    h = lifecycle(_copy(template, tmp_path_factory.mktemp("reference")), plan)
    assert outcome(h) == EXPECTED
    assert_clean_end(h, EXPECTED)
    assert "NodePoolReused" in h.events("b")  # the pool was handed over
    h.close()
    return plan


def _fresh_sqlite(directory: Path) -> str:
    url = f"sqlite:///{directory / 'falcon.db'}"
    migrate(url)
    return url


def test_the_scenario_covers_every_kind_of_step(reference: CrashPlan) -> None:
    assert reference.handlers_seen >= 20 and reference.commits_seen >= 15
    assert {call for call, _ in reference.done} == {"create-pool", "delete-pool", "submit-job",
                                                    "delete-job", "ack"}


@pytest.mark.parametrize("kind", ["handler", "commit", "before", "after"])
def test_a_crash_at_any_step_changes_no_outcome(kind: str, reference: CrashPlan,
                                                template: Path, tmp_path: Path) -> None:
    _crash_at_each_point(kind, reference, template, tmp_path, multislice=False)


def _crash_at_each_point(kind: str, reference: CrashPlan, template: Path, tmp_path: Path,
                         *, multislice: bool) -> None:
    """One run per step of ``kind`` the reference run took, crashing there."""
    total = {"handler": reference.handlers_seen, "commit": reference.commits_seen,
             "before": reference.effects_seen, "after": reference.effects_seen}[kind]
    expected = MULTISLICE_EXPECTED if multislice else EXPECTED
    for point in range(1, total + 1):
        plan = CrashPlan()
        _arm_at(plan, kind, point)
        h = lifecycle(_copy(template, tmp_path / f"{kind}-{point}"), plan,
                      multislice=multislice)
        try:
            assert h.restarts == 1, f"{kind} {point}: the crash did not happen"
            assert_clean_end(h, expected)
        finally:
            h.close()


def test_many_crashes_in_one_lifecycle(db_url: str) -> None:
    """One run dying over and over at every kind of point, on SQLite and MariaDB."""
    h = lifecycle(db_url, CrashPlan(), chain=True)
    try:
        assert h.restarts == len(h.plan.crashes) >= 8
        assert set(h.plan.crashes) == {"handler", "commit", "before", "after"}
        assert_clean_end(h, EXPECTED)
    finally:
        h.close()


MULTISLICE_EXPECTED = {"a": ("Succeeded", None), "ms": ("Succeeded", None),
                       "s1": ("Succeeded", None)}


@pytest.fixture(scope="module")
def multislice_reference(template: Path, tmp_path_factory: pytest.TempPathFactory) -> CrashPlan:
    """The crash-free multi-slice run: each hand-over happened, of one pool each."""
    plan = CrashPlan()
    h = lifecycle(_copy(template, tmp_path_factory.mktemp("multislice")), plan, multislice=True)
    assert_clean_end(h, MULTISLICE_EXPECTED)
    assert "NodePoolTaken" in h.events("ms") and "NodePoolReused" in h.events("s1")
    assert "NodePoolCreateRequested" not in h.events("s1")
    h.close()
    return plan


@pytest.mark.parametrize("kind", ["handler", "commit", "before", "after"])
def test_a_crash_at_any_step_of_a_multi_slice_hand_over_changes_no_outcome(
        kind: str, multislice_reference: CrashPlan, template: Path, tmp_path: Path) -> None:
    """A crash anywhere -- while a hand-over is decided, made durable, or the pools
    around it created and deleted -- leaves each pool to exactly one task."""
    _crash_at_each_point(kind, multislice_reference, template, tmp_path, multislice=True)


def test_many_crashes_in_one_multi_slice_lifecycle(db_url: str) -> None:
    h = lifecycle(db_url, CrashPlan(), chain=True, multislice=True)
    try:
        assert h.restarts == len(h.plan.crashes) >= 8
        assert_clean_end(h, MULTISLICE_EXPECTED)
    finally:
        h.close()
