"""Backoff policy, per-API configuration from the environment, and in-place retries."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falcon_es.config import retry
from falcon_es.config.retry import Backoff, RetryConfigError, RetryPolicies
from falcon_es.config.settings import Settings

NOW = dt.datetime(2026, 11, 1, 9, 0, 0)


def test_base_delay_grows_by_the_multiplier_until_the_cap() -> None:
    backoff = Backoff(initial=1, maximum=10, multiplier=2, jitter=0, attempts=10)
    assert [backoff.base_delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_huge_attempt_numbers_stay_at_the_cap_without_overflow() -> None:
    backoff = Backoff(initial=0.5, maximum=30, multiplier=3, jitter=0.5, attempts=10)
    assert backoff.base_delay(10**6) == 30
    assert Backoff(initial=2, maximum=9, multiplier=1).base_delay(10**9) == 2


def test_zero_jitter_is_exact_and_jitter_is_reproducible_with_a_seed() -> None:
    exact = Backoff(initial=3, maximum=100, multiplier=2, jitter=0)
    assert exact.delay(3, random.Random(1)) == 12
    jittered = Backoff(initial=3, maximum=100, multiplier=2, jitter=0.5)
    first = [jittered.delay(n, random.Random(7)) for n in range(1, 6)]
    second = [jittered.delay(n, random.Random(7)) for n in range(1, 6)]
    assert first == second
    assert any(d != jittered.base_delay(n) for n, d in enumerate(first, start=1))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    initial=st.floats(0.01, 50), factor=st.floats(1, 100), multiplier=st.floats(1, 5),
    jitter=st.floats(0, 1), attempt=st.integers(1, 10_000), seed=st.integers(0, 2**32),
)
def test_jittered_delay_stays_within_the_spread_and_below_the_cap(
    initial: float, factor: float, multiplier: float, jitter: float, attempt: int, seed: int,
) -> None:
    backoff = Backoff(initial=initial, maximum=initial * factor, multiplier=multiplier,
                      jitter=jitter, attempts=5)
    base = backoff.base_delay(attempt)
    delay = backoff.delay(attempt, random.Random(seed))
    assert initial <= base <= backoff.maximum
    assert base * (1 - jitter) - 1e-9 <= delay <= min(backoff.maximum, base * (1 + jitter)) + 1e-9


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"initial": 0}, "initial=0 must be positive"),
        ({"initial": 5, "maximum": 1}, "max=1 must be at least initial=5"),
        ({"multiplier": 0.5}, "multiplier=0.5 must be at least 1"),
        ({"jitter": 1.5}, "jitter=1.5 must be between 0 and 1"),
        ({"attempts": 0}, "attempts=0 must be at least 1"),
    ],
)
def test_impossible_backoffs_are_refused_with_the_field_named(fields: dict, words: str) -> None:
    with pytest.raises(RetryConfigError, match=words):
        Backoff(**fields)


def test_attempts_count_the_first_call() -> None:
    backoff = Backoff(attempts=3)
    assert not backoff.exhausted(1)
    assert not backoff.exhausted(2)
    assert backoff.exhausted(3)


def test_every_external_api_and_the_waits_have_a_default_policy() -> None:
    policies = RetryPolicies()
    assert set(policies.backoffs) == {"gke", "compute", "kubernetes", "pubsub", "wait"}
    assert policies.for_api("gke").maximum >= policies.for_api("kubernetes").maximum
    wait = policies.for_api("wait")
    assert wait.attempts is None and not wait.exhausted(10**9)
    assert wait.base_delay(10**9) == wait.maximum


def test_a_backoff_without_attempts_is_never_exhausted_and_stays_at_the_cap() -> None:
    never = Backoff(initial=10, maximum=300, jitter=0, attempts=None)
    assert not never.exhausted(40)
    assert never.delay(40, random.Random(0)) == 300


def test_an_unknown_api_is_named_in_the_error() -> None:
    with pytest.raises(RetryConfigError, match="no retry policy for API 'storage'"):
        RetryPolicies().for_api("storage")


def test_environment_overrides_one_api_and_leaves_the_others() -> None:
    policies = Settings.from_env({
        "FALCON_RETRY_GKE_INITIAL": "2.5", "FALCON_RETRY_GKE_MAX": "600",
        "FALCON_RETRY_GKE_ATTEMPTS": "20", "FALCON_RETRY_GKE_JITTER": "0",
        "FALCON_RETRY_PUBSUB_MULTIPLIER": "3", "FALCON_RETRY_COMPUTE_MAX": "",
    }).retry
    assert policies.for_api("gke") == Backoff(2.5, 600, 2.0, 0.0, 20)
    assert policies.for_api("pubsub").multiplier == 3
    assert policies.for_api("compute") == retry.DEFAULT_BACKOFFS["compute"]
    assert policies.for_api("kubernetes") == retry.DEFAULT_BACKOFFS["kubernetes"]


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"FALCON_RETRY_GKE_ATTEMPTS": "many"},
         "FALCON_RETRY_GKE_ATTEMPTS='many': expected a whole number"),
        ({"FALCON_RETRY_KUBERNETES_JITTER": "lots"},
         "FALCON_RETRY_KUBERNETES_JITTER='lots': expected a number"),
        ({"FALCON_RETRY_COMPUTE_MAX": "1", "FALCON_RETRY_COMPUTE_INITIAL": "5"},
         "FALCON_RETRY_COMPUTE_INITIAL=5, FALCON_RETRY_COMPUTE_MAX=1: backoff: max=1.0 must "
         "be at least initial=5.0"),
        ({"FALCON_RETRY_WAIT_INITIAL": "0"},
         "FALCON_RETRY_WAIT_INITIAL=0: backoff: initial=0.0 must be positive"),
        ({"FALCON_RETRY_WAIT_ATTEMPTS": "3"},
         "FALCON_RETRY_WAIT_ATTEMPTS='3': wait retries are never given up"),
    ],
)
def test_bad_environment_values_name_the_variable(environ: dict, words: str) -> None:
    with pytest.raises(RetryConfigError, match=words):
        Settings.from_env(environ).retry


def test_a_policy_set_must_cover_every_api() -> None:
    with pytest.raises(RetryConfigError, match="no backoff for compute, kubernetes, pubsub"):
        RetryPolicies({"gke": Backoff()})
