"""What ``falcon-es smoke`` checks: each fidelity-ledger row a smoke run can observe,
what the model assumes for it and whether the run agrees.

The model's numbers are the simulated world's own: the packaged sim configuration
(``adapters/sim/default_config.json``, read by ``load_sim_config``) and the sim's event
words, never copies, so a change of the model changes what smoke expects. A row the run
did not observe (the autoscaler's words on a reservation pool, the reservation on a
flex-start one) says so instead of agreeing. Rows are named by the stable id they carry
in docs/FIDELITY.md, so a finding can be filed against its row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from falcon_es.adapters.sim.common import OPERATION_DONE, OPERATION_RUNNING
from falcon_es.adapters.sim.config import (
    FLEX_START, ON_DEMAND, RESERVATION, SimConfig, Span, load_sim_config,
)
from falcon_es.adapters.sim.gke import FAILED_SCALE_UP, NOT_TRIGGER_SCALE_UP, TRIGGERED_SCALE_UP
from falcon_es.adapters.sim.kube_api import COMPLETE_CONDITION, FAILED_CONDITION

#: The ledger's ids of the rows a smoke run observes, with each row's behaviour in short.
ROWS: Mapping[str, str] = MappingProxyType({
    "gke-operation-words": "node pool create and delete are operations polled until DONE",
    "gke-pool-visibility": "a just-created pool can be missing from get for a while",
    "gke-node-registration": "a pool's nodes register, then turn Ready, some time after "
                             "the pool is RUNNING (a flex-start pool's after the scale-up)",
    "autoscaler-events": "the cluster autoscaler's event words on a flex-start pool's "
                         "pending pod",
    "job-conditions": "a Job ends with a condition of status True (Complete or Failed)",
    "pubsub-delivery": "the informer's observations reach the controller through Pub/Sub, "
                       "at least once",
    "reservation-in-use": "specificReservation.inUseCount counts the VMs that exist",
    "gcs-log-upload": "a pod's log file is in Cloud Storage once its container ended",
    "gke-operation-retention": "how long GKE keeps a finished operation",
})
LEDGER = "docs/FIDELITY.md"
#: The operation status words the simulated GKE answers (anything but DONE is running).
OPERATION_WORDS = (OPERATION_RUNNING, OPERATION_DONE)
#: The conditions the simulated Job controller ends a Job with: one of them, at once
#: (no ``SuccessCriteriaMet`` / ``FailureTarget`` before it).
JOB_CONDITIONS = (COMPLETE_CONDITION, FAILED_CONDITION)
#: The autoscaler's reasons the simulated world puts on a pending pod of a flex-start pool.
AUTOSCALER_REASONS = (TRIGGERED_SCALE_UP, FAILED_SCALE_UP, NOT_TRIGGER_SCALE_UP)


@dataclasses.dataclass(frozen=True)
class Model:
    """The assumptions a smoke run is held against, taken from the simulated world."""

    visibility: Mapping[str, Span]
    node_register: Mapping[str, Span]
    node_ready_lag: Span
    #: The longest the sim delays an observation on its way to the controller.
    max_late_seconds: float

    @classmethod
    def of(cls, config: SimConfig) -> Model:
        behaviour = config.defaults
        late = config.delivery.max_late_seconds if config.delivery.late_probability else 0.0
        return cls(visibility=behaviour.visibility_delay,
                   node_register=behaviour.node_register_delay,
                   node_ready_lag=behaviour.node_ready_lag, max_late_seconds=late)

    @classmethod
    def packaged(cls) -> Model:
        """The model of the packaged simulated world (what ``run --backend sim`` plays)."""
        return cls.of(load_sim_config())


@dataclasses.dataclass
class Observations:
    """What one smoke run saw; None where the run did not get that far or the case
    does not arise (a reused pool has no visibility delay to measure)."""

    supply_mode: str
    visibility_seconds: float | None = None
    operation_words: list[str] = dataclasses.field(default_factory=list)
    register_seconds: float | None = None
    ready_lag_seconds: float | None = None
    autoscaler_events: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    job_conditions: list[str] = dataclasses.field(default_factory=list)
    delivered: bool | None = None
    delivery_seconds: float | None = None
    duplicates: int = 0
    free_slices_before: int | None = None
    free_slices_during: int | None = None
    free_slices_after: int | None = None
    slices: int = 1
    log_found: bool | None = None
    log_seconds: float | None = None
    retention_seconds: float | None = None
    operation_kept: bool | None = None


@dataclasses.dataclass(frozen=True)
class RowCheck:
    """One ledger row: the model's assumption, the observation, and whether they agree
    (None: not observed in this run)."""

    row: str
    behaviour: str
    assumed: str
    observed: str
    agrees: bool | None

    @property
    def verdict(self) -> str:
        return {True: "agrees", False: "DIFFERS", None: "not observed"}[self.agrees]

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "behaviour": self.behaviour, "assumed": self.assumed,
                "observed": self.observed, "agrees": self.agrees}


def seconds(value: float) -> str:
    return f"{value:.1f} s"


def span_words(span: Span) -> str:
    return seconds(span.low) if span.low == span.high else \
        f"{span.low:.0f} to {span.high:.0f} s"


def within(value: float, span: Span, tolerance: float) -> bool:
    """The observation lies in the model's range, give or take one look's interval."""
    return span.low - tolerance <= value <= span.high + tolerance


def _row(row: str, assumed: str, observed: str, agrees: bool | None) -> RowCheck:
    return RowCheck(row, ROWS[row], assumed, observed, agrees)


def _not_observed(row: str, assumed: str, why: str) -> RowCheck:
    return _row(row, assumed, why, None)


def check_operation_words(obs: Observations) -> RowCheck:
    assumed = f"status words {' then '.join(OPERATION_WORDS)}; only DONE ends it"
    if not obs.operation_words:
        return _not_observed("gke-operation-words", assumed, "no operation was followed")
    words = list(dict.fromkeys(obs.operation_words))
    agrees = set(words) <= set(OPERATION_WORDS) and words[-1] == OPERATION_DONE
    return _row("gke-operation-words", assumed, "status words " + ", ".join(words), agrees)


def check_visibility(obs: Observations, model: Model, tolerance: float) -> RowCheck:
    span = model.visibility[obs.supply_mode]
    assumed = (f"visible at once ({obs.supply_mode})" if span.high == 0 else
               f"missing from get for {span_words(span)} ({obs.supply_mode})")
    if obs.visibility_seconds is None:
        return _not_observed("gke-pool-visibility", assumed, "no pool was created")
    return _row("gke-pool-visibility", assumed,
                f"visible {seconds(obs.visibility_seconds)} after the create returned",
                within(obs.visibility_seconds, span, tolerance))


def check_registration(obs: Observations, model: Model, tolerance: float) -> RowCheck:
    span = model.node_register[obs.supply_mode]
    start = "the Job's submit" if obs.supply_mode == FLEX_START else "RUNNING"
    assumed = (f"nodes registered {span_words(span)} after {start} ({obs.supply_mode}), "
               f"Ready {span_words(model.node_ready_lag)} later")
    if obs.register_seconds is None or obs.ready_lag_seconds is None:
        return _not_observed("gke-node-registration", assumed,
                             "the nodes were not followed from the start")
    agrees = (within(obs.register_seconds, span, 2 * tolerance)
              and within(obs.ready_lag_seconds, model.node_ready_lag, 2 * tolerance))
    return _row("gke-node-registration", assumed,
                f"registered {seconds(obs.register_seconds)} after {start}, Ready "
                f"{seconds(obs.ready_lag_seconds)} later", agrees)


def check_autoscaler(obs: Observations) -> RowCheck:
    assumed = (f"a pending pod gets {' or '.join(AUTOSCALER_REASONS)} events "
               "(\"pod triggered scale-up: ...\")")
    if obs.supply_mode != FLEX_START:
        return _not_observed("autoscaler-events", assumed,
                             f"a {obs.supply_mode} pool brings its nodes at create")
    reasons = [reason for reason, _ in obs.autoscaler_events if "ScaleUp" in reason]
    if not reasons:
        return _row("autoscaler-events", assumed, "no scale-up event on the pod", False)
    triggered = [m for r, m in obs.autoscaler_events if r == TRIGGERED_SCALE_UP]
    agrees = (set(reasons) <= set(AUTOSCALER_REASONS)
              and all(m.startswith("pod triggered scale-up") for m in triggered))
    shown = "; ".join(f"{r}: {m}" for r, m in obs.autoscaler_events if "ScaleUp" in r)
    return _row("autoscaler-events", assumed, shown, agrees)


def check_job_conditions(obs: Observations) -> RowCheck:
    assumed = f"one condition, {' or '.join(JOB_CONDITIONS)}, set at once"
    if not obs.job_conditions:
        return _not_observed("job-conditions", assumed, "the Job did not end")
    agrees = len(obs.job_conditions) == 1 and obs.job_conditions[0] in JOB_CONDITIONS
    return _row("job-conditions", assumed, "conditions " + ", ".join(obs.job_conditions),
                agrees)


def check_delivery(obs: Observations, model: Model, tolerance: float) -> RowCheck:
    assumed = (f"every change delivered at least once, at most "
               f"{seconds(model.max_late_seconds)} late")
    if obs.delivered is None:
        return _not_observed("pubsub-delivery", assumed, "the Job did not end")
    if not obs.delivered or obs.delivery_seconds is None:
        return _row("pubsub-delivery", assumed, "the Job's end never arrived", False)
    extra = f", {obs.duplicates} duplicate(s)" if obs.duplicates else ""
    return _row("pubsub-delivery", assumed,
                f"the Job's end arrived {seconds(obs.delivery_seconds)} after the API "
                f"showed it{extra}", obs.delivery_seconds <= model.max_late_seconds + tolerance)


def check_reservation(obs: Observations) -> RowCheck:
    assumed = (f"free slices drop by {obs.slices} while the pool's VMs exist and come back "
               "after its delete")
    if obs.supply_mode != RESERVATION:
        return _not_observed("reservation-in-use", assumed,
                             f"a {obs.supply_mode} pool consumes no reservation")
    counts = (obs.free_slices_before, obs.free_slices_during, obs.free_slices_after)
    if any(count is None for count in counts):
        return _not_observed("reservation-in-use", assumed,
                             "the pool was reused or not deleted, so before and after "
                             "are not both known")
    before, during, after = counts
    assert before is not None and during is not None and after is not None
    return _row("reservation-in-use", assumed,
                f"free slices {before} before, {during} while Ready, {after} after the delete",
                during == before - obs.slices and after == before)


def check_log(obs: Observations, tolerance: float) -> RowCheck:
    assumed = "uploaded on close: the whole file is there once the container ended"
    if obs.log_found is None:
        return _not_observed("gcs-log-upload", assumed, "the Job did not end")
    if not obs.log_found or obs.log_seconds is None:
        return _row("gcs-log-upload", assumed, "the line never appeared", False)
    when = ("at the first look after the Job ended" if obs.log_seconds == 0 else
            f"{seconds(obs.log_seconds)} after the Job ended")
    return _row("gcs-log-upload", assumed, f"the line was there {when}",
                obs.log_seconds <= tolerance)


def check_retention(obs: Observations) -> RowCheck:
    assumed = "not stated by GKE; the simulated GKE keeps every operation"
    if obs.operation_kept is None or obs.retention_seconds is None:
        return _not_observed("gke-operation-retention", assumed,
                             "the create operation was not asked again")
    state = "still known" if obs.operation_kept else "unknown (NOT_FOUND)"
    return _row("gke-operation-retention", assumed,
                f"the create operation {state} {seconds(obs.retention_seconds)} after DONE"
                + (" (kept at least that long)" if obs.operation_kept else ""),
                obs.operation_kept)


def compare(obs: Observations, model: Model, tolerance: float) -> list[RowCheck]:
    """Every row smoke knows, in the order a run meets them."""
    return [check_operation_words(obs), check_visibility(obs, model, tolerance),
            check_registration(obs, model, tolerance), check_autoscaler(obs),
            check_reservation(obs), check_job_conditions(obs),
            check_delivery(obs, model, tolerance), check_log(obs, tolerance),
            check_retention(obs)]


def finding(check: RowCheck, where: str, command: str) -> str:
    """A disagreement as an issue ready to file: the row, both sides, how to repeat."""
    return "\n".join([
        f"Finding: the model's row `{check.row}` differs from what {where} did",
        f"Ledger row: `{check.row}` in {LEDGER} ({check.behaviour})",
        f"The model assumes: {check.assumed}",
        f"Observed: {check.observed}",
        f"Seen by: {command}",
        "Next: correct the row and the simulated world's value (a timing: "
        "falcon_es/adapters/sim/default_config.json), or say in the row why the product "
        "works either way.",
    ])


def disagreements(checks: Sequence[RowCheck]) -> list[RowCheck]:
    return [check for check in checks if check.agrees is False]
