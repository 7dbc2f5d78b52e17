"""The replay with signed retry headers: a DLQ record whose signature is missing, made with
another key, or made for another topic is skipped and counted (problem `signature`) while the signed ones
are replayed; to the first tier, what the replay writes verifies with the app's key there.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, encode
from retrytopics.core.naming import topics_for
from retrytopics.core.signing import HeaderKeys, sign, verify
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import failure

pytestmark = [pytest.mark.broker, pytest.mark.spark]

KEYS = HeaderKeys.of(["the app's current key, 32 bytes+", "the app's previous key, 32 bytes"])


def test_dlq_records_without_a_valid_signature_are_skipped_and_the_rest_replayed(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: four DLQ records signed by the app (one with the previous key), and three forged among them
    source = unique_name("orders")
    topics = topics_for(source, "billing", (1_000,))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.dlq, 1))

    def record(offset: int, keys: HeaderKeys | None, topic: str = topics.dlq) -> dict[str, object]:
        headers = encode(failure(offset, 3, source=source, tier=None, due_at=None, reason=DlqReason.EXHAUSTED))
        key, value = b"k%d" % offset, b"v%d" % offset
        if keys is not None:
            headers = list(sign(keys, topic, key, value, headers))
        return {"key": key, "value": value, "headers": headers, "partition": 0}

    previous = HeaderKeys.of(KEYS.keys[1])
    signed = [record(0, KEYS), record(1, KEYS), record(2, previous), record(3, KEYS)]
    forged = [record(10, None), record(11, HeaderKeys.of(b"x" * 32)), record(12, KEYS, topics.tiers[0].topic)]
    produce(kafka, topics.dlq, [signed[0], forged[0], signed[1], forged[1], signed[2], forged[2], signed[3]])

    # when: replayed to the first tier with the app's keys
    result = replay(spark, kafka, topics, replay_id="signed-1", destination="first_tier", header_keys=KEYS)

    # then: the forged ones are counted and skipped, the signed ones written, signed for the tier
    assert (result["selected"], result["written"], result["skipped_invalid"]) == (7, 4, 3)
    assert result["skipped_invalid_by_problem"] == {"signature": 3}
    assert [r["offset"] for r in result["invalid_sample"]] == [1, 3, 5]
    tier = topics.tiers[0].topic
    rows = read_direct(kafka, tier, 1)
    assert sorted(r[3] for r in rows) == [b"v0", b"v1", b"v2", b"v3"]
    for _, _, key, value, headers in rows:
        assert verify(KEYS, tier, key, value, headers) is None
        assert verify(KEYS, topics.dlq, key, value, headers) is not None  # signed for the tier, nowhere else
