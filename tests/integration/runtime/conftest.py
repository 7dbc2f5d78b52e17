"""Helpers for runtime scenarios on a real broker: produce, read whole topics, committed offsets, deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retrytopics import RetryApp
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.brokers import local_broker
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.embedded import free_port
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.core.headers import Header

from .proxy import KafkaProxy


@dataclass(frozen=True)
class Read:
    """A record read back by an independent consumer."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    def header(self, name: str) -> bytes | None:
        found = [v for k, v in self.headers if k == name]
        return found[-1] if found else None


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `predicate` until truthy; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


#: what a just-created topic's partitions answer for a moment, before their leader is known everywhere
_NO_LEADER_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _watermarks(consumer: Any, tp: TopicPartition, timeout_s: float = 10.0) -> tuple[int, int]:
    """The partition's watermarks, asked again while it has no leader yet (seen in CI right after a topic
    was provisioned: NOT_LEADER_FOR_PARTITION)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in _NO_LEADER_YET or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Kit:
    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self.admin = make_admin(kafka)
        self._producer = make_producer(kafka)

    def create(self, topic: str, partitions: int = 1) -> str:
        ensure_topics(self.admin, [TopicSpec(name=topic, partitions=partitions)])
        return topic

    def produce(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes | None, list[Header]]],
        partition: int | None = None,
    ) -> None:
        for key, value, headers in records:
            kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers}
            if partition is not None:
                kwargs["partition"] = partition
            self._producer.produce(topic, **kwargs)
            self._producer.poll(0)
        assert self._producer.flush(30) == 0

    def read_all(self, topic: str, *, isolation: str = "read_committed", timeout_s: float = 10.0) -> list[Read]:
        """Every record of `topic` up to its end offsets, read by a throwaway assign()-only consumer."""
        consumer = make_consumer(self.kafka, group_id=None, overrides={"isolation.level": isolation})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            ends = {}
            for p in meta.partitions:
                low, high = _watermarks(consumer, TopicPartition(topic, p))
                if high > low:
                    ends[p] = high
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
            out: list[Read] = []
            done: set[int] = set()
            deadline = time.monotonic() + timeout_s
            while len(done) < len(ends) and time.monotonic() < deadline:
                for m in consumer.consume(500, 0.2):
                    if m.error():
                        continue
                    out.append(Read(m.topic(), m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ())))
                    if m.offset() >= ends[m.partition()] - 1:
                        done.add(m.partition())
                if isolation == "read_committed":
                    # aborted records and markers are never delivered: the position tells when we are through
                    for tp in consumer.position([TopicPartition(topic, p) for p in ends if p not in done]):
                        if tp.offset >= ends[tp.partition]:
                            done.add(tp.partition)
            return out
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offsets. A coordinator still moving or loading (NOT_COORDINATOR right after
        a group's first commit) is asked again, within 10 s; it says nothing about the offsets."""
        consumer = make_consumer(self.kafka, group_id=group)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                    return {tp.partition: tp.offset for tp in got}
                except KafkaException as exc:
                    if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            consumer.close()


_COORDINATOR_MOVING = frozenset(
    {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE}
)


@pytest.fixture
def kit(kafka: KafkaConfig) -> Kit:
    return Kit(kafka)


@pytest.fixture
def apps() -> Iterator[list[RetryApp]]:
    """Apps appended here are stopped at the end of the test, whatever happens."""
    started: list[RetryApp] = []
    yield started
    for app in started:
        app.stop(timeout=30)


@pytest.fixture(scope="package")
def proxied_broker(local_broker_kind: str) -> Iterator[tuple[Any, int]]:
    """One broker of the tests' own (not the session's), advertising a port where each test puts its proxy:
    the fault tests that cut connections but never stop the broker share it (a broker start is 5-10 s)."""
    port = free_port()
    with local_broker(local_broker_kind, advertised_port=port) as broker:
        yield broker, port


@pytest.fixture
def proxied(proxied_broker: tuple[Any, int]) -> Iterator[tuple[KafkaConfig, KafkaProxy]]:
    """The shared broker behind a proxy of this test's own: its toxics and counters start clean, and the
    previous test's connections were reset when its proxy stopped. Topic and group names must be unique."""
    broker, port = proxied_broker
    with KafkaProxy(port, broker.port) as proxy:
        yield broker.kafka_config(), proxy
