"""An in-memory broker behind the runtime's ports (`retrytopics.core.ports`), for fast, deterministic unit tests of
the runtime's own logic and of apps that drive the ports.

What it is: topics with partitions and offsets; records with key, value, headers and a timestamp; consumer
groups with subscribe and an eager rebalance (every member revokes before anyone is assigned, as librdkafka's
classic protocol does; an expelled member is told `on_lost`); `consume` honouring pause, resume and seek;
committed offsets per group; producers whose delivery reports are served by `poll`/`flush`; transactions
whose records and offsets reach read_committed readers only on commit (a commit or abort marker takes an
offset, as on Kafka); share groups (KIP-932: any number of members on a partition, records acquired under a
lock on the fake clock, a delivery count, ACCEPT/RELEASE/REJECT/RENEW, archiving at the delivery limit); a fake
clock; a topic's `max.message.bytes` (`max_message_bytes`); and failures a test injects (refused produces,
expulsion, rebalances, freezes, stale copies fetched before a seek, a share member killed).

What it is not: a Kafka emulator. No threads, network, retention, replicas or timing of its own: `consume`
with nothing to deliver advances the clock by its timeout and returns at once. What Kafka does is tested on
Apache Kafka; `tests/integration/runtime/test_memory_broker_contract.py` checks that this broker and Apache
Kafka agree on what the runtime relies on.

::

    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    producer = broker.producer()
    producer.produce("orders", key=b"k", value=b"v", headers=[], partition=None, on_delivery=print)
    producer.flush(0)                                   # prints None: acknowledged
    consumer = broker.consumer("billing")
    consumer.subscribe(["orders"], on_assign=print, on_revoke=print, on_lost=print)
    [msg] = consumer.consume(10, 1.0)                   # on_assign first, then the record
    consumer.commit({msg.tp: msg.offset + 1}, asynchronous=False)
    assert broker.committed("billing") == {("orders", msg.partition): 1}

The runtime reads time through the `Clock` it is given (runtime/clock.py); a loop given `broker.clock`
(a `MemoryClock`) sees a consume that waits move its time too.

This module is past the 300-line budget on purpose: it is one fake of one broker, and its classes (each under
250 lines) share private state the way a broker's parts do; split, they would need a private API of their own.
"""

from __future__ import annotations

import enum
import itertools
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import Header
from retrytopics.core.ports import (
    AcknowledgedCallback,
    AckType,
    DeliveryCallback,
    Message,
    PartitionsCallback,
    TopicPartition,
)

__all__ = [
    "GroupMetadata",
    "MemoryBroker",
    "MemoryClock",
    "MemoryConsumer",
    "MemoryProducer",
    "MemoryShareConsumer",
    "ShareRecordState",
]

#: librdkafka's defaults for the settings the runtime reads back from a consumer
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000
DEFAULT_SESSION_TIMEOUT_MS = 45_000

#: a topic without `max_message_bytes`
_NO_LIMIT = 2**63


class MemoryClock:
    """Wall and monotonic time that move only when told to (`advance`), or when a consume waits."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now_s = start_s

    def time(self) -> float:
        return self._now_s

    def monotonic(self) -> float:
        return self._now_s

    def now_ms(self) -> int:
        return int(self._now_s * 1000)

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now_s += seconds


class _TxnState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(eq=False)
class _Transaction:
    """One transaction of a producer: its records' fate, and the offsets it commits for a group."""

    state: _TxnState = _TxnState.OPEN
    partitions: set[TopicPartition] = field(default_factory=set)
    offsets: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    error: PublishError | None = None


class _Pending(NamedTuple):
    """A produced record on its way: written and reported by a poll once `polls_left` is 0 (or by a flush)."""

    tp: TopicPartition
    message: Message
    on_delivery: DeliveryCallback
    error: PublishError | None
    polls_left: int


class _Entry(NamedTuple):
    """One offset of a partition's log: a record, or a transaction marker (`message` None)."""

    message: Message | None
    txn: _Transaction | None


@dataclass(frozen=True)
class GroupMetadata:
    """What `MemoryConsumer.group_metadata()` returns: the member a transaction commits offsets for."""

    group_id: str
    member_id: str
    generation: int


@dataclass(frozen=True)
class _ProduceFailure:
    code: str
    retriable: bool
    fatal: bool
    at_once: bool
    topic: str | None


