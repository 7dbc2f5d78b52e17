"""The replay ledger: where a replay id started writing, so that a rerun finds what it already wrote.

The ledger topic (`<dlq>.replays`, one partition) holds small JSON records keyed by replay id. Before its
first write a replay appends `{"event": "started", "marks": {topic: {partition: high watermark}}}`; at the
end `{"event": "finished", ...counts}`. A rerun of the same replay id reads its earliest `started` marks and
scans the destination topics from there for records carrying `retry.replay_id = <id>` (`written_by`): the
source records named by their `retry.replay_original` are already replayed. A record that reached the log
counts, acknowledged or not, so a crash at any point leaves nothing written twice; a record lost in a
crashed producer's buffer is simply written by the rerun.

`retry.replay_original` is `<original_topic>-<original_partition>-<original_offset>` of the replayed DLQ
record: the one source record it stands for. The origin id cannot serve: with `id_header` a producer
chooses it, and two different records sharing one made a rerun skip the second.

Anyone with WRITE on the source can write those two headers too, so a rerun trusts only records it can
attribute to the replay itself: each record a replay writes carries `retry.replay_mark`, an HMAC over
(replay id, destination topic, source record) keyed by a random nonce that the `started` entry keeps
(`retrytopics.core.signing.mark_keys`; with header keys, keyed by a key derived from both, so that reading the
ledger is not enough). A marker without a valid mark is ignored: the record it names is written again, as
if the marker were not there. A mark copied from a genuine record names that record's source record only.
A replay id started by a release without marks (its `started` entry has no nonce) trusts markers as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from confluent_kafka import KafkaError, TopicPartition
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer, map_kafka_errors
from retrytopics.connectors.spark_kafka import kafka_options, read_kafka
from retrytopics.core.errors import ConfigError, KafkaClientError, PublishError
from retrytopics.core.headers import REPLAY_ID
from retrytopics.core.signing import HeaderKeys, mark_verifies, replay_mark, started_mark_keys
from retrytopics.spark.columns import header_text

__all__ = [
    "REPLAY_MARK",
    "REPLAY_ORIGINAL",
    "append",
    "attributed",
    "ledger_topic",
    "mark_header",
    "partition_counts",
    "read_entries",
    "replay_mark_keys",
    "watermarks",
    "written_by",
]

Marks = dict[str, dict[str, int]]

#: Lineage header of a replayed record: the source record its DLQ record stood for (see the module docstring).
#: Written by the replay only; the runtime drops it at the record's next hop, as any `retry.*` header.
REPLAY_ORIGINAL: Final = "retry.replay_original"


#: The HMAC that attributes a replayed record to its replay id (see the module docstring).
REPLAY_MARK: Final = "retry.replay_mark"


def ledger_topic(dlq: str) -> str:
    return f"{dlq}.replays"


def watermarks(kafka: KafkaConfig, topics: Sequence[str]) -> Marks:
    """High watermarks of every partition of `topics` that exists."""
    consumer = make_consumer(kafka, group_id=None)
    marks: Marks = {}
    try:
        with map_kafka_errors():
            metadata = consumer.list_topics(timeout=30)
            for topic in topics:
                meta = metadata.topics.get(topic)
                if meta is None or meta.error is not None:
                    continue
                for partition in meta.partitions:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
                    marks.setdefault(topic, {})[str(partition)] = int(high)
    finally:
        consumer.close()
    return marks


def partition_counts(kafka: KafkaConfig, topics: Sequence[str]) -> dict[str, int]:
    """Partitions of each of `topics` that exists (one metadata request)."""
    consumer = make_consumer(kafka, group_id=None)
    try:
        with map_kafka_errors():
            metadata = consumer.list_topics(timeout=30)
    finally:
        consumer.close()
    found = {t: metadata.topics.get(t) for t in topics}
    return {t: len(meta.partitions) for t, meta in found.items() if meta is not None and meta.error is None}


def written_by(
    spark: SparkSession,
    kafka: KafkaConfig,
    marks: Marks,
    replay_id: str,
    kafka_format: str,
    mark_keys: Sequence[bytes] | None = None,
) -> DataFrame:
    """(topic, source_record) of every record `replay_id` wrote since its first start `marks`; `source_record`
    is the record's `retry.replay_original` (NULL for one written before that header existed). With
    `mark_keys`, only records whose `retry.replay_mark` verifies with one of them count: the others were
    not written by this replay, whatever their headers say."""
    schema = "topic string, source_record string"
    marks = {t: parts for t, parts in marks.items() if parts}
    if not marks:
        return spark.createDataFrame([], schema)
    options = kafka_options(
        kafka,
        assign=json.dumps({t: [int(p) for p in parts] for t, parts in marks.items()}),
        startingOffsets=json.dumps(marks),
        endingOffsets="latest",
        includeHeaders="true",
    )
    written = read_kafka(spark, options, kafka_format=kafka_format).where(header_text(REPLAY_ID) == replay_id)
    written = written.select(
        "topic", header_text(REPLAY_ORIGINAL).alias("source_record"), header_text(REPLAY_MARK).alias("mark")
    )
    if mark_keys is not None:
        keys = tuple(mark_keys)  # inside the function, never a SQL literal: a plan shows its literals

        def attributed(topic: Any, source_record: Any, mark: Any) -> bool:
            if source_record is None or mark is None:
                return False
            given = str(mark).encode("utf-8", "surrogatepass")
            return mark_verifies(keys, replay_id, str(topic), str(source_record), given)

        written = written.where(F.udf(attributed, BooleanType(), useArrow=False)("topic", "source_record", "mark"))
    return written.select("topic", "source_record").distinct()


def mark_header(mark_key: bytes, replay_id: str, topic: Column, source_record: Column) -> Column:
    """The `retry.replay_mark` header (a struct like the others) of a record `replay_id` writes to `topic`
    for `source_record`."""

    def mark(topic: Any, source_record: Any) -> str:
        return replay_mark(mark_key, replay_id, str(topic), str(source_record or ""))

    return F.struct(
        F.lit(REPLAY_MARK).alias("key"),
        F.udf(mark, StringType(), useArrow=False)(topic, source_record).cast("binary").alias("value"),
    )


def append(kafka: KafkaConfig, dlq: str, replay_id: str, entry: Mapping[str, Any]) -> None:
    """Durably append one entry (acks=all, flushed) to the ledger, creating the topic if needed."""
    topic = ledger_topic(dlq)
    ensure_topics(make_admin(kafka), [TopicSpec(name=topic, partitions=1)])
    # One record, flushed before anything else happens: idempotence would guard nothing here, and a fresh
    # idempotent producer waits about 0.5 s for its producer id before its first send.
    producer = make_producer(kafka, overrides={"enable.idempotence": False})
    errors: list[KafkaError] = []
    value = json.dumps({"replay_id": replay_id, "at": int(time.time() * 1000), **entry}, sort_keys=True)

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(error)

    with map_kafka_errors():
        producer.produce(topic, key=replay_id.encode(), value=value.encode(), on_delivery=on_delivery)
        remaining = producer.flush(30)
    if errors or remaining:
        raise PublishError(topic, str(errors[0]) if errors else "not acknowledged in 30s")


def read_entries(kafka: KafkaConfig, dlq: str, replay_id: str, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Every ledger entry of `replay_id`, oldest first (read to the end of the log)."""
    return [entry for key, entry in _read_ledger(kafka, dlq, timeout_s) if key == replay_id.encode()]


