"""What a consumer loop does with each record it accepts: read its retry state, decide (retrytopics/core/step.py,
pure) and carry the decision out:

- handle: call the handler and settle the outcome (runtime/outcomes.py), or defer the record to its batch
  handler's call (runtime/batch_calls.py);
- a duplicate hop: finish it without a call (runtime/duplicates.py);
- not due yet: wait in memory, or pause the partition in Kafka (runtime/pausing.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from retrytopics.core.dedupe import AuditKey, DuplicateAudit, audit_key
from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.router import longest_wait_ms, read_retry_state
from retrytopics.core.step import Action, decide
from retrytopics.runtime.batch_calls import BatchCaller
from retrytopics.runtime.batching import Deferred
from retrytopics.runtime.dispatch import Binding, Invoker, build_record
from retrytopics.runtime.duplicates import DuplicateSuppressor
from retrytopics.runtime.guard import OwnershipGuard
from retrytopics.runtime.outcomes import Outcomes
from retrytopics.runtime.pausing import PauseController

__all__ = ["Decoded", "RecordProcessor"]

#: what was read from a record's retry headers: its state, or why it is invalid (kept with a record that
#: waits in memory, so that its headers are read once)
Decoded = tuple[RetryHeaders | None, HeaderDecodeError | None]


class RecordProcessor:
    """Acts on the records of one loop, one at a time (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        pauses: PauseController[Decoded],
        audit: DuplicateAudit,
        invoker: Invoker,
        guard: OwnershipGuard,
        outcomes: Outcomes,
        batches: BatchCaller,
        duplicates: DuplicateSuppressor,
        *,
        now_ms: Callable[[], int],
        stop: threading.Event,
    ) -> None:
        self._bindings = bindings
        self._pauses = pauses
        self._audit = audit
        self._invoker = invoker
        self._guard = guard
        self._outcomes = outcomes
        self._batches = batches
        self._duplicates = duplicates
        self._now_ms = now_ms
        self._stop = stop
        # a main consumer (source topics only): its polls can go to the handlers partition by partition
        self._sources_only = all(topic == b.topic for topic, b in bindings.items())

    def plain_runs(self, batch: list[Message]) -> list[tuple[Binding, list[Message]]] | None:
        """`batch` as runs per partition, when each record would be handed to its handler as it is: on a
        source topic nothing is decided per record (no retry state, so no due time and no audit key; never
        queued in memory), so `step.decide` would say HANDLE for every record that is accepted and was not
        handed off downstream already. A run goes to `call_run` (single-record handlers) or to
        `BatchCaller.call_run`. None: act on the records one by one."""
        if not self._sources_only:
            return None
        # rare: only after a previous owner died between hand-off and commit. Asked before any `accept`,
        # which the records' ordinary path then asks again (accepting a sought-back record forgets the seek)
        if self._duplicates.seeded and any(self._duplicates.was_handed_off(m, None, None) for m in batch):
            return None
        pauses, accept = self._pauses, self._pauses.accept
        runs: dict[TopicPartition, list[Message]] = {}
        run: list[Message] = []
        tp: TopicPartition = ("", -1)
        open_ = False  # every record of `tp` is accepted without asking (a poll comes in runs per partition)
        for msg in batch:
            if msg.partition != tp[1] or msg.topic != tp[0]:
                tp = (msg.topic, msg.partition)
                run = runs.setdefault(tp, [])
                open_ = pauses.accepts_all(tp)
            if open_ or accept(msg):
                run.append(msg)
        return [(self._bindings[tp[0]], run) for tp, run in runs.items() if run]

    def call_run(self, binding: Binding, msgs: list[Message]) -> None:
        """A plain run of one partition for a single-record handler: one call per record, in offset order,
        with no decision per record. The successes between two failures are finished in one step; a failure,
        or a record that fails before its call (poison), is settled as `_handle` settles it. A record this
        consumer may no longer act on stops the run: it and the rest are read again. However the run ends
        (stopping, a BaseException from a handler), the calls that returned are finished, as one by one."""
        guard, settle, stopped = self._guard, self._outcomes.settle, self._stop.is_set
        call, clock, sure_until = self._invoker.caller(binding), guard.monotonic, guard.sure_until
        tp = msgs[0].tp
        if guard.abandoned:  # an earlier run of this poll lost ownership: this one is read again too
            self._pauses.restart_at(tp, msgs[0].offset)
            return
        done = returned = 0  # msgs[done:returned]: calls that returned, not finished yet
        try:
            for i, msg in enumerate(msgs):
                if stopped():
                    return
                record, poison = build_record(binding, msg, None)
                failure: BaseException | None = poison
                if failure is None:
                    try:
                        call(record)
                    except Exception as exc:  # noqa: BLE001 - every handler failure is routed; BaseException stops the app
                        failure = exc
                    if clock() > sure_until:  # a long call: asked with what is finished (runtime/ownership.py)
                        start, done = done, returned  # (moved first: the `finally` never finishes them twice)
                        self._run_succeeded(tp, msgs, start, returned)
                        if guard.lost_ownership(msg):
                            self._pauses.restart_at(tp, msg.offset)
                            return
                    if failure is None:
                        returned = i + 1
                        continue
                    if guard.stopping(msg, failure):
                        return
                start, done, returned = done, i + 1, i + 1
                self._run_succeeded(tp, msgs, start, i)
                settle(binding, msg, None, record, None, failure)
        finally:
            self._run_succeeded(tp, msgs, done, returned)

    def _run_succeeded(self, tp: TopicPartition, msgs: list[Message], start: int, end: int) -> None:
        if start < end:
            self._outcomes.run_succeeded(tp, msgs[start:end] if start or end < len(msgs) else msgs)

    def read(self, msg: Message) -> None:
        """Act on a record just consumed."""
        binding = self._bindings[msg.topic]
        if msg.topic == binding.topic:  # a source record carries no retry state the router would read
            if self._duplicates.seeded:
                self.process(msg, None, None, queued=False)
            else:  # no state, never queued, nothing handed off downstream: `decide` can only say HANDLE
                self._handle(binding, msg, None, None, None)
            return
        state: RetryHeaders | None = None
        bad: HeaderDecodeError | None = None
        try:
            state = read_retry_state(binding.ctx, msg, now_ms=self._now_ms())
        except HeaderDecodeError as exc:
            bad = exc
        self.process(msg, state, bad, queued=False)

    def process(self, msg: Message, state: RetryHeaders | None, bad: HeaderDecodeError | None, *, queued: bool) -> None:
        """Decide what to do with `msg` (retrytopics/core/step.py, pure) and do it; `queued`: it waited in memory."""
        binding = self._bindings[msg.topic]
        pauses = self._pauses
        now = self._now_ms()
        key = None if state is None else audit_key(state)
        due = self._due_at(binding, msg, state, now)
        behind = not queued and pauses.queued(msg.tp)  # earlier records of its partition wait in memory
        action = decide(
            behind_queue=behind,
            handed_off=not behind and self._duplicates.was_handed_off(msg, state, bad),
            duplicate=key is not None and (key in self._audit or key in self._batches.deferred.keys),
            due_ms=due,
            now_ms=now,
            horizon_ms=pauses.ahead_ms,
        )
        if action is Action.HANDLE:
            self._handle(binding, msg, key, state, bad)
        elif action is Action.FINISH_HANDED_OFF:
            self._duplicates.finish_handed_off(msg, state)
        elif action is Action.SUPPRESS_DUPLICATE:
            assert state is not None
            self._duplicates.suppress(msg, state)
        elif self._batches.before_acting(msg.tp):  # the partition waits: what is deferred for it is settled first
            if action is Action.PAUSE:
                assert due is not None
                pauses.pause_until(msg.tp, msg.offset, due)
            else:
                pauses.enqueue(msg, due, (state, bad), now)

    def _handle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: HeaderDecodeError | None,
    ) -> None:
        """Call the handler (or defer the record to its batch handler's call), then settle the outcome."""
        record, poison = build_record(binding, msg, state)
        failure: BaseException | None = bad or poison
        if binding.batch:
            self._batches.defer(Deferred(binding, msg, key, record, state, failure))
            return
        if failure is None:
            try:
                self._invoker.call(binding, record)
            except Exception as exc:  # noqa: BLE001 - every handler failure is routed; BaseException stops the app
                failure = exc
            # Tracked only now: a record this consumer may no longer act on must not hold its partition's
            # commit position, since it is read again (here or by the new owner), not finished.
            if self._guard.lost_ownership(msg) or (failure is not None and self._guard.stopping(msg, failure)):
                return
        self._outcomes.settle(binding, msg, key, record, state, failure)

    def _due_at(self, binding: Binding, msg: Message, state: RetryHeaders | None, now: int) -> int | None:
        """When `msg` is due here: its `retry.due_at`, bounded by its tier's longest delay from when this
        consumer first saw it (runtime/pausing.py); a record due already costs one comparison."""
        if state is None or state.due_at is None or state.due_at <= now:
            return None if state is None else state.due_at
        return self._pauses.bounded_due(msg, state.due_at, longest_wait_ms(binding.ctx, msg.topic) or 0, now)
