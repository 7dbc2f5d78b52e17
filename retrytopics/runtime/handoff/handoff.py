"""The hand-off: the only part of a consumer loop that acts on outcomes (runtime/records/outcome.py) and the
only one that commits. A success is finished and counted; a failure is published to its route (a tier or the
DLQ) and finished once that is durable; a duplicate is finished without a call.

One `HandOff` class, given what finishes a record (a `Finisher`, runtime/handoff/finisher.py), so that the
loop has no mode branches:

- `OffsetsCommitted` (runtime/handoff/at_least_once.py, the default): a success is finished at once, a
  failure when its republish is acknowledged; commits are asynchronous, by count or time, and as soon as
  acknowledgements arrive (`commit_on_ack`); a revoke waits for in-flight acks and commits synchronously;
  shutdown drains the producer and commits.
- `TransactionPerBatch` (runtime/handoff/exactly_once.py): republishes and the consumed offsets commit in one
  transaction per poll batch.
- `Acknowledgements` (runtime/handoff/acknowledge.py): a share consumer's, which has no partitions of its own:
  each record ends in one acknowledgement instead of a finished offset (docs/architecture.md, "A second
  consumer model"); the records stage and its outcomes are the same.

The hand-off owns what all three share: the per-batch counts of handled and failed records
(`records.handled` and `records.failed`, one event per partition and batch) and of acknowledged retries
(`retries.scheduled`, one per partition and tier per producer poll), the publish jobs and their
announcements (events, `on_dead_letter`), and key order's writes, seen through one listener (`KeyChains`,
runtime/handoff/ordered.py). The per-record events (`record.handled`, `record.failed`, `retry.scheduled`) are
built only when a hook asks for them one by one (`Emitter.wants`, `Emitter.wants_each`). Calls go one way:
the hand-off calls its finisher, its publisher and key order's writes, and none of them calls back.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from retrytopics.core.headers import DlqReason, RetryHeaders
from retrytopics.core.keyorder.hops import Origin, origin_of
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, Polled, ProducerPort
from retrytopics.core.router import RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.finisher import Commit, CommitSettings, Finisher
from retrytopics.runtime.handoff.ordered import KeyWrites, too_large_follower_job
from retrytopics.runtime.handoff.publish import Publisher, PublishJob, too_large_fallback
from retrytopics.runtime.handoff.transactional import TransactionalPublisher
from retrytopics.runtime.records.outcome import Duplicate, Failed, Follow, Outcome, Parked, Succeeded, SucceededRun

__all__ = ["DeadLetterCallback", "HandOff", "new_publisher", "suppressed"]

log = logging.getLogger("retrytopics.runtime")

#: `on_dead_letter(record, route)`, called once the DLQ publish is durable.
DeadLetterCallback = Callable[[Any, Any], None]

#: within a batch, delivery reports are served at most this often while hand-offs are in flight: a producer
#: poll after every record costs more than the rest of a success; acknowledgements then wait at most this
#: long, or until the batch ends
_SERVE_SPACING_S = 0.002


def new_publisher(
    settings: CommitSettings,
    producer_factory: Callable[[], ProducerPort],
    alone_producer_factory: Callable[[], ProducerPort] | None,
    emitter: Emitter,
    clock: Clock,
) -> Publisher:
    """The at-least-once publisher of a hand-off that is not transactional."""
    return Publisher(
        producer_factory,
        emitter,
        make_alone_producer=alone_producer_factory,
        clock=clock.monotonic,
        consumer=settings.name,
    )


class _Tally:
    """One partition's failures in one batch: how many, and each retried one's lateness."""

    __slots__ = ("count", "lateness_ms")

    def __init__(self) -> None:
        self.count = 0
        self.lateness_ms: list[int] = []


class _Counted(_Tally):
    """One partition's successes in one batch, with their first and last offsets."""

    __slots__ = ("first", "last")

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.first = self.last = offset


#: a source record's timing: handled_at - due_at is the lateness metric, which only retried records have
_NO_TIMING = MappingProxyType({"due_at": None, "handled_at": None})


