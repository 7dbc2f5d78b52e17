"""The broker-written DLQ of a share group (KIP-1191) as dead letters beside retrytopics' own.

A broker dead letter carries no `retry.*` headers (the broker copies key and value only); what it says is in
its `__dlq.errors.*` headers, read here in Spark SQL with the rules of `retrytopics.core.broker_dlq` (a
header missing, repeated, not UTF-8, not canonical or out of range reads as NULL; texts are bounded), so a
bad header never fails a job. On a broker dead letter's row:

- `dlq_reason`: `broker_rejected`, `broker_delivery_limit` or `broker_dlq` (from the broker's message);
- `original_topic`, `original_partition`, `original_offset`, `consumer_group`: the source record and group;
- `delivery_count`: how many times the group delivered it; `exception_message`: the broker's message;
- `origin_message_id`: `<topic>-<partition>-<offset>` of the source record (the id retrytopics gives a
  record without an id header: the broker does not copy an id header), NULL without coordinates;
- every other typed retry column NULL, whatever headers the record has: the broker writes none, so any
  there was written by someone else.

Counted once (`duplicate_of`): a broker dead letter of a source record that our own DLQ also holds (same
source topic, partition and offset) is `duplicate_of = "retrytopics"`: ours wins, it carries the failure's
reason, exception and lineage, and the replay can replay it. A second broker copy of one source record
(the broker writes asynchronously, so duplicates are possible) is `duplicate_of = "broker"`: the first
(lowest offset) counts. NULL on every row that counts.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from retrytopics.core import broker_dlq as B
from retrytopics.spark.columns import RETRY_COLUMNS, header_bytes

__all__ = ["BROKER_KIND", "broker_summary", "mark_duplicates", "with_broker_columns"]

#: The audit's `kind` of a row read from the broker's DLQ.
BROKER_KIND = "broker_dlq"

_INT32 = 2**31 - 1
_COORDINATES = ("original_topic", "original_partition", "original_offset")


def _text(key: str) -> Column:
    """The header's text when it is there exactly once and valid UTF-8, else NULL."""
    raw = header_bytes(key)
    return F.when(F.is_valid_utf8(raw), raw.cast("string"))


def _number(key: str, low: int, high: int) -> Column:
    """The header's canonical decimal text (it reads back as the same text) within [low, high], else NULL."""
    text = _text(key)
    number = text.try_cast("bigint")
    return F.when((number.cast("string") == text) & number.between(low, high), number)


def _reason(message: Column) -> Column:
    lowered = F.lower(F.coalesce(message, F.lit("")))
    reason = F.lit(B.DEFAULT_BROKER_REASON)
    for text, name in reversed(B.BROKER_REASONS):  # the first match wins, so it is the outermost WHEN
        reason = F.when(lowered.contains(text), F.lit(name)).otherwise(reason)
    return reason


def _decoded() -> dict[str, Column]:
    topic = _text(B.TOPIC)
    topic = F.when(topic.rlike(r"^[a-zA-Z0-9._-]{1,249}$"), topic)
    partition = _number(B.PARTITION, 0, _INT32).cast("int")
    offset = _number(B.OFFSET, 0, 2**63 - 1)
    message = F.substring(_text(B.MESSAGE), 1, B.MESSAGE_LIMIT)
    origin = F.when(
        topic.isNotNull() & partition.isNotNull() & offset.isNotNull(),
        F.concat_ws("-", topic, partition.cast("string"), offset.cast("string")),
    )
    return {
        "original_topic": topic,
        "original_partition": partition,
        "original_offset": offset,
        "consumer_group": F.substring(_text(B.GROUP), 1, B.GROUP_LIMIT),
        "exception_message": message,
        "dlq_reason": _reason(message),
        "origin_message_id": origin,
        "delivery_count": _number(B.DELIVERY_COUNT, 1, _INT32).cast("int"),
    }


def with_broker_columns(df: DataFrame, broker_topic: str) -> DataFrame:
    """`df` (Kafka rows with headers and the typed retry columns) with the rows of `broker_topic` decoded as
    the module docstring says, and a `delivery_count` column (NULL on every other row)."""
    is_broker = F.col("topic") == broker_topic
    decoded = _decoded()
    replaced = {
        name: F.when(is_broker, decoded.get(name, F.lit(None)).cast(df.schema[name].dataType)).otherwise(F.col(name))
        for name in RETRY_COLUMNS
        if name in df.columns
    }
    replaced["delivery_count"] = F.when(is_broker, decoded["delivery_count"])
    return df.withColumns(replaced)


def mark_duplicates(records: DataFrame) -> DataFrame:
    """`records` (the audit's rows: `kind` is dlq or broker_dlq on dead letters) plus `duplicate_of`, NULL on
    every row that counts (see the module docstring: ours wins, then the broker's first copy)."""
    ours = (
        records.where(F.col("kind") == "dlq")
        .where(F.col("original_topic").isNotNull())
        .select(*_COORDINATES)
        .distinct()
        .withColumn("__ours", F.lit(True))
    )
    broker = records.where(F.col("kind") == BROKER_KIND)
    located = F.col("original_topic").isNotNull() & F.col("original_partition").isNotNull()
    located &= F.col("original_offset").isNotNull()
    earlier = F.row_number().over(Window.partitionBy(*_COORDINATES).orderBy("partition", "offset"))
    marked = broker.join(F.broadcast(ours), list(_COORDINATES), "left").withColumn(
        "duplicate_of",
        F.when(F.col("__ours"), F.lit("retrytopics")).when(located & (earlier > 1), F.lit("broker")),
    )
    others = records.where(F.col("kind") != BROKER_KIND).withColumn("duplicate_of", F.lit(None).cast("string"))
    return others.unionByName(marked.drop("__ours"))


def broker_summary(records: DataFrame, broker_topic: str) -> dict[str, Any]:
    """The broker DLQ's numbers in one aggregation: its records, those counted (not a duplicate), duplicates
    of ours and of its own, those without readable coordinates, and counted ones by reason and delivery
    count."""
    rows = (
        records.where(F.col("kind") == BROKER_KIND)
        .groupBy("duplicate_of", "dlq_reason", "delivery_count", F.col("origin_message_id").isNull().alias("lost"))
        .count()
        .collect()
    )
    counted = [r for r in rows if r.duplicate_of is None]
    by_reason: dict[str, int] = {}
    by_count: dict[str, int] = {}
    for r in counted:
        by_reason[str(r.dlq_reason)] = by_reason.get(str(r.dlq_reason), 0) + r["count"]
        by_count[str(r.delivery_count)] = by_count.get(str(r.delivery_count), 0) + r["count"]
    return {
        "topic": broker_topic,
        "records": sum(r["count"] for r in rows),
        "counted": sum(r["count"] for r in counted),
        "duplicates_of_ours": sum(r["count"] for r in rows if r.duplicate_of == "retrytopics"),
        "duplicates": sum(r["count"] for r in rows if r.duplicate_of == "broker"),
        "without_coordinates": sum(r["count"] for r in counted if r.lost),
        "by_reason": dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        "by_delivery_count": dict(sorted(by_count.items())),
    }
