"""One iteration of a consumer loop, over the clients and parts made when the loop started: the steps are
listed in runtime/loop.py's docstring. The clock is the loop's, passed in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ConsumerPort, Message
from retrytopics.runtime.batch_calls import BatchCaller
from retrytopics.runtime.guard import OwnershipGuard
from retrytopics.runtime.handoff import HandOff
from retrytopics.runtime.outcomes import Outcomes
from retrytopics.runtime.pausing import PauseController
from retrytopics.runtime.processing import Decoded, RecordProcessor

__all__ = ["PollCycle"]

#: how many records of a batch are read between two checks for records waiting in memory that fell due
_DUE_CHECK_EVERY = 32


class PollCycle:
    """Runs a loop's iterations, one `run_once()` each."""

    def __init__(
        self,
        consumer: ConsumerPort,
        pauses: PauseController[Decoded],
        handoff: HandOff,
        guard: OwnershipGuard,
        processor: RecordProcessor,
        batches: BatchCaller,
        outcomes: Outcomes,
        *,
        batch_size: int,
        max_wait_ms: int,
        assigned: set[TopicPartition],
        stop: threading.Event,
        now_ms: Callable[[], int],
        monotonic: Callable[[], float],
    ) -> None:
        self._batch_size = batch_size
        self._max_wait_ms = max_wait_ms
        self._consumer = consumer
        self._pauses = pauses
        self._handoff = handoff
        self._guard = guard
        self._processor = processor
        self._batches = batches
        self._outcomes = outcomes
        self._assigned = assigned
        self._stop = stop
        self._now_ms = now_ms
        self._monotonic = monotonic

    def run_once(self) -> None:
        """Serve acknowledgements, consume one batch, act on it, end it (report and commit)."""
        handoff, pauses, guard = self._handoff, self._pauses, self._guard
        handoff.serve()
        self._update_holds()
        now = self._now_ms()
        pauses.resume_due(now)
        if not guard.woke_expelled(self._monotonic() - guard.polled_at, []):
            self._act_on_queued(now)
        wait_ms = handoff.wait_ms(pauses.wait_ms(self._now_ms(), self._max_wait_ms))
        asked = self._monotonic()
        guard.in_poll = True
        batch = self._consumer.consume(self._batch_size, wait_ms / 1000)
        # Judged from before the wake: a consume() that overran its timeout by more than half the session
        # was frozen in it (SIGSTOP, a VM pause), and its return says nothing about membership yet.
        if not guard.woke_expelled(guard.polled() - asked - wait_ms / 1000, batch):
            self._act_on_batch(batch)
            self._batches.settle()
        self._outcomes.end_batch()

    def _act_on_batch(self, batch: list[Message]) -> None:
        runs = self._processor.plain_runs(batch)
        if runs is not None:  # a main consumer: each partition's run in one step, no decision per record
            for binding, msgs in runs:
                if binding.batch:
                    self._batches.call_run(binding, msgs)
                else:
                    self._processor.call_run(binding, msgs)
                self._handoff.serve(within_batch=True)
            return
        handoff, pauses, guard, read = self._handoff, self._pauses, self._guard, self._processor.read
        for i, msg in enumerate(batch):
            if self._stop.is_set():
                break
            if pauses.accept(msg):
                read(msg)
            if guard.abandoned:
                self._restart_at(batch[i:])
                break
            handoff.serve(within_batch=True)
            if not (i + 1) % _DUE_CHECK_EVERY and pauses.any_queued_due(now := self._now_ms()):
                # Records waiting in memory fall due while a large batch is read: serve them in between.
                self._act_on_queued(now, refill=False)
                if guard.abandoned:
                    self._restart_at(batch[i + 1 :])
                    break

    def _act_on_queued(self, now_ms: int, *, refill: bool = True) -> None:
        """Act on the records waiting in memory that are due (see runtime/pausing.py)."""
        for msg, (state, bad) in self._pauses.take_due(now_ms, refill=refill):
            self._processor.process(msg, state, bad, queued=True)
            if self._guard.abandoned:
                self._restart_at([msg])  # drops what queued behind it, too
                break
            if self._stop.is_set():
                break
            if self._handoff.publisher.in_flight:
                self._handoff.publisher.poll(0)
        self._batches.settle()

    def _restart_at(self, rest: list[Message]) -> None:
        """After an abandoned record: read it and the rest of the batch again. librdkafka only leaves the
        group once its own max.poll timer fires (up to ~0.5 s late, measured), and the next poll resets that
        timer, so a consumer that abandoned a record may well still own its partition; without this seek,
        the record was never read again and the partition's commit position stuck below it for good."""
        # first the records deferred for batch handlers, which come before `rest` in their partitions (a
        # partition keeps the first restart point it is given)
        self._batches.settle()
        starts: dict[TopicPartition, int] = {}
        for msg in rest:
            starts.setdefault(msg.tp, msg.offset)
        for tp, offset in starts.items():
            self._pauses.restart_at(tp, offset)

    def _update_holds(self) -> None:
        """Hold the partitions whose publish is failing (no records pile up in memory), release the others."""
        for tp in list(self._assigned):
            failing, held = self._handoff.publisher.is_failing(tp), self._pauses.schedule.is_held(tp)
            if failing and not held:
                self._pauses.hold(tp, None)
            elif held and not failing:
                self._pauses.release(tp)
