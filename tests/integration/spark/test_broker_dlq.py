"""The audit and the replay beside a share group's broker-written DLQ (KIP-1191) on Apache Kafka 4.4.0:
records a share group rejected or released to its delivery limit, written there by the broker, plus our own
DLQ, a repeated broker copy, a copy-less dead letter and one with hostile headers."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from retrytopics.connectors.admin import ensure_topics, set_share_group_config, share_group_provisioning
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.connectors.share import KafkaShareConsumer
from retrytopics.core import broker_dlq as B
from retrytopics.core.headers import DlqReason
from retrytopics.core.naming import topics_for
from retrytopics.core.ports import AckType, Message
from retrytopics.spark.audit import audit
from retrytopics.spark.broker_dlq import with_broker_columns
from retrytopics.spark.columns import with_retry_columns
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import failure, record

pytestmark = [pytest.mark.broker, pytest.mark.spark]

#: What the share group does with each source offset: 3, 4 and 7 rejected, 5 and 6 released until the
#: delivery limit (2), the rest accepted. Our consumer dead-lettered 2 (then accepted it) and 7 (its
#: acceptance lost, as when a process dies after its own DLQ write: the broker archived it too).
REJECTED, EXHAUSTED, OURS = {3, 4, 7}, {5, 6}, {2, 7}


def _fate(msg: Message) -> AckType:
    if msg.offset in REJECTED:
        return AckType.REJECT
    return AckType.RELEASE if msg.offset in EXHAUSTED else AckType.ACCEPT


def _share_deliveries(kafka: KafkaConfig, group: str, source: str, timeout_s: float = 30) -> list[Message]:
    consumer = KafkaShareConsumer(kafka, group_id=group, overrides={})
    consumer.subscribe([source])
    seen: list[Message] = []
    try:
        deadline = time.monotonic() + timeout_s
        while Counter(m.offset for m in seen) != Counter({**dict.fromkeys(range(8), 1), 5: 2, 6: 2}):
            assert time.monotonic() < deadline, sorted((m.offset, m.delivery_count) for m in seen)
            batch = consumer.poll(1.0)
            for msg in batch:
                consumer.acknowledge(msg, _fate(msg))
            if batch:
                assert all(error is None for error in consumer.commit(asynchronous=False).values())
            seen += batch
    finally:
        consumer.close()
    return seen


def _letters(kafka: KafkaConfig, topic: str, expected: int, timeout_s: float = 30) -> list[tuple[object, ...]]:
    """The broker's dead letters, polled for: it writes them asynchronously."""
    deadline = time.monotonic() + timeout_s
    while len(found := read_direct(kafka, topic, 1, timeout_s=5)) < expected:
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    return found


