"""The records stage: what a consumer loop makes of each record it accepts. It decides once what the record is,
calls the handler when the record is to be handled now, and says so with one outcome value per record
(runtime/records/outcome.py). It never pauses, publishes or commits: the poll cycle hands each outcome to the part
that acts on it.

One stage per consumer kind, on what both share (this module: calling and failure routing):

- the source path (runtime/records/source.py, `SourceStage`): a main or share consumer's records, which carry no
  retry state: handled at once, in runs per partition (`call_run`) when nothing is to be decided per record;
- the tier path (runtime/records/tier.py, `TierStage`): a tier consumer's records, read with their retry state,
  due or waiting (the only part of the stage that asks `runtime/waiting.py`).

A feature that decides about a record before its handler runs (key order: runtime/keyorder/stage.py) is a stage
of its own built on one of these, picked once by the consumer loop; this module imports nothing of it.

Each step is a generator of outcomes, consumed by the cycle as they come, so an outcome is acted on before
the stage goes on: the ownership question after a long handler call (runtime/records/ownership.py) commits
what the outcomes before it finished.

- `read(msg)`: a record just consumed (the path's own); `take_queued(msg, queued)`: a record that waited in
  memory fell due: what was decided is carried out.
- `runs_of(polled, accepting)` / `call_run(...)`: a poll as runs per partition, when nothing is decided per
  record (the source path; elsewhere None: read record by record).
- `settle_deferred()`: the batch handlers' calls (runtime/records/batches.py).
- `released()`, `wait_ms(...)` and `batch_size(...)`: what a stage keeps between polls (none here; key order
  parks records, handler concurrency runs calls).

A failure's route is decided here, once (`router.route`, with the state read at `read`).
"""

from __future__ import annotations

import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any, Protocol, cast

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, Polled, message_of
from retrytopics.core.record import Record
from retrytopics.core.router import route
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.records.batches import BatchCalls, Deferred
from retrytopics.runtime.records.calls import Binding, Invoker, Run, build_record
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import (
    Abandoned,
    Failed,
    Outcome,
    Queued,
    Succeeded,
    SucceededRun,
)
from retrytopics.runtime.records.ownership import OwnershipGuard

__all__ = ["ABANDONED", "Accepting", "RecordStage"]


class Accepting(Protocol):
    """Which consumed records a loop acts on (`PauseController`: not those of a partition sought back)."""

    def accept(self, msg: Message) -> bool: ...

    def accepts_all(self, tp: TopicPartition) -> bool: ...


