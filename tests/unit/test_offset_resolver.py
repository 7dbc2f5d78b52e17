"""The Spark reader's committed-offset lookup rides out a group coordinator that is still loading (seen on a
freshly started Apache Kafka: NOT_COORDINATOR), and gives up with the error once its timeout has passed."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retrytopics.connectors import spark_kafka_io
from retrytopics.core.errors import KafkaClientError


class _Probe:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in tps]

    def close(self) -> None:
        pass


def _resolver(monkeypatch: pytest.MonkeyPatch, probe: _Probe, timeout_s: float) -> Any:
    monkeypatch.setattr(spark_kafka_io, "_consumer", lambda props, **extra: probe)
    return spark_kafka_io.OffsetResolver({"bootstrap.servers": "unused:9092"}, timeout_s=timeout_s)


def test_a_loading_coordinator_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = _Probe(failures=3)
    assert _resolver(monkeypatch, probe, 10).committed("g", [("t", 0)]) == {("t", 0): 7}
    assert probe.calls == 4


def test_past_the_timeout_the_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = _Probe(failures=10_000)
    with pytest.raises(KafkaClientError, match="NOT_COORDINATOR"):
        _resolver(monkeypatch, probe, 0.3).committed("g", [("t", 0)])
