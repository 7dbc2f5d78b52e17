"""The consumer loop shared by main and tier consumers: poll, act on each record, hand failures off, commit.

One loop = one consumer + one producer + one thread. Per iteration:

1. serve producer delivery reports; hold partitions whose publish is failing, release them when it succeeds;
2. resume partitions whose head record is due; `consume()` for at most min(next due time, max_wait);
3. for each record: read its retry state (malformed → DLQ `invalid_retry_headers`), suppress a duplicate
   hop, pause the partition if the record is not due, else decode and call the handler;
   success → finished; failure → `route()` → produce, finished only when the broker acknowledges;
4. commit the finished prefix asynchronously, by count or by time (exactly-once: commit the transaction).

Records of a main topic carry no retry state (incoming `retry.*` headers are ignored there), so the same
loop serves both kinds of consumer; only tier records are ever paused.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from dataclasses import dataclass
from typing import Any

from retrytopics.dedupe import AuditKey, DuplicateAudit, audit_key, hand_off_key
from retrytopics.errors import HeaderDecodeError, KafkaClientError
from retrytopics.events import Emitter, Event
from retrytopics.headers import RetryHeaders, decode_lineage
from retrytopics.offsets import OffsetTracker, TopicPartition
from retrytopics.ports import ConsumerPort, Message, ProducerPort
from retrytopics.router import described_failure, longest_wait_ms, origin_message_id, read_retry_state, route
from retrytopics.runtime.batching import Deferred, DeferredCalls
from retrytopics.runtime.dispatch import Binding, Invoker, build_record, inbound
from retrytopics.runtime.handoff import AtLeastOnce, ExactlyOnce, HandOff
from retrytopics.runtime.ownership import OwnershipCheck
from retrytopics.step import Action, decide
from retrytopics.runtime.publish import PublishJob, too_large_fallback
from retrytopics.runtime.pausing import PauseController
from retrytopics.runtime.seeding import TailReader, destinations, seed
from retrytopics.runtime.tally import HandledTally

__all__ = ["ConsumerLoop", "DeadLetterCallback", "LoopSettings"]

log = logging.getLogger("retrytopics.runtime")

#: `on_dead_letter(record, route)`, called once the DLQ publish is acknowledged.
DeadLetterCallback = Callable[[Any, Any], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSettings:
    """How one consumer loop runs."""

    name: str
    group_id: str
    topics: tuple[str, ...]
    batch_size: int = 500
    commit_every: int = 500
    commit_interval_ms: int = 1000
    max_wait_ms: int = 1000
    drain_timeout_s: float = 10.0
    revoke_drain_timeout_s: float = 5.0
    exactly_once: bool = False
    #: a tier record due within this many ms waits in memory rather than in Kafka (0: always in Kafka)
    wait_in_memory_ms: int = 1000
    #: at most this many records wait in memory per partition
    wait_in_memory_records: int = 2000
    #: the loop reports itself unhealthy while its consumer has not joined the group this long after starting
    join_timeout_s: float = 60.0
    #: records read per partition of each destination when partitions are assigned (0: no seeding; see
    #: runtime/seeding.py), and for at most this long
    seed_last: int = 1000
    seed_timeout_s: float = 5.0
    #: at-least-once: commit as soon as a poll delivered acknowledgements of hand-offs (see `_commit_acked`)
    commit_on_ack: bool = True


class ConsumerLoop:
    """Runs one consumer until `stop` is set (see the module docstring)."""

    def __init__(
        self,
        settings: LoopSettings,
        bindings: Mapping[str, Binding],
        *,
        consumer_factory: Callable[[], ConsumerPort],
        producer_factory: Callable[[], ProducerPort],
        emitter: Emitter,
        stop: threading.Event,
        audit: DuplicateAudit,
        on_dead_letter: DeadLetterCallback | None = None,
        tail_reader: TailReader | None = None,
    ) -> None:
        self.settings = settings
        self._bindings = dict(bindings)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._emitter = emitter
        self._stop = stop
        self._audit = audit
        self._on_dead_letter = on_dead_letter
        self._tail_reader = tail_reader if not settings.exactly_once else None  # see runtime/seeding.py
        self._handed_off = DuplicateAudit()  # hops found downstream when partitions were assigned
        self._tracker = OffsetTracker()
        self._invoker = Invoker(stop)
        self._rng = random.Random()
        self._assigned: set[TopicPartition] = set()
        self._polled_at = time.monotonic()
        self._ownership: OwnershipCheck | None = None
        self._abandoned = False
        self._handled = HandledTally()
        self._deferred = DeferredCalls()  # records of batch handlers waiting for their call
        self._each_handled = emitter.wants(Event.RECORD_HANDLED)
        self.crash: BaseException | None = None
        self.running = False
        self._started_at: float | None = None
        self._joined = False  # set by the first assignment, even an empty one: the group answered
        self._join_reported = False
        self._consumer: ConsumerPort
        self._handoff: HandOff | None = None  # made with the clients (runtime/handoff.py)
        self._pauses: PauseController[tuple[RetryHeaders | None, HeaderDecodeError | None]] | None = None

    # -- state for the app -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False after a crash, while a publish is failing, or while the consumer has not joined its group
        `join_timeout_s` after starting (an unreachable bootstrap, say: librdkafka retries it forever)."""
        if self.crash is not None or not self._joined_in_time():
            return False
        return self._handoff is None or self._handoff.publisher.healthy

    def _joined_in_time(self) -> bool:
        if self._joined or self._started_at is None:
            return True
        late = time.monotonic() - self._started_at > self.settings.join_timeout_s
        if late and not self._join_reported:
            self._join_reported = True
            log.error("%s: not in group %r %.0fs after starting (is the bootstrap reachable?); unhealthy until "
                      "it joins", self.settings.name, self.settings.group_id, self.settings.join_timeout_s)  # fmt: skip
        return not late

    @property
    def paused_partitions(self) -> int:
        return len(self._pauses.paused) if self._pauses is not None else 0

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Consume until `stop` is set or a handler raises a BaseException; then drain, commit and close.

        Creating the clients is inside the crash handling: a consumer or producer that cannot be created
        (bad settings, a transactional producer whose broker never answers) stops the app with `crash` set,
        rather than ending this thread silently while the app reports itself running and healthy."""
        self.running = True
        self._started_at = time.monotonic()
        try:
            self._start_clients()
            self._emit(Event.CONSUMER_STARTED, group=self.settings.group_id, topics=list(self.settings.topics))
            while not self._stop.is_set():
                self._iterate()
        except BaseException as exc:  # noqa: BLE001 - recorded, re-raised by the app after a clean shutdown
            self.crash = exc
            if isinstance(exc, Exception):
                log.error("%s: stopping the app after an unexpected error", self.settings.name, exc_info=exc)
            else:
                log.warning("%s: stopping the app: %s raised in a handler", self.settings.name, type(exc).__name__)
            self._stop.set()
            if self._handoff is not None:
                self._handoff.crashed(exc)
        finally:
            self._shutdown()

    def _start_clients(self) -> None:
        consumer = self._consumer = self._consumer_factory()
        self._pauses = PauseController(
            consumer, self._emitter, consumer_name=self.settings.name,
            ahead_ms=self.settings.wait_in_memory_ms, max_records=self.settings.wait_in_memory_records,
        )  # fmt: skip
        shared = (self.settings, consumer, self._tracker, self._audit, self._emitter, self._on_dead_letter,
                  self._producer_factory)  # fmt: skip
        handoff: HandOff = (ExactlyOnce(*shared, pauses=self._pauses, assigned=self._assigned)
                            if self.settings.exactly_once else AtLeastOnce(*shared))  # fmt: skip
        self._handoff = handoff
        self._ownership = OwnershipCheck(consumer, self._tracker, committed_only=handoff.commits_in_transactions)
        consumer.subscribe(self.settings.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _iterate(self) -> None:
        assert self._handoff is not None and self._pauses is not None
        handoff = self._handoff
        handoff.serve()
        self._update_holds()
        now = _now_ms()
        self._pauses.resume_due(now)
        if not self._woke_expelled(time.monotonic() - self._polled_at, []):
            self._act_on_queued(now)
        wait_ms = handoff.wait_ms(self._pauses.wait_ms(_now_ms(), self.settings.max_wait_ms))
        asked = time.monotonic()
        batch = self._consumer.consume(self.settings.batch_size, wait_ms / 1000)
        self._polled_at = time.monotonic()
        self._abandoned = False
        # Judged from before the wake: a consume() that overran its timeout by more than half the session
        # was frozen in it (SIGSTOP, a VM pause), and its return says nothing about membership yet.
        if self._woke_expelled(self._polled_at - asked - wait_ms / 1000, batch):
            self._end_batch()
            return
        pauses = self._pauses
        for i, msg in enumerate(batch):
            if self._stop.is_set():
                break
            if pauses.accept(msg):
                self._read(msg)
            if self._abandoned:
                self._restart_at(batch[i:])
                break
            handoff.serve(within_batch=True)
            if not (i + 1) % _DUE_CHECK_EVERY and pauses.any_queued_due(now := _now_ms()):
                # Records waiting in memory fall due while a large batch is read: serve them in between.
                self._act_on_queued(now, refill=False)
                if self._abandoned:
                    self._restart_at(batch[i + 1 :])
                    break
        self._settle_deferred()
        self._end_batch()

    def _act_on_queued(self, now_ms: int, *, refill: bool = True) -> None:
        """Act on the records waiting in memory that are due (see runtime/pausing.py)."""
        assert self._pauses is not None
        for msg, (state, bad) in self._pauses.take_due(now_ms, refill=refill):
            self._process(msg, state, bad, queued=True)
            if self._abandoned:
                self._restart_at([msg])  # drops what queued behind it, too
                break
            if self._stop.is_set():
                break
            if self._handoff is not None and self._handoff.publisher.in_flight:
                self._handoff.publisher.poll(0)
        self._settle_deferred()

    def _read(self, msg: Message) -> None:
        binding = self._bindings[msg.topic]
        if msg.topic == binding.topic:  # a source record carries no retry state the router would read
            self._process(msg, None, None, queued=False)
            return
        state: RetryHeaders | None = None
        bad: HeaderDecodeError | None = None
        try:
            state = read_retry_state(binding.ctx, inbound(msg), now_ms=_now_ms())
        except HeaderDecodeError as exc:
            bad = exc
        self._process(msg, state, bad, queued=False)

    def _process(self, msg: Message, state: RetryHeaders | None, bad: HeaderDecodeError | None, *, queued: bool) -> None:
        """Decide what to do with `msg` (retrytopics/step.py, pure) and do it."""
        assert self._pauses is not None
        binding = self._bindings[msg.topic]
        now = _now_ms()
        key = None if state is None else audit_key(state)
        due = self._due_at(binding, msg, state, now)
        behind = not queued and self._pauses.queued(msg.tp)  # earlier records of its partition wait in memory
        action = decide(
            behind_queue=behind, handed_off=not behind and self._was_handed_off(msg, state, bad),
            duplicate=key is not None and (key in self._audit or key in self._deferred.keys),
            due_ms=due, now_ms=now, horizon_ms=self._pauses.ahead_ms,
        )  # fmt: skip
        if action is Action.HANDLE:
            self._handle(binding, msg, key, state, bad)
        elif action is Action.FINISH_HANDED_OFF:
            self._finish_handed_off(msg, state)
        elif action is Action.SUPPRESS_DUPLICATE:
            assert state is not None
            self._suppress(msg, state)
        elif self._before_acting(msg.tp):  # the partition waits: what is deferred for it is settled first
            if action is Action.PAUSE:
                assert due is not None
                self._pauses.pause_until(msg.tp, msg.offset, due)
            else:
                self._pauses.enqueue(msg, due, (state, bad), now)

    def _handle(
        self, binding: Binding, msg: Message, key: AuditKey | None, state: RetryHeaders | None,
        bad: HeaderDecodeError | None,
    ) -> None:  # fmt: skip
        """Call the handler (or defer the record to its batch handler's call), then settle the outcome."""
        record, poison = build_record(binding, msg, state)
        failure: BaseException | None = bad or poison
        if binding.batch:
            self._deferred.add(Deferred(binding, msg, key, record, state, failure))
            return
        if failure is None:
            try:
                self._invoker.call(binding, record)
            except Exception as exc:  # noqa: BLE001 - every handler failure is routed; BaseException stops the app
                failure = exc
            # Tracked only now: a record this consumer may no longer act on must not hold its partition's
            # commit position, since it is read again (here or by the new owner), not finished.
            if self._lost_ownership(msg) or (failure is not None and self._stopping(msg, failure)):
                return
        self._settle(binding, msg, key, record, state, failure)

    def _settle(
        self, binding: Binding, msg: Message, key: AuditKey | None, record: Any, state: RetryHeaders | None,
        failure: BaseException | None,
    ) -> None:  # fmt: skip
        """After the handler call (or a failure before any): finish the record, or route and hand it off."""
        # handled_at - due_at is the lateness metric, which only retried records have
        timing = {"due_at": state.due_at, "handled_at": _now_ms()} if state is not None else _NO_TIMING
        if failure is None:
            self._succeeded(msg, key, record, timing)
            return
        epoch = self._track(msg)
        if key is not None:
            self._remember(key)
        self._emit(Event.RECORD_FAILED, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                   attempt=record.attempt, error=type(described_failure(failure)).__name__, **timing)  # fmt: skip
        self._hand_off(binding, msg, epoch, record, failure)

    def _before_acting(self, tp: TopicPartition) -> bool:
        """Settle what is deferred for `tp` before anything else happens to it (runtime/batching.py); False
        when that lost this consumer the partition's ownership (the caller then leaves the record alone)."""
        if self._deferred.holds(tp):
            self._settle_deferred(tp)
        return not self._abandoned

    def _settle_deferred(self, tp: TopicPartition | None = None) -> None:
        """Call the batch handlers on the records deferred for `tp` (default: all), one call per partition."""
        for group in self._deferred.take(tp):
            self._call_group(group)

    def _call_group(self, group: list[Deferred]) -> None:
        first = group[0]
        assert self._pauses is not None
        if self._abandoned or self._stop.is_set():  # not acted on: read again, here or by the new owner
            if not self._stop.is_set():
                self._pauses.restart_at(first.msg.tp, first.msg.offset)
            return
        called = [d for d in group if d.failure is None]
        outcomes = self._invoker.call_batch(first.binding, [d.record for d in called]) if called else []
        if called and self._lost_ownership(first.msg):
            self._pauses.restart_at(first.msg.tp, first.msg.offset)
            return
        if len(called) == len(group) and all(o is None for o in outcomes):
            self._all_succeeded(group)
            return
        results = iter(outcomes)
        for d in group:
            failure = d.failure if d.failure is not None else next(results)
            if failure is not None and self._stopping(d.msg, failure):
                return  # this record and the rest of the group stay unsettled, so uncommitted
            self._settle(d.binding, d.msg, d.key, d.record, d.state, failure)

    def _all_succeeded(self, group: list[Deferred]) -> None:
        """Every record of a batch call succeeded: finished and counted in one step."""
        tp = group[0].msg.tp
        assert self._handoff is not None
        self._handoff.succeeded_run(tp, [d.msg.offset for d in group])
        now = _now_ms()
        lateness = [now - d.state.due_at for d in group if d.state is not None and d.state.due_at is not None]
        for d in group:
            if d.key is not None:
                self._remember(d.key)
            if self._each_handled:
                self._emit(Event.RECORD_HANDLED, topic=d.msg.topic, partition=d.msg.partition, offset=d.msg.offset,
                           attempt=d.record.attempt, due_at=d.state.due_at if d.state else None,
                           handled_at=now if d.state else None)  # fmt: skip
        self._handled.add_run(tp, group[0].msg.offset, group[-1].msg.offset, len(group), lateness)

    def _succeeded(self, msg: Message, key: AuditKey | None, record: Any, timing: Mapping[str, Any]) -> None:
        """A handler call returned: the record is finished, and counted for the batch's `records.handled`."""
        assert self._handoff is not None
        self._handoff.succeeded(msg.tp, msg.offset)
        if key is not None:
            self._remember(key)
        due_at = timing["due_at"]
        self._handled.add(msg.tp, msg.offset, None if due_at is None else timing["handled_at"] - due_at)
        if self._each_handled:  # a hook asked for one event per record
            self._emit(Event.RECORD_HANDLED, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                       attempt=record.attempt, **timing)  # fmt: skip

    def _due_at(self, binding: Binding, msg: Message, state: RetryHeaders | None, now: int) -> int | None:
        """When `msg` is due here: its `retry.due_at`, bounded by its tier's longest delay from when this
        consumer first saw it (runtime/pausing.py); a record due already costs one comparison."""
        if state is None or state.due_at is None or state.due_at <= now:
            return None if state is None else state.due_at
        assert self._pauses is not None
        return self._pauses.bounded_due(msg, state.due_at, longest_wait_ms(binding.ctx, msg.topic) or 0, now)

    def _hand_off(self, binding: Binding, msg: Message, epoch: int, record: Any, failure: BaseException) -> None:
        decision = route(binding.ctx, inbound(msg), failure, now_ms=_now_ms(), rng=self._rng)
        job = PublishJob(
            route=decision, key=msg.key, value=msg.value, source=msg.tp, offset=msg.offset, context=record,
            shrink=too_large_fallback(binding.ctx),
        )  # fmt: skip
        assert self._handoff is not None
        self._handoff.hand_off(job, epoch)

    def _suppress(self, msg: Message, state: RetryHeaders) -> None:
        if not self._before_acting(msg.tp):
            return
        epoch = self._track(msg)
        self._finish(msg.tp, msg.offset, epoch)
        log.info(
            "%s: duplicate suppressed: %s[%d]@%d repeats %s[%d]@%d attempt %d (a republish was duplicated by a crash)",
            self.settings.name, msg.topic, msg.partition, msg.offset, state.original_topic, state.original_partition,
            state.original_offset, state.reconsume_times,
        )  # fmt: skip
        self._emit(Event.DUPLICATE_SUPPRESSED, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                   origin_message_id=state.origin_message_id, reconsume_times=state.reconsume_times)  # fmt: skip

    def _was_handed_off(self, msg: Message, state: RetryHeaders | None, bad: HeaderDecodeError | None) -> bool:
        """Whether the record's hand-off is among the hops found downstream at assignment: a previous owner
        handled it and handed it off, then died before committing it (see runtime/seeding.py)."""
        if not self._handed_off or bad is not None:
            return False
        lineage = state.lineage if state is not None else decode_lineage(list(msg.headers))
        return hand_off_key(state, (msg.topic, msg.partition, msg.offset), lineage.replay_count) in self._handed_off

    def _finish_handed_off(self, msg: Message, state: RetryHeaders | None) -> None:
        """Finish a record handed off already, counted as a suppressed duplicate."""
        if not self._before_acting(msg.tp):
            return  # left alone: read again with the rest
        epoch = self._track(msg)
        self._finish(msg.tp, msg.offset, epoch)
        log.info("%s: duplicate suppressed: %s[%d]@%d was handed off already (found downstream at assignment)",
                 self.settings.name, msg.topic, msg.partition, msg.offset)  # fmt: skip
        if state is None:
            origin, attempt = origin_message_id(self._bindings[msg.topic].ctx, inbound(msg)), 0
        else:
            origin, attempt = state.origin_message_id, state.reconsume_times
        self._emit(Event.DUPLICATE_SUPPRESSED, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                   origin_message_id=origin, reconsume_times=attempt)  # fmt: skip

    def _track(self, msg: Message) -> int:
        if self._deferred:
            self._before_acting(msg.tp)
        assert self._handoff is not None
        return self._handoff.track(msg.tp, msg.offset)

    def _finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        assert self._handoff is not None
        self._handoff.finish(tp, offset, epoch)

    def _remember(self, key: AuditKey) -> None:
        assert self._handoff is not None
        self._handoff.remember(key)

    def _lost_ownership(self, msg: Message) -> bool:
        """True when this consumer may no longer act on `msg` (`runtime/ownership.py` says why)."""
        assert self._ownership is not None
        why = self._ownership.lost(time.monotonic() - self._polled_at)
        if why is None:
            return False
        log.warning(
            "%s: handling %s[%d]@%d %s; the record is neither handed off nor committed here, and is read again "
            "by whoever owns its partition now",
            self.settings.name, msg.topic, msg.partition, msg.offset, why,
        )  # fmt: skip
        self._abandoned = True
        self._emit(Event.RECORD_ABANDONED, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return True

    def _woke_expelled(self, gap_s: float, batch: list[Message]) -> bool:
        """After a gap of `gap_s` in which this consumer did nothing (the process was frozen), ask the group
        coordinator before touching a record: librdkafka delivers `partitions.lost` only some ms after the
        wake, and records waiting in memory, or fetched before the freeze, would be handed off meanwhile by
        a consumer that owns nothing (measured: 3 in 40 freezes). Expelled: nothing is acted on; the queued
        records and `batch` are read again by whoever owns their partitions now. Costs a clock read unless
        the gap was long enough for the session to lapse."""
        assert self._ownership is not None and self._pauses is not None
        if not self._ownership.may_have_lapsed(gap_s):
            return False
        starts = self._pauses.queue_starts()
        for msg in batch:
            starts[msg.tp] = min(starts.get(msg.tp, msg.offset), msg.offset)
        if not starts:
            return False  # nothing kept from before the gap: nothing to protect, nothing to ask
        why = self._ownership.lost(gap_s, unsure_is_lost=True)
        if why is None:
            return False
        log.warning(
            "%s: woke after a %.1fs gap in polling (%s); the records of %d partitions in memory are not acted on "
            "here and are read again by whoever owns their partitions now", self.settings.name, gap_s, why,
            len(starts),
        )  # fmt: skip
        for tp, offset in starts.items():
            self._emit(Event.RECORD_ABANDONED, topic=tp[0], partition=tp[1], offset=offset)
            self._pauses.restart_at(tp, offset)
        return True

    def _restart_at(self, rest: list[Message]) -> None:
        """After an abandoned record: read it and the rest of the batch again. librdkafka only leaves the
        group once its own max.poll timer fires (up to ~0.5 s late, measured), and the next poll resets that
        timer, so a consumer that abandoned a record may well still own its partition; without this seek,
        the record was never read again and the partition's commit position stuck below it for good."""
        assert self._pauses is not None
        # first the records deferred for batch handlers, which come before `rest` in their partitions (a
        # partition keeps the first restart point it is given)
        self._settle_deferred()
        starts: dict[TopicPartition, int] = {}
        for msg in rest:
            starts.setdefault(msg.tp, msg.offset)
        for tp, offset in starts.items():
            self._pauses.restart_at(tp, offset)

    def _stopping(self, msg: Message, failure: BaseException) -> bool:
        """True when the handler failed while the app is stopping (SIGTERM arrived mid-call): the failure may
        be the shutdown's doing, so it is no verdict on the record. It is neither handed off (no DLQ record)
        nor committed; the next run reads it again."""
        if not self._stop.is_set():
            return False
        log.warning(
            "%s: %s[%d]@%d failed while stopping (%s); not handed off, left uncommitted for the next run",
            self.settings.name, msg.topic, msg.partition, msg.offset, type(failure).__name__,
        )  # fmt: skip
        self._emit(Event.RECORD_ABANDONED, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return True

    def _update_holds(self) -> None:
        assert self._handoff is not None and self._pauses is not None
        for tp in list(self._assigned):
            failing, held = self._handoff.publisher.is_failing(tp), self._pauses.schedule.is_held(tp)
            if failing and not held:
                self._pauses.hold(tp, None)
            elif held and not failing:
                self._pauses.release(tp)

    # -- commits (runtime/handoff.py) -------------------------------------------------------------------------

    def _end_batch(self) -> None:
        self._handled.flush(self._emit)
        assert self._handoff is not None
        self._handoff.end_batch()

    # -- rebalance callbacks (run inside consume()) ---------------------------------------------------------

    def _on_assign(self, tps: list[TopicPartition]) -> None:
        assert self._pauses is not None
        self._joined = True
        for tp in tps:
            self._tracker.assign(tp)
        self._pauses.drop(tps)
        self._assigned.update(tps)
        if self._tail_reader is not None:
            seed(self._handed_off, self._tail_reader, destinations(self._bindings, tps),
                 last=self.settings.seed_last, timeout_s=self.settings.seed_timeout_s)  # fmt: skip
        self._emit(Event.PARTITIONS_ASSIGNED, partitions=tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        assert self._handoff is not None
        self._handoff.revoked(tps)
        self._forget(tps)
        self._emit(Event.PARTITIONS_REVOKED, partitions=tps)

    def _on_lost(self, tps: list[TopicPartition]) -> None:
        assert self._handoff is not None
        self._handoff.lost(tps)
        self._forget(tps)
        self._emit(Event.PARTITIONS_LOST, partitions=tps)

    def _forget(self, tps: list[TopicPartition]) -> None:
        assert self._handoff is not None and self._pauses is not None
        for tp in tps:
            self._tracker.revoke(tp)
        self._pauses.drop(tps)
        self._handoff.publisher.forget(tps)
        self._assigned.difference_update(tps)

    # -- shutdown ------------------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._handled.flush(self._emit)
        try:
            if self._handoff is not None:
                self._handoff.shutdown()
        except BaseException:  # noqa: BLE001 - closing the consumer matters more
            log.exception("%s: error while draining", self.settings.name)
        finally:
            try:
                consumer: ConsumerPort | None = getattr(self, "_consumer", None)  # None: its creation failed
                if consumer is not None:
                    consumer.close()
            except KafkaClientError as exc:
                log.warning("%s: close failed: %s", self.settings.name, exc)
            self._invoker.close()
            self.running = False
            self._emit(Event.CONSUMER_STOPPED, group=self.settings.group_id)

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self.settings.name, **data)


#: how many records of a batch are read between two checks for records waiting in memory that fell due
_DUE_CHECK_EVERY = 32

_NO_TIMING: Mapping[str, object] = MappingProxyType({"due_at": None, "handled_at": None})


def _now_ms() -> int:
    return int(time.time() * 1000)
