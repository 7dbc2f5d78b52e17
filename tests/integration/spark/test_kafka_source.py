"""Guarantees of the `retrytopics-kafka` data source on a real broker and local Spark:

- a batch read returns exactly the records a direct confluent-kafka read of the same ranges returns
  (offsets, keys, values, header bytes with null values and duplicate keys), in the built-in schema;
- empty partitions and empty topics read as nothing; a range past the end is a clear error, or is clamped
  with failOnDataLoss=false;
- a write round-trips, and a record the broker refuses fails the job;
- a streaming read with trigger(availableNow) reads everything, and a restart from its checkpoint reads
  only what arrived since;
- a streaming write copies records (key, value, headers, partition) exactly; a batch overwrite is refused
  and writes nothing, as with Spark's kafka sink.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.spark_kafka import FORMAT, KAFKA_SCHEMA, read_kafka, write_kafka

from .conftest import create_topics, produce, read_direct

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _records(n: int, partitions: int) -> list[dict[str, object]]:
    out = []
    for i in range(n):
        record: dict[str, object] = {
            "key": None if i % 7 == 0 else f"k{i}".encode(),
            "value": None if i % 11 == 5 else bytes([i % 256, 0, 255]) + str(i).encode(),
            "partition": i % partitions,
        }
        if i % 4:
            record["headers"] = [("dup", b"a"), ("dup", b"b"), ("nul", None), ("bin", bytes([0, i % 256]))]
        out.append(record)
    return out


def _rows(df: object) -> list[tuple[object, ...]]:
    return sorted(
        (r.partition, r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers] if r.headers else None)
        for r in df.collect()  # type: ignore[attr-defined]
    )


def test_batch_read_equals_a_direct_read(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("src")
    create_topics(kafka, (topic, 3))
    produce(kafka, topic, _records(120, 3))
    expected = read_direct(kafka, topic, 3)

    df = read_kafka(spark, {**options, "subscribe": topic, "includeHeaders": "true", "minPartitions": "5"})

    assert df.schema == KAFKA_SCHEMA
    assert df.rdd.getNumPartitions() >= 5  # split in proportion to size, as Spark does
    rows = df.collect()
    assert _rows(df) == expected
    assert {r.topic for r in rows} == {topic} and {r.timestampType for r in rows} == {0}
    assert all(r.timestamp is not None for r in rows)
    no_headers = spark.read.format(FORMAT).options(**options, subscribe=topic).load()
    assert "headers" not in no_headers.columns


def test_explicit_offset_ranges_and_empty_partitions(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    topic, empty = unique_name("ranges"), unique_name("empty")
    create_topics(kafka, (topic, 3), (empty, 2))
    produce(kafka, topic, [{"value": str(i).encode(), "partition": 1} for i in range(20)])

    ranged = read_kafka(
        spark,
        {
            **options,
            "assign": json.dumps({topic: [0, 1, 2]}),
            "startingOffsets": json.dumps({topic: {"0": -2, "1": 5, "2": -2}}),
            "endingOffsets": json.dumps({topic: {"0": -1, "1": 12, "2": -1}}),
        },
    )
    everything = read_kafka(spark, {**options, "subscribePattern": f"({topic}|{empty})"})

    assert sorted(r.offset for r in ranged.collect()) == list(range(5, 12))
    assert everything.count() == 20
    assert read_kafka(spark, {**options, "subscribe": empty}).count() == 0


def test_a_range_beyond_the_end_is_an_error_unless_clamping_is_asked_for(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("beyond")
    create_topics(kafka, (topic, 1))
    produce(kafka, topic, [{"value": b"x"} for _ in range(3)])
    beyond = {**options, "subscribe": topic, "endingOffsets": json.dumps({topic: {"0": 10}})}

    with pytest.raises(Exception, match=r"beyond the high watermark.*holds \[0, 3\)"):
        read_kafka(spark, beyond).count()
    assert read_kafka(spark, {**beyond, "failOnDataLoss": "false"}).count() == 3


def test_write_round_trip_and_a_refused_record_fails_the_job(
    spark: SparkSession, kafka: KafkaConfig, options: dict[str, str], unique_name: Callable[[str], str]
) -> None:
    source, target = unique_name("wsrc"), unique_name("wdst")
    create_topics(kafka, (source, 3), (target, 3))
    produce(kafka, source, _records(90, 3))
    df = read_kafka(spark, {**options, "subscribe": source, "includeHeaders": "true"})

    write_kafka(df.select("key", "value", "headers", "partition"), {**options, "topic": target})

    assert _rows(read_kafka(spark, {**options, "subscribe": target, "includeHeaders": "true"})) == _rows(df)
    bad = df.limit(5).selectExpr("value", "99 AS partition")
    with pytest.raises(Exception, match=r"(?i)unknown.partition"):  # broker code (tansu) or librdkafka's own (Apache)
        write_kafka(bad, {**options, "topic": target})
    with pytest.raises(Exception, match="needs a value column"):
        write_kafka(df.select("key"), {**options, "topic": target})


def test_streaming_available_now_then_restart_reads_only_new_records(
    spark: SparkSession,
    kafka: KafkaConfig,
    options: dict[str, str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("stream")
    create_topics(kafka, (topic, 2))
    produce(kafka, topic, [{"value": f"a{i}".encode(), "partition": i % 2} for i in range(50)])
    stream_options = {**options, "subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "20"}

    def run_once(name: str) -> int:
        stream = read_kafka(spark, stream_options, stream=True)
        query = (
            stream.selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return len([p for p in query.recentProgress if p["numInputRows"] > 0])

    assert run_once("first") == 3  # 50 records, at most 20 per micro-batch
    produce(kafka, topic, [{"value": f"b{i}".encode(), "partition": i % 2} for i in range(7)])
    run_once("second")

    values = [r.value for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(values) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(7)])


def test_stream_writes_to_kafka_and_batch_save_modes_are_sparks(
    spark: SparkSession,
    kafka: KafkaConfig,
    options: dict[str, str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    # setup: a source topic copied by a streaming query into a target, through this data source both ways
    source, target = unique_name("ssrc"), unique_name("sdst")
    create_topics(kafka, (source, 2), (target, 2))
    produce(kafka, source, _records(40, 2))
    stream = read_kafka(
        spark, {**options, "subscribe": source, "startingOffsets": "earliest", "includeHeaders": "true"}, stream=True
    )

    # when
    query = (
        stream.select("key", "value", "headers", "partition")
        .writeStream.format(FORMAT)
        .options(**options, topic=target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)

    # then: the copy equals the source, offsets included (one partition each way, written in order)
    assert query.exception() is None
    assert read_direct(kafka, target, 2) == read_direct(kafka, source, 2)
    # Overwrite is refused, as by Spark's sink, and writes nothing; ErrorIfExists (the default) and Ignore
    # are refused by Spark itself for every Python data source: write_kafka sets append.
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="Overwrite is not allowed"):
        df.write.format(FORMAT).options(**options, topic=target).mode("overwrite").save()
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format(FORMAT).options(**options, topic=target).save()
    assert len(read_direct(kafka, target, 2)) == 40
