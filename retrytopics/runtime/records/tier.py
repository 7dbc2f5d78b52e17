"""The tier path of the records stage: a tier consumer's records, and the only part of the stage that asks
waiting (runtime/waiting.py) anything.

`read(msg)`: a tier record's retry state is read once (malformed: its failure is kept, the record goes to the
DLQ as `invalid_retry_headers` in its turn); its due time is bounded once (retrytopics/core/due.py); a record
found downstream at assignment, or already handled here, is a `Duplicate`; a record not due is `Waiting` (in
memory, with what was decided, or in Kafka); a record behind others waiting in memory waits behind them with
its decision, so offset order is kept. What was decided for a record that waited in memory is carried out by
`take_queued` (runtime/records/stage.py) when it falls due.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping

from retrytopics.core.dedupe import DuplicateAudit, audit_key
from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.ports import Message
from retrytopics.core.router import read_retry_state
from retrytopics.core.step import Action, decide
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.records.calls import Binding, Invoker
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import Outcome, Queued, Waiting
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["TierStage"]


class TierStage(RecordStage):
    """The records stage of a tier consumer (see the module docstring)."""

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
    ) -> None:
        super().__init__(bindings, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        self._waiting = waiting

    def read(self, msg: Message) -> Iterator[Outcome]:
        """A record just consumed and accepted (see the module docstring)."""
        binding = self._bindings[msg.topic]
        state: RetryHeaders | None = None
        bad: HeaderDecodeError | None = None
        if msg.topic == binding.topic:  # a source record carries no retry state the router would read
            if not self._duplicates.seeded:  # nothing handed off downstream: only HANDLE is possible
                yield from self._handle(binding, msg, None, None, None)
                return
        else:
            try:
                state = read_retry_state(binding.ctx, msg, now_ms=self._now_ms())
            except HeaderDecodeError as exc:
                bad = exc
        yield from self._decided(binding, msg, state, bad)

    def _decided(
        self, binding: Binding, msg: Message, state: RetryHeaders | None, bad: HeaderDecodeError | None
    ) -> Iterator[Outcome]:
        """What `msg`, read with retry state `state` (or its failure `bad`), is: decided once (core/step.py)."""
        now = self._now_ms()
        key = None if state is None else audit_key(state)
        due = self._due_at(binding, msg, state, now)
        waiting = self._waiting
        action = decide(
            handed_off=self._duplicates.was_handed_off(msg, state, bad),
            duplicate=key is not None and (key in self._audit or key in self.batches.keys or waiting.holds_key(key)),
            due_ms=due,
            now_ms=now,
            horizon_ms=waiting.ahead_ms,
        )
        if action is Action.HANDLE and not waiting.queued(msg.tp):
            yield from self._handle(binding, msg, key, state, bad)
            return
        # Anything else first calls what is deferred for the partition's batch handler (offset order).
        if self.batches.holds(msg.tp) and not (yield from self.batches.settle(msg.tp)):
            return
        duplicate = None
        if action is Action.FINISH_HANDED_OFF or action is Action.SUPPRESS_DUPLICATE:
            duplicate = self._duplicates.duplicate(msg, state, downstream=action is Action.FINISH_HANDED_OFF)
            if not waiting.queued(msg.tp):
                yield duplicate
                return
        if action is Action.PAUSE and not waiting.queued(msg.tp):
            yield Waiting(msg, due, None)
            return
        # due within the horizon, or behind records of its partition waiting in memory: it waits there too
        yield Waiting(
            msg,
            due if action is Action.WAIT_IN_MEMORY or action is Action.PAUSE else None,
            Queued(state, key, bad, duplicate),
        )

    def _due_at(self, binding: Binding, msg: Message, state: RetryHeaders | None, now: int) -> int | None:
        """When `msg` is due here: its `retry.due_at`, bounded by its tier's longest wait from when this
        consumer first saw it (retrytopics/core/due.py); a record due already costs one comparison."""
        if state is None or state.due_at is None or state.due_at <= now:
            return None if state is None else state.due_at
        return self._waiting.bounded_due(msg, state.due_at, binding.wait_bounds_ms.get(msg.topic, 0), now)
