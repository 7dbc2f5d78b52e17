"""A source topic deleted and recreated under the same name keeps no ghost of its first life.

Guarantee: the hand-offs its first life left in the DLQ (and tiers) never make the recreated topic's records,
which restart at offset 0, look handed off already: with the same group, every record of the second life is
handled, and the group commits past them. That holds when the producer sets the same timestamps in both
lives (re-ingested event times): the hops carry the first life's values, not the new records'.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_producer
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

RECORDS = 5
T0 = 1_700_000_000_000


def _produce(kafka: KafkaConfig, topic: str, life: str, same_timestamps: bool) -> None:
    producer = make_producer(kafka)
    for i in range(RECORDS):
        stamp = {"timestamp": T0 + i} if same_timestamps else {}
        producer.produce(topic, key=None, value=f"{life}-{i}".encode(), **stamp)
    assert producer.flush(30) == 0


def _recreate(kit: Kit, topic: str) -> None:
    """Delete `topic` and create it again, retrying while the broker still finishes the deletion."""
    for future in kit.admin.delete_topics([topic], operation_timeout=30).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kit.create(topic, 1)
            if topic in kit.admin.list_topics(timeout=10).topics:
                return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


@pytest.mark.parametrize("same_timestamps", [False, True], ids=["own_timestamps", "same_timestamps"])
def test_a_recreated_source_topic_has_every_record_handled(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    same_timestamps: bool,
) -> None:
    # setup: first life: 5 records, each dead-lettered (non-retryable) and committed
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    handled: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def make_app() -> RetryApp:
        app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
        apps.append(app)

        @app.handler(source, policy=RetryPolicy(delays=["1s"]))
        def handle(record: Record[bytes]) -> None:
            with lock:
                handled.append((record.offset, record.value or b""))
            if (record.value or b"").startswith(b"first"):
                raise NonRetryable("first life: dead-lettered")

        return app

    first = make_app()
    first.provision()
    _produce(kafka, source, "first", same_timestamps)
    first.start(main=True)
    wait_until(lambda: kit.committed(group, source, 1) == {0: RECORDS}, 60, "first life committed")
    assert first.stop()
    dlq = kit.read_all(first.topics(source).dlq)
    assert [decode(list(r.headers)).original_offset for r in dlq] == list(range(RECORDS))
    assert {decode(list(r.headers)).dlq_reason for r in dlq} == {DlqReason.NON_RETRYABLE}

    # when: the source topic is recreated (same name, offsets from 0) and the same group reads its new records
    _recreate(kit, source)
    # Kafka drops a deleted topic's committed offsets (the same group then starts the new life at 0)
    wait_until(lambda: kit.committed(group, source, 1)[0] < 0, 30, "the first life's offsets dropped")
    _produce(kafka, source, "second", same_timestamps)
    second = make_app()
    second.start(main=True)

    def second_life() -> list[tuple[int, bytes]]:
        with lock:
            return sorted((offset, value) for offset, value in handled if value.startswith(b"second"))

    wait_until(
        lambda: len(second_life()) == RECORDS and kit.committed(group, source, 1) == {0: RECORDS},
        60,
        "the second life handled and committed",
    )
    assert second.stop()

    # then: every record of the second life was handled, once, and none of them reached the DLQ
    assert second_life() == [(i, f"second-{i}".encode()) for i in range(RECORDS)]
    assert len(kit.read_all(first.topics(source).dlq)) == RECORDS
    assert second.stats.duplicates_suppressed == 0
