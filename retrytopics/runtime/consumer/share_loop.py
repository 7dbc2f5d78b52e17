"""The main consumer as a share-group member (KIP-932, Kafka queues): any number of members read one partition,
each record is acquired under a lock and acknowledged on its own (docs/share-groups.md).

One iteration: poll a batch (every record acquired, with its delivery count); each record goes to the records
stage (`SourceStage.read`: a source record, so it is handled at once) and each outcome to the share hand-off
(runtime/handoff/acknowledge.py), which turns it into an acknowledgement; the batch ends with every record
acknowledged (the client's rule before the next poll) and the acknowledgements committed.

What partitions gave the partition-based loop, the share group gives otherwise:

- **Crash loops.** A record that kills the process is delivered again after its lock expires, each time
  with its delivery count + 1, and the broker archives it past the group's `share.delivery.count.limit`. So a
  record delivered for the limit-th time that this member never handed off goes to our DLQ as
  `delivery_limit` (with its count) instead of to its handler: one more crash and it would be gone.
- **Batch-mates of a crash.** Records acknowledged but not yet committed when the process dies come back
  too. Before the handler runs on a redelivered record, the acknowledgements made so far are committed
  synchronously; and redelivered records are handled after the fresh ones, in offset order on odd delivery
  counts and in reverse on even ones, so a record behind a crashing one in one delivery is ahead of it in
  the next: every batch-mate of a crash loop is handled within two more deliveries (a limit of at least 4;
  Kafka's default is 5). A batch handler's records are given to it by partition and offset.
- **Ownership** is the record lock, counted from the poll call that acquired the records: a call that
  outlives `share.record.lock.duration.ms` (the record may be
  another member's now; the client has no RENEW) leaves the record and the rest of the batch to be released,
  not handed off.

Tier consumers stay partition-based (runtime/consumer/loop.py): a tier waits by pausing its partitions until
the head record is due, and a share group has no partitions to pause; a released record comes back at once,
so a record not yet due would spin between members.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Container, Iterator, Mapping

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import ConfigError, DeliveryLimitReached
from retrytopics.core.ports import Message, ProducerPort, ShareConsumerPort
from retrytopics.core.router import delivery_limit_route, origin_message_id
from retrytopics.observe.events import Emitter
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.consumer.running import LoopRun
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.handoff.acknowledge import Acknowledgements, acknowledging
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff
from retrytopics.runtime.records.calls import Binding, build_record
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import Abandoned, Failed, Outcome, Waiting
from retrytopics.runtime.records.ownership import OwnershipCheck, OwnershipGuard
from retrytopics.runtime.records.source import SourceStage

__all__ = ["DEFAULT_DELIVERY_COUNT_LIMIT", "DEFAULT_LOCK_MS", "ShareConsumerLoop", "ShareLimits", "handling_order"]

log = logging.getLogger("retrytopics.runtime")

#: Kafka's defaults for a share group's `share.delivery.count.limit` and `share.record.lock.duration.ms`
DEFAULT_DELIVERY_COUNT_LIMIT = 5
DEFAULT_LOCK_MS = 30_000


class ShareLimits:
    """The group configs the loop works within, read once at start-up (`share_group_config`)."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self.delivery_count_limit = _int_config(config, "share.delivery.count.limit", DEFAULT_DELIVERY_COUNT_LIMIT)
        self.lock_ms = _int_config(config, "share.record.lock.duration.ms", DEFAULT_LOCK_MS)


def _int_config(config: Mapping[str, str], name: str, default: int) -> int:
    value = config.get(name) or ""
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(name, value, "the share group's config is not a number") from None


def handling_order(batch: list[Message], batched: Container[str] = ()) -> list[Message]:
    """The order a batch's records are handled in: first-time deliveries as acquired, then the redelivered
    ones by offset, reversed when their delivery count is even (the module docstring says why); last, the
    records of `batched` topics (a batch handler's) by partition and offset whatever their delivery counts: one
    call takes them all, so turning them around gains nothing, and a batch handler gets them in offset order."""
    single = [m for m in batch if m.topic not in batched]
    fresh = [m for m in single if (m.delivery_count or 1) <= 1]
    again = sorted((m for m in single if (m.delivery_count or 1) > 1), key=_position)
    if again and (again[0].delivery_count or 1) % 2 == 0:
        again.reverse()
    return fresh + again + sorted((m for m in batch if m.topic in batched), key=_position)


def _position(msg: Message) -> tuple[str, int, int]:
    return msg.topic, msg.partition, msg.offset


class _LockCheck(OwnershipCheck):
    """Ownership for a share consumer: a record is this member's until its lock expires, counted from the
    poll that acquired it (no group coordinator to ask, nothing to commit)."""

    def __init__(self, lock_s: float) -> None:  # no consumer to ask and no offsets: nothing of the parent's
        self._lock_s = lock_s

    @property
    def max_poll_s(self) -> float:
        return self._lock_s

    @property
    def quiet_s(self) -> float:
        return self._lock_s

    def may_have_lapsed(self, elapsed_s: float) -> bool:
        return elapsed_s > self._lock_s

    def lost(self, elapsed_s: float, *, unsure_is_lost: bool = False) -> str | None:
        if elapsed_s > self._lock_s:
            return f"took {elapsed_s:.1f}s, past the record lock ({self._lock_s:g}s): it may be another member's now"
        return None


