"""The Kafka I/O of the Spark data source: driver-side offset lookups, the executor-side range reader and
the executor-side task writer. Needs confluent-kafka and pyarrow, never pyspark.

Every client here is assign()-only: the reader never joins a consumer group and never commits offsets.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

import pyarrow as pa
import tenacity
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from retrytopics.connectors.kafka import delivery_error, map_kafka_errors
from retrytopics.connectors.record_headers import read_headers
from retrytopics.connectors.spark_kafka_plan import OffsetRange, Subscription, TopicPartitionKey
from retrytopics.core.errors import KafkaClientError, PublishError

__all__ = ["ARROW_SCHEMA", "OffsetResolver", "TaskWriteReport", "produce_batches", "read_range"]

_HEADER_TYPE: Final = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: The built-in Kafka source schema in Arrow terms (Spark's TimestampType is microseconds, UTC).
ARROW_SCHEMA: Final = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", _HEADER_TYPE),
    ]
)
_READER_DEFAULTS: Final[dict[str, Any]] = {
    # Spark's built-in source reads with the Java default; pass kafka.isolation.level to change it.
    "isolation.level": "read_uncommitted",
}


def _consumer(props: Mapping[str, str], **extra: Any) -> Consumer:
    config: dict[str, Any] = {**_READER_DEFAULTS, **props, **extra}
    config.setdefault("group.id", f"retrytopics-spark-{uuid.uuid4().hex}")
    config["enable.auto.commit"] = False
    config.setdefault("log_level", 3)
    with map_kafka_errors():
        return Consumer(config)


_COORDINATOR_MOVING: Final = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})


def _coordinator_moving(exc: BaseException) -> bool:
    return isinstance(exc, KafkaClientError) and exc.code in _COORDINATOR_MOVING


class OffsetResolver:
    """Driver-side metadata and offset queries through one group-less consumer; use it as a context
    manager, and never keep it in a reader (readers are pickled)."""

    def __init__(self, props: Mapping[str, str], *, timeout_s: float = 30.0) -> None:
        self._props = dict(props)
        self._consumer = _consumer(props)
        self._timeout_s = timeout_s

    def __enter__(self) -> OffsetResolver:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._consumer.close()

    def partition_counts(self) -> dict[str, int]:
        with map_kafka_errors():
            metadata = self._consumer.list_topics(timeout=self._timeout_s)
        return {
            name: len(meta.partitions)
            for name, meta in metadata.topics.items()
            if meta.error is None and meta.partitions and not name.startswith("__")
        }

    def topic_partitions(self, subscription: Subscription) -> list[TopicPartitionKey]:
        return subscription.select(self.partition_counts())

    def watermarks(self, tps: Sequence[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, int]]:
        """(low, high) per topic-partition, asked of the broker (never cached)."""
        out = {}
        with map_kafka_errors():
            for topic, partition in tps:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self._timeout_s, cached=False
                )
                out[(topic, partition)] = (int(low), int(high))
        return out

    def committed(self, group: str, tps: Sequence[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Offsets `group` has committed (-1001 when none), read without joining the group."""
        if not tps:
            return {}
        probe = _consumer(self._props, **{"group.id": group})
        # A group coordinator that is still loading (a broker just started or moved the group) answers
        # NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS: ask again until the resolver's timeout.
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_coordinator_moving),
            stop=tenacity.stop_after_delay(self._timeout_s),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt, map_kafka_errors():
                    found = probe.committed([TopicPartition(t, p) for t, p in tps], timeout=self._timeout_s)
        finally:
            probe.close()
        return {(c.topic, c.partition): int(c.offset) for c in found}

    def offsets_for_times(self, times: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """First offset whose timestamp is >= the given epoch ms, per topic-partition; -1 when none."""
        if not times:
            return {}
        query = [TopicPartition(t, p, ts) for (t, p), ts in times.items()]
        with map_kafka_errors():
            answers = self._consumer.offsets_for_times(query, timeout=self._timeout_s)
        return {(a.topic, a.partition): int(a.offset) for a in answers}


def _timestamp(message: Any) -> tuple[int | None, int]:
    kind, ms = message.timestamp()
    # librdkafka numbers the types 0/1/2 (none/create/log-append); Spark and Java use -1/0/1.
    return (None if kind == 0 else int(ms) * 1000), kind - 1


def _headers(message: Any) -> list[dict[str, Any]] | None:
    found, _ = read_headers(message)  # a key that is not UTF-8 reads as Spark's own source reads it (U+FFFD)
    return [{"key": k, "value": v} for k, v in found] if found else None


class _Columns:
    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        names = ARROW_SCHEMA.names if include_headers else ARROW_SCHEMA.names[:-1]
        self.data: dict[str, list[Any]] = {n: [] for n in names}

    def add(self, message: Any) -> None:
        ts, kind = _timestamp(message)
        d = self.data
        d["key"].append(message.key())
        d["value"].append(message.value())
        d["topic"].append(message.topic())
        d["partition"].append(message.partition())
        d["offset"].append(message.offset())
        d["timestamp"].append(ts)
        d["timestampType"].append(kind)
        if self.include_headers:
            d["headers"].append(_headers(message))

    def __len__(self) -> int:
        return len(self.data["offset"])

    def take(self) -> pa.RecordBatch:
        schema = ARROW_SCHEMA if self.include_headers else pa.schema(list(ARROW_SCHEMA)[:-1])
        batch = pa.RecordBatch.from_pydict(self.data, schema=schema)
        self.data = {n: [] for n in self.data}
        return batch


def read_range(
    props: Mapping[str, str],
    r: OffsetRange,
    *,
    include_headers: bool,
    batch_size: int = 10_000,
    poll_timeout_s: float = 120.0,
    fail_on_data_loss: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Records `[r.start, r.end)` of one partition as Arrow batches; stops exactly at `r.end`.

    Offsets may have gaps (compaction, transaction markers): the read ends at the first record at or past
    the end, or at the end of the log. Ending short of `r.end` is data loss, an error unless
    `fail_on_data_loss=False`. No record for `poll_timeout_s` is an error (Spark's pollTimeoutMs)."""
    if r.size <= 0:
        return
    consumer = _consumer(props, **{"enable.partition.eof": True, "auto.offset.reset": "error"})
    columns = _Columns(include_headers)
    try:
        with map_kafka_errors():
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        next_offset, waited_since = r.start, time.monotonic()
        while next_offset < r.end:
            messages = consumer.consume(min(batch_size, r.end - next_offset), timeout=1.0)
            if not messages and time.monotonic() - waited_since > poll_timeout_s:
                raise KafkaClientError(
                    f"no record from {r.topic}[{r.partition}] at offset {next_offset} for {poll_timeout_s}s "
                    f"(reading up to {r.end})",
                    code="TIMED_OUT",
                    retriable=True,
                )
            for message in messages:
                next_offset = _accept(message, r, columns, next_offset, fail_on_data_loss)
                if next_offset >= r.end:
                    break
            if messages:
                waited_since = time.monotonic()
            if len(columns) >= batch_size:
                yield columns.take()
    finally:
        consumer.close()
    if len(columns):
        yield columns.take()


def _accept(message: Any, r: OffsetRange, columns: _Columns, next_offset: int, fail_on_data_loss: bool) -> int:
    """Add one message to `columns` and return the next offset to expect (`r.end` when the read is over)."""
    error = message.error()
    if error is not None:
        if error.code() != KafkaError._PARTITION_EOF:
            raise KafkaClientError(
                f"reading {r.topic}[{r.partition}] at {next_offset}: {error.name()}: {error.str()}",
                code=error.name(),
                retriable=error.retriable(),
                fatal=error.fatal(),
            )
        if message.offset() < r.end and fail_on_data_loss and message.offset() <= next_offset:
            raise KafkaClientError(
                f"{r.topic}[{r.partition}] ends at {message.offset()}, before the planned end {r.end} "
                "(records deleted or the log truncated); set failOnDataLoss=false to accept it",
                code="DATA_LOSS",
            )
        return r.end if message.offset() <= next_offset else next_offset
    if message.offset() >= r.end:
        return r.end
    columns.add(message)
    return int(message.offset()) + 1


@dataclass(slots=True)
class TaskWriteReport:
    """What one writer task delivered (the commit message Spark hands back to the driver)."""

    records: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


_PRODUCER_DEFAULTS: Final[dict[str, Any]] = {"enable.idempotence": True, "acks": "all", "linger.ms": 20}


def produce_batches(
    props: Mapping[str, str],
    batches: Iterator[pa.RecordBatch],
    *,
    topic: str | None,
    flush_timeout_s: float = 120.0,
    rate_per_s: float | None = None,
) -> TaskWriteReport:
    """Produce every row of `batches`; flush; raise :class:`PublishError` if any record was not acknowledged.

    `topic` (the `topic` option) overrides a `topic` column. Columns: value (required), key, headers,
    partition, timestamp; str values are UTF-8 encoded. `rate_per_s` caps this task's send rate."""
    started = time.monotonic()
    report = TaskWriteReport()
    failures: list[PublishError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failures.append(delivery_error(err, msg.topic() if msg is not None else "?"))
        else:
            key = f"{msg.topic()}[{msg.partition()}]"
            report.per_partition[key] = report.per_partition.get(key, 0) + 1
            report.records += 1

    with map_kafka_errors():
        producer = Producer({"log_level": 3, **_PRODUCER_DEFAULTS, **props})
    produced = 0
    for batch in batches:
        for row in _rows(batch, topic):
            _produce(producer, row, on_delivery)
            produced += 1
            if rate_per_s:
                _pace(producer, started, produced, rate_per_s)
            if failures:
                raise failures[0]
    with map_kafka_errors():
        remaining = producer.flush(flush_timeout_s)
    if failures:
        raise failures[0]
    if remaining or report.records != produced:
        raise PublishError(topic or "?", f"{produced - report.records} of {produced} records not acknowledged in time")
    report.seconds = time.monotonic() - started
    return report


def _produce(producer: Producer, row: dict[str, Any], on_delivery: Any) -> None:
    while True:
        try:
            with map_kafka_errors():
                producer.produce(on_delivery=on_delivery, **row)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.5)


def _pace(producer: Producer, started: float, produced: int, rate_per_s: float) -> None:
    due = started + produced / rate_per_s
    while (ahead := due - time.monotonic()) > 0:
        producer.poll(min(ahead, 0.1))  # serves delivery callbacks while waiting; returns early on any


def _bytes(value: Any) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def _rows(batch: pa.RecordBatch, topic: str | None) -> Iterator[dict[str, Any]]:
    columns = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    for i in range(batch.num_rows):
        dest = topic or columns["topic"][i]
        if dest is None:
            raise PublishError("null", "a row has a null topic and no topic option is set")
        row: dict[str, Any] = {"topic": dest, "value": _bytes(columns["value"][i])}
        if "key" in columns:
            row["key"] = _bytes(columns["key"][i])
        if columns.get("headers") and columns["headers"][i]:
            row["headers"] = [(h["key"], _bytes(h["value"])) for h in columns["headers"][i]]
        if columns.get("partition") and columns["partition"][i] is not None:
            row["partition"] = columns["partition"][i]
        if columns.get("timestamp") and columns["timestamp"][i] is not None:
            row["timestamp"] = int(columns["timestamp"][i].timestamp() * 1000)
        yield row
