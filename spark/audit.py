"""Audit of one retry pipeline (source topic, tiers, DLQ) from what is in Kafka.

    summary = audit(spark, kafka, topics_for("orders", "billing", (5_000, 60_000)))
    summary["stages"]   # [{"topic", "kind", "records", "overdue", ...}, ...]

What Kafka tells, and so what the numbers mean (docs/spark.md, "Audit definitions"):

- A record is *handled* when its offset is below the offset committed by the consumer group that reads
  its topic (the main group for the source topic; a tier consumer's group is its tier topic's name). The
  runtime commits only what it handled or durably republished, so every later hop is already in Kafka.
- *Overdue*: a tier record not handled although `due_at < now - grace`: a stuck or missing tier consumer.
- An *episode* is one failure story: the tier and DLQ records sharing `(origin_message_id, replay_count)`.
  It *dead-lettered* when a DLQ record exists; it *recovered* when its last tier record (highest
  reconsume_times) is handled and nothing came after it (a success is not written to Kafka: the absence of
  a later hop after a commit is the success); otherwise it is *in flight*.
- *Attempts* of a recovered episode = its failures + 1 (the try that succeeded). *Time to recover* =
  last hop's `due_at` − `first_failed_at`: the earliest start of the successful try, a lower bound that is
  tight when tier consumers keep up.
- A DLQ record is *replayed* when a record on the source or a tier is proven to be the replay job's copy of
  it: its `retry.replay_original` names the DLQ record's source record and its `retry.replay_mark` verifies
  with the keys of its `retry.replay_id` in the replay ledger (spark/ledger.py; with header keys, derived
  from them too). A lineage header alone (`retry.replay_origin_id`) proves nothing: any writer on the source
  can set it. A replay id whose ledger entry has no nonce (a release before marks) is trusted without keys,
  as a rerun trusts it.
- A key-ordered pipeline (its key-state topic exists) gets a `key_order` section: blocked keys, followers
  and the longest wait behind a head (`retrytopics.spark.key_order`); followers' hops are no episode.
- With `broker_dlq` (a share group's broker-written DLQ, KIP-1191), its records are dead letters too, of
  kind `broker_dlq`, decoded and counted once as `retrytopics.spark.broker_dlq` says (ours wins over the
  broker's copy of one source record); `dlq.broker` gives its own numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.spark_kafka import kafka_options, read_kafka
from retrytopics.connectors.spark_kafka_io import OffsetResolver
from retrytopics.connectors.spark_kafka_plan import Subscription, client_properties
from retrytopics.core.durations import parse_duration
from retrytopics.core.errors import ConfigError
from retrytopics.core.naming import TopicSet
from retrytopics.core.signing import HeaderKeys
from retrytopics.operator.progress import finish, note, rate
from retrytopics.spark.broker_dlq import BROKER_KIND, broker_summary, mark_duplicates, with_broker_columns
from retrytopics.spark.columns import header_text, with_retry_columns
from retrytopics.spark.key_order import FOLLOWER_COLUMNS, key_order_lines, key_order_summary, with_follower_columns
from retrytopics.spark.ledger import REPLAY_ORIGINAL, attributed, replay_mark_keys
from retrytopics.spark.session import job_step

__all__ = [
    "add_audit_arguments",
    "audit",
    "episodes",
    "format_table",
    "pipeline_records",
    "record_facts",
    "run_audit_cli",
]

#: The kinds of dead-letter rows: ours and the broker's.
_DEAD = ("dlq", BROKER_KIND)


def _committed(kafka: KafkaConfig, topics: TopicSet) -> list[tuple[str, int, int]]:
    """(topic, partition, committed offset) for the source's group and every tier's group."""
    props = client_properties(kafka_options(kafka))
    groups = {topics.source: topics.group, **{t.topic: t.topic for t in topics.tiers}}
    out: list[tuple[str, int, int]] = []
    with OffsetResolver(props) as resolver:
        counts = resolver.partition_counts()
        for topic, group in groups.items():
            tps = Subscription("subscribe", topics=(topic,)).select(counts)
            out.extend((t, p, offset) for (t, p), offset in resolver.committed(group, tps).items())
    return out


def _lookup(committed: list[tuple[str, int, int]]) -> Column:
    """The committed offset of each row's topic-partition (NULL when unknown), as a literal map lookup: a
    join with a DataFrame built from Python rows would start Python workers and a job just to build it."""
    by_topic: dict[str, list[Column]] = {}
    for topic, partition, offset in committed:
        by_topic.setdefault(topic, []).extend((F.lit(partition), F.lit(offset).cast("long")))
    if not by_topic:
        return F.lit(None).cast("long")
    lookup = F.create_map(*[x for topic, pairs in by_topic.items() for x in (F.lit(topic), F.create_map(*pairs))])
    return lookup[F.col("topic")][F.col("partition")]


def pipeline_records(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    *,
    now_ms: int,
    grace_ms: int,
    kafka_format: str = "python",
    broker_dlq: str | None = None,
) -> DataFrame:
    """Every record of the pipeline with typed retry columns plus `kind` (source|tier|dlq|broker_dlq),
    `tier_index`, `handled`, `overdue`, `age_ms` and `delivery_count` (broker dead letters only). Committed
    offsets are read first, so no hop is missed. `broker_dlq`: also the share group's broker-written DLQ."""
    committed = _lookup(_committed(kafka, topics))
    all_topics = [topics.source, *(t.topic for t in topics.tiers), topics.dlq, *([broker_dlq] if broker_dlq else [])]
    options = kafka_options(kafka, subscribe=",".join(all_topics), includeHeaders="true")
    df = with_retry_columns(read_kafka(spark, options, kafka_format=kafka_format))
    if broker_dlq:
        df = with_broker_columns(df, broker_dlq)
    else:
        df = df.withColumn("delivery_count", F.lit(None).cast("int"))
    tier_of = F.create_map(*[x for t in topics.tiers for x in (F.lit(t.topic), F.lit(t.index))])
    kind = (
        F.when(F.col("topic") == topics.source, "source")
        .when(F.col("topic") == topics.dlq, "dlq")
        .when(F.col("topic") == (broker_dlq or ""), BROKER_KIND)
        .otherwise("tier")
    )
    now = F.lit(now_ms)
    df = (
        df.withColumn("committed", committed)
        .withColumn("kind", kind)
        .withColumn("tier_index", tier_of[F.col("topic")] if topics.tiers else F.lit(None).cast("int"))
        .withColumn("handled", F.coalesce(F.col("offset") < F.col("committed"), F.lit(False)))
        .withColumn("age_ms", now - F.unix_millis("timestamp"))
    )
    overdue = (F.col("kind") == "tier") & ~F.col("handled") & (F.unix_millis("due_at") < now - grace_ms)
    return df.withColumn("overdue", F.coalesce(overdue, F.lit(False)))


