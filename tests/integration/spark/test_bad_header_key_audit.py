"""The audit reads past a record whose header key is not UTF-8.

Before: the Python data source called confluent-kafka's `headers()`, which raised SystemError on such a
key, and the Spark task, then the whole audit, failed. Guarantee: the audit counts the record like any
other; a DLQ record with a bad key keeps its reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, TopicPartition
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_consumer
from retrytopics.core.headers import DlqReason, encode
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.spark.audit import audit

from ..raw_produce import produce_raw_record
from .conftest import create_topics, produce
from .pipeline_data import NOW, failure

pytestmark = [pytest.mark.broker, pytest.mark.spark]

BAD_KEY = b"\xff\xfe"


def _wait_for_group_coordinators(kafka: KafkaConfig, topics: TopicSet, timeout_s: float = 30.0) -> None:
    """A broker that has just started loads a group's coordinator on first use and answers NOT_COORDINATOR
    meanwhile; the audit's committed-offset lookup does not retry that, so wait until every group answers."""
    groups = {topics.source: topics.group, **{t.topic: t.topic for t in topics.tiers}}
    deadline = time.monotonic() + timeout_s
    for topic, group in groups.items():
        consumer = make_consumer(kafka, group_id=group)
        try:
            while True:
                try:
                    consumer.committed([TopicPartition(topic, 0)], timeout=5)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # polling with a deadline
        finally:
            consumer.close()


def test_the_audit_counts_records_with_a_bad_header_key(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: a good and a bad source record, and a DLQ record with a bad key
    source = unique_name("audit-bad-key")
    topics = topics_for(source, "billing", (1_000,))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.dlq, 1))
    produce(kafka, source, [{"key": b"k0", "value": b"v0"}])
    produce_raw_record(kafka, source, 0, key=b"k1", value=b"v1", headers=[(BAD_KEY, b"v")])
    dead = failure(1, 1, source=source, tier=None, due_at=None, reason=DlqReason.POISON)
    produce_raw_record(
        kafka,
        topics.dlq,
        0,
        key=b"k1",
        value=b"v1",
        headers=[(BAD_KEY, b"v"), *((k.encode(), v) for k, v in encode(dead))],
    )
    _wait_for_group_coordinators(kafka, topics)
    # when
    summary = audit(spark, kafka, topics, now_ms=NOW, grace_ms=60_000)
    # then
    stages = [(s["kind"], s["records"]) for s in summary["stages"]]
    assert stages == [("source", 2), ("tier", 0), ("dlq", 1)]
    assert summary["dlq"]["by_reason"] == {"poison": 1}
