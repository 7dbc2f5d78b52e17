"""The due-time rules the router writes by and the tier consumers read by (retrytopics/due.py): the header
checks accept a tier record due up to the tier's delay x (1 + jitter) + the clock-skew allowance ahead, so
a consumer waits at most the tier's longest delay from when it first saw the record: due = min(due_at,
first seen + longest). A record the app wrote is never due later than that on one clock, so it is never
made early.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.due import bounded_due_ms
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import RouteContext, tier_wait_bounds_ms

NOW = 1_700_000_000_000
POLICY = RetryPolicy(delays=["1s", "30s"], jitter=0.1)
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
TIER = CTX.topics.tiers[0].topic


def test_the_longest_wait_is_the_tier_delay_with_the_most_jitter() -> None:
    assert tier_wait_bounds_ms(CTX) == {TIER: 1_100, CTX.topics.tiers[1].topic: 33_000}


@settings(max_examples=300, deadline=None)
@given(failed_ago=st.integers(0, 5_000), delay=st.integers(0, 1_100), seen_after=st.integers(0, 5_000))
def test_a_record_written_by_the_app_is_never_made_early(failed_ago: int, delay: int, seen_after: int) -> None:
    # given: one clock; the record failed `failed_ago` ms before now and is due at most `longest` after that
    failed_at = NOW - failed_ago
    due_at = failed_at + delay
    # when: the consumer first sees it at any time after it was written (after its failure)
    seen = max(NOW, failed_at) + seen_after
    # then: its own due time stands
    assert bounded_due_ms(due_at, first_seen_ms=seen, longest_ms=1_100) == due_at


def test_a_forged_due_time_waits_one_longest_delay_from_first_sight() -> None:
    assert bounded_due_ms(NOW + 60_000, first_seen_ms=NOW, longest_ms=1_100) == NOW + 1_100