#: The grouping columns of the per-record pass (the fine grouping set; the coarse one is `topic` alone).
_FACETS = ("topic", "exception_type", "dlq_reason", "reconsume_times")


def record_facts(records: DataFrame) -> list[Row]:
    """Every per-record number of the audit in one aggregation (and so one Spark job): per topic (records,
    overdue, unhandled, age percentiles) and per (topic, exception_type, dlq_reason, reconsume_times) counts,
    as grouping sets; `coarse` tells the per-topic rows apart. The result is small: a few rows per topic."""
    return (
        records.groupingSets([["topic"], list(_FACETS)], *_FACETS)
        .agg(
            (F.grouping("exception_type") == 1).alias("coarse"),
            F.count("*").alias("records"),
            F.sum(F.col("overdue").cast("long")).alias("overdue"),
            F.sum((~F.col("handled")).cast("long")).alias("unhandled"),
            F.percentile_approx("age_ms", [0.5, 1.0], 10_000).alias("age"),
        )
        .collect()
    )


def _order(topics: TopicSet, broker_dlq: str | None) -> list[tuple[str, str]]:
    """(topic, kind) of each stage in flow order: the source, each tier, our DLQ, the broker's DLQ."""
    broker = [(broker_dlq, BROKER_KIND)] if broker_dlq else []
    return [(topics.source, "source"), *((t.topic, "tier") for t in topics.tiers), (topics.dlq, "dlq"), *broker]


