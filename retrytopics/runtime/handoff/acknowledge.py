"""The share-group hand-off: each record a share consumer acquired ends in one acknowledgement.

The outcomes are the records stage's (runtime/records/outcome.py); what this hand-off does with them:

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

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import AckType, Message, ProducerPort, ShareConsumerPort
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.base import CommitSettings, DeadLetterCallback, HandOffBase
from retrytopics.runtime.handoff.publish import Publisher, PublishJob

__all__ = ["Acknowledging"]

log = logging.getLogger("retrytopics.runtime")

_Coordinates = tuple[TopicPartition, int]

#: how many hand-offs (acknowledged publishes) a member remembers, to recognise a record that comes back
_HANDED_OFF_CAPACITY = 10_000

#: the `records.acknowledged` field of each acknowledgement type
_FIELD = {AckType.ACCEPT: "accepted", AckType.RELEASE: "released", AckType.REJECT: "rejected", AckType.RENEW: "renewed"}


class Acknowledging(HandOffBase):
    """Outcomes to acknowledgements for one share consumer (see the module docstring)."""

    commits_in_transactions = False

    def __init__(
        self,
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
    ) -> None:
        super().__init__(settings, audit, emitter, on_dead_letter, clock=clock)
        self._consumer = consumer
        self._ack_wait_s = ack_wait_s
        self.publisher: Publisher = self._new_publisher(producer_factory, alone_producer_factory)
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
        self._suppressed(msg, origin_message_id, 0)

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

    # -- HandOffBase: finishing is accepting ---------------------------------------------------------------

    def _finish_success(self, tp: TopicPartition, offset: int) -> None:
        self._acknowledge(tp, offset, AckType.ACCEPT)

    def _finish_run(self, tp: TopicPartition, offsets: list[int]) -> None:
        for offset in offsets:
            self._acknowledge(tp, offset, AckType.ACCEPT)

    def _track(self, tp: TopicPartition, offset: int) -> int:
        return 0  # no assignments, so no epochs: a record is held by this member until acknowledged

    def _finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        self._acknowledge(tp, offset, AckType.ACCEPT)

    def _send(self, job: PublishJob) -> None:
        self.publisher.send(job)

    def _acknowledged(self, jobs: list[PublishJob]) -> None:
        for job in jobs:
            coordinates = (job.source, job.offset)
            self._handed_off[coordinates] = None
            if len(self._handed_off) > _HANDED_OFF_CAPACITY:
                del self._handed_off[next(iter(self._handed_off))]
            self._acknowledge(job.source, job.offset, AckType.ACCEPT)
            self._announce(job)
        self._report_retried()

    # -- the loop's calls ----------------------------------------------------------------------------------

    def serve(self, *, within_batch: bool = False) -> None:
        """Serve delivery reports: acknowledged publishes ACCEPT their records (within a batch: spaced)."""
        if self._serve_now(self.publisher, within_batch):
            self._acknowledged(self.publisher.poll(0))

    def commit_now(self) -> None:
        """Send the acknowledgements made so far and wait for the broker's answer (before a call that may
        not return: a redelivered record's)."""
        if self._uncommitted:
            self._commit(asynchronous=False, timeout_s=self._ack_wait_s)

    def end_batch(self) -> None:
        """Wait (at most `ack_wait_s`) for the batch's publishes; release what is not acknowledged then;
        count, and commit the acknowledgements asynchronously."""
        publisher = self.publisher
        self._acknowledged(publisher.poll(0))
        deadline = self._monotonic() + self._ack_wait_s
        while publisher.awaiting_report and self._monotonic() < deadline:
            self._acknowledged(publisher.poll(0.01))
        for job in publisher.drop_all():
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
        self.report_handled()
        if self._acks or self._delivery_counts:
            self._emit(
                Event.RECORDS_ACKNOWLEDGED,
                **{field: self._acks[ack] for ack, field in _FIELD.items()},
                delivery_counts=dict(self._delivery_counts),
            )
        self._acks, self._delivery_counts = Counter(), Counter()
        if self._uncommitted:
            self._commit(asynchronous=True, timeout_s=self._ack_wait_s)

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
        self._emit(Event.ACKNOWLEDGEMENT_FAILED, partitions=partitions, error=str(error))

    def crashed(self, cause: BaseException) -> None:
        return None  # shutdown settles the batch and commits

    def shutdown(self) -> None:
        """Settle the batch (its publishes waited for, the rest released), commit synchronously."""
        self.end_batch()
        self._commit(asynchronous=False, timeout_s=self._settings.drain_timeout_s)
