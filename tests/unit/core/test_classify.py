"""Classification: verdict order, cause/context chains, per-exception schedules and retry-after hints."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.classify import (
    MAX_CHAIN,
    Verdict,
    classify,
    exception_chain,
    lone_verdict,
    plain_classes,
    retry_after_ms,
)
from retrytopics.core.errors import HeaderDecodeError, NonRetryable, PoisonRecordError, Retry
from retrytopics.core.policy import Exponential, RetryPolicy


class RateLimited(Exception):
    def __init__(self, retry_after: object = None) -> None:
        super().__init__("429")
        self.retry_after = retry_after


class SlowDown(RateLimited):
    pass


def chained(outer: BaseException, inner: BaseException, *, cause: bool = True) -> BaseException:
    """``outer`` raised while handling ``inner`` (``from inner`` when cause is True)."""
    try:
        try:
            raise inner
        except BaseException as caught:
            if cause:
                raise outer from caught
            raise outer  # noqa: B904 - the implicit __context__ is what this helper builds
    except BaseException as result:  # noqa: BLE001 - the raised chain is this helper's result
        return result
    raise AssertionError("unreachable")


POLICY = RetryPolicy(non_retryable=(ValueError,), retryable=(OSError, RuntimeError, RateLimited))


def test_plain_retryable_uses_the_default_schedule() -> None:
    c = classify(POLICY, OSError("down"))
    assert c.verdict is Verdict.RETRYABLE
    assert c.schedule_ms == POLICY.schedule_ms and c.retry_after_ms is None


def test_subclasses_match() -> None:
    assert classify(POLICY, ConnectionResetError()).verdict is Verdict.RETRYABLE
    assert classify(POLICY, UnicodeDecodeError("utf-8", b"", 0, 1, "x")).verdict is Verdict.NON_RETRYABLE


def test_unlisted_types_are_not_retried() -> None:
    c = classify(POLICY, KeyError("k"))
    assert c.verdict is Verdict.NON_RETRYABLE and c.schedule_ms == ()


@pytest.mark.parametrize("cause", [True, False])
def test_non_retryable_in_the_chain_beats_a_retryable_wrapper(cause: bool) -> None:
    exc = chained(RuntimeError("wrapper"), ValueError("bad input"), cause=cause)
    c = classify(POLICY, exc)
    assert c.verdict is Verdict.NON_RETRYABLE
    assert isinstance(c.deciding, ValueError)


def test_retryable_cause_under_an_unlisted_wrapper() -> None:
    c = classify(POLICY, chained(KeyError("wrapper"), OSError("disk")))
    assert c.verdict is Verdict.RETRYABLE and isinstance(c.deciding, OSError)


def test_poison_beats_everything() -> None:
    poison = PoisonRecordError("t", 0, 1, b"\xff", ValueError("bad json"))
    c = classify(POLICY, chained(Retry(after="1s"), poison))
    assert c.verdict is Verdict.POISON and c.deciding is poison


def test_non_retryable_signal_and_header_errors() -> None:
    assert classify(POLICY, NonRetryable(OSError("x"))).verdict is Verdict.NON_RETRYABLE
    c = classify(POLICY, HeaderDecodeError("retry.tier", b"x", "bad"))
    assert c.verdict is Verdict.NON_RETRYABLE and isinstance(c.deciding, HeaderDecodeError)


def test_retry_signal_overrides_type_rules_and_carries_its_hint() -> None:
    c = classify(POLICY, chained(Retry(after="45s"), ValueError("would be non-retryable")))
    assert c.verdict is Verdict.RETRYABLE and c.retry_after_ms == 45_000 and isinstance(c.deciding, Retry)


def test_retry_if_false_makes_it_non_retryable_and_a_raising_predicate_too() -> None:
    policy = RetryPolicy(retry_if=lambda e: "transient" in str(e))
    assert classify(policy, OSError("transient glitch")).verdict is Verdict.RETRYABLE
    assert classify(policy, OSError("permanent")).verdict is Verdict.NON_RETRYABLE

    def broken(exc: BaseException) -> bool:
        raise ZeroDivisionError

    assert classify(RetryPolicy(retry_if=broken), OSError()).verdict is Verdict.NON_RETRYABLE


def test_per_exception_schedule_picks_the_most_specific_type() -> None:
    policy = RetryPolicy(
        per_exception={
            RateLimited: ["1m", "10m"],
            SlowDown: Exponential(initial="2m", max_delay="8m", tiers=3),
            Exception: ["1s"],
        }
    )
    assert classify(policy, SlowDown()).schedule_ms == (120_000, 240_000, 480_000)
    assert classify(policy, RateLimited()).schedule_ms == (60_000, 600_000)
    assert classify(policy, OSError()).schedule_ms == (1_000,)
    # found through the chain when the wrapper has no schedule of its own
    only_rate_limited = RetryPolicy(per_exception={RateLimited: ["1m"]})
    assert classify(only_rate_limited, chained(OSError(), RateLimited())).schedule_ms == (60_000,)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (30, 30_000),
        (1.5, 1_500),
        (0.0001, 1),  # rounded up: a hint is never shortened
        ("120", 120_000),  # HTTP Retry-After text
        ("2m", 120_000),
        (timedelta(seconds=3), 3_000),
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        ("soon", None),
        (True, None),
        (object(), None),
        (None, None),
    ],
)
def test_retry_after_attribute(value: object, ms: int | None) -> None:
    assert retry_after_ms(RateLimited(value)) == ms
    assert classify(POLICY, RateLimited(value)).retry_after_ms == ms


def test_custom_hint_attribute_and_a_raising_property() -> None:
    class Custom(Exception):
        wait_for = "5s"

    class Exploding(Exception):
        @property
        def retry_after(self) -> int:
            raise RuntimeError("boom")

    assert classify(RetryPolicy(retry_after_attribute="wait_for"), Custom()).retry_after_ms == 5_000
    assert classify(RetryPolicy(), Exploding()).retry_after_ms is None


def test_chain_walk_is_cycle_safe_and_bounded() -> None:
    a, b = OSError("a"), OSError("b")
    a.__cause__, b.__cause__ = b, a
    assert [str(e) for e in exception_chain(a)] == ["a", "b"]
    head: BaseException = OSError("0")
    current = head
    for i in range(1, 100):
        nxt = OSError(str(i))
        current.__cause__ = nxt
        current = nxt
    current.__cause__ = ValueError("too deep to see")
    assert len(list(exception_chain(head))) == MAX_CHAIN
    assert classify(POLICY, head).verdict is Verdict.RETRYABLE


@given(st.lists(st.sampled_from([OSError, ValueError, KeyError, RuntimeError]), min_size=1, max_size=6))
def test_non_retryable_anywhere_in_a_chain_wins(types: list[type[Exception]]) -> None:
    exc: BaseException = types[0]("0")
    for i, t in enumerate(types[1:], start=1):
        exc = chained(t(str(i)), exc)
    verdict = classify(POLICY, exc).verdict
    if ValueError in types:
        assert verdict is Verdict.NON_RETRYABLE
    elif OSError in types or RuntimeError in types:
        assert verdict is Verdict.RETRYABLE
    else:
        assert verdict is Verdict.NON_RETRYABLE


class _Tagged(Exception, metaclass=type("_Meta", (type,), {})):
    pass


_LONE_CLASSES = [
    RuntimeError,
    ValueError,
    OSError,
    TimeoutError,
    KeyError,
    RateLimited,
    SlowDown,
    Retry,
    NonRetryable,
    PoisonRecordError,
    HeaderDecodeError,
    KeyboardInterrupt,
    _Tagged,
]
_LONE_POLICIES = [
    RetryPolicy(),
    POLICY,
    RetryPolicy(retryable=(OSError,), non_retryable=(TimeoutError,)),
    RetryPolicy(
        delays=["5s", "1m"],
        per_exception={RateLimited: ["30s"], OSError: Exponential(initial="1s", max_delay="8s", tiers=4)},
    ),
    RetryPolicy(retryable=(BaseException,), non_retryable=(_Tagged,)),
]


@given(
    cls=st.sampled_from(_LONE_CLASSES), policy=st.sampled_from(_LONE_POLICIES), hint=st.sampled_from([None, 2, "5s"])
)
def test_a_lone_failure_is_decided_by_its_class_as_classify_decides_it(
    cls: type[BaseException], policy: RetryPolicy, hint: object
) -> None:
    """For a failure with no cause or context under a policy of plain classes without `retry_if`, the verdict
    the router remembers per class (`lone_verdict`, plus the hint read from the instance) is `classify`'s."""
    failure = cls.__new__(cls)
    if isinstance(failure, Retry):
        failure.after = hint  # type: ignore[assignment]
    else:
        failure.retry_after = hint  # type: ignore[attr-defined]
    expected = classify(policy, failure)
    if not plain_classes(policy):
        return
    verdict, schedule = lone_verdict(policy, cls)
    assert (verdict, schedule, expected.deciding) == (expected.verdict, expected.schedule_ms, failure)
    if verdict is Verdict.RETRYABLE:
        assert retry_after_ms(failure, policy.retry_after_attribute) == expected.retry_after_ms
    else:
        assert expected.retry_after_ms is None


def test_a_policy_with_a_predicate_or_an_unusual_class_is_not_decided_by_class() -> None:
    """`retry_if` reads the instance, and a class with its own metaclass may answer `isinstance` from it: such
    policies are classified each time."""
    assert plain_classes(POLICY)
    assert not plain_classes(RetryPolicy(retry_if=lambda exc: True))
    assert not plain_classes(RetryPolicy(non_retryable=(_Tagged,)))