def _stages(facts: list[Row], topics: TopicSet, broker_dlq: str | None) -> list[dict[str, Any]]:
    found = {r.topic: r for r in facts if r.coarse}
    order = _order(topics, broker_dlq)
    stages = []
    for topic, kind in order:
        row = found.get(topic)
        age = (row.age if row is not None and row.age else None) or [None, None]
        stages.append(
            {
                "topic": topic,
                "kind": kind,
                "records": row.records if row else 0,
                "overdue": int(row.overdue or 0) if row else 0,
                "unhandled": None if kind in _DEAD else (int(row.unhandled or 0) if row else 0),
                "age_ms_p50": age[0],
                "age_ms_max": age[1],
            }
        )
    return stages


def _counts(facts: list[Row], column: str, *, where: Callable[[Row], bool]) -> dict[str, int]:
    """Record counts by `column` over the fine rows that pass `where`; largest first, then by name."""
    counts: Counter[str] = Counter()
    for r in facts:
        if not r.coarse and where(r):
            counts[str(r[column])] += r.records
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _with_replay_proof(df: DataFrame, keys_by_id: Mapping[str, tuple[bytes, ...] | None]) -> DataFrame:
    """`df` (with `headers`, `topic` and `replay_id`) plus `replay_original` (the source record a replayed
    record stands for) and `replay_proven` (its mark verifies: the module docstring)."""
    df = df.withColumn("replay_original", header_text(REPLAY_ORIGINAL))
    if not keys_by_id:  # no replay ever started: nothing to prove, and no Python function over every record
        return df.withColumn("replay_proven", F.lit(False))
    proven = attributed(keys_by_id, F.col("replay_id"), F.col("topic"), F.col("replay_original"))
    return df.withColumn("replay_proven", proven)


def _dlq(records: DataFrame, facts: list[Row], topics: TopicSet, broker_dlq: str | None) -> dict[str, Any]:
    in_dlq: Callable[[Row], bool] = lambda r: r.topic in (topics.dlq, broker_dlq)  # noqa: E731
    partition, offset = F.col("original_partition").cast("string"), F.col("original_offset").cast("string")
    source_record = F.concat(F.col("original_topic"), F.lit("-"), partition, F.lit("-"), offset)  # as the replay
    dlq = records.where(F.col("kind").isin(*_DEAD)).withColumn("source_record", source_record)
    copies = records.where(~F.col("kind").isin(*_DEAD) & F.col("replay_proven"))
    proven = copies.select(F.col("replay_original").alias("source_record")).distinct()
    replayed = dlq.join(proven, "source_record", "left_semi").count()
    total = sum(r.records for r in facts if not r.coarse and in_dlq(r))
    return {
        "records": total,
        "by_reason": _counts(facts, "dlq_reason", where=in_dlq),
        "by_exception_type": _counts(facts, "exception_type", where=in_dlq),
        "replayed": replayed,
        "pending": total - replayed,
    }


