"""The operator tools read past a record whose header key is not UTF-8.

Before: confluent-kafka's `headers()` raised SystemError on such a key, and `dlq peek`, `topics describe`
and the Spark data source behind `audit` and `replay` crashed on it. Guarantee: each reads every record;
the bad header keeps its value, with its key decoded as Spark's own source decodes it (U+FFFD), and
`dlq peek` says what was wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.connectors.spark_kafka_io import read_range
from retrytopics.connectors.spark_kafka_plan import OffsetRange
from retrytopics.core.headers import DlqReason, RetryHeaders, encode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import describe_pipeline, peek_dlq

from .raw_produce import produce_raw_record

pytestmark = pytest.mark.broker

BAD_KEY = b"\xff\xfe"
REPLACED = "\ufffd\ufffd"


def _retry(*, tier: int | None, due_at: int | None, reason: DlqReason | None) -> list[tuple[bytes, bytes | None]]:
    now = int(time.time() * 1000)
    retry = RetryHeaders(
        reconsume_times=1,
        origin_message_id="o-1",
        original_topic="orders",
        original_partition=0,
        original_offset=0,
        original_timestamp=now,
        consumer_group="billing",
        tier=tier,
        due_at=due_at,
        first_failed_at=now,
        last_failed_at=now,
        exception_type="x.E",
        exception_message="m",
        exception_trace="",
        dlq_reason=reason,
    )
    return [(k.encode(), v) for k, v in encode(retry)]


def _topic(kafka: KafkaConfig, name: str) -> str:
    ensure_topics(make_admin(kafka), [TopicSpec(name=name, partitions=1)])
    return name


def _good(kafka: KafkaConfig, topic: str, value: bytes) -> None:
    producer = make_producer(kafka)
    producer.produce(topic, key=b"g", value=value, headers=[("h", b"1")])
    assert producer.flush(10) == 0


def test_the_spark_reader_reads_past_a_bad_header_key(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    # setup: good, bad, bad twice, good
    topic = _topic(kafka, unique_name("spark-bad-key"))
    _good(kafka, topic, b"first")
    produce_raw_record(kafka, topic, 0, key=b"k", value=b"bad", headers=[(BAD_KEY, b"v"), (b"user", b"kept")])
    produce_raw_record(
        kafka, topic, 0, key=b"k", value=b"two", headers=[(b"\xc3(x", None), (b"u", b"1"), (BAD_KEY, b"w")]
    )
    _good(kafka, topic, b"last")
    # when: the executor-side reader of the Python data source reads the range
    batches = list(read_range(kafka.client_config(), OffsetRange(topic, 0, 0, 4), include_headers=True))
    # then: all rows; the bad headers in their places with their values, the key as Spark's own source decodes
    # it where its bytes are known (confluent-kafka reports the first bad key's only; later ones read as U+FFFD)
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [r["value"] for r in rows] == [b"first", b"bad", b"two", b"last"]
    assert rows[1]["headers"] == [{"key": REPLACED, "value": b"v"}, {"key": "user", "value": b"kept"}]
    assert rows[2]["headers"] == [
        {"key": "\ufffd(x", "value": None},
        {"key": "u", "value": b"1"},
        {"key": "\ufffd", "value": b"w"},
    ]


def test_dlq_peek_reads_past_a_bad_header_key(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    dlq = _topic(kafka, unique_name("peek-bad-key"))
    headers = [(BAD_KEY, b"v"), *_retry(tier=None, due_at=None, reason=DlqReason.POISON)]
    produce_raw_record(kafka, dlq, 0, key=b"k", value=b"bad", headers=headers)
    _good(kafka, dlq, b"after")
    # when
    peeked = list(peek_dlq(kafka, dlq, last=10, idle_timeout_s=1.0))
    # then: both records; the bad one's retry headers decoded and its problem named
    assert [p.value for p in peeked] == ["bad", "after"]
    bad = peeked[0]
    assert bad.retry is not None and bad.retry["reason"] == "poison"
    assert bad.header_error is not None and "not UTF-8" in bad.header_error and "\\xff\\xfe" in bad.header_error
    assert bad.user_headers == {REPLACED: "v"}


def test_topics_describe_reads_a_tier_head_with_a_bad_header_key(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: a pipeline whose tier 0 head (no consumer) carries a bad key and is due in an hour
    source = _topic(kafka, unique_name("describe-bad-key"))
    app = AppSettings(topic=source, group="billing", delays=("1s",))
    topics = topics_for(source, "billing", RetryPolicy(delays=["1s"]).tier_delays_ms)
    for name in topics.all_topics:
        _topic(kafka, name)
    due = int(time.time() * 1000) + 3_600_000
    produce_raw_record(
        kafka,
        topics.tiers[0].topic,
        0,
        key=b"k",
        value=b"v",
        headers=[(BAD_KEY, b"v"), *_retry(tier=0, due_at=due, reason=None)],
    )
    # when
    rows = describe_pipeline(kafka, app)
    # then: the head is read through the bad key
    (tier,) = [r for r in rows if r.kind == "tier"]
    assert tier.lag == 1 and tier.state.startswith("waiting")
