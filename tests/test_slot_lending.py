"""Slot lending: a slot holder stuck on its full reservation, holding nothing, lends its
queue's slot to the first waiting task that needs another supply mode, and goes on the
moment its reservation has room; strict FIFO (the setting) keeps the slot idle.

The rule alone, the scheduling handlers on the in-memory world of the property tests
(messages in both languages included), and the whole controller on the sim world with
the store on SQLite and MariaDB."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from falcon_es.config.settings import Settings, SettingsError
from falcon_es.domain import events as ev
from falcon_es.domain.slot_loans import (
    WHY_OTHER_SUPPLY_MODE, LoanCandidate, SlotBorrowed, SlotLent, choose_borrower,
)
from falcon_es.projections import replay
from falcon_es.projections.messages import task_message, wait_reason
from tests.support.harness import Harness, reserved_cluster
from tests.test_scheduling_properties import World

Make = Callable[..., Harness]
STRICT = Settings(best_effort_fifo=False)
T0 = dt.datetime(2026, 11, 1, 9, 0, 0)


def _candidate(name: str, mode: str | None) -> LoanCandidate:
    return LoanCandidate(name, f"{name}-job", "ann", mode)


# ------------------------------------------------------------------ the rule

def test_the_first_task_needing_other_capacity_borrows_and_those_passed_over_compete() -> None:
    order = [_candidate("a", None), _candidate("b", "reservation"),
             _candidate("c", "flex-start"), _candidate("d", "on-demand")]
    loan = choose_borrower(order, "res-1")
    assert loan is not None
    assert (loan.borrower.task_id, loan.supply_mode, loan.why) == (
        "c", "flex-start", WHY_OTHER_SUPPLY_MODE)
    assert [c.task_id for c in loan.passed_over] == ["a", "b"]
    assert loan.passed_over_count == 2
    assert loan.passed_over_record()[0] == {"task_id": "a", "actor": "ann", "name": "a-job"}


def test_nobody_borrows_when_every_waiting_task_waits_for_the_same_reservation() -> None:
    assert choose_borrower([_candidate("a", None), _candidate("b", "reservation")],
                           "res-1") is None
    assert choose_borrower([], "res-1") is None


def test_on_a_cluster_without_reservation_the_default_is_flex_start() -> None:
    loan = choose_borrower([_candidate("a", "reservation"), _candidate("b", None)], None)
    assert loan is not None and (loan.borrower.task_id, loan.supply_mode) == ("b", "flex-start")


def test_passed_over_is_recorded_up_to_ten_with_the_count() -> None:
    order = [_candidate(f"r{i}", None) for i in range(25)] + [_candidate("f", "flex-start")]
    loan = choose_borrower(order, "res-1")
    assert loan is not None and len(loan.passed_over) == 10 and loan.passed_over_count == 25


def test_the_setting_chooses_strict_fifo_and_names_itself_when_wrong() -> None:
    assert Settings().features.best_effort_fifo is True
    assert Settings.from_env({"FALCON_BEST_EFFORT_FIFO": "false"}).features.best_effort_fifo \
        is False
    with pytest.raises(SettingsError, match="FALCON_BEST_EFFORT_FIFO"):
        Settings.from_env({"FALCON_BEST_EFFORT_FIFO": "sometimes"})


# ------------------------------------------------------------------ the handlers

def _stuck(settings: Settings = Settings()) -> tuple[World, str]:
    """A reservation task holding the slot of c0/2x2 in ClusterBusy."""
    world = World(cluster_count=1, settings=settings, reservation="res-1")
    holder = world.arrive("ann", "2x2")
    world.tick()
    world.emit(holder, ev.ReservationInsufficient("res-1", 0, 1, 1))
    return world, holder


def test_a_stuck_holder_lends_to_a_flex_start_task_and_both_say_so() -> None:
    world, holder = _stuck()
    same = world.arrive("bob", "2x2")  # waits for res-1 too: never lent to
    world.tick()
    world.now += dt.timedelta(seconds=5)
    flex = world.arrive("cid", "2x2", mode="flex-start")
    world.tick()
    lender, borrower = world.tasks.get(holder), world.tasks.get(flex)
    assert lender.reason == "ClusterBusy" and borrower.reason == "Provisioning"
    assert world.tasks.get(same).reason == "Waiting"
    assert lender.note_event == SlotLent(flex, "cid-job-3", "flex-start", "res-1",
                                         WHY_OTHER_SUPPLY_MODE)
    borrowed = borrower.message_event
    assert isinstance(borrowed, SlotBorrowed)
    assert (borrowed.from_task, borrowed.reservation, borrowed.supply_mode,
            borrowed.passed_over_count) == (holder, "res-1", "flex-start", 1)
    assert borrowed.passed_over[0]["task_id"] == same
    # The lender's Message leads with what it waits on, then the loan.
    en, zh = task_message(lender), task_message(lender, "zh")
    assert en is not None and en.startswith("reservation res-1 has 0 slice(s) free")
    assert "slot lent to cid-job-3 (flex-start) while reservation res-1 is full, taken" in en
    assert zh is not None and "资源槽暂借给 cid-job-3（flex-start）" in zh
    assert task_message(borrower) == (
        "provisioning on 2x2 on the slot lent by ann-job-1, which waits for reservation "
        "res-1 (flex-start does not use it; 1 task(s) waiting for it passed over)")
    assert "使用 ann-job-1 借出的资源槽" in (task_message(borrower, "zh") or "")


def test_strict_fifo_keeps_the_slot_for_the_holder() -> None:
    world, holder = _stuck(STRICT)
    flex = world.arrive("cid", "2x2", mode="flex-start")
    world.tick()
    assert world.tasks.get(flex).reason == "Waiting"
    assert not any(isinstance(e, (SlotLent, SlotBorrowed)) for _, e in world.decided)


def _two_behind(second_mode: str) -> tuple[World, str, str, str]:
    """The stuck holder, a flex-start task that borrowed its slot, and a task of
    ``second_mode`` that came after the loan."""
    world, holder = _stuck()
    first = world.arrive("cid", "2x2", mode="flex-start")
    world.tick()
    second = world.arrive("dee", "2x2", mode=second_mode)
    world.tick()
    return world, holder, first, second


def test_one_loan_at_a_time_and_the_holder_goes_on_beside_its_borrower() -> None:
    world, holder, first, second = _two_behind("on-demand")
    assert world.tasks.get(first).reason == "Provisioning"
    assert world.tasks.get(second).reason == "Waiting", "one borrower per queue"
    # What it waits for is the loan's end, and its Message says so after the holder's.
    assert world.conn.messages[second].endswith(
        "; slot lent to cid: cid-job-2 (another supply mode) until its pods run")
    assert wait_reason("ann: a", "ClusterBusy", T0, None, "zh", "cid: c").endswith(
        "；资源槽暂借给 cid: c（其他供给方式），直到其 Pod 运行")
    # The reservation has room: the holder goes on at once, its loan notwithstanding,
    # and the loan's note leaves its Message.
    world.emit(holder, ev.NodePoolReused("falcon-pool", None, "reservation"))
    assert "lent" not in (task_message(world.tasks.get(holder)) or "")
    world.emit(holder, ev.PodsRunning(1, 1))
    world.tick()
    # The holder left the slot: the next pick does not wait for the borrower.
    assert world.tasks.get(second).reason == "Provisioning"
    assert world.picks[-1].task_id == second
    # The borrower runs; the queue has one holder, never two.
    world.free(first, fail=False)
    world.tick()
    assert world.view.book.borrowers(("c0", "2x2")) == ()


def test_a_loan_ends_when_the_borrower_runs_and_the_next_one_may_borrow() -> None:
    world, holder, first, second = _two_behind("flex-start")
    world.free(first, fail=False)
    world.tick()
    assert world.tasks.get(second).placement.borrowed_from == holder
    lent = [e for s, e in world.decided if s == holder and isinstance(e, SlotLent)]
    assert [e.to_task for e in lent] == [first, second]


def test_a_holder_with_a_pool_or_one_being_created_does_not_lend() -> None:
    world = World(cluster_count=1, reservation="res-1")
    holder = world.arrive("ann", "2x2")
    world.tick()  # Provisioning: not stuck
    flex = world.arrive("cid", "2x2", mode="flex-start")
    world.tick()
    assert world.tasks.get(holder).reason == "Provisioning"
    assert world.tasks.get(flex).reason == "Waiting"


# ------------------------------------------------------------------ the sim, end to end

def _scenario(make: Make, db_url: str, settings_of: Callable[[str], Settings]) -> Harness:
    """A reservation of one VM that ``r0`` runs on, ``r1`` (reservation) stuck behind it
    in ClusterBusy, and ``f1`` (flex-start, same cluster and topology) behind ``r1``."""
    h = make(reserved_cluster(count=1), settings=settings_of(db_url))
    h.submit("r0", sim={"duration_seconds": 3600})
    h.run(lambda: h.statuses()["r0"][0] == "Running", max_steps=500, max_seconds=3600)
    h.submit("r1")
    h.run(lambda: h.statuses()["r1"] == ("Pending", "ClusterBusy"), max_steps=500,
          max_seconds=600)
    h.submit("f1", supply_mode="flex-start")
    return h


def _running_at(h: Harness, task_id: str) -> dt.datetime:
    return next(r.recorded_at for r in h.app.store.read_stream(task_id)
                if r.type_name == "PodsRunning")


def test_best_effort_runs_the_flex_start_task_while_the_reservation_is_full(
        make: Make, db_url: str) -> None:
    h = _scenario(make, db_url, lambda url: Settings(db_url=url))
    h.run(lambda: h.statuses()["f1"][0] == "Running", max_steps=2000, max_seconds=1800)
    assert h.statuses()["r1"] == ("Pending", "ClusterBusy")
    assert "SlotLent" in h.events("r1") and "SlotBorrowed" in h.events("f1")
    assert "slot lent to f1" in h.row("r1")["message"]
    # r0 ends and its VM frees: r1 goes on, then everything ends, the log replays.
    h.run(max_steps=5000)
    assert {k: v[0] for k, v in h.statuses().items()} == {
        "r0": "Succeeded", "r1": "Succeeded", "f1": "Succeeded"}
    assert _running_at(h, "f1") < _running_at(h, "r1")
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_strict_fifo_makes_the_flex_start_task_wait_for_the_reservation(
        make: Make, db_url: str) -> None:
    h = _scenario(make, db_url, lambda url: Settings(db_url=url, best_effort_fifo=False))
    h.run_for(1800)
    assert h.statuses()["f1"] == ("Pending", "Waiting")
    assert "res-r" in h.row("f1")["message"]  # it names the reservation it waits behind
    h.run(max_steps=5000)
    assert _running_at(h, "f1") > _running_at(h, "r1")  # f1 waited for the reservation
    assert "SlotBorrowed" not in h.events("f1")
    assert replay.verify(h.app.engine, h.app.store, "en", job=h.app.job) == []


def test_a_restart_places_the_borrower_apart_from_the_holder(make: Make, db_url: str) -> None:
    h = _scenario(make, db_url, lambda url: Settings(db_url=url))
    h.run(lambda: "SlotBorrowed" in h.events("f1"), max_steps=500, max_seconds=600)
    h.restart()
    book = h.app.queue_view.book
    key = next(k for k in book.queue_keys() if book.holders(k))
    assert book.holders(key) == ("r1",) and book.borrowers(key) == ("f1",)
    book.check(h.clock.now())
    h.run(max_steps=5000)
    assert {k: v[0] for k, v in h.statuses().items()} == {
        "r0": "Succeeded", "r1": "Succeeded", "f1": "Succeeded"}


def test_history_names_lender_borrower_and_why(make: Make, db_url: str) -> None:
    h = _scenario(make, db_url, lambda url: Settings(db_url=url))
    h.run(lambda: "SlotBorrowed" in h.events("f1"), max_steps=500, max_seconds=600)
    borrowed = [r.event for r in h.app.store.read_stream("f1") if r.type_name == "SlotBorrowed"]
    lent = [r.event for r in h.app.store.read_stream("r1") if r.type_name == "SlotLent"]
    assert isinstance(borrowed[0], SlotBorrowed) and isinstance(lent[0], SlotLent)
    assert (borrowed[0].from_task, borrowed[0].why) == ("r1", WHY_OTHER_SUPPLY_MODE)
    assert (lent[0].to_task, lent[0].to_supply_mode) == ("f1", "flex-start")
    assert borrowed[0].to_data()["passed_over"] == []
