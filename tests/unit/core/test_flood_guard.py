"""The flood guard's rules (retrytopics/core/flood_guard.py): an outage opens it, a bad record among successes
never does, it probes after a growing back-off, closes on successful probes and ramps up."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.errors import ConfigError
from retrytopics.core.flood_guard import FloodBreaker, FloodGuard, GuardState, Outcome

GUARD = FloodGuard(failure_ratio=0.5, min_calls=20, window="10s", backoff="1s", max_backoff="8s", jitter=0.0)


def _breaker(guard: FloodGuard = GUARD, seed: int = 1) -> FloodBreaker:
    return FloodBreaker(guard, rng=random.Random(seed))


def _call(breaker: FloodBreaker, outcome: Outcome, now_ms: int) -> bool:
    admission = breaker.admit(now_ms)
    if admission.call:
        breaker.record(outcome, now_ms, probe=admission.probe)
    return admission.call


def test_an_outage_opens_it_once_the_window_holds_enough_calls() -> None:
    breaker = _breaker()
    for i in range(19):
        assert _call(breaker, Outcome.RETRYABLE, 1_000 + i)
    assert breaker.state is GuardState.CLOSED  # 19 < min_calls
    assert _call(breaker, Outcome.RETRYABLE, 1_019)
    assert breaker.state is GuardState.OPEN and breaker.opened_at_ms == 1_019
    assert not breaker.admit(1_500).call and breaker.refused == 1


@given(
    successes_per_failure=st.integers(min_value=2, max_value=50),
    calls=st.integers(min_value=20, max_value=2_000),
    spacing_ms=st.integers(min_value=0, max_value=500),
)
@settings(max_examples=60, deadline=None)
def test_a_bad_record_among_successes_never_opens_it(successes_per_failure: int, calls: int, spacing_ms: int) -> None:
    # one record failing on every attempt, or any failure share below the ratio, with the calls spread in time
    breaker = _breaker()
    for i in range(calls):
        outcome = Outcome.RETRYABLE if i % (successes_per_failure + 1) == 0 else Outcome.SUCCESS
        assert _call(breaker, outcome, i * spacing_ms)
    assert breaker.state is GuardState.CLOSED


def test_terminal_failures_never_count_however_many() -> None:
    breaker = _breaker()
    for i in range(1_000):
        assert _call(breaker, Outcome.TERMINAL, i)
    assert breaker.state is GuardState.CLOSED


def test_failures_older_than_the_window_are_forgotten() -> None:
    breaker = _breaker()
    for i in range(15):
        _call(breaker, Outcome.RETRYABLE, i)
    for i in range(10):  # 11 s later: the first 15 left the window
        _call(breaker, Outcome.RETRYABLE, 11_000 + i)
    assert breaker.state is GuardState.CLOSED


def _open(breaker: FloodBreaker, at_ms: int = 0) -> int:
    for i in range(GUARD.min_calls):
        _call(breaker, Outcome.RETRYABLE, at_ms + i)
    assert breaker.state is GuardState.OPEN
    return at_ms + GUARD.min_calls - 1


def test_it_probes_once_after_the_back_off_and_a_failed_probe_doubles_it_up_to_the_bound() -> None:
    breaker = _breaker()
    now = _open(breaker)
    waits = []
    for _ in range(6):
        retry_at = breaker._retry_at_ms
        waits.append(retry_at - now)
        assert not breaker.admit(retry_at - 1).call
        probe = breaker.admit(retry_at)
        assert probe.call and probe.probe
        assert not breaker.admit(retry_at).call  # one probe at a time
        breaker.record(Outcome.RETRYABLE, retry_at, probe=True)
        now = retry_at
    assert waits == [1_000, 2_000, 4_000, 8_000, 8_000, 8_000]


def test_successful_probes_close_it_and_the_rate_ramps_up() -> None:
    guard = FloodGuard(min_calls=20, backoff="1s", jitter=0.0, probes=2, ramp="10s", ramp_start=5.0)
    breaker = _breaker(guard)
    now = _open(breaker) + 1_000
    for _ in range(2):
        probe = breaker.admit(now)
        assert probe.call and probe.probe
        breaker.record(Outcome.SUCCESS, now, probe=True)
    assert breaker.state is GuardState.CLOSED
    admitted_first_second = sum(breaker.admit(now + t).call for t in range(0, 1_000, 10))
    assert 3 <= admitted_first_second <= 10  # about ramp_start calls a second, never everything at once
    admitted_later = sum(breaker.admit(now + 9_000 + t).call for t in range(0, 1_000, 10))
    assert admitted_later > 50
    assert all(breaker.admit(now + 10_000 + t).call for t in range(100))  # the ramp is over


def test_a_failure_ratio_while_ramping_opens_it_with_a_longer_back_off() -> None:
    guard = FloodGuard(min_calls=20, backoff="1s", max_backoff="1m", jitter=0.0, ramp="10s", ramp_start=1_000.0)
    breaker = _breaker(guard)
    now = _open(breaker) + 1_000
    breaker.admit(now)
    breaker.record(Outcome.SUCCESS, now, probe=True)
    for i in range(20):
        _call(breaker, Outcome.RETRYABLE, now + 100 + i)
    assert breaker.state is GuardState.OPEN
    assert breaker._retry_at_ms - (now + 119) == 2_000


def test_the_dead_letter_budget_opens_it_without_a_failure_ratio() -> None:
    def three_dead_letters() -> FloodBreaker:
        breaker = _breaker(FloodGuard(min_calls=1_000, dead_letters_per_minute=3))
        for i in range(3):
            _call(breaker, Outcome.EXHAUSTED, i * 1_000)
            _call(breaker, Outcome.SUCCESS, i * 1_000 + 1)
        assert breaker.state is GuardState.CLOSED  # 3 is the budget, not over it
        return breaker

    assert [t.reason for t in three_dead_letters().record(Outcome.EXHAUSTED, 59_000)] == ["dead_letters"]
    forgetting = three_dead_letters()
    assert forgetting.record(Outcome.EXHAUSTED, 62_500) == []  # the first three left the minute


def test_opened_by_hand_it_stays_open_until_closed_by_hand() -> None:
    breaker = _breaker()
    breaker.force_open(0, "operator: gateway maintenance")
    assert not any(breaker.admit(t).call for t in range(0, 600_000, 1_000))
    assert breaker.force_close(600_000, "operator: done").state is GuardState.CLOSED
    assert breaker.admit(600_000).call


def test_a_cancelled_probe_lets_the_next_call_probe() -> None:
    breaker = _breaker()
    now = _open(breaker) + 1_000
    assert breaker.admit(now).probe
    breaker.cancel_probe()
    assert breaker.admit(now).probe


@given(
    outcomes=st.lists(
        st.tuples(st.sampled_from(list(Outcome)), st.integers(min_value=0, max_value=3_000)), max_size=400
    ),
    seed=st.integers(min_value=0, max_value=2**16),
)
@settings(max_examples=80, deadline=None)
def test_open_never_admits_before_its_back_off_and_half_open_one_probe_at_a_time(
    outcomes: list[tuple[Outcome, int]], seed: int
) -> None:
    guard = FloodGuard(min_calls=5, backoff="1s", max_backoff="4s", jitter=0.2)
    breaker = FloodBreaker(guard, rng=random.Random(seed))
    now = 0
    for outcome, step in outcomes:
        now += step
        state, retry_at = breaker.state, breaker._retry_at_ms
        admission = breaker.admit(now)
        if state is GuardState.OPEN and now < retry_at:
            assert not admission.call
        if admission.call:
            assert admission.probe == (breaker.state is GuardState.HALF_OPEN)
            breaker.record(outcome, now, probe=admission.probe)
        if breaker.state is GuardState.OPEN:
            assert 1 <= breaker._retry_at_ms - now <= 4_000 * 1.2 + 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_ratio", 0.0),
        ("failure_ratio", 1.5),
        ("min_calls", 0),
        ("probes", 0),
        ("jitter", -0.1),
        ("window", "5ms"),
        ("backoff", "0s"),
        ("max_backoff", "100ms"),
        ("dead_letters_per_minute", -1),
        ("ramp_start", 0),
    ],
)
def test_a_bad_setting_fails_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as raised:
        FloodGuard(**{field: value})  # type: ignore[arg-type]
    assert raised.value.field == field
