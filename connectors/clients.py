"""confluent-kafka behind the runtime's ports (`retrytopics.core.ports`): plain tuples in, our errors out.

The clients come from `connectors.kafka.make_consumer`/`make_producer`, so every product default (manual
commits, idempotence, acks=all, read_committed) applies; every call translates client exceptions through
`map_kafka_errors`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import (
    Message as CKMessage,
)
from confluent_kafka import TopicPartition as CKTopicPartition

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import (
    delivery_error,
    kafka_client_error,
    make_consumer,
    make_producer,
    map_kafka_errors,
)
from retrytopics.connectors.record_headers import (
    UndecodableHeaderError,
    headers_after_error,
    listed_headers,
)
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import RETRY_PREFIX, Header
from retrytopics.core.ports import DeliveryCallback, Message, PartitionsCallback, Polled, TopicPartition, message_of
from retrytopics.core.record import Record

__all__ = [
    "DEFAULT_MAX_POLL_INTERVAL_MS",
    "DEFAULT_SESSION_TIMEOUT_MS",
    "KafkaConsumer",
    "KafkaProducer",
    "message_from_client",
    "read_tails",
    "read_to_end",
]

log = logging.getLogger("retrytopics.kafka")

#: librdkafka's defaults, for the settings the runtime reads back.
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000
DEFAULT_SESSION_TIMEOUT_MS = 45_000


def _tps(partitions: Sequence[CKTopicPartition]) -> list[TopicPartition]:
    return [(p.topic, p.partition) for p in partitions]


def _ck(
    offsets: Mapping[TopicPartition, int], marks: Mapping[TopicPartition, str] | None = None
) -> list[CKTopicPartition]:
    if not marks:
        return [CKTopicPartition(topic, partition, offset) for (topic, partition), offset in offsets.items()]
    return [CKTopicPartition(tp[0], tp[1], offset, marks.get(tp)) for tp, offset in offsets.items()]


_new_message = tuple.__new__


_Read = tuple[tuple[Header, ...], UndecodableHeaderError | None]

#: consecutive records of one poll that went to one list (a partition's run of Records, or the other records'
#: Messages): the list and the index the stretch starts at
_Stretch = tuple[list[Message] | list[Record[Any]], int]


def _headers_of(msg: CKMessage) -> _Read:
    """`msg`'s headers and the error describing keys that are not UTF-8 (record_headers.py). Read a message's
    headers once: confluent-kafka's second read returns a cached list without the bad key's bytes."""
    try:
        found = msg.headers()
    except (SystemError, UnicodeDecodeError) as exc:  # a header key is not UTF-8 (record_headers.py)
        return _read_after_error(msg, exc)
    return ((), None) if found is None else _read_listed(msg, found)  # most records have no headers


def _read_after_error(msg: CKMessage, exc: SystemError | UnicodeDecodeError) -> _Read:
    listed, error = headers_after_error(msg, exc)
    return tuple(listed), error


def _read_listed(msg: CKMessage, found: Any) -> _Read:
    # checked as read_headers checks it, without asking confluent-kafka again: a call of headers() that the
    # interpreter has specialised does not check its result and returns the list with the decode error pending
    listed, error = listed_headers(msg, found)
    return tuple(listed), error


def _message(msg: CKMessage, read: _Read | None = None) -> Message:
    """`msg` as a Message; `read`: what `_headers_of(msg)` returned already."""
    # positional and without conversions: this runs once per consumed record
    kind, timestamp = msg.timestamp()
    headers, error = _headers_of(msg) if read is None else read
    # confluent-kafka's stubs are looser than what it returns for a record (topic, partition, offset are set);
    # tuple.__new__ skips the NamedTuple's Python-level __new__, a large part of this function's cost
    return _new_message(
        Message,
        (
            msg.topic(),
            msg.partition(),
            msg.offset(),
            -1 if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
            msg.key(),
            msg.value(),
            headers,
            error,
            None,  # delivery_count: no share group here
        ),
    )


#: `_message` for the other consumers of this package (the share consumer adds the delivery count).
message_from_client = _message


def _client_error(err: KafkaError) -> None:
    """A consumed error: fatal ones raise; the end of a partition is no news; the rest are logged."""
    if err.fatal():
        raise KafkaClientError(f"{err.name()}: {err.str()}", code=err.name(), fatal=True)
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consumer error: %s", err)


def _as_messages(stretches: list[_Stretch], at: CKMessage, read: _Read, unread: list[CKMessage]) -> Polled:
    """The poll as Messages only (`Polled` says when), in the client's order: what was read before `at` (its
    Records as `message_of` gives them back, the other records as the Messages made of them already, in the
    order `stretches` says), `at` itself (`read`: its headers as read), then `unread` (the records after it,
    last first, as `consume_runs` takes them; its errors are not reported yet)."""
    # where each stretch ends: where the next stretch of the same list starts, else at that list's end
    ends: list[int] = []
    next_start: dict[int, int] = {}
    for items, start in reversed(stretches):
        ends.append(next_start.get(id(items), len(items)))
        next_start[id(items)] = start
    before: list[Message] = []
    for (items, start), end in zip(stretches, reversed(ends), strict=True):
        before += [item if isinstance(item, Message) else message_of(item) for item in items[start:end]]
    unread.reverse()
    return Polled([*before, _message(at, read), *_messages(unread)], [])


def _messages(batch: list[CKMessage], *, report: bool = True) -> list[Message]:
    """The records of `batch` as Messages; its errors to `_client_error` (with `report`: not reported yet).
    Empties `batch`: each client message is let go once its Message is made (`_taken`)."""
    out: list[Message] = []
    take = _taken(batch)
    while batch:
        msg = take()
        err = msg.error()
        if err is None:
            out.append(_message(msg))
        elif report:
            _client_error(err)
    return out


def _taken(batch: list[CKMessage]) -> Callable[[], CKMessage]:
    """`batch`'s records one at a time, in order, each removed from `batch` as it is taken (call while
    `batch` is not empty). A poll's client messages and what is made of them are then never all alive at
    once: together they pass the cyclic GC's youngest-generation threshold, and each poll would set off a
    collection that moves them, still alive, to the older generations, whose full collections then walk the
    whole heap."""
    batch.reverse()
    return batch.pop


def _log_failed_commit(err: KafkaError | None, partitions: list[CKTopicPartition]) -> bool:
    """Log a failed commit; whether it failed."""
    if err is None or err.code() == KafkaError._NO_OFFSET:
        return False
    offsets = ", ".join(f"{p.topic}[{p.partition}]@{p.offset}" for p in partitions)
    log.warning(
        "asynchronous commit of %s failed: %s (these offsets are committed again at the next commit; if this "
        "consumer lost its session, the new owner reads the records again)",
        offsets,
        err.str(),
    )
    return True


class KafkaConsumer:
    """`ConsumerPort` over a confluent-kafka `Consumer`."""

    def __init__(self, kafka: KafkaConfig, *, group_id: str, overrides: Mapping[str, Any] | None = None) -> None:
        # Without a callback, librdkafka drops the outcome of an asynchronous commit: a zombie's refused
        # commit (its session lapsed and the group moved on) would leave no trace at all.
        self._failed_commits: dict[TopicPartition, int] = {}  # filled by the callback, inside consume()
        self._marks: dict[TopicPartition, str] = {}  # the metadata of later commits (`mark_commits`)
        with_callback = {"on_commit": self._commit_reported, **(overrides or {})}
        self._consumer: Consumer = make_consumer(kafka, group_id=group_id, overrides=with_callback)
        merged = {**kafka.consumer_config(), **(overrides or {})}
        self.max_poll_interval_ms = int(merged.get("max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL_MS))
        self.session_timeout_ms = int(merged.get("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS))
        # Incremental assignment: cooperative assignors, and KIP-848's consumer group protocol, where the
        # broker assigns and a plain assign() fails with _STATE.
        self._cooperative = "cooperative" in str(merged.get("partition.assignment.strategy", "")) or (
            str(merged.get("group.protocol", "classic")).lower() == "consumer"
        )

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        def assigned(consumer: Consumer, parts: list[CKTopicPartition]) -> None:
            # librdkafka keeps a partition's paused flag across a rebalance when it comes back to the same
            # member; a fresh assignment must start fetching (the loop pauses again from committed offsets).
            if self._cooperative:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)
            if parts:
                consumer.resume(parts)
            on_assign(_tps(parts))

        with map_kafka_errors():
            self._consumer.subscribe(
                list(topics),
                on_assign=assigned,
                on_revoke=lambda _c, parts: on_revoke(_tps(parts)),
                on_lost=lambda _c, parts: on_lost(_tps(parts)),
            )

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        """Up to `max_records` messages; returns as soon as one is there, or after `timeout_s` with none.

        (confluent-kafka's `consume(n, timeout)` waits for all n messages or the whole timeout, which would
        make every due record up to `timeout_s` late; so wait for the first, then take what is queued.)
        """
        return _messages(self._poll(max_records, timeout_s))

    def consume_runs(self, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
        """As `consume`; the records of `topics` built straight from the client's as the Records `Polled`
        describes (what `split_runs` makes of `consume`, without a `Message` per record first)."""
        batch = self._poll(max_records, timeout_s)
        messages: list[Message] = []
        runs: dict[TopicPartition, list[Record[Any]]] = {}
        run: list[Record[Any]] = []
        #: the list each stretch of the poll went to (a run, or `messages`) and from which index: the client's
        #: order, should the poll fall back to Messages
        stretches: list[_Stretch] = []
        new, add, at, prefix = _new_message, run.append, ("", -1), ""
        take = _taken(batch)
        while batch:
            msg = take()
            err = msg.error()
            if err is not None:
                _client_error(err)
                continue
            topic, partition = msg.topic(), msg.partition()
            if partition != at[1] or topic != at[0]:  # a poll comes in runs per partition: asked once a run
                if topic not in topics:
                    if not stretches or stretches[-1][0] is not messages:
                        stretches.append((messages, len(messages)))
                        at = ("", -1)  # the next record of `topics` starts a stretch of its run
                    messages.append(_message(msg))
                    continue
                at = (topic, partition)  # type: ignore[assignment]
                run = runs.setdefault(at, [])
                add = run.append
                stretches.append((run, len(run)))
                prefix = f"{topic}-{partition}-"
            # `_headers_of` inline: the same reads, without a call for the records that have no headers
            try:
                found = msg.headers()
            except (SystemError, UnicodeDecodeError) as exc:  # a header key is not UTF-8
                return _as_messages(stretches, msg, _read_after_error(msg, exc), batch)
            headers: tuple[Header, ...] = ()
            if found is not None:
                read = headers, error = _read_listed(msg, found)
                if error is not None or any(k.startswith(RETRY_PREFIX) for k, _ in headers):
                    return _as_messages(stretches, msg, read, batch)
            offset = msg.offset()
            kind, timestamp = msg.timestamp()
            value = msg.value()
            # as `split_runs` builds it, positionally: once per consumed record
            add(
                new(
                    Record,
                    (
                        topic,
                        partition,
                        offset,
                        -1 if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
                        msg.key(),
                        value,
                        value,
                        headers,
                        None,
                        prefix + str(offset),
                    ),
                )
            )
        return Polled(messages, list(runs.values()))

    def _poll(self, max_records: int, timeout_s: float) -> list[CKMessage]:
        with map_kafka_errors():
            first = self._consumer.poll(timeout_s)
            if first is None:
                return []
            return [first, *self._consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        with map_kafka_errors():
            self._consumer.pause([CKTopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        with map_kafka_errors():
            self._consumer.resume([CKTopicPartition(t, p) for t, p in tps])
        if tps:
            self._wake_fetcher(tps[0])

    def _wake_fetcher(self, tp: TopicPartition) -> None:
        # When every partition a librdkafka broker thread fetches is paused, the thread sleeps up to 1 s and a
        # resume does not wake it, so a due record could wait up to a second (docs/architecture.md, Pausing).
        # Any request through that thread wakes it; a watermark query is the cheapest (one round trip).
        # Failures are harmless: the fetch then starts on the thread's own schedule.
        try:
            self._consumer.get_watermark_offsets(CKTopicPartition(tp[0], tp[1]), timeout=0.5, cached=False)
        except (KafkaException, RuntimeError):
            pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with map_kafka_errors():
            self._consumer.seek(CKTopicPartition(tp[0], tp[1], offset))

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        if not offsets:
            return
        with map_kafka_errors():
            if asynchronous:
                self._consumer.commit(offsets=_ck(offsets, self._marks), asynchronous=True)
            else:
                self._consumer.commit(offsets=_ck(offsets, self._marks), asynchronous=False)

    def _commit_reported(self, err: KafkaError | None, partitions: list[CKTopicPartition]) -> None:
        if _log_failed_commit(err, partitions):
            self._failed_commits.update({(p.topic, p.partition): p.offset for p in partitions if p.offset >= 0})

    def positions(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        with map_kafka_errors():
            known = self._consumer.position([CKTopicPartition(topic, partition) for topic, partition in tps])
        # librdkafka's position is past the markers and aborted records of what it fetched; negative: unknown
        return {(p.topic, p.partition): p.offset for p in known if p.offset >= 0}

    def failed_commits(self) -> dict[TopicPartition, int]:
        failed, self._failed_commits = self._failed_commits, {}
        return failed

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]:
        with map_kafka_errors():
            found = self._consumer.committed([CKTopicPartition(t, p) for t, p in tps], timeout=timeout_s)
        return {(p.topic, p.partition): p.metadata or "" for p in found if p.error is None and p.offset >= 0}

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None:
        self._marks.update(marks)

    def group_metadata(self) -> object:
        with map_kafka_errors():
            return self._consumer.consumer_group_metadata()

    def close(self) -> None:
        with map_kafka_errors():
            self._consumer.close()


class _DeliveryReport:
    """confluent-kafka's delivery callback for one produce: the port's callback, with the error translated. One
    small object (not a closure and its cells) stays alive per record in flight."""

    __slots__ = ("on_delivery", "topic")

    def __init__(self, on_delivery: DeliveryCallback, topic: str) -> None:
        self.on_delivery, self.topic = on_delivery, topic

    def __call__(self, err: KafkaError | None, _msg: CKMessage) -> None:
        self.on_delivery(None if err is None else delivery_error(err, self.topic))


class KafkaProducer:
    """`ProducerPort` over a confluent-kafka `Producer` (idempotent, acks=all; transactional on request)."""

    def __init__(
        self,
        kafka: KafkaConfig,
        *,
        transactional_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        metadata_timeout_s: float = 10.0,
    ) -> None:
        self._producer: Producer = make_producer(kafka, transactional_id=transactional_id, overrides=overrides)
        self._partitions: dict[str, int] = {}
        self._metadata_timeout_s = metadata_timeout_s

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
        report = _DeliveryReport(on_delivery, topic)
        listed: list[Any] = list(headers)  # confluent-kafka's stubs want str | bytes | None values
        while True:
            try:  # (once per hand-off: a plain try, not map_kafka_errors' context manager)
                if partition is None:
                    self._producer.produce(topic, key=key, value=value, headers=listed, on_delivery=report)
                else:
                    self._producer.produce(
                        topic, key=key, value=value, headers=listed, partition=partition, on_delivery=report
                    )
                return
            except BufferError:
                # The local queue is full: serve delivery reports (which frees room) and try again.
                self._producer.poll(0.1)
            except KafkaException as exc:
                raise kafka_client_error(exc) from exc

    def poll(self, timeout_s: float) -> None:
        with map_kafka_errors():  # a fenced transactional producer raises its fatal error here
            self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        with map_kafka_errors():
            return int(self._producer.flush(timeout_s))

    def partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            with map_kafka_errors():
                meta = self._producer.list_topics(topic, timeout=self._metadata_timeout_s).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise KafkaClientError(f"topic {topic!r} does not exist; run provisioning first", code="UNKNOWN_TOPIC")
            count = self._partitions[topic] = len(meta.partitions)
        return count

    def purge(self) -> None:
        with map_kafka_errors():
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)

    def init_transactions(self, timeout_s: float) -> None:
        with map_kafka_errors():
            self._producer.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        with map_kafka_errors():
            self._producer.begin_transaction()

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout_s: float
    ) -> None:
        with map_kafka_errors():
            self._producer.send_offsets_to_transaction(_ck(offsets), group_metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        with map_kafka_errors():
            self._producer.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        with map_kafka_errors():
            self._producer.abort_transaction(timeout_s)


def read_tails(kafka: KafkaConfig, topics: Sequence[str], *, last: int, timeout_s: float) -> list[Message]:
    """The last `last` records of every partition of `topics` (read_committed, assign()-only: no group, no
    commits), read for at most `timeout_s`; a topic that does not exist is skipped. The duplicate check of a
    newly assigned partition is seeded from these (`retrytopics/runtime/records/duplicates.py`)."""
    consumer = make_consumer(kafka, group_id=None, overrides={"enable.partition.eof": True})
    deadline = time.monotonic() + timeout_s
    try:
        with map_kafka_errors():
            assignment: list[CKTopicPartition] = []
            for topic in topics:  # one topic per metadata request: a large cluster's full metadata is not needed
                described = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics.get(topic)
                for partition in sorted(described.partitions) if described is not None and not described.error else ():
                    left = max(0.1, deadline - time.monotonic())
                    low, high = consumer.get_watermark_offsets(
                        CKTopicPartition(topic, partition), timeout=left, cached=False
                    )
                    if high > low:
                        assignment.append(CKTopicPartition(topic, partition, max(low, high - last)))
            consumer.assign(assignment)
            pending = {(p.topic, p.partition) for p in assignment}
            read: list[Message] = []
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(500, timeout=min(0.1, max(0.0, deadline - time.monotonic()))):
                    error = msg.error()
                    if error is None:
                        read.append(_message(msg))
                    elif (msg.topic(), msg.partition()) not in pending:
                        # Not about a partition read here: GROUP_AUTHORIZATION_FAILED for the throwaway group
                        # id (librdkafka looks up its coordinator though this reader never uses the group)
                        log.debug("reading tails: %s", error.str())
                    else:  # its end, or an error (e.g. no READ on the topic): what was read so far is the tail
                        pending.discard((msg.topic(), msg.partition()))
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning(
                                "reading the tail of %s[%d] failed (%s); hand-offs to it are not recognised "
                                "after a rebalance (the app needs READ on it)",
                                msg.topic(),
                                msg.partition(),
                                error.str(),
                            )
            return read
    finally:
        consumer.close()


def read_to_end(kafka: KafkaConfig, topic: str, partitions: Sequence[int] | None, *, timeout_s: float) -> list[Message]:
    """Every record of `topic`'s `partitions` (None: all of them) from the first to the end as it is now (its
    high watermark), read_committed, assign()-only, in log order per partition. Unlike `read_tails` it must
    complete: a missing topic or partition, a partition that fails, or an end not reached within `timeout_s`
    is a `KafkaClientError`, never a partial answer (a key-state read that stopped early would start a
    partition without knowing its blocked keys).

    The end is the high watermark, not the last stable offset a read_committed reader sees: a key-state
    partition is written in the transactions of several producers (a main consumer's chain records, each tier
    consumer's passages), and what one producer committed after another's open transaction began lies beyond
    that transaction's first record, the last stable offset. A read stopping there missed a predecessor's last
    chain records. So the read goes on until every transaction open when it began is decided (committed records
    read, aborted ones skipped); one left open past `timeout_s` (a crashed producer that nobody fences, until
    the broker aborts it at its `transaction.timeout.ms`) is a retriable `TIMED_OUT`."""
    consumer = make_consumer(kafka, group_id=None, overrides={"enable.partition.eof": True})
    deadline = time.monotonic() + timeout_s
    try:
        with map_kafka_errors():
            described = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics.get(topic)
            if described is None or described.error is not None:
                raise KafkaClientError(f"cannot read {topic}: it does not exist", code="UNKNOWN_TOPIC_OR_PART")
            wanted = sorted(described.partitions) if partitions is None else sorted(set(partitions))
            missing = [p for p in wanted if p not in described.partitions]
            if missing:
                raise KafkaClientError(f"{topic} has no partitions {missing}", code="UNKNOWN_TOPIC_OR_PART")
            ends = _high_watermarks(kafka, topic, wanted, deadline)  # the end as it is now, open transactions included
            assignment = [CKTopicPartition(topic, p, low) for p, (low, high) in ends.items() if high > low]
            consumer.assign(assignment)
            pending = {p.partition for p in assignment}
            read: list[Message] = []
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaClientError(
                        f"{topic} partitions {sorted(pending)} not read to their end within {timeout_s}s (a "
                        "transaction open in them is not decided yet)",
                        code="TIMED_OUT",
                        retriable=True,
                    )
                for msg in consumer.consume(500, timeout=min(0.1, left)):
                    error = msg.error()
                    partition, offset = msg.partition(), msg.offset()
                    if error is None:
                        if partition in pending and partition is not None and offset is not None:
                            read.append(_message(msg))
                            if offset + 1 >= ends[partition][1]:
                                pending.discard(partition)
                    elif msg.topic() != topic or partition not in pending:
                        log.debug("reading %s to its end: %s", topic, error.str())  # as in `read_tails`
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # read_committed: at the last stable offset, which an open transaction holds below the
                        # end; librdkafka reports the end again once the transaction is decided
                        if offset is not None and offset >= ends[partition][1]:
                            pending.discard(partition)
                    else:
                        raise KafkaClientError(f"reading {topic}[{partition}] failed: {error.str()}", code=error.name())
            return read
    finally:
        consumer.close()


def _high_watermarks(
    kafka: KafkaConfig, topic: str, partitions: Sequence[int], deadline: float
) -> dict[int, tuple[int, int]]:
    """The low and high watermarks of `topic`'s `partitions`, whatever transactions are open in them (a
    read_committed consumer's watermark query answers the last stable offset instead)."""
    consumer = make_consumer(kafka, group_id=None, overrides={"isolation.level": "read_uncommitted"})
    try:
        out: dict[int, tuple[int, int]] = {}
        for partition in partitions:
            left = max(0.1, deadline - time.monotonic())
            low, high = consumer.get_watermark_offsets(CKTopicPartition(topic, partition), timeout=left, cached=False)
            out[partition] = (int(low), int(high))
        return out
    finally:
        consumer.close()


class KeyStateFeed:
    """An assign()-only, read_committed reader of key-state partitions as they grow (no group, no commits): a
    main consumer of key-ordered handlers reads the tiers' passages of its partitions with it, every poll
    (retrytopics/runtime/keyorder/ordering.py). Made on its first assignment."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._consumer: Consumer | None = None

    def add(self, topic: str, starts: Mapping[int, int]) -> None:
        if self._consumer is None:
            self._consumer = make_consumer(self._kafka, group_id=None)
        with map_kafka_errors():
            self._consumer.incremental_assign([CKTopicPartition(topic, p, offset) for p, offset in starts.items()])

    def remove(self, topic: str, partitions: Sequence[int]) -> None:
        if self._consumer is not None:
            with map_kafka_errors():
                self._consumer.incremental_unassign([CKTopicPartition(topic, p) for p in partitions])

    def poll(self) -> list[Message]:
        if self._consumer is None:
            return []
        read: list[Message] = []
        with map_kafka_errors():
            for msg in self._consumer.consume(500, timeout=0):
                error = msg.error()
                if error is None:
                    read.append(_message(msg))
                else:  # as in `read_tails`: the throwaway group's errors, or a partition's; read on
                    log.debug("reading key state: %s", error.str())
        return read

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
