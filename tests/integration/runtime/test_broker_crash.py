"""Catalogue #6 (kill -9 the broker mid-republish, then restart), on Apache Kafka, whose log survives the crash.

Guarantee: a broker SIGKILLed while the main consumer is republishing failed records to a tier, then restarted
a few seconds later, costs nothing: every record ends (succeeded on its retry or dead-lettered as planned), no
offset was committed past a record that was neither handled nor acknowledged, and afterwards everything is
committed. Duplicates are allowed (at-least-once), losses are not.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

N = 600
CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
PRODUCER = {"message.timeout.ms": 60_000}  # longer than the outage: librdkafka retries the republishes itself


@pytest.fixture
def crashing_broker() -> Iterator[ApacheKafkaBroker]:
    with ApacheKafkaBroker() as broker:
        yield broker


def test_a_broker_killed_mid_republish_and_restarted_loses_nothing(crashing_broker: ApacheKafkaBroker) -> None:
    # setup: every third record fails once, every 50th is non-retryable
    kafka = crashing_broker.kafka_config()
    kit = Kit(kafka)
    source = kit.create("orders", 2)
    succeeded: Counter[int] = Counter()
    failed_once: set[int] = set()
    lock = threading.Lock()
    killed = threading.Event()
    app = RetryApp(kafka=kafka, group="billing", consumer_overrides=CONSUMER, producer_overrides=PRODUCER)

    @app.handler(source, policy=RetryPolicy(delays=["300ms"]), value_deserializer=lambda d, c: int(d))
    def handle(record: Record[int]) -> None:
        i = record.value
        if i % 50 == 0:
            raise NonRetryable(ValueError(f"bad {i}"))
        with lock:
            first_failure = i % 3 == 0 and i not in failed_once
            failed_once.add(i) if first_failure else succeeded.update([i])
        if first_failure and i >= N // 3 and not killed.is_set():
            killed.set()  # the broker dies while this record's republish is on its way
            crashing_broker.kill()
        if first_failure:
            raise RuntimeError(f"transient {i}")

    app.provision()
    kit.produce(source, [(str(i).encode(), str(i).encode(), []) for i in range(N)])

    # when: the broker is killed mid-run and comes back 3 s later with its log
    app.start(main=True, tiers="all")
    try:
        assert killed.wait(60), "the run never reached the kill point"
        threading.Event().wait(3)
        crashing_broker.start()
        expected_success = {i for i in range(N) if i % 50}
        wait_until(lambda: expected_success <= set(succeeded), 120, "every record to succeed after the restart")
        wait_until(lambda: kit.committed("billing", source, 2) == _ends(kit, source), 60, "every offset committed")
    finally:
        assert app.stop(timeout=30)

    # then: nothing lost; dead letters exactly the planned ones
    dlq = {int(r.value or b"-1") for r in kit.read_all(app.topics(source).dlq)}
    assert dlq == {i for i in range(N) if i % 50 == 0}
    assert {decode(list(r.headers)).dlq_reason.value for r in kit.read_all(app.topics(source).dlq)} == {"non_retryable"}
    tier = Counter(int(r.value or b"-1") for r in kit.read_all(app.topics(source).tiers[0].topic))
    assert set(tier) == set(failed_once), "a failed record was never republished"


def _ends(kit: Kit, topic: str) -> dict[int, int]:
    ends = {0: 0, 1: 0}
    for read in kit.read_all(topic):
        ends[read.partition] = max(ends[read.partition], read.offset + 1)
    return ends
