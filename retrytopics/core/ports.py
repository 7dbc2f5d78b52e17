"""The I/O seams the runtime drives: a consumer and a producer, as small Protocols over plain values.

Pure: standard library only. `retrytopics.connectors.clients` implements them over confluent-kafka; the runtime
never sees a confluent-kafka type, so no client exception or object leaks into `retrytopics/`. Partitions are
`(topic, partition)` tuples and offsets plain ints (Kafka's *next offset to read* when committing).

Two consumer models: `ConsumerPort` is a consumer-group member (partitions assigned to it, offsets committed);
`ShareConsumerPort` is a share-group member (KIP-932: any number of members read one partition, each record is
acquired under a time lock and acknowledged one by one; `retrytopics.connectors.share` implements it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import Header
from retrytopics.core.offsets import TopicPartition

__all__ = [
    "AckType",
    "AcknowledgedCallback",
    "ConsumerPort",
    "DeliveryCallback",
    "Message",
    "PartitionsCallback",
    "ProducerPort",
    "ShareConsumerPort",
    "TopicPartition",
]

#: Called with the partitions of a rebalance event, inside `ConsumerPort.consume`.
PartitionsCallback = Callable[[list[TopicPartition]], None]
#: Called from `ProducerPort.poll`/`flush` with None on acknowledgement, or the error.
DeliveryCallback = Callable[[PublishError | None], None]
#: Called when the broker answered an acknowledgement commit: the offsets it covered, per partition, and None,
#: or the error (those records stay acquired until their lock expires, then come back).
AcknowledgedCallback = Callable[[Mapping[TopicPartition, frozenset[int]], KafkaClientError | None], None]


class Message(NamedTuple):
    """A consumed record, exactly as it arrived. A NamedTuple, not a dataclass: one is built for every
    record consumed, and this is the cheapest immutable record Python has."""

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
    #: How many times a share group has delivered this record, this delivery included (1 the first time); None
    #: outside share groups.
    delivery_count: int | None = None

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


class AckType(enum.Enum):
    """How a share consumer acknowledges a record it acquired (KIP-932, RENEW from KIP-1222)."""

    ACCEPT = "accept"  # handled: never delivered again
    RELEASE = "release"  # back to the group at once, delivery count kept: redelivered (no delay)
    REJECT = "reject"  # archived: never delivered again (the broker's own DLQ, if configured, gets a copy)
    RENEW = "renew"  # keep it acquired: its lock restarts (only where `supports_renew`)


class ShareConsumerPort(Protocol):
    """A share-group member with explicit acknowledgement.

    `poll` acquires a batch: each record is locked to this member until it is acknowledged or its lock expires
    (the group's `share.record.lock.duration.ms`), then it is available again with its delivery count + 1; past
    the group's `share.delivery.count.limit` the broker archives it instead. Every record of a batch must be
    acknowledged (`acknowledge`) before the next `poll`; acknowledgements reach the broker on `commit` (or
    with the next poll). Closing releases what is still held.
    """

    @property
    def supports_renew(self) -> bool:
        """Whether `acknowledge(..., AckType.RENEW)` is available (the client sends KIP-1222's RENEW)."""
        ...

    def subscribe(self, topics: Sequence[str], *, on_acknowledged: AcknowledgedCallback | None = None) -> None: ...

    def poll(self, timeout_s: float) -> list[Message]:
        """The next acquired batch (each with its `delivery_count`), or [] after `timeout_s`."""
        ...

    def acknowledge(self, message: Message, ack: AckType) -> None:
        """Record how `message` ends; sent with the next commit or poll. RENEW raises where not supported."""
        ...

    def commit(self, *, asynchronous: bool, timeout_s: float = 30.0) -> dict[TopicPartition, KafkaClientError | None]:
        """Send the pending acknowledgements. Synchronously: the broker's answer per partition (an error
        means those records were not acknowledged and come back after their lock). Asynchronously: {} at
        once, the answer to `on_acknowledged`."""
        ...

    def close(self) -> None: ...
