"""Batch handler calls (`RetryApp.batch_handler`): records deferred for one call per partition, and the
outcomes of that call.

The records stage decides about each record as for a single-record handler (a duplicate, not due yet, poison),
but a record to handle is *deferred*: the records of one partition gathered from one poll are passed to one
handler call, in offset order, and each gets its own outcome (success, or a failure with its route). A record
that failed before any call (poison, invalid retry headers) waits with them, so that every partition's
outcomes come in offset order: the offset tracker needs that, and so does the guarantee that nothing is
committed past an unsettled record. Whatever else happens to a partition (a wait, a duplicate) first calls
what is deferred for it (`BatchCalls.settle`). A main consumer's plain runs skip the deferral
(`BatchCalls.call_run`).

A key-ordered handler's call never holds two records of one key (docs/key-ordering.md, section 8): the records
stage cuts the call before the second (`holds_key`: the call is settled first, then that record is admitted
again), and a record key order decided before any call (a follower handed off unhandled, a copy finished)
waits in the group with its outcome, yielded in its place; so does a record it parked (`Parked`).

A `BatchGate` (the retry-flood guard's: runtime/flood/stage.py) is asked before each call, a main consumer's
plain runs included: it may cut a group into calls of one record, or hold it uncalled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, NamedTuple, Protocol, cast

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, message_of
from retrytopics.core.record import Record
from retrytopics.runtime.records.calls import Binding, Invoker, Run, build_record, build_run
from retrytopics.runtime.records.outcome import Abandoned, Failed, Outcome, Succeeded, SucceededRun
from retrytopics.runtime.records.ownership import OwnershipGuard

__all__ = ["BatchCalls", "BatchGate", "Deferred", "FailedOutcome", "GroupCall"]

#: builds a failure's outcome (its route decided once): the records stage's
FailedOutcome = Callable[
    [Binding, Message, "AuditKey | None", Record[Any], "RetryHeaders | None", BaseException], Failed
]


class Deferred(NamedTuple):
    binding: Binding
    msg: Message
    key: AuditKey | None
    record: Record[Any]
    state: RetryHeaders | None
    #: known before any call (poison, invalid headers): settled in its place, never passed to the handler
    failure: BaseException | None
    #: decided before any call by key order (a follower, a copy): yielded in its place, never passed either
    decided: Outcome | None = None


#: one call on a group (its records in offset order), yielding each record's outcome; False: the call may have
#: cost this consumer the partition (`Abandoned` yielded)
GroupCall = Callable[[list[Deferred]], Generator[Outcome, None, bool]]


class BatchGate(Protocol):
    """What each batch call goes through when a loop's stage asks before calling (the retry-flood guard):
    `settle` calls `call` on `group` (or on parts of it, or not at all) and yields what it makes of the
    outcomes; `drop(records)` gives back records it leaves uncalled (read again from the first)."""

    def settle(
        self, group: list[Deferred], call: GroupCall, drop: Callable[[list[Deferred]], None]
    ) -> Generator[Outcome, None, bool]: ...


class BatchCalls:
    """The deferred records of one loop (per partition, in offset order), and the calls of their handlers."""

    def __init__(
        self,
        invoker: Invoker,
        ownership: OwnershipGuard,
        failed: FailedOutcome,
        *,
        stop: threading.Event,
        dropped: Callable[[list[Deferred]], None] | None = None,
    ) -> None:
        self._invoker = invoker
        #: told of each group dropped uncalled (it is read again from its first record): key order takes back
        #: the records it parked in it
        self._dropped = dropped
        self._ownership = ownership
        self._failed = failed
        self._stop = stop
        self._groups: dict[TopicPartition, list[Deferred]] = {}
        #: the audit keys among the deferred records (a copy of one read meanwhile is a duplicate)
        self.keys: set[AuditKey] = set()
        #: per partition, the record keys of a key-ordered handler's deferred records (`defer_ordered`)
        self._record_keys: dict[TopicPartition, set[bytes]] = {}
        #: asked before each call (None: every call goes)
        self.gate: BatchGate | None = None

    def defer(self, item: Deferred) -> None:
        self._groups.setdefault(item.msg.tp, []).append(item)
        if item.key is not None:
            self.keys.add(item.key)

    def defer_ordered(self, item: Deferred) -> None:
        """`defer` a keyed record of a key-ordered handler: its partition's call now holds its key."""
        self.defer(item)
        assert item.msg.key is not None
        self._record_keys.setdefault(item.msg.tp, set()).add(item.msg.key)

    def holds(self, tp: TopicPartition) -> bool:
        return tp in self._groups

    def holds_key(self, tp: TopicPartition, key: bytes) -> bool:
        """Whether `tp`'s deferred call holds a record of key `key` (a key-ordered handler's)."""
        keys = self._record_keys.get(tp)
        return keys is not None and key in keys

    def keyed(self, tp: TopicPartition) -> int:
        """How many keys of a key-ordered handler `tp`'s deferred call holds."""
        keys = self._record_keys.get(tp)
        return 0 if keys is None else len(keys)

    def abandon(self) -> list[Abandoned]:
        """Drop every deferred record uncalled: `Abandoned` at each partition's first (read again from there)."""
        groups, self._groups = list(self._groups.values()), {}
        self.keys.clear()
        self._record_keys.clear()
        for group in groups:
            self._drop(group)
        return [Abandoned(group[0].msg) for group in groups]

    def settle(self, tp: TopicPartition | None = None) -> Generator[Outcome, None, bool]:
        """Call the batch handlers on what is deferred for `tp` (default: every partition), one call per
        partition, yielding each record's outcome; returns False when a call may have cost this consumer its
        partition (every group not settled then yields `Abandoned` at its first record)."""
        if tp is None:
            groups, self._groups = list(self._groups.values()), {}
            self._record_keys.clear()
        else:
            group = self._groups.pop(tp, None)
            groups = [] if group is None else [group]
            self._record_keys.pop(tp, None)
        if not self._groups:
            self.keys.clear()
        else:
            for group in groups:
                self.keys.difference_update(d.key for d in group if d.key is not None)
        for i, group in enumerate(groups):
            if not (yield from self._call(group)):
                for rest in groups[i + 1 :]:
                    self._drop(rest)
                    yield Abandoned(rest[0].msg)
                return False
        return True

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        """One call on a plain run of source records of one partition (runtime/records/stage.py says when a
        run is plain): nothing to decide per record, so no `Deferred` each. A record that fails before the call
        (poison) makes it an ordinary group, settled in offset order. A run the consumer built as Records
        already (`ports.consume_runs`) is passed as it is: one object per record."""
        if self.gate is not None:  # asked per call: the run as one group
            yield from self._call(self._group_of(binding, run))
            return
        if type(run[0]) is Record:
            yield from self._call_built(binding, run)
            return
        msgs = cast(list[Message], run)
        records = build_run(binding, msgs)
        if records is None:
            built = [build_record(binding, m, None) for m in msgs]
            if any(poison is not None for _, poison in built):
                group = [Deferred(binding, m, None, r, None, p) for m, (r, p) in zip(msgs, built, strict=True)]
                yield from self._call(group)
                return
            records = [record for record, _ in built]
        settled, outcomes = self._called(binding, msgs[0], records)
        if not settled:
            if not self._stop.is_set():
                yield Abandoned(msgs[0])
            return
        if outcomes is None:
            yield SucceededRun(msgs[0].tp, msgs, None, [])
            return
        yield from self._each(
            [Deferred(binding, m, None, r, None, None) for m, r in zip(msgs, records, strict=True)], iter(outcomes)
        )

    def _call_built(self, binding: Binding, run: list[Record[Any]]) -> Iterator[Outcome]:
        """`call_run` on Records the consumer built: the handler gets its own list of them (what it does to
        that list changes nothing here); the Messages of a run are made only for its failures."""
        head = message_of(run[0])
        settled, outcomes = self._called(binding, head, list(run))
        if not settled:
            if not self._stop.is_set():
                yield Abandoned(head)
            return
        if outcomes is None:
            yield SucceededRun(head.tp, run, None, [])
            return
        yield from self._each([Deferred(binding, message_of(r), None, r, None, None) for r in run], iter(outcomes))

    @staticmethod
    def _group_of(binding: Binding, run: Run) -> list[Deferred]:
        if type(run[0]) is Record:
            return [Deferred(binding, message_of(r), None, r, None, None) for r in run]
        group = []
        for msg in cast(list[Message], run):
            record, poison = build_record(binding, msg, None)
            group.append(Deferred(binding, msg, None, record, None, poison))
        return group

    def _call(self, group: list[Deferred]) -> Generator[Outcome, None, bool]:
        if self.gate is not None:
            return (yield from self.gate.settle(group, self._call_group, self._drop))
        return (yield from self._call_group(group))

    def _call_group(self, group: list[Deferred]) -> Generator[Outcome, None, bool]:
        first = group[0]
        called = [d for d in group if d.failure is None and d.decided is None]
        settled, outcomes = self._called(first.binding, first.msg, [d.record for d in called])
        if not settled:
            if self._stop.is_set():
                return True  # stopping: nothing settled, nothing to read again here
            self._drop(group)
            yield Abandoned(first.msg)
            return False
        if outcomes is None:
            outcomes = [None] * len(called)
        # a key-ordered handler's success in a tier is a passage of its chain: one outcome per record then
        ordered_tier = first.binding.ordering is not None and first.msg.topic != first.binding.topic
        if len(called) == len(group) and not ordered_tier and all(o is None for o in outcomes):
            keys = [d.key for d in group if d.key is not None]
            yield SucceededRun(first.msg.tp, [d.msg for d in group], [d.record for d in group], keys)
            return True
        return (yield from self._each(group, iter(outcomes)))

    def _drop(self, group: list[Deferred]) -> None:
        if self._dropped is not None:
            self._dropped(group)

    def _called(
        self, binding: Binding, first: Message, records: list[Any]
    ) -> tuple[bool, list[BaseException | None] | None]:
        """Whether the outcomes of one call on `records` may be settled, and those outcomes (None: every record
        succeeded, or there was nothing to call). Not settled: the app is stopping, or this consumer lost (or
        may have lost) the partition during the call; the records are then read again, here or by the new
        owner."""
        if self._stop.is_set():
            return False, None
        outcomes = self._invoker.call_batch(binding, records) if records else None
        if records and self._ownership.lost_ownership(first):
            return False, None
        return True, outcomes

    def _each(self, group: list[Deferred], outcomes: Iterator[BaseException | None]) -> Generator[Outcome, None, bool]:
        """In offset order: a record that failed before the call keeps that failure, the others take the
        call's outcomes in turn."""
        for d in group:
            if d.decided is not None:
                yield d.decided
                continue
            failure = d.failure if d.failure is not None else next(outcomes)
            if failure is None:
                yield Succeeded(d.msg, d.key, d.record)
                continue
            if self._ownership.stopping(d.msg, failure):
                return True  # this record and the rest of the group stay unsettled, so uncommitted
            yield self._failed(d.binding, d.msg, d.key, d.record, d.state, failure)
        return True
