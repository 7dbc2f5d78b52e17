"""Helpers for share-group scenarios on Apache Kafka (4.2+; the suite's 4.4.0): a topic with records, a
group configured before its first member joins, share consumers closed at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from retrytopics.connectors.admin import ShareGroupConfig, TopicSpec, ensure_topics, set_share_group_config
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.connectors.share import KafkaShareConsumer
from retrytopics.core.headers import Header
from retrytopics.core.ports import AckType, Message

#: Each member fetches a few records at a time, so that several members share one partition's records.
SMALL_BATCHES = {"max.poll.records": 5}


class ShareKit:
    """One test's topic, share group and consumers."""

    def __init__(self, kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
        self.kafka = kafka
        self.topic = unique_name("share")
        self.group = unique_name("share-group")
        self.admin = make_admin(kafka)
        self.consumers: list[KafkaShareConsumer] = []

    def setup(self, records: int, *, partitions: int = 1, one_per_batch: bool = True, **config: object) -> list[bytes]:
        """Create the topic, configure the group (earliest, a 1 s heartbeat, plus `config`), write records
        `id-0`, `id-1`, ... with a header each; returns their values. `one_per_batch`: each record its own
        producer batch (the broker acquires whole batches, see test_share_broker)."""
        ensure_topics(self.admin, [TopicSpec(name=self.topic, partitions=partitions)])
        group_config = ShareGroupConfig(auto_offset_reset="earliest", heartbeat_interval_ms=1000, **config)  # type: ignore[arg-type]
        set_share_group_config(self.admin, self.group, group_config)
        producer = make_producer(self.kafka, overrides={"batch.num.messages": 1} if one_per_batch else None)
        values = [f"id-{i}".encode() for i in range(records)]
        for value in values:
            producer.produce(self.topic, key=value, value=value, headers=[("origin", b"test")])
        assert producer.flush(30) == 0
        return values

    def consumer(self, **overrides: object) -> KafkaShareConsumer:
        consumer = KafkaShareConsumer(self.kafka, group_id=self.group, overrides=overrides)
        self.consumers.append(consumer)
        consumer.subscribe([self.topic])
        return consumer

    def close(self) -> None:
        for consumer in self.consumers:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - a failed test may leave a consumer in any state
                pass


@pytest.fixture
def share(kafka: KafkaConfig, unique_name: Callable[[str], str], broker: object) -> Iterator[ShareKit]:
    if getattr(broker, "kind", "") == "tansu":
        pytest.skip("share groups need Apache Kafka 4.2+; tansu has none")
    kit = ShareKit(kafka, unique_name)
    yield kit
    kit.close()


def poll_settling(
    consumer: KafkaShareConsumer, decide: Callable[[Message], AckType], timeout_s: float = 1.0
) -> list[Message]:
    """One poll; every record acknowledged as `decide` says, and the acknowledgements committed."""
    batch = consumer.poll(timeout_s)
    for msg in batch:
        consumer.acknowledge(msg, decide(msg))
    if batch:
        answers = consumer.commit(asynchronous=False)
        assert all(error is None for error in answers.values()), answers
    return batch


def deliveries_until(
    consumers: list[KafkaShareConsumer],
    decide: Callable[[Message], AckType],
    done: Callable[[list[Message]], bool],
    timeout_s: float,
) -> list[Message]:
    """Poll the members in turn, settling each batch, until `done(deliveries so far)` or the deadline."""
    seen: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        if time.monotonic() > deadline:
            pytest.fail(f"deadline passed with {len(seen)} deliveries: {[(m.offset, m.delivery_count) for m in seen]}")
        for consumer in consumers:
            seen += poll_settling(consumer, decide, 0.3)
    return seen


def quiet(consumers: list[KafkaShareConsumer], seconds: float) -> list[Message]:
    """What the members get in `seconds` (each batch accepted): [] when nothing is left to deliver."""
    seen: list[Message] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for consumer in consumers:
            seen += poll_settling(consumer, lambda _m: AckType.ACCEPT, 0.3)
    return seen


def read_topic(
    kafka: KafkaConfig, topic: str, expected: int, timeout_s: float = 20.0
) -> list[tuple[bytes | None, bytes | None, tuple[Header, ...]]]:
    """Key, value and headers of the first `expected` records of a one-partition topic."""
    consumer = make_consumer(kafka, group_id=None)
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes | None, bytes | None, tuple[Header, ...]]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.key(), msg.value(), tuple(msg.headers() or ())))  # type: ignore[arg-type]
    finally:
        consumer.close()
    return out
