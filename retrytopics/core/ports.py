"""The I/O seams the runtime drives: a consumer and a producer, as small Protocols over plain values.

Pure: standard library only. `retrytopics.connectors.clients` implements them over confluent-kafka; the runtime
never sees a confluent-kafka type, so no client exception or object leaks into `retrytopics/`. Partitions are
`(topic, partition)` tuples and offsets plain ints (Kafka's *next offset to read* when committing).

A batch handler's records can come from the consumer already built as the handler's `Record`s
(`consume_runs`): on a plain source run that is one object per consumed record, not a `Message` and then a
`Record` made from it.

Two consumer models: `ConsumerPort` is a consumer-group member (partitions assigned to it, offsets committed);
`ShareConsumerPort` is a share-group member (KIP-932: any number of members read one partition, each record is
acquired under a time lock and acknowledged one by one; `retrytopics.connectors.share` implements it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import RETRY_PREFIX, Header
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.record import Record

__all__ = [
    "AckType",
    "AcknowledgedCallback",
    "ConsumerPort",
    "DeliveryCallback",
    "EndOffsetsPort",
    "Message",
    "PartitionsCallback",
    "PendingEndOffsets",
    "Polled",
    "ProducerPort",
    "RunsConsumerPort",
    "ShareConsumerPort",
    "TopicPartition",
    "consume_runs",
    "message_of",
    "split_runs",
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

    def positions(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The consumer's position (the next offset it would fetch) of each of `tps` it knows one of; past the
        markers and aborted records a read_committed fetch skipped. Local: no request to the broker."""

    def failed_commits(self) -> dict[TopicPartition, int]:
        """The offsets of asynchronous commits that failed since the last call (the client reports them
        later, served in `consume`), for the caller to commit again."""

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]:
        """The metadata of the group's committed offset of each of `tps` that has one ("" when it carries
        none); a partition with no committed offset is left out."""

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None:
        """The metadata every later commit of these partitions carries (core/commit_marks.py)."""

    def group_metadata(self) -> object: ...

    def close(self) -> None: ...


class Polled(NamedTuple):
    """One poll, as `consume_runs` hands it over. `runs`: the records of the topics asked for, already the
    handler's `Record`s of a plain source run (raw bytes as the value, no retry state, the coordinates as the
    origin id, user headers), one list per partition in offset order; `messages`: every other record. When a
    record of those topics cannot be such a Record (a header key that is not UTF-8, a `retry.*` header), the
    whole poll is `messages`."""

    messages: list[Message]
    runs: list[list[Record[Any]]]


class RunsConsumerPort(ConsumerPort, Protocol):
    """A `ConsumerPort` that builds the Records of `consume_runs` straight from its client's records."""

    def consume_runs(self, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
        """As `consume`, the records of `topics` built as `Polled.runs` says."""
        ...


def consume_runs(consumer: ConsumerPort, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
    """`consumer.consume_runs` where the consumer has it; else its `consume`, split by `split_runs`."""
    if not topics:
        return Polled(consumer.consume(max_records, timeout_s), [])
    built: Callable[[int, float, frozenset[str]], Polled] | None = getattr(consumer, "consume_runs", None)
    if built is not None:
        return built(max_records, timeout_s, topics)
    return split_runs(consumer.consume(max_records, timeout_s), topics)


_new = tuple.__new__


def split_runs(batch: list[Message], topics: frozenset[str]) -> Polled:
    """`batch` as `Polled`: the records of `topics` as Records, one run per partition (`Polled` says when
    none are). Every `RunsConsumerPort` returns what this makes of its `consume`."""
    messages: list[Message] = []
    runs: dict[TopicPartition, list[Record[Any]]] = {}
    run: list[Record[Any]] = []
    add, topic, partition, wanted, prefix = run.append, "", -1, False, ""
    for m in batch:
        if m.partition != partition or m.topic != topic:  # a poll comes in runs per partition
            topic, partition = m.topic, m.partition
            wanted = topic in topics
            if wanted:
                add = runs.setdefault((topic, partition), []).append
                prefix = f"{topic}-{partition}-"
        if not wanted:
            messages.append(m)
        elif m.header_error is not None or (m.headers and any(k.startswith(RETRY_PREFIX) for k, _ in m.headers)):
            return Polled(batch, [])
        else:
            offset, value = m.offset, m.value
            # positional, through tuple.__new__: once per record (the NamedTuple's own __new__ is a Python call)
            add(
                _new(
                    Record,
                    (
                        topic,
                        partition,
                        offset,
                        m.timestamp_ms,
                        m.key,
                        value,
                        value,
                        m.headers,
                        None,
                        prefix + str(offset),
                    ),
                )
            )
    return Polled(messages, list(runs.values()))


def message_of(record: Record[Any]) -> Message:
    """The `Message` a record of `Polled.runs` was consumed as (nothing is lost: such a record has no retry
    headers and no header error)."""
    return Message(
        record.topic, record.partition, record.offset, record.timestamp_ms, record.key, record.raw_value, record.headers
    )


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


class PendingEndOffsets(Protocol):
    """One end-offsets request on its way (`EndOffsetsPort.request`)."""

    def done(self) -> bool:
        """Whether the answer came (never waits)."""
        ...

    def result(self) -> dict[TopicPartition, int]:
        """The end offset of each partition asked (once `done`): the last stable offset, as a read_committed
        consumer sees it. A failed request is a `KafkaClientError`."""
        ...


class EndOffsetsPort(Protocol):
    """Asks partitions' end offsets without waiting for the answer (one batched ListOffsets request)."""

    def request(self, tps: Sequence[TopicPartition]) -> PendingEndOffsets: ...


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
