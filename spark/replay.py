"""Replay DLQ records to their original topic (default) or to the pipeline's first retry tier.

    result = replay(spark, kafka, topics, replay_id="2026-11-23-timeouts", reasons=["timeout"])
    result["written"], result["skipped_already_replayed"]

- Selection: reason, exception type, DLQ record time range, origin ids, and any SQL predicate over the
  typed columns (`retrytopics.spark.columns.RETRY_COLUMNS` plus key, value, topic, partition, offset,
  timestamp). One record per source record is replayed (the latest episode): a DLQ record stands for the
  record at its original topic, partition and offset, not for its origin id, which two records may share.
- Signatures: with header keys (`RetryApp(header_key=...)`, `--header-key-file`, `RETRYTOPICS_APP_HEADER_KEY`),
  a DLQ record whose `retry.signature` is missing or wrong is skipped with the problem `signature`, and a
  record replayed to the first tier is signed for it (`retrytopics.spark.signatures`).
- Safety: a destination is never taken from the user. It is the record's own `retry.original_topic`, which
  must be this pipeline's source, or the pipeline's first tier; other records are skipped as foreign.
  Records already replayed `max_replays` times (default 1) are skipped, or parked in `<dlq>.parked`.
- Idempotent per replay id: see `retrytopics.spark.ledger`. Write tasks are never retried within a run
  (a retried task could resend what its failed attempt delivered): a failed run is rerun with the same id.
- A share group's broker-written DLQ (`broker_dlq`, KIP-1191) is read and counted, never replayed: the
  broker copies no headers, so each of its records lost its user headers, the case `skipped_headers_dropped`
  refuses for ours. Its dead letters not in our DLQ are `skipped_broker_dlq`, by reason in `broker_dlq`
  (counted once, as the audit counts them); ours of the same source record replays as usual.
- Order: the records written to one destination partition go in source order (original topic, partition,
  offset), not DLQ order: a key-ordered handler's dead-lettered record and the `blocked_by_key` records
  behind it go back as they first came. `--to first_tier` refuses a selection holding such a sequence
  (`blocked_by_key` records and the records they name as waited behind), writing nothing: a tier would
  handle them as independent retries (docs/key-ordering.md, section 6).
- Output headers: the user headers byte for byte, then `retry.replay_id`, `retry.replayed_at`,
  `retry.replay_count` (+1), `retry.replay_origin_id` (the DLQ record's origin id) and `retry.replay_original`
  (its original coordinates, what a rerun matches on). To a tier, also the retry state, with reconsume_times
  and the failure times reset (default) or kept.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin
from retrytopics.connectors.spark_kafka import kafka_options, read_kafka, write_kafka
from retrytopics.core import headers as H
from retrytopics.core.errors import ConfigError
from retrytopics.core.keyorder.hops import WAITED_BEHIND
from retrytopics.core.naming import TopicSet
from retrytopics.core.signing import HeaderKeys, mark_keys, started_mark_keys
from retrytopics.operator.config import instant_argument
from retrytopics.spark import checks, ledger, signatures
from retrytopics.spark import where as where_filter
from retrytopics.spark.broker_dlq import BROKER_KIND, broker_summary, mark_duplicates, with_broker_columns
from retrytopics.spark.columns import with_retry_columns

__all__ = ["DESTINATIONS", "SOURCE_ORDER", "add_replay_arguments", "replay", "run_replay_cli", "select_records"]

#: Where a replay may write: the record's own original topic, or the pipeline's first retry tier.
DESTINATIONS = ("original", "first_tier")
#: The order of the records a replay writes to one destination partition: where they first came from.
SOURCE_ORDER = ("original_topic", "original_partition", "original_offset")


def select_records(
    dlq: DataFrame,
    *,
    reasons: Sequence[str] | None = None,
    exception_types: Sequence[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    origin_ids: Iterable[str] | None = None,
    where: str | None = None,
) -> DataFrame:
    """DLQ rows (with typed columns) matching every given criterion; the time range is on the DLQ record's
    Kafka timestamp, `[since_ms, until_ms)`."""
    conditions: list[Column] = []
    if reasons:
        conditions.append(F.col("dlq_reason").isin(list(reasons)))
    if exception_types:
        conditions.append(F.col("exception_type").isin(list(exception_types)))
    if since_ms is not None:
        conditions.append(F.unix_millis("timestamp") >= since_ms)
    if until_ms is not None:
        conditions.append(F.unix_millis("timestamp") < until_ms)
    if origin_ids is not None:
        conditions.append(F.col("origin_message_id").isin(sorted(set(origin_ids))))
    if where:  # restricted: see retrytopics.spark.where
        conditions.append(F.expr(where_filter.to_sql(where)))
    for condition in conditions:
        dlq = dlq.where(condition)
    return dlq


def _header(key: str, value: Column) -> Column:
    return F.struct(F.lit(key).alias("key"), value.cast("string").cast("binary").alias("value"))


def _ms(column: str) -> Column:
    return F.unix_millis(column)


def _output_headers(destination: str, *, replay_id: str, now_ms: int, reset: bool) -> Column:
    user = F.filter(
        F.coalesce("headers", F.array().cast("array<struct<key:string,value:binary>>")),
        lambda h: ~h["key"].startswith(H.RETRY_PREFIX),
    )
    lineage = [
        _header(H.REPLAY_ID, F.lit(replay_id)),
        _header(H.REPLAYED_AT, F.lit(now_ms)),
        _header(H.REPLAY_COUNT, F.coalesce("replay_count", F.lit(0)) + 1),
        _header(H.REPLAY_ORIGIN_ID, F.col("origin_message_id")),
        _header(ledger.REPLAY_ORIGINAL, F.col("source_record")),
    ]
    if destination == "original":
        return F.concat(user, F.array(*lineage))
    failed_first = F.lit(now_ms) if reset else _ms("first_failed_at")
    failed_last = F.lit(now_ms) if reset else _ms("last_failed_at")
    state = [
        _header(H.SCHEMA_VERSION, F.lit(1)),
        _header(H.RECONSUME_TIMES, F.lit(1) if reset else F.col("reconsume_times")),
        _header(H.ORIGIN_MESSAGE_ID, F.col("origin_message_id")),
        _header(H.ORIGINAL_TOPIC, F.col("original_topic")),
        _header(H.ORIGINAL_PARTITION, F.col("original_partition")),
        _header(H.ORIGINAL_OFFSET, F.col("original_offset")),
        _header(H.ORIGINAL_TIMESTAMP, F.coalesce(_ms("original_timestamp"), F.lit(-1))),
        _header(H.CONSUMER_GROUP, F.col("consumer_group")),
        _header(H.TIER, F.lit(0)),
        _header(H.DUE_AT, F.lit(now_ms)),
        _header(H.FIRST_FAILED_AT, failed_first),
        _header(H.LAST_FAILED_AT, failed_last),
        _header(H.EXCEPTION_TYPE, F.col("exception_type")),
        _header(H.EXCEPTION_MESSAGE, F.coalesce("exception_message", F.lit(""))),
        _header(H.EXCEPTION_TRACE, F.coalesce("exception_trace", F.lit(""))),
    ]
    return F.concat(user, F.array(*state, *lineage))


def _source_record() -> Column:
    """`<original_topic>-<original_partition>-<original_offset>`: the one source record a DLQ record stands
    for (NULL if a part is missing); partition and offset are numbers, so it reads back unambiguously."""
    partition, offset = F.col("original_partition").cast("string"), F.col("original_offset").cast("string")
    return F.concat(F.col("original_topic"), F.lit("-"), partition, F.lit("-"), offset)


def _plan(
    dlq: DataFrame,
    topics: TopicSet,
    destination: str,
    max_replays: int,
    allow_replayed: bool,
    park: bool,
    source_partitions: int,
    header_keys: HeaderKeys | None = None,
) -> tuple[DataFrame, dict[str, Any], tuple[int, int]]:
    """Assign each selected record its destination topic (or drop it). Returns the records to write, the
    counts of what was skipped, and (records to write, destination partitions) (see `_tally`).

    Foreign and invalid records (`retrytopics.spark.checks`) are skipped, each counted with its reason.
    Among the valid ones, one per source record is kept (`source_record`: its original topic, partition and
    offset), the latest episode: a true duplicate (a DLQ publish repeated after a crash) and an earlier
    episode of a record replayed to a tier count as duplicates, but two records sharing an origin id (which
    `id_header` allows) are two records. A kept record whose value is only a reference to a too-large
    record (`checks.reference_only`) is skipped as `skipped_reference_only`: its value is not the record's;
    one dead-lettered as `too_many_headers` (`checks.headers_dropped`) as `skipped_headers_dropped`: it lost
    its user headers.

    Forged copies: with `header_keys`, a record that does not verify is invalid, and a valid record always
    ranks before an invalid one, so a forged copy never hides a verified record. Without keys nothing tells
    a forged copy from the app's own: a principal with WRITE on the DLQ decides what a replay writes for any
    source record (docs/headers.md, *Trust*)."""
    foreign = F.col("original_topic").isNull() | (F.col("original_topic") != topics.source)
    problem = checks.problem(source_partitions)
    if header_keys is not None:  # checked first: a record that fails it may have been forged to pass the rest
        signed = signatures.verified(header_keys, F.col("topic"), F.col("key"), F.col("value"), F.col("headers"))
        problem = F.when(~signed, F.lit("signature")).otherwise(problem)
    checked = dlq.withColumn("problem", F.when(foreign, None).otherwise(problem))
    checked = checked.withColumn("source_record", _source_record())
    usable = ~foreign & F.col("problem").isNull()
    newest_first = Window.partitionBy("source_record").orderBy(
        usable.desc(), F.coalesce("replay_count", F.lit(0)).desc(), F.col("partition").desc(), F.col("offset").desc()
    )
    latest = checked.withColumn("rank", F.row_number().over(newest_first))
    target = topics.source if destination == "original" else topics.tiers[0].topic
    duplicate = usable & (F.col("rank") > 1)
    reference = usable & ~duplicate & checks.reference_only()
    dropped = usable & ~duplicate & checks.headers_dropped()
    looped = (
        usable
        & ~duplicate
        & ~reference
        & ~dropped
        & (F.coalesce("replay_count", F.lit(0)) >= max_replays)
        & F.lit(not allow_replayed)
    )
    dest = (
        F.when(~usable | duplicate | reference | dropped, None)
        .when(looped, F.lit(f"{topics.dlq}.parked") if park else None)
        .otherwise(F.lit(target))
    )
    planned = latest.withColumn("destination", dest).cache()
    counts, sizes = _tally(
        planned,
        duplicate=duplicate,
        foreign=foreign,
        reference=reference,
        dropped=dropped,
        skipped_looped=looped & F.lit(not park),
        parked_topic=f"{topics.dlq}.parked",
    )
    return planned.where(F.col("destination").isNotNull()), counts, sizes


def _tally(
    planned: DataFrame,
    *,
    duplicate: Column,
    foreign: Column,
    reference: Column,
    dropped: Column,
    skipped_looped: Column,
    parked_topic: str,
) -> tuple[dict[str, Any], tuple[int, int]]:
    """The `--json` counts of a plan, and (records to write, destination partitions): one Spark job, plus a
    small one listing the first invalid records when there are any."""
    row = planned.agg(
        F.count("*").alias("selected"),
        F.count_if(duplicate).alias("skipped_duplicates"),
        F.count_if(foreign).alias("skipped_foreign"),
        F.count_if(F.col("problem").isNotNull()).alias("skipped_invalid"),
        *[F.count_if(F.col("problem") == name).alias(f"invalid:{name}") for name in (*checks.PROBLEMS, "signature")],
        F.count_if(reference).alias("skipped_reference_only"),
        F.count_if(dropped).alias("skipped_headers_dropped"),
        F.count_if(skipped_looped).alias("skipped_max_replays"),
        F.count_if(F.col("destination") == parked_topic).alias("parked"),
        F.array_sort(F.collect_set("destination")).alias("destination_topics"),
        F.count("destination").alias("to_write"),
        F.count_distinct("destination", "original_partition").alias("tasks"),
    ).first()
    assert row is not None  # an aggregate without grouping always has one row
    found = row.asDict()
    sizes = int(found.pop("to_write")), int(found.pop("tasks"))
    problems = {k.removeprefix("invalid:"): int(found.pop(k)) for k in list(found) if k.startswith("invalid:")}
    counts: dict[str, Any] = {k: v if k == "destination_topics" else int(v or 0) for k, v in found.items()}
    counts["skipped_invalid_by_problem"] = {k: v for k, v in problems.items() if v}
    # Where the operator finds them: the DLQ coordinates of the first few.
    invalid = planned.where(F.col("problem").isNotNull()).orderBy("partition", "offset")
    sample = invalid.select("partition", "offset", "problem").limit(10).collect() if counts["skipped_invalid"] else []
    counts["invalid_sample"] = [r.asDict() for r in sample]
    return counts, sizes


def replay(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    *,
    replay_id: str,
    destination: str = "original",
    reasons: Sequence[str] | None = None,
    exception_types: Sequence[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    origin_ids: Iterable[str] | None = None,
    where: str | None = None,
    reset_reconsume_times: bool = True,
    max_replays: int = 1,
    allow_replayed: bool = False,
    park: bool = False,
    rate_per_s: int | None = None,
    dry_run: bool = False,
    now_ms: int | None = None,
    kafka_format: str = "python",
    header_keys: HeaderKeys | None = None,
    broker_dlq: str | None = None,
) -> dict[str, Any]:
    """Replay the selected DLQ records of `topics`; returns the `--json` summary (see the module docstring).
    `broker_dlq`: a share group's broker-written DLQ, counted as `skipped_broker_dlq` (never replayed).

    `kafka_format="builtin"` reads and writes through Spark's own `kafka` format instead of the Python data
    source (same rows, same result; `rate_per_s` needs the Python source, which alone can throttle).
    `header_keys`: skip DLQ records whose signature is missing or wrong (problem `signature`), and sign the
    records written to the first tier."""
    if rate_per_s and kafka_format != "python":
        raise ConfigError("rate", rate_per_s, "a send rate limit needs --kafka-format python")
    if destination not in DESTINATIONS:
        raise ConfigError("destination", destination, f"expected one of {DESTINATIONS}: replays never go elsewhere")
    if destination == "first_tier" and not topics.tiers:
        raise ConfigError("destination", destination, "the pipeline has no retry tier")
    H.Lineage(replay_id=replay_id)  # validates the id like the header contract does
    if where:
        where_filter.to_sql(where)  # a refused filter fails before any Kafka read
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    target = topics.source if destination == "original" else topics.tiers[0].topic
    partitions = ledger.partition_counts(kafka, sorted({topics.source, target}))
    for topic in sorted({topics.source, target} - set(partitions)):
        raise ConfigError("topic", topic, "does not exist: a replay writes only to existing pipeline topics")
    dlq = with_retry_columns(
        read_kafka(spark, kafka_options(kafka, subscribe=topics.dlq, includeHeaders="true"), kafka_format=kafka_format),
        exclude_trace=False,
    )
    chosen = select_records(
        dlq,
        reasons=reasons,
        exception_types=exception_types,
        since_ms=since_ms,
        until_ms=until_ms,
        origin_ids=origin_ids,
        where=where,
    )
    planned, counts, sizes = _plan(
        chosen, topics, destination, max_replays, allow_replayed, park, partitions[topics.source], header_keys
    )
    result: dict[str, Any] = {"replay_id": replay_id, "dry_run": dry_run, "destination": destination, **counts}
    if broker_dlq:
        result["broker_dlq"] = _broker_dead_letters(spark, kafka, dlq, broker_dlq, kafka_format)
        result["skipped_broker_dlq"] = result["broker_dlq"]["counted"]
    try:
        if destination == "first_tier":
            _refuse_key_ordered_sequences(dlq, planned, topics)
        if dry_run:
            sample = (
                planned.select(
                    "partition",
                    "offset",
                    "origin_message_id",
                    "dlq_reason",
                    "exception_type",
                    "replay_count",
                    "destination",
                )
                .limit(10)
                .collect()
            )
            result.update(written=0, skipped_already_replayed=None, sample=[r.asDict() for r in sample])
            return result
        return _write(
            spark,
            kafka,
            topics,
            planned,
            result,
            replay_id=replay_id,
            destination=destination,
            kafka_format=kafka_format,
            now_ms=now_ms,
            reset=reset_reconsume_times,
            rate_per_s=rate_per_s,
            sizes=sizes,
            target_partitions=partitions[target],
            header_keys=header_keys,
        )
    finally:
        planned.unpersist()


def _refuse_key_ordered_sequences(dlq: DataFrame, planned: DataFrame, topics: TopicSet) -> None:
    """Fail, before anything is written, when a replay to the first tier would include a `blocked_by_key`
    record or a record one of them names as what it waited behind (`retry.exception_message`, `behind
    <topic>-<partition>-<offset> ...`; read from the whole DLQ, selected or not): in a tier they would be
    independent retried records with no chain around them, handled in any order. To the source topic they
    are new records of their key, ordered again by the main consumer. One small Spark job."""
    blocked = F.col("dlq_reason") == H.DlqReason.BLOCKED_BY_KEY.value
    named = (
        dlq.where(blocked & (F.col("original_topic") == topics.source))
        .select(F.regexp_extract("exception_message", WAITED_BEHIND, 1).alias("source_record"))
        .where(F.col("source_record") != "")
    )
    to_tier = planned.where(F.col("destination") == topics.tiers[0].topic)
    refused = (
        to_tier.where(blocked)
        .select("source_record")
        .unionByName(to_tier.join(named.distinct(), "source_record", "left_semi").select("source_record"))
    )
    sample = [r.source_record for r in refused.distinct().orderBy("source_record").limit(6).collect()]
    if sample:
        shown = ", ".join(sample[:5]) + (", ..." if len(sample) > 5 else "")
        raise ConfigError(
            "destination",
            "first_tier",
            f"the selection holds records of a key-ordered handler's dead-lettered sequence ({shown}: "
            f"{H.DlqReason.BLOCKED_BY_KEY.value} records or the records they waited behind), which a tier "
            "would handle as independent retries, in any order; replay them to their source topic "
            "(--to original), where the main consumer orders them again, or leave them out of the selection",
        )


def _broker_dead_letters(
    spark: SparkSession, kafka: KafkaConfig, dlq: DataFrame, broker_dlq: str, kafka_format: str
) -> dict[str, Any]:
    """The broker DLQ's numbers (`broker_dlq.broker_summary`): counted once against our whole DLQ, so a
    source record ours also holds is not among them (ours replays it)."""
    options = kafka_options(kafka, subscribe=broker_dlq, includeHeaders="true")
    broker = with_broker_columns(with_retry_columns(read_kafka(spark, options, kafka_format=kafka_format)), broker_dlq)
    both = dlq.withColumn("kind", F.lit("dlq")).unionByName(
        broker.withColumn("kind", F.lit(BROKER_KIND)), allowMissingColumns=True
    )
    return broker_summary(mark_duplicates(both), broker_dlq)


def _partition(destination: str, target_partitions: int) -> Column:
    """The destination partition, as the runtime picks it: back to the original partition on the source
    (checked to exist); on a tier, by key (NULL: the producer's partitioner) or, keyless, the original
    partition modulo the tier's partition count (a tier may have fewer partitions than the source)."""
    if destination == "original":
        return F.col("original_partition")
    return F.when(F.col("key").isNull(), F.pmod("original_partition", F.lit(target_partitions)))


def _write(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    planned: DataFrame,
    result: dict[str, Any],
    *,
    replay_id: str,
    destination: str,
    now_ms: int,
    reset: bool,
    rate_per_s: int | None,
    sizes: tuple[int, int],
    target_partitions: int,
    kafka_format: str,
    header_keys: HeaderKeys | None = None,
) -> dict[str, Any]:
    todo, mark_key = _not_yet_written(
        spark,
        kafka,
        topics,
        planned,
        replay_id=replay_id,
        destination=destination,
        parked=bool(result["parked"]),
        kafka_format=kafka_format,
        header_keys=header_keys,
    )
    eligible, tasks = sizes
    pending = eligible
    if todo is not planned:  # a rerun: count what is left
        stats = todo.agg(F.count("*"), F.count_distinct("destination", "original_partition")).first()
        assert stats is not None  # an aggregate without grouping always has one row
        pending, tasks = int(stats[0]), int(stats[1])
    headers = _output_headers(destination, replay_id=replay_id, now_ms=now_ms, reset=reset)
    parked_headers = _output_headers("original", replay_id=replay_id, now_ms=now_ms, reset=reset)
    # One task per destination partition, in source order (not DLQ order): a key-ordered handler's
    # dead-lettered record and the `blocked_by_key` records behind it go back as they first came, however
    # their DLQ records are interleaved; the DLQ position only breaks ties.
    tasks = max(1, tasks)
    ordered = todo.repartition(tasks, "destination", "original_partition").sortWithinPartitions(
        *SOURCE_ORDER, "timestamp", "partition", "offset"
    )
    chosen_headers = F.when(F.col("destination") == f"{topics.dlq}.parked", parked_headers).otherwise(headers)
    if mark_key is not None:  # what a rerun trusts: see retrytopics.spark.ledger
        mark = ledger.mark_header(mark_key, replay_id, F.col("destination"), F.col("source_record"))
        chosen_headers = F.concat(chosen_headers, F.array(mark))
    out = ordered.select(
        F.col("destination").alias("topic"),
        "key",
        "value",
        chosen_headers.alias("headers"),
        F.when(F.col("destination") == f"{topics.dlq}.parked", F.lit(None))
        .otherwise(_partition(destination, target_partitions))
        .cast("int")
        .alias("partition"),
    )
    if header_keys is not None and destination == "first_tier":  # the tier consumers refuse unsigned records
        mac = signatures.signature(header_keys, F.col("topic"), F.col("key"), F.col("value"), F.col("headers"))
        to_tier = F.col("topic") == topics.tiers[0].topic
        out = out.withColumn("headers", F.when(to_tier, F.concat("headers", F.array(mac))).otherwise(F.col("headers")))
    options = kafka_options(kafka, failRetriedTasks="true")
    if rate_per_s:  # shared evenly by the tasks (approximate when two destinations hash to one task)
        options["maxRecordsPerSecondPerTask"] = str(max(1, rate_per_s // tasks))
    try:
        if pending:
            write_kafka(out, options, kafka_format=kafka_format)
    finally:
        if todo is not planned:
            todo.unpersist()
    result.update(written=pending, skipped_already_replayed=eligible - pending)
    ledger.append(
        kafka, topics.dlq, replay_id, {"event": "finished", **{k: v for k, v in result.items() if k != "sample"}}
    )
    return result


def _not_yet_written(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: TopicSet,
    planned: DataFrame,
    *,
    replay_id: str,
    destination: str,
    parked: bool,
    kafka_format: str,
    header_keys: HeaderKeys | None,
) -> tuple[DataFrame, bytes | None]:
    """The planned records this replay id has not written yet (`planned` itself when that is all of them),
    and the key this run marks its records with (None for a replay id started by a release without marks).

    A first run writes its start marks and a fresh nonce now, before its first record, so nothing of this
    replay id can be in the destinations yet: every planned record is to write, without a scan. A rerun
    scans the destinations from its first run's marks (see `retrytopics.spark.ledger`) and skips the source
    records found there with a valid `retry.replay_mark`, and DLQ records whose lineage names this replay
    id: a record it replayed that failed back into the DLQ (to the source topic a replayed record is a new
    record, with new coordinates)."""
    parked_topic = f"{topics.dlq}.parked"
    if parked:  # exists before the marks are taken, so that a rerun scans it too
        ensure_topics(make_admin(kafka), [TopicSpec(name=parked_topic, partitions=1)])
    started = [e for e in ledger.read_entries(kafka, topics.dlq, replay_id) if e.get("event") == "started"]
    if not started:
        targets = sorted({topics.source if destination == "original" else topics.tiers[0].topic, parked_topic})
        nonce = secrets.token_bytes(32)
        ledger.append(
            kafka,
            topics.dlq,
            replay_id,
            {"event": "started", "marks": ledger.watermarks(kafka, targets), "nonce": nonce.hex()},
        )
        return planned, mark_keys(nonce, header_keys)[0]
    keys = started_mark_keys(started[0], header_keys)
    done = ledger.written_by(spark, kafka, started[0]["marks"], replay_id, kafka_format, keys)
    done = done.withColumnRenamed("topic", "destination")
    descendant = F.coalesce(F.col("replay_id") == replay_id, F.lit(False))
    todo = planned.where(~descendant).join(F.broadcast(done), ["destination", "source_record"], "left_anti")
    return todo.cache(), None if keys is None else keys[0]


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `retrytopics replay` (the pipeline itself comes from --topic/--group/--delays or --config)."""
    parser.add_argument("--replay-id", required=True, help="names this replay; rerunning the same id is idempotent")
    parser.add_argument("--reason", action="append", help="DLQ reason to select (repeatable)")
    parser.add_argument("--exception-type", action="append", help="exception type to select (repeatable)")
    parser.add_argument(
        "--since",
        type=instant_argument("--since"),
        metavar="TIME",
        help="DLQ records at or after this time (ISO-8601 such as 2026-11-23T16:50:00Z, or epoch ms)",
    )
    parser.add_argument(
        "--until", type=instant_argument("--until"), metavar="TIME", help="DLQ records before this time"
    )
    parser.add_argument("--origin-ids", metavar="FILE", help="file with one origin message id per line")
    parser.add_argument(
        "--where",
        metavar="FILTER",
        help="filter over the typed columns: comparisons, AND/OR/NOT, "
        "IN, BETWEEN, LIKE, IS NULL and a few pure functions (docs/spark.md)",
    )
    parser.add_argument(
        "--to",
        dest="destination",
        choices=DESTINATIONS,
        default="original",
        help="original topic (default) or the first retry tier (refused for a key-ordered handler's "
        "blocked_by_key records and the records they waited behind)",
    )
    parser.add_argument(
        "--keep-reconsume-times",
        action="store_true",
        help="to a tier: keep the retry count and failure times instead of resetting them",
    )
    parser.add_argument("--max-replays", type=int, default=1, help="skip records replayed this often (default 1)")
    parser.add_argument("--allow-replayed", action="store_true", help="replay such records anyway")
    parser.add_argument("--park", action="store_true", help="send such records to <dlq>.parked instead")
    parser.add_argument("--rate", type=int, metavar="RECORDS_PER_S", help="overall send rate limit")
    parser.add_argument("--dry-run", action="store_true", help="print counts and a sample, write nothing")
    parser.add_argument(
        "--broker-dlq",
        metavar="TOPIC",
        help="count a share group's broker-written DLQ (dlq.<group>) as skipped_broker_dlq: never replayed",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument(
        "--header-key-file",
        metavar="FILE",
        help="signed retry headers: file with the app's "
        "header keys, one per line, the first signing (or RETRYTOPICS_APP_HEADER_KEY)",
    )
    parser.add_argument(
        "--accept-v1-signatures",
        action="store_true",
        help="with header keys, also accept DLQ "
        "records signed by a release before user headers were signed (their user headers are "
        "not covered: docs/headers.md)",
    )
    parser.add_argument(
        "--kafka-format",
        choices=["python", "builtin"],
        default="python",
        help="read and write with this project's Python data source or Spark's own kafka format",
    )


def run_replay_cli(args: argparse.Namespace, *, kafka: KafkaConfig, topics: TopicSet) -> int:
    """Run a replay for parsed `args`; exit status 0."""
    from retrytopics.operator.progress import finish, note, rate
    from retrytopics.spark.session import get_session, job_step

    origin_ids = None
    if args.origin_ids:
        with open(args.origin_ids, encoding="utf-8") as handle:
            origin_ids = [line.strip() for line in handle if line.strip()]
    header_keys = getattr(args, "header_keys", None)
    if args.accept_v1_signatures:
        if header_keys is None:
            raise ConfigError("--accept-v1-signatures", True, "needs the app's header keys (--header-key-file)")
        header_keys = HeaderKeys.of(header_keys, accept_v1=True)
    spark = get_session(args.master, "retrytopics-replay")
    job_step(spark, "replay: selecting DLQ records" + (" (dry run)" if args.dry_run else " and writing them"))
    started = time.monotonic()
    result = replay(
        spark,
        kafka,
        topics,
        replay_id=args.replay_id,
        destination=args.destination,
        reasons=args.reason,
        exception_types=args.exception_type,
        since_ms=args.since,
        until_ms=args.until,
        origin_ids=origin_ids,
        where=args.where,
        reset_reconsume_times=not args.keep_reconsume_times,
        max_replays=args.max_replays,
        allow_replayed=args.allow_replayed,
        park=args.park,
        rate_per_s=args.rate,
        dry_run=args.dry_run,
        kafka_format=args.kafka_format,
        header_keys=header_keys,
        broker_dlq=args.broker_dlq,
    )
    seconds, written = time.monotonic() - started, int(result.get("written") or 0)
    note(f"{result.get('selected', 0):,} selected, {written:,} written in {seconds:.1f}s ({rate(written, seconds)})")
    finish()  # the progress line, if any, ends before the result
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        from retrytopics.operator.reports import replay_text

        print(replay_text(result))
    return 0
