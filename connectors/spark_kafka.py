"""A Kafka source and sink for PySpark, written with the Python Data Source API (no JVM connector jar).

Format name `retrytopics-kafka`; rows have exactly the schema of Spark's built-in `kafka` source and the
options mirror its names (see docs/spark.md)::

    from retrytopics.connectors.spark_kafka import read_kafka, write_kafka
    df = read_kafka(spark, {"kafka.bootstrap.servers": "b:9092", "subscribe": "orders.billing.dlq",
                            "includeHeaders": "true"})
    write_kafka(df.select("key", "value", "headers"), {"kafka.bootstrap.servers": "b:9092", "topic": "orders"})

`read_kafka(..., kafka_format="builtin")` and `write_kafka(..., kafka_format="builtin")` use Spark's own
`kafka` format instead, on clusters that have the spark-sql-kafka jar. Executors need retrytopics and
confluent-kafka installed (a packed venv shipped with `spark.archives`).
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from retrytopics.connectors import spark_kafka_plan as plan
from retrytopics.connectors.spark_kafka_plan import OffsetRange, get_option
from retrytopics.core.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession

__all__ = ["FORMAT", "KAFKA_SCHEMA", "KafkaDataSource", "kafka_options", "read_kafka", "register", "write_kafka"]

#: The format name this data source registers.
FORMAT: Final = "retrytopics-kafka"
_HEADERS: Final = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
#: Spark's built-in Kafka source schema (every field nullable); `headers` only with includeHeaders=true.
KAFKA_SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", _HEADERS),
    ]
)


_flag = plan.bool_option


class _Settings:
    """Everything a reader needs on the executors, parsed once on the driver (picklable, no clients)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.props = plan.client_properties(options)
        self.include_headers = _flag(options, "includeHeaders", False)
        self.fail_on_data_loss = _flag(options, "failOnDataLoss", True)
        self.min_partitions = plan.int_option(options, "minPartitions", None)
        self.max_records = plan.int_option(options, "maxRecordsPerPartition", None)
        self.max_offsets_per_trigger = plan.int_option(options, "maxOffsetsPerTrigger", None)
        self.min_offsets_per_trigger = plan.int_option(options, "minOffsetsPerTrigger", None)
        self.max_trigger_delay_ms = plan.duration_option(options, "maxTriggerDelay", 15 * 60_000)
        self.poll_timeout_s = (plan.int_option(options, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000) / 1000
        self.batch_size = plan.int_option(options, "fetch.batchSize", 10_000) or 10_000
        self.strategy = (get_option(options, "startingOffsetsByTimestampStrategy") or "error").lower()
        self.subscription = plan.subscription_from_options(options)
        self.options = dict(options)


class _Range(InputPartition):
    """One Spark task: offsets `[start, end)` of one topic-partition."""

    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


def _positions(
    settings: _Settings, which: str, default: str, tps: Sequence[plan.TopicPartitionKey], resolver: Any, wm: Any
) -> dict[plan.TopicPartitionKey, int]:
    """Concrete offsets for a starting/ending position: timestamp options win over offset options."""
    prefix = which.removesuffix("Offsets")
    by_time = plan.timestamp_spec(settings.options, prefix)
    if by_time is None:
        spec = plan.parse_offset_spec(get_option(settings.options, which), which=which, default=default)
        return plan.resolve_offsets(spec, tps, wm, which=which)
    times = {tp: by_time if isinstance(by_time, int) else by_time.get(tp, -1) for tp in tps}
    answers = resolver.offsets_for_times(times)
    found = plan.resolve_timestamps(by_time, tps, answers, which=f"{prefix}Timestamp", strategy=settings.strategy)
    return plan.resolve_offsets(found, tps, wm, which=which)


def _read(settings: _Settings, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    from retrytopics.connectors.spark_kafka_io import read_range

    r = getattr(partition, "range", None)
    if r is None:  # Spark replaces an empty plan with [InputPartition(None)]
        return iter(())
    return read_range(
        settings.props,
        r,
        include_headers=settings.include_headers,
        batch_size=settings.batch_size,
        poll_timeout_s=settings.poll_timeout_s,
        fail_on_data_loss=settings.fail_on_data_loss,
    )


class _BatchReader(DataSourceReader):
    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    def partitions(self) -> list[InputPartition]:
        from retrytopics.connectors.spark_kafka_io import OffsetResolver

        s = self.settings
        if (get_option(s.options, "startingOffsets") or "").strip().lower() == "latest":
            raise ConfigError("startingOffsets", "latest", "a batch query cannot start at latest (as in Spark)")
        with OffsetResolver(s.props) as resolver:
            tps = resolver.topic_partitions(s.subscription)
            wm = resolver.watermarks(tps)
            starts = _positions(s, "startingOffsets", "earliest", tps, resolver, wm)
            ends = _positions(s, "endingOffsets", "latest", tps, resolver, wm)
        ranges = plan.plan_ranges(starts, ends, wm, fail_on_data_loss=s.fail_on_data_loss)
        ranges = plan.split_ranges(ranges, min_partitions=s.min_partitions, max_records=s.max_records)
        return [_Range(r) for r in ranges] or [_Range(OffsetRange("", 0, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.settings, partition)


def _as_spark(offsets: Mapping[plan.TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def _from_spark(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[plan.TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in (offsets or {}).items() for p, o in parts.items()}


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets are Spark's JSON shape `{"topic": {"0": 123}}`; nothing is committed to
    Kafka (the checkpoint is the only position, as with the built-in source)."""

    def __init__(self, settings: _Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._target: dict[plan.TopicPartitionKey, int] | None = None
        self._clock = clock
        self._last_trigger_ms: int | None = None  # the reader lives in one driver process for the whole query

    def _latest(self) -> tuple[dict[plan.TopicPartitionKey, int], dict[plan.TopicPartitionKey, tuple[int, int]]]:
        from retrytopics.connectors.spark_kafka_io import OffsetResolver

        with OffsetResolver(self.settings.props) as resolver:
            wm = resolver.watermarks(resolver.topic_partitions(self.settings.subscription))
        return {tp: high for tp, (_, high) in wm.items()}, wm

    def initialOffset(self) -> dict[str, dict[str, int]]:
        from retrytopics.connectors.spark_kafka_io import OffsetResolver

        s = self.settings
        with OffsetResolver(s.props) as resolver:
            tps = resolver.topic_partitions(s.subscription)
            wm = resolver.watermarks(tps)
            return _as_spark(_positions(s, "startingOffsets", "latest", tps, resolver, wm))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.settings.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target, _ = self._latest()

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit) -> dict[str, dict[str, int]]:
        latest, _ = self._latest() if self._target is None else (self._target, None)
        begin = _from_spark(start)
        if self._target is None and self._waits(begin, latest):
            return start  # no new micro-batch yet
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = plan.allocate_limit(begin, latest, max_rows)
        return _as_spark({tp: max(end, begin.get(tp, 0)) for tp, end in ends.items()})

    def _waits(self, begin: Mapping[plan.TopicPartitionKey, int], latest: Mapping[plan.TopicPartitionKey, int]) -> bool:
        """`minOffsetsPerTrigger`/`maxTriggerDelay` (not with Trigger.AvailableNow, which reads what there is)."""
        s = self.settings
        if s.min_offsets_per_trigger is None:
            return False
        available = sum(max(0, end - begin.get(tp, 0)) for tp, end in latest.items())
        now_ms = int(self._clock() * 1000)
        if plan.delay_batch(
            available, s.min_offsets_per_trigger, now_ms, self._last_trigger_ms, s.max_trigger_delay_ms
        ):
            return True
        self._last_trigger_ms = now_ms
        return False

    def partitions(self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]) -> list[InputPartition]:
        begin, stop = _from_spark(start), _from_spark(end)
        _, wm = self._latest()
        starts = {tp: begin.get(tp, wm.get(tp, (0, 0))[0]) for tp in stop}
        wm = {tp: (wm.get(tp, (0, 0))[0], max(stop[tp], wm.get(tp, (0, 0))[1])) for tp in stop}
        ranges = plan.plan_ranges(starts, stop, wm, fail_on_data_loss=self.settings.fail_on_data_loss)
        s = self.settings
        return [
            _Range(r) for r in plan.split_ranges(ranges, min_partitions=s.min_partitions, max_records=s.max_records)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.settings, partition)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: like Spark's source, progress lives in the checkpoint only."""


class KafkaCommit(WriterCommitMessage):
    """One writer task's report: records acknowledged, per topic-partition counts, seconds."""

    def __init__(self, records: int, per_partition: dict[str, int], seconds: float) -> None:
        self.records = records
        self.per_partition = per_partition
        self.seconds = seconds


class _Producing:
    """What a batch and a streaming writer task share: produce the rows, flush, fail on any delivery error
    (at-least-once, as Spark's sink)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.props = plan.client_properties(options)
        self.topic = get_option(options, "topic")
        self.flush_timeout_s = (plan.int_option(options, "flushTimeoutMs", 120_000) or 120_000) / 1000
        rate = plan.int_option(options, "maxRecordsPerSecondPerTask", None)
        self.rate_per_s = float(rate) if rate else None
        self.fail_retried_tasks = _flag(options, "failRetriedTasks", False)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommit:
        from pyspark import TaskContext

        from retrytopics.connectors.spark_kafka_io import produce_batches

        context = TaskContext.get()
        if self.fail_retried_tasks and context is not None and context.attemptNumber() > 0:
            # A retried task would resend what the failed attempt delivered; the caller (the replay job)
            # prefers a failed job that it can rerun idempotently.
            raise ConfigError("failRetriedTasks", "true", "this write task was retried; rerun the job instead")
        report = produce_batches(
            self.props, iterator, topic=self.topic, flush_timeout_s=self.flush_timeout_s, rate_per_s=self.rate_per_s
        )
        return KafkaCommit(report.records, report.per_partition, report.seconds)


class _ArrowWriter(_Producing, DataSourceArrowWriter):
    """Batch writes (`df.write`)."""


class _StreamArrowWriter(_Producing, DataSourceStreamArrowWriter):
    """Streaming writes (`df.writeStream`): each micro-batch's tasks produce their rows; nothing to commit
    or undo afterwards, as with Spark's sink (a retried batch sends its rows again: at-least-once)."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task's records were acknowledged before it returned."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already sent cannot be taken back (Spark's sink does the same)."""


def validate_sink_schema(schema: StructType, topic_option: str | None) -> None:
    """Spark's sink rules: value string|binary (required); key string|binary; topic string (or the option);
    headers array<struct<key string, value binary>>; partition int; timestamp timestamp."""
    fields = {f.name: f.dataType for f in schema.fields}
    text_or_bytes = (StringType(), BinaryType())
    rules: dict[str, tuple[Any, ...]] = {
        "value": text_or_bytes,
        "key": text_or_bytes,
        "topic": (StringType(),),
        "headers": (_HEADERS,),
        "partition": (IntegerType(),),
        "timestamp": (TimestampType(),),
    }
    if "value" not in fields:
        raise ConfigError("value", None, "the DataFrame to write needs a value column (string or binary)")
    if "topic" not in fields and not topic_option:
        raise ConfigError("topic", None, "set the topic option or provide a topic column")
    for name, allowed in rules.items():
        if name in fields and fields[name] not in allowed:
            shown = [t.simpleString() for t in allowed]
            raise ConfigError(name, fields[name].simpleString(), f"column type must be one of {shown}")


class KafkaDataSource(DataSource):
    """Format `retrytopics-kafka`: Spark's Kafka source and sink contract, on confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if _flag(self.options, "includeHeaders", False):
            return KAFKA_SCHEMA
        return StructType(KAFKA_SCHEMA.fields[:-1])

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_Settings(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = _Settings(self.options)
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if get_option(self.options, name) is not None:
                raise ConfigError(name, get_option(self.options, name), "ending positions are for batch queries only")
        return _StreamReader(settings)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:  # Kafka cannot truncate a topic: refused, as Spark's kafka sink refuses it
            raise ConfigError("mode", "overwrite", "save mode Overwrite is not allowed for Kafka: use append")
        validate_sink_schema(schema, get_option(self.options, "topic"))
        return _ArrowWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        # Every output mode is accepted, as by Spark's sink: complete mode writes the whole result again.
        validate_sink_schema(schema, get_option(self.options, "topic"))
        return _StreamArrowWriter(self.options)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register the format with this session, once (auto-discovery through `pyspark_retrytopics` also works
    when the package is installed normally, not in editable mode). Registering pickles the class and
    costs a JVM round trip (about 0.1-0.4 s), so repeated calls for the same session are free."""
    if spark in _registered:
        return
    spark.dataSource.register(KafkaDataSource)
    _registered.add(spark)


class Py4jSecretFilter(logging.Filter):
    """Hides the value of a secret option in py4j's DEBUG lines. py4j logs every command it sends to the JVM
    ("Command to send: ...", one argument a line, strings prefixed with "s"), so an option such as
    `kafka.sasl.password` passed to a reader or writer would be logged in clear."""

    _SECRET_VALUE = re.compile(
        r"(\ns[^\n]*(?:password|secret|jaas\.config|private\.key)[^\n]*\n)s[^\n]*", re.IGNORECASE
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = self._SECRET_VALUE.sub(r"\1s[hidden]", message)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True


def _guard_py4j_logs() -> None:
    # Filters on a logger do not see its children's records: attach to the loggers py4j writes commands to.
    for name in ("py4j.clientserver", "py4j.java_gateway"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, Py4jSecretFilter) for f in logger.filters):
            logger.addFilter(Py4jSecretFilter())


def kafka_options(kafka: Any, **extra: str) -> dict[str, str]:
    """`kafka.*` options from a :class:`~retrytopics.connectors.config.KafkaConfig` (secrets included:
    never log the result), plus `extra` options. From the first call on, py4j's command log hides secret
    option values (`Py4jSecretFilter`)."""
    _guard_py4j_logs()
    # Producer and consumer overrides both go in: librdkafka ignores the other kind's properties.
    props = {**kafka.client_config(), **kafka.consumer_overrides, **kafka.producer_overrides}
    props.pop("client.id", None)
    return {**{f"kafka.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in props.items()}, **extra}


def _format(kafka_format: str) -> str:
    if kafka_format not in ("python", "builtin"):
        raise ConfigError("kafka_format", kafka_format, "expected 'python' (this data source) or 'builtin'")
    return FORMAT if kafka_format == "python" else "kafka"


def read_kafka(
    spark: SparkSession, options: Mapping[str, str], *, kafka_format: str = "python", stream: bool = False
) -> DataFrame:
    """A batch (or, with `stream=True`, streaming) DataFrame of Kafka records."""
    fmt = _format(kafka_format)
    if fmt == FORMAT:
        register(spark)
    reader: DataFrameReader | Any = spark.readStream if stream else spark.read
    return reader.format(fmt).options(**dict(options)).load()


def write_kafka(df: DataFrame, options: Mapping[str, str], *, kafka_format: str = "python") -> None:
    """Write `df` (value, and optionally topic, key, headers, partition, timestamp) to Kafka; raises if any
    record was not acknowledged."""
    fmt = _format(kafka_format)
    if fmt == FORMAT:
        register(df.sparkSession)
    df.write.format(fmt).options(**dict(options)).mode("append").save()
