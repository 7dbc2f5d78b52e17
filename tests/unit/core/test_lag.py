"""Lag in seconds from sampled end offsets (retrytopics/core/lag.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.lag import MAX_SAMPLES, EndOffsetSamples


def test_nothing_unhandled_is_no_lag() -> None:
    samples = EndOffsetSamples()
    samples.add(10, 1_000)
    assert samples.lag_ms(10, 9_000) == 0
    assert EndOffsetSamples().lag_ms(0, 9_000) == 0


def test_the_append_time_is_interpolated_between_the_samples_around_the_record() -> None:
    # setup: the end went from 10 at t=1 s to 20 at t=2 s
    samples = EndOffsetSamples()
    samples.add(10, 1_000)
    samples.add(20, 2_000)
    # then: offset 14 (the end passed 15) was appended at 1.5 s
    assert samples.lag_ms(14, 5_000) == 3_500
    # and the last record sampled, at 2 s
    assert samples.lag_ms(19, 5_000) == 3_000


def test_a_record_older_than_every_sample_is_at_least_as_old_as_the_oldest() -> None:
    samples = EndOffsetSamples()
    samples.add(10, 1_000)
    samples.add(12, 2_000)
    assert samples.lag_ms(3, 5_000) == 4_000


def test_a_still_partition_keeps_one_sample_and_the_samples_are_bounded() -> None:
    samples = EndOffsetSamples()
    for t in range(5):
        samples.add(7, t * 1_000)
    assert list(samples.samples) == [(7, 0)]
    for end in range(MAX_SAMPLES + 50):
        samples.add(end + 8, end)
    assert len(samples.samples) == MAX_SAMPLES


@given(
    steps=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 5_000)), min_size=1, max_size=30),
    start=st.integers(0, 2_000),
)
def test_the_lag_is_never_negative_and_shrinks_as_the_consumer_reads_on(
    steps: list[tuple[int, int]], start: int
) -> None:
    samples = EndOffsetSamples()
    end, now = 0, 0
    for grow, wait in steps:
        end, now = end + grow, now + wait
        samples.add(end, now)
    lags = [samples.lag_ms(offset, now) for offset in range(start, end + 2)]
    assert all(lag >= 0 for lag in lags)
    assert lags == sorted(lags, reverse=True)