def episodes(records: DataFrame) -> DataFrame:
    """One row per failure episode (see the module docstring) with its outcome, attempts and time to recover."""
    # a broker dead letter without readable coordinates has no id to follow: counted in `dlq.broker` only
    traceable = (F.col("kind") != BROKER_KIND) | F.col("origin_message_id").isNotNull()
    hops = records.where((F.col("kind") != "source") & traceable)
    if "key_order_after" in records.columns:  # a follower has not failed: its hops are no failure episode
        hops = hops.where(F.col("key_order_after").isNull())
    hops = hops.withColumn("replays", F.coalesce("replay_count", F.lit(0)))
    tier = F.col("kind") == "tier"
    last = F.struct("handled", "tier_index", "due_at", "topic")
    grouped = hops.groupBy("origin_message_id", "replays").agg(
        F.max("reconsume_times").alias("failures"),
        F.max(F.col("kind").isin(*_DEAD).cast("int")).alias("in_dlq"),
        F.min("first_failed_at").alias("first_failed_at"),
        F.max_by(last, F.when(tier, F.col("reconsume_times"))).alias("last_tier"),
        F.max(F.when(tier, F.col("overdue"))).alias("overdue"),
    )
    outcome = (
        F.when(F.col("in_dlq") == 1, "dead_lettered")
        .when(F.col("last_tier.handled"), "recovered")
        .otherwise("in_flight")
    )
    return grouped.withColumn("outcome", outcome).select(
        "origin_message_id",
        "replays",
        "failures",
        "outcome",
        "first_failed_at",
        F.col("last_tier.tier_index").alias("last_tier_index"),
        F.col("last_tier.topic").alias("last_tier_topic"),
        F.coalesce("overdue", F.lit(False)).alias("overdue"),
        F.when(F.col("outcome") == "recovered", F.col("failures") + 1).alias("attempts"),
        F.when(
            F.col("outcome") == "recovered", F.unix_millis("last_tier.due_at") - F.unix_millis("first_failed_at")
        ).alias("time_to_recover_ms"),
    )


def _lineage(facts: list[Row], eps: DataFrame, topics: TopicSet) -> dict[str, Any]:
    """Episode numbers in one aggregation: all episodes (with the attempts and time-to-recover percentiles,
    which are NULL except for recovered episodes), per outcome, and per (outcome, last tier)."""
    rows = (
        eps.groupingSets([[], ["outcome"], ["outcome", "last_tier_topic"]], "outcome", "last_tier_topic")
        .agg(
            F.grouping_id().alias("level"),
            F.count("*").alias("n"),
            F.percentile_approx("attempts", [0.5, 0.99], 10_000).alias("attempts"),
            F.percentile_approx("time_to_recover_ms", [0.5, 0.99], 10_000).alias("ttr"),
        )
        .collect()
    )
    total = next((r for r in rows if r.level == 3), None)
    by_outcome = {str(r.outcome): r.n for r in sorted(rows, key=lambda r: (-r.n, str(r.outcome))) if r.level == 1}
    wins = {r.last_tier_topic: r.n for r in rows if r.level == 0 and r.outcome == "recovered"}
    attempts = (total.attempts if total else None) or [None, None]
    ttr = (total.ttr if total else None) or [None, None]
    coarse = {r.topic: r for r in facts if r.coarse}
    handled = {t: int(r.records - (r.unhandled or 0)) for t, r in coarse.items()}
    per_tier = [
        {
            "topic": t.topic,
            "handled": handled.get(t.topic, 0),
            "recovered": wins.get(t.topic, 0),
            "success_rate": round(wins.get(t.topic, 0) / handled[t.topic], 4) if handled.get(t.topic) else None,
        }
        for t in topics.tiers
    ]
    return {
        "episodes": total.n if total else 0,
        "by_outcome": by_outcome,
        "recovered": by_outcome.get("recovered", 0),
        "attempts_p50": attempts[0],
        "attempts_p99": attempts[1],
        "time_to_recover_ms_p50": ttr[0],
        "time_to_recover_ms_p99": ttr[1],
        "tiers": per_tier,
    }


