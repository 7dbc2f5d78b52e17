"""Reading offset ranges of a partition with an assign()-only consumer: no group, no commits, bounded
fetches. The console pages a DLQ backwards with it (one block at a time) and scans tiers for one origin id.

    consumer = range_reader(kafka)
    bounds = partition_bounds(consumer, "orders.billing.dlq")          # {partition: (low, high)}
    messages = read_range(consumer, "orders.billing.dlq", 0, 900, 1000)  # offsets [900, 1000), in order
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_consumer, map_kafka_errors
from retrytopics.core.errors import KafkaClientError

__all__ = ["follow_from_start", "partition_bounds", "range_reader", "read_range"]

#: Small fetches: a block of a DLQ of large records must not pull hundreds of megabytes into librdkafka's queue.
_READER_SETTINGS = {
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 1024 * 1024,
    "fetch.max.bytes": 4 * 1024 * 1024,
    "queued.max.messages.kbytes": 8 * 1024,
}


def range_reader(kafka: KafkaConfig) -> Consumer:
    """An assign()-only consumer that reports the end of a partition (close it after use)."""
    return make_consumer(kafka, group_id=None, overrides=dict(_READER_SETTINGS))


def partition_bounds(consumer: Consumer, topic: str, *, timeout_s: float = 10.0) -> dict[int, tuple[int, int]] | None:
    """(low, high) watermarks of every partition of `topic`, or None when the topic does not exist."""
    with map_kafka_errors():
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
            for p in sorted(meta.partitions)
        }


def read_range(
    consumer: Consumer, topic: str, partition: int, start: int, end: int, *, timeout_s: float = 10.0
) -> list[Message]:
    """The records at offsets `[start, end)` of one partition, in offset order (fewer where offsets hold no
    record: transaction markers, compaction). `end` must not pass the high watermark."""
    if end <= start:
        return []
    found: list[Message] = []
    with map_kafka_errors():
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                for message in consumer.consume(min(500, end - start), 0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return found
                        raise KafkaClientError(f"reading {topic}[{partition}]: {error}", code=error.name())
                    offset = message.offset() or 0
                    if offset >= end:
                        return found
                    found.append(message)
                    if offset == end - 1:
                        return found
        finally:
            consumer.unassign()
    raise KafkaClientError(
        f"reading {topic}[{partition}] offsets {start}..{end}: no end within {timeout_s}s", code="TIMED_OUT"
    )


def follow_from_start(consumer: Consumer, topics: dict[str, int], *, poll_s: float = 0.5) -> Iterator[list[Message]]:
    """Batches of records of every partition of `topics` (name → partition count), from the beginning and
    then as they come; an empty batch when nothing is new. Errors at the end of a partition are skipped."""
    with map_kafka_errors():
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, count in topics.items() for p in range(count)])
    while True:
        with map_kafka_errors():
            batch = consumer.consume(500, poll_s)
        yield [m for m in batch if m.error() is None]
