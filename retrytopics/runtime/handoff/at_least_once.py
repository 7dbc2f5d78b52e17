"""At-least-once (the default): offsets committed. A success is finished at once, a failure when the broker has
acknowledged its republish (acks=all, idempotent producer); commits are asynchronous, by count or time, and
as soon as a poll delivered acknowledgements (`commit_on_ack`); a commit that failed (raised, or reported failed
later by the client) is made again at the next interval, so an idle partition's committed offset catches up
too; a revoke waits for in-flight acks (the hand-off drains them) and commits synchronously; shutdown commits
what the hand-off's drain finished. A settled partition's tail (transaction markers, aborted records) is
committed with the next commit (runtime/handoff/tails.py). The hand-off itself is runtime/handoff/handoff.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, Message, ProducerPort
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.finisher import Commit, CommitSettings
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff, new_publisher
from retrytopics.runtime.handoff.ordered import OrderedHandOffs
from retrytopics.runtime.handoff.publish import PublishJob
from retrytopics.runtime.handoff.tails import skip_settled_tails

__all__ = ["OffsetsCommitted", "at_least_once"]

log = logging.getLogger("retrytopics.runtime")

#: the longest `consume()` wait while hand-offs are unacknowledged: their commit follows the ack
_ACK_WAIT_MS = 20

#: within a batch, acknowledged hand-offs are committed at most this often (the batch's end commits them anyway)
_ACK_COMMIT_SPACING_S = 0.01


def at_least_once(
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
) -> HandOff:
    """The hand-off of a partition-based consumer without transactions: its offsets committed."""
    return HandOff(
        settings,
        OffsetsCommitted(settings, consumer, tracker, audit, clock=clock),
        new_publisher(settings, producer_factory, alone_producer_factory, emitter, clock),
        emitter,
        on_dead_letter,
        clock=clock,
        key_writes=ordered,
    )


class OffsetsCommitted:
    """Finished on success or acknowledgement; asynchronous commits of the finished prefix."""

    commits_in_transactions = False
    finishes_when_sent = False
    settle_wait_s = None

    def __init__(
        self,
        settings: CommitSettings,
        consumer: ConsumerPort,
        tracker: OffsetTracker,
        audit: DuplicateAudit,
        *,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._consumer = consumer
        self._tracker = tracker
        self._audit = audit
        self._monotonic = clock.monotonic
        self._finished_since_commit = 0
        self._acked_since_commit = False
        #: a commit failed (or its asynchronous outcome came back failed): made again at the next interval,
        #: also on a partition that gets nothing new
        self._commit_owed = False
        self._last_commit = clock.monotonic()

    def remember(self, key: AuditKey) -> None:
        self._audit.remember(key)

    def track(self, tp: TopicPartition, offset: int) -> int:
        return self._tracker.track(tp, offset)

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        if self._tracker.finish(tp, offset, epoch):
            self._finished_since_commit += 1

    def finish_at_once(self, tp: TopicPartition, offset: int) -> None:
        if self._tracker.finish_at_once(tp, offset):
            self._finished_since_commit += 1

    def finish_run(self, tp: TopicPartition, msgs: list[Message] | list[Record[Any]]) -> None:
        # a run that nothing before it waits for is settled by its last offset: no list of its offsets
        if self._tracker.finish_span(tp, msgs[0].offset, msgs[-1].offset):
            self._finished_since_commit += len(msgs)
        else:
            self._finished_since_commit += self._tracker.finish_run(tp, [m.offset for m in msgs])

    def sent(self, job: PublishJob) -> None:
        return None  # finished when acknowledged (`acked`)

    def acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        if self._tracker.finish(tp, offset, epoch):
            self._finished_since_commit += 1
            self._acked_since_commit = True

    def served(self, *, within_batch: bool) -> Commit | None:
        """Commit what acknowledgements finished (within a batch: spaced)."""
        if not within_batch or self._monotonic() - self._last_commit >= _ACK_COMMIT_SPACING_S:
            return self._commit_acked()
        return None

    def polled(self, read_to: Mapping[TopicPartition, int]) -> Commit | None:
        tracker = self._tracker
        for tp, next_offset in read_to.items():
            tracker.read(tp, next_offset)
        if not read_to and skip_settled_tails(self._consumer, tracker):
            self._commit_owed = True  # committed with the next commit, by time
        return None

    def wait_ms(self, wait_ms: int, *, in_flight: bool) -> int:
        if in_flight and self._settings.commit_on_ack:
            return min(wait_ms, _ACK_WAIT_MS)  # serve the acks soon: their commit follows at once
        return wait_ms

    def unacknowledged(self, jobs: list[PublishJob]) -> None:
        return None  # a batch's end does not wait for its publishes (`settle_wait_s` is None)

    def end_batch(self) -> Commit | None:
        settings = self._settings
        if self._tracker.commit_failed(self._consumer.failed_commits()):
            self._commit_owed = True
        due = self._monotonic() - self._last_commit >= settings.commit_interval_ms / 1000
        owed = self._finished_since_commit or self._commit_owed
        if self._finished_since_commit >= settings.commit_every or (due and owed):
            return self._commit(self._tracker.commit_positions(), asynchronous=True)
        return self._commit_acked()

    def _commit_acked(self) -> Commit | None:
        """Commit (asynchronously) as soon as a poll delivered acknowledgements of hand-offs: a consumer
        killed between an ack and the commit covering it leaves the record to be handed off again by the
        next owner, so that window is kept to one poll. Successes still commit by count or time."""
        if self._acked_since_commit and self._settings.commit_on_ack:
            self._acked_since_commit = False
            return self._commit(self._tracker.commit_positions(), asynchronous=True)
        return None

    def _commit(self, positions: Mapping[TopicPartition, int], *, asynchronous: bool) -> Commit | None:
        self._last_commit = self._monotonic()
        self._finished_since_commit = 0
        self._acked_since_commit = False
        self._commit_owed = False
        if not positions:
            return None
        try:
            self._consumer.commit(positions, asynchronous=asynchronous)
        except KafkaClientError as exc:
            log.warning("%s: commit failed (%s); made again at the next commit", self._settings.name, exc)
            self._commit_owed = True
            return None
        self._tracker.mark_committed(dict(positions))
        return Commit(positions, synchronous=not asynchronous, jobs=[])

    def revoked(self, tps: list[TopicPartition]) -> Commit | None:
        positions = self._tracker.commit_positions(tps)
        return self._commit(positions, asynchronous=False) if positions else None

    def reading_key_state(self) -> Commit | None:
        return None  # key state is written outside transactions: nothing holds a read back

    def lost(self, tps: list[TopicPartition]) -> None:
        return None  # nothing may be committed for them any more; their acks are ignored (epochs)

    def crashed(self, cause: BaseException) -> None:
        return None  # shutdown commits what the drain finished

    def shutdown(self) -> Commit | None:
        return self._commit(self._tracker.positions(), asynchronous=False)
