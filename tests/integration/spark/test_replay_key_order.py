"""Guarantees of the replay for a key-ordered handler's dead-lettered sequences (docs/key-ordering.md, section 6):

- the records a replay writes to one destination partition go in source order (original topic, partition,
  offset), not in DLQ order, so a dead-lettered record and the `blocked_by_key` records behind it go back
  as they first came however their DLQ records are interleaved; a `blocked_by_key` record's retry count of 0
  is valid;
- a replay to the first tier is refused, naming the reason, when its selection holds a `blocked_by_key` record
  or the record one of them waited behind, and writes nothing; other records still replay to the tier.

The DLQ records are forged with the core's encoders, as the runtime writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core import headers as H
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import DlqReason, RetryHeaders, decode_lineage, encode
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.spark.ledger import REPLAY_ORIGINAL
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import T0

pytestmark = [pytest.mark.broker, pytest.mark.spark]

BLOCKED_TYPE = "retrytopics.core.key_order.BlockedByKey"


def _dead_letter(source: str, partition: int, offset: int, key: bytes, *, behind: int | None) -> dict[str, Any]:
    """A DLQ record of source record `partition`/`offset`: a head dead-lettered as `exhausted`, or (`behind`
    given) a follower dead-lettered unhandled behind source offset `behind`, as the runtime writes it."""
    state = RetryHeaders(
        reconsume_times=3 if behind is None else 1,
        origin_message_id=f"{source}-{partition}-{offset}",
        original_topic=source,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=T0 - 1000,
        consumer_group="billing",
        tier=None,
        due_at=None,
        first_failed_at=T0,
        last_failed_at=T0,
        exception_type="builtins.TimeoutError" if behind is None else BLOCKED_TYPE,
        exception_message="boom"
        if behind is None
        else f"behind {source}-{partition}-{behind} (dead-lettered: exhausted)",
        exception_trace="",
        dlq_reason=DlqReason.EXHAUSTED if behind is None else DlqReason.BLOCKED_BY_KEY,
    )
    headers = encode(state)
    if behind is not None:  # it never ran: the runtime writes a count of 0, which RetryHeaders itself refuses
        headers = [(name, b"0" if name == H.RECONSUME_TIMES else raw) for name, raw in headers]
    return {"key": key, "value": f"v{partition}-{offset}".encode(), "headers": [("trace-id", b"t"), *headers]}


def _interleaved_dlq(kafka: KafkaConfig, source: str) -> TopicSet:
    """Source partition 0: `acct-7` dead-lettered at 10 with followers 11 and 12 behind it, and an unrelated
    record 5; partition 1: `acct-9` dead-lettered at 3 with follower 4. The DLQ holds them out of order."""
    topics = topics_for(source, "billing", (1_000, 10_000))
    create_topics(kafka, (source, 2), (topics.tiers[0].topic, 2), (topics.tiers[1].topic, 2), (topics.dlq, 1))
    a, b = b"acct-7", b"acct-9"
    produce(
        kafka,
        topics.dlq,
        [
            _dead_letter(source, 0, 12, a, behind=11),
            _dead_letter(source, 1, 4, b, behind=3),
            _dead_letter(source, 0, 10, a, behind=None),
            _dead_letter(source, 0, 5, b"other", behind=None),
            _dead_letter(source, 0, 11, a, behind=10),
            _dead_letter(source, 1, 3, b, behind=None),
        ],
    )
    return topics


def test_a_dead_lettered_sequence_goes_back_in_source_order_however_the_dlq_interleaves_it(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """Replayed to the source, each partition receives its records in source-offset order (10, 11, 12 of
    `acct-7` after 5; 3 then 4 of `acct-9`), each once, with its lineage naming the source record; the
    `blocked_by_key` records (retry count 0) are valid, none skipped."""
    source = unique_name("orders")
    topics = _interleaved_dlq(kafka, source)

    result = replay(spark, kafka, topics, replay_id="ordered")

    assert (result["selected"], result["written"], result["skipped_invalid"]) == (6, 6, 0)
    rows = read_direct(kafka, source, 2)
    written = {p: [value for partition, _, _, value, _ in rows if partition == p] for p in (0, 1)}
    assert written == {0: [b"v0-5", b"v0-10", b"v0-11", b"v0-12"], 1: [b"v1-3", b"v1-4"]}
    for partition, _, key, value, headers in rows:
        offset = int(value.decode().split("-")[1])
        assert dict(headers)[REPLAY_ORIGINAL] == f"{source}-{partition}-{offset}".encode()
        assert decode_lineage(headers).replay_id == "ordered"
        assert key == {10: b"acct-7", 11: b"acct-7", 12: b"acct-7", 5: b"other", 3: b"acct-9", 4: b"acct-9"}[offset]


def test_a_replay_to_the_first_tier_refuses_a_dead_lettered_sequence_and_writes_nothing(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """`--to first_tier` fails naming `blocked_by_key` and the source records when the selection holds a
    follower or the head a follower names (the head alone selected, by its reason, included), dry run or not,
    and nothing reaches the tier; a record outside every sequence still replays to it."""
    source = unique_name("orders")
    topics = _interleaved_dlq(kafka, source)
    tier = topics.tiers[0].topic

    for selection in ({}, {"reasons": ["exhausted"]}, {"where": "original_offset = 4"}):
        for dry_run in (True, False):
            with pytest.raises(ConfigError) as info:
                replay(
                    spark, kafka, topics, replay_id="to-tier", destination="first_tier", dry_run=dry_run, **selection
                )
            assert info.value.field == "destination"
            assert "blocked_by_key" in str(info.value)
    follower_only = str(info.value)
    assert f"{source}-1-4" in follower_only and f"{source}-0-10" not in follower_only
    with pytest.raises(ConfigError) as info:
        replay(spark, kafka, topics, replay_id="heads", destination="first_tier", reasons=["exhausted"])
    assert f"{source}-0-10" in str(info.value) and f"{source}-1-3" in str(info.value)
    assert f"{source}-0-5" not in str(info.value)
    assert read_direct(kafka, tier, 2) == []

    alone = replay(spark, kafka, topics, replay_id="alone", destination="first_tier", where="original_offset = 5")

    assert alone["written"] == 1
    ((_, _, key, value, _),) = read_direct(kafka, tier, 2)
    assert (key, value) == (b"other", b"v0-5")
