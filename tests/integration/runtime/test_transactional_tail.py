"""A partition that ends in transaction markers or aborted records is committed to its end.

A transactional producer follows its records with a control record (commit or abort marker), and a
read_committed consumer skips an aborted transaction's records: neither is ever handed to the runtime. A
group that commits `last handled offset + 1` therefore stops short of such a partition's end, and shows lag
for good. Once a partition has nothing unfinished, the runtime commits the consumer's position instead.

Setup: the source is written by a transactional producer (a committed transaction, then an aborted one at the
tail); the app fails one record once. At-least-once and exactly-once commit differently; exactly-once also writes
its tier in its own transactions (a commit marker at the tier's tail).

Guarantees: each committed record is handled once, no aborted record is handled; the group's committed offset
of the source, and the tier group's of the tier, equal the partitions' end offsets; so does the committed offset
of a new member that starts past the last record and is handed nothing (a rolling restart's case).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition as CKTopicPartition

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_consumer, make_producer

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

COMMITTED = [b"a", b"fails-once", b"c"]
ABORTED = [b"x", b"y"]


def _end(kafka: KafkaConfig, topic: str) -> int:
    consumer = make_consumer(kafka, group_id=None)
    try:
        return int(consumer.get_watermark_offsets(CKTopicPartition(topic, 0), timeout=10, cached=False)[1])
    finally:
        consumer.close()


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_committed_offsets_reach_the_end_past_markers_and_aborted_records(
    exactly_once: bool,
    broker: Any,
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu shows aborted records to read_committed readers (docs/testing.md)")
    # setup: a source written in two transactions, the second aborted
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, exactly_once=exactly_once, consumer_overrides=consumer_overrides)
    apps.append(app)
    lock = threading.Lock()
    handled: Counter[bytes] = Counter()

    @app.handler(source, policy=RetryPolicy(delays=["200ms"]))
    def handle(record: Record[bytes]) -> None:
        if record.value == b"fails-once" and record.attempt == 1:
            raise RuntimeError("first attempt fails")
        with lock:
            assert record.value is not None
            handled[record.value] += 1

    app.provision()
    tier = app.topics(source).tiers[0].topic
    producer = make_producer(kafka, transactional_id=unique_name("writer"))
    producer.init_transactions(30)
    for values, commit in ((COMMITTED, True), (ABORTED, False)):
        producer.begin_transaction()
        for value in values:
            producer.produce(source, key=value, value=value)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    source_end = _end(kafka, source)
    assert source_end == len(COMMITTED) + len(ABORTED) + 2  # a marker after each transaction

    # when: the main consumer and the tier consumer run until every committed record is handled
    app.start(main=True, tiers="all")
    try:
        wait_until(lambda: sum(handled.values()) >= len(COMMITTED), 60, "every committed record handled")
        tier_end = _end(kafka, tier)
        # then: both groups commit up to the partitions' ends, markers and aborted records included
        wait_until(lambda: kit.committed(group, source, 1) == {0: source_end}, 30, f"{group} committed {source_end}")
        wait_until(lambda: kit.committed(tier, tier, 1) == {0: tier_end}, 30, f"{tier} committed {tier_end}")
    finally:
        assert app.stop(timeout=30)

    assert handled == Counter(COMMITTED)
    assert tier_end == (2 if exactly_once else 1)  # the republished record (and the app's commit marker)

    # when: the group is set back past the last record only (where a rolling restart found it), and a new
    # member starts there: it is handed nothing, its fetch skips the marker and the aborted transaction
    rewind = make_consumer(kafka, group_id=group)
    try:
        rewind.commit(offsets=[CKTopicPartition(source, 0, len(COMMITTED))], asynchronous=False)
    finally:
        rewind.close()
    assert kit.committed(group, source, 1) == {0: len(COMMITTED)}
    restarted = RetryApp(kafka=kafka, group=group, exactly_once=exactly_once, consumer_overrides=consumer_overrides)
    apps.append(restarted)
    restarted.handler(source, policy=RetryPolicy(delays=["200ms"]))(handle)
    restarted.start(main=True)
    try:
        # then: it commits the end, and handles nothing
        wait_until(
            lambda: kit.committed(group, source, 1) == {0: source_end}, 30, f"the new member committed {source_end}"
        )
    finally:
        assert restarted.stop(timeout=30)
    assert handled == Counter(COMMITTED)
