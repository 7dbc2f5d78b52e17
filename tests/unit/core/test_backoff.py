"""Back-off math: jitter bounds, hint tiers that are never early, and schedules that repeat their last tier."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.backoff import jittered_delay_ms, schedule_delay_ms, tier_for_hint
from retrytopics.core.errors import ConfigError

TIERS = (1_000, 5_000, 30_000, 300_000)


@given(
    delay=st.integers(min_value=0, max_value=10**9),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    seed=st.integers(),
    extra=st.integers(min_value=0, max_value=10**9),
)
def test_jitter_stays_within_its_bounds(delay: int, jitter: float, seed: int, extra: int) -> None:
    max_delay = delay + extra
    got = jittered_delay_ms(delay, jitter=jitter, max_delay_ms=max_delay, rng=random.Random(seed))
    assert 0 <= got <= max_delay
    assert delay * (1 - jitter) - 1 <= got <= delay * (1 + jitter) + 1


@given(delay=st.integers(min_value=0, max_value=10**9), seed=st.integers())
def test_zero_jitter_is_the_identity(delay: int, seed: int) -> None:
    assert jittered_delay_ms(delay, jitter=0.0, max_delay_ms=delay, rng=random.Random(seed)) == delay


def test_jitter_spreads_both_ways_and_is_clamped_at_the_max() -> None:
    rng = random.Random(42)
    draws = {jittered_delay_ms(10_000, jitter=0.5, max_delay_ms=12_000, rng=rng) for _ in range(500)}
    assert min(draws) < 10_000 < max(draws)
    assert max(draws) == 12_000  # anything above the longest tier is clamped onto it


@pytest.mark.parametrize("jitter", [-0.1, 1.1, float("nan")])
def test_jitter_out_of_range_is_refused(jitter: float) -> None:
    with pytest.raises(ConfigError) as info:
        jittered_delay_ms(1000, jitter=jitter, max_delay_ms=1000, rng=random.Random(0))
    assert info.value.field == "jitter"


@pytest.mark.parametrize(
    ("hint", "index"), [(0, 0), (1_000, 0), (1_001, 1), (5_000, 1), (29_999, 2), (300_000, 3), (10**9, 3)]
)
def test_tier_for_hint(hint: int, index: int) -> None:
    assert tier_for_hint(TIERS, hint) == index


@given(st.integers(min_value=0, max_value=TIERS[-1]))
def test_a_hint_within_the_ladder_is_never_early_and_never_wasteful(hint: int) -> None:
    index = tier_for_hint(TIERS, hint)
    assert TIERS[index] >= hint
    assert index == 0 or TIERS[index - 1] < hint


def test_a_hint_beyond_the_longest_tier_is_capped_to_it() -> None:
    assert tier_for_hint(TIERS, TIERS[-1] * 10) == len(TIERS) - 1


def test_schedule_repeats_the_last_delay() -> None:
    schedule = (5_000, 30_000, 300_000)
    assert [schedule_delay_ms(schedule, n) for n in range(1, 7)] == [5_000, 30_000, 300_000, 300_000, 300_000, 300_000]


@pytest.mark.parametrize(("schedule", "n", "field"), [((), 1, "schedule_ms"), ((1,), 0, "reconsume_times")])
def test_schedule_errors_name_the_field(schedule: tuple[int, ...], n: int, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        schedule_delay_ms(schedule, n)
    assert info.value.field == field
    with pytest.raises(ConfigError):
        tier_for_hint((), 5)
