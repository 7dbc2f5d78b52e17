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
from dataclasses import dataclass

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import ConfigError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, EndOffsetsPort, ProducerPort
from retrytopics.core.transactions import CALL_TIMEOUT_MS
from retrytopics.observe.events import Emitter
from retrytopics.runtime.bounded import BoundedCalls, BoundedCommits
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.concurrency.holds import WindowFull
from retrytopics.runtime.concurrency.stage import CallWindow, WindowedSourceStage, WindowedTierStage, windowed_topics
from retrytopics.runtime.consumer.cycle import CycleParts, PollCycle
from retrytopics.runtime.consumer.holds import HoldReason, PublishFailing
from retrytopics.runtime.consumer.rebalance import AssignmentListener, GroupJoin, RebalanceListener
from retrytopics.runtime.consumer.running import LoopRun
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.flood.breaker import HandlerGuard
from retrytopics.runtime.flood.holds import FloodHold
from retrytopics.runtime.flood.stage import FloodGuardedStage
from retrytopics.runtime.handoff.at_least_once import at_least_once
from retrytopics.runtime.handoff.exactly_once import exactly_once
from retrytopics.runtime.handoff.handoff import DeadLetterCallback, HandOff
from retrytopics.runtime.handoff.ordered import KeyWrites, OrderedHandOffs
from retrytopics.runtime.keyorder.holds import KeyOrderHold
from retrytopics.runtime.keyorder.key_state import KeyStateReader
from retrytopics.runtime.keyorder.learning import KeyStateLearning
from retrytopics.runtime.keyorder.listener import KeyOrderListener
from retrytopics.runtime.keyorder.ordering import PARKED_PER_PARTITION, KeyOrder, KeyStateFeed, TierOrder
from retrytopics.runtime.keyorder.stage import OrderedSourceStage, OrderedTierStage
from retrytopics.runtime.keyorder.windowed import KeyOrderStarts, WindowedOrderedTierStage
from retrytopics.runtime.lag import LagProbe
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import DuplicateCheck, TailReader
from retrytopics.runtime.records.ownership import OwnershipCheck, OwnershipGuard
from retrytopics.runtime.records.source import SourceStage
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.records.tier import TierStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["ConsumerLoop", "LoopClients"]

log = logging.getLogger("retrytopics.runtime")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopClients:
    """How one loop makes and reaches its clients (an app's `ClientFactory`, or a test's broker): its consumer
    and producer; a producer for a record alone in its batch (runtime/handoff/publish.py; None: the producer);
    the reader of the tiers' tails that seeds the hand-off audit (runtime/records/duplicates.py); the key-state
    reads of key-ordered handlers (runtime/keyorder/); the end offsets the lag is measured against
    (runtime/lag.py)."""

    consumer: Callable[[], ConsumerPort]
    producer: Callable[[], ProducerPort]
    alone_producer: Callable[[], ProducerPort] | None = None
    tail_reader: TailReader | None = None
    key_state_reader: KeyStateReader | None = None
    key_state_feed: Callable[[], KeyStateFeed] | None = None
    end_offsets: Callable[[], EndOffsetsPort] | None = None


