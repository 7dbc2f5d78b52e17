"""A header key that is not UTF-8 reads the same through every path of the consumer port.

confluent-kafka's `headers()` knows the bad key's bytes only on the first read of a message (they travel in
the `UnicodeDecodeError`); a second read returns its cached list, where the key is unknown and reads as one
U+FFFD (connectors/record_headers.py). Guarantee: `KafkaConsumer.consume` and `consume_runs` read each
message's headers once, so a record's bad key is decoded with one U+FFFD per invalid byte and its raw bytes
are in the `UndecodableHeaderError`, whichever path and poll it comes through.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Message as CKMessage
from confluent_kafka import TopicPartition as CKTopicPartition

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.clients import KafkaConsumer
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer
from retrytopics.connectors.record_headers import UndecodableHeaderError
from retrytopics.core.ports import Message

from .raw_produce import produce_raw_record

pytestmark = pytest.mark.broker

BAD_KEY = b"\xff\xfe"
HEADERS = [(BAD_KEY, b"v"), (b"user", b"kept")]
DECODED = (("\ufffd\ufffd", b"v"), ("user", b"kept"))
# enough polls for the interpreter to specialise the `headers()` call site: a specialised call of a C method
# does not check its result, so `headers()` returns the list with the decode error still pending
RECORDS = 20


def _topic_with_bad_keys(kafka: KafkaConfig, topic: str, values: list[bytes]) -> str:
    ensure_topics(make_admin(kafka), [TopicSpec(name=topic, partitions=1)])
    for value in values:
        produce_raw_record(kafka, topic, 0, key=b"k", value=value, headers=HEADERS)
    return topic


def _assert_read_once(messages: list[Message]) -> None:
    for message in messages:
        assert message.headers == DECODED, message.value
        error = message.header_error
        assert isinstance(error, UndecodableHeaderError), message.value
        assert error.raw_key == BAD_KEY and error.positions == [1], message.value


@pytest.mark.parametrize("path", ["consume", "consume_runs"])
def test_every_poll_decodes_a_bad_key_with_its_bytes(
    kafka: KafkaConfig, unique_name: Callable[[str], str], path: str
) -> None:
    """One record per poll, so each poll of `consume_runs` falls back to Messages at its only record: every
    record's bad key is `"\\ufffd\\ufffd"` with its raw bytes known, as through `consume`. Before the fix,
    `consume_runs` read the headers a second time on the fallback, and every record after the call site was
    specialised came with `"\\ufffd"` and no raw bytes."""
    values = [str(i).encode() for i in range(RECORDS)]
    topic = _topic_with_bad_keys(kafka, unique_name("bad-key-polls"), values)
    consumer = KafkaConsumer(kafka, group_id=unique_name("bad-key-polls"), overrides={"auto.offset.reset": "earliest"})
    consumer.subscribe([topic], on_assign=lambda _p: None, on_revoke=lambda _p: None, on_lost=lambda _p: None)
    got: list[Message] = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < RECORDS and time.monotonic() < deadline:
            if path == "consume":
                got += consumer.consume(1, 0.5)
            else:
                polled = consumer.consume_runs(1, 0.5, frozenset({topic}))
                assert polled.runs == []  # a record with a bad key is never a run's Record
                got += polled.messages
    finally:
        consumer.close()
    assert [m.value for m in got] == values
    _assert_read_once(got)


def _client_messages(kafka: KafkaConfig, topics: list[str]) -> dict[str, CKMessage]:
    """The first record of each topic as confluent-kafka's Message, its headers not read yet."""
    reader = make_consumer(kafka, group_id=None)
    reader.assign([CKTopicPartition(topic, 0, 0) for topic in topics])
    found: dict[str, CKMessage] = {}
    try:
        deadline = time.monotonic() + 30
        while len(found) < len(topics) and time.monotonic() < deadline:
            for msg in reader.consume(10, 0.5):
                assert msg.error() is None, msg.error()
                found.setdefault(str(msg.topic()), msg)
    finally:
        reader.close()
    assert sorted(found) == sorted(topics)
    return found


def test_a_bad_key_outside_the_runs_before_the_fallback_keeps_its_bytes(
    kafka: KafkaConfig, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll whose first record is of a topic outside the runs (built as a Message at once) and whose next
    record makes the poll fall back to Messages: both bad keys are decoded with their bytes. The poll is the
    real consumer's records in this order (the order of partitions in a fetch is the broker's to choose).
    Before the fix, the fallback built the first record again from confluent-kafka's cached list: `"\\ufffd"`
    and no raw bytes."""
    other = _topic_with_bad_keys(kafka, unique_name("bad-key-other"), [b"other"])
    runs = _topic_with_bad_keys(kafka, unique_name("bad-key-runs"), [b"runs"])
    by_topic = _client_messages(kafka, [other, runs])
    consumer = KafkaConsumer(kafka, group_id=unique_name("bad-key-fallback"))
    monkeypatch.setattr(consumer, "_poll", lambda _n, _t: [by_topic[other], by_topic[runs]])
    try:
        polled = consumer.consume_runs(10, 0, frozenset({runs}))
    finally:
        consumer.close()
    assert polled.runs == []
    assert [(m.topic, m.value) for m in polled.messages] == [(other, b"other"), (runs, b"runs")]
    _assert_read_once(polled.messages)
