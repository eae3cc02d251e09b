"""Retry with backoff for every external API, configured in one place.

``RetryPolicies`` holds one ``Backoff`` per external API (gke, compute, kubernetes,
pubsub) plus ``wait``, the pace of the steps that wait on the world through the log
(reservation capacity, a pool not visible yet, nodes not ready): those are not failed
calls and are never given up. ``RetrySettings`` declares them, one
``FALCON_RETRY_<API>_<FIELD>`` variable each; ``Settings.retry`` is that group, and the
rules below read only it.

Retries never block a tick: the effect executor and the handlers record each failed
call in the task's log (``ApiCallRetrying``) and come back when the next attempt is
due, and the attempt count and the limit go into the task's Message ("attempt 3 of 12,
next in 40s"). The rules below read those records back from the folded task state, so
a restarted controller goes on counting where the last one stopped.

The delay is a pure function of the attempt number and a generator seeded by the task,
the step and the attempt, so every controller, every replay and every test computes
the same moment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from falcon_es.config.errors import SettingsError
from falcon_es.config.fields import Fraction, Whole, setting
from falcon_es.domain.intents import RESERVATION_CHECK, IntentKind

if TYPE_CHECKING:  # the rules read task states
    from falcon_es.domain import events as ev
    from falcon_es.domain.task import TaskState

GKE, COMPUTE, KUBERNETES, PUBSUB = "gke", "compute", "kubernetes", "pubsub"
#: Not an API: the pace of log-driven waits on the world (never given up).
WAIT = "wait"
APIS = (GKE, COMPUTE, KUBERNETES, PUBSUB, WAIT)


class RetryConfigError(SettingsError):
    """A retry setting holds a value that cannot describe a backoff."""


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff with proportional jitter.

    ``attempts`` counts every call, the first included: with ``attempts=5`` there are
    at most four retries; ``None`` never gives up (the delay stays at ``maximum``).
    Jitter spreads retries of many tasks that failed together
    (a stockout hits every queue at once) so they do not return in lockstep.
    """

    initial: float = 1.0
    maximum: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2
    attempts: int | None = 5

    def __post_init__(self) -> None:
        problems = []
        if self.initial <= 0:
            problems.append(f"initial={self.initial} must be positive")
        if self.maximum < self.initial:
            problems.append(f"max={self.maximum} must be at least initial={self.initial}")
        if self.multiplier < 1:
            problems.append(f"multiplier={self.multiplier} must be at least 1")
        if not 0 <= self.jitter <= 1:
            problems.append(f"jitter={self.jitter} must be between 0 and 1")
        if self.attempts is not None and self.attempts < 1:
            problems.append(f"attempts={self.attempts} must be at least 1")
        if problems:
            raise RetryConfigError("backoff: " + "; ".join(problems))

    def base_delay(self, attempt: int) -> float:
        """The delay before call number ``attempt + 1``, without jitter.

        ``attempt`` is the number of calls made so far (1 after the first failure).
        """
        if attempt < 1:
            raise ValueError(f"attempt must be at least 1, got {attempt}")
        exponent = attempt - 1
        if self.multiplier == 1 or exponent == 0:
            return self.initial
        # Compare exponents, not products: a large attempt number must not overflow.
        if exponent >= math.log(self.maximum / self.initial, self.multiplier):
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier ** exponent)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The jittered delay after ``attempt`` failed calls, never above ``maximum``."""
        base = self.base_delay(attempt)
        if self.jitter == 0:
            return base
        spread = base * self.jitter
        return min(self.maximum, max(0.0, rng.uniform(base - spread, base + spread)))

    def exhausted(self, attempt: int) -> bool:
        """True once ``attempt`` calls have been made and no more are allowed."""
        return self.attempts is not None and attempt >= self.attempts


#: Defaults per API: GKE node-pool operations are slow and rate-limited per cluster,
#: Kubernetes and Pub/Sub calls are quick and cheap to repeat.
DEFAULT_BACKOFFS: Mapping[str, Backoff] = MappingProxyType({
    GKE: Backoff(initial=10.0, maximum=300.0, multiplier=2.0, jitter=0.2, attempts=12),
    COMPUTE: Backoff(initial=5.0, maximum=120.0, multiplier=2.0, jitter=0.2, attempts=8),
    KUBERNETES: Backoff(initial=1.0, maximum=60.0, multiplier=2.0, jitter=0.2, attempts=10),
    PUBSUB: Backoff(initial=0.5, maximum=30.0, multiplier=2.0, jitter=0.2, attempts=10),
    WAIT: Backoff(initial=15.0, maximum=300.0, multiplier=2.0, jitter=0.1, attempts=None),
})
#: Policies whose ``attempts`` cannot be set: what they pace is never given up.
UNLIMITED = frozenset({WAIT})

@dataclasses.dataclass(frozen=True)
class RetryPolicies:
    """The backoff of each external API (gke, compute, kubernetes, pubsub) and of the
    log-driven waits (``wait``)."""

    backoffs: Mapping[str, Backoff] = dataclasses.field(default_factory=lambda: DEFAULT_BACKOFFS)

    def __post_init__(self) -> None:
        missing = [api for api in APIS if api not in self.backoffs]
        if missing:
            raise RetryConfigError(f"retry policies: no backoff for {', '.join(missing)}")
        object.__setattr__(self, "backoffs", MappingProxyType(dict(self.backoffs)))

    def for_api(self, api: str) -> Backoff:
        try:
            return self.backoffs[api]
        except KeyError:
            raise RetryConfigError(
                f"no retry policy for API {api!r}; known: {', '.join(sorted(self.backoffs))}"
            ) from None


#: Backoff field -> the suffix of its variable and the words of its doc line.
_FIELDS = MappingProxyType({
    "initial": ("INITIAL", "seconds before the first retry"),
    "maximum": ("MAX", "the longest delay, in seconds"),
    "multiplier": ("MULTIPLIER", "how much each delay grows"),
    "jitter": ("JITTER", "the fraction by which a delay is spread at random"),
    "attempts": ("ATTEMPTS", "calls before giving up, the first included"),
})
_WHAT = MappingProxyType({
    GKE: "GKE node-pool calls", COMPUTE: "Compute Engine calls",
    KUBERNETES: "Kubernetes API calls", PUBSUB: "Pub/Sub calls",
    WAIT: "waits on the world (reservation capacity, pool visibility, node readiness)",
})


def _retry(api: str, field: str) -> Any:
    """The declaration of one field of one API's backoff."""
    suffix, words = _FIELDS[field]
    return setting(getattr(DEFAULT_BACKOFFS[api], field), f"FALCON_RETRY_{api.upper()}_{suffix}",
                   doc=f"{_WHAT[api]}: {words}")


