"""Guarantee: the project's Python data source reads exactly what Spark's own Kafka connector
(spark-sql-kafka-0-10, resolved by scripts/setup.sh) reads, row for row and column for column, for the same
options; and the audit gives the same answer through either (checked in test_audit.py, on its ground-truth
pipeline). Runs wherever the connector jars are cached (always in CI: setup resolves them). Replay too: the
same selection, the same records written, and a rerun with the same replay id writes nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.spark_kafka import read_kafka
from retrytopics.spark.replay import replay
from retrytopics.spark.session import builtin_kafka_jars

from .conftest import create_topics, produce, read_direct
from .pipeline_data import NOW, build_pipeline

pytestmark = [pytest.mark.broker, pytest.mark.spark]


@pytest.fixture(scope="module", autouse=True)
def connector_present() -> None:
    if not builtin_kafka_jars():
        message = "Spark's Kafka connector is not in the cache: run scripts/setup.sh (it needs Maven)"
        if os.environ.get("CI"):
            pytest.fail(message)  # never a silent skip in CI
        pytest.skip(message)


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    columns = [
        c
        for c in ("topic", "partition", "offset", "key", "value", "timestamp", "timestampType", "headers")
        if c in df.columns
    ]
    return [tuple(row) for row in df.select(*columns).orderBy("topic", "partition", "offset").collect()]


def _both(spark: SparkSession, options: dict[str, str]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return _rows(read_kafka(spark, options, kafka_format="python")), _rows(
        read_kafka(spark, options, kafka_format="builtin")
    )


@pytest.fixture(scope="module")
def two_topics(kafka: KafkaConfig, request: pytest.FixtureRequest) -> tuple[str, str]:
    prefix = f"parity-{os.getpid()}-{request.node.name[:20]}"
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topics(kafka, (first, 3), (second, 2))
    records: list[dict[str, Any]] = []
    for i in range(60):
        record: dict[str, Any] = {
            "key": None if i % 7 == 0 else f"k{i}".encode(),
            "value": b"" if i % 11 == 0 else f"v{i}".encode(),
            "partition": i % 3,
        }
        if i % 2:  # half without headers: NULL, not an empty array, in both sources
            record["headers"] = [("h", f"{i}".encode()), ("null-value", None), ("h", b"\x00\xff")]
        records.append(record)
    produce(kafka, first, records)
    produce(kafka, second, [{"key": b"x", "value": f"w{i}".encode(), "partition": i % 2} for i in range(10)])
    return first, second


def test_subscribe_with_headers_reads_the_same_rows(
    spark: SparkSession, options: dict[str, str], two_topics: tuple[str, str]
) -> None:
    first, second = two_topics
    python, builtin = _both(spark, {**options, "subscribe": f"{first},{second}", "includeHeaders": "true"})
    assert len(python) == 70 and python == builtin
    assert any(row[7] is None for row in python) and any(row[7] for row in python)


def test_assign_with_explicit_offsets_reads_the_same_rows(
    spark: SparkSession, options: dict[str, str], two_topics: tuple[str, str]
) -> None:
    first, second = two_topics
    python, builtin = _both(
        spark,
        {
            **options,
            "assign": json.dumps({first: [0, 2], second: [1]}),
            "startingOffsets": json.dumps({first: {"0": 3, "2": -2}, second: {"1": 1}}),
            "endingOffsets": json.dumps({first: {"0": 10, "2": -1}, second: {"1": -1}}),
        },
    )
    assert python == builtin
    assert {(r[0], r[1]) for r in python} == {(first, 0), (first, 2), (second, 1)}
    assert (
        min(r[2] for r in python if r[:2] == (first, 0)) == 3 and max(r[2] for r in python if r[:2] == (first, 0)) == 9
    )


def test_subscribe_pattern_without_headers_reads_the_same_rows(
    spark: SparkSession, options: dict[str, str], two_topics: tuple[str, str]
) -> None:
    first, _ = two_topics
    python, builtin = _both(spark, {**options, "subscribePattern": first.rsplit("-", 1)[0] + "-.*"})
    assert len(python) == 70 and python == builtin


def test_timestamp_positions_read_the_same_rows(
    spark: SparkSession, options: dict[str, str], kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """startingTimestamp / endingOffsetsByTimestamp resolve through offsets_for_times on the broker."""
    topic = unique_name("stamped")
    create_topics(kafka, (topic, 2))
    base = 1_700_000_000_000
    produce(
        kafka, topic, [{"value": f"v{i}".encode(), "partition": i % 2, "timestamp": base + i * 1000} for i in range(40)]
    )
    python, builtin = _both(
        spark,
        {
            **options,
            "subscribe": topic,
            "startingTimestamp": str(base + 10_500),
            "endingOffsetsByTimestamp": json.dumps({topic: {"0": base + 30_000, "1": base + 35_500}}),
        },
    )
    assert python == builtin
    stamps = sorted(int(row[5].timestamp() * 1000) - base for row in python)
    assert stamps == [i * 1000 for i in range(11, 30)] + [i * 1000 for i in range(31, 36, 2)]


def test_replay_is_the_same_through_either_format(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    through_python = build_pipeline(kafka, unique_name("orders"))
    through_builtin = build_pipeline(kafka, unique_name("orders"))
    runs = {}
    for kafka_format, topics in (("python", through_python), ("builtin", through_builtin)):
        before = len(read_direct(kafka, topics.source, 1))
        result = replay(spark, kafka, topics, replay_id="parity", now_ms=NOW, kafka_format=kafka_format)
        rerun = replay(spark, kafka, topics, replay_id="parity", now_ms=NOW, kafka_format=kafka_format)
        assert (rerun["written"], rerun["skipped_already_replayed"]) == (0, result["written"])
        written = read_direct(kafka, topics.source, 1)[before:]
        # each run's replay mark is keyed by its own nonce (the rerun above holds that it verifies): one each
        assert all(sum(k == "retry.replay_mark" for k, _ in headers) == 1 for *_, headers in written)
        # the records as written, with the source's own name and the mark taken out (the two pipelines differ
        # only there)
        runs[kafka_format] = (
            {k: v for k, v in result.items() if k != "destination_topics"},
            [
                (
                    key,
                    value,
                    [
                        (k, (v or b"").replace(topics.source.encode(), b"SRC"))
                        for k, v in headers
                        if k != "retry.replay_mark"
                    ],
                )
                for _, _, key, value, headers in written
            ],
        )
    assert runs["python"] == runs["builtin"]
    assert runs["python"][0]["written"] == 2 and len(runs["python"][1]) == 2
