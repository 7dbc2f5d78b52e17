"""The hand-offs key order adds to an at-least-once hand-off (docs/key-ordering.md, sections 4 and 5): follower
hops, and the key-state records that must be durable before a source offset is finished (write before commit).

Both go out on a producer of their own, so that a follower hop is never batched with, refused with or
retried behind the failure path's republishes; each write is produced again after a short back-off until it
is acknowledged (acks=all, idempotent producer). A key-state record is tiny and its topic is the app's own, so
a refusal of one is an outage, not a property of the record: it is retried, and the offsets that wait for it
stay uncommitted meanwhile. A follower hop refused as too large is the record's own property, not an outage:
sent again alone (it may have been refused for a neighbour in its batch), and refused alone it is given back to
the hand-off to dead-letter (docs/key-ordering.md, section 9). The decisions are the records stage's key order
(runtime/keyorder/ordering.py), seen here through `KeyChains`.

With exactly-once (`TransactionalKeyWrites`) both go into the batch's transaction instead, on the transactional
producer: no producer of their own, no acknowledgement to wait for (section 8). A follower hop refused as too
large fails its transaction; the next attempt sends it alone, and refused alone it is dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import RETRY_PREFIX, Header, user_headers
from retrytopics.core.keyorder.hops import Origin, blocked_by_key_route, follower_headers
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import KeyStateRecord, encode_signed
from retrytopics.core.ports import ProducerPort
from retrytopics.core.record import Record
from retrytopics.core.router import too_large_reference_record
from retrytopics.core.signing import HeaderKeys
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.producer import TOO_LARGE_CODES, AckedProducer
from retrytopics.runtime.handoff.publish import PublishJob
from retrytopics.runtime.handoff.transactional import TransactionalPublisher
from retrytopics.runtime.records.outcome import Follow

__all__ = [
    "KeyChains",
    "KeyWrites",
    "OrderedHandOffs",
    "TransactionalKeyWrites",
    "follower_origin",
    "too_large_follower_job",
]

log = logging.getLogger("retrytopics.runtime")

#: back-off before a write whose delivery failed is produced again (seconds, loop clock)
_RETRY_AFTER_S = 0.5


class KeyChains(Protocol):
    """What the hand-off asks of a loop's key order (`runtime.keyorder.ordering`: `KeyOrder` on a main consumer,
    `TierOrder` on a tier consumer). Each answer is the key-state records to write."""

    def ordered(self, topic: str) -> bool: ...

    def state_topic(self, source: str) -> str: ...

    def state_keys(self, source: str) -> HeaderKeys | None: ...

    def sent(
        self, at: Origin, *, to_tier: int | None, handled: bool, behind: int | None = None
    ) -> list[KeyStateRecord]: ...

    def acked(self, at: Origin, landed: int | None) -> list[KeyStateRecord]: ...

    def succeeded(self, at: Origin) -> list[KeyStateRecord]: ...


class KeyWrites(Protocol):
    """What a hand-off and the loop ask of key order's writes, in either delivery mode: `OrderedHandOffs`
    (at-least-once: a producer of their own, acknowledged before an offset is finished) or
    `TransactionalKeyWrites` (exactly-once: in the batch's transaction)."""

    @property
    def chains(self) -> KeyChains: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def in_flight(self) -> int:
        """Writes waiting for their acknowledgement (worth serving promptly)."""

    def write(self, records: Iterable[KeyStateRecord], then: Callable[[], None] | None = None) -> None:
        """Produce key-state records; `then` once they are durable."""

    def follow(self, outcome: Follow, finish: Callable[[], None], too_large: Callable[[str], None]) -> None:
        """Hand `outcome.msg` off unhandled behind its key's predecessor; `finish` once the hop is durable;
        refused as too large by itself, `too_large` (given why) dead-letters it instead."""

    def serve(self) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...


def follower_origin(outcome: Follow) -> Origin:
    """The chain and source offset a follower hop is about."""
    msg, follower = outcome.msg, outcome.follower
    assert msg.key is not None  # a record without a key never follows
    return Origin(
        ChainKey(follower.original_topic, follower.original_partition, key_id(msg.key)), follower.original_offset
    )


@dataclass(slots=True)
class _Write:
    """One key-order write in flight (a key-state record or a follower hop): its own delivery callback."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: tuple[Header, ...]
    on_ack: Callable[[], None] | None
    owner: OrderedHandOffs
    attempt: int = 0
    #: a follower hop's: what to do once it is refused as too large alone (given the error); None: a
    #: key-state record, tiny, whose refusal is an outage
    too_large: Callable[[str], None] | None = None
    #: sent on the one-record-per-batch producer: a too-large refusal is then this record's own
    alone: bool = False
    record_id: int = -1

    def __call__(self, error: PublishError | None) -> None:
        self.owner.delivered(self, error)


class OrderedHandOffs:
    """Follower hops and key-state writes of one consumer loop (see the module docstring), on an
    `AckedProducer` of their own (runtime/handoff/producer.py), made at the first write: most loops never
    write one."""

    def __init__(
        self,
        chains: KeyChains,
        make_producer: Callable[[], ProducerPort],
        emitter: Emitter,
        *,
        clock: Clock,
        name: str,
        make_alone_producer: Callable[[], ProducerPort] | None = None,
    ) -> None:
        self.chains = chains
        self._writes: AckedProducer[_Write] = AckedProducer(make_producer, make_alone_producer=make_alone_producer)
        self._emitter = emitter
        self._monotonic = clock.monotonic
        self._now_ms = clock.now_ms
        self._name = name
        #: key-state writes: (topic, record key) -> the id of its latest write not yet acknowledged
        self._latest: dict[tuple[str, bytes | None], int] = {}

    @property
    def in_flight(self) -> int:
        """Writes not acknowledged, or whose acknowledgement has not run what waits for it yet."""
        return self._writes.unsettled

    @property
    def healthy(self) -> bool:
        """False while some write has failed and waits to be produced again."""
        return not any(w.attempt for w in self._writes.records())

    # -- what the hand-off calls ------------------------------------------------------------------------------

    def follow(self, outcome: Follow, finish: Callable[[], None], too_large: Callable[[str], None]) -> None:
        """Hand `outcome.msg` off unhandled behind its key's predecessor; `finish` once the hop and its chain
        record are acknowledged. A hop refused as too large by itself is not retried: `too_large` (given the
        error) dead-letters the record, and its acknowledgement is then `acked(..., landed=None, ...)`."""
        msg, tier, follower, ctx, behind = outcome
        topic = ctx.topics.tiers[tier].topic
        at = follower_origin(outcome)
        self.write(self.chains.sent(at, to_tier=tier, handled=False, behind=behind))

        def landed() -> None:
            self.acked(at, tier, finish)

        headers = follower_headers(ctx, follower, msg, topic)
        self._send(_Write(topic, msg.key, msg.value, None, headers, landed, self, too_large=too_large))
        self._emitter.emit(
            Event.KEY_ORDER_FOLLOWED,
            consumer=self._name,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            destination=topic,
        )

    def acked(self, at: Origin, landed: int | None, finish: Callable[[], None]) -> None:
        """The hop of an ordered record is acknowledged in tier `landed` (None: the DLQ): `finish` its offset
        once the key-state records this changes are durable too."""
        self.write(self.chains.acked(at, landed), finish)

    def write(self, records: Iterable[KeyStateRecord], then: Callable[[], None] | None = None) -> None:
        """Produce key-state records to their partitions (the source partition of their chain); `then` once
        every one of them is acknowledged."""
        batch = list(records)
        if not batch:
            if then is not None:
                then()
            return
        left = [len(batch)]

        def one_acked() -> None:
            left[0] -= 1
            if left[0] == 0 and then is not None:
                then()

        for record in batch:
            source = record.chain.source_topic
            topic = self.chains.state_topic(source)
            key, value, partition, headers = encode_signed(record, topic, self.chains.state_keys(source))
            self._send(_Write(topic, key, value, partition, headers, one_acked, self))

    # -- serving ----------------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve delivery reports (running what waited for them) and produce again what is due for a retry."""
        if not self._writes.started or not self._writes.unsettled:
            return
        self._writes.poll(0)
        self._run_done()
        self._retry_due()

    def flush(self, timeout_s: float) -> bool:
        """Serve until every write is acknowledged (those the acknowledgements lead to included) or `timeout_s`
        passed; True when none is left."""
        writes = self._writes
        deadline = self._monotonic() + timeout_s
        while writes.unsettled and self._monotonic() < deadline:
            writes.poll(min(0.05, max(0.0, deadline - self._monotonic())))
            self._run_done()
            self._retry_due()
        return not writes.unsettled

    def _retry_due(self) -> None:
        """Produce again the failed writes whose back-off passed. A key-state write that a later write of the
        same record key superseded is not: produced now, it would land behind the newer one, and compaction
        keeps the last; what waited for it waits for the newer one instead."""
        writes = self._writes
        for write in writes.due(self._monotonic()):
            write_id = write.record_id
            newer_id = self._latest.get((write.topic, write.key), write_id) if write.partition is not None else write_id
            newer = writes.find(newer_id)
            if newer_id == write_id or newer is None:
                self._produce(write, writes.producer_for(write))
                continue
            writes.forget(write_id)
            newer.on_ack = _both(write.on_ack, newer.on_ack)

    def _send(self, write: _Write) -> None:
        producer = self._writes.track(write)
        if write.partition is not None:  # a key-state record: the latest write of its record key
            self._latest[(write.topic, write.key)] = write.record_id
        self._produce(write, producer)

    def _produce(self, write: _Write, producer: ProducerPort) -> None:
        writes = self._writes
        try:
            producer.produce(
                write.topic,
                key=write.key,
                value=write.value,
                headers=write.headers,
                partition=write.partition,
                on_delivery=write,
            )
        except KafkaClientError as exc:
            writes.refused(write, exc)
            self.delivered(write, PublishError(write.topic, str(exc), code=exc.code, fatal=exc.fatal))

    def delivered(self, write: _Write, error: PublishError | None) -> None:
        """The delivery report of `write` (None: acknowledged)."""
        writes = self._writes
        if error is None:
            writes.acked(write)  # unless it is gone (superseded)
            return
        if not writes.is_current(write):
            return
        if write.too_large is not None and error.code in TOO_LARGE_CODES:
            # at once, but from `serve`, never from inside this delivery report (runtime/handoff/producer.py)
            if not write.alone:
                write.alone = True
                writes.retry_at(self._monotonic(), write)
                return
            refused, reason = write.too_large, str(error)
            write.on_ack = lambda: refused(reason)
            writes.acked(write)
            return
        write.attempt += 1
        if write.attempt == 1:
            log.warning("%s: a key-order write to %s failed (%s); producing it again", self._name, write.topic, error)
        self._emitter.emit(
            Event.PUBLISH_FAILED, consumer=self._name, destination=write.topic, error=str(error), attempt=write.attempt
        )
        writes.retry_at(self._monotonic() + _RETRY_AFTER_S, write)

    def _run_done(self) -> None:
        """Run what waited for the writes acknowledged since the last call (outside the delivery callbacks:
        what they run may produce again)."""
        writes = self._writes
        while done := writes.take_done():
            for write in done:
                if self._latest.get((write.topic, write.key)) == write.record_id:
                    del self._latest[(write.topic, write.key)]
                if write.on_ack is not None:
                    write.on_ack()


class TransactionalKeyWrites:
    """Key order's writes in exactly-once mode (docs/key-ordering.md, section 8): key-state records and follower
    hops go into the open transaction of the loop's transactional producer, with the batch's hops and offsets,
    and commit or abort with them. Nothing waits for an acknowledgement: where a hop lands is its transaction's
    fate, so the hand-off tells key order as soon as the hop is produced, and an aborted transaction rebuilds
    the key state from the topic (read_committed) rather than undoing what it told."""

    #: nothing waits for an acknowledgement
    in_flight = 0

    def __init__(self, chains: KeyChains, publisher: TransactionalPublisher, emitter: Emitter, *, name: str) -> None:
        self.chains = chains
        self._publisher = publisher
        self._emitter = emitter
        self._name = name

    @property
    def healthy(self) -> bool:
        return True  # a failed write fails its transaction: `TransactionalPublisher.healthy` says so

    def serve(self) -> None:
        return None  # the transactional producer's reports are served with the hand-off's publishes

    def flush(self, timeout_s: float) -> bool:
        return True  # durable with the transaction, which the hand-off's finisher commits

    def write(self, records: Iterable[KeyStateRecord], then: Callable[[], None] | None = None) -> None:
        """Produce key-state records into the open transaction (opened by the first one); `then` at once: they
        are durable exactly when what they describe is."""
        for record in records:
            source = record.chain.source_topic
            topic = self.chains.state_topic(source)
            key, value, partition, headers = encode_signed(record, topic, self.chains.state_keys(source))
            self._publisher.send_record(topic, key=key, value=value, partition=partition, headers=headers)
        if then is not None:
            then()

    def follow(self, outcome: Follow, finish: Callable[[], None], too_large: Callable[[str], None]) -> None:
        """Produce `outcome`'s follower hop into the open transaction, `finish` it at once and tell key order it
        landed; when an earlier attempt of it was refused as too large alone, produce nothing and call
        `too_large` instead (the hand-off dead-letters it, and tells key order once that is sent)."""
        msg, tier, follower, ctx, behind = outcome
        at = follower_origin(outcome)
        self.write(self.chains.sent(at, to_tier=tier, handled=False, behind=behind))
        source = (msg.tp, msg.offset)
        if self._publisher.refused_alone(source):
            too_large("refused as too large alone in an earlier attempt of its transaction")
            return
        topic = ctx.topics.tiers[tier].topic
        headers = follower_headers(ctx, follower, msg, topic)
        self._publisher.send_record(topic, key=msg.key, value=msg.value, partition=None, headers=headers, source=source)
        finish()
        self.write(self.chains.acked(at, tier))
        self._emitter.emit(
            Event.KEY_ORDER_FOLLOWED,
            consumer=self._name,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            destination=topic,
        )


def too_large_follower_job(outcome: Follow, *, epoch: int, error: str, now_ms: int) -> PublishJob:
    """The DLQ publish of a follower whose hop was refused as too large (`error`): unhandled, so reason
    ``blocked_by_key`` (it never ran, and a replay puts it back in source order with its key's other records),
    the message naming the refusal. Refused by the DLQ too, it is sent once more with a reference to the
    consumed record instead of its value, without user headers. Its context is the source record it stands
    for, with no value decoded (as a poison record's): what `on_dead_letter` and the key order's
    acknowledgement (`landed=None`: the key's next record waits behind the same predecessor) read."""
    msg, tier, follower, ctx, _behind = outcome
    why = f"its hop to {ctx.topics.tiers[tier].topic} was refused as too large"
    log.warning(
        "%s[%d]@%d: a follower hop refused as too large (%s); dead-lettering it unhandled",
        follower.original_topic,
        follower.original_partition,
        follower.original_offset,
        error,
    )
    source = Record(
        follower.original_topic,
        follower.original_partition,
        follower.original_offset,
        follower.original_timestamp,
        msg.key,
        None,
        msg.value,
        tuple(user_headers(msg.headers)),
        None,
        follower.origin_message_id,
    )

    def reference(job: PublishJob) -> bool:
        if job.shrunk:
            return False
        job.shrunk = 1
        job.key, job.value = too_large_reference_record(
            follower.original_topic, follower.original_partition, follower.original_offset, job.key, job.value
        )
        # only the retry headers: the lineage the route keeps, none of the user's
        bare = msg._replace(
            key=job.key, value=job.value, headers=tuple(h for h in msg.headers if h[0].startswith(RETRY_PREFIX))
        )
        job.route = blocked_by_key_route(ctx, follower, bare, why=f"{why}, so was its dead letter", now_ms=now_ms)
        log.warning(
            "%s[%d]@%d: its dead letter refused as too large; dead-lettering a reference to it instead",
            follower.original_topic,
            follower.original_partition,
            follower.original_offset,
        )
        return True

    return PublishJob(
        route=blocked_by_key_route(ctx, follower, msg, why=why, now_ms=now_ms),
        key=msg.key,
        value=msg.value,
        source=msg.tp,
        offset=msg.offset,
        epoch=epoch,
        context=source,
        shrink=reference,
    )


def _both(first: Callable[[], None] | None, then: Callable[[], None] | None) -> Callable[[], None] | None:
    if first is None or then is None:
        return first or then

    def both() -> None:
        first()
        then()

    return both
