"""Guarantees of the audit for a key-ordered pipeline (docs/spark.md, "Key ordering"):

- blocked keys are the key-state topic's live chain records by compaction's rule (a tombstone closes one), a
  malformed chain record is counted and never shown;
- followers (tier records with `retry.key_order.after`) are counted per tier, and per key as distinct source
  records;
- each follower's wait behind its head runs from `held_at` to its DLQ record, its first failure, or its
  handled last hop, else to now; the longest is reported with its source record;
- `blocked_by_key` is counted as a DLQ reason; a follower's hops are no failure episode; a pipeline without a
  key-state topic has no such section.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin
from retrytopics.core import headers as H
from retrytopics.core.headers import DlqReason, RetryHeaders, encode
from retrytopics.core.keyorder.follower import Follower, encode_follower
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import Chain, Closed, encode_record
from retrytopics.core.naming import topics_for
from retrytopics.spark.audit import audit, format_table, pipeline_records
from retrytopics.spark.key_order import follower_waits, with_follower_columns

from .conftest import create_topics, produce
from .pipeline_data import commit

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _state(source: str, offset: int, **fields: Any) -> RetryHeaders:
    base: dict[str, Any] = {
        "reconsume_times": 1,
        "origin_message_id": f"{source}-0-{offset}",
        "original_topic": source,
        "original_partition": 0,
        "original_offset": offset,
        "original_timestamp": -1,
        "consumer_group": "billing",
        "tier": None,
        "due_at": None,
        "first_failed_at": fields.get("first_failed_at", 1),
        "last_failed_at": fields.get("first_failed_at", 1),
        "exception_type": "builtins.TimeoutError",
        "exception_message": "boom",
        "exception_trace": "",
    }
    return RetryHeaders(**{**base, **fields})


def test_the_audit_reports_blocked_keys_followers_and_the_longest_wait_behind_a_head(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """acct-7: head 10, followers 11 (forwarded to tier 1, ran there: handled), 12 (dead-lettered as
    blocked_by_key), 13 (ran and failed: a retry hop); its chain closed. acct-8: head 20, follower 21 still
    waiting in tier 0; its chain open. Expected: 1 blocked key (acct-8), 1 malformed chain record; followers
    4 in tier 0 and 1 in tier 1, 2 keys with at most 3; waits 4,900, 8,800, 6,600 ms and, for 21, up to now;
    the longest is 21's, still waiting."""
    now = int(time.time() * 1000)
    base = now - 600_000
    source = unique_name("orders")
    topics = topics_for(source, "billing", (1_000, 10_000))
    t0, t1 = topics.tiers
    create_topics(kafka, (source, 1), (t0.topic, 1), (t1.topic, 1), (topics.dlq, 1))
    ensure_topics(
        make_admin(kafka), [TopicSpec(name=topics.key_state_topic, partitions=1, config={"cleanup.policy": "compact"})]
    )

    def follower(offset: int, key: bytes, after: int, held_at: int, at: int) -> dict[str, Any]:
        f = Follower(
            original_topic=source,
            original_partition=0,
            original_offset=offset,
            original_timestamp=-1,
            consumer_group="billing",
            origin_message_id=f"{source}-0-{offset}",
            after=after,
            held_at=held_at,
        )
        return {"key": key, "value": b"v", "headers": encode_follower(f), "timestamp": at}

    def retried(offset: int, key: bytes, tier: int, at: int, first_failed_at: int) -> dict[str, Any]:
        state = _state(source, offset, tier=tier, due_at=at + 1000, first_failed_at=first_failed_at)
        return {"key": key, "value": b"v", "headers": encode(state), "timestamp": at}

    a, b = b"acct-7", b"acct-8"
    produce(
        kafka,
        t0.topic,
        [
            retried(10, a, 0, base + 50, base + 50),
            follower(11, a, 10, base + 100, base + 150),
            follower(12, a, 11, base + 200, base + 250),
            retried(20, b, 0, base + 280, base + 280),
            follower(21, b, 20, base + 300, base + 350),
            follower(13, a, 12, base + 400, base + 450),
        ],
    )
    produce(
        kafka, t1.topic, [follower(11, a, 10, base + 100, base + 5_000), retried(13, a, 1, base + 7_000, base + 7_000)]
    )
    commit(kafka, t0.topic, t0.topic, 4)  # 21 (offset 4) not read yet
    commit(kafka, t1.topic, t1.topic, 1)  # 11's hop read and handled
    dead = encode(_state(source, 12, dlq_reason=DlqReason.BLOCKED_BY_KEY, first_failed_at=base + 9_000))
    dead = [(name, b"0" if name == H.RECONSUME_TIMES else raw) for name, raw in dead]
    produce(kafka, topics.dlq, [{"key": a, "value": b"v", "headers": dead, "timestamp": base + 9_000}])
    records = []
    for record in (
        Chain(chain=ChainKey(source, 0, key_id(a)), head=10, frontier=13, at_tier=0, followers=3, since_ms=base),
        Chain(chain=ChainKey(source, 0, key_id(b)), head=20, frontier=21, at_tier=0, followers=1, since_ms=base + 280),
        Closed(chain=ChainKey(source, 0, key_id(a))),
    ):
        key, value, partition = encode_record(record)
        records.append({"key": key, "value": value, "partition": partition})
    records.append({"key": f"chain/{source}/0/0061".encode(), "value": b'{"v":1}', "partition": 0})
    produce(kafka, topics.key_state_topic, records)

    summary = audit(spark, kafka, topics, now_ms=now)

    section = summary["key_order"]
    assert (section["topic"], section["blocked_keys"], section["malformed"]) == (topics.key_state_topic, 1, 1)
    assert section["blocked_by_partition"] == {"0": 1}
    ((chain),) = section["chains"]
    assert (chain["key_id"], chain["head"], chain["frontier"], chain["followers"]) == (key_id(b).hex(), 20, 21, 1)
    assert section["followers_by_tier"] == {t0.topic: 4, t1.topic: 1}
    assert section["followers_per_key"]["keys"] == 2 and section["followers_per_key"]["max"] == 3
    assert (section["followers"], section["followers_waiting"]) == (4, 1)
    longest = section["longest_wait"]
    assert (longest["original_offset"], longest["after"], longest["waiting"]) == (21, 20, True)
    assert section["longest_wait_ms"] == now - (base + 300)
    assert summary["dlq"]["by_reason"] == {"blocked_by_key": 1}
    # followers that never failed are no failure episodes: heads 10 and 20 recovered, 13 in flight, 12 dead
    lineage = summary["lineage"]
    assert (lineage["episodes"], lineage["by_outcome"]) == (4, {"recovered": 2, "dead_lettered": 1, "in_flight": 1})
    assert "1 blocked keys" in format_table(summary) and "still waiting" in format_table(summary)

    read = with_follower_columns(pipeline_records(spark, kafka, topics, now_ms=now, grace_ms=60_000))
    waits = {r.original_offset: (r.wait_ms, r.waiting) for r in follower_waits(read, now).collect()}
    assert waits == {11: (4_900, False), 12: (8_800, False), 13: (6_600, False), 21: (now - base - 300, True)}


def test_a_pipeline_without_a_key_state_topic_has_no_key_order_section(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """The audit of a pipeline provisioned without key ordering adds nothing: its summary keys are the ones
    it always had."""
    source = unique_name("orders")
    topics = topics_for(source, "billing", (1_000,))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.dlq, 1))

    summary = audit(spark, kafka, topics)

    assert "key_order" not in summary
    assert set(summary) == {
        "source",
        "group",
        "now_ms",
        "grace_ms",
        "stages",
        "dlq",
        "by_exception_type",
        "reconsume_times",
        "lineage",
    }