def _never_given_up(value: Any) -> None:
    if value is None:
        return None
    raise ValueError("wait retries are never given up; only INITIAL, MAX, MULTIPLIER and "
                     "JITTER can be set")


class RetrySettings(BaseModel):
    """Every backoff, in one place: per external API (failed calls) and ``wait`` (steps
    waiting on the world through the log). The fields are ``<api>_<backoff field>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gke_initial: Fraction = _retry(GKE, "initial")
    gke_maximum: Fraction = _retry(GKE, "maximum")
    gke_multiplier: Fraction = _retry(GKE, "multiplier")
    gke_jitter: Fraction = _retry(GKE, "jitter")
    gke_attempts: Whole = _retry(GKE, "attempts")
    compute_initial: Fraction = _retry(COMPUTE, "initial")
    compute_maximum: Fraction = _retry(COMPUTE, "maximum")
    compute_multiplier: Fraction = _retry(COMPUTE, "multiplier")
    compute_jitter: Fraction = _retry(COMPUTE, "jitter")
    compute_attempts: Whole = _retry(COMPUTE, "attempts")
    kubernetes_initial: Fraction = _retry(KUBERNETES, "initial")
    kubernetes_maximum: Fraction = _retry(KUBERNETES, "maximum")
    kubernetes_multiplier: Fraction = _retry(KUBERNETES, "multiplier")
    kubernetes_jitter: Fraction = _retry(KUBERNETES, "jitter")
    kubernetes_attempts: Whole = _retry(KUBERNETES, "attempts")
    pubsub_initial: Fraction = _retry(PUBSUB, "initial")
    pubsub_maximum: Fraction = _retry(PUBSUB, "maximum")
    pubsub_multiplier: Fraction = _retry(PUBSUB, "multiplier")
    pubsub_jitter: Fraction = _retry(PUBSUB, "jitter")
    pubsub_attempts: Whole = _retry(PUBSUB, "attempts")
    wait_initial: Fraction = _retry(WAIT, "initial")
    wait_maximum: Fraction = _retry(WAIT, "maximum")
    wait_multiplier: Fraction = _retry(WAIT, "multiplier")
    wait_jitter: Fraction = _retry(WAIT, "jitter")
    #: Declared to be refused: what ``wait`` paces is never given up.
    wait_attempts: Annotated[None, BeforeValidator(_never_given_up)] = setting(
        None, "FALCON_RETRY_WAIT_ATTEMPTS", doc="cannot be set: waits on the world are "
        "never given up")

    @model_validator(mode="after")
    def _backoffs_hold(self) -> RetrySettings:
        """Each API's fields make a valid backoff; a bad one is named by the variables
        set for that API, as they were given."""
        for api in APIS:
            try:
                self._backoff(api)
            except RetryConfigError as error:
                named = [f"FALCON_RETRY_{api.upper()}_{_FIELDS[field][0]}="
                         f"{getattr(self, f'{api}_{field}'):g}"
                         for field in _FIELDS if f"{api}_{field}" in self.model_fields_set]
                raise RetryConfigError(f"{', '.join(named)}: {error}") from None
        return self

    def for_api(self, api: str) -> Backoff:
        """The backoff of ``api`` (one of ``APIS``)."""
        return self.policies.for_api(api)

    @functools.cached_property
    def policies(self) -> RetryPolicies:
        """The same backoffs as one ``RetryPolicies`` (built once: every failed call
        and every retry's due time reads them)."""
        return RetryPolicies({api: self._backoff(api) for api in APIS})

    def _backoff(self, api: str) -> Backoff:
        values = {field: getattr(self, f"{api}_{field}") for field in _FIELDS}
        return Backoff(**values) if api not in UNLIMITED else Backoff(
            **{**values, "attempts": None})

    @classmethod
    def of(cls, policies: RetryPolicies) -> RetrySettings:
        """The settings that give ``policies`` (a test's or a benchmark's own)."""
        return cls(**{f"{api}_{field}": getattr(policies.for_api(api), field)
                      for api in APIS for field in _FIELDS
                      if not (field == "attempts" and api in UNLIMITED)})


def seeded_delay(backoff: Backoff, attempt: int, seed: str) -> float:
    """The jittered delay after ``attempt`` failed calls, drawn from a generator seeded
    by ``seed`` (a task, a step and the attempt), so every controller and every replay
    of the log computes the same moment."""
    return backoff.delay(attempt, random.Random(seed))


# ------------------------------------------------------------------ log-driven rules
#: The API each step calls (and whose backoff paces its retries).
API_OF_STEP: Mapping[str, str] = MappingProxyType({
    IntentKind.POOL_CREATE: GKE, IntentKind.POOL_DELETE: GKE, IntentKind.ORPHAN_DELETE: GKE,
    IntentKind.JOB_SUBMIT: KUBERNETES, IntentKind.JOB_DELETE: KUBERNETES,
    RESERVATION_CHECK: COMPUTE,
})
#: Steps retried until they succeed, whatever the policy's attempts: a pool or Job
#: left behind costs money and blocks nothing else.
NEVER_GIVEN_UP = frozenset({IntentKind.POOL_DELETE, IntentKind.JOB_DELETE,
                            IntentKind.ORPHAN_DELETE})
#: Steps retried through the log whose pace is not an API's: waits on the world.
WAIT_KINDS = frozenset({"ReservationInsufficient", "NodePoolNotVisible", "NodesNotReady"})


def retry_backoff(retry: RetrySettings, kind: str) -> Backoff:
    """The backoff of a step retried through the log: the ``wait`` policy for waits on
    the world (reservation capacity, pool visibility, node readiness), the GKE policy
    for a failed pool delete (``NodePoolDeleteFailed``, never given up)."""
    return retry.for_api(WAIT if kind in WAIT_KINDS else GKE)


def retry_due_at(state: TaskState, kind: str, retry: RetrySettings) -> dt.datetime | None:
    """When the next attempt of ``kind`` is due for this task (None: try now)."""
    if state.retries.kind != kind or state.retries.at is None or state.retries.attempt < 1:
        return None
    delay = seeded_delay(retry_backoff(retry, kind), state.retries.attempt,
                         f"{state.task_id}:{kind}:{state.retries.attempt}")
    return state.retries.at + dt.timedelta(seconds=delay)


def call_retry_due_at(state: TaskState, step: str) -> dt.datetime | None:
    """When the call of ``step`` that last failed with a transient error is due again
    (recorded by ``ApiCallRetrying``; None when it never failed)."""
    retried = state.retries.api_calls.get(step)
    return retried[1] if retried is not None else None


def call_failed(state: TaskState, step: str, error: str,
                retry: RetrySettings) -> ev.ApiCallRetrying | None:
    """The record of a failed call of ``step`` for this task: the attempt it was, the
    limit and when the next is due; None when the attempts are used up.

    The attempt counts every failed call of the step in the task's log, so a restarted
    controller goes on counting where the last one stopped; the delay is seeded by the
    task, the step and the attempt."""
    attempt = failed_calls(state, step) + 1
    backoff = retry.for_api(API_OF_STEP[step])
    never = step in NEVER_GIVEN_UP
    if not never and backoff.exhausted(attempt):
        return None
    delay = seeded_delay(backoff, attempt, f"{state.task_id}:{step}:{attempt}")
    # Imported here: every command reads the settings (this module among them) without
    # needing the event types.
    from falcon_es.domain import events as ev

    return ev.ApiCallRetrying(
        api=API_OF_STEP[step], step=step, attempt=attempt,
        attempts=None if never else backoff.attempts, error=error,
        retry_in_seconds=max(1, math.ceil(delay)))


def failed_calls(state: TaskState, step: str) -> int:
    """How many calls of ``step`` failed with a transient error, as the log says."""
    retried = state.retries.api_calls.get(step)
    return retried[0] if retried is not None else 0


def gave_up(attempts: int, error: str) -> str:
    """The definite failure's words once a step used up its attempts."""
    return f"gave up after {attempts} attempts: {error}"


def scheduled_try(state: TaskState, kind: str, retry: RetrySettings, now: dt.datetime) -> int:
    """The number of the wait's try due at ``now``: the last try the retry schedule
    puts at or before ``now``, counted from the last recorded try (its number and
    moment), and at least the one after it. A wait records a try only when what it
    found changed (or at a checkpoint, ``records_try``), so a controller that starts
    afresh counts the silent tries on the schedule, as its predecessor made them."""
    recorded = state.retries.attempt if state.retries.kind == kind else 0
    if recorded < 1 or state.retries.at is None:
        return recorded + 1
    backoff = retry_backoff(retry, kind)
    attempt, at = recorded, state.retries.at
    while True:
        at += dt.timedelta(seconds=seeded_delay(
            backoff, attempt, f"{state.task_id}:{kind}:{attempt}"))
        if at > now:
            return max(attempt, recorded + 1)
        attempt += 1


def wait_delay(state: TaskState, kind: str, attempt: int, retry: RetrySettings) -> dt.timedelta:
    """How long after try ``attempt`` of the wait ``kind`` the next one comes (the
    delay ``retry_due_at`` reads for a recorded try)."""
    return dt.timedelta(seconds=seeded_delay(retry_backoff(retry, kind), attempt,
                                             f"{state.task_id}:{kind}:{attempt}"))


def records_try(attempt: int) -> bool:
    """Whether a try that found what the log already says is recorded all the same: the
    first, and each whose number is a power of two, so the Message's count of tries
    stays within a factor of two of the truth while the log grows with the logarithm
    of the wait (about a dozen events in a week of tries every five minutes)."""
    return attempt & (attempt - 1) == 0


def next_attempt(state: TaskState, kind: str) -> int:
    """The attempt number of the next log-driven retry of ``kind``."""
    return state.retries.attempt + 1 if state.retries.kind == kind else 1