class ShareConsumerLoop(LoopRun):
    """The main consumer of a `RetryApp(consumer="share")`: one share-group member (see the module docstring).
    `group_config()` returns the group's configs by Kafka's names (`share_group_config`), read at start-up."""

    def __init__(
        self,
        settings: LoopSettings,
        bindings: Mapping[str, Binding],
        *,
        consumer_factory: Callable[[], ShareConsumerPort],
        producer_factory: Callable[[], ProducerPort],
        group_config: Callable[[], Mapping[str, str]],
        emitter: Emitter,
        stop: threading.Event,
        audit: DuplicateAudit,
        on_dead_letter: DeadLetterCallback | None = None,
        alone_producer_factory: Callable[[], ProducerPort] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(settings, emitter, stop)
        if settings.exactly_once:
            raise ConfigError(
                "exactly_once",
                True,
                "a share group's acknowledgements are not part of a Kafka transaction; use consumer='group'",
            )
        self._bindings = dict(bindings)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._alone_producer_factory = alone_producer_factory
        self._group_config = group_config
        self._audit = audit
        self._on_dead_letter = on_dead_letter
        self._clock = clock
        self.limits: ShareLimits | None = None
        # made by `_start`
        self._consumer: ShareConsumerPort | None = None
        self._handoff: HandOff | None = None
        self._acks: Acknowledgements | None = None  # the hand-off's finisher: what is held, handed off, released

    # -- state for the app -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False after a crash, while a publish is failing, and while a handler call runs past the lock."""
        if self.crash is not None:
            return False
        if self._overdue():
            return False
        return self._handoff is None or self._handoff.publisher.healthy

    paused_partitions = 0  # nothing to pause

    # -- the loop ------------------------------------------------------------------------------------------

    def _start(self) -> Callable[[], None]:
        s, stop, clock = self.settings, self._stop, self._clock
        limits = self.limits = ShareLimits(self._group_config())
        lock_s = limits.lock_ms / 1000
        log.info(
            "%s: share group %s: delivery count limit %d, record lock %d ms; the client cannot renew a lock, so "
            "a handler call longer than the lock has its record redelivered to another member meanwhile",
            s.name,
            s.group_id,
            limits.delivery_count_limit,
            limits.lock_ms,
        )
        consumer = self._consumer = self._consumer_factory()
        handoff, acks = self._handoff, self._acks = acknowledging(
            s,
            consumer,
            self._audit,
            self._emitter,
            self._on_dead_letter,
            self._producer_factory,
            clock=clock,
            # a batch must be settled well within its lock, and before the next poll
            ack_wait_s=min(s.drain_timeout_s, lock_s / 2),
            alone_producer_factory=self._alone_producer_factory,
        )
        guard = self._guard = OwnershipGuard(
            _LockCheck(lock_s), self._emit, name=s.name, stop=stop, monotonic=clock.monotonic
        )
        stage = SourceStage(
            self._bindings,
            self._audit,
            self._invoker,
            guard,
            DuplicateCheck(self._bindings, tail_reader=None, seed_last=0, seed_timeout_s=0.0),
            clock=clock,
            rng=random.Random(),
            stop=stop,
        )
        consumer.subscribe(s.topics, on_acknowledged=acks.on_acknowledged)
        limit, wait_s = limits.delivery_count_limit, s.max_wait_ms / 1000
        batched = frozenset(topic for topic, binding in self._bindings.items() if binding.batch)

        def run_once() -> None:
            guard.in_poll = True
            called = clock.monotonic()
            batch = consumer.poll(wait_s)
            guard.polled(since=called)  # the locks run from the acquisition, somewhere inside the poll
            if not batch:
                return
            acks.hold(batch)
            owned = True  # no call has outlived the batch's locks
            for msg in handling_order(batch, batched):
                if stop.is_set():
                    break
                count = msg.delivery_count or 1
                if acks.handed_off(msg):
                    acks.accept_duplicate(msg, origin_message_id(self._bindings[msg.topic].ctx, msg))
                elif count >= limit:
                    handoff.apply(self._crash_loop(msg, count, limit))
                else:
                    if count > 1:
                        acks.commit_now()  # what is done must not come back with this record's crash
                    if not self._act_on(stage.read(msg)):
                        owned = False
                        break
                handoff.serve(within_batch=True)
            # The batch handlers are called only while the batch is still this member's: its locks expired
            # together, so after an abandoned call what is deferred is dropped uncalled and released.
            if owned:
                self._act_on(stage.settle_deferred())
            for left in stage.abandon_deferred():
                acks.release(left.msg)
            handoff.end_batch()

        return run_once

    def _act_on(self, outcomes: Iterator[Outcome]) -> bool:
        """Each outcome to the hand-off; False after an `Abandoned` (released, and so is the rest of the batch
        when it ends: their locks expire together)."""
        handoff, acks = self._handoff, self._acks
        assert handoff is not None and acks is not None
        for outcome in outcomes:
            if type(outcome) is Abandoned:
                acks.release(outcome.msg)
                return False
            if type(outcome) is Waiting:
                raise TypeError("a source record never waits")  # the records stage's rule for source topics
            handoff.apply(outcome)
        return True

    def _crash_loop(self, msg: Message, count: int, limit: int) -> Failed:
        """The outcome of a record delivered to the group's limit without a hand-off: our DLQ, `delivery_limit`."""
        binding = self._bindings[msg.topic]
        failure = DeliveryLimitReached(count, limit)
        log.warning(
            "%s: %s[%d]@%d was delivered %d times without a hand-off (limit %d): dead-lettering it as a crash loop",
            self.settings.name,
            msg.topic,
            msg.partition,
            msg.offset,
            count,
            limit,
        )
        record, _poison = build_record(binding, msg, None)
        route = delivery_limit_route(binding.ctx, msg, failure, now_ms=self._clock.now_ms())
        return Failed(msg, None, record, failure, route, binding.ctx)

    def _crashed(self, cause: BaseException) -> None:
        if self._handoff is not None:
            self._handoff.crashed(cause)

    def _drain(self) -> None:
        if self._handoff is not None:
            self._handoff.shutdown()

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