def replay_mark_keys(
    kafka: KafkaConfig, dlq: str, header_keys: HeaderKeys | None, *, timeout_s: float = 30.0
) -> dict[str, tuple[bytes, ...] | None]:
    """Per replay id of the ledger, the keys its marks verify with (`started_mark_keys` of its first `started`
    entry; None: a release before marks, trusted as a rerun trusts it). A replay id whose entry cannot be
    checked with `header_keys` (no nonce, or a malformed one) is left out: none of its marks is proven."""
    first: dict[str, dict[str, Any]] = {}
    for key, entry in _read_ledger(kafka, dlq, timeout_s):
        if entry.get("event") == "started":
            first.setdefault(key.decode("utf-8", "replace"), entry)
    out: dict[str, tuple[bytes, ...] | None] = {}
    for replay_id, entry in first.items():
        try:
            out[replay_id] = started_mark_keys(entry, header_keys)
        except ConfigError:
            continue
    return out


def attributed(
    keys_by_id: Mapping[str, tuple[bytes, ...] | None], replay_id: Column, topic: Column, source_record: Column
) -> Column:
    """True when the record's `retry.replay_mark` attributes it to `replay_id` writing `source_record` on `topic`
    (`keys_by_id`: `replay_mark_keys`); never NULL. The keys travel inside the function, never as literals."""
    keys = dict(keys_by_id)

    def check(replay_id: Any, topic: Any, source_record: Any, mark: Any) -> bool:
        if replay_id is None or source_record is None or replay_id not in keys:
            return False
        known = keys[replay_id]
        if known is None:
            return True
        given = None if mark is None else str(mark).encode("utf-8", "surrogatepass")
        return mark_verifies(known, str(replay_id), str(topic), str(source_record), given)

    mark = header_text(REPLAY_MARK)
    return F.udf(check, BooleanType(), useArrow=False)(replay_id, topic, source_record, mark)


def _read_ledger(kafka: KafkaConfig, dlq: str, timeout_s: float) -> list[tuple[bytes, dict[str, Any]]]:
    """Every ledger entry with its key (a replay id), oldest first (read to the end of the log)."""
    topic = ledger_topic(dlq)
    # A short fetch wait: the end of the log is signalled by an empty fetch, which otherwise takes 500 ms.
    consumer = make_consumer(kafka, group_id=None, overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    entries: list[tuple[bytes, dict[str, Any]]] = []
    try:
        with map_kafka_errors():
            if topic not in consumer.list_topics(timeout=timeout_s).topics:
                return []
            consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return entries
                raise KafkaClientError(f"reading {topic}: {error}", code=error.name())
            key, value = message.key(), message.value()
            if key is not None and value is not None:
                try:
                    entry = json.loads(value)
                except ValueError:
                    continue  # not ours: nothing in it is trusted
                if isinstance(entry, dict):
                    entries.append((key, entry))
        raise KafkaClientError(f"reading {topic}: no end of log within {timeout_s}s", code="TIMED_OUT")
    finally:
        consumer.close()