def test_the_audit_counts_the_broker_dlq_once_beside_ours_and_the_replay_skips_it(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Every source id is accounted for once: accepted (0, 1), in our DLQ with our reason (2, and 7 which
    the broker also holds: ours wins), or in the broker's with `broker_rejected`/`broker_delivery_limit`,
    its coordinates and delivery count (3-6); a repeated broker copy counts once, a copy-less dead letter by
    its coordinates, one with hostile headers as `without_coordinates`, and no job fails. The replay writes
    ours back to the source and counts the broker's as `skipped_broker_dlq`, idempotently."""
    source, group = unique_name("orders"), unique_name("share-group")
    topics = topics_for(source, group, (1_000,))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.dlq, 1))
    admin = make_admin(kafka)
    specs, settings = share_group_provisioning(group, broker_dlq=True)
    ensure_topics(admin, specs)
    set_share_group_config(admin, group, replace(settings, delivery_count_limit=2, heartbeat_interval_ms=1000))
    broker_dlq = specs[0].name
    producer = make_producer(kafka, overrides={"batch.num.messages": 1})
    for i in range(8):
        producer.produce(source, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("trace-id", b"t")])
    assert producer.flush(30) == 0
    ours = {o: failure(o, 1, source=source, tier=None, due_at=None, reason=DlqReason.NON_RETRYABLE) for o in OURS}
    produce(kafka, topics.dlq, [record(h, o) for o, h in sorted(ours.items())])

    deliveries = _share_deliveries(kafka, group, source)
    assert {m.offset for m in deliveries if _fate(m) is AckType.ACCEPT} == {0, 1, 2}
    letters = _letters(kafka, broker_dlq, 5)
    by_offset = {dict(h)["__dlq.errors.offset"]: (k, v, h) for _p, _o, k, v, h in letters}  # type: ignore[misc]
    assert sorted(by_offset) == [b"3", b"4", b"5", b"6", b"7"]
    key, value, copied = by_offset[b"3"]
    hostile = [
        ("__dlq.errors.topic", b"\xff\xfe"),
        ("__dlq.errors.partition", b"0"),
        ("__dlq.errors.offset", b"-1"),
        ("__dlq.errors.delivery.count", b"99999999999999999999"),
        ("__dlq.errors.message", b"rejected " * 5_000),
        ("retry.dlq_reason", b"exhausted"),  # the broker writes no retry headers: not believed
    ]
    copyless = [
        ("__dlq.errors.topic", source.encode()),
        ("__dlq.errors.partition", b"0"),
        ("__dlq.errors.offset", b"100"),
        ("__dlq.errors.delivery.count", b"1"),
    ]
    produce(
        kafka,
        broker_dlq,
        [{"key": key, "value": value, "headers": copied}, {"headers": copyless}, {"headers": hostile}],
    )

    out = tmp_path / "audit"
    summary = audit(spark, kafka, topics, broker_dlq=broker_dlq, out=str(out))

    assert summary["dlq"]["by_reason"] == {
        "broker_rejected": 3,
        "broker_delivery_limit": 2,
        "non_retryable": 2,
        "broker_dlq": 1,
    }
    assert summary["dlq"]["records"] == 8
    assert summary["dlq"]["broker"] == {
        "topic": broker_dlq,
        "records": 8,
        "counted": 6,
        "duplicates_of_ours": 1,
        "duplicates": 1,
        "without_coordinates": 1,
        "by_reason": {"broker_rejected": 3, "broker_delivery_limit": 2, "broker_dlq": 1},
        "by_delivery_count": {"1": 3, "2": 2, "None": 1},
    }
    assert [(s["kind"], s["records"]) for s in summary["stages"]][-2:] == [("dlq", 2), ("broker_dlq", 6)]
    assert summary["lineage"]["by_outcome"] == {"dead_lettered": 7}

    rows = spark.read.parquet(str(out / "records")).where(F.col("kind").isin("dlq", "broker_dlq")).collect()
    counted = [r for r in rows if r.duplicate_of is None]
    ids = Counter(r.origin_message_id for r in counted)
    assert ids == Counter({**{f"{source}-0-{o}": 1 for o in (2, 3, 4, 5, 6, 7, 100)}, None: 1})
    facts = {r.original_offset: (r.kind, r.dlq_reason, r.delivery_count, r.consumer_group) for r in counted}
    assert facts == {
        2: ("dlq", "non_retryable", None, "billing"),
        7: ("dlq", "non_retryable", None, "billing"),
        3: ("broker_dlq", "broker_rejected", 1, group),
        4: ("broker_dlq", "broker_rejected", 1, group),
        5: ("broker_dlq", "broker_delivery_limit", 2, group),
        6: ("broker_dlq", "broker_delivery_limit", 2, group),
        100: ("broker_dlq", "broker_dlq", 1, None),
        None: ("broker_dlq", "broker_rejected", None, None),
    }
    [lost] = [r for r in counted if r.original_offset is None]
    assert len(lost.exception_message) == 500
    assert sorted((r.original_offset, r.duplicate_of) for r in rows if r.duplicate_of) == [
        (3, "broker"),
        (7, "retrytopics"),
    ]

    first = replay(spark, kafka, topics, replay_id="r-broker", broker_dlq=broker_dlq)
    again = replay(spark, kafka, topics, replay_id="r-broker", broker_dlq=broker_dlq)
    assert (first["selected"], first["written"], first["skipped_broker_dlq"]) == (2, 2, 6)
    assert first["broker_dlq"]["by_reason"] == {"broker_rejected": 3, "broker_delivery_limit": 2, "broker_dlq": 1}
    assert (again["written"], again["skipped_already_replayed"], again["skipped_broker_dlq"]) == (0, 2, 6)
    replayed = [r for r in read_direct(kafka, source, 1) if r[1] >= 8]
    assert sorted(r[3] for r in replayed) == [b"v2", b"v7"]  # type: ignore[type-var]
    for _p, _o, _k, _v, headers in replayed:
        assert dict(headers)["retry.replay_id"] == b"r-broker"  # type: ignore[call-overload]


def _hostile_headers(rng: random.Random) -> list[tuple[str, bytes | None]]:
    values: list[bytes | None] = [
        None,
        b"",
        b"0",
        b"7",
        b"-1",
        b"007",
        b"+3",
        b" 4",
        b"2147483647",
        b"2147483648",
        b"9223372036854775807",
        b"9223372036854775808",
        "١٢".encode(),
        b"\xff\xfe",
        b"orders.v1",
        b"a/b",
        b"x" * 260,
        b"Offset rejected by client.",
        b"Offset delivery count exceeded the threshold.",
        "Zurückgewiesen: REJECTED ".encode() * 40,
    ]
    keys = [*B.HEADERS, "retry.dlq_reason", "retry.origin_message_id", "__dlq.errors"]
    return [(rng.choice(keys), rng.choice(values)) for _ in range(rng.randint(0, 10))]


def test_spark_reads_broker_headers_as_the_pure_decoder_does(spark: SparkSession) -> None:
    """The audit's Spark SQL decoding of `__dlq.errors.*` headers equals `core.broker_dlq` (held by
    hypothesis over hostile bytes in tests/unit/core/test_broker_dlq.py) on 400 hostile header sets: missing,
    repeated, non-UTF-8, non-canonical and out-of-range values; and the retry headers there are not believed."""
    rng = random.Random(1191)
    samples = [_hostile_headers(rng) for _ in range(400)]
    schema = "topic string, headers array<struct<key: string, value: binary>>"
    df = spark.createDataFrame([("dlq.g", [(k, v) for k, v in h]) for h in samples], schema)
    df = df.withColumn("n", F.monotonically_increasing_id())
    rows = sorted(with_broker_columns(with_retry_columns(df), "dlq.g").collect(), key=lambda r: r["n"])
    for headers, row in zip(samples, rows, strict=True):
        want = B.decode_broker_dead_letter(headers)
        got = (
            row.original_topic,
            row.original_partition,
            row.original_offset,
            row.consumer_group,
            row.delivery_count,
            row.exception_message,
            row.dlq_reason,
            row.origin_message_id,
        )
        expected = (
            want.topic,
            want.partition,
            want.offset,
            want.group,
            want.delivery_count,
            want.message,
            want.reason,
            want.origin_message_id,
        )
        assert got == expected, headers
        assert row.exception_type is None and row.reconsume_times is None
