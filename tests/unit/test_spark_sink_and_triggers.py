"""The Spark data source's sink modes and streaming trigger options, without a session or a broker:
`minOffsetsPerTrigger`/`maxTriggerDelay` were accepted and ignored, `mode("overwrite")` appended silently."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, DataSourceStreamArrowWriter
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import BinaryType, StructField, StructType

from retrytopics.connectors import spark_kafka
from retrytopics.connectors.spark_kafka import KafkaDataSource
from retrytopics.connectors.spark_kafka_plan import delay_batch, duration_option
from retrytopics.core.errors import ConfigError

BOOT = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "topic": "out"}
VALUE = StructType([StructField("value", BinaryType())])


def test_a_batch_needs_min_records_until_the_max_delay_has_passed() -> None:
    assert delay_batch(0, 10, now_ms=0, last_trigger_ms=None, max_delay_ms=1_000) is False  # the first never waits
    assert delay_batch(9, 10, now_ms=999, last_trigger_ms=0, max_delay_ms=1_000) is True
    assert delay_batch(10, 10, now_ms=1, last_trigger_ms=0, max_delay_ms=1_000) is False
    assert delay_batch(1, 10, now_ms=1_000, last_trigger_ms=0, max_delay_ms=1_000) is False


def test_durations_read_as_spark_reads_them() -> None:
    assert duration_option({}, "maxTriggerDelay", 900_000) == 900_000
    assert duration_option({"maxtriggerdelay": "250"}, "maxTriggerDelay", 0) == 250
    assert duration_option({"maxTriggerDelay": "30s"}, "maxTriggerDelay", 0) == 30_000
    assert duration_option({"maxTriggerDelay": "15min"}, "maxTriggerDelay", 0) == 900_000
    with pytest.raises(ConfigError, match="maxTriggerDelay"):
        duration_option({"maxTriggerDelay": "soon"}, "maxTriggerDelay", 0)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _reader(options: dict[str, str], latest: dict[tuple[str, int], int], clock: _Clock) -> Any:
    settings = spark_kafka._Settings(CaseInsensitiveDict(options))
    reader = spark_kafka._StreamReader(settings, clock=clock)
    reader._latest = lambda: (dict(latest), {})  # the broker's end offsets, without a broker
    return reader


def test_the_stream_reader_waits_for_min_offsets_or_the_max_delay() -> None:
    # setup: 3 new records per partition check, at least 10 wanted, at most 2 s of waiting
    clock, latest = _Clock(), {("t", 0): 3}
    reader = _reader({**BOOT, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "2s"}, latest, clock)
    start = {"t": {"0": 0}}

    # when / then: the first trigger runs; then 3 < 10 waits until 2 s have passed
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first == {"t": {"0": 3}}
    latest[("t", 0)] = 6
    clock.now_s += 1.9
    assert reader.latestOffset(first, ReadAllAvailable()) == first
    latest[("t", 0)] = 13
    assert reader.latestOffset(first, ReadAllAvailable()) == {"t": {"0": 13}}  # 10 available
    latest[("t", 0)] = 14
    clock.now_s += 2.0
    assert reader.latestOffset({"t": {"0": 13}}, ReadAllAvailable()) == {"t": {"0": 14}}  # the delay passed


def test_without_min_offsets_every_trigger_takes_what_is_there() -> None:
    reader = _reader(BOOT, {("t", 0): 1}, _Clock())
    assert reader.latestOffset({"t": {"0": 0}}, ReadAllAvailable()) == {"t": {"0": 1}}
    assert reader.latestOffset({"t": {"0": 1}}, ReadAllAvailable()) == {"t": {"0": 1}}


def test_overwrite_is_refused_as_by_sparks_kafka_sink_and_streams_get_a_stream_writer() -> None:
    source = KafkaDataSource(CaseInsensitiveDict(BOOT))
    with pytest.raises(ConfigError, match="Overwrite is not allowed"):
        source.writer(VALUE, True)
    assert isinstance(source.streamWriter(VALUE, False), DataSourceStreamArrowWriter)
    assert isinstance(source.streamWriter(VALUE, True), DataSourceStreamArrowWriter)  # complete mode, as Spark's
    with pytest.raises(ConfigError, match="value"):
        source.streamWriter(StructType([StructField("key", BinaryType())]), False)
