"""Handler concurrency's admission step (docs/concurrency.md): the records stage of a loop with a handler whose
`concurrency` is above 1, picked once by the consumer loop; a loop without one never has it, so the plain
stages (runtime/records/) import nothing of it.

A windowed handler's record is not called on the consumer's thread. It is admitted to its handler's window
(runtime/concurrency/window.py), said `Parked` (the hand-off tracks its offset, unfinished: no commit passes
it) and started on the workers (runtime/concurrency/workers.py) now, or when the record of its gate before it
returned. What each call returned comes back in offset-free order through `released`, as the plain stage's
outcome values (`Succeeded`, `Failed` with its route, decided here): the hand-off finishes or hands it off as
any other, so a failure goes to its tier while other calls run. The consumer asks Kafka for no more records
than the window has room for (`batch_size`); a record read while its window is full anyway is `Held`: its
partition is read again from it; and while the window holds its byte bound its partitions are held (the hold
reason, holds.py).

A feature that decides per record before its call (key order, docs/key-ordering.md) is asked at the moment a
record would start, not when it enters the window (`StartCheck`): the record is called, handed on with the
outcome the check gives instead of a call, or deferred (it keeps its gate, so its key's later records stay
behind it, and is asked again at the next poll). With a check, a returned call's outcome is acted on before
the next record of its gate is asked: what the hand-off tells the feature (a failure's hop) decides that record.

- `StartCheck`: that seam;
- `CallWindow`: the windows of one loop's handlers, their workers, admission and outcomes; what the loop
  asks at a revocation (`settle_before_revoke`) and at shutdown (`drain`).
- `WindowedSourceStage` / `WindowedTierStage`: the source and tier paths with it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from retrytopics.core.concurrency import Concurrency
from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.concurrency.window import Slot, Window, gate_of
from retrytopics.runtime.concurrency.workers import Workers, is_async_handler
from retrytopics.runtime.records.calls import Binding, Invoker, Run, build_record
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import Failed, Held, Outcome, Parked, Succeeded
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.source import SourceStage
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.records.tier import TierStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["CallWindow", "StartCheck", "WindowedSourceStage", "WindowedTierStage", "windowed_topics"]

log = logging.getLogger("retrytopics.runtime")

#: the longest `consume()` wait while calls are in flight and the window has room: a returned call's outcome
#: is acted on within about this long (`consume()` does not wake for it)
_IN_FLIGHT_WAIT_MS = 1
#: while every window is full, how long the consumer's thread waits for a call to return at the least (even when
#: the hand-off asks for a prompt poll): a poll then would read a record only to read it again later
_FULL_WAIT_MS = 5
#: the in-flight gauge is sampled at most this often (`concurrency.sampled`)
_SAMPLE_EVERY_S = 1.0


class Call(NamedTuple):
    """One windowed record: what its outcome is made of."""

    binding: Binding
    msg: Message
    key: AuditKey | None
    record: Record[Any]
    state: RetryHeaders | None


class StartCheck(Protocol):
    """Asked as a windowed record is about to be called (see the module docstring)."""

    def before_start(self, binding: Binding, msg: Message, state: RetryHeaders | None) -> Outcome | None:
        """None: call it now; `Parked`: not yet (it keeps its gate and is asked again at the next poll); any
        other outcome: the record's, instead of a call."""


FailedOutcome = Callable[[Binding, Message, AuditKey | None, Record[Any], RetryHeaders | None, BaseException], Failed]


def windowed_topics(bindings: Mapping[str, Binding]) -> dict[str, Concurrency]:
    """The consumed topics (sources and tiers) whose handler runs calls in a window, with its concurrency."""
    return {t: b.concurrency for t, b in bindings.items() if b.concurrency is not None and b.concurrency.windowed}


