"""Batch handler calls: the records deferred for a batch handler (runtime/batching.py says which, and why in
offset order) go to one call per partition, and each outcome is then settled as a single call's would be
(runtime/outcomes.py). Whatever else the loop does to a partition first settles what is deferred for it
(`BatchCaller.before_acting`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.runtime.batching import Deferred, DeferredCalls
from retrytopics.runtime.dispatch import Binding, Invoker, build_record
from retrytopics.runtime.guard import OwnershipGuard
from retrytopics.runtime.outcomes import Outcomes
from retrytopics.runtime.pausing import PauseController

__all__ = ["BatchCaller"]


class BatchCaller:
    """Holds the deferred records of one loop and calls their batch handlers."""

    def __init__(
        self,
        invoker: Invoker,
        outcomes: Outcomes,
        guard: OwnershipGuard,
        pauses: PauseController[Any],
        *,
        stop: threading.Event,
    ) -> None:
        self._invoker = invoker
        self._outcomes = outcomes
        self._guard = guard
        self._pauses = pauses
        self._stop = stop
        #: the records waiting for their call; the loop reads `deferred.keys` (a copy of one is a duplicate)
        self.deferred = DeferredCalls()

    def defer(self, item: Deferred) -> None:
        self.deferred.add(item)

    def before_acting(self, tp: TopicPartition) -> bool:
        """Settle what is deferred for `tp` before anything else happens to it; False when that lost this
        consumer the partition's ownership (the caller then leaves the record alone)."""
        if self.deferred.holds(tp):
            self.settle(tp)
        return not self._guard.abandoned

    def settle(self, tp: TopicPartition | None = None) -> None:
        """Call the batch handlers on the records deferred for `tp` (default: all), one call per partition."""
        for group in self.deferred.take(tp):
            self._call(group)

    def call_run(self, binding: Binding, msgs: list[Message]) -> None:
        """One call on the plain source records of one partition in one poll (runtime/cycle.py says when a
        run is plain): no retry state, no audit key and nothing to decide per record, so no `Deferred` each.
        A record that fails before the call (poison) makes it an ordinary group, settled in offset order."""
        built = [build_record(binding, m, None) for m in msgs]
        if any(poison is not None for _, poison in built):
            self._call([Deferred(binding, m, None, r, None, p) for m, (r, p) in zip(msgs, built, strict=False)])
            return
        records = [record for record, _ in built]
        outcomes = self._called(binding, msgs[0], records)
        if outcomes is None:
            return
        if all(o is None for o in outcomes):
            self._outcomes.run_succeeded(msgs[0].tp, msgs)
            return
        self._settle_each(
            [Deferred(binding, m, None, r, None, None) for m, r in zip(msgs, records, strict=False)], iter(outcomes)
        )

    def _call(self, group: list[Deferred]) -> None:
        first = group[0]
        called = [d for d in group if d.failure is None]
        outcomes = self._called(first.binding, first.msg, [d.record for d in called])
        if outcomes is None:
            return
        if len(called) == len(group) and all(o is None for o in outcomes):
            self._outcomes.all_succeeded(group)
            return
        self._settle_each(group, iter(outcomes))

    def _called(self, binding: Binding, first: Message, records: list[Any]) -> list[BaseException | None] | None:
        """The outcomes of one call on `records` (none: no call), or None when nothing may be settled: the app
        is stopping, or this consumer lost (or may have lost) the partition before or during the call; the
        records are then read again, here or by the new owner."""
        if self._guard.abandoned or self._stop.is_set():
            if not self._stop.is_set():
                self._pauses.restart_at(first.tp, first.offset)
            return None
        outcomes = self._invoker.call_batch(binding, records) if records else []
        if records and self._guard.lost_ownership(first):
            self._pauses.restart_at(first.tp, first.offset)
            return None
        return outcomes

    def _settle_each(self, group: list[Deferred], outcomes: Iterator[BaseException | None]) -> None:
        """In offset order: a record that failed before the call keeps that failure, the others take the
        call's outcomes in turn."""
        for d in group:
            failure = d.failure if d.failure is not None else next(outcomes)
            if failure is not None and self._guard.stopping(d.msg, failure):
                return  # this record and the rest of the group stay unsettled, so uncommitted
            self._outcomes.settle(d.binding, d.msg, d.key, d.record, d.state, failure)