def audit(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    *,
    grace_ms: int = 60_000,
    now_ms: int | None = None,
    out: str | None = None,
    chart: str | None = None,
    kafka_format: str = "python",
    overwrite: bool = False,
    broker_dlq: str | None = None,
    header_keys: HeaderKeys | None = None,
) -> dict[str, Any]:
    """Audit the pipeline of `topics`; returns the summary (the `--json` object). `out` writes Parquet
    (`records/`, `episodes/`, `summary.json`) into a folder that is new or empty, or replaces them with
    `overwrite`; `chart` a PNG of records per stage and exception type. `broker_dlq`: a share group's
    broker-written DLQ (`dlq.<group>`), read beside ours (`retrytopics.spark.broker_dlq`). `header_keys`: the
    app's (`RetryApp(header_key=...)`), which sign its key-state records.

    Three Spark jobs make the summary: the per-record pass (which also reads Kafka once, into the cache),
    the episode pass and the replayed count (and one for `dlq.broker`, and a few small ones for the
    `key_order` section of a pipeline with a key-state topic: `retrytopics.spark.key_order`); the chart
    needs none, the Parquet output one per dataset. Every number counts a broker dead letter once; `records/` keeps every row, with
    `duplicate_of` telling the rows not counted."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if out and not overwrite:
        _refuse_a_used_folder(spark, out)
    job_step(spark, "audit: reading committed offsets, planning the read")
    read = pipeline_records(
        spark, kafka, topics, now_ms=now_ms, grace_ms=grace_ms, kafka_format=kafka_format, broker_dlq=broker_dlq
    )
    read = _with_replay_proof(with_follower_columns(read), replay_mark_keys(kafka, topics.dlq, header_keys))
    read = read.drop("key", "value", "headers").cache()
    every = mark_duplicates(read).cache() if broker_dlq else read.withColumn("duplicate_of", F.lit(None).cast("string"))
    records = every.where(F.col("duplicate_of").isNull())
    eps = episodes(records)
    if out:
        eps = eps.cache()  # written as Parquet after the summary
    try:
        facts = _timed_facts(spark, records, topics)
        job_step(spark, "audit: following failure episodes and replays")
        hop: Callable[[Row], bool] = lambda r: r.topic != topics.source  # noqa: E731
        summary: dict[str, Any] = {
            "source": topics.source,
            "group": topics.group,
            "now_ms": now_ms,
            "grace_ms": grace_ms,
            "stages": _stages(facts, topics, broker_dlq),
            "dlq": _dlq(records, facts, topics, broker_dlq),
            "by_exception_type": _counts(facts, "exception_type", where=hop),
            "reconsume_times": _counts(
                facts, "reconsume_times", where=lambda r: hop(r) and r.reconsume_times is not None
            ),
            "lineage": _lineage(facts, eps, topics),
        }
        if broker_dlq:
            job_step(spark, f"audit: counting the broker's dead letters in {broker_dlq}")
            summary["dlq"]["broker"] = broker_summary(every, broker_dlq)
        job_step(spark, f"audit: reading {topics.key_state_topic} and the followers of key-ordered handlers")
        key_order = key_order_summary(
            spark, kafka, topics, records, now_ms=now_ms, kafka_format=kafka_format, header_keys=header_keys
        )
        if key_order is not None:  # only a key-ordered pipeline has the section
            summary["key_order"] = key_order
        note(f"{summary['lineage']['episodes']:,} failure episodes, {summary['dlq']['records']:,} DLQ records")
        if out:
            job_step(spark, f"audit: writing Parquet to {out}")
            _write_parquet(every, eps, summary, out)
        if chart:
            job_step(spark, f"audit: drawing {chart}")
            _chart(facts, topics, chart, broker_dlq)
        return summary
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]  # py4j passes None as null
        eps.unpersist()
        every.unpersist()
        read.unpersist()


def _timed_facts(spark: SparkSession, records: DataFrame, topics: TopicSet) -> list[Row]:
    """`record_facts`, reported on the progress line: its job reads every topic of the pipeline."""
    started = time.monotonic()
    job_step(spark, f"audit: reading and counting the records of {len(topics.tiers) + 2} topics")
    facts = record_facts(records)
    seconds = time.monotonic() - started
    total = sum(r.records for r in facts if r.coarse)
    note(f"read {len(topics.tiers) + 2} topics: {total:,} records in {seconds:.1f}s ({rate(total, seconds)})")
    return facts


def _refuse_a_used_folder(spark: SparkSession, out: str) -> None:
    """Fail before any work when `out` already holds something: writing replaces its `records/`,
    `episodes/` and `summary.json` whole, which would delete what an operator kept there. Asked through
    Hadoop's file system, so that `s3a://` or `hdfs://` folders are checked like local ones."""
    jvm = spark._jvm
    assert jvm is not None  # a live session has its gateway
    path = jvm.org.apache.hadoop.fs.Path(out)
    conf = spark._jsc.hadoopConfiguration()
    fs = path.getFileSystem(conf)
    if fs.exists(path) and (not fs.getFileStatus(path).isDirectory() or len(fs.listStatus(path)) > 0):
        raise ConfigError(
            "out",
            out,
            "exists and is not an empty folder: choose a new one, or pass "
            "--overwrite to replace its records/, episodes/ and summary.json",
        )


