"""Batch handlers end to end on the broker: `@app.batch_handler` on the source and on both tiers.

Guarantees: 400 records over 3 partitions, 10% failing once, 2% always and 2% non-retryable, reported
per record through `BatchFailed`. Every id ends exactly where its plan says: succeeded once (after one retry
for the flaky ones), in the DLQ as `exhausted` after both tiers, or as `non_retryable` at once; no record is
handled after it succeeded; every call held one partition's records in offset order, and calls held many
records (the point of a batch handler); every source offset is committed.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from retrytopics import BatchFailed, NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

_NO_LEADER_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}
POLICY = RetryPolicy(delays=["200ms", "400ms"], non_retryable=(ValueError,))


def _read(kit: Kit, topic: str) -> list[Any]:
    """The topic's records; none yet while its partitions have no leader (just provisioned: the broker
    answers NOT_LEADER_FOR_PARTITION to a watermark query for a moment, seen once in CI)."""
    try:
        return kit.read_all(topic)
    except KafkaException as exc:
        if exc.args[0].code() not in _NO_LEADER_YET:
            raise
        return []


def plan(i: int) -> str:
    return "flaky" if i % 10 == 1 else "broken" if i % 50 == 2 else "bad" if i % 50 == 3 else "ok"


def test_a_batch_handler_settles_each_record_by_its_own_outcome(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup
    source = kit.create(unique_name("orders"), 3)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
    apps.append(app)
    lock = threading.Lock()
    calls: list[tuple[str, int, list[int]]] = []
    succeeded: Counter[bytes] = Counter()
    attempts: defaultdict[bytes, list[int]] = defaultdict(list)

    @app.batch_handler(source, policy=POLICY)
    def handle(records: list[Record[bytes]]) -> None:
        failed: list[tuple[Record[bytes], BaseException]] = []
        with lock:
            calls.append((records[0].topic, records[0].partition, [r.offset for r in records]))
            for r in records:
                assert r.value is not None and r.partition == records[0].partition
                attempts[r.value].append(r.attempt)
                kind = plan(int(r.value))
                if kind == "bad":
                    failed.append((r, NonRetryable(ValueError(f"bad {r.value!r}"))))
                elif kind == "broken" or (kind == "flaky" and r.attempt == 1):
                    failed.append((r, RuntimeError(f"attempt {r.attempt} failed")))
                else:
                    succeeded[r.value] += 1
        if failed:
            raise BatchFailed(failed)

    app.provision()
    values = [str(i).encode() for i in range(400)]
    kit.produce(source, [(v, v, []) for v in values])
    expected_dlq = {v: DlqReason.EXHAUSTED for v in values if plan(int(v)) == "broken"}
    expected_dlq |= {v: DlqReason.NON_RETRYABLE for v in values if plan(int(v)) == "bad"}

    # when: the main consumer and both tier consumers run
    app.start(main=True, tiers="all")
    try:
        dlq = wait_until(
            lambda: (r := _read(kit, app.topics(source).dlq)) and len(r) >= len(expected_dlq) and r,
            60,
            "every DLQ record",
        )
        wait_until(lambda: len(succeeded) == len(values) - len(expected_dlq), 60, "every success")
        wait_until(lambda: sum(kit.committed(group, source, 3).values()) == len(values), 30, "the source committed")
    finally:
        assert app.stop(timeout=30)

    # then: every id accounted for, once
    assert {r.value: decode(list(r.headers)).dlq_reason for r in dlq} == expected_dlq
    assert len(dlq) == len(expected_dlq)
    assert set(succeeded) == set(values) - set(expected_dlq) and set(succeeded.values()) == {1}
    for v in values:
        kind = plan(int(v))
        want = {"ok": [1], "flaky": [1, 2], "broken": [1, 2, 3], "bad": [1]}[kind]
        assert attempts[v] == want, (v, kind)
    # every call held one partition's records in offset order, and the source calls were real batches
    assert all(offsets == sorted(offsets) for _, _, offsets in calls)
    assert max(len(offsets) for topic, _, offsets in calls if topic == source) > 10
    assert app.error is None and app.stats.handled == len(values) - len(expected_dlq)
