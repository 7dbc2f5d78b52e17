"""Key order's admission step: the records stage of a loop whose handlers are key-ordered (docs/key-ordering.md,
section 4), picked once by the consumer loop. Each builds on its consumer kind's stage and asks key order
(runtime/keyorder/ordering.py) before a handler runs; a loop without an ordered handler never has one, so the
plain stages (runtime/records/) import nothing of key order.

- `OrderedSourceStage` (a main consumer, `KeyOrder`): a keyed record of an ordered handler is admitted first: it
  is handled, follows its key's predecessor into a tier unhandled (`Follow`), waits in memory for its key's last
  hop (`Parked`, given back each poll by `released` once that hop is acknowledged), or stops its partition
  (`Held`). A plain run of an ordered handler goes record by record, admitted each.
- `OrderedTierStage` (a tier consumer, `TierOrder`): a follower is decided by what this tier did with the record
  it waits behind (handled as its source record, forwarded, dead-lettered as ``blocked_by_key``, finished as a
  copy, or kept at its partition's head); a retried record whose chain has a hop in flight waits in memory.

A key-ordered batch handler's call never holds two records of one key: it is cut before the second, which is
admitted once the call settled (docs/key-ordering.md, section 8).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections.abc import Callable, Container, Generator, Iterable, Iterator, Mapping
from typing import Any, cast

from retrytopics.core.dedupe import AuditKey, DuplicateAudit
from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.keyorder.follower import Follower
from retrytopics.core.keyorder.hops import BlockedByKey, blocked_by_key_route, read_follower, source_follower
from retrytopics.core.keyorder.source_chains import Admission, Admit
from retrytopics.core.keyorder.tier_passages import Step
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.core.router import origin_message_id, route
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder
from retrytopics.runtime.records.batches import Deferred
from retrytopics.runtime.records.calls import Binding, Invoker, Run, build_record
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import (
    Abandoned,
    Duplicate,
    Failed,
    Follow,
    Held,
    Outcome,
    Parked,
    Queued,
    Succeeded,
    Waiting,
)
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.source import SourceStage
from retrytopics.runtime.records.stage import ABANDONED
from retrytopics.runtime.records.tier import TierStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["FOLLOWER", "OrderedSourceStage", "OrderedTierStage", "followed"]

#: the longest `consume()` wait while records are parked for an acknowledgement, of a partition whose publish is
#: not failing: `consume()` does not wake for an acknowledgement (a tier's such records wait in memory, due one
#: poll later)
_ACK_AWAITED_WAIT_MS = 1
#: what a follower waiting in memory behind its partition's queue is kept with: it is decided in its turn
FOLLOWER = Queued(None, None, None, None)
#: how soon a follower waiting in memory for its predecessor's acknowledgement is asked again (one poll)
_ACK_RECHECK_MS = 1
#: the Record of a batch handler's deferred record that key order decided before the call: never passed to it
_UNCALLED: Record[Any] = Record("", 0, 0, -1, None, None, None, (), None, "")


class OrderedSourceStage(SourceStage):
    """A main consumer's records stage with key order's admission (see the module docstring). `assigned` and
    `failing`: the loop's assigned partitions and whether a partition's publish is failing (parked records of
    such a partition wait: their hops will not be acknowledged soon)."""

    keeps_records = True

    #: asked before a parked record given back is admitted again (the retry-flood guard: runtime/flood/stage.py);
    #: False: it is parked again, uncalled
    admits_unparked: Callable[[Message], bool] = staticmethod(lambda msg: True)

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
        key_order: KeyOrder,
        assigned: Container[TopicPartition],
        failing: Callable[[TopicPartition], bool],
    ) -> None:
        super().__init__(bindings, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        self._key_order = key_order
        self._assigned = assigned
        self._failing = failing

    # -- between polls: the parked records -------------------------------------------------------------------

    def released(self) -> Iterable[Iterator[Outcome]]:
        """The parked records whose key's last hop is acknowledged now (`KeyOrder.unpark`), of the partitions
        still assigned whose publish is not failing, each admitted again."""
        key_order = self._key_order
        if not key_order.parks:
            return ()
        failing, assigned = self._failing, self._assigned
        return (self._unparked(msg) for msg in key_order.unpark(lambda tp: tp in assigned and not failing(tp)))

    def wait_ms(self, wait_ms: int) -> int:
        if any(not self._failing(tp) for tp in self._key_order.awaiting_acks()):
            return min(wait_ms, _ACK_AWAITED_WAIT_MS)  # not while their publish fails: no acknowledgement soon
        return wait_ms

    def _unparked(self, msg: Message) -> Iterator[Outcome]:
        """A record key order parked and took back: admitted again, and parked again rather than left (its
        offset is tracked, later records of its partition were acted on). A batch handler's is called at once,
        alone: nothing deferred may be read again behind it."""
        if not self.admits_unparked(msg):
            yield self.park_again(msg)
            return
        binding = self._bindings[msg.topic]
        outcomes = self._admitted(binding, msg, parked=True)
        if binding.batch:
            outcomes = itertools.chain(outcomes, self.batches.settle(msg.tp))
        for outcome in outcomes:
            if type(outcome) is Abandoned:
                yield self.park_again(msg)
                return
            yield outcome

    def park_again(self, msg: Message) -> Parked:
        """A record given back by `released` and not acted on: parked again (its offset stays tracked)."""
        self._key_order.park(msg, again=True)
        return Parked(msg)

    # -- admission ---------------------------------------------------------------------------------------------

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        if binding.ordering is None:
            return super().call_run(binding, run)
        return self._ordered_run(binding, cast(list[Message], run))  # never built (`run_topics`)

    def _ordered_run(self, binding: Binding, msgs: list[Message]) -> Iterator[Outcome]:
        """A plain run of a key-ordered handler: record by record, each admitted first; the run ends at a record
        key order stops (`Held`) or that this consumer must leave. A batch handler's records are deferred, its
        call cut where admission says, and the rest called at the end."""
        for msg in msgs:
            if self._stop.is_set():
                return
            for outcome in self._handle(binding, msg, None, None, None):
                yield outcome
                if type(outcome) is Held or type(outcome) is Abandoned:
                    return
        if binding.batch:
            yield from self.batches.settle(msgs[0].tp)

    def _handle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        if binding.ordering is None or msg.key is None:
            return super()._handle(binding, msg, key, state, bad)
        return self._admitted(binding, msg)

    def _admitted(self, binding: Binding, msg: Message, *, parked: bool = False) -> Iterator[Outcome]:
        """Source record `msg` of a key-ordered handler, admitted by key order first: it may follow its key's
        predecessor into a tier unhandled (`Follow`), wait in memory for its key's last hop (`Parked`;
        `parked`: it did already), or stop its partition (`Held`); else it is called as any record."""
        assert msg.key is not None
        key_order = self._key_order
        if not (yield from _cut_before(self, binding, msg, key_order.room(msg.tp))):
            return
        admission = key_order.admit(msg, unparked=parked)
        if admission.action is Admit.FOLLOW:
            decided = followed(binding, msg, admission, now_ms=self._now_ms())
            if binding.batch and self.batches.holds(msg.tp):  # in its place among the call's records
                self.batches.defer_ordered(Deferred(binding, msg, None, _UNCALLED, None, None, decided))
            else:
                yield decided
            return
        if admission.action is not Admit.HANDLE:
            waits = not parked and admission.action is Admit.WAIT and key_order.park(msg)
            if waits and binding.batch and self.batches.holds(msg.tp):
                # parked in its place among the call's records; its key's later ones park behind it
                self.batches.defer(Deferred(binding, msg, None, _UNCALLED, None, None, Parked(msg)))
                return
            if not (yield from self._settled_before(binding, msg)):
                return
            if parked or waits:
                if parked:
                    key_order.park(msg, again=True)
                yield Parked(msg)
            else:
                yield Held(msg)
            return
        yield from super()._handle(binding, msg, None, None, None)

    def _dropped(self, group: list[Deferred]) -> None:
        """A batch call dropped uncalled is read again from its first record: the records key order parked in it
        are forgotten (they come again)."""
        for d in group:
            if type(d.decided) is Parked:
                self._key_order.unpark_dropped(d.msg)


class OrderedTierStage(TierStage):
    """A tier consumer's records stage with key order's admission (see the module docstring)."""

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
        tier_order: TierOrder,
    ) -> None:
        super().__init__(bindings, waiting, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        self._tier_order = tier_order

    def read(self, msg: Message) -> Iterator[Outcome]:
        binding = self._bindings[msg.topic]
        if binding.ordering is None or msg.key is None or msg.topic == binding.topic:
            return super().read(msg)
        return self._read_ordered(binding, msg)

    def _read_ordered(self, binding: Binding, msg: Message) -> Iterator[Outcome]:
        """A keyed tier record of an ordered handler: a follower (which carries no retry state), or a retried
        record read as any other."""
        try:
            follower = read_follower(binding.ctx, msg)
        except HeaderDecodeError as exc:
            yield from self._decided(binding, msg, None, exc)
            return
        if follower is None:
            yield from super().read(msg)
            return
        if self._waiting.queued(msg.tp):  # behind records waiting in memory: decided in its turn
            yield Waiting(msg, None, FOLLOWER)
            return
        yield from self._follower(binding, msg, follower)

    def take_queued(self, msg: Message, queued: Queued) -> Iterator[Outcome]:
        if queued == FOLLOWER:  # read and checked when it was queued
            follower = read_follower(self._bindings[msg.topic].ctx, msg)
            assert follower is not None
            return self._follower(self._bindings[msg.topic], msg, follower)
        return super().take_queued(msg, queued)

    def _follower(self, binding: Binding, msg: Message, follower: Follower) -> Iterator[Outcome]:
        """A follower read in a tier (docs/key-ordering.md, section 4), decided by what this tier did with the
        record it waits behind: handled now (as its source record's first attempt), forwarded behind it,
        dead-lettered unhandled as ``blocked_by_key``, finished as a copy, or kept in memory at its partition's
        head until its predecessor's hop is acknowledged (held, when the tier's key state is not read yet)."""
        if not (yield from self._settled_before(binding, msg)):  # what it waits behind may be deferred
            return
        tier_order = self._tier_order
        decision = tier_order.on_follower(msg, follower)
        step = decision.step
        if step is Step.WAIT:
            # its predecessor's hop is in flight: it waits in memory at its partition's head (`TierOrder.started`)
            yield Waiting(msg, self._now_ms() + _ACK_RECHECK_MS, FOLLOWER) if tier_order.started(msg.tp) else Held(msg)
            return
        if step is Step.DUPLICATE:
            yield Duplicate(msg, follower.origin_message_id, 0, downstream=False)
            return
        ctx = binding.ctx
        if step is Step.FORWARD:
            assert decision.tier is not None and decision.after is not None
            yield Follow(msg, decision.tier, dataclasses.replace(follower, after=decision.after), ctx, follower.after)
            return
        # the handler sees, and a failure routes from, the source record the follower is
        source = msg._replace(
            topic=follower.original_topic,
            partition=follower.original_partition,
            offset=follower.original_offset,
            timestamp_ms=follower.original_timestamp,
        )
        record, poison = build_record(binding, source, None)
        failure: BaseException | None = poison
        if step is not Step.HANDLE:  # DEAD_LETTER, UNPROVEN: never handled out of order
            why = "dead-lettered" if step is Step.DEAD_LETTER else "unproven: nothing in this tier accounts for it"
            dead = blocked_by_key_route(ctx, follower, msg, why=why, now_ms=self._now_ms())
            yield Failed(msg, None, record, BlockedByKey(dead.retry.exception_message), dead, ctx)
            return
        if failure is None:
            failure = self._call(binding, msg, record)
            if failure is ABANDONED:
                yield Abandoned(msg)
                return
        if failure is None:
            yield Succeeded(msg, None, record)
            return
        # a released follower that fails starts its own schedule: a first failure, from its own coordinates
        first = route(ctx, source, failure, now_ms=self._now_ms(), rng=self._rng, previous=None)
        yield Failed(msg, None, record, failure, first, ctx)

    def _handle(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        if binding.ordering is None or msg.key is None:
            return super()._handle(binding, msg, key, state, bad)
        return self._admitted(binding, msg, key, state, bad)

    def _admitted(
        self,
        binding: Binding,
        msg: Message,
        key: AuditKey | None,
        state: RetryHeaders | None,
        bad: BaseException | None,
    ) -> Iterator[Outcome]:
        """A keyed retried record of an ordered handler: it waits in memory at its partition's head while a hop
        of its chain is in flight (held, when the tier's key state is not read yet); else it is called."""
        assert msg.key is not None
        if not (yield from _cut_before(self, binding, msg, None)):
            return
        tier_order = self._tier_order
        if state is not None and tier_order.on_retry(msg, state).step is Step.WAIT:
            if not (yield from self._settled_before(binding, msg)):
                return
            if tier_order.started(msg.tp):
                yield Waiting(msg, self._now_ms() + _ACK_RECHECK_MS, Queued(state, key, bad, None))
            else:
                yield Held(msg)
            return
        yield from super()._handle(binding, msg, key, state, bad)


def followed(binding: Binding, msg: Message, admission: Admission, *, now_ms: int) -> Outcome:
    """Source record `msg`, admitted `Admit.FOLLOW`: handed off unhandled behind its key's predecessor, or a
    duplicate when it was read again after a restart or rebalance (every record of its key up to the frontier
    is terminal or handed off already, durably: the chain record says so)."""
    assert admission.tier is not None and admission.after is not None
    ctx, after = binding.ctx, admission.after
    if after >= msg.offset:
        return Duplicate(msg, origin_message_id(ctx, msg), 1, downstream=True)
    follower = source_follower(ctx, msg, after=after, held_at=max(0, now_ms))
    return Follow(msg, admission.tier, follower, ctx, after)


def _cut_before(
    stage: SourceStage | TierStage, binding: Binding, msg: Message, room: int | None
) -> Generator[Outcome, None, bool]:
    """Settle the call deferred for `msg`'s partition first when it must not hold `msg` too: it holds `msg`'s key
    (its outcome decides this record's admission), or, on a main consumer, as many keys as may still open chains
    (`room`: `max_blocked_keys` holds if they all fail). False when that call may have cost the partition."""
    batches = stage.batches
    if not binding.batch or not batches.holds(msg.tp):
        return True
    assert msg.key is not None
    if batches.holds_key(msg.tp, msg.key) or (room is not None and batches.keyed(msg.tp) >= room):
        return (yield from batches.settle(msg.tp))
    return True
