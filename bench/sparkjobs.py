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
from retrytopics.naming import topics_for
from retrytopics.spark.audit import audit
from retrytopics.spark.session import get_session

__all__ = ["spark_jobs"]


def spark_jobs(args: dict[str, Any]) -> None:
    """Read the DLQ of `source`/`group` with the data source (cold, then warm), then audit the pipeline.

    Args: bootstrap, source, group, delays_ms, master. Reports "read" (the warm read) and "done" (audit).
    """
    kafka = KafkaConfig(bootstrap=args["bootstrap"])
    topics = topics_for(args["source"], args["group"], args["delays_ms"])
    spark = get_session(args.get("master", "local[2]"), app_name="retrytopics-bench")
    emit("ready")
    try:
        reads = [_timed_read(spark, kafka, topics.dlq) for _ in range(2)]
        (count, seconds), (_, cold_s) = reads[1], reads[0]
        emit("read", count=count, seconds=seconds, rate=count / seconds, cold_seconds=cold_s)
        start = time.monotonic()
        summary = audit(spark, kafka, topics)
        audit_s = time.monotonic() - start
        emit("done", seconds=audit_s, dlq_records=summary["dlq"]["records"])
    finally:
        spark.stop()


def _timed_read(spark: Any, kafka: KafkaConfig, topic: str) -> tuple[int, float]:
    """Every record of `topic` through the data source, values touched (a sum of lengths): (count, seconds)."""
    start = time.monotonic()
    df = read_kafka(spark, kafka_options(kafka, subscribe=topic))
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return int(row["n"]), time.monotonic() - start
