"""Exactly-once (`exactly_once=True`): a transaction per batch finishes the records.

Republishes and the consumed offsets commit in one transaction per poll batch. A refused commit aborts: the
batch's audit entries are forgotten and its partitions read again (`rewind`). A revoke commits the open
transaction with the revoked partitions' offsets; a loss aborts it. The hand-off is runtime/handoff/handoff.py;
the transactional producer is runtime/handoff/transactional.py. A settled partition's tail (transaction markers,
aborted records) is committed too (`polled`, runtime/handoff/tails.py).

Key order (docs/key-ordering.md, section 8): follower hops and key-state records go into the same transaction
(`TransactionalKeyWrites`). The hand-off tells key order: a hop to a tier is acknowledged to key order as soon as it is produced (it lands
there exactly when the transaction commits, and what a tier landing lets a later record of its key do, follow
it, calls no handler). A hop to the DLQ is acknowledged just before the commit, in the same transaction: a dead
letter makes its key's next record runnable, and that record must not run before the dead letter is
committed (an abort would run its predecessor again, after it). So the state in memory runs ahead of the topic
within a batch; an aborted transaction rebuilds it from the key-state topic (read_committed), as an
assignment does, for every assigned partition: no undo log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, Message, ProducerPort
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.finisher import Commit, CommitSettings
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff
from retrytopics.runtime.handoff.ordered import KeyChains, TransactionalKeyWrites
from retrytopics.runtime.handoff.publish import PublishJob
from retrytopics.runtime.handoff.tails import skip_settled_tails
from retrytopics.runtime.handoff.transactional import TransactionalPublisher, TransactionOutcomeUnknown

__all__ = ["TransactionPerBatch", "exactly_once"]

log = logging.getLogger("retrytopics.runtime")


def exactly_once(
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
    key_chains: KeyChains | None = None,
    rebuild_key_state: Callable[[list[TopicPartition]], None] | None = None,
) -> HandOff:
    """The hand-off of an exactly-once consumer: a transaction per batch; key order's writes (with
    `key_chains`) go into it too."""
    publisher = TransactionalPublisher(producer_factory, emitter, consumer=settings.name, monotonic=clock.monotonic)
    finisher = TransactionPerBatch(
        settings,
        consumer,
        tracker,
        audit,
        publisher,
        forget_waiting=forget_waiting,
        assigned=assigned,
        rebuild_key_state=rebuild_key_state,
    )
    writes = None if key_chains is None else TransactionalKeyWrites(key_chains, publisher, emitter, name=settings.name)
    return HandOff(settings, finisher, publisher, emitter, on_dead_letter, clock=clock, key_writes=writes)


class TransactionPerBatch:
    """Republishes and consumed offsets in one transaction per batch (see the module docstring)."""

    commits_in_transactions = True
    finishes_when_sent = True
    settle_wait_s = None

    def __init__(
        self,
        settings: CommitSettings,
        consumer: ConsumerPort,
        tracker: OffsetTracker,
        audit: DuplicateAudit,
        publisher: TransactionalPublisher,
        *,
        forget_waiting: Callable[[list[TopicPartition]], None],
        assigned: set[TopicPartition],
        rebuild_key_state: Callable[[list[TopicPartition]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._consumer = consumer
        self._tracker = tracker
        self._audit = audit
        self._publisher = publisher
        self._forget_waiting = forget_waiting  # a rewound partition's pauses and queue (runtime/waiting.py)
        self._assigned = assigned  # the loop's set of assigned partitions (a rewind seeks only those)
        self._keys: list[AuditKey] = []  # audit entries of the open transaction
        self._jobs: list[PublishJob] = []  # its hand-offs, announced when it commits
        self._tps: set[TopicPartition] = set()  # partitions with offsets in it
        self._rebuild_key_state = rebuild_key_state  # of these partitions, from the topic (an abort's undo)

    def remember(self, key: AuditKey) -> None:
        self._audit.remember(key)
        self._keys.append(key)

    def track(self, tp: TopicPartition, offset: int) -> int:
        self._publisher.begin()
        self._tps.add(tp)
        return self._tracker.track(tp, offset)

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        self._tracker.finish(tp, offset, epoch)

    def finish_at_once(self, tp: TopicPartition, offset: int) -> None:
        self._tracker.finish(tp, offset, self.track(tp, offset))

    def finish_run(self, tp: TopicPartition, msgs: list[Message] | list[Record[Any]]) -> None:
        for m in msgs:
            self._tracker.finish(tp, m.offset, self.track(tp, m.offset))

    def sent(self, job: PublishJob) -> None:
        # durable with the transaction that also commits the offset; announced once it commits
        self._tracker.finish(job.source, job.offset, job.epoch)
        self._jobs.append(job)

    def acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        self._tracker.finish(tp, offset, epoch)

    def served(self, *, within_batch: bool) -> Commit | None:
        return None  # a transaction commits at the batch's end

    def polled(self, read_to: Mapping[TopicPartition, int]) -> Commit | None:
        """A settled partition's tail (runtime/handoff/tails.py) goes into the open transaction's offsets; with
        none open, into a plain consumer commit: everything before the tail is committed already (each batch
        ends with its transaction's commit), and the tail holds no record to handle, so there is nothing a
        transaction would make atomic with it. A zombie's commit is refused as its transaction's offsets would be
        (the group's generation)."""
        tracker = self._tracker
        for tp, next_offset in read_to.items():
            tracker.read(tp, next_offset)
        if read_to or not skip_settled_tails(self._consumer, tracker) or self._publisher.in_flight:
            return None
        positions = tracker.commit_positions(tracker.settled())
        try:
            self._consumer.commit(positions, asynchronous=False)
        except KafkaClientError as exc:
            log.warning(
                "%s: commit of a partition's tail failed (%s); the next transaction commits it",
                self._settings.name,
                exc,
            )
            return None
        tracker.mark_committed(positions)
        return Commit(positions, synchronous=True, jobs=[])

    def wait_ms(self, wait_ms: int, *, in_flight: bool) -> int:
        return wait_ms

    def unacknowledged(self, jobs: list[PublishJob]) -> None:
        return None  # a batch's end does not wait for its publishes (`settle_wait_s` is None)

    def end_batch(self) -> Commit | None:
        return self._commit_transaction()

    def _commit_transaction(self) -> Commit | None:
        positions = self._tracker.commit_positions()
        try:
            self._publisher.commit(positions, self._consumer.group_metadata())
        except TransactionOutcomeUnknown:
            raise  # rewinding could handle a committed batch twice, going on could lose an aborted one: stop
        except KafkaClientError as exc:
            log.warning(
                "%s: transaction failed (%s); rewinding to the last committed offsets", self._settings.name, exc
            )
            self._rewind()
            return None
        self._tracker.mark_committed(positions)
        jobs, self._jobs, self._keys, self._tps = self._jobs, [], [], set()
        return Commit(positions, synchronous=True, jobs=jobs)

    def _abort(self, cause: BaseException, *, keep: Collection[TopicPartition] = (), rebuild: bool = True) -> None:
        self._publisher.abort(cause)
        self._rewind(keep=keep, rebuild=rebuild)

    def _rewind(self, *, keep: Collection[TopicPartition] = (), rebuild: bool = True) -> None:
        """After an aborted transaction: forget its audit entries and read its partitions again; rebuild the key
        state of the assigned partitions but those in `keep` (lost ones), unless not `rebuild` (a crash)."""
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
        if rebuild and self._rebuild_key_state is not None:
            # the rebuild reads up to every transaction open in the key state: not this one's, left open
            self._publisher.end_abandoned()
            self._rebuild_key_state(sorted(self._assigned.difference(keep)))

    def revoked(self, tps: list[TopicPartition]) -> Commit | None:
        """Records waiting in memory are handed off before `consume()`, so their transaction is open when a
        rebalance callback runs in it; once the revoked partitions' offsets were dropped, the batch end
        committed those hand-offs without them and the new owner handled the records again. On revoke the
        member still belongs to its generation, so the transaction commits with every finished offset, the
        revoked ones included (a refusal aborts and rewinds)."""
        return self._commit_transaction() if self._tps else None

    def reading_key_state(self) -> Commit | None:
        """The read waits for every transaction open in the key-state topic, this loop's own too (a tier
        consumer's passages, under an incremental assignment): commit it first, as a revoke does."""
        return self._commit_transaction() if self._publisher.in_flight else None

    def lost(self, tps: list[TopicPartition]) -> None:
        """A lost member's offsets would be refused: its open transaction aborts."""
        if self._tps:
            lost = KafkaClientError("partitions lost with a transaction open", code="_ASSIGNMENT_LOST", abortable=True)
            self._abort(lost, keep=tps)

    def crashed(self, cause: BaseException) -> None:
        self._abort(cause, rebuild=False)  # the loop stops: nothing reads key state again

    def shutdown(self) -> Commit | None:
        return None  # a batch ends with its commit: nothing is finished outside a committed transaction
