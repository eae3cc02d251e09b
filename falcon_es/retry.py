"""Retry with backoff for every external API, configured in one place.

``RetryPolicies`` holds one ``Backoff`` per external API (gke, compute, kubernetes,
pubsub) plus ``wait``, the pace of the steps that wait on the world through the log
(reservation capacity, a pool not visible yet, nodes not ready): those are not failed
calls and are never given up. ``Settings.retry`` carries the policies, read from
``FALCON_RETRY_<API>_<FIELD>`` by ``RetryPolicies.from_env``.

Two ways to retry exist in Falcon-ES and both use the same ``Backoff`` policy:

- the effect executor and the handlers never block a tick: they record the attempt in
  an event and come back when the next one is due (the attempt count and the limit go
  into the task's Message, "attempt 3 of 12, next in 40s");
- adapters and informers that must retry a call in place (reconnecting a watch, a 429
  on a read) use ``call_with_retry`` with an injected ``sleep``.

The delay is a pure function of the attempt number and an injected ``random.Random``,
so tests and simulations are reproducible.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

T = TypeVar("T")

GKE, COMPUTE, KUBERNETES, PUBSUB = "gke", "compute", "kubernetes", "pubsub"
#: Not an API: the pace of log-driven waits on the world (never given up).
WAIT = "wait"
APIS = (GKE, COMPUTE, KUBERNETES, PUBSUB, WAIT)


class RetryConfigError(ValueError):
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


@dataclasses.dataclass(frozen=True)
class RetryDecision:
    """What a handler records after a failed call: which attempt this was, out of how
    many, and when the next one is due (``None`` when the attempts are used up)."""

    api: str
    attempt: int
    attempts: int | None
    delay_seconds: float | None
    due_at: dt.datetime | None

    @property
    def exhausted(self) -> bool:
        return self.due_at is None

    def describe(self) -> str:
        """The words a Message carries while a task waits on retries."""
        if self.exhausted:
            return f"gave up after {self.attempt} of {self.attempts} attempts"
        limit = f" of {self.attempts}" if self.attempts is not None else ""
        return (f"attempt {self.attempt}{limit} failed, "
                f"next in {self.delay_seconds:.0f}s")


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

#: Environment variable suffix -> Backoff field.
_ENV_FIELDS = MappingProxyType({
    "INITIAL": "initial", "MAX": "maximum", "MULTIPLIER": "multiplier",
    "JITTER": "jitter", "ATTEMPTS": "attempts",
})


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

    def decide(self, api: str, attempt: int, now: dt.datetime, rng: random.Random) -> RetryDecision:
        """After ``attempt`` failed calls to ``api``: when to try again, if at all."""
        backoff = self.for_api(api)
        if backoff.exhausted(attempt):
            return RetryDecision(api, attempt, backoff.attempts, None, None)
        delay = backoff.delay(attempt, rng)
        return RetryDecision(api, attempt, backoff.attempts, delay,
                             now + dt.timedelta(seconds=delay))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetryPolicies:
        """Read ``FALCON_RETRY_<API>_<FIELD>`` overrides, e.g. ``FALCON_RETRY_GKE_MAX=600``
        (fields: INITIAL, MAX, MULTIPLIER, JITTER in seconds or fractions; ATTEMPTS,
        except for WAIT, which is never given up). A bad value raises one
        ``RetryConfigError`` naming the variables at fault."""
        env = os.environ if environ is None else environ
        return cls({api: _backoff_from_env(api, default, env)
                    for api, default in DEFAULT_BACKOFFS.items()})


def seeded_delay(backoff: Backoff, attempt: int, seed: str) -> float:
    """The jittered delay after ``attempt`` failed calls, drawn from a generator seeded
    by ``seed`` (a task, a step and the attempt), so every controller and every replay
    of the log computes the same moment."""
    return backoff.delay(attempt, random.Random(seed))


def _backoff_from_env(api: str, default: Backoff, env: Mapping[str, str]) -> Backoff:
    changes: dict[str, Any] = {}  # field -> value of that field's type
    named: list[str] = []
    for suffix, field in _ENV_FIELDS.items():
        name = f"FALCON_RETRY_{api.upper()}_{suffix}"
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        if field == "attempts" and api in UNLIMITED:
            raise RetryConfigError(f"{name}={raw!r}: {api} retries are never given up; "
                                   "only INITIAL, MAX, MULTIPLIER and JITTER can be set")
        changes[field] = _number(name, raw, whole=field == "attempts")
        named.append(f"{name}={raw}")
    try:
        return dataclasses.replace(default, **changes)
    except RetryConfigError as error:
        raise RetryConfigError(f"{', '.join(named)}: {error}") from None


def _number(name: str, raw: str, *, whole: bool) -> float | int:
    try:
        return int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise RetryConfigError(f"{name}={raw!r}: expected {kind}") from None


class RetriesExhausted(Exception):
    """Every attempt failed; ``last_error`` is the final failure."""

    def __init__(self, api: str, attempts: int, last_error: BaseException) -> None:
        super().__init__(f"{api}: gave up after {attempts} attempts: {last_error}")
        self.api = api
        self.attempts = attempts
        self.last_error = last_error


def call_with_retry(
    call: Callable[[], T],
    *,
    api: str,
    policies: RetryPolicies,
    is_retryable: Callable[[BaseException], bool],
    sleep: Callable[[float], None],
    rng: random.Random,
    on_retry: Callable[[int, float, BaseException], None] | None = None,
) -> T:
    """Call ``call`` until it succeeds, a non-retryable error occurs, or the policy's
    attempts are used up. ``on_retry(attempt, delay, error)`` lets the caller log and
    count each retry (for example into the external-call metrics)."""
    backoff = policies.for_api(api)
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as error:
            if not is_retryable(error):
                raise
            if backoff.exhausted(attempt):
                raise RetriesExhausted(api, attempt, error) from error
            delay = backoff.delay(attempt, rng)
            if on_retry is not None:
                on_retry(attempt, delay, error)
            sleep(delay)
