"""`open_tail` asks a partition whose leader is not known yet again, up to its timeout, and refuses other errors
at once: the demo's DLQ reader opens right after its topics were created, when Apache Kafka may still answer
NOT_LEADER_FOR_PARTITION."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retrytopics.connectors import kafka as kafka_module
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import KafkaClientError


class _Consumer:
    def __init__(self, failures: list[int]) -> None:
        self.failures = failures
        self.assigned: list[TopicPartition] = []
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.asked += 1
        if self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        return 5, 105

    def assign(self, assignment: list[TopicPartition]) -> None:
        self.assigned = assignment


def _open(monkeypatch: pytest.MonkeyPatch, consumer: _Consumer, timeout_s: float = 5.0) -> None:
    monkeypatch.setattr(kafka_module, "make_consumer", lambda *_, **__: consumer)
    kafka_module.open_tail(KafkaConfig(bootstrap="127.0.0.1:1"), "orders.dlq", 2, last=10, timeout_s=timeout_s)


def test_a_partition_without_a_leader_yet_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE])
    _open(monkeypatch, consumer)
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 95), (1, 95)]
    assert consumer.asked == 4


def test_other_errors_and_a_leader_missing_past_the_timeout_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KafkaClientError, match="TOPIC_AUTHORIZATION_FAILED"):
        _open(monkeypatch, _Consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED]))
    with pytest.raises(KafkaClientError, match="NOT_LEADER"):
        _open(monkeypatch, _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION] * 1_000), timeout_s=0.3)
