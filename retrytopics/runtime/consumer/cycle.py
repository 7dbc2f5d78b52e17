"""One iteration of a consumer loop, and the one place where outcomes are handed to the part that acts on them.

1. Serve the hand-off's delivery reports; run the steps before a poll (the lag probe, key order's reads);
   hold the partitions some reason holds (runtime/consumer/holds.py), release the others.
2. Resume partitions whose head record is due; act on the records the stage kept that may go on now, and on
   the records waiting in memory that fell due.
3. `consume()` for at most min(next due time, max wait); after a gap in polling long enough to have cost the
   membership, ask before touching a record (runtime/records/ownership.py).
4. Each record goes to the records stage (runtime/records/stage.py), which yields outcomes; each outcome goes
   to one place: `Waiting` to waiting (runtime/waiting.py), `Abandoned` back here (the rest of the poll is read
   again), everything else to the hand-off (runtime/handoff/).
   The hand-off learns how far each partition was read (an idle poll may commit a partition's tail past
   transaction markers, runtime/handoff/tails.py).
5. End the batch: the hand-off reports and commits.

The clock is the loop's (runtime/clock.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ConsumerPort, Message, Polled, consume_runs, message_of
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.consumer.holds import HoldReason
from retrytopics.runtime.handoff.handoff import HandOff
from retrytopics.runtime.records.calls import Run
from retrytopics.runtime.records.outcome import Abandoned, Held, Outcome, Waiting
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["CycleParts", "PollCycle"]

#: how many records of a batch are read between two checks for records waiting in memory that fell due
_DUE_CHECK_EVERY = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleParts:
    """The parts one loop's cycle hands records and outcomes to, made once by the loop (runtime/consumer/loop.py).
    `before_poll`: steps run at the start of every iteration (the lag probe's tick, key order's reads), none of
    which may wait; `holds`: the reasons to hold a partition (runtime/consumer/holds.py)."""

    consumer: ConsumerPort
    stage: RecordStage
    waiting: PauseController
    handoff: HandOff
    ownership: OwnershipGuard
    holds: Sequence[HoldReason] = ()
    before_poll: Sequence[Callable[[], None]] = ()


class PollCycle:
    """Runs a loop's iterations, one `run_once()` each."""

    def __init__(
        self,
        parts: CycleParts,
        *,
        batch_size: int,
        max_wait_ms: int,
        assigned: set[TopicPartition],
        stop: threading.Event,
        clock: Clock,
    ) -> None:
        self._consumer = parts.consumer
        self._stage = parts.stage
        self._waiting = parts.waiting
        self._handoff = parts.handoff
        self._ownership = parts.ownership
        self._holds = tuple(parts.holds)
        self._before_poll = tuple(parts.before_poll)
        self._batch_size = batch_size
        self._max_wait_ms = max_wait_ms
        self._assigned = assigned
        self._stop = stop
        self._now_ms = clock.now_ms
        self._monotonic = clock.monotonic
        #: the stage keeps records between polls (key order's parked ones): asked after each run too
        self._keeps_records = parts.stage.keeps_records

    def run_once(self) -> None:
        """Serve acknowledgements, consume one batch, act on it, end it (report and commit)."""
        handoff, waiting, ownership = self._handoff, self._waiting, self._ownership
        handoff.serve()
        for step in self._before_poll:
            step()
        self._update_holds()
        now = self._now_ms()
        waiting.resume_due(now)
        if not self._woke_expelled(self._monotonic() - ownership.polled_at, []):
            self._act_on_released()
            self._act_on_queued(now)
        wait_ms = self._stage.wait_ms(handoff.wait_ms(waiting.wait_ms(self._now_ms(), self._max_wait_ms)))
        asked = self._monotonic()
        ownership.in_poll = True
        batch_size = self._stage.batch_size(self._batch_size)
        polled = consume_runs(self._consumer, batch_size, wait_ms / 1000, self._stage.run_topics)
        # Judged from before the wake: a consume() that overran its timeout by more than half the session
        # was frozen in it (SIGSTOP, a VM pause), and its return says nothing about membership yet.
        batch, built = polled
        if not self._woke_expelled(
            ownership.polled() - asked - wait_ms / 1000,
            batch + [message_of(run[0]) for run in built] if built else batch,
        ):
            handoff.polled(polled)
            self._act_on_batch(polled)
            self._act_on(self._stage.settle_deferred())
        handoff.end_batch()

    def _act_on(self, outcomes: Iterator[Outcome]) -> bool:
        """Hand each outcome to the part that acts on it; False after an `Abandoned`: the records deferred for
        batch handlers are then read again too (the caller restarts the rest of the poll)."""
        handoff, waiting = self._handoff, self._waiting
        abandoned = False
        for outcome in outcomes:
            if type(outcome) is Waiting:
                msg, due_ms, queued = outcome
                if queued is None:
                    assert due_ms is not None  # paused in Kafka only until a due time
                    waiting.pause_until(msg.tp, msg.offset, due_ms)
                else:
                    waiting.enqueue(msg, due_ms, queued, self._now_ms())
            elif type(outcome) is Held:
                # read again from it (records queued in memory behind it too), once `_update_holds` releases it
                waiting.restart_at(outcome.msg.tp, outcome.msg.offset)
                waiting.hold(outcome.msg.tp, None)
            elif type(outcome) is Abandoned:
                abandoned = True
                waiting.restart_at(outcome.msg.tp, outcome.msg.offset)
            else:
                handoff.apply(outcome)
        if abandoned:
            for left in self._stage.abandon_deferred():
                waiting.restart_at(left.msg.tp, left.msg.offset)
        return not abandoned

    def _act_on_batch(self, polled: Polled) -> None:
        stage, handoff = self._stage, self._handoff
        batch, runs = stage.runs_of(polled, self._waiting)
        if runs is not None:  # a main consumer: each partition's run in one step, no decision per record
            for i, (binding, run) in enumerate(runs):
                if not self._act_on(stage.call_run(binding, run)):
                    # each later run is one partition's, from its first record on
                    self._restart_at([_head(later) for _, later in runs[i + 1 :]])
                    return
                handoff.serve(within_batch=True)
                if self._keeps_records and not self._act_on_released():
                    self._restart_at([_head(later) for _, later in runs[i + 1 :]])
                    return
            return
        accept, read = self._waiting.accept, stage.read
        for i, msg in enumerate(batch):
            if self._stop.is_set():
                break
            if accept(msg) and not self._act_on(read(msg)):
                self._restart_at(batch[i + 1 :])
                return
            handoff.serve(within_batch=True)
            if not (i + 1) % _DUE_CHECK_EVERY and self._waiting.any_queued_due(now := self._now_ms()):
                # Records waiting in memory fall due while a large batch is read: serve them in between.
                if not self._act_on_queued(now, refill=False):
                    self._restart_at(batch[i + 1 :])
                    return

    def _act_on_queued(self, now_ms: int, *, refill: bool = True) -> bool:
        """Act on the records waiting in memory that are due (see runtime/waiting.py); False when one was
        abandoned (it and what queued behind it are read again)."""
        take = self._stage.take_queued
        for msg, queued in self._waiting.take_due(now_ms, refill=refill):
            if not self._act_on(take(msg, queued)):
                return False
            if self._stop.is_set():
                break
            if self._handoff.publisher.in_flight:
                self._handoff.serve(within_batch=True)
        return self._act_on(self._stage.settle_deferred())

    def _act_on_released(self) -> bool:
        """Act on the records the stage kept that may go on now (key order's parked records whose key's last hop
        is acknowledged); False after an `Abandoned`."""
        for outcomes in self._stage.released():
            if not self._act_on(outcomes):
                return False
        return True

    def _restart_at(self, rest: list[Message]) -> None:
        """After an abandoned record: read the rest of the batch again. librdkafka only leaves the group once
        its own max.poll timer fires (up to ~0.5 s late), and the next poll resets that timer, so a consumer
        that abandoned a record may well still own its partition; without this seek, the record was never read
        again and the partition's commit position stuck below it for good. A partition keeps the first restart
        point it is given."""
        starts: dict[TopicPartition, int] = {}
        for msg in rest:
            starts.setdefault(msg.tp, msg.offset)
        for tp, offset in starts.items():
            self._waiting.restart_at(tp, offset)

    def _woke_expelled(self, gap_s: float, batch: list[Message]) -> bool:
        """After a freeze: whether this consumer was expelled, in which case what it kept from before the gap
        (records waiting in memory, `batch`) is read again, not acted on."""
        waiting = self._waiting

        def kept() -> dict[TopicPartition, int]:
            starts = waiting.queue_starts()
            for msg in batch:
                starts[msg.tp] = min(starts.get(msg.tp, msg.offset), msg.offset)
            return starts

        if not self._ownership.woke_expelled(gap_s, kept):
            return False
        for tp, offset in kept().items():
            waiting.restart_at(tp, offset)
        return True

    def _update_holds(self) -> None:
        """Hold the partitions some reason holds (a publish failing: no records pile up in memory; key order
        stopping them; ...), release the others."""
        reasons, schedule, waiting = self._holds, self._waiting.schedule, self._waiting
        for tp in list(self._assigned):
            held = schedule.is_held(tp)
            for reason in reasons:
                if reason.holds(tp):
                    if not held:
                        waiting.hold(tp, None)
                    break
            else:
                if held:
                    waiting.release(tp)


def _head(run: Run) -> Message:
    first = run[0]
    return first if isinstance(first, Message) else message_of(first)
