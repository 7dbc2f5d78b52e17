"""Durations: explicit units in, milliseconds out; bare numbers refused with the reason why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.durations import MAX_DURATION_MS, format_duration, parse_duration
from retrytopics.core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("5s", 5_000),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("1m30s500ms", 90_500),
        ("0s", 0),
        (" 5s ", 5_000),
    ],
)
def test_parses_units_and_compounds(text: str, ms: int) -> None:
    assert parse_duration(text, field="delay") == ms


def test_accepts_timedelta() -> None:
    assert parse_duration(timedelta(minutes=2, milliseconds=5), field="delay") == 120_005


@pytest.mark.parametrize("bare", [1, 1.5, "5", "1.5", "-3", "1e3"])
def test_bare_number_is_refused_and_the_error_says_why(bare: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(bare, field="delays[0]")  # type: ignore[arg-type]
    assert info.value.field == "delays[0]"
    assert info.value.value == bare
    assert "unit" in info.value.reason and "ActiveMQ" in info.value.reason and "1 millisecond" in info.value.reason


@pytest.mark.parametrize(
    "bad",
    ["", "5 s", "5S", "1.5s", "5x", "30m1h", "1m1m", "s", "-5s", "5s-", "1" * 65, "5000000000d"],
)
def test_malformed_strings_name_the_field_and_value(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(bad, field="timeout")
    assert info.value.field == "timeout"
    assert info.value.value == bad


@pytest.mark.parametrize("bad", [timedelta(seconds=-1), timedelta(microseconds=1500), None, True, ["5s"]])
def test_other_invalid_values(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(bad, field="wait")  # type: ignore[arg-type]
    assert info.value.field == "wait"


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0ms"), (500, "500ms"), (5_000, "5s"), (120_000, "2m"), (5_400_000, "1h30m"), (90_500, "1m30s500ms")],
)
def test_format_is_canonical(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@pytest.mark.parametrize("bad", [-1, MAX_DURATION_MS + 1, True, 1.0])
def test_format_rejects_out_of_range(bad: object) -> None:
    with pytest.raises(ConfigError):
        format_duration(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=MAX_DURATION_MS))
def test_format_parse_round_trip_and_topic_safe(ms: int) -> None:
    text = format_duration(ms)
    assert parse_duration(text, field="x") == ms
    assert text.isascii() and text.isalnum()


@given(st.text(max_size=30))
def test_parse_is_total_on_arbitrary_text(text: str) -> None:
    try:
        ms = parse_duration(text, field="x")
    except ConfigError as error:
        assert error.field == "x"
    else:
        assert 0 <= ms <= MAX_DURATION_MS