class CallWindow:
    """The windows of one loop's windowed handlers (one per handler, shared by its source and tier topics in
    this loop) and the workers their calls run on (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        *,
        failed: FailedOutcome,
        emitter: Emitter,
        consumer: str,
        stop: threading.Event,
        monotonic: Callable[[], float] = time.monotonic,
        starts: StartCheck | None = None,
    ) -> None:
        configs = windowed_topics(bindings)
        self._windows: dict[str, Window[Call]] = {}
        #: consumed topic -> its handler's window and order
        self._by_topic: dict[str, tuple[Window[Call], Concurrency]] = {}
        for topic, config in configs.items():
            handler = bindings[topic].topic
            window = self._windows.get(handler)
            if window is None:
                window = self._windows[handler] = Window(calls=config.calls, max_bytes=config.max_bytes)
            self._by_topic[topic] = (window, config)
        threads = sum(
            config.calls
            for t, config in configs.items()
            if t == bindings[t].topic and not is_async_handler(bindings[t].handler)
        )
        self.topics = frozenset(configs)
        self._workers = Workers(threads=max(1, threads), stop=stop, name=consumer)
        self._failed = failed
        self._starts = starts
        self._emitter = emitter
        self._consumer = consumer
        self._monotonic = monotonic
        self._sampled_at = 0.0
        #: handlers whose window is full now (a `concurrency.window_full` per episode)
        self._full: set[str] = set()
        #: partitions a record of which found its window full: held until the window drained by half
        self._held: set[TopicPartition] = set()

    # -- what the loop asks ------------------------------------------------------------------------------------

    def holds(self, tp: TopicPartition) -> bool:
        """Whether `tp` is held (the hold reason, holds.py): while its handler's window holds its byte bound,
        and once a record of it found the window full, until the window has room for half its calls again (a
        slow handler's partition is paused once per drain, not at every poll)."""
        at = self._by_topic.get(tp[0])
        if at is None:
            return False
        window = at[0]
        if tp in self._held:
            if window.room < window.calls // 2 + 1:
                return True
            self._held.discard(tp)
        return window.over_bytes

    def batch_size(self, batch_size: int) -> int:
        """No more records from the next poll than the fullest window has room for, counting the calls that
        returned since (at least one: a record that finds no room is read again later), so that librdkafka
        keeps the rest fetched ahead."""
        returned = self._workers.done.qsize()
        return max(1, min(batch_size, *(w.room + returned for w in self._windows.values())))

    @property
    def in_flight(self) -> int:
        return sum(w.records for w in self._windows.values())

    def admit(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        """A windowed handler's record: failed before any call (poison, bad retry headers), `Held` (its window
        is full), or `Parked` and started now or behind its gate."""
        record, poison = build_record(binding, msg, state)
        failure = bad or poison
        if failure is not None:
            yield self._failed(binding, msg, key, record, state, failure)
            return
        window, config = self._by_topic[msg.topic]
        if window.full and not self._workers.done.empty():
            yield from self._returned()  # calls returned since: their room is this record's
        if window.full:
            self._filled(binding.topic, window)
            self._held.add(msg.tp)
            yield Held(msg)
            return
        yield Parked(msg)
        size = len(msg.value or b"") + len(msg.key or b"")
        slot = Slot(msg.tp, gate_of(config.order, msg.key), size, Call(binding, msg, key, record, state))
        if window.admit(slot):
            yield from self._begin([slot])

    def busy(self, msg: Message) -> bool:
        """Whether a record `msg` would wait behind (its gate's) is admitted and not settled."""
        at = self._by_topic.get(msg.topic)
        if at is None:
            return False
        gate = gate_of(at[1].order, msg.key)
        return gate is not None and at[0].busy(msg.tp, gate)

    def run(self, binding: Binding, msgs: list[Message]) -> Iterator[Outcome]:
        """A run of one partition's records, each admitted; the run ends at the first one held."""
        for msg in msgs:
            for outcome in self.admit(binding, msg, None, None, None):
                yield outcome
                if type(outcome) is Held:
                    return

    def released(self) -> Iterable[Iterator[Outcome]]:
        """The outcomes of the calls that returned since last asked (one iterator), each started record's gate
        handing on to its next record; then the deferred records, asked again (`StartCheck`)."""
        self._sample()
        released: list[Iterator[Outcome]] = []
        if not self._workers.done.empty():
            released.append(self._returned())
        if any(w.deferred for w in self._windows.values()):
            released.append(self._undeferred())  # after the outcomes above: they may decide these
        return released

    def wait_ms(self, wait_ms: int) -> int:
        """How long the next `consume()` may wait: not at all when outcomes are there; while every window with
        calls in flight is full, until a call returns (at most `wait_ms`, at least `_FULL_WAIT_MS`); while
        calls are in flight, briefly."""
        workers = self._workers
        workers.flush()
        if not workers.done.empty():
            return 0
        if any(w.deferred for w in self._windows.values()):
            return min(wait_ms, _IN_FLIGHT_WAIT_MS)  # asked again at the next poll
        busy = [w for w in self._windows.values() if w.in_flight]
        if not busy:
            return wait_ms
        if all(w.full for w in busy):
            workers.returned.clear()
            workers.waiting = True
            if workers.done.empty():
                workers.returned.wait(max(wait_ms, _FULL_WAIT_MS) / 1000)
            workers.waiting = False
            return 0
        return min(wait_ms, _IN_FLIGHT_WAIT_MS)

    def settle_before_revoke(
        self, tps: list[TopicPartition], timeout_s: float, apply: Callable[[Outcome], None]
    ) -> None:
        """`tps` are being revoked: wait up to `timeout_s` for their calls in flight, handing every outcome to
        `apply` (the hand-off, before it commits what is finished); the calls still running then are abandoned:
        their offsets stay unfinished, so the commit stops below them."""
        for window in self._windows.values():
            window.drop_waiting(tps)  # records waiting behind a gate of theirs never start now
        self._wait(lambda: sum(w.in_flight_of(tps) for w in self._windows.values()) == 0, timeout_s, apply)

    def drain(self, timeout_s: float, apply: Callable[[Outcome], None]) -> None:
        """At shutdown: wait up to `timeout_s` for every call in flight (none is started any more), handing each
        outcome to `apply`; calls still running then are abandoned unfinished, and their records read again by
        the next owner."""
        for window in self._windows.values():
            window.drop_waiting(window.partitions)  # records waiting behind a gate never start now
        self._wait(lambda: all(w.in_flight == 0 for w in self._windows.values()), timeout_s, apply)
        left = sum(w.in_flight for w in self._windows.values())
        if left:
            log.warning(
                "%s: %d handler call(s) still running at shutdown; their records are read again", self._consumer, left
            )

    def assigned(self, tps: list[TopicPartition]) -> Iterable[TopicPartition]:
        """(An assignment listener, runtime/consumer/rebalance.py) nothing to hold."""
        return ()

    def revoked(self, tps: list[TopicPartition]) -> None:
        """`tps` were revoked (after `settle_before_revoke`) or lost: what waits behind a gate of theirs never
        starts, and what their calls still running return is dropped (read again by the new owner)."""
        for window in self._windows.values():
            window.forget(tps)
        self._held.difference_update(tps)

    def close(self) -> None:
        self._workers.close()

    # -- calls and their outcomes ------------------------------------------------------------------------------

    def _start(self, slot: Slot[Call]) -> None:
        call = slot.item
        self._workers.start(slot, call.binding.handler, call.record, call.binding.policy)

    def _begin(self, slots: list[Slot[Call]]) -> Iterator[Outcome]:
        """Start `slots` (each counted in flight by its window), asking the start check first when there is one:
        a record it hands on instead of calling settles at once, and one it defers gives its call back; either
        way what that frees is started (asked) in turn, after the outcome is acted on."""
        starts = self._starts
        if starts is None:
            for slot in slots:
                self._start(slot)
            return
        todo = deque(slots)
        while todo:
            slot = todo.popleft()
            call = slot.item
            instead = starts.before_start(call.binding, call.msg, call.state)
            if instead is None:
                self._start(slot)
                continue
            window = self._by_topic[call.msg.topic][0]
            if type(instead) is Parked:
                todo.extend(window.defer(slot))
                continue
            yield instead
            todo.extend(window.settle(slot)[1])

    def _undeferred(self) -> Iterator[Outcome]:
        for window in list(self._windows.values()):
            yield from self._begin(window.undefer())

    def _returned(self) -> Iterator[Outcome]:
        done, workers = self._workers.done, self._workers
        checked = self._starts is not None
        # Without a start check, what returned until now is settled at once: the calls it frees start before its
        # outcomes are acted on. With one, each outcome is acted on before the next record of its gate is asked.
        settled: list[tuple[Call, BaseException | None]] = []
        while not done.empty():
            token, failure = done.get_nowait()
            assert isinstance(token, Slot)
            slot: Slot[Call] = token
            call = slot.item
            current, startable = self._by_topic[call.msg.topic][0].settle(slot)
            if checked:
                if current:
                    yield self._outcome(call, failure)
                yield from self._begin(startable)
                continue
            for following in startable:
                self._start(following)
            if current:  # else its partition was revoked meanwhile: abandoned, read again by its owner
                settled.append((call, failure))
        workers.flush()
        if self._full:
            for handler in [h for h in self._full if not self._windows[h].full]:
                self._full.discard(handler)
        for call, failure in settled:
            yield self._outcome(call, failure)

    def _outcome(self, call: Call, failure: BaseException | None) -> Outcome:
        if failure is None:
            return Succeeded(call.msg, call.key, call.record)
        if isinstance(failure, Exception):
            return self._failed(call.binding, call.msg, call.key, call.record, call.state, failure)
        raise failure  # a BaseException from a handler stops the app, as on the consumer's thread

    def _wait(self, done: Callable[[], bool], timeout_s: float, apply: Callable[[Outcome], None]) -> None:
        deadline = self._monotonic() + timeout_s
        workers = self._workers
        while True:
            for outcome in self._returned():
                apply(outcome)
            workers.flush()
            if done():
                return
            left = deadline - self._monotonic()
            if left <= 0:
                return
            workers.returned.clear()
            workers.waiting = True
            if workers.done.empty():
                workers.returned.wait(min(left, 0.05))
            workers.waiting = False

    def _filled(self, handler: str, window: Window[Call]) -> None:
        if handler not in self._full:
            self._full.add(handler)
            self._emitter.emit(
                Event.CONCURRENCY_WINDOW_FULL, consumer=self._consumer, handler=handler, in_flight=window.in_flight
            )

    def _sample(self) -> None:
        now = self._monotonic()
        if now - self._sampled_at < _SAMPLE_EVERY_S:
            return
        self._sampled_at = now
        for handler, window in self._windows.items():
            self._emitter.emit(
                Event.CONCURRENCY_SAMPLED,
                consumer=self._consumer,
                handler=handler,
                in_flight=window.in_flight,
                waiting=window.records - window.in_flight,
            )


class _InWindow(RecordStage):
    """What both windowed stages do alike: the windowed topics' records go to the window, and the cycle's
    questions (what returned, how long to wait, how many to read) are the window's."""

    keeps_records = True
    window: CallWindow

    def released(self) -> Iterable[Iterator[Outcome]]:
        return self.window.released()

    def wait_ms(self, wait_ms: int) -> int:
        return self.window.wait_ms(wait_ms)

    def batch_size(self, batch_size: int) -> int:
        return self.window.batch_size(batch_size)

    def _handle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        if msg.topic not in self.window.topics:
            return super()._handle(binding, msg, key, state, bad)
        return self.window.admit(binding, msg, key, state, bad)


class WindowedSourceStage(_InWindow, SourceStage):
    """A main consumer's records stage with handler concurrency (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        audit: DuplicateAudit,
        invoker: Invoker,
        ownership: OwnershipGuard,
        duplicates: DuplicateCheck,
        *,
        clock: Clock,
        rng: random.Random,
        stop: threading.Event,
        emitter: Emitter,
        consumer: str,
        starts: StartCheck | None = None,
    ) -> None:
        super().__init__(bindings, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        self.window = CallWindow(
            bindings,
            failed=self.failed,
            emitter=emitter,
            consumer=consumer,
            stop=stop,
            monotonic=clock.monotonic,
            starts=starts,
        )
        self.run_topics = self.run_topics - self.window.topics  # a windowed run is admitted record by record

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        if binding.topic not in self.window.topics:
            return super().call_run(binding, run)
        return self.window.run(binding, run)  # type: ignore[arg-type]  # never built (`run_topics`)


class WindowedTierStage(_InWindow, TierStage):
    """A tier consumer's records stage with handler concurrency: due records run in the window with the same
    option and gate rule as on the source (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        waiting: PauseController,
        audit: DuplicateAudit,
        invoker: Invoker,
        ownership: OwnershipGuard,
        duplicates: DuplicateCheck,
        *,
        clock: Clock,
        rng: random.Random,
        stop: threading.Event,
        emitter: Emitter,
        consumer: str,
        starts: StartCheck | None = None,
    ) -> None:
        super().__init__(bindings, waiting, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        self.window = CallWindow(
            bindings,
            failed=self.failed,
            emitter=emitter,
            consumer=consumer,
            stop=stop,
            monotonic=clock.monotonic,
            starts=starts,
        )
