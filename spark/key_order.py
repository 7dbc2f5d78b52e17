"""The audit's view of key-ordered retries (docs/key-ordering.md): blocked keys, followers, waits behind a head.

    summary["key_order"] = key_order_summary(spark, kafka, topics, records, now_ms=..., kafka_format=...)

What Kafka tells, and so what the numbers mean (docs/spark.md, "Key ordering"):

- *Blocked keys*: the live `chain/...` records of the pipeline's key-state topic, read like the other topics
  and folded by compaction's rule (per partition, the latest record of a key wins and a tombstone deletes it,
  so the answer is the same before and after the broker compacts), decoded with the core's `decode_record`;
  a live chain record that does not decode, names another source or sits in another partition than its
  chain's is counted in `malformed`, never shown. With header keys, a record whose signature is missing or
  wrong is skipped before the fold, as the runtime skips it, and counted in `forged`.
- *Followers*: tier records carrying `retry.key_order.after` (never handled, waiting behind an earlier record
  of their key), counted per tier; *followers per key*: distinct follower records per (source partition,
  record key), over what the tiers still hold.
- *Wait behind a head* of one follower (its source record): from its `retry.key_order.held_at` to the first
  record that shows it ran or was dead-lettered: a DLQ record of it (its Kafka time), a retry hop of it (its
  `first_failed_at`: it ran and failed), else its last follower hop once handled (that hop's Kafka time: it
  ran after, so a lower bound), else now (still waiting). The longest is reported with its source record.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from retrytopics.connectors.admin import partition_count
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin
from retrytopics.connectors.spark_kafka import kafka_options, read_kafka
from retrytopics.core.keyorder.follower import HELD_AT, KEY_ORDER_AFTER
from retrytopics.core.naming import TopicSet
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys
from retrytopics.operator.ops import open_chains
from retrytopics.spark.columns import typed_header
from retrytopics.spark.signatures import state_verified

__all__ = [
    "CHAINS_LISTED",
    "FOLLOWER_COLUMNS",
    "follower_waits",
    "key_order_lines",
    "key_order_summary",
    "with_follower_columns",
]

#: The follower columns the audit adds to every record (NULL on any other record): `key_order_after`,
#: `key_order_held_at` (epoch ms), and `key_digest` (a hash of a follower's record key, to count followers
#: per key without keeping keys; dropped before the audit writes its records).
FOLLOWER_COLUMNS: Final = ("key_order_after", "key_order_held_at", "key_digest")
#: Open chains listed in the summary (oldest first); `blocked_keys` counts them all.
CHAINS_LISTED: Final = 20
#: A key-state record's key and value are never longer (core/keyorder/state_records.py); longer live ones are malformed.
_STATE_BYTES: Final = 512
_SOURCE_RECORD: Final = ("original_topic", "original_partition", "original_offset")


def with_follower_columns(df: DataFrame) -> DataFrame:
    """`df` (with `headers`, `key` and `original_offset`) plus `FOLLOWER_COLUMNS`. A follower header that is
    missing, repeated or not canonical reads as NULL, like every typed header (spark/columns.py)."""
    after = typed_header(KEY_ORDER_AFTER, "long")
    return (
        df.withColumn("key_order_after", after)
        .withColumn("key_order_held_at", typed_header(HELD_AT, "long"))
        .withColumn("key_digest", F.when(after.isNotNull(), F.xxhash64("key")))
    )


def key_order_summary(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    records: DataFrame,
    *,
    now_ms: int,
    kafka_format: str,
    header_keys: HeaderKeys | None = None,
) -> dict[str, Any] | None:
    """The `key_order` section of the audit summary, or None when the pipeline has no key-state topic (no
    key-ordered handler was provisioned for it). `records`: the audit's records with `FOLLOWER_COLUMNS`;
    `header_keys`: the app's, which sign its key-state records."""
    name = topics.key_state_topic
    if partition_count(make_admin(kafka), name) is None:
        return None
    chains, malformed, forged = _blocked_keys(spark, kafka, name, topics.source, kafka_format, header_keys)
    followers = records.where((F.col("kind") == "tier") & F.col("key_order_after").isNotNull())
    by_tier = {r.topic: int(r["count"]) for r in followers.groupBy("topic").count().collect()}
    per_key = (
        followers.groupBy("original_partition", "key_digest")
        .agg(F.count_distinct(*_SOURCE_RECORD).alias("n"))
        .agg(F.count("*").alias("keys"), F.max("n").alias("max"), F.percentile_approx("n", 0.5, 10_000).alias("p50"))
        .first()
    )
    waits = _waits(records, now_ms)
    blocked: dict[int, int] = {}
    for chain in chains:
        blocked[chain.partition] = blocked.get(chain.partition, 0) + 1
    return {
        "topic": name,
        "blocked_keys": len(chains),
        "blocked_by_partition": {str(p): n for p, n in sorted(blocked.items())},
        "malformed": malformed,
        "forged": forged,
        "chains": [c.as_dict() for c in sorted(chains, key=lambda c: (c.since_ms, c.partition, c.key_id))][
            :CHAINS_LISTED
        ],
        "followers_by_tier": {t.topic: by_tier.get(t.topic, 0) for t in topics.tiers},
        "followers_per_key": {
            "keys": int(per_key["keys"]) if per_key else 0,
            "max": per_key["max"] if per_key else None,
            "p50": per_key["p50"] if per_key else None,
        },
        **waits,
    }