class MemoryBroker:
    """Topics, logs, consumer groups and transactional ids, all in memory (see the module docstring)."""

    def __init__(self, *, clock: MemoryClock | None = None) -> None:
        self.clock = clock or MemoryClock()
        self._logs: dict[str, list[list[_Entry]]] = {}
        self._groups: dict[str, _Group] = {}
        self._share_groups: dict[str, _ShareGroup] = {}
        self._failures: list[_ProduceFailure] = []
        self._transactional: dict[str, MemoryProducer] = {}
        self._round_robin = itertools.count()
        #: polls a produced record waits before it is written and acknowledged (a flush waits for all): a slow
        #: broker, for tests of what must wait for an acknowledgement
        self.ack_after_polls = 0
        #: ("delivered", topic, partition, offset) and ("committed", group, topic, partition, offset), in order:
        #: tests assert what happened before what (a commit after the ack of its hand-off, say)
        self.journal: list[tuple[object, ...]] = []
        #: a topic's `max.message.bytes`: a record larger than this (key, value, header keys and values) is
        #: refused with MSG_SIZE_TOO_LARGE in its delivery report, every time it is produced, as a broker does
        self.max_message_bytes: dict[str, int] = {}

    # -- topics and records ------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> str:
        """Create `name` (an existing topic is left as it is) and return it."""
        if partitions < 1:
            raise ValueError(f"partitions={partitions}: a topic has at least one partition")
        self._logs.setdefault(name, [[] for _ in range(partitions)])
        return name

    def create_topics(self, names: Iterable[str], partitions: int = 1) -> None:
        for name in names:
            self.create_topic(name, partitions)

    def partition_count(self, topic: str) -> int:
        return len(self._partitions_of(topic))

    def append(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Message:
        """Write one record at once (no producer, no delivery report): the setup of a test."""
        tp = (topic, self._choose_partition(topic, key, partition))
        ts = self.clock.now_ms() if timestamp_ms is None else timestamp_ms
        return self._write(tp, key, value, headers, ts, None)

    def records(self, topic: str, *, read_committed: bool = True) -> list[Message]:
        """Every record of `topic` a reader with that isolation sees, by partition then offset."""
        out: list[Message] = []
        for log in self._partitions_of(topic):
            out += _readable(log, 0, len(log) + 1, read_committed)[0]
        return out

    def stable_records(self, topic: str, ends: Mapping[int, int]) -> list[Message] | None:
        """Every record of `topic` a read_committed reader sees from the start of each partition in `ends` to
        at least that end, by partition then offset; None while a transaction open below an end holds a
        reader there (its last stable offset)."""
        out: list[Message] = []
        logs = self._partitions_of(topic)
        for partition, end in sorted(ends.items()):
            log = logs[partition]
            records, position = _readable(log, 0, len(log) + 1, True)
            if position < end:
                return None
            out += records
        return out

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: len(log) for p, log in enumerate(self._partitions_of(topic))}

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (the next offset to read, per partition)."""
        return dict(self._group(group_id).committed)

    def reset_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Set the group's committed offsets as an operator's tool does (`kafka-consumer-groups --reset-offsets`,
        with no metadata); the group should have no members, as the tool requires."""
        self._group(group_id).store(offsets)

    # -- clients -----------------------------------------------------------------------------------------

    def consumer(
        self,
        group_id: str,
        *,
        read_committed: bool = True,
        auto_offset_reset: str = "earliest",
        max_poll_interval_ms: int = DEFAULT_MAX_POLL_INTERVAL_MS,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
    ) -> MemoryConsumer:
        return MemoryConsumer(
            self,
            self._group(group_id),
            read_committed=read_committed,
            auto_offset_reset=auto_offset_reset,
            max_poll_interval_ms=max_poll_interval_ms,
            session_timeout_ms=session_timeout_ms,
        )

    def producer(self, *, transactional_id: str | None = None) -> MemoryProducer:
        return MemoryProducer(self, transactional_id=transactional_id)

    def share_consumer(
        self, group_id: str, *, max_records: int = 500, supports_renew: bool = True
    ) -> MemoryShareConsumer:
        """A share-group member (`ShareConsumerPort`); `supports_renew=False` acts as confluent-kafka 2.16."""
        group = self._share_group(group_id)
        return MemoryShareConsumer(group, max_records=max_records, supports_renew=supports_renew)

    def configure_share_group(
        self,
        group_id: str,
        *,
        auto_offset_reset: str | None = None,
        record_lock_duration_ms: int | None = None,
        delivery_count_limit: int | None = None,
    ) -> None:
        """Set a share group's configs (Kafka's defaults until then: latest, 30 s, 5)."""
        group = self._share_group(group_id)
        if auto_offset_reset is not None:
            group.auto_offset_reset = auto_offset_reset
        if record_lock_duration_ms is not None:
            group.lock_ms = record_lock_duration_ms
        if delivery_count_limit is not None:
            group.delivery_limit = delivery_count_limit

    def share_group_config(self, group_id: str) -> dict[str, str]:
        """A share group's configs by Kafka's names, as `connectors.admin.share_group_config` reads them."""
        group = self._share_group(group_id)
        return {
            "share.auto.offset.reset": group.auto_offset_reset,
            "share.record.lock.duration.ms": str(group.lock_ms),
            "share.delivery.count.limit": str(group.delivery_limit),
        }

    def share_state(self, group_id: str, topic: str) -> dict[tuple[int, int], tuple[ShareRecordState, int]]:
        """Each record a share group delivered: (partition, offset) -> its state and delivery count."""
        group = self._share_group(group_id)
        group.expire_locks()
        return {
            (tp[1], offset): (held.state, held.delivery_count)
            for tp, part in group.partitions.items()
            if tp[0] == topic
            for offset, held in part.records.items()
        }

    # -- injected failures -------------------------------------------------------------------------------

    def fail_produces(
        self,
        count: int,
        code: str,
        *,
        retriable: bool = False,
        fatal: bool = False,
        at_once: bool = False,
        topic: str | None = None,
    ) -> None:
        """Refuse the next `count` produces (to `topic`, or any) with error `code`: in their delivery report,
        or raised by `produce()` itself when `at_once` (librdkafka's local checks, e.g. MSG_SIZE_TOO_LARGE)."""
        self._failures += [_ProduceFailure(code, retriable, fatal, at_once, topic)] * count

    def _take_failure(self, topic: str) -> _ProduceFailure | None:
        for i, failure in enumerate(self._failures):
            if failure.topic in (None, topic):
                return self._failures.pop(i)
        return None

    # -- internals shared with the clients ---------------------------------------------------------------

    def _partitions_of(self, topic: str) -> list[list[_Entry]]:
        logs = self._logs.get(topic)
        if logs is None:
            raise KafkaClientError(f"topic {topic!r} does not exist", code="UNKNOWN_TOPIC_OR_PART")
        return logs

    def _log(self, tp: TopicPartition) -> list[_Entry]:
        logs = self._partitions_of(tp[0])
        if not 0 <= tp[1] < len(logs):
            raise KafkaClientError(f"{tp[0]}[{tp[1]}] does not exist", code="_UNKNOWN_PARTITION")
        return logs[tp[1]]

    def _group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group(self, group_id)
        return group

    def _share_group(self, group_id: str) -> _ShareGroup:
        group = self._share_groups.get(group_id)
        if group is None:
            group = self._share_groups[group_id] = _ShareGroup(self, group_id)
        return group

    def _choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        count = self.partition_count(topic)
        if partition is not None:
            self._log((topic, partition))  # raises for a partition that does not exist
            return partition
        if key is None:
            return next(self._round_robin) % count
        return zlib.crc32(key) % count  # librdkafka's `consistent` partitioner

    def _write(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        timestamp_ms: int,
        txn: _Transaction | None,
    ) -> Message:
        log = self._log(tp)
        msg = Message(tp[0], tp[1], len(log), timestamp_ms, key, value, tuple(headers))
        log.append(_Entry(msg, txn))
        if txn is not None:
            txn.partitions.add(tp)
        self.journal.append(("delivered", tp[0], tp[1], msg.offset))
        return msg

    def _end(self, txn: _Transaction, state: _TxnState) -> None:
        """Commit or abort `txn`: a marker on each of its partitions, then (on commit) its offsets."""
        txn.state = state
        for tp in sorted(txn.partitions):
            self._log(tp).append(_Entry(None, txn))
        if state is _TxnState.COMMITTED:
            for group_id, offsets in txn.offsets.items():
                self._group(group_id).store(offsets)

    def _claim(self, transactional_id: str, producer: MemoryProducer) -> None:
        """`producer` takes over `transactional_id`: the previous one is fenced, its open transaction aborted."""
        previous = self._transactional.get(transactional_id)
        if previous is not None and previous is not producer:
            previous._fence()
        self._transactional[transactional_id] = producer


