"""The exactly-once hand-off (`exactly_once=True`): one transaction per poll batch.

Republishes and the consumed offsets commit in one transaction per poll batch. A refused commit aborts: the
batch's audit entries are forgotten and its partitions read again (`rewind`). A revoke commits the open
transaction with the revoked partitions' offsets; a loss aborts it. The interface is runtime/handoff/base.py;
the transactional producer is runtime/handoff/transactional.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, ProducerPort
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.base import CommitSettings, DeadLetterCallback, HandOffBase
from retrytopics.runtime.handoff.publish import PublishJob
from retrytopics.runtime.handoff.transactional import TransactionalPublisher, TransactionOutcomeUnknown

__all__ = ["ExactlyOnce"]

log = logging.getLogger("retrytopics.runtime")


class ExactlyOnce(HandOffBase):
    """Republishes and consumed offsets in one transaction per batch (see the module docstring)."""

    commits_in_transactions = True

    def __init__(
        self,
        settings: CommitSettings,
        consumer: ConsumerPort,
        tracker: OffsetTracker,
        audit: DuplicateAudit,
        emitter: Emitter,
        on_dead_letter: DeadLetterCallback | None,
        producer_factory: Callable[[], ProducerPort],
        *,
        clock: Clock,
        forget_waiting: Callable[[list[TopicPartition]], None],
        assigned: set[TopicPartition],
    ) -> None:
        super().__init__(settings, audit, emitter, on_dead_letter, clock=clock)
        self._consumer = consumer
        self._tracker = tracker
        self.publisher: TransactionalPublisher = TransactionalPublisher(
            producer_factory, emitter, consumer=settings.name, monotonic=clock.monotonic
        )
        self._forget_waiting = forget_waiting  # a rewound partition's pauses and queue (runtime/waiting.py)
        self._assigned = assigned  # the loop's set of assigned partitions (a rewind seeks only those)
        self._keys: list[AuditKey] = []  # audit entries of the open transaction
        self._jobs: list[PublishJob] = []  # its hand-offs, announced when it commits
        self._tps: set[TopicPartition] = set()  # partitions with offsets in it

    def _track(self, tp: TopicPartition, offset: int) -> int:
        self.publisher.begin()
        self._tps.add(tp)
        return self._tracker.track(tp, offset)

    def _finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        self._tracker.finish(tp, offset, epoch)

    def _finish_success(self, tp: TopicPartition, offset: int) -> None:
        self._finish(tp, offset, self._track(tp, offset))

    def _finish_run(self, tp: TopicPartition, offsets: list[int]) -> None:
        for offset in offsets:
            self._finish_success(tp, offset)

    def _remember(self, key: AuditKey) -> None:
        super()._remember(key)
        self._keys.append(key)

    def _send(self, job: PublishJob) -> None:
        # Durable with the transaction that also commits the offset; events wait for the commit.
        self.publisher.send(job)
        self._finish(job.source, job.offset, job.epoch)
        self._jobs.append(job)

    def serve(self, *, within_batch: bool = False) -> None:
        if self._serve_now(self.publisher, within_batch):
            self.publisher.poll(0)

    def wait_ms(self, wait_ms: int) -> int:
        return wait_ms

    def end_batch(self) -> None:
        self.report_handled()
        self._commit_transaction()

    def _commit_transaction(self) -> None:
        positions = self._tracker.commit_positions()
        try:
            self.publisher.commit(positions, self._consumer.group_metadata())
        except TransactionOutcomeUnknown:
            raise  # rewinding could handle a committed batch twice, going on could lose an aborted one: stop
        except KafkaClientError as exc:
            log.warning(
                "%s: transaction failed (%s); rewinding to the last committed offsets", self._settings.name, exc
            )
            self._rewind()
            return
        self._tracker.mark_committed(positions)
        jobs, self._jobs, self._keys, self._tps = self._jobs, [], [], set()
        for job in jobs:
            self._announce(job)
        self._report_retried()
        if positions:
            self._emit(Event.OFFSETS_COMMITTED, offsets=dict(positions), synchronous=True)

    def _abort(self, cause: BaseException) -> None:
        self.publisher.abort(cause)
        self._rewind()

    def _rewind(self) -> None:
        """After an aborted transaction: forget its audit entries and read its partitions again."""
        for key in self._keys:
            self._audit.forget(key)
        for tp in self._tps:
            target = self._tracker.rewind(tp)
            self._forget_waiting([tp])
            if target is not None and tp in self._assigned:
                try:
                    self._consumer.seek(tp, target)
                    self._consumer.resume([tp])
                except KafkaClientError as exc:
                    log.warning("%s: rewind of %s failed: %s", self._settings.name, tp, exc)
        self._jobs, self._keys, self._tps = [], [], set()

    def revoked(self, tps: list[TopicPartition]) -> None:
        """Records waiting in memory are handed off before `consume()`, so their transaction is open when a
        rebalance callback runs in it; once the revoked partitions' offsets were dropped, the batch end
        committed those hand-offs without them and the new owner handled the records again. On revoke the
        member still belongs to its generation, so the transaction commits with every finished offset, the
        revoked ones included (a refusal aborts and rewinds)."""
        if self._tps:
            self._commit_transaction()

    def lost(self, tps: list[TopicPartition]) -> None:
        """A lost member's offsets would be refused: its open transaction aborts."""
        if self._tps:
            self._abort(KafkaClientError("partitions lost with a transaction open", code="_ASSIGNMENT_LOST"))

    def crashed(self, cause: BaseException) -> None:
        self._abort(cause)

    def shutdown(self) -> None:
        return None  # a batch ends with its commit: nothing is finished outside a committed transaction
