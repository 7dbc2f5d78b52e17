"""The share-group finisher: each record a share consumer acquired ends in one acknowledgement.

The outcomes are the records stage's (runtime/records/outcome.py); the hand-off (runtime/handoff/handoff.py)
acts on them with this finisher:

- `Succeeded`, `SucceededRun`, `Duplicate`: ACCEPT;
- `Failed`: publish its route (a tier or the DLQ) with the at-least-once `Publisher`; ACCEPT once the broker
  acknowledged the publish; until then the record stays acquired. A publish that fails (refused, timed out,
  or not acknowledged when the batch ends) is dropped and its record RELEASEd: it comes back at once, to
  this member or another, and is handled again (nothing lost; a copy the failed publish did write is
  caught by the tier's duplicate audit);
- `Abandoned` (a call that outlived the record lock, or failed while stopping): RELEASE;
- anything of the batch not acknowledged when it ends: RELEASE. The client requires every record of a batch
  to be acknowledged before the next poll, so `end_batch` waits for the batch's publishes (at most
  `ack_wait_s`) and then settles everything.

Acknowledgements are committed asynchronously once per batch (the broker's answer comes to
`on_acknowledged`); before a redelivered record's handler runs, synchronously (`commit_now`, see
runtime/consumer/share_loop.py). Shutdown settles the batch and commits synchronously.

A record whose hand-off this member published and saw acknowledged but which comes back (its ACCEPT was lost
with an expired lock) is recorded here (`handed_off`): it is accepted as a duplicate, not handled again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import AckType, Message, ProducerPort, ShareConsumerPort
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.finisher import Commit, CommitSettings
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff, new_publisher, suppressed
from retrytopics.runtime.handoff.publish import PublishJob

__all__ = ["Acknowledgements", "acknowledging"]

log = logging.getLogger("retrytopics.runtime")

_Coordinates = tuple[TopicPartition, int]

#: how many hand-offs (acknowledged publishes) a member remembers, to recognise a record that comes back
_HANDED_OFF_CAPACITY = 10_000

#: the `records.acknowledged` field of each acknowledgement type
_FIELD = {AckType.ACCEPT: "accepted", AckType.RELEASE: "released", AckType.REJECT: "rejected", AckType.RENEW: "renewed"}


def acknowledging(
    settings: CommitSettings,
    consumer: ShareConsumerPort,
    audit: DuplicateAudit,
    emitter: Emitter,
    on_dead_letter: DeadLetterCallback | None,
    producer_factory: Callable[[], ProducerPort],
    *,
    clock: Clock,
    ack_wait_s: float,
    alone_producer_factory: Callable[[], ProducerPort] | None = None,
) -> tuple[HandOff, Acknowledgements]:
    """The hand-off of a share consumer, and its finisher (what the share loop asks about acquired records)."""
    acks = Acknowledgements(settings, consumer, audit, emitter, clock=clock, ack_wait_s=ack_wait_s)
    publisher = new_publisher(settings, producer_factory, alone_producer_factory, emitter, clock)
    return HandOff(settings, acks, publisher, emitter, on_dead_letter, clock=clock), acks


class Acknowledgements:
    """Outcomes to acknowledgements for one share consumer (see the module docstring)."""

    commits_in_transactions = False
    finishes_when_sent = False

    def __init__(
        self,
        settings: CommitSettings,
        consumer: ShareConsumerPort,
        audit: DuplicateAudit,
        emitter: Emitter,
        *,
        clock: Clock,
        ack_wait_s: float,
    ) -> None:
        self._settings = settings
        self._consumer = consumer
        self._audit = audit
        self._emitter = emitter
        self.settle_wait_s: float | None = ack_wait_s
        self._held: dict[_Coordinates, Message] = {}  # this batch's records, until acknowledged
        self._acks: Counter[AckType] = Counter()  # this batch's acknowledgements
        self._delivery_counts: Counter[int] = Counter()  # this batch's records by delivery count
        self._handed_off: dict[_Coordinates, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._uncommitted = False  # acknowledgements made since the last commit

    # -- a batch -------------------------------------------------------------------------------------------

    def hold(self, batch: list[Message]) -> None:
        """A poll acquired `batch`: each record is held until it is acknowledged."""
        for msg in batch:
            self._held[(msg.tp, msg.offset)] = msg
            self._delivery_counts[msg.delivery_count or 1] += 1

    def handed_off(self, msg: Message) -> bool:
        """Whether this member handed `msg` off already (its publish acknowledged): it came back only because
        its ACCEPT was lost."""
        return (msg.tp, msg.offset) in self._handed_off

    def accept_duplicate(self, msg: Message, origin_message_id: str) -> None:
        """ACCEPT a record handed off already, without a call."""
        self._acknowledge(msg.tp, msg.offset, AckType.ACCEPT)
        log.info(
            "%s: duplicate suppressed: %s[%d]@%d came back (delivery %s) after its hand-off was acknowledged",
            self._settings.name,
            msg.topic,
            msg.partition,
            msg.offset,
            msg.delivery_count,
        )
        suppressed(self._emitter, self._settings.name, msg, origin_message_id, 0)

    def release(self, msg: Message) -> None:
        """Give `msg` back to the group: it is delivered again at once (its delivery count + 1)."""
        self._acknowledge(msg.tp, msg.offset, AckType.RELEASE)

    def _acknowledge(self, tp: TopicPartition, offset: int, ack: AckType) -> None:
        msg = self._held.pop((tp, offset), None)
        if msg is None:
            return  # settled already (a batch's end releases what an abandoned run left)
        self._consumer.acknowledge(msg, ack)
        self._acks[ack] += 1
        self._uncommitted = True

    # -- Finisher: finishing is accepting ------------------------------------------------------------------

    def remember(self, key: AuditKey) -> None:
        self._audit.remember(key)

    def track(self, tp: TopicPartition, offset: int) -> int:
        return 0  # no assignments, so no epochs: a record is held by this member until acknowledged

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        self._acknowledge(tp, offset, AckType.ACCEPT)

    def finish_at_once(self, tp: TopicPartition, offset: int) -> None:
        self._acknowledge(tp, offset, AckType.ACCEPT)

    def finish_run(self, tp: TopicPartition, msgs: list[Message] | list[Record[Any]]) -> None:
        for m in msgs:
            self._acknowledge(tp, m.offset, AckType.ACCEPT)

    def sent(self, job: PublishJob) -> None:
        return None  # accepted when acknowledged (`acked`)

    def acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        coordinates = (tp, offset)
        self._handed_off[coordinates] = None
        if len(self._handed_off) > _HANDED_OFF_CAPACITY:
            del self._handed_off[next(iter(self._handed_off))]
        self._acknowledge(tp, offset, AckType.ACCEPT)

    def served(self, *, within_batch: bool) -> Commit | None:
        return None  # acknowledgements are committed once per batch

    def polled(self, read_to: Mapping[TopicPartition, int]) -> Commit | None:
        return None  # a share group has no committed offsets

    def wait_ms(self, wait_ms: int, *, in_flight: bool) -> int:
        return wait_ms

    # -- the loop's calls ----------------------------------------------------------------------------------

    def commit_now(self) -> None:
        """Send the acknowledgements made so far and wait for the broker's answer (before a call that may
        not return: a redelivered record's)."""
        if self._uncommitted:
            self._commit(asynchronous=False, timeout_s=self._ack_wait_s)

    @property
    def _ack_wait_s(self) -> float:
        assert self.settle_wait_s is not None
        return self.settle_wait_s

    def unacknowledged(self, jobs: list[PublishJob]) -> None:
        """The batch's publishes not acknowledged within `ack_wait_s` are RELEASEd, and so is the rest of the
        batch: the client requires every record of a batch to be acknowledged before the next poll."""
        for job in jobs:
            log.warning(
                "%s: the hand-off of %s[%d]@%d to %s was not acknowledged (%s); the record is released and comes back",
                self._settings.name,
                job.source[0],
                job.source[1],
                job.offset,
                job.route.topic,
                "failed" if job.attempt else f"no answer within {self._ack_wait_s:g} s",
            )
            self._acknowledge(job.source, job.offset, AckType.RELEASE)
        for tp, offset in list(self._held):
            self._acknowledge(tp, offset, AckType.RELEASE)

    def end_batch(self) -> Commit | None:
        """Count the batch's acknowledgements, and commit them asynchronously."""
        if self._acks or self._delivery_counts:
            self._emitter.emit(
                Event.RECORDS_ACKNOWLEDGED,
                consumer=self._settings.name,
                **{field: self._acks[ack] for ack, field in _FIELD.items()},
                delivery_counts=dict(self._delivery_counts),
            )
        self._acks, self._delivery_counts = Counter(), Counter()
        if self._uncommitted:
            self._commit(asynchronous=True, timeout_s=self._ack_wait_s)
        return None  # acknowledgements are no offsets: no `offsets.committed`

    def _commit(self, *, asynchronous: bool, timeout_s: float) -> None:
        self._uncommitted = False
        try:
            answers = self._consumer.commit(asynchronous=asynchronous, timeout_s=timeout_s)
        except KafkaClientError as exc:
            self._refused([], exc)
            return
        failed = [tp for tp, error in answers.items() if error is not None]
        if failed:
            self._refused(failed, next(e for e in answers.values() if e is not None))

    def on_acknowledged(self, offsets: Mapping[TopicPartition, frozenset[int]], error: KafkaClientError | None) -> None:
        """The broker's answer to an acknowledgement commit (the consumer's callback)."""
        if error is not None:
            self._refused(list(offsets), error)

    def _refused(self, partitions: list[TopicPartition], error: KafkaClientError) -> None:
        log.warning(
            "%s: acknowledgements refused for %s (%s); those records come back when their locks expire",
            self._settings.name,
            partitions or "some partitions",
            error,
        )
        self._emitter.emit(
            Event.ACKNOWLEDGEMENT_FAILED, consumer=self._settings.name, partitions=partitions, error=str(error)
        )

    def revoked(self, tps: list[TopicPartition]) -> Commit | None:
        return None  # a share consumer has no assignment

    def reading_key_state(self) -> Commit | None:
        return None  # no key order on a share consumer

    def lost(self, tps: list[TopicPartition]) -> None:
        return None  # a share consumer has no assignment

    def crashed(self, cause: BaseException) -> None:
        return None  # shutdown settles the batch and commits

    def shutdown(self) -> Commit | None:
        """The hand-off settled the batch (its publishes waited for, the rest released): commit synchronously."""
        self._commit(asynchronous=False, timeout_s=self._settings.drain_timeout_s)
        return None
