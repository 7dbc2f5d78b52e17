"""One local[2] Spark session for every Spark test (starting one costs about 5 s and 1.5 GiB), plus helpers
that produce and read test data directly with confluent-kafka, to compare Spark's answers against."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyspark.sql import SparkSession

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.connectors.spark_kafka import kafka_options, register
from retrytopics.spark.session import builtin_kafka_jars, warm_up_workers

Header = tuple[str, bytes | None]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    builder = SparkSession.builder
    connector = builtin_kafka_jars()  # Spark's own Kafka format, for the parity tests
    if connector:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in connector))
    session = (
        builder.master("local[2]")
        .appName("retrytopics-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")  # one per core, as get_session sets for local masters
        .config("spark.driver.memory", "1g")
        # Tests are short and their data small: C1-only JIT starts faster and spends less CPU compiling
        # (a cold audit here took about a third less time).
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        # No generated code: every test query is new to the session, and on a few dozen records compiling
        # it (Janino, then the JIT) costs more than running it interpreted; a job took about a third less
        # time on 2 cores. Results are the same (Spark falls back to the same interpreted path whenever
        # codegen fails); the cold CLI runs (the replay command, the killed replay, the README tour) still run
        # the jobs as operators do, with codegen.
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    warm_up_workers(session)  # overlaps the Python workers' start with the first test's setup
    yield session
    session.stop()


def cli_env() -> dict[str, str]:
    """The environment for a `retrytopics audit`/`replay` subprocess: this one, plus C1-only JIT for its
    driver JVM through spark-submit's own `SPARK_SUBMIT_OPTS` (added to the driver's java command line; it
    prints nothing, unlike `JAVA_TOOL_OPTIONS`). The command's output is the same; a cold CLI job takes
    about 15% less time on 2 cores (see `get_session(short_job=True)`)."""
    current = os.environ.get("SPARK_SUBMIT_OPTS", "")
    return {**os.environ, "SPARK_SUBMIT_OPTS": f"{current} -XX:TieredStopAtLevel=1".strip()}


@pytest.fixture
def options(kafka: KafkaConfig) -> dict[str, str]:
    """`kafka.*` options for the test broker."""
    return kafka_options(kafka)


def create_topics(kafka: KafkaConfig, *specs: tuple[str, int]) -> None:
    ensure_topics(make_admin(kafka), [TopicSpec(name=name, partitions=n) for name, n in specs])


def produce(kafka: KafkaConfig, topic: str, records: Sequence[dict[str, Any]]) -> None:
    """Produce dicts of produce() keyword arguments (key, value, headers, partition) and wait for acks."""
    producer = make_producer(kafka)
    errors: list[Any] = []
    for record in records:
        producer.produce(topic, on_delivery=lambda err, _m: err and errors.append(err), **record)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors


def read_direct(kafka: KafkaConfig, topic: str, partitions: int, *, timeout_s: float = 30) -> list[tuple[Any, ...]]:
    """Every record of `topic` as (partition, offset, key, value, headers|None), read to the high watermark."""
    consumer = make_consumer(kafka, group_id=None)
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + timeout_s
        while sum(ends.values()) > 0 and time.monotonic() < deadline:
            for m in consumer.consume(500, 0.5):
                if m.error() or m.offset() >= ends.get(m.partition(), 0):
                    continue
                out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers() or None))
                if m.offset() == ends[m.partition()] - 1:
                    ends[m.partition()] = 0
        return sorted(out, key=lambda r: (r[0], r[1]))
    finally:
        consumer.close()
