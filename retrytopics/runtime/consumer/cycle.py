"""One iteration of a consumer loop, and the one place where outcomes are handed to the part that acts on them.

1. Serve the hand-off's delivery reports; hold partitions whose publish is failing, release the others.
2. Resume partitions whose head record is due; act on the records waiting in memory that fell due.
3. `consume()` for at most min(next due time, max wait); after a gap in polling long enough to have cost the
   membership, ask before touching a record (runtime/records/ownership.py).
4. Each record goes to the records stage (runtime/records/stage.py), which yields outcomes; each outcome goes
   to one place: `Waiting` to waiting (runtime/waiting.py), `Abandoned` back here (the rest of the poll is read
   again), everything else to the hand-off (runtime/handoff/).
5. End the batch: the hand-off reports and commits.

The clock is the loop's (runtime/clock.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ConsumerPort, Message, Polled, consume_runs, message_of
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.handoff.handoff import HandOff
from retrytopics.runtime.handoff.ordered import KeyWrites
from retrytopics.runtime.lag import LagProbe
from retrytopics.runtime.records.calls import Run
from retrytopics.runtime.records.ordering import KeyOrder, TierOrder
from retrytopics.runtime.records.outcome import Abandoned, Held, Outcome, Waiting
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["PollCycle"]

#: how many records of a batch are read between two checks for records waiting in memory that fell due
_DUE_CHECK_EVERY = 32
#: the longest `consume()` wait while a main consumer's key order keeps records parked for an acknowledgement, of a
#: partition whose publish is not failing: `consume()` does not wake for an acknowledgement (a tier's such records
#: wait in memory, due one poll later)
_ACK_AWAITED_WAIT_MS = 1


class PollCycle:
    """Runs a loop's iterations, one `run_once()` each."""

    def __init__(
        self,
        consumer: ConsumerPort,
        stage: RecordStage,
        waiting: PauseController,
        handoff: HandOff,
        ownership: OwnershipGuard,
        *,
        batch_size: int,
        max_wait_ms: int,
        assigned: set[TopicPartition],
        stop: threading.Event,
        clock: Clock,
        key_order: tuple[KeyOrder | TierOrder, KeyWrites] | None = None,
        lag: LagProbe | None = None,
    ) -> None:
        self._consumer = consumer
        self._lag = lag
        self._key_order = key_order
        self._stage = stage
        self._waiting = waiting
        self._handoff = handoff
        self._ownership = ownership
        self._batch_size = batch_size
        self._max_wait_ms = max_wait_ms
        self._assigned = assigned
        self._stop = stop
        self._now_ms = clock.now_ms
        self._monotonic = clock.monotonic
        #: a main consumer's key order: it parks records (`KeyOrder.park`)
        self._parking = key_order[0] if key_order is not None and isinstance(key_order[0], KeyOrder) else None

    def run_once(self) -> None:
        """Serve acknowledgements, consume one batch, act on it, end it (report and commit)."""
        handoff, waiting, ownership = self._handoff, self._waiting, self._ownership
        handoff.serve()
        if self._lag is not None:
            self._lag.tick()  # never waits: an answer is read when it came
        if self._key_order is not None:
            self._learn_key_state(*self._key_order)
        self._update_holds()
        now = self._now_ms()
        waiting.resume_due(now)
        if not self._woke_expelled(self._monotonic() - ownership.polled_at, []):
            self._act_on_parked()
            self._act_on_queued(now)
        wait_ms = handoff.wait_ms(waiting.wait_ms(self._now_ms(), self._max_wait_ms))
        if self._key_order is not None and any(
            not handoff.publisher.is_failing(tp) for tp in self._key_order[0].awaiting_acks()
        ):
            wait_ms = min(wait_ms, _ACK_AWAITED_WAIT_MS)  # not while their publish fails: no acknowledgement soon
        asked = self._monotonic()
        ownership.in_poll = True
        polled = consume_runs(self._consumer, self._batch_size, wait_ms / 1000, self._stage.run_topics)
        # Judged from before the wake: a consume() that overran its timeout by more than half the session
        # was frozen in it (SIGSTOP, a VM pause), and its return says nothing about membership yet.
        batch, built = polled
        if not self._woke_expelled(
            ownership.polled() - asked - wait_ms / 1000,
            batch + [message_of(run[0]) for run in built] if built else batch,
        ):
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
        batch, runs = stage.runs_of(polled)
        if runs is not None:  # a main consumer: each partition's run in one step, no decision per record
            for i, (binding, run) in enumerate(runs):
                if not self._act_on(stage.call_run(binding, run)):
                    # each later run is one partition's, from its first record on
                    self._restart_at([_head(later) for _, later in runs[i + 1 :]])
                    return
                handoff.serve(within_batch=True)
                if self._parking is not None and not self._act_on_parked():
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

    def _act_on_parked(self) -> bool:
        """Key order: act on the parked records whose key's last hop is acknowledged now (`KeyOrder.unpark`),
        for the partitions whose publish is not failing; False after an `Abandoned`."""
        parking = self._parking
        if parking is None or not parking.parks:
            return True
        failing, assigned = self._handoff.publisher.is_failing, self._assigned
        for msg in parking.unpark(lambda tp: tp in assigned and not failing(tp)):
            if not self._act_on(self._stage.unparked(msg)):
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

    def _learn_key_state(self, key_order: KeyOrder | TierOrder, writes: KeyWrites) -> None:
        """Key order: read the key state of partitions not started yet, and the tiers' passages; write the
        tombstones of the chains they close."""
        if key_order.not_started:
            self._handoff.reading_key_state()  # the read waits for transactions open in the key state
        writes.write(key_order.read_pending())
        writes.write(key_order.learn())

    def _update_holds(self) -> None:
        """Hold the partitions whose publish is failing (no records pile up in memory) or that key order stops,
        release the others."""
        publisher, waiting = self._handoff.publisher, self._waiting
        holds = None if self._key_order is None else self._key_order[0].holds
        for tp in list(self._assigned):
            failing, held = publisher.is_failing(tp) or (holds is not None and holds(tp)), waiting.schedule.is_held(tp)
            if failing and not held:
                waiting.hold(tp, None)
            elif held and not failing:
                waiting.release(tp)


def _head(run: Run) -> Message:
    first = run[0]
    return first if isinstance(first, Message) else message_of(first)
