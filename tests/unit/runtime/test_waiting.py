"""Waiting (runtime/waiting.py) bounds the head-of-line cost of a forged or skewed due time: a tier consumer
waits at most the tier's longest delay from when it first saw a record (the rule is retrytopics/due.py's,
tested in tests/unit/test_due.py), reports the clamp once, and remembers a bounded number of first sightings
per partition, forgotten with the partition.
"""

from __future__ import annotations

from collections.abc import Mapping

from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.router import RouteContext
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


def test_first_sightings_are_bounded_and_forgotten_with_the_partition() -> None:
    pauses, _ = _controller()
    for offset in range(20):
        pauses.bounded_due(_msg(offset), NOW + 60_000, 1_100, NOW + offset)
    assert pauses.bounded_due(_msg(19), NOW + 60_000, 1_100, NOW + 99_999) == NOW + 19 + 1_100
    assert len(pauses._first_seen[(TIER, 0)]) <= pauses.max_records + 1
    pauses.drop([(TIER, 0)])
    assert (TIER, 0) not in pauses._first_seen
