"""Guarantee of the replay job when an origin id is shared:

- a DLQ record stands for one source record, named by its original topic, partition and offset, never by
  its `origin_message_id`, which `RetryApp(id_header=...)` lets two different records share: two DLQ
  records sharing an id but not their coordinates are each replayed once, while a true duplicate (same
  coordinates, same attempt, written twice by an at-least-once crash) is replayed once;
- a rerun of the replay id writes nothing, even after a replayed record has failed back into the DLQ;
- the dry run's counts and sample say exactly what the run then writes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, Lineage, RetryHeaders
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import failure, record

pytestmark = [pytest.mark.broker, pytest.mark.spark]

SHARED_ID = "order-7"  # the id_header value two different orders were given


def _dead_letter(source: str, offset: int, *, lineage: Lineage = Lineage()) -> RetryHeaders:
    h = failure(offset, 3, source=source, tier=None, due_at=None, reason=DlqReason.EXHAUSTED, lineage=lineage)
    return dataclasses.replace(h, origin_message_id=SHARED_ID)


def _written(kafka: KafkaConfig, topic: str, replay_id: str) -> Counter[tuple[bytes, bytes, bytes]]:
    """(value, retry.replay_original, retry.replay_origin_id) of every record `replay_id` wrote to `topic`."""
    mine = [
        dict(r[4]) | {"value": r[3]}
        for r in read_direct(kafka, topic, 1)
        if r[4] and ("retry.replay_id", replay_id.encode()) in r[4]
    ]
    return Counter((h["value"], h.get("retry.replay_original"), h["retry.replay_origin_id"]) for h in mine)


@pytest.mark.parametrize("destination", ["original", "first_tier"])
def test_records_sharing_an_origin_id_are_each_replayed_once_and_true_duplicates_once(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str], destination: str
) -> None:
    # setup: source offsets 0 and 1 dead-lettered with the same origin id, then offset 0's DLQ record again
    source = unique_name("orders")
    topics: TopicSet = topics_for(source, "billing", (1_000, 10_000))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.tiers[1].topic, 1), (topics.dlq, 1))
    produce(kafka, source, [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in (0, 1)])
    first, second = record(_dead_letter(source, 0), 0), record(_dead_letter(source, 1), 1)
    produce(kafka, topics.dlq, [first, second, first])
    target = source if destination == "original" else topics.tiers[0].topic

    # when
    dry = replay(spark, kafka, topics, replay_id="fix-15", destination=destination, dry_run=True)
    run = replay(spark, kafka, topics, replay_id="fix-15", destination=destination)
    rerun = replay(spark, kafka, topics, replay_id="fix-15", destination=destination)

    # then: one record per source record, whatever their origin id says
    expected = Counter({(f"v{i}".encode(), f"{source}-0-{i}".encode(), SHARED_ID.encode()): 1 for i in (0, 1)})
    assert _written(kafka, target, "fix-15") == expected
    assert {k: dry[k] for k in ("selected", "skipped_duplicates", "skipped_invalid", "written")} == {
        "selected": 3,
        "skipped_duplicates": 1,
        "skipped_invalid": 0,
        "written": 0,
    }
    assert sorted(s["offset"] for s in dry["sample"]) == [1, 2]  # the newest copy of offset 0's DLQ record
    assert {k: run[k] for k in ("selected", "skipped_duplicates", "written", "skipped_already_replayed")} == {
        "selected": 3,
        "skipped_duplicates": 1,
        "written": 2,
        "skipped_already_replayed": 0,
    }
    assert (rerun["written"], rerun["skipped_already_replayed"]) == (0, 2)

    # when: a replayed record fails back into the DLQ (to the source it is a new record, with new
    # coordinates; to a tier it keeps them), and the replay id is rerun, allowing replayed records
    replayed_at = {
        h[1]: offset
        for _, offset, *_, headers in read_direct(kafka, target, 1)
        if headers
        for h in headers
        if h[0] == "retry.replay_original"
    }
    copy_offset = replayed_at[f"{source}-0-0".encode()] if destination == "original" else 0
    assert copy_offset >= (2 if destination == "original" else 0)  # after the two records of the source
    lineage = Lineage(replay_id="fix-15", replayed_at=1, replay_count=1, replay_origin_id=SHARED_ID)
    produce(kafka, topics.dlq, [record(_dead_letter(source, copy_offset, lineage=lineage), 0)])
    again = replay(spark, kafka, topics, replay_id="fix-15", destination=destination, allow_replayed=True)

    # then: nothing more is written under this replay id
    # (to a tier the new DLQ record is the newest of source offset 0's three, and the only one planned)
    planned = 3 if destination == "original" else 2
    assert (again["selected"], again["written"], again["skipped_already_replayed"]) == (4, 0, planned)
    assert _written(kafka, target, "fix-15") == expected
