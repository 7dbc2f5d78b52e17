"""`read_tails` (the duplicate check's seed reader) against a scripted consumer: an error event that is not about
a partition it reads is not a failed tail. On a broker with ACLs, librdkafka reports GROUP_AUTHORIZATION_FAILED
for the reader's throwaway group id (it looks up the coordinator of an assign()-only consumer too); the app's
principal has no DESCRIBE on that group, and needs none."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError

from retrytopics.connectors import clients
from retrytopics.connectors.config import KafkaConfig


class _Described:
    def __init__(self, partitions: int) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = None


class _Metadata:
    def __init__(self, topic: str) -> None:
        self.topics = {topic: _Described(1)}


class _Event:
    """What confluent-kafka's consume() returns: a record, or an error with or without a partition."""

    def __init__(self, topic: str | None, partition: int, value: bytes | None, error: KafkaError | None) -> None:
        self._topic, self._partition, self._value, self._error = topic, partition, value, error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int:
        return self._partition


class _ScriptedConsumer:
    def __init__(self, events: list[_Event]) -> None:
        self.events = events
        self.assigned: list[Any] = []

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        return _Metadata(topic)

    def get_watermark_offsets(self, partition: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, 2

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions

    def consume(self, num_messages: int, timeout: float) -> list[_Event]:
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        pass


def test_a_group_authorization_event_is_not_a_failed_tail(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # setup: the group error arrives before the partition's records and its end
    events = [
        _Event(None, -1, None, KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)),
        _Event("t.dlq", 0, b"a", None),
        _Event("t.dlq", 0, b"b", None),
        _Event("t.dlq", 0, None, KafkaError(KafkaError._PARTITION_EOF)),
    ]
    consumer = _ScriptedConsumer(events)
    monkeypatch.setattr(clients, "make_consumer", lambda *args, **kwargs: consumer)
    seen: list[bytes] = []
    monkeypatch.setattr(clients, "_message", lambda msg: seen.append(msg._value) or msg)

    # when
    with caplog.at_level(logging.DEBUG, logger="retrytopics"):
        read = clients.read_tails(KafkaConfig(bootstrap="127.0.0.1:9"), ["t.dlq"], last=10, timeout_s=5)

    # then: both records are the tail, and nothing claims that the tail could not be read
    assert len(read) == 2 and seen == [b"a", b"b"]
    assert [(p.topic, p.partition, p.offset) for p in consumer.assigned] == [("t.dlq", 0, 0)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_error_on_a_partition_read_here_is_still_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = [_Event("t.dlq", 0, None, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]
    monkeypatch.setattr(clients, "make_consumer", lambda *args, **kwargs: _ScriptedConsumer(events))
    with caplog.at_level(logging.WARNING, logger="retrytopics"):
        read = clients.read_tails(KafkaConfig(bootstrap="127.0.0.1:9"), ["t.dlq"], last=10, timeout_s=5)
    assert read == []
    assert [r.args[:2] for r in caplog.records if r.levelno == logging.WARNING] == [("t.dlq", 0)]
