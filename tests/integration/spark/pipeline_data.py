"""A small retry pipeline written straight to Kafka with a known ground truth (shared by audit and replay
tests). Until an end-to-end runtime run feeds these tests, the records are what the router would write."""

from __future__ import annotations

import dataclasses
from typing import Any

from confluent_kafka import TopicPartition

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_consumer
from retrytopics.core.headers import DlqReason, Lineage, RetryHeaders, encode
from retrytopics.core.naming import TopicSet, topics_for

from .conftest import create_topics, produce

NOW = 1_800_000_000_000
T0 = NOW - 600_000


def failure(
    offset: int,
    n: int,
    *,
    source: str,
    tier: int | None,
    due_at: int | None,
    exc: str = "TimeoutError",
    reason: DlqReason | None = None,
    first: int = T0,
    lineage: Lineage = Lineage(),
) -> RetryHeaders:
    return RetryHeaders(
        reconsume_times=n,
        origin_message_id=f"{source}-0-{offset}",
        original_topic=source,
        original_partition=0,
        original_offset=offset,
        original_timestamp=T0 - 1000,
        consumer_group="billing",
        tier=tier,
        due_at=due_at,
        first_failed_at=first,
        last_failed_at=first + (n - 1) * 10_000,
        exception_type=exc,
        exception_message="boom",
        exception_trace="Traceback...",
        dlq_reason=reason,
        lineage=lineage,
    )


def record(h: RetryHeaders, offset: int) -> dict[str, Any]:
    return {
        "key": f"k{offset}".encode(),
        "value": f"v{offset}".encode(),
        "headers": [("trace-id", f"t{offset}".encode()), ("dup", b"1"), ("dup", None), *encode(h)],
    }


def commit(kafka: KafkaConfig, group: str, topic: str, offset: int) -> None:
    consumer = make_consumer(kafka, group_id=group)
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def build_pipeline(kafka: KafkaConfig, source: str) -> TopicSet:
    """Episodes (origin offsets): 0 recovered in tier 0; 1 recovered in tier 1; 2 exhausted to the DLQ;
    3 non-retryable straight to the DLQ, then claimed replayed by source offset 6, whose lineage headers a
    plain producer wrote (no ledger entry, no `retry.replay_mark`: not proven); 4 stuck in tier 0 (overdue);
    5 in flight in tier 1 (not due yet)."""
    topics = topics_for(source, "billing", (1_000, 10_000))
    t0, t1 = topics.tiers
    create_topics(kafka, (source, 1), (t0.topic, 1), (t1.topic, 1), (topics.dlq, 1))
    f = lambda o, n, **kw: failure(o, n, source=source, **kw)  # noqa: E731
    src = [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(6)]
    replayed = f(3, 1, tier=None, due_at=None, exc="ValueError", reason=DlqReason.NON_RETRYABLE)
    src.append(
        {
            "key": b"k3",
            "value": b"v3",
            "headers": [
                ("trace-id", b"t3"),
                *encode(
                    RetryHeaders(
                        **{
                            **{fl.name: getattr(replayed, fl.name) for fl in dataclasses.fields(replayed)},
                            "lineage": Lineage(
                                replay_id="r-old",
                                replayed_at=NOW - 1000,
                                replay_count=1,
                                replay_origin_id=f"{source}-0-3",
                            ),
                        }
                    )
                )[-4:],
            ],
        }
    )
    produce(kafka, source, src)
    produce(
        kafka,
        t0.topic,
        [
            record(f(0, 1, tier=0, due_at=T0 + 1000), 0),
            record(f(1, 1, tier=0, due_at=T0 + 1000), 1),
            record(f(2, 1, tier=0, due_at=T0 + 1000), 2),
            record(f(5, 1, tier=0, due_at=T0 + 1000), 5),
            record(f(4, 1, tier=0, due_at=T0 + 1000), 4),
        ],
    )
    produce(
        kafka,
        t1.topic,
        [
            record(f(1, 2, tier=1, due_at=T0 + 20_000), 1),
            record(f(2, 2, tier=1, due_at=T0 + 20_000), 2),
            record(f(5, 2, tier=1, due_at=NOW + 60_000), 5),
        ],
    )
    produce(
        kafka,
        topics.dlq,
        [
            record(f(2, 3, tier=None, due_at=None, reason=DlqReason.EXHAUSTED), 2),
            record(replayed, 3),
        ],
    )
    commit(kafka, "billing", source, 7)
    commit(kafka, t0.topic, t0.topic, 4)
    commit(kafka, t1.topic, t1.topic, 2)
    return topics
