"""Spark child roles: the retrytopics-kafka reader and the audit job, in one local Spark session.

Imported only for scenario 7 (it needs the `spark` extra and Java).
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import functions as F

from bench.measure import emit
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.spark_kafka import kafka_options, read_kafka
from retrytopics.core.naming import topics_for
from retrytopics.spark.audit import audit
from retrytopics.spark.session import builtin_kafka_jars, get_session

__all__ = ["spark_jobs"]


def spark_jobs(args: dict[str, Any]) -> None:
    """Read the DLQ of `source`/`group` with the data source (cold, then warm), then audit the pipeline; the
    same with Spark's own `kafka` format when its jars are cached.

    Args: bootstrap, source, group, delays_ms, master. Reports "read" and "done", each with one entry per
    format ("python", and "builtin" when available).
    """
    kafka = KafkaConfig(bootstrap=args["bootstrap"])
    topics = topics_for(args["source"], args["group"], args["delays_ms"])
    spark = get_session(args.get("master", "local[2]"), app_name="retrytopics-bench")
    formats = ["python", "builtin"] if builtin_kafka_jars() else ["python"]
    emit("ready")
    try:
        reads: dict[str, dict[str, float]] = {}
        for kafka_format in formats:
            (_, cold_s), (count, seconds) = [_timed_read(spark, kafka, topics.dlq, kafka_format) for _ in range(2)]
            reads[kafka_format] = {"count": count, "seconds": seconds, "rate": count / seconds, "cold_seconds": cold_s}
        emit("read", **reads)
        audits: dict[str, dict[str, Any]] = {}
        summaries = {}
        now_ms = int(time.time() * 1000)  # one clock for both audits, so that their answers compare
        for kafka_format in formats:
            start = time.monotonic()
            summaries[kafka_format] = audit(spark, kafka, topics, now_ms=now_ms, kafka_format=kafka_format)
            audits[kafka_format] = {
                "seconds": time.monotonic() - start,
                "dlq_records": summaries[kafka_format]["dlq"]["records"],
            }
        if "builtin" in audits:
            audits["builtin"]["same_summary"] = _comparable(summaries["builtin"]) == _comparable(summaries["python"])
        emit("done", **audits)
    finally:
        spark.stop()


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "table"}


def _timed_read(spark: Any, kafka: KafkaConfig, topic: str, kafka_format: str) -> tuple[int, float]:
    """Every record of `topic` through one format, values touched (a sum of lengths): (count, seconds)."""
    start = time.monotonic()
    df = read_kafka(spark, kafka_options(kafka, subscribe=topic), kafka_format=kafka_format)
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return int(row["n"]), time.monotonic() - start
