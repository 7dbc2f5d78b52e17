"""The at-least-once hand-off (the default): a success is finished at once, a failure when the broker has
acknowledged its republish (acks=all, idempotent producer); commits are asynchronous, by count or time, and
as soon as a poll delivered acknowledgements (`commit_on_ack`); a commit that failed (raised, or reported failed
later by the client) is made again at the next interval, so an idle partition's committed offset catches up
too; a revoke waits for in-flight acks and commits synchronously; shutdown drains the producer and commits. The interface is runtime/handoff/base.py.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.keyorder.hops import origin_of
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, Message, ProducerPort
from retrytopics.core.record import Record
from retrytopics.core.router import RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.base import CommitSettings, DeadLetterCallback, HandOffBase
from retrytopics.runtime.handoff.ordered import OrderedHandOffs, too_large_follower_job
from retrytopics.runtime.handoff.publish import Publisher, PublishJob
from retrytopics.runtime.records.outcome import Follow

__all__ = ["AtLeastOnce"]

log = logging.getLogger("retrytopics.runtime")

#: the longest `consume()` wait while hand-offs are unacknowledged: their commit follows the ack
_ACK_WAIT_MS = 20

#: within a batch, acknowledged hand-offs are committed at most this often (the batch's end commits them anyway)
_ACK_COMMIT_SPACING_S = 0.01


class AtLeastOnce(HandOffBase):
    """Finished on success or acknowledgement; asynchronous commits of the finished prefix."""

    commits_in_transactions = False

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
        alone_producer_factory: Callable[[], ProducerPort] | None = None,
        ordered: OrderedHandOffs | None = None,
    ) -> None:
        super().__init__(settings, audit, emitter, on_dead_letter, clock=clock)
        self._ordered: OrderedHandOffs | None = ordered
        self._consumer = consumer
        self._tracker = tracker
        self.publisher: Publisher = self._new_publisher(producer_factory, alone_producer_factory)
        self._finished_since_commit = 0
        self._acked_since_commit = False
        #: a commit failed (or its asynchronous outcome came back failed): made again at the next interval,
        #: also on a partition that gets nothing new
        self._commit_owed = False
        self._last_commit = clock.monotonic()
        #: records key order parked, tracked when parked (offsets are tracked in increasing order): their epoch
        self._parked: dict[TopicPartition, dict[int, int]] = {}

    def _park(self, tp: TopicPartition, offset: int) -> None:
        parked = self._parked.setdefault(tp, {})
        if offset not in parked:  # parked again after it was taken back: tracked already
            parked[offset] = self._tracker.track(tp, offset)

    def _track(self, tp: TopicPartition, offset: int) -> int:
        parked = self._parked.get(tp)
        if parked:
            epoch = parked.pop(offset, None)
            if epoch is not None:
                return epoch
        return self._tracker.track(tp, offset)

    def _finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        if self._tracker.finish(tp, offset, epoch):
            self._finished_since_commit += 1

    def _finish_success(self, tp: TopicPartition, offset: int) -> None:
        if self._parked.get(tp):
            self._finish(tp, offset, self._track(tp, offset))
        elif self._tracker.finish_at_once(tp, offset):
            self._finished_since_commit += 1

    def _finish_records(self, tp: TopicPartition, records: list[Message] | list[Record[Any]]) -> None:
        # a run that nothing before it waits for is settled by its last offset: no list of its offsets
        if not self._parked.get(tp) and self._tracker.finish_span(tp, records[0].offset, records[-1].offset):
            self._finished_since_commit += len(records)
        else:
            self._finish_run(tp, [r.offset for r in records])

    def _finish_run(self, tp: TopicPartition, offsets: list[int]) -> None:
        parked = self._parked.get(tp)
        if parked and any(offset in parked for offset in offsets):
            for offset in offsets:
                self._finish_success(tp, offset)
            return
        self._finished_since_commit += self._tracker.finish_run(tp, offsets)

    def _send(self, job: PublishJob) -> None:
        self.publisher.send(job)

    def _follow(self, outcome: Follow) -> None:
        assert self._ordered is not None
        msg = outcome.msg
        epoch = self._track(msg.tp, msg.offset)
        self._ordered.follow(
            outcome,
            lambda: self._finish_acked(msg.tp, msg.offset, epoch),
            # refused as too large by itself: to the DLQ unhandled; its key waits behind the same record
            lambda error: self._send(too_large_follower_job(outcome, epoch=epoch, error=error, now_ms=self._now_ms())),
        )

    def _acknowledged(self, jobs: list[PublishJob]) -> None:
        ordered = self._ordered
        for job in jobs:
            if ordered is not None and ordered.chains.ordered(job.source[0]):
                # a key-ordered record: finished once its key-state record is durable too (write before commit)
                landed = job.route.retry.tier if job.route.kind is RouteKind.TIER else None
                finish = functools.partial(self._finish_acked, job.source, job.offset, job.epoch)
                at = None if job.context is None else origin_of(job.context)
                if at is None:
                    finish()
                else:
                    ordered.acked(at, landed, finish)
            else:
                self._finish_acked(job.source, job.offset, job.epoch)
            self._announce(job)
        self._report_retried()

    def _finish_acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        if self._tracker.finish(tp, offset, epoch):
            self._finished_since_commit += 1
            self._acked_since_commit = True

    def serve(self, *, within_batch: bool = False) -> None:
        """Serve delivery reports, and commit what acknowledgements finished (within a batch: spaced)."""
        keyed = self._ordered is not None and self._ordered.in_flight > 0
        if self._ordered is not None and keyed:
            self._ordered.serve()
        if self._serve_now(self.publisher, within_batch):
            self._acknowledged(self.publisher.poll(0))
        elif not keyed:
            return  # delivery reports free offsets; nothing to serve when none are pending
        if not within_batch or self._monotonic() - self._last_commit >= _ACK_COMMIT_SPACING_S:
            self._commit_acked()

    def wait_ms(self, wait_ms: int) -> int:
        in_flight = self.publisher.in_flight or (self._ordered is not None and self._ordered.in_flight)
        if in_flight and self._settings.commit_on_ack:
            return min(wait_ms, _ACK_WAIT_MS)  # serve the acks soon: their commit follows at once
        return wait_ms

    def end_batch(self) -> None:
        settings = self._settings
        self.report_handled()
        if self._tracker.commit_failed(self._consumer.failed_commits()):
            self._commit_owed = True
        due = self._monotonic() - self._last_commit >= settings.commit_interval_ms / 1000
        owed = self._finished_since_commit or self._commit_owed
        if self._finished_since_commit >= settings.commit_every or (due and owed):
            self._commit(self._tracker.commit_positions(), asynchronous=True)
        else:
            self._commit_acked()

    def _commit_acked(self) -> None:
        """Commit (asynchronously) as soon as a poll delivered acknowledgements of hand-offs: a consumer
        killed between an ack and the commit covering it leaves the record to be handed off again by the
        next owner, so that window is kept to one poll. Successes still commit by count or time."""
        if self._acked_since_commit and self._settings.commit_on_ack:
            self._acked_since_commit = False
            self._commit(self._tracker.commit_positions(), asynchronous=True)

    def _commit(self, positions: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        self._last_commit = self._monotonic()
        self._finished_since_commit = 0
        self._acked_since_commit = False
        self._commit_owed = False
        if not positions:
            return
        try:
            self._consumer.commit(positions, asynchronous=asynchronous)
        except KafkaClientError as exc:
            log.warning("%s: commit failed (%s); made again at the next commit", self._settings.name, exc)
            self._commit_owed = True
            return
        self._tracker.mark_committed(dict(positions))
        self._emit(Event.OFFSETS_COMMITTED, offsets=dict(positions), synchronous=not asynchronous)

    def revoked(self, tps: list[TopicPartition]) -> None:
        self.publisher.flush(self._settings.revoke_drain_timeout_s)
        self._acknowledged(self.publisher.take_acked())
        if self._ordered is not None:  # the key-state writes those acknowledgements wait for
            self._ordered.flush(self._settings.revoke_drain_timeout_s)
        positions = self._tracker.commit_positions(tps)
        if positions:
            self._commit(positions, asynchronous=False)
        self._forget_parked(tps)

    def lost(self, tps: list[TopicPartition]) -> None:
        self._forget_parked(tps)  # nothing may be committed for them any more; their acks are ignored (epochs)

    def _forget_parked(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._parked.pop(tp, None)

    def crashed(self, cause: BaseException) -> None:
        return None  # shutdown drains and commits what is finished

    def shutdown(self) -> None:
        drained = self.publisher.flush(self._settings.drain_timeout_s)
        self._acknowledged(self.publisher.take_acked())
        if self._ordered is not None and not self._ordered.flush(self._settings.drain_timeout_s):
            log.warning(
                "%s: key-order writes unacknowledged at shutdown; their offsets stay uncommitted", self._settings.name
            )
        if not drained:
            log.warning(
                "%s: %d publishes unacknowledged at shutdown; their offsets stay uncommitted",
                self._settings.name,
                self.publisher.in_flight,
            )
        self._commit(self._tracker.positions(), asynchronous=False)