def _write_parquet(records: DataFrame, eps: DataFrame, summary: Mapping[str, Any], out: str) -> None:
    records = records.drop(*FOLLOWER_COLUMNS) if "key_order" not in summary else records.drop("key_digest")
    records.write.mode("overwrite").partitionBy("kind").parquet(f"{out}/records")
    eps.write.mode("overwrite").parquet(f"{out}/episodes")
    spark = records.sparkSession
    spark.createDataFrame([(json.dumps(summary),)], "summary string").coalesce(1).write.mode("overwrite").text(
        f"{out}/summary.json"
    )


def _chart(facts: list[Row], topics: TopicSet, path: str, broker_dlq: str | None = None) -> None:
    """Records per stage in flow order (source, each tier, the DLQ), with what still waits or is overdue,
    and tier and DLQ records by exception type (top 8, then "other"): `retrytopics.operator.charts`."""
    from retrytopics.operator.charts import Bar, pipeline_chart

    coarse = {r.topic: r for r in facts if r.coarse}
    stages = []
    for topic, kind in _order(topics, broker_dlq):
        row = coarse.get(topic)
        overdue, unhandled = (int(row.overdue or 0), int(row.unhandled or 0)) if row else (0, 0)
        notes = [f"{overdue:,} overdue"] if overdue else []
        if kind not in _DEAD and unhandled > overdue:  # a DLQ has no consumer: nothing there waits
            notes.insert(0, f"{unhandled - overdue:,} {'not yet consumed' if kind == 'source' else 'waiting'}")
        bar_kind = "dlq" if kind in _DEAD else kind
        stages.append(Bar(label=topic, value=row.records if row else 0, kind=bar_kind, note=", ".join(notes)))
    failures: Counter[str] = Counter()
    for r in facts:
        if not r.coarse and r.topic != topics.source:
            failures["unknown" if r.exception_type is None else str(r.exception_type)] += r.records
    ranked = failures.most_common()
    shown = ranked[:8] + ([("other", sum(n for _, n in ranked[8:]))] if len(ranked) > 8 else [])
    pipeline_chart(
        path,
        title=f"{topics.source}, group {topics.group}",
        stages=stages,
        failures=[Bar(label=name, value=n, kind="failure") for name, n in shown],
    )