def _size(key: bytes | None, value: bytes | None, headers: Sequence[Header]) -> int:
    """A record's size as a topic's size limit counts it here: its key, value, header keys and values."""
    return len(key or b"") + len(value or b"") + sum(len(k.encode()) + len(v or b"") for k, v in headers)


def _readable(log: list[_Entry], start: int, limit: int, read_committed: bool) -> tuple[list[Message], int]:
    """Up to `limit` records of `log` from offset `start`, and the position after them. read_committed stops
    at an open transaction (the last stable offset) and skips aborted records; markers are never returned, and the
    position is past the markers and skipped records that follow the last one returned."""
    out: list[Message] = []
    position = start
    while position < len(log):
        msg, txn = log[position]
        if txn is not None and read_committed:
            if txn.state is _TxnState.OPEN:
                break
            if txn.state is _TxnState.ABORTED:
                msg = None
        if msg is not None:
            if len(out) >= limit:
                break
            out.append(msg)
        position += 1  # past what it skips, too, as a Kafka fetch moves the position past markers it read
    return out, position


class _Group:
    """A consumer group: committed offsets, members, and the eager rebalance's barrier (every member with
    partitions revokes them before the next assignment is handed out)."""

    def __init__(self, broker: MemoryBroker, group_id: str) -> None:
        self._broker = broker
        self.group_id = group_id
        self.committed: dict[TopicPartition, int] = {}
        self.metadata: dict[TopicPartition, str] = {}  # of each committed offset ("" when none was given)
        self.members: dict[str, MemoryConsumer] = {}  # in join order
        self.generation = 0
        self.to_revoke: set[str] = set()
        self._plan: dict[str, list[TopicPartition]] | None = None
        self._ids = itertools.count(1)

    def join(self, consumer: MemoryConsumer) -> str:
        member_id = f"{self.group_id}-member-{next(self._ids)}"
        self.members[member_id] = consumer
        self.rebalance()
        return member_id

    def leave(self, member_id: str) -> None:
        if self.members.pop(member_id, None) is not None:
            self.to_revoke.discard(member_id)
            self.rebalance()

    def rebalance(self) -> None:
        self.generation += 1
        self._plan = None
        self.to_revoke = {m for m, c in self.members.items() if c.assignment}

    def is_member(self, member_id: str) -> bool:
        return member_id in self.members

    def stable(self) -> bool:
        return not self.to_revoke

    def assignment_for(self, member_id: str) -> list[TopicPartition]:
        if self._plan is None:
            self._plan = self._range_plan()
        return list(self._plan.get(member_id, []))

    def _range_plan(self) -> dict[str, list[TopicPartition]]:
        """Kafka's range assignor: per topic, contiguous partition ranges to its subscribers in join order."""
        plan: dict[str, list[TopicPartition]] = {m: [] for m in self.members}
        topics = sorted({t for c in self.members.values() for t in c.subscription})
        for topic in topics:
            subscribers = [m for m, c in self.members.items() if topic in c.subscription]
            count = self._broker.partition_count(topic)
            for i, member in enumerate(subscribers):
                lo, hi = i * count // len(subscribers), (i + 1) * count // len(subscribers)
                plan[member] += [(topic, p) for p in range(lo, hi)]
        return plan

    def store(self, offsets: Mapping[TopicPartition, int], marks: Mapping[TopicPartition, str] | None = None) -> None:
        for tp, offset in offsets.items():
            self.committed[tp] = offset
            self.metadata[tp] = (marks or {}).get(tp, "")
            self._broker.journal.append(("committed", self.group_id, tp[0], tp[1], offset))


