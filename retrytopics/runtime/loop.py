"""The consumer loop shared by main and tier consumers: poll, act on each record, hand failures off, commit.

One loop = one consumer + one producer + one thread. Per iteration (runtime/cycle.py):

1. serve producer delivery reports; hold partitions whose publish is failing, release them when it succeeds;
2. resume partitions whose head record is due; `consume()` for at most min(next due time, max_wait); after a
   gap in polling long enough to have cost the membership, ask before touching a record (runtime/guard.py);
3. for each record (runtime/processing.py): read its retry state (malformed → DLQ `invalid_retry_headers`),
   suppress a duplicate hop (runtime/duplicates.py), pause the partition if the record is not due, else
   decode and call the handler (a batch handler: once per partition, runtime/batch_calls.py); success →
   finished; failure → `route()` → produce, finished only when the broker acknowledges (runtime/outcomes.py);
4. commit the finished prefix asynchronously, by count or by time (exactly-once: commit the transaction;
   runtime/handoff.py).

Records of a main topic carry no retry state (incoming `retry.*` headers are ignored there), so the same
loop serves both kinds of consumer; only tier records are ever paused.

The parts of a loop get their clock from this module (`time.monotonic`, `_now_ms`) when the loop is built or
started: tests point `retrytopics.runtime.loop.time` at a fake clock before building one.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, ProducerPort
from retrytopics.core.transactions import CALL_TIMEOUT_MS
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.batch_calls import BatchCaller
from retrytopics.runtime.bounded import BoundedCalls, BoundedCommits
from retrytopics.runtime.cycle import PollCycle
from retrytopics.runtime.dispatch import Binding, Invoker
from retrytopics.runtime.duplicates import DuplicateSuppressor
from retrytopics.runtime.exactly_once import ExactlyOnce
from retrytopics.runtime.guard import OwnershipGuard
from retrytopics.runtime.handoff import AtLeastOnce, HandOff
from retrytopics.runtime.outcomes import Outcomes
from retrytopics.runtime.ownership import OwnershipCheck
from retrytopics.runtime.pausing import PauseController
from retrytopics.runtime.processing import Decoded, RecordProcessor
from retrytopics.runtime.rebalance import GroupJoin, RebalanceListener
from retrytopics.runtime.seeding import TailReader
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
    """Runs one consumer until `stop` is set (see the module docstring). The clients are created in `run()`,
    with everything that acts through them (`_start_clients`)."""

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
    ) -> None:
        self.settings = settings
        self._bindings = dict(bindings)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._alone_producer_factory = alone_producer_factory  # one record per batch (runtime/publish.py)
        self._emitter = emitter
        self._stop = stop
        self._audit = audit
        self._on_dead_letter = on_dead_letter
        self._tail_reader = tail_reader if not settings.exactly_once else None  # see runtime/seeding.py
        self._tracker = OffsetTracker()
        self._invoker = Invoker(stop)
        self._assigned: set[TopicPartition] = set()
        self._handled = HandledTally()
        self._each_handled = emitter.wants(Event.RECORD_HANDLED)  # a hook asked for one event per record
        self._join = GroupJoin(
            name=settings.name, group_id=settings.group_id, timeout_s=settings.join_timeout_s, monotonic=time.monotonic
        )
        self.crash: BaseException | None = None
        self.running = False
        # made by `_start_clients`; read by the app's thread (health) and at shutdown, so None until then
        self._consumer: ConsumerPort | None = None
        self._pauses: PauseController[Decoded] | None = None
        self._handoff: HandOff | None = None  # runtime/handoff.py
        self._guard: OwnershipGuard | None = None

    # -- state for the app -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False after a crash, while a publish is failing, while the consumer is out of its group (not joined
        `join_timeout_s` after starting, or its assignment lost: the coordinator stopped answering), and while
        a poll batch (a handler call, say) runs past `max.poll.interval.ms`."""
        if self.crash is not None or not self._join.in_time():
            return False
        if self.running and self._guard is not None and self._guard.overdue_s() > 0:
            return False
        return self._handoff is None or self._handoff.publisher.healthy

    def watch(self) -> None:
        """Called by a watchdog thread (runtime/lifecycle.py): count the record of a handler call that has run
        past `max.poll.interval.ms` as abandoned when it is found, not when (if ever) the call returns."""
        guard = self._guard
        if self.running and guard is not None and not guard.overdue_reported and guard.overdue_s() > 0:
            guard.report_overdue(self._invoker.calling)

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
        self._join.started()
        try:
            cycle = self._start_clients()
            self._emit(Event.CONSUMER_STARTED, group=self.settings.group_id, topics=list(self.settings.topics))
            while not self._stop.is_set():
                cycle.run_once()
        except BaseException as exc:
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

    def _start_clients(self) -> PollCycle:
        """Create the clients, then once each part that acts through them, given what it needs."""
        s, stop, emit = self.settings, self._stop, self._emit
        calls = BoundedCalls(timeout_s=CALL_TIMEOUT_MS / 1000 + 1, name=s.name)
        consumer = self._consumer = BoundedCommits(self._consumer_factory(), calls)
        pauses = self._pauses = PauseController(
            consumer,
            self._emitter,
            consumer_name=s.name,
            ahead_ms=s.wait_in_memory_ms,
            max_records=s.wait_in_memory_records,
        )
        shared = (s, consumer, self._tracker, self._audit, self._emitter, self._on_dead_letter, self._producer_factory)
        handoff = self._handoff = (
            ExactlyOnce(*shared, pauses=pauses, assigned=self._assigned)
            if s.exactly_once
            else AtLeastOnce(*shared, alone_producer_factory=self._alone_producer_factory)
        )
        check = OwnershipCheck(consumer, self._tracker, committed_only=handoff.commits_in_transactions)
        guard = self._guard = OwnershipGuard(check, pauses, emit, name=s.name, stop=stop, monotonic=time.monotonic)
        outcomes = Outcomes(
            handoff, self._handled, emit, each_handled=self._each_handled, rng=random.Random(), now_ms=_now_ms
        )
        batches = BatchCaller(self._invoker, outcomes, guard, pauses, stop=stop)
        duplicates = DuplicateSuppressor(
            handoff,
            batches,
            self._bindings,
            emit,
            name=s.name,
            tail_reader=self._tail_reader,
            seed_last=s.seed_last,
            seed_timeout_s=s.seed_timeout_s,
        )
        processor = RecordProcessor(
            self._bindings,
            pauses,
            self._audit,
            self._invoker,
            guard,
            outcomes,
            batches,
            duplicates,
            now_ms=_now_ms,
            stop=stop,
        )
        rebalance = RebalanceListener(
            self._tracker, pauses, handoff, duplicates, emit, assigned=self._assigned, join=self._join
        )
        consumer.subscribe(
            s.topics, on_assign=rebalance.on_assign, on_revoke=rebalance.on_revoke, on_lost=rebalance.on_lost
        )
        return PollCycle(
            consumer,
            pauses,
            handoff,
            guard,
            processor,
            batches,
            outcomes,
            batch_size=s.batch_size,
            max_wait_ms=s.max_wait_ms,
            assigned=self._assigned,
            stop=stop,
            now_ms=_now_ms,
            monotonic=time.monotonic,
        )

    # -- shutdown ------------------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._handled.flush(self._emit)
        try:
            if self._handoff is not None:
                self._handoff.shutdown()
        except BaseException:
            log.exception("%s: error while draining", self.settings.name)
        finally:
            try:
                if self._consumer is not None:  # None: its creation failed
                    self._consumer.close()
            except KafkaClientError as exc:
                log.warning("%s: close failed: %s", self.settings.name, exc)
            self._invoker.close()
            self.running = False
            self._emit(Event.CONSUMER_STOPPED, group=self.settings.group_id)

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self.settings.name, **data)


def _now_ms() -> int:
    return int(time.time() * 1000)
