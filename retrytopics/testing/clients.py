"""A whole `RetryApp` on the in-memory broker: `MemoryClientFactory`, the `ClientFactory` whose clients are a
`MemoryBroker`'s (retrytopics/testing/broker.py), each call taken under one lock because the app runs one thread
per consumer loop and the broker has none of its own::

    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing",
                   clients=MemoryClientFactory(broker))  # `kafka` is still validated, never connected to
    ...                                                  # @app.handler("orders", ...)
    app.provision()                                      # tier topics and DLQ, on the memory broker
    app.start(main=True, tiers="all")

The memory broker is a fake, not Kafka: what it does is checked against Apache Kafka by its contract test,
and every delivery guarantee is still proven on a real broker (docs/testing.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from retrytopics.connectors.admin import ProvisionOutcome, ShareGroupConfig, TopicDurability, TopicSpec
from retrytopics.connectors.clients import DEFAULT_MAX_POLL_INTERVAL_MS, DEFAULT_SESSION_TIMEOUT_MS
from retrytopics.core.errors import ConfigError, KafkaClientError, TopicMismatchError
from retrytopics.core.headers import Header
from retrytopics.core.ports import (
    AcknowledgedCallback,
    AckType,
    ConsumerPort,
    DeliveryCallback,
    EndOffsetsPort,
    Message,
    PartitionsCallback,
    ProducerPort,
    ShareConsumerPort,
    TopicPartition,
)
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.keyorder.ordering import KeyStateFeed as KeyStateFeedPort
from retrytopics.testing.broker import MemoryBroker, MemoryConsumer, MemoryProducer, MemoryShareConsumer

__all__ = ["MemoryClientFactory"]

#: the longest a memory consume waits in real time for a record to be written: a stopping app is never kept
#: waiting longer than this by an idle consumer (its loop sees the stop when the consume returns)
_MEMORY_WAIT_S = 0.1


class MemoryClientFactory:
    """Clients of a `MemoryBroker` for a whole `RetryApp`.

    The broker has no threads of its own and the app runs one thread per consumer loop, so every call into
    the broker takes `lock` (hold it to read the broker while an app runs on it). A consume with nothing to
    deliver waits in real time, up to its timeout and at most 0.1 s, until some producer writes, as a Kafka
    consume would; it does not advance the broker's clock, and the runtime keeps its real clock. Of the
    librdkafka properties, consumers take `isolation.level`, `auto.offset.reset`, `max.poll.interval.ms` and
    `session.timeout.ms`; the rest mean nothing here. Write records before the app starts (`broker.append`)
    or through a producer from `producer()`: a direct `append` wakes no waiting consumer.
    """

    def __init__(self, broker: MemoryBroker, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.broker = broker
        self.clock = clock
        self.lock = threading.RLock()
        self._written = threading.Condition(self.lock)
        # the memory broker keeps no topic configs: those given when `ensure_topics` created a topic are kept
        # here, for `topic_durability` (a topic made otherwise has none said)
        self._cleanup_policy: dict[str, str] = {}

    def consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ConsumerPort:
        with self.lock:
            consumer = self.broker.consumer(
                group_id,
                read_committed=overrides.get("isolation.level", "read_committed") != "read_uncommitted",
                auto_offset_reset=str(overrides.get("auto.offset.reset", "earliest")),
                max_poll_interval_ms=int(overrides.get("max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL_MS)),
                session_timeout_ms=int(overrides.get("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS)),
            )
        return _LockedConsumer(consumer, self._written)

    def producer(self, transactional_id: str | None, overrides: Mapping[str, Any]) -> ProducerPort:
        with self.lock:
            return _LockedProducer(self.broker.producer(transactional_id=transactional_id), self._written)

    def share_consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ShareConsumerPort:
        with self.lock:
            consumer = self.broker.share_consumer(group_id, max_records=int(overrides.get("max.poll.records", 500)))
        return _LockedShareConsumer(consumer, self._written)

    def share_group_config(self, group_id: str, timeout_s: float) -> dict[str, str]:
        with self.lock:
            return self.broker.share_group_config(group_id)

    def set_share_group_config(self, group_id: str, config: ShareGroupConfig, timeout_s: float) -> None:
        with self.lock:
            self.broker.configure_share_group(
                group_id,
                auto_offset_reset=config.auto_offset_reset,
                record_lock_duration_ms=config.record_lock_duration_ms,
                delivery_count_limit=config.delivery_count_limit,
            )

    def read_tails(self, topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        tails: list[Message] = []
        with self.lock:
            for topic in topics:
                if last <= 0 or self.partition_count(topic, timeout_s) is None:
                    continue
                by_partition: dict[int, list[Message]] = {}
                for msg in self.broker.records(topic):
                    by_partition.setdefault(msg.partition, []).append(msg)
                tails += [msg for records in by_partition.values() for msg in records[-last:]]
        return tails

    def read_to_end(self, topic: str, partitions: Sequence[int] | None, timeout_s: float) -> list[Message]:
        with self.lock:
            count = self.broker.partition_count(topic)  # UNKNOWN_TOPIC_OR_PART when it does not exist
            wanted = set(range(count)) if partitions is None else set(partitions)
            if not wanted <= set(range(count)):
                raise KafkaClientError(
                    f"{topic} has no partitions {sorted(wanted - set(range(count)))}", code="UNKNOWN_TOPIC_OR_PART"
                )
            ends = {p: end for p, end in self.broker.end_offsets(topic).items() if p in wanted}
            # As on Kafka, to the end as it is now: a transaction open below it is waited for
            # (connectors/clients.py). The wait releases the lock, however often this thread holds it (a
            # rebalance callback runs inside a consume), so that other loops can decide their transactions.
            deadline = time.monotonic() + timeout_s
            while (records := self.broker.stable_records(topic, ends)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaClientError(
                        f"{topic} not read to its end within {timeout_s}s (a transaction open in it is not decided)",
                        code="TIMED_OUT",
                        retriable=True,
                    )
                self._written.wait(min(left, _MEMORY_WAIT_S))
            return records

    def key_state_feed(self) -> KeyStateFeedPort:
        return _MemoryFeed(self)

    def end_offsets(self) -> EndOffsetsPort:
        return _MemoryEndOffsets(self)

    def partition_count(self, topic: str, timeout_s: float) -> int | None:
        with self.lock:
            try:
                return self.broker.partition_count(topic)
            except KafkaClientError as exc:
                if exc.code != "UNKNOWN_TOPIC_OR_PART":
                    raise
                return None

    def ensure_topics(self, specs: Sequence[TopicSpec], timeout_s: float) -> dict[str, ProvisionOutcome]:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError("topics", names, "a topic is listed twice")
        with self.lock:
            existing = {s.name: n for s in specs if (n := self.partition_count(s.name, timeout_s)) is not None}
            for spec in specs:
                if spec.name in existing and existing[spec.name] != spec.partitions:
                    raise TopicMismatchError(spec.name, spec.partitions, existing[spec.name])
            for spec in specs:
                self.broker.create_topic(spec.name, spec.partitions)
                if spec.name not in existing and "cleanup.policy" in spec.config:
                    self._cleanup_policy[spec.name] = spec.config["cleanup.policy"]
        return {n: ProvisionOutcome.EXISTS if n in existing else ProvisionOutcome.CREATED for n in names}

    def topic_durability(self, topics: Sequence[str], timeout_s: float) -> dict[str, TopicDurability]:
        # one copy of everything, in this process's memory
        with self.lock:
            return {
                t: TopicDurability(
                    replication_factor=1, min_insync_replicas=1, cleanup_policy=self._cleanup_policy.get(t)
                )
                for t in topics
                if self.partition_count(t, timeout_s) is not None
            }


class _MemoryFeed:
    """`ClientFactory.key_state_feed` on the memory broker: each poll returns the committed records written to
    its partitions since the last one."""

    def __init__(self, factory: MemoryClientFactory) -> None:
        self._factory = factory
        self._positions: dict[TopicPartition, int] = {}

    def add(self, topic: str, starts: Mapping[int, int]) -> None:
        for partition, offset in starts.items():
            self._positions[(topic, partition)] = max(0, offset)

    def remove(self, topic: str, partitions: Sequence[int]) -> None:
        for partition in partitions:
            self._positions.pop((topic, partition), None)

    def poll(self) -> list[Message]:
        read: list[Message] = []
        with self._factory.lock:
            for topic in {tp[0] for tp in self._positions}:
                for msg in self._factory.broker.records(topic):
                    position = self._positions.get(msg.tp)
                    if position is not None and msg.offset >= position:
                        read.append(msg)
                        self._positions[msg.tp] = msg.offset + 1
        return read

    def close(self) -> None:
        self._positions.clear()


class _LockedConsumer:
    """A `MemoryConsumer` whose calls take the factory's lock, and whose empty consume waits for a write."""

    def __init__(self, consumer: MemoryConsumer, written: threading.Condition) -> None:
        self._consumer = consumer
        self._written = written
        self.max_poll_interval_ms = consumer.max_poll_interval_ms
        self.session_timeout_ms = consumer.session_timeout_ms  # read by runtime/records/ownership.py

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        with self._written:
            self._consumer.subscribe(
                topics,
                on_assign=self._unlocked(on_assign),
                on_revoke=self._unlocked(on_revoke),
                on_lost=self._unlocked(on_lost),
            )

    def _unlocked(self, callback: PartitionsCallback) -> PartitionsCallback:
        """`callback` run without the factory's lock, which the consume or close that calls it holds: as with
        librdkafka, another thread (a bounded synchronous commit in `on_revoke`) may use the client meanwhile."""

        def run(tps: list[TopicPartition]) -> None:
            self._written.release()
            try:
                callback(tps)
            finally:
                self._written.acquire()

        return run

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        with self._written:
            batch = self._consumer.consume(max_records, 0.0)
            if not batch and timeout_s > 0:
                self._written.wait(min(timeout_s, _MEMORY_WAIT_S))
                batch = self._consumer.consume(max_records, 0.0)
            return batch

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        with self._written:
            self._consumer.pause(tps)

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        with self._written:
            self._consumer.resume(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with self._written:
            self._consumer.seek(tp, offset)

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        with self._written:
            self._consumer.commit(offsets, asynchronous=asynchronous)

    def positions(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with self._written:
            return self._consumer.positions(tps)

    def failed_commits(self) -> dict[TopicPartition, int]:
        with self._written:
            return self._consumer.failed_commits()

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]:
        with self._written:
            return self._consumer.committed_metadata(tps, timeout_s)

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None:
        with self._written:
            self._consumer.mark_commits(marks)

    def group_metadata(self) -> object:
        with self._written:
            return self._consumer.group_metadata()

    def close(self) -> None:
        with self._written:
            self._consumer.close()


class _LockedShareConsumer:
    """A `MemoryShareConsumer` whose calls take the factory's lock, and whose empty poll waits for a write (in
    real time, at most 0.1 s) before it lets the broker's clock pass the timeout (locks expire on that clock)."""

    def __init__(self, consumer: MemoryShareConsumer, written: threading.Condition) -> None:
        self._consumer = consumer
        self._written = written
        self.supports_renew = consumer.supports_renew

    def subscribe(self, topics: Sequence[str], *, on_acknowledged: AcknowledgedCallback | None = None) -> None:
        with self._written:
            self._consumer.subscribe(topics, on_acknowledged=on_acknowledged)

    def poll(self, timeout_s: float) -> list[Message]:
        with self._written:
            batch = self._consumer.poll(0.0)
            if not batch and timeout_s > 0:
                self._written.wait(min(timeout_s, _MEMORY_WAIT_S))
                batch = self._consumer.poll(timeout_s)
            return batch

    def acknowledge(self, message: Message, ack: AckType) -> None:
        with self._written:
            self._consumer.acknowledge(message, ack)

    def commit(self, *, asynchronous: bool, timeout_s: float = 30.0) -> dict[TopicPartition, KafkaClientError | None]:
        with self._written:
            return self._consumer.commit(asynchronous=asynchronous, timeout_s=timeout_s)

    def close(self) -> None:
        with self._written:
            self._consumer.close()


class _LockedProducer:
    """A `MemoryProducer` whose calls take the factory's lock; a call that may write wakes waiting consumers."""

    def __init__(self, producer: MemoryProducer, written: threading.Condition) -> None:
        self._producer = producer
        self._written = written

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: DeliveryCallback,
    ) -> None:
        with self._written:
            self._producer.produce(
                topic, key=key, value=value, headers=headers, partition=partition, on_delivery=on_delivery
            )

    def poll(self, timeout_s: float) -> None:
        with self._written:
            try:
                self._producer.poll(timeout_s)
            finally:
                self._written.notify_all()

    def flush(self, timeout_s: float) -> int:
        with self._written:
            try:
                return self._producer.flush(timeout_s)
            finally:
                self._written.notify_all()

    def partition_count(self, topic: str) -> int:
        with self._written:
            return self._producer.partition_count(topic)

    def purge(self) -> None:
        with self._written:
            self._producer.purge()

    def init_transactions(self, timeout_s: float) -> None:
        with self._written:
            self._producer.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        with self._written:
            self._producer.begin_transaction()

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout_s: float
    ) -> None:
        with self._written:
            self._producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        with self._written:
            try:
                self._producer.commit_transaction(timeout_s)
            finally:
                self._written.notify_all()

    def abort_transaction(self, timeout_s: float) -> None:
        with self._written:
            try:
                self._producer.abort_transaction(timeout_s)
            finally:
                self._written.notify_all()


class _MemoryEndOffsets:
    """End offsets of the memory broker, answered at once."""

    def __init__(self, factory: MemoryClientFactory) -> None:
        self._factory = factory

    def request(self, tps: Sequence[TopicPartition]) -> _Answered:
        with self._factory.lock:
            ends = {topic: self._factory.broker.end_offsets(topic) for topic in {topic for topic, _ in tps}}
        return _Answered({(topic, partition): ends[topic][partition] for topic, partition in tps})


class _Answered:
    def __init__(self, offsets: dict[TopicPartition, int]) -> None:
        self._offsets = offsets

    def done(self) -> bool:
        return True

    def result(self) -> dict[TopicPartition, int]:
        return dict(self._offsets)
