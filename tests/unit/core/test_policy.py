"""RetryPolicy, Exponential and InProcessRetry: normalised, validated, every error naming its field."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.errors import ConfigError
from retrytopics.core.policy import (
    MAX_TIERS,
    ROCKETMQ_LEVELS,
    UNLIMITED,
    Exponential,
    InProcessRetry,
    RetryPolicy,
)


class RateLimited(Exception):
    pass


def test_defaults() -> None:
    policy = RetryPolicy()
    assert policy.schedule_ms == (5_000, 30_000, 300_000)
    assert policy.tier_delays_ms == (5_000, 30_000, 300_000)
    assert policy.max_delay_ms == 300_000
    assert policy.timeout_ms is None
    assert policy.max_retries_for(policy.schedule_ms) == 3


def test_lists_are_normalised_to_tuples_and_the_policy_is_hashable() -> None:
    policy = RetryPolicy(
        delays=["1s", timedelta(seconds=5)],
        retryable=[OSError],  # type: ignore[arg-type]  # lists are accepted at run time, as YAML/TOML give them
        non_retryable=[ValueError],  # type: ignore[arg-type]
    )
    assert policy.delays == ("1s", timedelta(seconds=5))
    assert policy.retryable == (OSError,) and policy.non_retryable == (ValueError,)
    same = RetryPolicy(delays=("1s", timedelta(seconds=5)), retryable=(OSError,), non_retryable=(ValueError,))
    assert policy == same and hash(policy) == hash(same)


def test_tiers_are_the_distinct_delays_of_every_schedule_ascending() -> None:
    policy = RetryPolicy(
        delays=["30s", "5s", "30s"],
        per_exception={RateLimited: Exponential(initial="1m", max_delay="4m", tiers=5), TimeoutError: ["5s"]},
    )
    assert policy.tier_delays_ms == (5_000, 30_000, 60_000, 120_000, 240_000)
    assert policy.per_exception_ms[RateLimited] == (60_000, 120_000, 240_000, 240_000, 240_000)
    assert policy.max_reconsume_times == 5


def test_exponential_ladder_caps_and_repeats() -> None:
    ladder = Exponential(initial="1s", multiplier=2.0, max_delay="10s", tiers=6)
    assert ladder.delays_ms() == (1_000, 2_000, 4_000, 8_000, 10_000, 10_000)
    assert RetryPolicy(delays=ladder).tier_delays_ms == (1_000, 2_000, 4_000, 8_000, 10_000)


@given(
    initial=st.integers(min_value=1, max_value=10**6),
    factor=st.integers(min_value=1, max_value=1000),
    multiplier=st.floats(min_value=1.0, max_value=100.0),
    tiers=st.integers(min_value=1, max_value=MAX_TIERS),
)
def test_exponential_is_non_decreasing_capped_and_sized(
    initial: int, factor: int, multiplier: float, tiers: int
) -> None:
    cap = initial * factor
    ladder = Exponential(initial=f"{initial}ms", multiplier=multiplier, max_delay=f"{cap}ms", tiers=tiers)
    delays = ladder.delays_ms()
    assert len(delays) == tiers and delays[0] == initial
    assert all(a <= b <= cap for a, b in itertools.pairwise(delays))


def test_rocketmq_preset() -> None:
    assert ROCKETMQ_LEVELS == tuple("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".split())
    policy = RetryPolicy.rocketmq(jitter=0.1)
    assert len(policy.tier_delays_ms) == 18 and policy.max_delay_ms == 7_200_000 and policy.jitter == 0.1
    assert sum(policy.schedule_ms) == 17_146_000  # 4h45m46s in total
    with pytest.raises(ConfigError) as info:
        RetryPolicy.rocketmq(max_retry=3)
    assert info.value.field == "max_retry"


@pytest.mark.parametrize(("value", "expected"), [(None, 3), (0, 0), (7, 7), (UNLIMITED, None)])
def test_max_retries_semantics(value: int | str | None, expected: int | None) -> None:
    policy = RetryPolicy(max_retries=value)  # type: ignore[arg-type]
    assert policy.max_retries_for(policy.schedule_ms) == expected
    assert policy.max_reconsume_times == expected


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delays": ["5s", "30s", 5]}, "delays[2]"),
        ({"delays": "5s"}, "delays"),
        ({"delays": []}, "delays"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_retries": "forever"}, "max_retries"),
        ({"timeout": "soon"}, "timeout"),
        ({"timeout": "1s"}, "timeout"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": float("nan")}, "jitter"),
        ({"jitter": "0.1"}, "jitter"),
        ({"retryable": [ValueError, "KeyError"]}, "retryable[1]"),
        ({"non_retryable": [int]}, "non_retryable[0]"),
        ({"retry_if": 3}, "retry_if"),
        ({"per_exception": {TimeoutError: ["1s", "x"]}}, "per_exception[TimeoutError][1]"),
        ({"per_exception": {TimeoutError: []}}, "per_exception[TimeoutError]"),
        ({"per_exception": {"TimeoutError": ["1s"]}}, "per_exception"),
        ({"per_exception": [TimeoutError]}, "per_exception"),
        ({"in_process": 3}, "in_process"),
        ({"retry_after_attribute": "retry-after"}, "retry_after_attribute"),
        ({"delays": [f"{i + 1}s" for i in range(MAX_TIERS + 1)]}, "delays"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)
    assert info.value.field == field
    assert info.value.reason
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial": "0s", "max_delay": "1s", "tiers": 2}, "initial"),
        ({"initial": "2s", "max_delay": "1s", "tiers": 2}, "max_delay"),
        ({"initial": "1s", "max_delay": "1m", "tiers": 0}, "tiers"),
        ({"initial": "1s", "max_delay": "1m", "tiers": 2, "multiplier": 0.5}, "multiplier"),
        ({"initial": "1s", "max_delay": "1m", "tiers": 2, "multiplier": float("inf")}, "multiplier"),
        ({"initial": 1, "max_delay": "1m", "tiers": 2}, "initial"),
    ],
)
def test_exponential_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Exponential(**kwargs)
    assert info.value.field == field


def test_in_process_fits_or_names_the_numbers() -> None:
    retry = InProcessRetry(attempts=3, wait="100ms")
    retry.check_fits(300_000, handler_budget_ms=10_000)  # 3 * 10.1 s = 30.3 s < 300 s
    with pytest.raises(ConfigError) as info:
        retry.check_fits(30_000, handler_budget_ms=10_000)
    assert info.value.field == "in_process"
    assert "30300" in info.value.reason and "max.poll.interval.ms=30000" in info.value.reason


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"attempts": 0}, "in_process.attempts"), ({"wait": 100}, "in_process.wait")]
)
def test_in_process_validation(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        InProcessRetry(**kwargs)
    assert info.value.field == field


def test_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.jitter = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.per_exception[KeyError] = ["1s"]  # type: ignore[index]