class HandOff:
    """Outcomes to finishes, counts and publish jobs, with one `Finisher` (see the module docstring)."""

    def __init__(
        self,
        settings: CommitSettings,
        finisher: Finisher,
        publisher: Publisher | TransactionalPublisher,
        emitter: Emitter,
        on_dead_letter: DeadLetterCallback | None,
        *,
        clock: Clock,
        key_writes: KeyWrites | None = None,
    ) -> None:
        self._settings = settings
        self.finisher = finisher
        self._track_new = finisher.track  # bound once: a failure's path is hot
        self._finishes_when_sent = finisher.finishes_when_sent
        self.publisher = publisher
        #: key order's writes (follower hops, key-state records); None: no key-ordered handler
        self.key_writes = key_writes
        self._emitter = emitter
        self._on_dead_letter = on_dead_letter
        self._monotonic = clock.monotonic
        self._now_ms = clock.now_ms
        self._served_at = 0.0
        # a hook asked for one event per record (otherwise only their sums are emitted)
        self._each_handled = emitter.wants(Event.RECORD_HANDLED)
        self._each_failed = emitter.wants_each(Event.RECORD_FAILED)
        self._each_retried = emitter.wants_each(Event.RETRY_SCHEDULED)
        self._handled: dict[TopicPartition, _Counted] = {}  # this batch's successes, per partition
        self._failures: dict[TopicPartition, _Tally] = {}  # this batch's failures, per partition
        #: acknowledged republishes to tiers not reported yet, per (source topic, partition, tier)
        self._retried: dict[tuple[str, int, str], int] = {}
        #: per routing context (a handler's, alive as long as the app), its too-large fallback, made once
        self._shrinks: dict[int, Callable[[PublishJob], bool]] = {}
        #: records key order parked, tracked when parked (offsets are tracked in increasing order): their epoch
        self._parked: dict[TopicPartition, dict[int, int]] = {}
        #: ordered records dead-lettered in the open transaction: acknowledged to key order just before it
        #: commits (runtime/handoff/exactly_once.py says why)
        self._dead_letters: list[Origin] = []

    @property
    def commits_in_transactions(self) -> bool:
        return self.finisher.commits_in_transactions

    # -- outcomes ------------------------------------------------------------------------------------------

    def apply(self, outcome: Outcome) -> None:
        """Act on a `Succeeded`, `SucceededRun`, `Failed`, `Duplicate`, `Follow` or `Parked` outcome."""
        if type(outcome) is SucceededRun:
            self._succeeded_run(outcome)
        elif type(outcome) is Succeeded:
            self._succeeded(outcome)
        elif type(outcome) is Failed:
            self._failed(outcome)
        elif type(outcome) is Duplicate:
            self._duplicate(outcome)
        elif type(outcome) is Follow and self.key_writes is not None:  # a record of a blocked key, unhandled
            self._follow(outcome)
        elif type(outcome) is Parked:
            self._park(outcome.msg.tp, outcome.msg.offset)
        else:
            raise TypeError(f"the hand-off does not act on {type(outcome).__name__}")

    def _succeeded(self, outcome: Succeeded) -> None:
        msg, key, record = outcome
        tp, writes = msg.tp, self.key_writes
        if (
            writes is not None
            and writes.chains.ordered(msg.topic)
            and (at := origin_of(record)) is not None
            and (passages := writes.chains.succeeded(at))
        ):
            # a tier's passage is written before the offset is finished (write before commit)
            epoch = self._track(tp, msg.offset)
            writes.write(passages, functools.partial(self.finisher.acked, tp, msg.offset, epoch))
        elif self._parked and self._parked.get(tp):
            self.finisher.finish(tp, msg.offset, self._track(tp, msg.offset))
        else:
            self.finisher.finish_at_once(tp, msg.offset)
        if key is not None:
            self.finisher.remember(key)
        state = record.retry
        now = self._now_ms() if state is not None else 0
        counted = self._handled.get(tp)
        if counted is None:
            counted = self._handled[tp] = _Counted(msg.offset)
        counted.count += 1
        counted.last = msg.offset
        if state is not None and state.due_at is not None:
            counted.lateness_ms.append(now - state.due_at)
        if self._each_handled:
            self._handled_event(msg.topic, msg.partition, msg.offset, record.attempt, state, now)

    def _succeeded_run(self, outcome: SucceededRun) -> None:
        tp, msgs, records, keys = outcome
        parked = self._parked.get(tp)
        if parked and any(m.offset in parked for m in msgs):
            finish = self.finisher.finish
            for m in msgs:
                finish(tp, m.offset, self._track(tp, m.offset))
        else:
            self.finisher.finish_run(tp, msgs)
        remember = self.finisher.remember
        for key in keys:
            remember(key)
        counted = self._count(tp, msgs[0].offset, msgs[-1].offset, len(msgs))
        if records is None:
            if self._each_handled:
                for m in msgs:
                    self._handled_event(m.topic, m.partition, m.offset, 1, None, 0)
            return
        now = self._now_ms()
        counted.lateness_ms.extend(
            now - r.retry.due_at for r in records if r.retry is not None and r.retry.due_at is not None
        )
        if self._each_handled:
            for r in records:
                self._handled_event(r.topic, r.partition, r.offset, r.attempt, r.retry, now)

    def _handled_event(
        self, topic: str, partition: int, offset: int, attempt: int, state: RetryHeaders | None, now_ms: int
    ) -> None:
        """One `record.handled` (a hook asked for one per record); a retried record's has its timing."""
        timing = _NO_TIMING if state is None else {"due_at": state.due_at, "handled_at": now_ms}
        self._emit(Event.RECORD_HANDLED, topic=topic, partition=partition, offset=offset, attempt=attempt, **timing)

    def _failed(self, outcome: Failed) -> None:
        msg, key, record, _failure, route, ctx = outcome
        tp = msg.tp
        epoch = self._track(tp, msg.offset) if self._parked else self._track_new(tp, msg.offset)
        if key is not None:
            self.finisher.remember(key)
        writes, at = self.key_writes, None
        if writes is not None and writes.chains.ordered(msg.topic) and (at := origin_of(record)) is not None:
            # its key waits until this hop is acknowledged; a follower dead-lettered behind its key never ran
            handled = route.reason is not DlqReason.BLOCKED_BY_KEY
            to_tier = route.retry.tier if route.kind is RouteKind.TIER else None
            writes.write(writes.chains.sent(at, to_tier=to_tier, handled=handled))
        failures = self._failures.get(tp)
        if failures is None:
            failures = self._failures[tp] = _Tally()
        failures.count += 1
        state = record.retry
        now = self._now_ms() if state is not None else 0
        if state is not None and state.due_at is not None:
            failures.lateness_ms.append(now - state.due_at)
        if self._each_failed:
            timing = _NO_TIMING if state is None else {"due_at": state.due_at, "handled_at": now}
            self._emitter.emit_each(
                Event.RECORD_FAILED,
                consumer=self._settings.name,
                topic=msg.topic,
                partition=msg.partition,
                offset=msg.offset,
                attempt=record.attempt,
                # the type the route's exception headers describe (a NonRetryable or Retry wrapper's cause)
                error=route.retry.exception_type.rpartition(".")[2],
                **timing,
            )
        shrink = self._shrinks.get(id(ctx))
        if shrink is None:
            shrink = self._shrinks[id(ctx)] = too_large_fallback(ctx)
        job = PublishJob(
            route=route,
            key=msg.key,
            value=msg.value,
            source=tp,
            offset=msg.offset,
            epoch=epoch,
            # kept in flight only for `on_dead_letter`, or for key order's acknowledgement (its chain)
            context=record if self._on_dead_letter is not None or at is not None else None,
            shrink=shrink,
        )
        self.publisher.send(job)  # not `_send`: a failure's path is hot
        if self._finishes_when_sent:
            self._sent(job)

    def _send(self, job: PublishJob) -> None:
        self.publisher.send(job)
        if self._finishes_when_sent:
            self._sent(job)

    def _sent(self, job: PublishJob) -> None:
        """A hand-off durable with what finishes it as soon as it is sent (a transaction's): the finisher
        finishes it, and key order learns where it lands (otherwise both wait for `_acknowledged`)."""
        self.finisher.sent(job)
        writes = self.key_writes
        if writes is not None and job.context is not None and writes.chains.ordered(job.source[0]):
            at = origin_of(job.context)
            # `send` shrank it already if an earlier attempt was refused as too large: its route is final
            if at is not None and job.route.kind is RouteKind.TIER:
                writes.write(writes.chains.acked(at, job.route.retry.tier))
            elif at is not None:
                self._dead_letters.append(at)  # acknowledged just before the commit

    def _duplicate(self, outcome: Duplicate) -> None:
        msg, origin, attempt, downstream = outcome
        self.finisher.finish(msg.tp, msg.offset, self._track(msg.tp, msg.offset))
        if downstream:
            log.info(
                "%s: duplicate suppressed: %s[%d]@%d was handed off already (found downstream at assignment)",
                self._settings.name,
                msg.topic,
                msg.partition,
                msg.offset,
            )
        else:
            log.info(
                "%s: duplicate suppressed: %s[%d]@%d repeats %s attempt %d (a republish was duplicated by a crash)",
                self._settings.name,
                msg.topic,
                msg.partition,
                msg.offset,
                origin,
                attempt,
            )
        suppressed(self._emitter, self._settings.name, msg, origin, attempt)

    def _follow(self, outcome: Follow) -> None:
        """Hand a record of a blocked key off unhandled behind its key's predecessor (key order's writes);
        refused as too large by itself, it goes to the DLQ unhandled, and its key waits behind the same record."""
        writes = self.key_writes
        assert writes is not None
        msg = outcome.msg
        epoch = self._track(msg.tp, msg.offset)

        def too_large(error: str) -> None:
            self._send(too_large_follower_job(outcome, epoch=epoch, error=error, now_ms=self._now_ms()))

        writes.follow(outcome, functools.partial(self.finisher.acked, msg.tp, msg.offset, epoch), too_large)

    def _park(self, tp: TopicPartition, offset: int) -> None:
        """Track a record key order parked (its outcome comes later, after records of its partition that
        follow it): nothing is committed past it until that outcome finishes it."""
        parked = self._parked.setdefault(tp, {})
        if offset not in parked:  # parked again after it was taken back: tracked already
            parked[offset] = self.finisher.track(tp, offset)

    def _track(self, tp: TopicPartition, offset: int) -> int:
        parked = self._parked.get(tp) if self._parked else None
        if parked:
            epoch = parked.pop(offset, None)
            if epoch is not None:
                return epoch
        return self.finisher.track(tp, offset)

    def _count(self, tp: TopicPartition, first: int, last: int, count: int) -> _Counted:
        counted = self._handled.get(tp)
        if counted is None:
            counted = self._handled[tp] = _Counted(first)
        counted.count += count
        counted.last = last
        return counted

    # -- acknowledgements ----------------------------------------------------------------------------------

    def _acknowledged(self, jobs: list[PublishJob]) -> None:
        """The publisher acknowledged `jobs`: each is finished (a key-ordered record once its key-state
        records are durable too: write before commit) and announced."""
        if not jobs:
            return
        writes, acked = self.key_writes, self.finisher.acked
        for job in jobs:
            at = None
            if writes is not None and job.context is not None and writes.chains.ordered(job.source[0]):
                at = origin_of(job.context)
            if at is None:
                acked(job.source, job.offset, job.epoch)
            else:
                assert writes is not None
                landed = job.route.retry.tier if job.route.kind is RouteKind.TIER else None
                writes.write(
                    writes.chains.acked(at, landed), functools.partial(acked, job.source, job.offset, job.epoch)
                )
            self._announce(job)
        self._report_retried()

    def _announce(self, job: PublishJob) -> None:
        """A durable hand-off: a retry is counted (`_report_retried` sums them), a DLQ publish announced."""
        r = job.route
        topic, partition = job.source
        if r.kind is RouteKind.TIER:
            key = (topic, partition, r.topic)
            self._retried[key] = self._retried.get(key, 0) + 1
            if self._each_retried:
                self._emitter.emit_each(
                    Event.RETRY_SCHEDULED,
                    consumer=self._settings.name,
                    due_at=r.due_at_ms,
                    topic=topic,
                    partition=partition,
                    offset=job.offset,
                    destination=r.topic,
                )
            return
        where = {"topic": topic, "partition": partition, "offset": job.offset, "destination": r.topic}
        self._emit(Event.DLQ_DISPATCHED, reason=str(r.reason), **where)
        if self._on_dead_letter is not None:
            try:
                self._on_dead_letter(job.context, r)
            except Exception:
                log.exception("on_dead_letter callback failed for %s", where)

    def _committed(self, commit: Commit | None) -> None:
        """Announce what a commit made durable (a transaction's hand-offs), then the commit itself."""
        if commit is None:
            return
        for job in commit.jobs:
            self._announce(job)
        self._report_retried()
        if commit.offsets:
            self._emit(Event.OFFSETS_COMMITTED, offsets=dict(commit.offsets), synchronous=commit.synchronous)

    def _report_retried(self) -> None:
        """Emit one `retries.scheduled` per source partition and tier announced since the last report (one
        producer poll's acknowledgements, or one transaction's)."""
        if not self._retried:
            return
        retried, self._retried = self._retried, {}
        for (topic, partition, destination), count in retried.items():
            self._emit(Event.RETRIES_SCHEDULED, topic=topic, partition=partition, destination=destination, count=count)

    # -- the loop's calls ----------------------------------------------------------------------------------

    def report_handled(self) -> None:
        """Emit one `records.handled` and one `records.failed` per partition counted since the last report (one
        poll batch)."""
        if self._failures:
            failures, self._failures = self._failures, {}
            for (topic, partition), f in failures.items():
                self._emit(
                    Event.RECORDS_FAILED,
                    topic=topic,
                    partition=partition,
                    count=f.count,
                    lateness_ms=tuple(f.lateness_ms),
                )
        if not self._handled:
            return
        handled, self._handled = self._handled, {}
        for (topic, partition), c in handled.items():
            self._emit(
                Event.RECORDS_HANDLED,
                topic=topic,
                partition=partition,
                count=c.count,
                first_offset=c.first,
                last_offset=c.last,
                lateness_ms=tuple(c.lateness_ms),
            )

    def serve(self, *, within_batch: bool = False) -> None:
        """Serve delivery reports (key order's writes first), and let the finisher commit what they finished
        (within a batch: spaced)."""
        writes = self.key_writes
        keyed = writes is not None and writes.in_flight > 0
        if keyed:
            assert writes is not None
            writes.serve()
        elif within_batch and not self.publisher.in_flight:
            return  # nothing pending: the common case after a success
        if self._serve_now(within_batch):
            self._acknowledged(self.publisher.poll(0))
        elif not keyed:
            return  # delivery reports free offsets; nothing to serve when none are pending
        if (commit := self.finisher.served(within_batch=within_batch)) is not None:
            self._committed(commit)

    def _serve_now(self, within_batch: bool) -> bool:
        """Whether to poll the producer now: always between batches; within one, only while hand-offs are in
        flight, and at most every `_SERVE_SPACING_S`."""
        if not within_batch:
            return True
        if not self.publisher.in_flight:
            return False
        now = self._monotonic()
        if now - self._served_at < _SERVE_SPACING_S:
            return False
        self._served_at = now
        return True

    def polled(self, polled: Polled) -> None:
        """A poll's records were delivered (none: it was idle); the finisher learns how far each partition was
        read, and may commit a settled partition's tail (runtime/handoff/tails.py)."""
        messages, runs = polled
        # a partition's records come in offset order: its last one wins (attributes: `tp` builds a tuple per record)
        read_to = {(m.topic, m.partition): m.offset + 1 for m in messages}
        for run in runs:
            last = run[-1]
            read_to[(last.topic, last.partition)] = last.offset + 1
        if (commit := self.finisher.polled(read_to)) is not None:
            self._committed(commit)

    def wait_ms(self, wait_ms: int) -> int:
        writes = self.key_writes
        in_flight = bool(self.publisher.in_flight or (writes is not None and writes.in_flight))
        return self.finisher.wait_ms(wait_ms, in_flight=in_flight)

    def end_batch(self) -> None:
        """Report the batch's counts and end it as the finisher does (a commit, a transaction's commit, or its
        acknowledgements, after waiting for its publishes)."""
        settle_s = self.finisher.settle_wait_s
        if settle_s is not None:
            self._settle(settle_s)
        self.report_handled()
        if self._dead_letters:
            self._before_commit()
        if (commit := self.finisher.end_batch()) is not None:
            self._committed(commit)

    def _settle(self, wait_s: float) -> None:
        """Wait (at most `wait_s`) for the batch's publishes; what is not acknowledged then is dropped and
        given back (`Finisher.unacknowledged`)."""
        publisher = self.publisher
        self._acknowledged(publisher.poll(0))
        deadline = self._monotonic() + wait_s
        while publisher.awaiting_report and self._monotonic() < deadline:
            self._acknowledged(publisher.poll(0.01))
        self.finisher.unacknowledged(publisher.drop_all())

    def _before_commit(self) -> None:
        """Acknowledge the open transaction's dead letters to key order, in it (see `_dead_letters`)."""
        writes = self.key_writes
        if writes is not None and self._dead_letters:
            dead_letters, self._dead_letters = self._dead_letters, []
            for at in dead_letters:
                writes.write(writes.chains.acked(at, None))

    def reading_key_state(self) -> None:
        self._before_commit()
        self._committed(self.finisher.reading_key_state())

    def revoked(self, tps: list[TopicPartition]) -> None:
        """Wait for the in-flight hand-offs (and key order's writes they wait for), then let the finisher
        commit what is finished."""
        drain_s = self._settings.revoke_drain_timeout_s
        self.publisher.flush(drain_s)
        self._acknowledged(self.publisher.take_acked())
        if self.key_writes is not None:  # the key-state writes those acknowledgements wait for
            self.key_writes.flush(drain_s)
        self._before_commit()
        self._committed(self.finisher.revoked(tps))
        self._forget_parked(tps)

    def lost(self, tps: list[TopicPartition]) -> None:
        self.finisher.lost(tps)  # nothing may be committed for them any more; their acks are ignored (epochs)
        self._forget_parked(tps)
        self._dead_letters = []

    def _forget_parked(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._parked.pop(tp, None)

    def crashed(self, cause: BaseException) -> None:
        self.finisher.crashed(cause)
        self._dead_letters = []

    def shutdown(self) -> None:
        """A finisher that settles each batch ends the last one; the others' publishes are drained (their
        acknowledgements finish their records) before the finisher's last commit."""
        if self.finisher.settle_wait_s is not None:
            self.end_batch()
        else:
            self._drain(self._settings.drain_timeout_s)
        self._committed(self.finisher.shutdown())

    def _drain(self, timeout_s: float) -> None:
        drained = self.publisher.flush(timeout_s)
        self._acknowledged(self.publisher.take_acked())
        if self.key_writes is not None and not self.key_writes.flush(timeout_s):
            log.warning(
                "%s: key-order writes unacknowledged at shutdown; their offsets stay uncommitted", self._settings.name
            )
        if not drained:
            log.warning(
                "%s: %d publishes unacknowledged at shutdown; their offsets stay uncommitted",
                self._settings.name,
                self.publisher.in_flight,
            )

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self._settings.name, **data)


def suppressed(emitter: Emitter, consumer: str, msg: Message, origin_message_id: str, attempt: int) -> None:
    """The `duplicate.suppressed` event of a record finished without a call."""
    emitter.emit(
        Event.DUPLICATE_SUPPRESSED,
        consumer=consumer,
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        origin_message_id=origin_message_id,
        reconsume_times=attempt,
    )
