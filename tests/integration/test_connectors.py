"""Guarantees of the connector layer on a real broker: the project's factories carry key, value bytes and
headers (binary values, null values, duplicate keys) unchanged, and provisioning is idempotent and refuses
a partition-count mismatch with an error that names the topic and both counts."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from retrytopics.connectors.admin import ProvisionOutcome, TopicSpec, ensure_topics, partition_count
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.core.errors import TopicMismatchError

pytestmark = pytest.mark.broker


def test_round_trip_preserves_key_value_and_headers(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("roundtrip")
    ensure_topics(make_admin(kafka), [TopicSpec(name=topic, partitions=3)])
    sent = []
    producer = make_producer(kafka)
    for i in range(30):
        key = None if i % 10 == 0 else f"key-{i}".encode()
        value = None if i % 15 == 7 else bytes(range(256)) + str(i).encode()
        headers = [("bin", b"\x00\xff\x80" + bytes([i])), ("dup", b"first"), ("dup", b"second"), ("nul", None)]
        producer.produce(topic, key=key, value=value, headers=headers, partition=i % 3)
        sent.append((i % 3, key, value, headers))
    assert producer.flush(10) == 0

    consumer = make_consumer(kafka, group_id=None)
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    received = []
    deadline = time.monotonic() + 20
    while len(received) < len(sent) and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.5):
            assert message.error() is None, message.error()
            received.append((message.partition(), message.key(), message.value(), message.headers()))
    consumer.close()

    assert sorted(received, key=repr) == sorted(sent, key=repr)


def test_provisioning_is_idempotent(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    admin = make_admin(kafka)
    specs = [TopicSpec(name=unique_name("prov-a"), partitions=2), TopicSpec(name=unique_name("prov-b"), partitions=4)]
    first = ensure_topics(admin, specs)
    second = ensure_topics(admin, specs)
    assert set(first.values()) == {ProvisionOutcome.CREATED}
    assert set(second.values()) == {ProvisionOutcome.EXISTS}
    assert [partition_count(admin, s.name) for s in specs] == [2, 4]


def test_partition_mismatch_names_topic_and_counts(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    admin = make_admin(kafka)
    name = unique_name("prov-mismatch")
    ensure_topics(admin, [TopicSpec(name=name, partitions=2)])
    with pytest.raises(TopicMismatchError) as info:
        ensure_topics(admin, [TopicSpec(name=name, partitions=5)])
    message = str(info.value)
    assert name in message and "2 partitions" in message and "5 were asked" in message
    assert (info.value.topic, info.value.expected_partitions, info.value.actual_partitions) == (name, 5, 2)
