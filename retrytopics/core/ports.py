"""The I/O seams the runtime drives: a consumer and a producer, as small Protocols over plain values.

Pure: standard library only. `retrytopics.connectors.clients` implements them over confluent-kafka; the runtime
never sees a confluent-kafka type, so no client exception or object leaks into `retrytopics/`. Partitions are
`(topic, partition)` tuples and offsets plain ints (Kafka's *next offset to read* when committing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from retrytopics.core.errors import PublishError
from retrytopics.core.headers import Header
from retrytopics.core.offsets import TopicPartition

__all__ = ["ConsumerPort", "DeliveryCallback", "Message", "PartitionsCallback", "ProducerPort", "TopicPartition"]

#: Called with the partitions of a rebalance event, inside `ConsumerPort.consume`.
PartitionsCallback = Callable[[list[TopicPartition]], None]
#: Called from `ProducerPort.poll`/`flush` with None on acknowledgement, or the error.
DeliveryCallback = Callable[[PublishError | None], None]


class Message(NamedTuple):
    """A consumed record, exactly as it arrived. A NamedTuple, not a dataclass: one is built for every
    record consumed, and this is the cheapest immutable record Python has (0.3 µs against 1.1 µs)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # -1 when the broker gave none
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    #: Set when a header key was not UTF-8 (its key in `headers` has U+FFFD for the invalid bytes): the
    #: runtime dead-letters the record as `poison` instead of handling it.
    header_error: ValueError | None = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


class ConsumerPort(Protocol):
    """A group member with manual commits."""

    @property
    def max_poll_interval_ms(self) -> int: ...

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None: ...

    def consume(self, max_records: int, timeout_s: float) -> list[Message]: ...

    def pause(self, tps: Sequence[TopicPartition]) -> None: ...

    def resume(self, tps: Sequence[TopicPartition]) -> None: ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None: ...

    def group_metadata(self) -> object: ...

    def close(self) -> None: ...


class ProducerPort(Protocol):
    """An idempotent producer, optionally transactional."""

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: DeliveryCallback,
    ) -> None: ...

    def poll(self, timeout_s: float) -> None: ...

    def flush(self, timeout_s: float) -> int: ...

    def partition_count(self, topic: str) -> int: ...

    def purge(self) -> None: ...

    def init_transactions(self, timeout_s: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout_s: float
    ) -> None: ...

    def commit_transaction(self, timeout_s: float) -> None: ...

    def abort_transaction(self, timeout_s: float) -> None: ...
