"""What every hand-off does with successes (runtime/handoff/handoff.py), on the in-memory broker: a batch's
successes are counted per partition in one `records.handled` event (first and last offset, count), their
offsets finish without being queued, and a per-record `record.handled` reaches only a hook that asks for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from retrytopics.observe.events import Event

from ..kit import GROUP, TIER, Ledger, StopWhen, build_loop, committed_all, fill, hand_offs, new_broker, run


class Everything:
    """A hook without `wanted_events`: it receives every event, `record.handled` included."""

    def __init__(self) -> None:
        self.seen: list[Event] = []

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append(event)


@pytest.mark.parametrize("per_record_hook", [False, True])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_successes_are_counted_per_partition_and_batch_and_finish_their_offsets(
    per_record_hook: bool, exactly_once: bool
) -> None:
    # setup: two source partitions of three records; id-0-1 fails between two successes of partition 0.
    # The broker's fetch takes partition 0 first, then 1: the first poll is 0@0..2 and 1@0, the second 1@1..2
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(3)] for p in (0, 1)}
    fill(broker, ids)
    ledger = Ledger(broker, failing={"id-0-1"})
    ledger.wanted_events = frozenset({Event.RECORDS_HANDLED, Event.RETRY_SCHEDULED})  # type: ignore[attr-defined]
    every = Everything()
    stop = StopWhen(committed_all(broker, GROUP, {0: 3, 1: 3}))
    hooks = [every] if per_record_hook else []
    loop = build_loop(broker, ledger, stop, hooks=hooks, batch_size=4, exactly_once=exactly_once, commit_on_ack=False)

    # when
    run(loop, stop)

    # then: 5 successes in 3 events: one per partition and poll, the failure in between not counted
    counted = [
        (d["partition"], d["count"], d["first_offset"], d["last_offset"]) for d in ledger.of(Event.RECORDS_HANDLED)
    ]
    assert counted == [(0, 2, 0, 2), (1, 1, 0, 0), (1, 2, 1, 2)]
    assert ledger.calls == Counter(ids[0] + ids[1])
    assert [(i, h.original_offset) for i, h in hand_offs(broker, TIER)] == [("id-0-1", 1)]
    assert every.seen.count(Event.RECORD_HANDLED) == (5 if per_record_hook else 0)
