"""Durations with explicit units: ``"500ms"``, ``"5s"``, ``"2m"``, ``"1h30m"`` or a :class:`~datetime.timedelta`.

Pure: standard library only. Every duration in retrytopics is an ``int`` number of milliseconds inside,
and a string with a unit outside, because a bare number is ambiguous::

    >>> parse_duration("1h30m", field="timeout")
    5400000
    >>> format_duration(5_400_000)
    '1h30m'

ActiveMQ's ``initialRedeliveryDelay=1`` means 1 millisecond; users who read it as 1 second lost messages to an
instant redelivery storm. retrytopics refuses ``1`` and asks for ``"1s"`` or ``"1ms"``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final, TypeAlias

from retrytopics.core.errors import ConfigError

__all__ = ["MAX_DURATION_MS", "DurationLike", "format_duration", "parse_duration"]

#: What a policy accepts wherever it asks for a duration.
DurationLike: TypeAlias = str | timedelta

#: Unit suffixes, largest first; a compound string must use them in this order, each at most once.
_UNITS: Final[tuple[tuple[str, int], ...]] = (
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)
_UNIT_MS: Final[dict[str, int]] = dict(_UNITS)
_UNIT_RANK: Final[dict[str, int]] = {unit: rank for rank, (unit, _) in enumerate(_UNITS)}
# "ms" before "m" and "s" so that the alternation never splits "ms" into "m" + garbage.
_PART: Final = re.compile(r"([0-9]{1,12})(ms|d|h|m|s)")
_BARE_NUMBER: Final = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")

#: Upper bound of any duration (100 years): keeps arithmetic on due times far from overflow in Java readers
#: (epoch ms + delay must fit a signed 64-bit long) and catches typos such as "5000000d".
MAX_DURATION_MS: Final = 100 * 365 * 86_400_000
_MAX_TEXT: Final = 64

_BARE_REASON: Final = (
    "a duration needs a unit (ms, s, m, h or d), e.g. '1s' or '1500ms'; bare numbers are refused because "
    "they are ambiguous: ActiveMQ's initialRedeliveryDelay=1 meant 1 millisecond, not 1 second, and "
    "users lost messages to an instant redelivery storm"
)


def parse_duration(value: DurationLike, *, field: str) -> int:
    """Return ``value`` in milliseconds (``>= 0``); raise :class:`ConfigError` naming ``field`` otherwise.

    Accepts a :class:`~datetime.timedelta` (whole milliseconds) or a string of one or more
    ``<integer><unit>`` parts, largest unit first, each unit at most once::

        parse_duration("500ms", field="x")   # 500
        parse_duration("1h30m", field="x")   # 5400000
        parse_duration(5, field="x")         # ConfigError: a duration needs a unit ...
    """
    if isinstance(value, timedelta):
        return _from_timedelta(value, field)
    if isinstance(value, bool) or not isinstance(value, str):
        if isinstance(value, int | float):
            raise ConfigError(field, value, _BARE_REASON)
        raise ConfigError(field, value, "expected a duration string such as '5s' or a datetime.timedelta")
    return _from_text(value, field)


def _from_timedelta(value: timedelta, field: str) -> int:
    if value < timedelta(0):
        raise ConfigError(field, value, "a duration cannot be negative")
    if value.microseconds % 1000:
        raise ConfigError(field, value, "durations have millisecond precision; round the timedelta")
    ms = value // timedelta(milliseconds=1)
    return _bounded(ms, value, field)


def _from_text(value: str, field: str) -> int:
    text = value.strip()
    if not text or len(text) > _MAX_TEXT:
        raise ConfigError(field, value, f"expected 1..{_MAX_TEXT} characters such as '5s' or '1h30m'")
    if _BARE_NUMBER.fullmatch(text):
        raise ConfigError(field, value, _BARE_REASON)
    total, position, last_rank = 0, 0, -1
    for part in _PART.finditer(text):
        if part.start() != position:
            break
        rank = _UNIT_RANK[part.group(2)]
        if rank <= last_rank:
            raise ConfigError(field, value, "units must go from largest to smallest, each once (e.g. '1h30m')")
        total += int(part.group(1)) * _UNIT_MS[part.group(2)]
        position, last_rank = part.end(), rank
    if position != len(text):
        raise ConfigError(
            field, value, "expected whole numbers with units ms, s, m, h or d, e.g. '500ms', '5s', '1h30m'"
        )
    return _bounded(total, value, field)


def _bounded(ms: int, value: object, field: str) -> int:
    if ms > MAX_DURATION_MS:
        raise ConfigError(field, value, f"longer than the 100-year limit ({MAX_DURATION_MS} ms)")
    return ms


def format_duration(ms: int) -> str:
    """The canonical, topic-name-safe spelling of ``ms``; ``parse_duration`` reads it back exactly.

    Largest units first, zero parts left out::

        format_duration(500)        # '500ms'
        format_duration(120_000)    # '2m'
        format_duration(90_500)     # '1m30s500ms'
        format_duration(0)          # '0ms'
    """
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= MAX_DURATION_MS:
        raise ConfigError("duration", ms, f"expected an int number of milliseconds in 0..{MAX_DURATION_MS}")
    if ms == 0:
        return "0ms"
    parts: list[str] = []
    rest = ms
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