class MemoryConsumer:
    """`ConsumerPort` over a `MemoryBroker` group member. Rebalance callbacks run inside `consume`, in
    librdkafka's order: `on_lost` (expelled), `on_revoke` (before any new assignment), then `on_assign`."""

    def __init__(
        self,
        broker: MemoryBroker,
        group: _Group,
        *,
        read_committed: bool,
        auto_offset_reset: str,
        max_poll_interval_ms: int,
        session_timeout_ms: int,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset={auto_offset_reset!r}: expected 'earliest' or 'latest'")
        self._broker = broker
        self._group = group
        self._read_committed = read_committed
        self._reset_to_end = auto_offset_reset == "latest"
        self.max_poll_interval_ms = max_poll_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.subscription: tuple[str, ...] = ()
        self.assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._member_id: str | None = None
        self._generation = 0  # of the current assignment
        self._expelled = False  # commits are refused; `on_lost` comes at the next consume
        self._freeze_s = 0.0
        self._closed = False
        self._rotation = 0
        self._callbacks: tuple[PartitionsCallback, PartitionsCallback, PartitionsCallback] | None = None
        self._marks: dict[TopicPartition, str] = {}  # the metadata of this member's commits
        self._stale: list[Message] = []
        #: asynchronous commits the group refused (an expelled member's): librdkafka only logs them
        self.refused_commits: list[dict[TopicPartition, int]] = []
        self._failed_commits: dict[TopicPartition, int] = {}  # reported by `failed_commits`
        self._failing_commits = 0

    # -- injected failures -------------------------------------------------------------------------------

    def fail_asynchronous_commits(self, count: int) -> None:
        """The next `count` asynchronous commits fail (not stored; reported by `failed_commits`, as
        librdkafka's commit callback reports them), as a coordinator that moved or is unavailable refuses them."""
        self._failing_commits = count

    def trigger_rebalance(self) -> None:
        """Make the whole group rebalance: each member revokes at its next consume, then all are assigned."""
        self._group.rebalance()

    def expel(self) -> None:
        """The group drops this member (its session lapsed): commits are refused with UNKNOWN_MEMBER_ID at
        once, `on_lost` comes at the next consume, and the member then joins again."""
        if self._member_id is not None and not self._expelled:
            self._expelled = True
            self._group.leave(self._member_id)

    def freeze(self, seconds: float) -> None:
        """The next consume returns nothing, `seconds` later on the clock (SIGSTOP, a VM pause); longer than
        the session, and the member is expelled (`on_lost` at the consume after)."""
        self._freeze_s = seconds

    def deliver_stale(self, msgs: Sequence[Message]) -> None:
        """The next consume returns `msgs` first, whatever the positions say: copies librdkafka fetched before
        a seek and hands out after it, which the consumer of this port must recognise and drop."""
        self._stale = list(msgs)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def position(self, tp: TopicPartition) -> int | None:
        return self._positions.get(tp)

    def positions(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._positions[tp] for tp in tps if tp in self._positions}

    # -- ConsumerPort ------------------------------------------------------------------------------------

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        self._check_open()
        for topic in topics:
            self._broker.partition_count(topic)  # raises for a topic that does not exist
        self.subscription = tuple(topics)
        self._callbacks = (on_assign, on_revoke, on_lost)
        if self._member_id is None:
            self._member_id = self._group.join(self)
        else:
            self._group.rebalance()

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        self._check_open()
        if self._freeze_s:
            self._wake_from_freeze()
            return []
        self._serve_group()
        stale, self._stale = self._stale[:max_records], self._stale[max_records:]
        batch = stale + self._fetch(max_records - len(stale))
        if not batch:
            self._broker.clock.advance(timeout_s)  # the wait a real consume would have spent
        return batch

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        self._paused.update(tp for tp in tps if tp in self._positions)

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        self._paused.difference_update(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._positions:
            raise KafkaClientError(f"seek: {tp[0]}[{tp[1]}] is not assigned", code="_UNKNOWN_PARTITION")
        self._positions[tp] = offset

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        if not offsets:
            return
        self._check_open()
        if self._expelled or self._member_id is None:
            if asynchronous:
                self.refused_commits.append(dict(offsets))
                self._failed_commits.update(offsets)
                return
            raise KafkaClientError("commit refused: the group no longer knows this member", code="UNKNOWN_MEMBER_ID")
        if asynchronous and self._failing_commits > 0:
            self._failing_commits -= 1
            self._failed_commits.update(offsets)
            return
        self._group.store(offsets, self._marks)

    def failed_commits(self) -> dict[TopicPartition, int]:
        """The offsets of asynchronous commits that failed since the last call (`ConsumerPort.failed_commits`)."""
        failed, self._failed_commits = self._failed_commits, {}
        return failed

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]:
        self._check_open()
        return {tp: self._group.metadata.get(tp, "") for tp in tps if tp in self._group.committed}

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None:
        self._marks.update(marks)

    def group_metadata(self) -> object:
        return GroupMetadata(self._group.group_id, self._member_id or "", self._generation)

    def close(self) -> None:
        """Leave the group; like librdkafka, revoke (or, expelled, lose) the assignment first."""
        if self._closed:
            return
        if self.assignment and self._callbacks is not None:
            self._callbacks[2 if self._expelled else 1](list(self.assignment))
        self._drop_assignment()
        if self._member_id is not None and not self._expelled:
            self._group.leave(self._member_id)
        self._closed = True

    # -- internals ---------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaClientError("consumer closed", code="_STATE")

    def _wake_from_freeze(self) -> None:
        frozen_s, self._freeze_s = self._freeze_s, 0.0
        self._broker.clock.advance(frozen_s)
        if frozen_s * 1000 > self.session_timeout_ms:
            self.expel()

    def _serve_group(self) -> None:
        if self._callbacks is None:
            return
        on_assign, on_revoke, on_lost = self._callbacks
        if self._expelled:
            lost = list(self.assignment)
            if lost:
                on_lost(lost)
            self._drop_assignment()
            self._expelled = False
            self._member_id = self._group.join(self)
        if self._member_id in self._group.to_revoke:
            on_revoke(list(self.assignment))
            self._drop_assignment()
            self._group.to_revoke.discard(self._member_id)
        if self._group.stable() and self._generation != self._group.generation:
            self._assign(self._group.assignment_for(self._member_id or ""))
            on_assign(list(self.assignment))

    def _assign(self, tps: list[TopicPartition]) -> None:
        self._generation = self._group.generation
        self.assignment = tps
        self._paused.clear()  # a fresh assignment fetches (KafkaConsumer resumes on assign, too)
        committed = self._group.committed
        for tp in tps:
            start = len(self._broker._log(tp)) if self._reset_to_end else 0
            self._positions[tp] = committed.get(tp, start)

    def _drop_assignment(self) -> None:
        self.assignment = []
        self._positions.clear()
        self._paused.clear()

    def _fetch(self, max_records: int) -> list[Message]:
        """Records from the fetchable partitions, starting one partition further each call (none starves)."""
        tps = [tp for tp in self.assignment if tp not in self._paused]
        if not tps:
            return []
        start, self._rotation = self._rotation % len(tps), self._rotation + 1
        out: list[Message] = []
        for tp in tps[start:] + tps[:start]:
            got, self._positions[tp] = _readable(
                self._broker._log(tp), self._positions[tp], max_records - len(out), self._read_committed
            )
            out += got
        return out


class MemoryProducer:
    """`ProducerPort` over a `MemoryBroker`: a record is written, and its delivery reported, at the next
    `poll`/`flush` (or the transaction's commit); with a `transactional_id`, only inside a transaction."""

    def __init__(self, broker: MemoryBroker, *, transactional_id: str | None = None) -> None:
        self._broker = broker
        self._transactional_id = transactional_id
        self._pending: list[_Pending] = []
        self._purged: list[tuple[DeliveryCallback, PublishError]] = []
        self._initialised = False
        self._fenced = False
        self._txn: _Transaction | None = None

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
        self._check_usable()
        if self._transactional_id is not None and self._txn is None:
            raise KafkaClientError("produce outside a transaction", code="_STATE")
        tp = (topic, self._broker._choose_partition(topic, key, partition))
        failure = self._broker._take_failure(topic)
        if failure is not None and failure.at_once:
            raise KafkaClientError(
                f"{failure.code} (injected)", code=failure.code, retriable=failure.retriable, fatal=failure.fatal
            )
        error = None
        if failure is not None:
            error = PublishError(
                topic, f"{failure.code} (injected)", code=failure.code, retriable=failure.retriable, fatal=failure.fatal
            )
        elif _size(key, value, headers) > self._broker.max_message_bytes.get(topic, _NO_LIMIT):
            limit = self._broker.max_message_bytes[topic]
            error = PublishError(topic, f"larger than {topic}'s max.message.bytes ({limit})", code="MSG_SIZE_TOO_LARGE")
        msg = Message(topic, tp[1], -1, self._broker.clock.now_ms(), key, value, tuple(headers))
        self._pending.append(_Pending(tp, msg, on_delivery, error, self._broker.ack_after_polls))

    def poll(self, timeout_s: float) -> None:
        self._check_not_fenced()
        self._deliver(waiting=True)

    def flush(self, timeout_s: float) -> int:
        self._check_not_fenced()
        self._deliver()
        return 0

    def partition_count(self, topic: str) -> int:
        return self._broker.partition_count(topic)

    def purge(self) -> None:
        """Drop what is not delivered yet; each one's report says `_PURGE_QUEUE`, at the next poll."""
        pending, self._pending = self._pending, []
        self._purged += [
            (on_delivery, PublishError(tp[0], "purged", code="_PURGE_QUEUE"))
            for tp, _msg, on_delivery, _error, _polls in pending
        ]

    def init_transactions(self, timeout_s: float) -> None:
        if self._transactional_id is None:
            raise KafkaClientError("init_transactions needs a transactional id", code="_NOT_CONFIGURED")
        self._broker._claim(self._transactional_id, self)
        self._initialised = True

    def begin_transaction(self) -> None:
        self._check_usable()
        if not self._initialised or self._txn is not None:
            raise KafkaClientError("begin_transaction: not initialised, or a transaction is open", code="_STATE")
        self._txn = _Transaction()

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout_s: float
    ) -> None:
        txn = self._open_txn()
        if not isinstance(group_metadata, GroupMetadata):
            raise KafkaClientError(f"not a group's metadata: {group_metadata!r}", code="_INVALID_ARG")
        group = self._broker._group(group_metadata.group_id)
        if not group.is_member(group_metadata.member_id):
            raise KafkaClientError(
                "offsets refused: the group no longer knows this member", code="UNKNOWN_MEMBER_ID", abortable=True
            )
        if group_metadata.generation != group.generation:
            raise KafkaClientError(
                "offsets refused: the group has rebalanced since", code="ILLEGAL_GENERATION", abortable=True
            )
        txn.offsets.setdefault(group_metadata.group_id, {}).update(offsets)

    def commit_transaction(self, timeout_s: float) -> None:
        """Deliver what is pending, then commit; a failed delivery fails the commit (abort it then)."""
        txn = self._open_txn()
        self._deliver()
        if txn.error is not None:
            raise KafkaClientError(
                f"transaction failed: {txn.error}", code=txn.error.code, retriable=False, abortable=True
            )
        self._broker._end(txn, _TxnState.COMMITTED)
        self._txn = None

    def abort_transaction(self, timeout_s: float) -> None:
        """Abort: as librdkafka's abort, it purges the records still queued in the client (they take no
        offsets; each one's report says `_PURGE_QUEUE`, at a later poll, when the next transaction may be
        open). What was written in the transaction never reaches a read_committed reader; its offsets are
        never committed."""
        txn = self._open_txn()
        self.purge()
        self._broker._end(txn, _TxnState.ABORTED)
        self._txn = None

    # -- internals ---------------------------------------------------------------------------------------

    def _deliver(self, *, waiting: bool = False) -> None:
        """Write and report what is pending; with `waiting` (a poll), only what waited its `ack_after_polls`."""
        purged, self._purged = self._purged, []
        for on_delivery, purge_error in purged:
            on_delivery(purge_error)
        if waiting and any(p.polls_left for p in self._pending):
            ready = [p for p in self._pending if not p.polls_left]
            self._pending = [p._replace(polls_left=p.polls_left - 1) for p in self._pending if p.polls_left]
        else:
            ready, self._pending = self._pending, []
        for tp, msg, on_delivery, error, _ in ready:
            if error is None:
                self._broker._write(tp, msg.key, msg.value, msg.headers, msg.timestamp_ms, self._txn)
            elif self._txn is not None and self._txn.error is None:
                self._txn.error = error
            on_delivery(error)

    def _open_txn(self) -> _Transaction:
        self._check_usable()
        if self._txn is None:
            raise KafkaClientError("no transaction is open", code="_STATE")
        return self._txn

    def _check_usable(self) -> None:
        self._check_not_fenced()
        if self._transactional_id is not None and not self._initialised:
            raise KafkaClientError("init_transactions first", code="_STATE")

    def _check_not_fenced(self) -> None:
        if self._fenced:
            raise KafkaClientError(
                "fenced by a newer producer with the same transactional id", code="_FENCED", fatal=True
            )

    def _fence(self) -> None:
        if self._txn is not None:
            self._pending.clear()
            self._broker._end(self._txn, _TxnState.ABORTED)
            self._txn = None
        self._fenced = True


