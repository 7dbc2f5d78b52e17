"""How a consumer loop makes its records' outcomes durable: the two hand-off strategies.

The loop decides what happens to each record; a strategy owns what makes that final: which offsets are
finished, how a failure's republish is handed to the broker, and when offsets are committed. One strategy
per delivery mode, behind one interface, so that the loop has no mode branches and commits happen here only.

- `AtLeastOnce`: a success is finished at once, a failure when its republish is acknowledged; commits are
  asynchronous, by count or time, and as soon as acknowledgements arrive (`commit_on_ack`); a revoke waits
  for in-flight acks and commits synchronously; shutdown drains the producer and commits.
- `ExactlyOnce` (runtime/exactly_once.py): republishes and the consumed offsets commit in one transaction per
  poll batch. A refused commit aborts: the batch's audit entries are forgotten and its partitions read again
  (`rewind`). A revoke commits the open transaction with the revoked partitions' offsets; a loss aborts it.

Both share the offset tracker (offsets.py) and announce acknowledged hand-offs (events, `on_dead_letter`), through
`HandOffBase`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, ProducerPort
from retrytopics.core.router import RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.publish import Publisher, PublishJob
from retrytopics.runtime.transactional import TransactionalPublisher

__all__ = ["AtLeastOnce", "CommitSettings", "DeadLetterCallback", "HandOff", "HandOffBase"]

log = logging.getLogger("retrytopics.runtime")

#: `on_dead_letter(record, route)`, called once the DLQ publish is durable.
DeadLetterCallback = Callable[[Any, Any], None]

#: the longest `consume()` wait while hand-offs are unacknowledged (at-least-once): their commit follows the ack
_ACK_WAIT_MS = 20

#: within a batch, acknowledged hand-offs are committed at most this often (the batch's end commits them anyway)
_ACK_COMMIT_SPACING_S = 0.01

#: within a batch, delivery reports are served at most this often while hand-offs are in flight: a producer
#: poll after every record cost 14 µs a record when one in ten failed (bench/findings.md, section 10), more
#: than the rest of a success; acknowledgements then wait at most this long, or until the batch ends
_SERVE_SPACING_S = 0.002


class CommitSettings(Protocol):
    """The part of `LoopSettings` a strategy reads."""

    @property
    def name(self) -> str: ...
    @property
    def commit_every(self) -> int: ...
    @property
    def commit_interval_ms(self) -> int: ...
    @property
    def commit_on_ack(self) -> bool: ...
    @property
    def drain_timeout_s(self) -> float: ...
    @property
    def revoke_drain_timeout_s(self) -> float: ...


class HandOff(Protocol):
    """What the loop asks of a strategy (see the module docstring)."""

    @property
    def publisher(self) -> Publisher | TransactionalPublisher: ...
    @property
    def commits_in_transactions(self) -> bool:
        """Offsets finished in an open transaction must not be committed outside it (runtime/ownership.py)."""

    def track(self, tp: TopicPartition, offset: int) -> int: ...
    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None: ...
    def succeeded(self, tp: TopicPartition, offset: int) -> None: ...
    def succeeded_run(self, tp: TopicPartition, offsets: list[int]) -> None: ...
    def remember(self, key: AuditKey) -> None: ...
    def hand_off(self, job: PublishJob, epoch: int) -> None: ...
    def serve(self, *, within_batch: bool = False) -> None: ...
    def wait_ms(self, wait_ms: int) -> int: ...
    def end_batch(self) -> None: ...
    def revoked(self, tps: list[TopicPartition]) -> None: ...
    def lost(self, tps: list[TopicPartition]) -> None: ...
    def crashed(self, cause: BaseException) -> None: ...
    def shutdown(self) -> None: ...


class HandOffBase:
    """State and steps both strategies have."""

    def __init__(
        self,
        settings: CommitSettings,
        consumer: ConsumerPort,
        tracker: OffsetTracker,
        audit: DuplicateAudit,
        emitter: Emitter,
        on_dead_letter: DeadLetterCallback | None,
    ) -> None:
        self._settings = settings
        self._consumer = consumer
        self._tracker = tracker
        self._audit = audit
        self._emitter = emitter
        self._on_dead_letter = on_dead_letter
        self._served_at = 0.0

    def _serve_now(self, publisher: Publisher | TransactionalPublisher, within_batch: bool) -> bool:
        """Whether to poll the producer now: always between batches; within one, only while hand-offs are in
        flight, and at most every `_SERVE_SPACING_S`."""
        if not within_batch:
            return True
        if not publisher.in_flight:
            return False
        now = time.monotonic()
        if now - self._served_at < _SERVE_SPACING_S:
            return False
        self._served_at = now
        return True

    def track(self, tp: TopicPartition, offset: int) -> int:
        return self._tracker.track(tp, offset)

    def remember(self, key: AuditKey) -> None:
        self._audit.remember(key)

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self._settings.name, **data)

    def _announce(self, job: PublishJob) -> None:
        r = job.route
        where = {"topic": job.source[0], "partition": job.source[1], "offset": job.offset, "destination": r.topic}
        if r.kind is RouteKind.TIER:
            self._emit(Event.RETRY_SCHEDULED, due_at=r.due_at_ms, **where)
            return
        self._emit(Event.DLQ_DISPATCHED, reason=str(r.reason), **where)
        if self._on_dead_letter is not None:
            try:
                self._on_dead_letter(job.context, r)
            except Exception:
                log.exception("on_dead_letter callback failed for %s", where)


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
        alone_producer_factory: Callable[[], ProducerPort] | None = None,
    ) -> None:
        super().__init__(settings, consumer, tracker, audit, emitter, on_dead_letter)
        self.publisher: Publisher = Publisher(
            producer_factory, emitter, make_alone_producer=alone_producer_factory, consumer=settings.name
        )
        self._finished_since_commit = 0
        self._acked_since_commit = False
        self._last_commit = time.monotonic()

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        if self._tracker.finish(tp, offset, epoch):
            self._finished_since_commit += 1

    def succeeded(self, tp: TopicPartition, offset: int) -> None:
        if self._tracker.finish_at_once(tp, offset):
            self._finished_since_commit += 1

    def succeeded_run(self, tp: TopicPartition, offsets: list[int]) -> None:
        self._finished_since_commit += self._tracker.finish_run(tp, offsets)

    def hand_off(self, job: PublishJob, epoch: int) -> None:
        job.on_acked = lambda j: self._acked(j, epoch)
        self.publisher.send(job)

    def _acked(self, job: PublishJob, epoch: int) -> None:
        if self._tracker.finish(job.source, job.offset, epoch):
            self._finished_since_commit += 1
            self._acked_since_commit = True
        self._announce(job)

    def serve(self, *, within_batch: bool = False) -> None:
        """Serve delivery reports, and commit what acknowledgements finished (within a batch: spaced)."""
        if not self._serve_now(self.publisher, within_batch):
            return  # delivery reports free offsets; nothing to serve when none are pending
        self.publisher.poll(0)
        if not within_batch or time.monotonic() - self._last_commit >= _ACK_COMMIT_SPACING_S:
            self._commit_acked()

    def wait_ms(self, wait_ms: int) -> int:
        if self.publisher.in_flight and self._settings.commit_on_ack:
            return min(wait_ms, _ACK_WAIT_MS)  # serve the acks soon: their commit follows at once
        return wait_ms

    def end_batch(self) -> None:
        settings = self._settings
        due = time.monotonic() - self._last_commit >= settings.commit_interval_ms / 1000
        if self._finished_since_commit >= settings.commit_every or (due and self._finished_since_commit):
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
        self._last_commit = time.monotonic()
        self._finished_since_commit = 0
        self._acked_since_commit = False
        if not positions:
            return
        try:
            self._consumer.commit(positions, asynchronous=asynchronous)
        except KafkaClientError as exc:
            log.warning("%s: commit failed (%s); the next commit covers these offsets", self._settings.name, exc)
            return
        self._tracker.mark_committed(dict(positions))
        self._emit(Event.OFFSETS_COMMITTED, offsets=dict(positions), synchronous=not asynchronous)

    def revoked(self, tps: list[TopicPartition]) -> None:
        self.publisher.flush(self._settings.revoke_drain_timeout_s)
        positions = self._tracker.commit_positions(tps)
        if positions:
            self._commit(positions, asynchronous=False)

    def lost(self, tps: list[TopicPartition]) -> None:
        return None  # nothing may be committed for them any more; their acks are ignored (epochs)

    def crashed(self, cause: BaseException) -> None:
        return None  # shutdown drains and commits what is finished

    def shutdown(self) -> None:
        if not self.publisher.flush(self._settings.drain_timeout_s):
            log.warning(
                "%s: %d publishes unacknowledged at shutdown; their offsets stay uncommitted",
                self._settings.name,
                self.publisher.in_flight,
            )
        self._commit(self._tracker.positions(), asynchronous=False)
