"""Ownership and max.poll.interval.ms: a handler that outlives it, and a tier delay longer than it.

Guarantees:

- A handler call that outlives `max.poll.interval.ms` and then fails is abandoned: no republish and no DLQ
  record from a consumer that may have lost its partition; the record is read again by whoever owns the
  partition (here the same consumer, whether or not librdkafka left the group meanwhile: it only notices
  up to ~0.5 s late, and a poll before that keeps it in the group) and handed off once from there. The
  partition's commit position moves past it; nothing is lost.
- A tier partition paused for longer than `max.poll.interval.ms` keeps its consumer in the group: it keeps
  polling while paused, so the tier group sees 0 rebalances, and no record is handled before its due time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import Event, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

MAX_POLL_MS = 3000
#: max.poll.interval.ms may not be below session.timeout.ms, so the session is short too.
CONSUMER = {"session.timeout.ms": MAX_POLL_MS, "heartbeat.interval.ms": 500, "max.poll.interval.ms": MAX_POLL_MS}
#: The tier waits longer than max.poll.interval.ms.
POLICY = RetryPolicy(delays=["5s"])


class Membership:
    """Rebalance events per consumer."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Event, object]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event in (Event.PARTITIONS_ASSIGNED, Event.PARTITIONS_REVOKED, Event.PARTITIONS_LOST):
            self.events.append((str(data["consumer"]), event, data["partitions"]))

    def of(self, consumer: str) -> list[tuple[Event, object]]:
        return [(e, p) for c, e, p in self.events if c == consumer]


def test_outliving_max_poll_abandons_the_call_and_a_long_tier_wait_keeps_the_group(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str], apps: list[RetryApp]
) -> None:
    # setup: "slow" overruns max.poll.interval.ms by 0.2 s on its first call and fails
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    membership = Membership()
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=CONSUMER, hooks=[membership])
    apps.append(app)
    lock = threading.Lock()
    calls: list[dict[str, Any]] = []

    @app.handler(source, policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        with lock:
            first_call = not any(c["value"] == record.value for c in calls)
            calls.append(
                {
                    "value": record.value,
                    "attempt": record.attempt,
                    "at": time.time() * 1000,
                    "due_at": record.retry.due_at if record.retry else None,
                }
            )
        if record.value == b"slow" and first_call:
            time.sleep(MAX_POLL_MS / 1000 + 0.2)
        if record.value in (b"slow", b"wait") and record.attempt == 1:
            raise RuntimeError(f"{record.value!r} fails on attempt 1")

    app.provision()
    tier = app.topics(source).tiers[0].topic
    kit.produce(source, [(None, b"wait", []), (None, b"slow", []), (None, b"after", [])])

    # when
    app.start(main=True, tiers="all")
    wait_until(lambda: app.stats.handled == 3, 40, "every record to succeed")
    wait_until(lambda: kit.committed(group, source, 1) == {0: 3}, 10, "the main consumer to commit past 'slow'")
    assert app.stop()

    # then: the overrunning call was abandoned, "slow" read again and handed off once, then recovered
    assert app.stats.abandoned == 1
    assert [c["attempt"] for c in calls if c["value"] == b"slow"] == [1, 1, 2]
    tier_records = [(r.value, decode(list(r.headers))) for r in kit.read_all(tier)]
    assert sorted((v, h.origin_message_id, h.reconsume_times) for v, h in tier_records) == [
        (b"slow", f"{source}-0-1", 1),
        (b"wait", f"{source}-0-0", 1),
    ]
    assert kit.read_all(app.topics(source).dlq) == []
    # then: the tier waited 5 s (> max.poll.interval.ms) without a rebalance, and nothing ran early
    retries = [c for c in calls if c["attempt"] == 2]
    assert sorted(c["value"] for c in retries) == [b"slow", b"wait"]
    assert all(c["at"] >= c["due_at"] for c in retries), retries
    assert all(h.due_at is not None and h.due_at - h.last_failed_at > MAX_POLL_MS for _, h in tier_records)
    tier_events = membership.of(tier)
    assert tier_events[0] == (Event.PARTITIONS_ASSIGNED, [(tier, 0)])
    assert [e for e, _ in tier_events[1:]] in ([], [Event.PARTITIONS_REVOKED]), tier_events  # the stop's revoke
    assert app.stats.duplicates_suppressed == 0