class ShareRecordState(enum.Enum):
    """Where a delivered record is in its share group (KIP-932's states)."""

    ACQUIRED = "acquired"  # locked to one member until acknowledged or its lock expires
    AVAILABLE = "available"  # released or its lock expired: delivered again, delivery count + 1
    ACKNOWLEDGED = "acknowledged"  # accepted: done
    ARCHIVED = "archived"  # rejected, or released/expired at the delivery count limit: never delivered again


@dataclass(eq=False)
class _Held:
    state: ShareRecordState
    delivery_count: int
    owner: int | None  # the member holding it while ACQUIRED
    lock_until_s: float


@dataclass(eq=False)
class _SharePartition:
    next_fresh: int  # the first offset never delivered
    records: dict[int, _Held] = field(default_factory=dict)


class _ShareGroup:
    """One share group: its configs and, per partition, the state of every record it has delivered."""

    def __init__(self, broker: MemoryBroker, group_id: str) -> None:
        self.broker = broker
        self.group_id = group_id
        self.auto_offset_reset = "latest"  # Kafka's default for share groups
        self.lock_ms = 30_000
        self.delivery_limit = 5
        self.partitions: dict[TopicPartition, _SharePartition] = {}
        self._member_ids = itertools.count(1)

    def join(self, topics: Sequence[str]) -> int:
        for topic in topics:
            for partition, log in enumerate(self.broker._partitions_of(topic)):
                if (topic, partition) not in self.partitions:  # the start offset is fixed when first read
                    start = 0 if self.auto_offset_reset == "earliest" else len(log)
                    self.partitions[(topic, partition)] = _SharePartition(start)
        return next(self._member_ids)

    def expire_locks(self) -> None:
        now = self.broker.clock.monotonic()
        for part in self.partitions.values():
            for held in part.records.values():
                if held.state is ShareRecordState.ACQUIRED and held.lock_until_s <= now:
                    self._give_back(held)

    def _give_back(self, held: _Held) -> None:
        held.owner = None
        limited = held.delivery_count >= self.delivery_limit
        held.state = ShareRecordState.ARCHIVED if limited else ShareRecordState.AVAILABLE

    def acquire(self, member: int, topics: Sequence[str], limit: int) -> list[Message]:
        self.expire_locks()
        lock_until = self.broker.clock.monotonic() + self.lock_ms / 1000
        out: list[Message] = []
        for tp, part in self.partitions.items():
            if tp[0] not in topics or len(out) >= limit:
                continue
            log = self.broker._log(tp)
            again = sorted(o for o, h in part.records.items() if h.state is ShareRecordState.AVAILABLE)
            again = again[: limit - len(out)]
            fresh, part.next_fresh = _readable(log, part.next_fresh, limit - len(out) - len(again), False)
            for msg in [log[o].message for o in again] + fresh:
                assert msg is not None  # only records are ever held, never markers
                held = part.records.setdefault(msg.offset, _Held(ShareRecordState.AVAILABLE, 0, None, 0.0))
                held.state, held.owner, held.lock_until_s = ShareRecordState.ACQUIRED, member, lock_until
                held.delivery_count += 1
                out.append(msg._replace(delivery_count=held.delivery_count))
        return out

    def settle(self, member: int, tp: TopicPartition, offset: int, ack: AckType) -> bool:
        """Apply one acknowledgement; False when the member no longer holds the record (its lock expired)."""
        self.expire_locks()
        part = self.partitions.get(tp)
        held = part.records.get(offset) if part else None
        if held is None or held.state is not ShareRecordState.ACQUIRED or held.owner != member:
            return False
        if ack is AckType.ACCEPT:
            held.state, held.owner = ShareRecordState.ACKNOWLEDGED, None
        elif ack is AckType.REJECT:
            held.state, held.owner = ShareRecordState.ARCHIVED, None
        elif ack is AckType.RELEASE:
            self._give_back(held)
        else:  # RENEW: a fresh lock from now
            held.lock_until_s = self.broker.clock.monotonic() + self.lock_ms / 1000
        return True

    def release_all(self, member: int) -> None:
        for part in self.partitions.values():
            for held in part.records.values():
                if held.state is ShareRecordState.ACQUIRED and held.owner == member:
                    self._give_back(held)