class ConsumerLoop(LoopRun):
    """Runs one consumer until `stop` is set (see the module docstring). The clients are created in `run()`
    (runtime/consumer/running.py), with everything that acts through them (`_start_clients`)."""

    def __init__(
        self,
        settings: LoopSettings,
        bindings: Mapping[str, Binding],
        *,
        clients: LoopClients,
        emitter: Emitter,
        stop: threading.Event,
        audit: DuplicateAudit,
        on_dead_letter: DeadLetterCallback | None = None,
        clock: Clock = SYSTEM_CLOCK,
        flood_guards: Mapping[str, HandlerGuard] | None = None,
    ) -> None:
        super().__init__(settings, emitter, stop)
        # the retry-flood guards of this loop's handlers (runtime/flood/): topic (source or tier) -> its guard
        guards = flood_guards or {}
        self._flood_guards = {t: guards[b.topic] for t, b in bindings.items() if b.topic in guards}
        self._end_offsets = clients.end_offsets  # the lag measured while partitions are paused (runtime/lag.py)
        self._clock = clock
        self._bindings = dict(bindings)
        self._consumer_factory = clients.consumer
        self._producer_factory = clients.producer
        self._alone_producer_factory = clients.alone_producer  # one record per batch (runtime/handoff/publish.py)
        self._audit = audit
        self._on_dead_letter = on_dead_letter
        self._tail_reader = clients.tail_reader if not settings.exactly_once else None  # runtime/records/duplicates.py
        self._key_state = (clients.key_state_reader, clients.key_state_feed)  # a loop of key-ordered handlers
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
        #: the windowed handlers' calls (runtime/concurrency/); None: every call on this loop's thread
        self._window: CallWindow | None = None

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
        listener: KeyOrderListener | None = chains  # what the hand-off tells key order (runtime/keyorder/listener.py)
        writes: KeyWrites | None
        if s.exactly_once:
            handoff = exactly_once(
                *shared,
                clock=clock,
                forget_waiting=waiting.drop,
                assigned=self._assigned,
                key_chains=listener,
                rebuild_key_state=self._rebuild_key_state,
            )
            writes = handoff.key_writes
        else:
            hand_offs = None if listener is None else self._ordered_hand_offs(listener)
            handoff = at_least_once(
                *shared, clock=clock, alone_producer_factory=self._alone_producer_factory, ordered=hand_offs
            )
            writes = hand_offs
        self._handoff = handoff
        key_order = self._key_order = None if chains is None or writes is None else (chains, writes)
        check = OwnershipCheck(consumer, self._tracker, committed_only=handoff.commits_in_transactions)
        ownership = self._guard = OwnershipGuard(check, emit, name=s.name, stop=stop, monotonic=clock.monotonic)
        duplicates = DuplicateCheck(
            self._bindings,
            tail_reader=self._tail_reader,
            seed_last=s.seed_last,
            seed_timeout_s=s.seed_timeout_s,
            marks=consumer,
            clock=clock,
        )
        flood_hold = FloodHold(self._flood_guards) if self._flood_guards else None

        def failing(tp: TopicPartition) -> bool:
            """Key order's parked records of `tp` wait (while its publish fails, or its flood guard refuses)."""
            return handoff.publisher.is_failing(tp) or (flood_hold is not None and flood_hold.holds(tp))

        stage = self._stage(waiting, ownership, duplicates, key_order, failing=failing)
        # what a feature adds to the shared path, one entry per seam (docs/architecture.md, Where a new feature goes)
        holds: list[HoldReason] = [PublishFailing(handoff)]
        before_revoke: list[Callable[[list[TopicPartition]], None]] = []
        listeners: list[AssignmentListener] = []
        if isinstance(stage, WindowedSourceStage | WindowedTierStage):
            window = self._window = stage.window
            holds.append(WindowFull(window))
            listeners.append(window)
            before_revoke.append(lambda tps: window.settle_before_revoke(tps, s.revoke_drain_timeout_s, handoff.apply))
        if self._flood_guards:
            batch_topics = {t for t, b in self._bindings.items() if b.batch}
            stage = FloodGuardedStage(
                stage,
                self._flood_guards,
                consumer=s.name,
                emitter=self._emitter,
                clock=clock,
                batch_topics=batch_topics,
                batches=stage.batches if batch_topics else None,
                unparking=stage if isinstance(stage, OrderedSourceStage) else None,
            )
            assert flood_hold is not None
            holds.append(flood_hold)
        before_poll: list[Callable[[], None]] = []
        lag = self._lag_probe(waiting)
        if lag is not None:
            before_poll.append(lag.tick)  # never waits: an answer is read when it came
        if key_order is not None:
            reads = KeyStateLearning(key_order[0], key_order[1], reading_key_state=handoff.reading_key_state)
            holds.append(KeyOrderHold(key_order[0]))
            before_poll.append(reads)
            listeners.append(reads)
        rebalance = RebalanceListener(
            self._tracker,
            waiting,
            handoff,
            duplicates,
            emit,
            assigned=self._assigned,
            join=self._join,
            listeners=listeners,
            before_revoke=before_revoke,
        )
        consumer.subscribe(
            s.topics, on_assign=rebalance.on_assign, on_revoke=rebalance.on_revoke, on_lost=rebalance.on_lost
        )
        parts = CycleParts(
            consumer=consumer,
            stage=stage,
            waiting=waiting,
            handoff=handoff,
            ownership=ownership,
            holds=holds,
            before_poll=before_poll,
        )
        return PollCycle(
            parts, batch_size=s.batch_size, max_wait_ms=s.max_wait_ms, assigned=self._assigned, stop=stop, clock=clock
        )

    def _stage(
        self,
        waiting: PauseController,
        ownership: OwnershipGuard,
        duplicates: DuplicateCheck,
        key_order: tuple[KeyOrder | TierOrder, KeyWrites] | None,
        *,
        failing: Callable[[TopicPartition], bool],
    ) -> RecordStage:
        """The records stage of this loop's kind, picked once: the source path (a main consumer: source topics
        only) or the tier path; with key order's admission when a handler is key-ordered, asked as each record
        starts when handlers run calls in a window (runtime/keyorder/windowed.py)."""
        parts = (self._audit, self._invoker, ownership, duplicates)
        clock, rng, stop = self._clock, random.Random(), self._stop
        order = None if key_order is None else key_order[0]
        windowed = bool(windowed_topics(self._bindings))
        emitter, name = self._emitter, self.settings.name
        if all(topic == b.topic for topic, b in self._bindings.items()):
            if windowed:
                starts = KeyOrderStarts(order, clock.now_ms) if isinstance(order, KeyOrder) else None
                return WindowedSourceStage(
                    self._bindings,
                    *parts,
                    clock=clock,
                    rng=rng,
                    stop=stop,
                    emitter=emitter,
                    consumer=name,
                    starts=starts,
                )
            if isinstance(order, KeyOrder):
                return OrderedSourceStage(
                    self._bindings,
                    *parts,
                    clock=clock,
                    rng=rng,
                    stop=stop,
                    key_order=order,
                    assigned=self._assigned,
                    failing=failing,
                )
            return SourceStage(self._bindings, *parts, clock=clock, rng=rng, stop=stop)
        if windowed and isinstance(order, TierOrder):
            return WindowedOrderedTierStage(
                self._bindings,
                waiting,
                *parts,
                clock=clock,
                rng=rng,
                stop=stop,
                emitter=emitter,
                consumer=name,
                tier_order=order,
            )
        if windowed:
            return WindowedTierStage(
                self._bindings, waiting, *parts, clock=clock, rng=rng, stop=stop, emitter=emitter, consumer=name
            )
        if isinstance(order, TierOrder):
            return OrderedTierStage(self._bindings, waiting, *parts, clock=clock, rng=rng, stop=stop, tier_order=order)
        return TierStage(self._bindings, waiting, *parts, clock=clock, rng=rng, stop=stop)

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

    def _ordered_hand_offs(self, listener: KeyOrderListener) -> OrderedHandOffs:
        """At-least-once: key order's writes on a producer of their own."""
        return OrderedHandOffs(
            listener,
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
        if self._window is not None and self._handoff is not None and self.crash is None:
            self._window.drain(self.settings.drain_timeout_s, self._handoff.apply)
        if self._handoff is not None:
            self._handoff.report_handled()
            self._handoff.shutdown()

    def _close(self) -> None:
        if self._window is not None:
            self._window.close()
        if self._consumer is not None:  # None: its creation failed
            self._consumer.close()
        if self._key_order is not None:
            self._key_order[0].close()
