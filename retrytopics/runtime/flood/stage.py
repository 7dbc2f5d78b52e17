"""The retry-flood guard's admission step: a records stage built on the loop's own (the source or the tier
path), picked once by the loop when one of its handlers is guarded. Before a guarded handler is called on a
record it asks the handler's guard (runtime/flood/breaker.py), and tells it the outcome after:

- **refused** (open, a probe out, ramping): the record is not called and not lost: a record just read is `Held`
  (read again from it once the hold reason lets its partition go: runtime/flood/holds.py); a record that
  waited in memory waits again at its partition's head until the guard's time;
- **a probe**: one record at a time; a probe admitted for a record that is then not called (not due, a
  duplicate) is given back;
- **spared**: a record whose attempts ran out (`exhausted`, `timeout`) while the guard is not closed is not
  dead-lettered (at most `max_deferrals` times: `HandlerGuard.failed`): it is `Held` and read again once calls go through, that attempt not counted, since a
  republish could not carry it (one more failure than the policy allows is refused by the tier that reads
  it; the same count again is its audit key, suppressed as a duplicate). Poison and non-retryable records
  go to the DLQ as ever;
- **closed**: a plain run goes to the inner stage whole and its successes are counted in one step; the run is
  cut after a failure that opened the guard.

A batch handler's records are admitted per call, not per record: this stage is the inner stage's `BatchGate`
(runtime/records/batches.py), asked before each call on a group (a main consumer's plain run included). Closed,
the group is one call; otherwise it is cut into calls of one record, each admitted (a probe is one record, and
the ramp counts records). A group refused is held at its first record; each record's outcome is counted as one
call's; a record spared is held, and the rest of its group's outcomes dropped (read again from it). Every
outcome of a call made is yielded (no cut after a failure: those calls happened). Once a partition is held,
whatever the inner stage yields after it for that partition is dropped: the partition is read again from the
held record.

A key-ordered handler's run goes record by record, each admitted (as key order admits them). The records key
order parks and gives back (`released`) sit below records of their partition acted on since, so one is never
held: the inner stage (`Unparking`) asks the guard before it admits one again, and one refused or spared is
parked again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from typing import Any, Protocol

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.flood_guard import Admission
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, Polled, message_of
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.flood.breaker import HandlerGuard
from retrytopics.runtime.records.batches import BatchCalls, Deferred, GroupCall
from retrytopics.runtime.records.calls import Binding, Run
from retrytopics.runtime.records.outcome import (
    Abandoned,
    Failed,
    Held,
    Outcome,
    Parked,
    Queued,
    Succeeded,
    SucceededRun,
    Waiting,
)
from retrytopics.runtime.records.stage import Accepting, RecordStage

__all__ = ["FloodGuardedStage"]

log = logging.getLogger("retrytopics.runtime")


class Unparking(Protocol):
    """A stage that parks records and gives them back by `released` (key order's main consumer stage,
    runtime/keyorder/stage.py): it asks `admits_unparked` before admitting one again, and `park_again` parks
    one that was not acted on."""

    admits_unparked: Callable[[Message], bool]

    def park_again(self, msg: Message) -> Parked: ...


class FloodGuardedStage(RecordStage):
    """The loop's stage (`inner`) behind its guarded handlers' guards (see the module docstring)."""

    def __init__(
        self,
        inner: RecordStage,
        guards: Mapping[str, HandlerGuard],
        *,
        consumer: str,
        emitter: Emitter,
        clock: Clock,
        batch_topics: Collection[str] = (),
        batches: BatchCalls | None = None,
        unparking: Unparking | None = None,
    ) -> None:
        """`batch_topics`: the guarded topics of batch handlers, whose calls `batches` (the inner stage's) makes:
        this stage is then their gate. `unparking`: the inner stage, when it parks records (key order): each
        it gives back is admitted by the guard first."""
        # RecordStage.__init__ is not called: every step is the inner stage's, asked through the guards
        self._inner = inner
        self._guards = dict(guards)  # topic (a source or a tier) -> its handler's guard
        self._batch_topics = frozenset(t for t in batch_topics if t in self._guards)
        if self._batch_topics:
            assert batches is not None, "a guarded batch handler's calls are admitted by its BatchCalls' gate"
            batches.gate = self
        self._unparking = unparking
        #: the guard and whether a probe, of the parked record being given back now (`_admits_unparked`)
        self._unparked: tuple[HandlerGuard, bool] | None = None
        if unparking is not None:
            unparking.admits_unparked = self._admits_unparked
        self._consumer = consumer
        self._emitter = emitter
        self._now_ms = clock.now_ms
        self.run_topics = inner.run_topics
        self.keeps_records = inner.keeps_records

    # -- the guarded steps ------------------------------------------------------------------------------------

    def read(self, msg: Message) -> Iterator[Outcome]:
        guard = self._guards.get(msg.topic)
        if guard is None:
            return self._inner.read(msg)
        if msg.topic in self._batch_topics:  # admitted per call (`settle`)
            return _after_held(self._inner.read(msg))
        return self._guarded(guard, msg, lambda: self._inner.read(msg), lambda _: Held(msg))

    def take_queued(self, msg: Message, queued: Queued) -> Iterator[Outcome]:
        guard = self._guards.get(msg.topic)
        if guard is None:
            return self._inner.take_queued(msg, queued)
        if msg.topic in self._batch_topics:
            return _after_held(self._inner.take_queued(msg, queued))

        def again(admission: Admission) -> Outcome:
            # back to its queue's head, due when the guard may admit a call (the loop's wall clock)
            return Waiting(msg, self._now_ms() + guard.wait_ms(admission), queued)

        return self._guarded(guard, msg, lambda: self._inner.take_queued(msg, queued), again)

    def _guarded(
        self,
        guard: HandlerGuard,
        msg: Message,
        outcomes: Callable[[], Iterator[Outcome]],
        refused: Callable[[Admission], Outcome],
    ) -> Iterator[Outcome]:
        admission = guard.admit(self._consumer, msg.tp)
        if not admission.call:
            yield refused(admission)
            return
        probe, told = admission.probe, False
        try:
            for outcome in outcomes():
                kind = type(outcome)
                if kind is Succeeded:
                    told = True
                    guard.succeeded(1, probe=probe, consumer=self._consumer)
                elif kind is Failed:
                    told = True
                    assert isinstance(outcome, Failed)
                    if guard.failed(
                        outcome.route, probe=probe, consumer=self._consumer, record=_coordinates(outcome.msg)
                    ):
                        yield self._spared(guard, outcome)
                        continue
                yield outcome
        finally:
            if probe and not told:
                guard.cancel_probe()

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        guard = self._guards.get(binding.topic)
        if guard is None:
            yield from self._inner.call_run(binding, run)
            return
        if binding.topic in self._batch_topics:  # admitted per call (`settle`)
            yield from _after_held(self._inner.call_run(binding, run))
            return
        if binding.ordering is not None:  # key order admits record by record: so does the guard
            for item in run:
                msg = _message(item)
                stopped = False
                for outcome in self._guarded(guard, msg, _one_run(self._inner, binding, msg), _held(msg)):
                    yield outcome
                    stopped = stopped or type(outcome) is Held or type(outcome) is Abandoned
                if stopped:
                    return
            return
        consumer, start = self._consumer, 0
        tp = (run[0].topic, run[0].partition)
        while start < len(run):
            if guard.free:
                probe, chunk = False, run if start == 0 else run[start:]
            else:  # admitted one call at a time
                admission = guard.admit(consumer, tp)
                if not admission.call:
                    yield Held(_message(run[start]))
                    return
                probe, chunk = admission.probe, run[start : start + 1]
            outcomes = self._inner.call_run(binding, chunk)
            told, cut_after = False, -1
            try:
                for outcome in outcomes:
                    if type(outcome) is SucceededRun:
                        told = True
                        guard.succeeded(len(outcome.msgs), probe=probe, consumer=consumer)
                    elif type(outcome) is Failed:
                        told = True
                        assert isinstance(outcome, Failed)
                        coordinates = _coordinates(outcome.msg)
                        if guard.failed(outcome.route, probe=probe, consumer=consumer, record=coordinates):
                            yield self._spared(guard, outcome)  # read again from it: the rest of the run too
                            return
                        if not guard.free:
                            yield outcome
                            cut_after = outcome.msg.offset
                            break
                    yield outcome
                    if type(outcome) is Abandoned:
                        return
            finally:
                if isinstance(outcomes, Generator):  # cut after a failure: its calls end here, none after
                    outcomes.close()
                if probe and not told:
                    guard.cancel_probe()
            if not told:
                return  # the inner stage stopped before calling (the app is stopping)
            if cut_after < 0:
                start += len(chunk)
            else:
                start = next(i for i in range(start, len(run)) if run[i].offset == cut_after) + 1

    # -- a batch handler's calls (the inner stage's `BatchGate`) ---------------------------------------------

    def settle(
        self, group: list[Deferred], call: GroupCall, drop: Callable[[list[Deferred]], None]
    ) -> Generator[Outcome, None, bool]:
        """Call `call` on `group` as the guard admits (see the module docstring); False as `call` returns it."""
        guard = self._guards.get(group[0].msg.topic)
        if guard is None:
            return (yield from call(group))
        consumer, start = self._consumer, 0
        while start < len(group):
            if guard.free:
                probe, chunk = False, group if start == 0 else group[start:]
            else:
                admission = guard.admit(consumer, group[start].msg.tp)
                if not admission.call:
                    drop(group[start:])
                    yield Held(group[start].msg)
                    return True
                probe, chunk = admission.probe, group[start : start + 1]
            outcomes, told = call(chunk), False
            try:
                while True:
                    try:
                        outcome = next(outcomes)
                    except StopIteration as end:
                        if not end.value:
                            return False  # `Abandoned` was yielded: the call may have cost the partition
                        break
                    kind = type(outcome)
                    if kind is SucceededRun or kind is Succeeded:
                        told = True
                        count = len(outcome.msgs) if isinstance(outcome, SucceededRun) else 1
                        guard.succeeded(count, probe=probe, consumer=consumer)
                    elif kind is Failed:
                        told = True
                        assert isinstance(outcome, Failed)
                        coordinates = _coordinates(outcome.msg)
                        if guard.failed(outcome.route, probe=probe, consumer=consumer, record=coordinates):
                            at = next(i for i, d in enumerate(group) if d.msg.offset == outcome.msg.offset)
                            drop(group[at:])
                            yield self._spared(guard, outcome)  # read again from it: the rest of the group too
                            return True
                    yield outcome
            finally:
                outcomes.close()
                if probe and not told:
                    guard.cancel_probe()
            if not told:
                return True  # nothing was settled (stopping)
            start += len(chunk)
        return True

    def _spared(self, guard: HandlerGuard, failed: Failed) -> Held:
        self._tell_spared(guard, failed)
        return Held(failed.msg)

    def _tell_spared(self, guard: HandlerGuard, failed: Failed) -> None:
        msg = failed.msg
        reason = str(failed.route.reason)
        log.info(
            "%s: %s[%d]@%d ran out of attempts (%s) while the flood guard of %s is %s: read again later, not "
            "dead-lettered",
            self._consumer,
            msg.topic,
            msg.partition,
            msg.offset,
            reason,
            guard.handler,
            guard.state,
        )
        self._emitter.emit(
            Event.FLOOD_GUARD_DEFERRED,
            handler=guard.handler,
            consumer=self._consumer,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            reason=reason,
        )

    # -- parked records given back (key order's) ----------------------------------------------------------------

    def released(self) -> Iterable[Iterator[Outcome]]:
        if self._unparking is None:
            return self._inner.released()
        return (self._released(outcomes) for outcomes in self._inner.released())

    def _admits_unparked(self, msg: Message) -> bool:
        """Asked by the inner stage before it admits a parked record again: whether its guard admits a call."""
        guard = self._guards.get(msg.topic)
        if guard is None:
            self._unparked = None
            return True
        admission = guard.admit(self._consumer, msg.tp)
        self._unparked = (guard, admission.probe) if admission.call else None
        return admission.call

    def _released(self, outcomes: Iterator[Outcome]) -> Iterator[Outcome]:
        """A parked record given back, its outcome told to its guard; spared the DLQ, it is parked again (held,
        it would be read again from its offset, below records of its partition acted on since)."""
        assert self._unparking is not None
        self._unparked, told = None, False
        try:
            for outcome in outcomes:
                unparked = self._unparked  # set by `_admits_unparked` when the iteration began
                if unparked is not None and (type(outcome) is Succeeded or type(outcome) is Failed):
                    told = True
                    guard, probe = unparked
                    if isinstance(outcome, Failed):
                        coordinates = _coordinates(outcome.msg)
                        if guard.failed(outcome.route, probe=probe, consumer=self._consumer, record=coordinates):
                            self._tell_spared(guard, outcome)
                            yield self._unparking.park_again(outcome.msg)
                            continue
                    else:
                        guard.succeeded(1, probe=probe, consumer=self._consumer)
                yield outcome
        finally:
            if self._unparked is not None and self._unparked[1] and not told:
                self._unparked[0].cancel_probe()
            self._unparked = None

    # -- the inner stage's own ----------------------------------------------------------------------------------

    def runs_of(self, polled: Polled, accepting: Accepting) -> tuple[list[Message], list[tuple[Binding, Run]] | None]:
        return self._inner.runs_of(polled, accepting)

    def wait_ms(self, wait_ms: int) -> int:
        return self._inner.wait_ms(wait_ms)

    def abandon_deferred(self) -> list[Abandoned]:
        return self._inner.abandon_deferred()

    def settle_deferred(self) -> Generator[Outcome, None, bool]:
        if self._batch_topics:
            return _after_held(self._inner.settle_deferred())
        return self._inner.settle_deferred()

    def failed(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        record: Record[Any],
        state: RetryHeaders | None,
        failure: BaseException,
    ) -> Failed:
        return self._inner.failed(binding, msg, key, record, state, failure)


def _after_held(outcomes: Iterator[Outcome]) -> Generator[Outcome, None, bool]:
    """`outcomes`, but none of a partition after it was held (it is read again from the held record); the
    value `outcomes` returns (a generator's; True for any other iterator)."""
    held: set[TopicPartition] = set()
    try:
        while True:
            try:
                outcome = next(outcomes)
            except StopIteration as end:
                return end.value is not False
            tp = outcome.tp if isinstance(outcome, SucceededRun) else outcome.msg.tp
            if tp in held:
                continue
            if type(outcome) is Held:
                held.add(tp)
            yield outcome
    finally:
        if isinstance(outcomes, Generator):
            outcomes.close()


def _one_run(stage: RecordStage, binding: Binding, msg: Message) -> Callable[[], Iterator[Outcome]]:
    return lambda: stage.call_run(binding, [msg])


def _held(msg: Message) -> Callable[[Admission], Outcome]:
    return lambda _: Held(msg)


def _coordinates(msg: Message) -> tuple[str, int, int]:
    return (msg.topic, msg.partition, msg.offset)


def _message(item: Message | Record[Any]) -> Message:
    return item if isinstance(item, Message) else message_of(item)