class MemoryShareConsumer:
    """`ShareConsumerPort` on a `MemoryBroker` share group (see `MemoryBroker.share_consumer`).

    As confluent-kafka's explicit mode: a batch must be acknowledged before the next poll, acknowledgements
    reach the group on `commit` or the next poll, `close` sends them and releases the rest. `kill()` is a
    SIGKILL: what the member holds stays acquired until its lock expires."""

    def __init__(self, group: _ShareGroup, *, max_records: int, supports_renew: bool) -> None:
        self._group = group
        self._max_records = max_records
        self.supports_renew = supports_renew
        self._member: int | None = None
        self._topics: list[str] = []
        self._unacknowledged: set[tuple[TopicPartition, int]] = set()
        self._pending: dict[tuple[TopicPartition, int], AckType] = {}
        self._renewed: set[tuple[TopicPartition, int]] = set()
        self._on_acknowledged: AcknowledgedCallback | None = None
        self._closed = False

    def subscribe(self, topics: Sequence[str], *, on_acknowledged: AcknowledgedCallback | None = None) -> None:
        self._check_open()
        self._topics = list(topics)
        self._member = self._group.join(self._topics)
        self._on_acknowledged = on_acknowledged

    def poll(self, timeout_s: float) -> list[Message]:
        self._check_open()
        if self._member is None:
            raise KafkaClientError("share consumer: not subscribed", code="ILLEGAL_STATE")
        if self._unacknowledged:
            raise KafkaClientError(
                f"share consumer: {len(self._unacknowledged)} records of the last poll are not acknowledged",
                code="ILLEGAL_STATE",
            )
        self._send()
        batch = self._group.acquire(self._member, self._topics, self._max_records)
        if not batch:  # nothing to deliver: the wait passes (and locks may expire meanwhile)
            self._group.broker.clock.advance(timeout_s)
            batch = self._group.acquire(self._member, self._topics, self._max_records)
        self._unacknowledged = {(m.tp, m.offset) for m in batch}
        return batch

    def acknowledge(self, message: Message, ack: AckType) -> None:
        self._check_open()
        if ack is AckType.RENEW and not self.supports_renew:
            raise KafkaClientError("share consumer: RENEW is not supported", code="UNSUPPORTED_ACKNOWLEDGEMENT")
        key = (message.tp, message.offset)
        if key not in self._unacknowledged and key not in self._pending and key not in self._renewed:
            raise KafkaClientError(f"share consumer: {message.tp}@{message.offset} is not held", code="ILLEGAL_STATE")
        self._unacknowledged.discard(key)
        self._pending[key] = ack
        if ack is AckType.RENEW:  # still held: it takes a final acknowledgement later
            self._renewed.add(key)
        else:
            self._renewed.discard(key)

    def commit(self, *, asynchronous: bool, timeout_s: float = 30.0) -> dict[TopicPartition, KafkaClientError | None]:
        self._check_open()
        answers = self._send()
        return {} if asynchronous else answers

    def close(self) -> None:
        if self._closed:
            return
        if self._member is not None:
            self._send()
            self._group.release_all(self._member)
        self._closed = True

    def kill(self) -> None:
        """Vanish as a SIGKILLed process does: nothing sent, nothing released."""
        self._closed = True

    def _send(self) -> dict[TopicPartition, KafkaClientError | None]:
        pending, self._pending = self._pending, {}
        if self._member is None or not pending:
            return {}
        done: dict[TopicPartition, set[int]] = {}
        answers: dict[TopicPartition, KafkaClientError | None] = {}
        for (tp, offset), ack in pending.items():
            if self._group.settle(self._member, tp, offset, ack):
                done.setdefault(tp, set()).add(offset)
                answers.setdefault(tp, None)
            else:
                answers[tp] = KafkaClientError(f"{tp}@{offset}: lock expired", code="INVALID_RECORD_STATE")
        if self._on_acknowledged is not None:
            failed = next((e for e in answers.values() if e is not None), None)
            self._on_acknowledged({tp: frozenset(offsets) for tp, offsets in done.items()}, failed)
        return answers

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaClientError("share consumer is closed", code="ILLEGAL_STATE")