def _blocked_keys(
    spark: SparkSession, kafka: KafkaConfig, topic: str, source: str, kafka_format: str, keys: HeaderKeys | None
) -> tuple[list[Any], int, int]:
    """The open chains of the key-state topic (`ops.open_chains`), the malformed live chain records and, with
    `keys`, the records skipped as unsigned or forged: the fold runs in Spark, so only live chain records of
    bounded size reach the driver."""
    state = read_kafka(spark, kafka_options(kafka, subscribe=topic), kafka_format=kafka_format)
    forged = 0
    if keys is not None:  # before the fold: a forged later record must not hide the genuine one it follows
        signed = state_verified(keys, F.col("topic"), F.col("key"), F.col("value"), F.col("headers"))
        state = state.withColumn("signed", signed)
        forged = state.where(~F.col("signed")).count()
        state = state.where(F.col("signed"))
    latest = state.groupBy("partition", "key").agg(F.max_by(F.struct("offset", "value"), F.col("offset")).alias("at"))
    live = latest.where(F.col("at.value").isNotNull() & F.col("key").cast("string").startswith("chain/"))
    bounded = (F.octet_length("key") <= _STATE_BYTES) & (F.octet_length("at.value") <= _STATE_BYTES)
    oversized = live.where(~bounded).count()
    rows: list[Row] = live.where(bounded).select("partition", "key", "at.offset", "at.value").collect()
    messages = (Message(topic, r.partition, r.offset, -1, r.key, r.value, ()) for r in rows)
    chains, malformed, _ = open_chains(messages, source)  # verified above
    return chains, malformed + oversized, forged


def _ms(column: str) -> Column:
    return F.unix_millis(column)


def follower_waits(records: DataFrame, now_ms: int) -> DataFrame:
    """One row per follower source record of `records` (the audit's, with `FOLLOWER_COLUMNS`): its
    coordinates, `after`, `held_at`, `wait_ms` behind its head (module docstring) and `waiting` (not yet
    shown to have run or been dead-lettered)."""
    followers = records.where((F.col("kind") == "tier") & F.col("key_order_after").isNotNull())
    held = followers.groupBy(*_SOURCE_RECORD).agg(
        F.min("key_order_held_at").alias("held_at"),
        F.min("key_order_after").alias("after"),
        F.max_by(F.struct("handled", _ms("timestamp").alias("at")), _ms("timestamp")).alias("last"),
    )
    later = records.where(
        F.col("key_order_after").isNull() & F.col("kind").isin("tier", "dlq") & F.col("original_offset").isNotNull()
    )
    ran = F.when(F.col("kind") == "dlq", _ms("timestamp")).otherwise(_ms("first_failed_at"))
    ended = later.groupBy(*_SOURCE_RECORD).agg(F.min(ran).alias("ended_at"))
    end = F.coalesce(F.col("ended_at"), F.when(F.col("last.handled"), F.col("last.at")), F.lit(now_ms))
    return (
        held.join(ended, list(_SOURCE_RECORD), "left")
        .withColumn("waiting", F.col("ended_at").isNull() & ~F.col("last.handled"))
        .withColumn("wait_ms", F.greatest(end - F.col("held_at"), F.lit(0)))
        .drop("last", "ended_at")
    )


def _waits(records: DataFrame, now_ms: int) -> dict[str, Any]:
    """The count of follower source records, how many still wait, and the longest wait with its record."""
    waits = follower_waits(records, now_ms)
    longest = F.struct("wait_ms", "waiting", "original_partition", "original_offset", "after", "held_at")
    row = waits.agg(
        F.count("*").alias("followers"),
        F.count_if("waiting").alias("waiting"),
        F.max_by(longest, F.col("wait_ms")).alias("longest"),
    ).first()
    top = row["longest"] if row else None
    return {
        "followers": int(row["followers"]) if row else 0,
        "followers_waiting": int(row["waiting"] or 0) if row else 0,
        "longest_wait_ms": None if top is None else top["wait_ms"],
        "longest_wait": None if top is None else top.asDict(),
    }


def key_order_lines(section: dict[str, Any] | None) -> list[str]:
    """The audit's console lines for the `key_order` section (none without one)."""
    from retrytopics.operator.reports import counts, duration

    if section is None:
        return []
    keys, longest = section["followers_per_key"], section["longest_wait"]
    wait = "none"
    if longest is not None:
        where = f"source partition {longest['original_partition']} offset {longest['original_offset']}"
        state = "still waiting" if longest["waiting"] else "done"
        wait = f"{duration(section['longest_wait_ms'])} ({where}, behind {longest['after']}, {state})"
    malformed = f", {section['malformed']} malformed chain records skipped" if section["malformed"] else ""
    if section.get("forged"):
        malformed += f", {section['forged']} unsigned or forged key-state records skipped"
    return [
        "",
        f"key ordering ({section['topic']}): {section['blocked_keys']} blocked keys{malformed}",
        f"  by source partition: {counts(section['blocked_by_partition'])}",
        f"  followers: {section['followers']} ({section['followers_waiting']} waiting), "
        f"by tier: {counts(section['followers_by_tier'])}",
        f"  followers per key: {keys['keys']} keys, p50 {keys['p50']}, max {keys['max']}",
        f"  longest wait behind a head: {wait}",
    ]
