"""The hand-off: the only part of a consumer loop that acts on outcomes (runtime/records/outcome.py) and the
only one that commits. A success is finished and counted; a failure is published to its route (a tier or the
DLQ) and finished once that is durable; a duplicate is finished without a call.

One strategy per delivery mode, behind one interface, so that the loop has no mode branches:

- `AtLeastOnce` (runtime/handoff/at_least_once.py): a success is finished at once, a failure when its
  republish is acknowledged; commits are asynchronous, by count or time, and as soon as acknowledgements
  arrive (`commit_on_ack`); a revoke waits for in-flight acks and commits synchronously; shutdown drains the
  producer and commits.
- `ExactlyOnce` (runtime/handoff/exactly_once.py): republishes and the consumed offsets commit in one
  transaction per poll batch.

Both keep an offset tracker (offsets.py); they share the duplicate audit, the per-batch counts of handled and
failed records (`records.handled` and `records.failed`, one event per partition and batch) and of acknowledged
retries (`retries.scheduled`, one per partition and tier per producer poll), and the announcements of durable
hand-offs (events, `on_dead_letter`), here in `HandOffBase`. The per-record events (`record.handled`,
`record.failed`, `retry.scheduled`) are built only when a hook asks for them one by one (`Emitter.wants`,
`Emitter.wants_each`).

A consumer model without partitions (a share group) has a hand-off of its own on the same base,
`Acknowledging` (runtime/handoff/acknowledge.py): it acknowledges each record instead of finishing offsets;
the records stage and its outcomes are the same (docs/architecture.md, "A second consumer model"). So the
base knows no consumer and no offsets: each strategy holds its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Protocol

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.headers import DlqReason, RetryHeaders
from retrytopics.core.keyorder.hops import origin_of
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, ProducerPort
from retrytopics.core.record import Record
from retrytopics.core.router import RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.ordered import KeyWrites
from retrytopics.runtime.handoff.publish import Publisher, PublishJob, too_large_fallback
from retrytopics.runtime.handoff.transactional import TransactionalPublisher
from retrytopics.runtime.records.outcome import Duplicate, Failed, Follow, Outcome, Parked, Succeeded, SucceededRun

__all__ = ["CommitSettings", "DeadLetterCallback", "HandOff", "HandOffBase"]

log = logging.getLogger("retrytopics.runtime")

#: `on_dead_letter(record, route)`, called once the DLQ publish is durable.
DeadLetterCallback = Callable[[Any, Any], None]

#: within a batch, delivery reports are served at most this often while hand-offs are in flight: a producer
#: poll after every record costs more than the rest of a success; acknowledgements then wait at most this
#: long, or until the batch ends
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
    """What the poll cycle and the rebalance callbacks ask of a strategy (see the module docstring)."""

    @property
    def publisher(self) -> Publisher | TransactionalPublisher: ...
    @property
    def commits_in_transactions(self) -> bool:
        """Offsets finished in an open transaction must not be committed outside it (ownership.py)."""

    def apply(self, outcome: Outcome) -> None:
        """Act on a `Succeeded`, `SucceededRun`, `Failed`, `Duplicate` or `Follow` outcome."""

    def report_handled(self) -> None: ...
    def serve(self, *, within_batch: bool = False) -> None: ...
    def wait_ms(self, wait_ms: int) -> int: ...
    def end_batch(self) -> None: ...
    def revoked(self, tps: list[TopicPartition]) -> None: ...
    def lost(self, tps: list[TopicPartition]) -> None: ...
    def crashed(self, cause: BaseException) -> None: ...
    def shutdown(self) -> None: ...
    def reading_key_state(self) -> None:
        """Key state is about to be read at an assignment (read_committed, up to every transaction open in it
        when the read begins): exactly-once commits its own open transaction first."""


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


class HandOffBase:
    """What both strategies do with outcomes; each strategy says how an offset is finished and a job sent."""

    def __init__(
        self,
        settings: CommitSettings,
        audit: DuplicateAudit,
        emitter: Emitter,
        on_dead_letter: DeadLetterCallback | None,
        *,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._audit = audit
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
        #: follower hops and key-state writes of key-ordered handlers; None: no such handler
        self._ordered: KeyWrites | None = None

    # -- the strategy's part -------------------------------------------------------------------------------

    def _finish_success(self, tp: TopicPartition, offset: int) -> None:
        raise NotImplementedError

    def _finish_run(self, tp: TopicPartition, offsets: list[int]) -> None:
        raise NotImplementedError

    def _finish_records(self, tp: TopicPartition, records: list[Message] | list[Record[Any]]) -> None:
        """Finish a run of successes (consecutive records of `tp`, increasing offsets): `_finish_run` of their
        offsets; a strategy whose tracker can settle the run by its first and last offsets does so instead."""
        self._finish_run(tp, [r.offset for r in records])

    def _track(self, tp: TopicPartition, offset: int) -> int:
        """Start tracking a record about to be handed off; returns the assignment epoch its hand-off carries."""
        raise NotImplementedError

    def _finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        raise NotImplementedError

    def _park(self, tp: TopicPartition, offset: int) -> None:
        """Track a record key order parked (its outcome comes later, after records of its partition that
        follow it): nothing is committed past it until that outcome finishes it."""
        raise TypeError("only the at-least-once hand-off parks records")

    def _follow(self, outcome: Follow) -> None:
        """Hand a record of a blocked key off unhandled behind its key's predecessor (key order's writes)."""
        raise NotImplementedError

    def _send(self, job: PublishJob) -> None:
        raise NotImplementedError

    def _finish_acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """Finish a hand-off whose acknowledgement (and key-state write) arrived."""
        self._finish(tp, offset, epoch)

    def _remember(self, key: AuditKey) -> None:
        self._audit.remember(key)

    # -- outcomes ------------------------------------------------------------------------------------------

    def apply(self, outcome: Outcome) -> None:
        if type(outcome) is SucceededRun:
            self._succeeded_run(outcome)
        elif type(outcome) is Succeeded:
            self._succeeded(outcome)
        elif type(outcome) is Failed:
            self._failed(outcome)
        elif type(outcome) is Duplicate:
            self._duplicate(outcome)
        elif type(outcome) is Follow and self._ordered is not None:  # a record of a blocked key, unhandled
            self._follow(outcome)
        elif type(outcome) is Parked:
            self._park(outcome.msg.tp, outcome.msg.offset)
        else:
            raise TypeError(f"the hand-off does not act on {type(outcome).__name__}")

    def _succeeded(self, outcome: Succeeded) -> None:
        msg, key, record = outcome
        ordered = self._ordered
        if (
            ordered is not None
            and ordered.chains.ordered(msg.topic)
            and (at := origin_of(record)) is not None
            and (passages := ordered.chains.succeeded(at))
        ):
            # a tier's passage is written before the offset is finished (write before commit)
            epoch = self._track(msg.tp, msg.offset)
            ordered.write(passages, lambda: self._finish_acked(msg.tp, msg.offset, epoch))
        else:
            self._finish_success(msg.tp, msg.offset)
        if key is not None:
            self._remember(key)
        state = record.retry
        now = self._now_ms() if state is not None else 0
        counted = self._count(msg.tp, msg.offset, msg.offset, 1)
        if state is not None and state.due_at is not None:
            counted.lateness_ms.append(now - state.due_at)
        if self._each_handled:
            self._handled_event(msg.topic, msg.partition, msg.offset, record.attempt, state, now)

    def _succeeded_run(self, outcome: SucceededRun) -> None:
        tp, msgs, records, keys = outcome
        self._finish_records(tp, msgs)
        for key in keys:
            self._remember(key)
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
        epoch = self._track(tp, msg.offset)
        if key is not None:
            self._remember(key)
        ordered, at = self._ordered, None
        if ordered is not None and ordered.chains.ordered(msg.topic) and (at := origin_of(record)) is not None:
            # its key waits until this hop is acknowledged; a follower dead-lettered behind its key never ran
            handled = route.reason is not DlqReason.BLOCKED_BY_KEY
            to_tier = route.retry.tier if route.kind is RouteKind.TIER else None
            ordered.write(ordered.chains.sent(at, to_tier=to_tier, handled=handled))
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
        job = PublishJob(
            route=route,
            key=msg.key,
            value=msg.value,
            source=tp,
            offset=msg.offset,
            epoch=epoch,
            # kept in flight only for `on_dead_letter`, or for key order's acknowledgement (its chain)
            context=record if self._on_dead_letter is not None or at is not None else None,
            shrink=self._shrinks.get(id(ctx)) or self._shrinks.setdefault(id(ctx), too_large_fallback(ctx)),
        )
        self._send(job)

    def _duplicate(self, outcome: Duplicate) -> None:
        msg, origin, attempt, downstream = outcome
        self._finish(msg.tp, msg.offset, self._track(msg.tp, msg.offset))
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
        self._suppressed(msg, origin, attempt)

    def _suppressed(self, msg: Message, origin_message_id: str, attempt: int) -> None:
        """The `duplicate.suppressed` event of a record finished without a call."""
        self._emit(
            Event.DUPLICATE_SUPPRESSED,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            origin_message_id=origin_message_id,
            reconsume_times=attempt,
        )

    def _count(self, tp: TopicPartition, first: int, last: int, count: int) -> _Counted:
        counted = self._handled.get(tp)
        if counted is None:
            counted = self._handled[tp] = _Counted(first)
        counted.count += count
        counted.last = last
        return counted

    def reading_key_state(self) -> None:
        return None  # at-least-once writes key state outside transactions: nothing holds a read back

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

    # -- shared steps --------------------------------------------------------------------------------------

    def _new_publisher(
        self,
        producer_factory: Callable[[], ProducerPort],
        alone_producer_factory: Callable[[], ProducerPort] | None,
    ) -> Publisher:
        """The at-least-once publisher of this consumer's hand-offs (both strategies that are not transactional)."""
        return Publisher(
            producer_factory,
            self._emitter,
            make_alone_producer=alone_producer_factory,
            clock=self._monotonic,
            consumer=self._settings.name,
        )

    def _serve_now(self, publisher: Publisher | TransactionalPublisher, within_batch: bool) -> bool:
        """Whether to poll the producer now: always between batches; within one, only while hand-offs are in
        flight, and at most every `_SERVE_SPACING_S`."""
        if not within_batch:
            return True
        if not publisher.in_flight:
            return False
        now = self._monotonic()
        if now - self._served_at < _SERVE_SPACING_S:
            return False
        self._served_at = now
        return True

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self._settings.name, **data)

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

    def _report_retried(self) -> None:
        """Emit one `retries.scheduled` per source partition and tier announced since the last report (one
        producer poll's acknowledgements, or one transaction's)."""
        if not self._retried:
            return
        retried, self._retried = self._retried, {}
        for (topic, partition, destination), count in retried.items():
            self._emit(Event.RETRIES_SCHEDULED, topic=topic, partition=partition, destination=destination, count=count)
