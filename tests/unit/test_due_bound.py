"""The head-of-line cost of a forged or skewed due time is bounded (issue 15.3, runtime/waiting.py).

The header checks accept a tier record due up to the tier's delay × (1 + jitter) + the clock-skew allowance
(60 s) ahead, so one forged record used to hold a 1 s tier's partition for about 61 s. A tier consumer now
waits at most the tier's longest delay from when it first saw the record: due = min(due_at, first seen +
longest). A record the app wrote is never due later than that on one clock, so it is never made early.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.router import RouteContext, tier_wait_bounds_ms
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.waiting import PauseController

NOW = 1_700_000_000_000
POLICY = RetryPolicy(delays=["1s", "30s"], jitter=0.1)
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
TIER = CTX.topics.tiers[0].topic


class Consumer:
    def pause(self, tps: object) -> None: ...
    def resume(self, tps: object) -> None: ...
    def seek(self, tp: object, offset: int) -> None: ...


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[Event, Mapping[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.seen.append((event, dict(data)))


def _controller() -> tuple[PauseController, Events]:
    events = Events()
    return PauseController(Consumer(), Emitter([events]), consumer_name="tier", max_records=4), events  # type: ignore[arg-type]


def _msg(offset: int) -> Message:
    return Message(TIER, 0, offset, NOW, None, b"v", (), None)


def test_the_longest_wait_is_the_tier_delay_with_the_most_jitter() -> None:
    assert tier_wait_bounds_ms(CTX) == {TIER: 1_100, CTX.topics.tiers[1].topic: 33_000}


def test_a_forged_due_time_costs_at_most_one_tier_delay_from_first_sight() -> None:
    # given: a record on the 1 s tier claiming to be due 51 s from now (within the 60 s skew allowance)
    pauses, events = _controller()
    forged = NOW + 1_100 + 50_000
    # when: first seen now, then seen again after the partition resumed
    first = pauses.bounded_due(_msg(7), forged, 1_100, NOW)
    again = pauses.bounded_due(_msg(7), forged, 1_100, NOW + 1_100)
    # then: due one tier delay after it was first seen, and the clamp is reported once
    assert first == again == NOW + 1_100
    clamped = [data for event, data in events.seen if event is Event.DUE_CLAMPED]
    assert clamped == [
        {"consumer": "tier", "topic": TIER, "partition": 0, "offset": 7, "due_at": forged, "clamped_to": NOW + 1_100}
    ]


@settings(max_examples=300, deadline=None)
@given(failed_ago=st.integers(0, 5_000), delay=st.integers(0, 1_100), seen_after=st.integers(0, 5_000))
def test_a_record_written_by_the_app_is_never_made_early(failed_ago: int, delay: int, seen_after: int) -> None:
    # given: one clock; the record failed `failed_ago` ms before now and is due at most `longest` after that
    failed_at = NOW - failed_ago
    due_at = failed_at + delay
    # when: the consumer first sees it at any time after it was written (after its failure)
    seen = max(NOW, failed_at) + seen_after
    pauses, events = _controller()
    # then: its own due time stands, and nothing is reported
    assert pauses.bounded_due(_msg(1), due_at, 1_100, seen) == due_at
    assert not events.seen


def test_first_sightings_are_bounded_and_forgotten_with_the_partition() -> None:
    pauses, _ = _controller()
    for offset in range(20):
        pauses.bounded_due(_msg(offset), NOW + 60_000, 1_100, NOW + offset)
    assert pauses.bounded_due(_msg(19), NOW + 60_000, 1_100, NOW + 99_999) == NOW + 19 + 1_100
    assert len(pauses._first_seen[(TIER, 0)]) <= pauses.max_records + 1
    pauses.drop([(TIER, 0)])
    assert (TIER, 0) not in pauses._first_seen
