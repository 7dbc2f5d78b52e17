"""Typed decoding: retry headers read back as the typed values that were encoded (bad or duplicated
headers as NULL), and Avro values (plain and Confluent wire format) as struct columns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.serde import avro_serializer
from retrytopics.connectors.spark_kafka import read_kafka
from retrytopics.core.headers import DlqReason, Lineage, RetryHeaders, encode
from retrytopics.spark.columns import load_schema, with_avro_value, with_retry_columns

from .conftest import create_topics, produce

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)


def test_retry_headers_become_typed_columns(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("typed")
    create_topics(kafka, (topic, 1))
    dlq = RetryHeaders(
        reconsume_times=3,
        origin_message_id="orders-0-7",
        original_topic="orders",
        original_partition=0,
        original_offset=7,
        original_timestamp=1_700_000_000_000,
        consumer_group="billing",
        tier=None,
        due_at=None,
        first_failed_at=1_700_000_001_000,
        last_failed_at=1_700_000_009_500,
        exception_type="TimeoutError",
        exception_message="slow",
        exception_trace="Traceback",
        dlq_reason=DlqReason.EXHAUSTED,
        lineage=Lineage(replay_id="r1", replayed_at=1_700_000_000_500, replay_count=1, replay_origin_id="o-1"),
    )
    tier = [
        ("retry.tier", b"1"),
        ("retry.due_at", b"1700000005000"),
        ("retry.reconsume_times", b"007"),
        ("retry.exception_type", b"A"),
        ("retry.exception_type", b"B"),
    ]
    produce(
        kafka,
        topic,
        [
            {"value": b"1", "headers": [("user", b"u"), *encode(dlq)]},
            {"value": b"2", "headers": tier},
            {"value": b"3"},
            {"value": b"4", "headers": [("retry.due_at", str(2**63 - 1).encode())]},
        ],
    )

    rows = (
        with_retry_columns(read_kafka(spark, {**options, "subscribe": topic, "includeHeaders": "true"}))
        .orderBy("offset")
        .collect()
    )

    first = rows[0]
    assert (first.reconsume_times, first.origin_message_id, first.original_offset, first.dlq_reason) == (
        3,
        "orders-0-7",
        7,
        "exhausted",
    )
    assert first.first_failed_at == _ts(1_700_000_001_000) and first.last_failed_at == _ts(1_700_000_009_500)
    assert (first.replay_id, first.replay_count, first.replay_origin_id) == ("r1", 1, "o-1")
    assert first.tier is None and first.due_at is None
    second = rows[1]
    assert second.tier == 1 and second.due_at == _ts(1_700_000_005_000)
    assert second.reconsume_times is None  # "007" is not canonical
    assert second.exception_type is None  # duplicated: ambiguous
    assert rows[2].origin_message_id is None
    assert rows[3].due_at is None  # beyond Spark's timestamps: NULL, where it failed every audit (DATETIME_OVERFLOW)


def test_avro_values_decode_to_structs_plain_and_confluent(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("avro")
    create_topics(kafka, (topic, 1))
    schema = load_schema("order.avsc")
    order = {
        "order_id": "o1",
        "customer_id": "c",
        "amount_cents": 1250,
        "currency": "EUR",
        "created_at": datetime(2026, 1, 2, tzinfo=UTC),
        "items": [{"sku": "s", "quantity": 2}],
    }
    plain, framed = avro_serializer(schema), avro_serializer(schema, wire="confluent", schema_id=42)
    produce(kafka, topic, [{"value": plain(order)}, {"value": b"\x00garbage"}])
    df = read_kafka(spark, {**options, "subscribe": topic})

    rows = with_avro_value(df, schema).orderBy("offset").collect()

    assert rows[0].avro.order_id == "o1" and rows[0].avro.items[0].quantity == 2
    assert rows[0].avro.currency == "EUR" and rows[0].avro.amount_cents == 1250
    assert rows[1].avro is None
    wire_df = spark.createDataFrame([(framed(order),)], "value binary")
    assert with_avro_value(wire_df, schema, wire="confluent", schema_id=42).first().avro.order_id == "o1"
