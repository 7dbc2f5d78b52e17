"""The exactly-once hand-off (`exactly_once=True`): one transaction per poll batch.

Republishes and the consumed offsets commit in one transaction per poll batch. A refused commit aborts: the
batch's audit entries are forgotten and its partitions read again (`rewind`). A revoke commits the open
transaction with the revoked partitions' offsets; a loss aborts it. The interface is runtime/handoff/base.py;
the transactional producer is runtime/handoff/transactional.py.

Key order (docs/key-ordering.md, section 8): follower hops and key-state records go into the same transaction
(`TransactionalKeyWrites`). A hop to a tier is acknowledged to key order as soon as it is produced (it lands
there exactly when the transaction commits, and what a tier landing lets a later record of its key do, follow
it, calls no handler). A hop to the DLQ is acknowledged just before the commit, in the same transaction: a dead
letter makes its key's next record runnable, and that record must not run before the dead letter is
committed (an abort would run its predecessor again, after it). So the state in memory runs ahead of the topic
within a batch; an aborted transaction rebuilds it from the key-state topic (read_committed), as an
assignment does, for every assigned partition: no undo log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.keyorder.hops import Origin, origin_of
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, ProducerPort
from retrytopics.core.router import RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.base import CommitSettings, DeadLetterCallback, HandOffBase
from retrytopics.runtime.handoff.ordered import (
    KeyChains,
    TransactionalKeyWrites,
    follower_origin,
    too_large_follower_job,
)
from retrytopics.runtime.handoff.publish import PublishJob
from retrytopics.runtime.handoff.transactional import TransactionalPublisher, TransactionOutcomeUnknown
from retrytopics.runtime.records.outcome import Follow

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
        key_chains: KeyChains | None = None,
        rebuild_key_state: Callable[[list[TopicPartition]], None] | None = None,
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
        #: key order's writes, in the transaction (None: no key-ordered handler)
        self.key_writes = None if key_chains is None else TransactionalKeyWrites(key_chains, self.publisher)
        self._ordered = self.key_writes
        self._rebuild_key_state = rebuild_key_state  # of these partitions, from the topic (an abort's undo)
        self._dead_letters: list[Origin] = []  # ordered records dead-lettered in the open transaction

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
        writes = self.key_writes
        if writes is not None and writes.chains.ordered(job.source[0]) and job.context is not None:
            at = origin_of(job.context)
            # `send` shrank it already if an earlier attempt was refused as too large: its route is final
            if at is not None and job.route.kind is RouteKind.TIER:
                writes.write(writes.chains.acked(at, job.route.retry.tier))
            elif at is not None:
                self._dead_letters.append(at)  # acknowledged at the commit (see the module docstring)

    def _follow(self, outcome: Follow) -> None:
        writes = self.key_writes
        assert writes is not None
        msg = outcome.msg
        epoch = self._track(msg.tp, msg.offset)
        at = follower_origin(outcome)
        writes.write(writes.chains.sent(at, to_tier=outcome.tier, handled=False, behind=outcome.behind))
        if not writes.follow(outcome):  # refused as too large alone: to the DLQ unhandled (`_send` tells key order)
            why = "refused as too large alone in an earlier attempt of its transaction"
            self._send(too_large_follower_job(outcome, epoch=epoch, error=why, now_ms=self._now_ms()))
            return
        self._finish(msg.tp, msg.offset, epoch)
        writes.write(writes.chains.acked(at, outcome.tier))
        self._emit(
            Event.KEY_ORDER_FOLLOWED,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            destination=outcome.ctx.topics.tiers[outcome.tier].topic,
        )

    def serve(self, *, within_batch: bool = False) -> None:
        if self._serve_now(self.publisher, within_batch):
            self.publisher.poll(0)

    def wait_ms(self, wait_ms: int) -> int:
        return wait_ms

    def end_batch(self) -> None:
        self.report_handled()
        self._commit_transaction()

    def _commit_transaction(self) -> None:
        writes = self.key_writes
        if writes is not None:
            dead_letters, self._dead_letters = self._dead_letters, []
            for at in dead_letters:
                writes.write(writes.chains.acked(at, None))
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

    def _abort(self, cause: BaseException, *, keep: Collection[TopicPartition] = (), rebuild: bool = True) -> None:
        self.publisher.abort(cause)
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
        self._jobs, self._keys, self._tps, self._dead_letters = [], [], set(), []
        if rebuild and self._rebuild_key_state is not None:
            # the rebuild reads up to every transaction open in the key state: not this one's, left open
            self.publisher.end_abandoned()
            self._rebuild_key_state(sorted(self._assigned.difference(keep)))

    def revoked(self, tps: list[TopicPartition]) -> None:
        """Records waiting in memory are handed off before `consume()`, so their transaction is open when a
        rebalance callback runs in it; once the revoked partitions' offsets were dropped, the batch end
        committed those hand-offs without them and the new owner handled the records again. On revoke the
        member still belongs to its generation, so the transaction commits with every finished offset, the
        revoked ones included (a refusal aborts and rewinds)."""
        if self._tps:
            self._commit_transaction()

    def reading_key_state(self) -> None:
        """The read waits for every transaction open in the key-state topic, this loop's own too (a tier
        consumer's passages, under an incremental assignment): commit it first, as a revoke does."""
        if self.publisher.in_flight:
            self._commit_transaction()

    def lost(self, tps: list[TopicPartition]) -> None:
        """A lost member's offsets would be refused: its open transaction aborts."""
        if self._tps:
            lost = KafkaClientError("partitions lost with a transaction open", code="_ASSIGNMENT_LOST", abortable=True)
            self._abort(lost, keep=tps)

    def crashed(self, cause: BaseException) -> None:
        self._abort(cause, rebuild=False)  # the loop stops: nothing reads key state again

    def shutdown(self) -> None:
        return None  # a batch ends with its commit: nothing is finished outside a committed transaction
