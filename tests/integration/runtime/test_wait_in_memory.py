"""Tier records due soon wait in the tier consumer's memory (`wait_in_memory`), later ones in Kafka.

Guarantees, the same with waiting in memory on and off ("0s"): every tier record is handled exactly once,
never before its due time, in offset order per partition; a record with unreadable retry headers waiting
in line goes to the DLQ as `invalid_retry_headers`; a duplicate republish waiting in line is suppressed;
every offset is committed at the end. Batches of 5 and a queue of at most 4 records per partition make the
consumer stop and restart fetching many times, and a gap of 1.6 s in due times (longer than the 500 ms horizon) sends
the partition back to waiting in Kafka: with memory waiting on, a partition is sought back and paused only
for the long waits (before the first record and at the gap), not once per fetch.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, Header, RetryHeaders, decode, encode
from retrytopics.observe.events import Event

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

DELAY_MS = 5_000
POLICY = RetryPolicy(delays=[f"{DELAY_MS}ms"])
PARTITIONS = 2
BEFORE_GAP, AFTER_GAP = 60, 20


class PauseCounter:
    def __init__(self) -> None:
        self.paused: Counter[tuple[str, int]] = Counter()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is Event.PARTITION_PAUSED and data.get("until") is not None:
            self.paused[(str(data["topic"]), int(data["partition"]))] += 1  # type: ignore[call-overload]


@pytest.mark.parametrize("wait_in_memory", ["500ms", "0s"])
def test_tier_records_are_handled_once_in_order_and_never_early(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    wait_in_memory: str,
) -> None:
    # setup: per partition, 60 records due 15 ms apart from 4 s on, then 20 due after a 1.6 s gap; in the
    # middle of the first run, a record with a broken header and a second copy of an earlier record
    source = kit.create(unique_name("orders"), PARTITIONS)
    group = unique_name("billing")
    pauses = PauseCounter()
    # small batches, so that queues fill up, stop fetching, run low and fetch again many times
    app = RetryApp(
        kafka=kafka,
        group=group,
        consumer_overrides=consumer_overrides,
        hooks=[pauses],
        batch_size=5,
        wait_in_memory=wait_in_memory,
        wait_in_memory_records=4,
    )
    apps.append(app)
    lock = threading.Lock()
    calls: list[tuple[int, int, bytes, float, int]] = []

    @app.handler(source, policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        handled_at = time.time() * 1000
        assert record.retry is not None and record.retry.due_at is not None
        with lock:
            calls.append((record.partition, record.offset, record.value, handled_at, record.retry.due_at))

    app.provision()
    tier = app.topics(source).tiers[0].topic
    start = int(time.time() * 1000) + 4_000
    expected: dict[bytes, int] = {}
    for p in range(PARTITIONS):
        records: list[tuple[bytes | None, bytes | None, list[Header]]] = []
        for i in range(BEFORE_GAP + AFTER_GAP):
            due = start + i * 15 if i < BEFORE_GAP else start + BEFORE_GAP * 15 + 1_600 + (i - BEFORE_GAP) * 10
            value = f"p{p}-r{i}".encode()
            expected[value] = due
            records.append((None, value, _tier_headers(source, group, p, i, due)))
            if i == 30:
                broken = [(k, b"minus one" if k == "retry.reconsume_times" else v) for k, v in records[-1][2]]
                records.append((None, f"p{p}-broken".encode(), broken))
                records.append((None, f"p{p}-r10-again".encode(), _tier_headers(source, group, p, 10, start + 150)))
        kit.produce(tier, records, partition=p)

    # when
    app.start(main=False, tiers="all")
    wait_until(
        lambda: len(calls) >= len(expected) and app.stats.duplicates_suppressed == PARTITIONS,
        30,
        "every record handled",
    )
    per_partition = BEFORE_GAP + AFTER_GAP + 2
    wait_until(
        lambda: kit.committed(tier, tier, PARTITIONS) == dict.fromkeys(range(PARTITIONS), per_partition),
        15,
        "every offset committed",
    )
    assert app.stop()

    # then: exactly once each, never early, in offset order per partition
    assert sorted(v for _, _, v, _, _ in calls) == sorted(expected)
    early = [(v, round(at - due, 1)) for _, _, v, at, due in calls if at < due]
    assert not early, early
    assert all(due == expected[v] for _, _, v, _, due in calls)
    for p in range(PARTITIONS):
        offsets = [o for q, o, _, _, _ in calls if q == p]
        assert offsets == sorted(offsets)
    # then: the broken record went to the DLQ in its turn; the copy was suppressed, not handled
    dlq = kit.read_all(app.topics(source).dlq)
    assert sorted(r.value for r in dlq) == [f"p{p}-broken".encode() for p in range(PARTITIONS)]
    assert {decode(list(r.headers)).dlq_reason for r in dlq} == {DlqReason.INVALID_RETRY_HEADERS}
    assert app.stats.duplicates_suppressed == PARTITIONS
    # then: with memory waiting, partitions were paused in Kafka for the long waits only
    if wait_in_memory != "0s":
        assert all(1 <= pauses.paused[(tier, p)] <= 4 for p in range(PARTITIONS)), pauses.paused


def _tier_headers(source: str, group: str, partition: int, i: int, due: int) -> list[Header]:
    return encode(
        RetryHeaders(
            reconsume_times=1,
            origin_message_id=f"{source}-{partition}-{i}",
            original_topic=source,
            original_partition=partition,
            original_offset=i,
            original_timestamp=due - DELAY_MS,
            consumer_group=group,
            tier=0,
            due_at=due,
            first_failed_at=due - DELAY_MS,
            last_failed_at=due - DELAY_MS,
            exception_type="test.Failure",
            exception_message="failed once",
            exception_trace="",
        )
    )
