"""A handler call's outcome made final through the hand-off strategy (runtime/handoff.py, so no delivery-mode
branch here): a success is finished at once and counted in its batch's `records.handled` (runtime/tally.py);
a failure is routed (`router.route`: a tier or the DLQ) and handed off, finished once the broker has it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.diagnostics import described_failure
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.router import route
from retrytopics.observe.events import Event
from retrytopics.runtime.batching import Deferred
from retrytopics.runtime.dispatch import Binding
from retrytopics.runtime.handoff import HandOff
from retrytopics.runtime.publish import PublishJob, too_large_fallback
from retrytopics.runtime.tally import HandledTally

__all__ = ["Outcomes"]

#: a source record's timing: handled_at - due_at is the lateness metric, which only retried records have
_NO_TIMING: Mapping[str, object] = MappingProxyType({"due_at": None, "handled_at": None})


class Outcomes:
    """Settles the outcomes of one loop's handler calls, and ends its poll batches (report, then commit)."""

    def __init__(
        self,
        handoff: HandOff,
        handled: HandledTally,
        emit: Callable[..., None],
        *,
        each_handled: bool,
        rng: random.Random,
        now_ms: Callable[[], int],
    ) -> None:
        self._handoff = handoff
        self._handled = handled
        self._emit = emit
        self._each_handled = each_handled  # `record.handled` per record, for a hook that asks for it
        self._rng = rng
        self._now_ms = now_ms

    def settle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        record: Any,
        state: RetryHeaders | None,
        failure: BaseException | None,
    ) -> None:
        """After the handler call (or a failure before any): finish the record, or route and hand it off."""
        timing = {"due_at": state.due_at, "handled_at": self._now_ms()} if state is not None else _NO_TIMING
        if failure is None:
            self._succeeded(msg, key, record, timing)
            return
        # Tracked without settling deferred batch records first: there are none before it in its partition (a
        # batch handler's records come here already taken out of them; a single-record handler's never wait).
        epoch = self._handoff.track(msg.tp, msg.offset)
        if key is not None:
            self._handoff.remember(key)
        self._emit(
            Event.RECORD_FAILED,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            attempt=record.attempt,
            error=type(described_failure(failure)).__name__,
            **timing,
        )
        self._hand_off(binding, msg, epoch, record, state, failure)

    def all_succeeded(self, group: list[Deferred]) -> None:
        """Every record of a batch call succeeded: finished and counted in one step."""
        tp = group[0].msg.tp
        self._handoff.succeeded_run(tp, [d.msg.offset for d in group])
        now = self._now_ms()
        lateness = [now - d.state.due_at for d in group if d.state is not None and d.state.due_at is not None]
        for d in group:
            if d.key is not None:
                self._handoff.remember(d.key)
            if self._each_handled:
                self._emit(
                    Event.RECORD_HANDLED,
                    topic=d.msg.topic,
                    partition=d.msg.partition,
                    offset=d.msg.offset,
                    attempt=d.record.attempt,
                    due_at=d.state.due_at if d.state else None,
                    handled_at=now if d.state else None,
                )
        self._handled.add_run(tp, group[0].msg.offset, group[-1].msg.offset, len(group), lateness)

    def run_succeeded(self, tp: TopicPartition, msgs: list[Message]) -> None:
        """`all_succeeded` for a plain run of source records (runtime/batch_calls.py): no keys, no lateness."""
        self._handoff.succeeded_run(tp, [m.offset for m in msgs])
        if self._each_handled:
            for m in msgs:
                self._emit(
                    Event.RECORD_HANDLED, topic=m.topic, partition=m.partition, offset=m.offset, attempt=1, **_NO_TIMING
                )
        self._handled.add_run(tp, msgs[0].offset, msgs[-1].offset, len(msgs), [])

    def end_batch(self) -> None:
        """A poll batch is over: one `records.handled` per partition, then the strategy's commit."""
        self._handled.flush(self._emit)
        self._handoff.end_batch()

    def _succeeded(self, msg: Message, key: AuditKey | None, record: Any, timing: Mapping[str, Any]) -> None:
        """A handler call returned: the record is finished, and counted for the batch's `records.handled`."""
        self._handoff.succeeded(msg.tp, msg.offset)
        if key is not None:
            self._handoff.remember(key)
        due_at = timing["due_at"]
        self._handled.add(msg.tp, msg.offset, None if due_at is None else timing["handled_at"] - due_at)
        if self._each_handled:
            self._emit(
                Event.RECORD_HANDLED,
                topic=msg.topic,
                partition=msg.partition,
                offset=msg.offset,
                attempt=record.attempt,
                **timing,
            )

    def _hand_off(
        self,
        binding: Binding,
        msg: Message,
        epoch: int,
        record: Any,
        state: RetryHeaders | None,
        failure: BaseException,
    ) -> None:
        # the state read when the record arrived (unreadable headers: None, and the failure says why)
        decision = route(binding.ctx, msg, failure, now_ms=self._now_ms(), rng=self._rng, previous=state)
        job = PublishJob(
            route=decision,
            key=msg.key,
            value=msg.value,
            source=msg.tp,
            offset=msg.offset,
            context=record,
            shrink=too_large_fallback(binding.ctx),
        )
        self._handoff.hand_off(job, epoch)