class RecordStage(ABC):
    """Reads, decides and calls for one loop (see the module docstring): what every consumer kind shares."""

    #: the topics whose records the consumer hands over as their handler's Records already
    #: (`ports.consume_runs`); none but on the source path
    run_topics: frozenset[str] = frozenset()

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
    ) -> None:
        self._bindings = bindings
        self._audit = audit
        self._invoker = invoker
        self._ownership = ownership
        self._duplicates = duplicates
        self._now_ms = clock.now_ms
        self._rng = rng
        self._stop = stop
        self.batches = BatchCalls(invoker, ownership, self.failed, stop=stop, dropped=self._dropped)

    @abstractmethod
    def read(self, msg: Message) -> Iterator[Outcome]:
        """A record just consumed and accepted: its outcomes (the path's own reading)."""

    def runs_of(self, polled: Polled, accepting: Accepting) -> tuple[list[Message], list[tuple[Binding, Run]] | None]:
        """`polled` as runs per partition to hand to `call_run`; None: read the batch record by record (here
        always: only the source path has runs)."""
        batch, built = polled
        if built:
            batch = batch + [message_of(r) for run in built for r in run]
        return batch, None

    # -- between polls: what a stage keeps (key order's parked records); nothing here -------------------------

    #: whether `released` may ever give records back (the cycle asks it after each run only then)
    keeps_records = False

    def released(self) -> Iterable[Iterator[Outcome]]:
        """The records kept since an earlier poll that may go on now, each as its outcomes."""
        return ()

    def wait_ms(self, wait_ms: int) -> int:
        """How long the next `consume()` may wait, given the loop's `wait_ms`."""
        return wait_ms

    def batch_size(self, batch_size: int) -> int:
        """How many records the next `consume()` may return, given the loop's `batch_size` (handler
        concurrency: no more than its window has room for)."""
        return batch_size

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        """A plain run of one partition: one call per record in offset order (a batch handler: one call,
        runtime/records/batches.py). The calls that returned between two failures are one `SucceededRun`. A
        record this consumer may no longer act on ends the run with `Abandoned`. However the run ends
        (stopping, a BaseException from a handler), the calls that returned are yielded first."""
        if binding.batch:
            yield from self.batches.call_run(binding, run)
            return
        ownership, stopped = self._ownership, self._stop.is_set
        call, clock, sure_until = self._invoker.caller(binding), ownership.monotonic, ownership.sure_until
        # the consumer built the Records (`run_topics`): each is called as it is, and a Message is made again
        # only for the records that need one (a failure, a record this consumer must leave)
        built = not isinstance(run[0], Message)
        records, msgs = cast("list[Record[Any]]", run), cast("list[Message]", run)  # the view `built` says

        def message(i: int) -> Message:
            return message_of(records[i]) if built else msgs[i]

        tp, done, i = (run[0].topic, run[0].partition), 0, 0  # run[done:i]: calls that returned, not yielded yet
        try:
            for i in range(len(run)):
                if stopped():
                    break
                if built:
                    record, poison = records[i], None
                else:
                    record, poison = build_record(binding, msgs[i], None)
                failure: BaseException | None = poison
                if failure is None:
                    try:
                        call(record)
                    except Exception as exc:  # noqa: BLE001 - every handler failure is routed; BaseException stops the app
                        failure = exc
                    if clock() > sure_until:  # a long call: asked with what is finished (ownership.py)
                        if done < i:
                            yield _run(tp, run, done, i)
                            done = i
                        if ownership.lost_ownership(msg := message(i)):
                            yield Abandoned(msg)
                            return
                    if failure is None:
                        continue
                    if ownership.stopping(msg := message(i), failure):
                        break
                else:
                    msg = message(i)
                if done < i:
                    yield _run(tp, run, done, i)
                done = i + 1
                yield self.failed(binding, msg, None, record, None, failure)
            else:
                i = len(run)
        except GeneratorExit:
            raise
        except BaseException:
            # a handler's BaseException stops the app: the calls that returned before it are finished first
            if done < i:
                yield _run(tp, run, done, i)
            raise
        if done < i:
            yield _run(tp, run, done, i)

    def take_queued(self, msg: Message, queued: Queued) -> Iterator[Outcome]:
        """A record that waited in memory came to its turn: carry out what was decided when it was read."""
        if queued.duplicate is not None:
            if self.batches.holds(msg.tp) and not (yield from self.batches.settle(msg.tp)):
                return
            yield queued.duplicate
            return
        yield from self._handle(self._bindings[msg.topic], msg, queued.key, queued.state, queued.bad)

    def abandon_deferred(self) -> list[Abandoned]:
        """After an abandoned record: nothing deferred for a batch handler may be called in this poll either;
        each partition's deferred records are read again from the first."""
        return self.batches.abandon()

    def settle_deferred(self) -> Generator[Outcome, None, bool]:
        """Call the batch handlers on every record deferred for them (`BatchCalls.settle`)."""
        return (yield from self.batches.settle())

    def failed(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        record: Record[Any],
        state: RetryHeaders | None,
        failure: BaseException,
    ) -> Failed:
        """A failure's outcome, with its route (the state read when the record arrived; unreadable headers:
        None, and the failure says why)."""
        decision = route(binding.ctx, msg, failure, now_ms=self._now_ms(), rng=self._rng, previous=state)
        return Failed(msg, key, record, failure, decision, binding.ctx)

    def _handle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        """Call the handler (or defer the record to its batch handler's call): its outcome."""
        record, poison = build_record(binding, msg, state)
        failure: BaseException | None = bad or poison
        if binding.batch:
            deferred = Deferred(binding, msg, key, record, state, failure)
            if binding.ordering is not None and msg.key is not None:
                self.batches.defer_ordered(deferred)
            else:
                self.batches.defer(deferred)
            return
        if failure is None:
            failure = self._call(binding, msg, record)
            if failure is ABANDONED:
                yield Abandoned(msg)
                return
        if failure is None:
            yield Succeeded(msg, key, record)
        else:
            yield self.failed(binding, msg, key, record, state, failure)

    def _dropped(self, group: list[Deferred]) -> None:
        """A batch call dropped uncalled: its records are read again from the first (nothing kept here)."""
        return None

    def _settled_before(self, binding: Binding, msg: Message) -> Generator[Outcome, None, bool]:
        """Call what is deferred for `msg`'s partition before acting on `msg` (a batch handler's outcomes come
        in offset order); False when that call may have cost this consumer the partition."""
        if binding.batch and self.batches.holds(msg.tp):
            return (yield from self.batches.settle(msg.tp))
        return True

    def _call(self, binding: Binding, msg: Message, record: Record[Any]) -> BaseException | None:
        """Call the handler on `record` (a batch handler: on a list of it): None, its failure, or `ABANDONED`.
        A record this consumer may no longer act on must not hold its partition's commit position: it is read
        again (here or by the new owner), not finished."""
        failure: BaseException | None = None
        if binding.batch:
            outcomes = self._invoker.call_batch(binding, [record])
            failure = None if outcomes is None else outcomes[0]
        else:
            try:
                self._invoker.call(binding, record)
            except Exception as exc:  # noqa: BLE001 - every handler failure is routed; BaseException stops the app
                failure = exc
        if self._ownership.lost_ownership(msg) or (failure is not None and self._ownership.stopping(msg, failure)):
            return ABANDONED
        return failure


class _Abandoned(Exception):
    """The marker `_call` returns for a call this consumer may no longer act on (never raised)."""


#: what `_call` returns for a call this consumer may no longer act on (the record is read again, not finished)
ABANDONED = _Abandoned()


def _run(tp: TopicPartition, run: Run, start: int, end: int) -> SucceededRun:
    return SucceededRun(tp, run if start == 0 and end == len(run) else run[start:end], None, [])
