"""The consumer loop shared by main and tier consumers: one consumer + one producer + one thread, from start
to shutdown. It makes the clients and, once, each part that acts through them, and reports its health.

The path of a record (docs/architecture.md draws it): the poll cycle (runtime/consumer/cycle.py) consumes a
batch; the records stage (runtime/records/) reads, decides and calls the handler, yielding one outcome per
record; waiting (runtime/waiting.py) pauses partitions and queues records due soon; the hand-off
(runtime/handoff/) finishes, publishes and commits. Rebalance callbacks are runtime/consumer/rebalance.py.

Records of a main topic carry no retry state (incoming `retry.*` headers are ignored there), so the same
loop serves both kinds of consumer; only tier records are ever paused.

Every part reads time through the loop's `Clock` (runtime/clock.py): a test passes a fake one.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import ConfigError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, EndOffsetsPort, ProducerPort
from retrytopics.core.transactions import CALL_TIMEOUT_MS
from retrytopics.observe.events import Emitter
from retrytopics.runtime.bounded import BoundedCalls, BoundedCommits
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.consumer.cycle import PollCycle
from retrytopics.runtime.consumer.rebalance import GroupJoin, RebalanceListener
from retrytopics.runtime.consumer.running import LoopRun
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.handoff.at_least_once import at_least_once
from retrytopics.runtime.handoff.exactly_once import exactly_once
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff
from retrytopics.runtime.handoff.ordered import KeyWrites, OrderedHandOffs
from retrytopics.runtime.lag import LagProbe
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import DuplicateCheck, TailReader
from retrytopics.runtime.records.key_state import KeyStateReader
from retrytopics.runtime.records.ordering import PARKED_PER_PARTITION, KeyOrder, KeyStateFeed, TierOrder
from retrytopics.runtime.records.ownership import OwnershipCheck, OwnershipGuard
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["ConsumerLoop"]

log = logging.getLogger("retrytopics.runtime")


class ConsumerLoop(LoopRun):
    """Runs one consumer until `stop` is set (see the module docstring). The clients are created in `run()`
    (runtime/consumer/running.py), with everything that acts through them (`_start_clients`)."""

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
        alone_producer_factory: Callable[[], ProducerPort] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        key_state_reader: KeyStateReader | None = None,
        key_state_feed: Callable[[], KeyStateFeed] | None = None,
        end_offsets: Callable[[], EndOffsetsPort] | None = None,
    ) -> None:
        super().__init__(settings, emitter, stop)
        self._end_offsets = end_offsets  # the lag measured while partitions are paused (runtime/lag.py)
        self._clock = clock
        self._bindings = dict(bindings)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._alone_producer_factory = alone_producer_factory  # one record per batch (runtime/handoff/publish.py)
        self._audit = audit
        self._on_dead_letter = on_dead_letter
        self._tail_reader = tail_reader if not settings.exactly_once else None  # runtime/records/duplicates.py
        self._key_state = (key_state_reader, key_state_feed)  # a main consumer of key-ordered handlers
        self._key_order: tuple[KeyOrder | TierOrder, KeyWrites] | None = None
        self._tracker = OffsetTracker()
        self._assigned: set[TopicPartition] = set()
        self._join = GroupJoin(
            name=settings.name, group_id=settings.group_id, timeout_s=settings.join_timeout_s, monotonic=clock.monotonic
        )
        # made by `_start_clients`; read by the app's thread (health) and at shutdown, so None until then
        self._consumer: ConsumerPort | None = None
        self._pauses: PauseController | None = None
        self._handoff: HandOff | None = None

    # -- state for the app -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False after a crash, while a publish is failing, while the consumer is out of its group (not joined
        `join_timeout_s` after starting, or its assignment lost: the coordinator stopped answering), and while
        a poll batch (a handler call, say) runs past `max.poll.interval.ms`."""
        if self.crash is not None or not self._join.in_time():
            return False
        if self._key_order is not None and (self._key_order[0].not_started or not self._key_order[1].healthy):
            return False
        if self._overdue():
            return False
        return self._handoff is None or self._handoff.publisher.healthy

    @property
    def paused_partitions(self) -> int:
        return len(self._pauses.paused) if self._pauses is not None else 0

    # -- the loop ------------------------------------------------------------------------------------------

    def _start(self) -> Callable[[], None]:
        self._join.started()
        return self._start_clients().run_once

    def _tier_topics(self) -> list[str]:
        return sorted(t for t, binding in self._bindings.items() if binding.topic != t)

    def _crashed(self, cause: BaseException) -> None:
        if self._handoff is not None:
            self._handoff.crashed(cause)

    def _start_clients(self) -> PollCycle:
        """Create the clients, then once each part that acts through them, given what it needs."""
        s, stop, emit, clock = self.settings, self._stop, self._emit, self._clock
        calls = BoundedCalls(timeout_s=CALL_TIMEOUT_MS / 1000 + 1, name=s.name, monotonic=clock.monotonic)
        consumer = self._consumer = BoundedCommits(self._consumer_factory(), calls)
        waiting = self._pauses = PauseController(
            consumer,
            self._emitter,
            consumer_name=s.name,
            ahead_ms=s.wait_in_memory_ms,
            max_records=s.wait_in_memory_records,
        )
        shared = (s, consumer, self._tracker, self._audit, self._emitter, self._on_dead_letter, self._producer_factory)
        chains = self._make_key_order()
        writes: KeyWrites | None
        if s.exactly_once:
            handoff = exactly_once(
                *shared,
                clock=clock,
                forget_waiting=waiting.drop,
                assigned=self._assigned,
                key_chains=chains,
                rebuild_key_state=self._rebuild_key_state,
            )
            writes = handoff.key_writes
        else:
            hand_offs = None if chains is None else self._ordered_hand_offs(chains)
            handoff = at_least_once(
                *shared, clock=clock, alone_producer_factory=self._alone_producer_factory, ordered=hand_offs
            )
            writes = hand_offs
        self._handoff = handoff
        key_order = self._key_order = None if chains is None or writes is None else (chains, writes)
        check = OwnershipCheck(consumer, self._tracker, committed_only=handoff.commits_in_transactions)
        ownership = self._guard = OwnershipGuard(check, emit, name=s.name, stop=stop, monotonic=clock.monotonic)
        duplicates = DuplicateCheck(
            self._bindings, tail_reader=self._tail_reader, seed_last=s.seed_last, seed_timeout_s=s.seed_timeout_s
        )
        stage = RecordStage(
            self._bindings,
            waiting,
            self._audit,
            self._invoker,
            ownership,
            duplicates,
            clock=clock,
            rng=random.Random(),
            stop=stop,
            key_order=None if key_order is None else key_order[0],
        )
        rebalance = RebalanceListener(
            self._tracker,
            waiting,
            handoff,
            duplicates,
            emit,
            assigned=self._assigned,
            join=self._join,
            key_order=key_order,
        )
        consumer.subscribe(
            s.topics, on_assign=rebalance.on_assign, on_revoke=rebalance.on_revoke, on_lost=rebalance.on_lost
        )
        return PollCycle(
            consumer,
            stage,
            waiting,
            handoff,
            ownership,
            batch_size=s.batch_size,
            max_wait_ms=s.max_wait_ms,
            assigned=self._assigned,
            stop=stop,
            clock=clock,
            key_order=key_order,
            lag=self._lag_probe(waiting),
        )

    def _lag_probe(self, waiting: PauseController) -> LagProbe | None:
        if self._end_offsets is None:
            return None
        tracker = self._tracker

        def unhandled_from(tp: TopicPartition) -> int | None:
            start = waiting.unhandled_from(tp)
            return tracker.unhandled_from(tp) if start is None else start

        return LagProbe(
            self._end_offsets,
            self._emitter,
            consumer_name=self.settings.name,
            group_id=self.settings.group_id,
            assigned=self._assigned,
            unhandled_from=unhandled_from,
            head_due_ms=waiting.head_due_ms,
            clock=self._clock,
        )

    def _make_key_order(self) -> KeyOrder | TierOrder | None:
        """The loop's key order, when some handler it consumes is key-ordered (docs/key-ordering.md): a main
        consumer's (`KeyOrder`) or a tier consumer's (`TierOrder`)."""
        ordered = sorted(t for t, b in self._bindings.items() if b.ordering is not None)
        if not ordered:
            return None
        read, feed = self._key_state
        main = any(self._bindings[t].topic == t for t in ordered)
        if read is None or (main and feed is None):
            raise ConfigError("ordering", ordered, "key ordering runs with a key-state reader and feed")
        clock, name = self._clock, self.settings.name
        if main:
            assert feed is not None
            return KeyOrder(
                self._bindings,
                read=read,
                feed=feed(),
                emitter=self._emitter,
                name=name,
                now_ms=clock.now_ms,
                monotonic=clock.monotonic,
                park_limit=0 if self.settings.exactly_once else PARKED_PER_PARTITION,
            )
        return TierOrder(
            self._bindings, read=read, emitter=self._emitter, name=name, now_ms=clock.now_ms, monotonic=clock.monotonic
        )

    def _ordered_hand_offs(self, chains: KeyOrder | TierOrder) -> OrderedHandOffs:
        """At-least-once: key order's writes on a producer of their own."""
        return OrderedHandOffs(
            chains,
            self._producer_factory,
            self._emitter,
            clock=self._clock,
            name=self.settings.name,
            make_alone_producer=self._alone_producer_factory,
        )

    def _rebuild_key_state(self, tps: list[TopicPartition]) -> None:
        """Exactly-once, after an aborted transaction: the key state of `tps` read again from the topic (what
        the aborted transaction told key order never happened), as at an assignment."""
        if self._key_order is None:
            return
        key_order, writes = self._key_order
        ordered = [tp for tp in tps if key_order.ordered(tp[0])]
        key_order.revoked(ordered)
        writes.write(key_order.assigned(ordered))

    # -- shutdown ------------------------------------------------------------------------------------------

    def _drain(self) -> None:
        if self._handoff is not None:
            self._handoff.report_handled()
            self._handoff.shutdown()

    def _close(self) -> None:
        if self._consumer is not None:  # None: its creation failed
            self._consumer.close()
        if self._key_order is not None:
            self._key_order[0].close()
