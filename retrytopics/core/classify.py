"""Classification: is a failure retryable, non-retryable or a poison record, and on which schedule?

Pure: standard library only. The verdict is decided in this order, over the failure and its
``__cause__``/``__context__`` chain (cycle-safe, at most :data:`MAX_CHAIN` links):

1. a :class:`~retrytopics.errors.PoisonRecordError` anywhere → ``POISON`` (never retried);
2. a :class:`~retrytopics.errors.NonRetryable` or :class:`~retrytopics.errors.HeaderDecodeError` anywhere →
   ``NON_RETRYABLE``;
3. a :class:`~retrytopics.errors.Retry` anywhere → ``RETRYABLE``, with its ``after`` as the hint;
4. any link matching ``policy.non_retryable`` → ``NON_RETRYABLE`` (it beats ``retryable``);
5. ``policy.retry_if(failure)`` false (or raising) → ``NON_RETRYABLE``;
6. any link matching ``policy.retryable`` → ``RETRYABLE``; otherwise ``NON_RETRYABLE``.

::

    policy = RetryPolicy(non_retryable=(ValueError,))
    classify(policy, RuntimeError("wrapped")).verdict      # Verdict.RETRYABLE
    try:
        raise RuntimeError("wrapped") from ValueError("bad input")
    except RuntimeError as exc:
        classify(policy, exc).verdict                      # Verdict.NON_RETRYABLE
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Final

from retrytopics.core.durations import MAX_DURATION_MS, parse_duration
from retrytopics.core.errors import ConfigError, HeaderDecodeError, NonRetryable, PoisonRecordError, Retry
from retrytopics.core.policy import RetryPolicy

__all__ = [
    "MAX_CHAIN",
    "Classification",
    "Verdict",
    "classify",
    "exception_chain",
    "lone_verdict",
    "plain_classes",
    "retry_after_ms",
]

#: Links of a ``__cause__``/``__context__`` chain that are examined; deeper links are ignored.
MAX_CHAIN: Final = 32
# HTTP's Retry-After carries decimal seconds, and libraries often keep the header as a string.
_SECONDS_TEXT: Final = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")


class Verdict(StrEnum):
    """What the router does with a failure."""

    RETRYABLE = "retryable"
    """Republish to a tier topic (unless attempts or the timeout are used up)."""
    NON_RETRYABLE = "non_retryable"
    """Straight to the DLQ with reason ``non_retryable`` (``invalid_retry_headers`` for a HeaderDecodeError)."""
    POISON = "poison"
    """The record could not be deserialized: straight to the DLQ with reason ``poison``, never retried."""


# Checked in this order, before any policy rule: a poison record is never retried, whatever the policy says.
_SIGNALS: Final[tuple[tuple[tuple[type[BaseException], ...], Verdict], ...]] = (
    ((PoisonRecordError,), Verdict.POISON),
    ((NonRetryable, HeaderDecodeError), Verdict.NON_RETRYABLE),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Classification:
    """The verdict on a failure.

    ``schedule_ms`` is the schedule that applies (empty unless ``RETRYABLE``); ``retry_after_ms`` a hint in
    ms, or None; ``deciding`` the link of the chain that decided the verdict.
    """

    verdict: Verdict
    schedule_ms: tuple[int, ...]
    retry_after_ms: int | None
    deciding: BaseException


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts depth-first (cause before context), each once, at most MAX_CHAIN."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < MAX_CHAIN:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        # Pushed in reverse so that __cause__ is visited before __context__.
        for link in (current.__context__, current.__cause__):
            if link is not None and id(link) not in seen:
                stack.append(link)


def classify(policy: RetryPolicy, exc: BaseException) -> Classification:
    """Classify ``exc`` under ``policy``; see the module docstring for the order of the rules."""
    # most failures are one exception with no cause or context: no chain walk (every failure is classified)
    chain = [exc] if exc.__cause__ is None and exc.__context__ is None else list(exception_chain(exc))
    for kinds, verdict in _SIGNALS:
        found = _first(chain, kinds)
        if found is not None:
            return Classification(verdict=verdict, schedule_ms=(), retry_after_ms=None, deciding=found)
    signal = _first(chain, Retry)
    if signal is not None:
        return _retryable(policy, chain, signal)
    blocked = _first(chain, policy.non_retryable)
    if blocked is not None or not _predicate_allows(policy, exc):
        return Classification(
            verdict=Verdict.NON_RETRYABLE, schedule_ms=(), retry_after_ms=None, deciding=blocked or exc
        )
    allowed = _first(chain, policy.retryable)
    if allowed is None:
        return Classification(verdict=Verdict.NON_RETRYABLE, schedule_ms=(), retry_after_ms=None, deciding=exc)
    return _retryable(policy, chain, allowed)


def _first(
    chain: list[BaseException], kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    for link in chain:
        if isinstance(link, kinds):
            return link
    return None


def _predicate_allows(policy: RetryPolicy, exc: BaseException) -> bool:
    if policy.retry_if is None:
        return True
    try:
        return bool(policy.retry_if(exc))
    except Exception:  # noqa: BLE001 - a broken predicate must not crash the consumer; the DLQ shows the failure
        return False


def _retryable(policy: RetryPolicy, chain: list[BaseException], deciding: BaseException) -> Classification:
    hint = None
    for link in chain:
        hint = retry_after_ms(link, policy.retry_after_attribute)
        if hint is not None:
            break
    return Classification(
        verdict=Verdict.RETRYABLE, schedule_ms=_schedule_for(policy, chain), retry_after_ms=hint, deciding=deciding
    )


def _schedule_for(policy: RetryPolicy, chain: list[BaseException]) -> tuple[int, ...]:
    """The per-exception schedule of the first link with a match, by its most specific (MRO-first) type."""
    if policy.per_exception_ms:
        for link in chain:
            schedule = _own_schedule(policy, type(link))
            if schedule is not None:
                return schedule
    return policy.schedule_ms


def _own_schedule(policy: RetryPolicy, cls: type[BaseException]) -> tuple[int, ...] | None:
    for kind in cls.__mro__:
        schedule = policy.per_exception_ms.get(kind)
        if schedule is not None:
            return schedule
    return None


def _schedule_of(policy: RetryPolicy, cls: type[BaseException]) -> tuple[int, ...]:
    schedule = _own_schedule(policy, cls) if policy.per_exception_ms else None
    return policy.schedule_ms if schedule is None else schedule


def retry_after_ms(exc: BaseException, attribute: str = "retry_after") -> int | None:
    """The retry-after hint ``exc`` carries in ``attribute``, in ms; None if absent or unreadable.

    Accepted: seconds as int/float or as decimal text (HTTP ``Retry-After``), a timedelta, or a duration
    string such as ``"30s"``. Anything else (negative, NaN, garbage) is ignored rather than trusted.
    """
    try:
        value = getattr(exc, attribute, None)
    except Exception:  # noqa: BLE001 - a property that raises is treated as "no hint"
        return None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _seconds(float(value))
    if isinstance(value, str) and _SECONDS_TEXT.fullmatch(value.strip()):
        return _seconds(float(value))
    if isinstance(value, str | timedelta):
        try:
            return parse_duration(value, field=attribute)
        except ConfigError:
            return None
    return None


def _seconds(value: float) -> int | None:
    if not math.isfinite(value) or value < 0:
        return None
    return min(MAX_DURATION_MS, math.ceil(value * 1000))  # ceil: a hint is never shortened


def lone_verdict(policy: RetryPolicy, cls: type[BaseException]) -> tuple[Verdict, tuple[int, ...]]:
    """What `classify` decides for a failure of class `cls` with no cause or context under a `policy` without
    `retry_if`, when every class it names is a plain class (`plain_classes`): the verdict and schedule, which
    then depend on the class alone (the deciding link is the failure itself, and the retry-after hint, which
    is read from the instance, is `retry_after_ms(failure, policy.retry_after_attribute)` when retryable).
    A caller can remember it per class."""
    for kinds, verdict in _SIGNALS:
        if issubclass(cls, kinds):
            return verdict, ()
    if issubclass(cls, Retry) or (not issubclass(cls, policy.non_retryable) and issubclass(cls, policy.retryable)):
        return Verdict.RETRYABLE, _schedule_of(policy, cls)
    return Verdict.NON_RETRYABLE, ()


def plain_classes(policy: RetryPolicy) -> bool:
    """True when `policy` has no `retry_if` and every class it matches failures against is a plain class (its
    metaclass is `type`): `isinstance` on them then asks only the failure's class (`lone_verdict`)."""
    named = (*policy.retryable, *policy.non_retryable, *policy.per_exception_ms)
    return policy.retry_if is None and all(type(c) is type for c in named)