def format_table(summary: Mapping[str, Any]) -> str:
    """The console view of a summary: aligned tables (stages, recovery per tier) and counts in words; no
    Python reprs. `--json` prints the summary itself."""
    from retrytopics.operator.reports import counts, duration, table

    stages = [
        [
            s["topic"],
            s["kind"],
            s["records"],
            s["overdue"],
            s["unhandled"],
            duration(s["age_ms_p50"]),
            duration(s["age_ms_max"]),
        ]
        for s in summary["stages"]
    ]
    dlq, lineage = summary["dlq"], summary["lineage"]
    rates = [
        [
            t["topic"],
            t["handled"],
            t["recovered"],
            None if t["success_rate"] is None else f"{100 * t['success_rate']:.1f}%",
        ]
        for t in lineage["tiers"]
    ]
    failures = ", ".join(
        f"{n} with {k} failure{'' if k == '1' else 's'}" for k, n in summary["reconsume_times"].items()
    )
    attempts, ttr = (
        (lineage["attempts_p50"], lineage["attempts_p99"]),
        (lineage["time_to_recover_ms_p50"], lineage["time_to_recover_ms_p99"]),
    )
    recovery = (
        "none"
        if attempts[0] is None
        else (
            f"{attempts[0]} / {attempts[1]} attempts, {duration(ttr[0])} / {duration(ttr[1])} after the first failure"
        )
    )
    return "\n".join(
        [
            f"pipeline {summary['source']} (group {summary['group']})",
            "",
            table(["stage", "kind", "records", "overdue", "unhandled", "age p50", "age max"], stages, align="llrrrrr"),
            "",
            f"DLQ: {dlq['records']} records, {dlq['replayed']} replayed, {dlq['pending']} pending",
            f"  by reason: {counts(dlq['by_reason'])}",
            *_broker_lines(dlq.get("broker")),
            f"  by exception type: {counts(dlq['by_exception_type'])}",
            f"retried records: {failures or 'none'}",
            "",
            f"failure episodes: {lineage['episodes']} ({counts(lineage['by_outcome'])})",
            f"  recovery (p50 / p99): {recovery}",
            "",
            table(["tier", "handled", "recovered", "success rate"], rates, align="lrrr"),
            *key_order_lines(summary.get("key_order")),
        ]
    )


def _broker_lines(broker: Mapping[str, Any] | None) -> list[str]:
    from retrytopics.operator.reports import counts

    if broker is None:
        return []
    return [
        f"  broker DLQ {broker['topic']}: {broker['records']} records, {broker['counted']} counted "
        f"({broker['duplicates_of_ours']} also in ours, {broker['duplicates']} repeated, "
        f"{broker['without_coordinates']} without coordinates); by delivery count: "
        f"{counts(broker['by_delivery_count'])}"
    ]


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `retrytopics audit` (the pipeline itself comes from --topic/--group/--delays or --config)."""
    parser.add_argument(
        "--grace", default="1m", help="a tier record due longer ago than this and not handled is overdue (default 1m)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--out", metavar="DIR", help="write records/, episodes/ and summary.json as Parquet/text")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --out replace the outputs of an earlier audit in a folder that is not empty",
    )
    parser.add_argument("--chart", metavar="PNG", help="write a chart of records per stage and exception type")
    parser.add_argument(
        "--broker-dlq",
        metavar="TOPIC",
        help="also read a share group's broker-written DLQ (KIP-1191; `topics create` makes dlq.<group>)",
    )
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument(
        "--kafka-format",
        choices=["python", "builtin"],
        default="python",
        help="read with this package's data source (default) or Spark's kafka jar",
    )


def run_audit_cli(args: argparse.Namespace, *, kafka: KafkaConfig, topics: TopicSet) -> int:
    """Run the audit for parsed `args`; prints JSON or the table. Exit status 0."""
    from retrytopics.spark.session import get_session

    spark = get_session(args.master, "retrytopics-audit")
    summary = audit(
        spark,
        kafka,
        topics,
        grace_ms=parse_duration(args.grace, field="--grace"),
        out=args.out,
        chart=args.chart,
        kafka_format=args.kafka_format,
        overwrite=args.overwrite,
        broker_dlq=args.broker_dlq,
        header_keys=getattr(args, "header_keys", None),
    )
    finish()  # the progress line, if any, ends before the result
    print(json.dumps(summary, sort_keys=True) if args.json else format_table(summary))
    return 0
