"""Filling topics for a scenario: batched idempotent produce, and valid retry headers for tier records.

Runs in the harness process (its memory never counts). Producing is batched for speed, which makes the
embedded broker's high watermark under-report: scenarios therefore count consumed records, never end offsets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from confluent_kafka import Producer

from bench.context import Bench
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import PRODUCER_DEFAULTS, make_admin
from retrytopics.core.headers import DlqReason, Header, RetryHeaders, encode
from retrytopics.core.naming import TopicSet, topics_for

__all__ = ["create_topics", "dead_lettered_pipeline", "dlq_headers", "fill", "tier_headers", "tier_topics"]

#: Batching for the loaders only (the measured programs use the product's defaults).
_LOADER = {"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000}


def create_topics(kafka: KafkaConfig, names: Sequence[str], partitions: int) -> None:
    ensure_topics(make_admin(kafka), [TopicSpec(name=n, partitions=partitions) for n in names])


def tier_topics(source: str, group: str, delays_ms: Sequence[int]) -> TopicSet:
    """The product's names for the tiers of `source` (the same function the runtime uses)."""
    return topics_for(source, group, delays_ms)


def tier_headers(
    ts: TopicSet, *, tier: int, due_at: int, failed_at: int, offset: int = 0, partition: int = 0
) -> list[Header]:
    """Retry headers a tier consumer accepts: the record failed once at `failed_at` and is due at `due_at`."""
    return encode(
        RetryHeaders(
            reconsume_times=1,
            origin_message_id=f"{ts.source}-{partition}-{offset}",
            original_topic=ts.source,
            original_partition=partition,
            original_offset=offset,
            original_timestamp=failed_at,
            consumer_group=ts.group,
            tier=tier,
            due_at=due_at,
            first_failed_at=failed_at,
            last_failed_at=failed_at,
            exception_type="bench.Failure",
            exception_message="failed once",
            exception_trace="",
        )
    )


def dlq_headers(ts: TopicSet, *, failed_at: int, offset: int, partition: int, kind: int = 0) -> list[Header]:
    """Retry headers of a dead-lettered record: failed twice (one retry), retries exhausted; `kind` picks one
    of three exception types so that group-bys have something to count."""
    return encode(
        RetryHeaders(
            reconsume_times=2,
            origin_message_id=f"{ts.source}-{partition}-{offset}",
            original_topic=ts.source,
            original_partition=partition,
            original_offset=offset,
            original_timestamp=failed_at - 1000,
            consumer_group=ts.group,
            tier=None,
            due_at=None,
            first_failed_at=failed_at - 1000,
            last_failed_at=failed_at,
            exception_type=("bench.Timeout", "bench.Refused", "bench.BadData")[kind % 3],
            exception_message="failed twice",
            exception_trace="",
            dlq_reason=DlqReason.EXHAUSTED,
        )
    )


def fill(
    kafka: KafkaConfig,
    topic: str,
    n: int,
    *,
    value_size: int = 100,
    partitions: int = 3,
    headers: Callable[[int, int], list[Header]] | None = None,
    exact_end_offsets: bool = False,
    timeout_s: float = 600.0,
) -> float:
    """Produce `n` keyless records round-robin over `partitions`; returns the seconds it took.

    `headers(i, partition)` gives record i's headers. `exact_end_offsets` sends one record per batch (slow),
    for readers that plan from end offsets (Spark), which batched produces make the embedded broker
    under-report. Raises if any record is not acknowledged.
    """
    exact = {"batch.num.messages": 1} if exact_end_offsets else {}
    producer = Producer({**kafka.producer_config(), **PRODUCER_DEFAULTS, **_LOADER, **exact})
    failed: list[str] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    value = b"v" * value_size
    start = time.monotonic()
    for i in range(n):
        partition = i % partitions
        kwargs = {"headers": headers(i, partition)} if headers else {}
        while True:
            try:
                producer.produce(topic, value=value, partition=partition, on_delivery=report, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(timeout_s)
    if left or failed:
        raise RuntimeError(f"loading {topic}: {left} records unacknowledged, {len(failed)} failed: {failed[:3]}")
    return time.monotonic() - start


def dead_lettered_pipeline(b: Bench, stem: str, delays_ms: Sequence[int], n: int) -> TopicSet:
    """A fresh pipeline (source, tiers, DLQ) whose DLQ holds `n` exhausted records of three exception types.
    On tansu one record per produce batch: readers that plan from end offsets (Spark)
    need them exact."""
    source, group = b.name(stem), b.name("app")
    ts = tier_topics(source, group, delays_ms)
    create_topics(b.kafka, [source, *ts.all_topics], b.partitions)
    now = int(time.time() * 1000)
    fill(
        b.kafka,
        ts.dlq,
        n,
        partitions=b.partitions,
        exact_end_offsets=b.broker == "tansu",
        headers=lambda i, p: dlq_headers(ts, failed_at=now, offset=i, partition=p, kind=i),
    )
    return ts
