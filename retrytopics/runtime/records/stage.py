"""The records stage: what a consumer loop makes of each record it accepts. It reads the record's retry state,
decides once what the record is (retrytopics/core/step.py, pure), calls the handler when the record is to be
handled now, and says so with one outcome value per record (runtime/records/outcome.py). It never pauses,
publishes or commits: the poll cycle hands each outcome to the part that acts on it.

Each step is a generator of outcomes, consumed by the cycle as they come, so an outcome is acted on before
the stage goes on: the ownership question after a long handler call (runtime/records/ownership.py) commits
what the outcomes before it finished.

- `read(msg)`: a record just consumed. A tier record's retry state is read once (malformed: its failure is
  kept, the record goes to the DLQ as `invalid_retry_headers` in its turn); its due time is bounded once
  (retrytopics/core/due.py); a record found downstream at assignment, or already handled here, is a `Duplicate`; a
  record not due is `Waiting` (in memory, with what was decided, or in Kafka); a record behind others waiting
  in memory waits behind them with its decision, so offset order is kept.
- `take_queued(msg, queued)`: a record that waited in memory fell due: what was decided is carried out.
- `plain_runs(batch)` / `call_run(...)`: a main consumer's poll, partition by partition, with nothing to
  decide per record (a source record carries no retry state: never a duplicate hop, never waiting);
  `runs_of(polled)` adds the runs the consumer built as the handlers' Records already (`run_topics`,
  `ports.consume_runs`).
- `settle_deferred()`: the batch handlers' calls (runtime/records/batches.py).

A failure's route is decided here, once (`router.route`, with the state read at `read`).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections.abc import Generator, Iterator, Mapping
from typing import Any, cast

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import AuditKey, DuplicateAudit, audit_key
from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.keyorder.follower import Follower
from retrytopics.core.keyorder.hops import BlockedByKey, blocked_by_key_route, read_follower, source_follower
from retrytopics.core.keyorder.source_chains import Admit
from retrytopics.core.keyorder.tier_passages import Step
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, Polled, message_of
from retrytopics.core.record import Record
from retrytopics.core.router import origin_message_id, read_retry_state, route
from retrytopics.core.step import Action, decide
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder
from retrytopics.runtime.records.batches import BatchCalls, Deferred
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
    SucceededRun,
    Waiting,
)
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.waiting import PauseController

__all__ = ["RecordStage"]


class RecordStage:
    """Reads, decides and calls for one loop (see the module docstring)."""

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
        key_order: KeyOrder | TierOrder | None = None,
    ) -> None:
        self._bindings = bindings
        self._key_order = key_order if isinstance(key_order, KeyOrder) else None
        self._tier_order = key_order if isinstance(key_order, TierOrder) else None
        self._waiting = waiting
        self._audit = audit
        self._invoker = invoker
        self._ownership = ownership
        self._duplicates = duplicates
        self._now_ms = clock.now_ms
        self._rng = rng
        self._stop = stop
        self.batches = BatchCalls(invoker, ownership, self.failed, stop=stop, dropped=self._dropped)
        # a main consumer (source topics only): its polls can go to the handlers partition by partition
        self._sources_only = all(topic == b.topic for topic, b in bindings.items())
        #: the topics whose records the consumer hands over as their handler's Records already
        #: (`ports.consume_runs`): what `build_record` would make of them needs nothing of the binding
        self.run_topics: frozenset[str] = frozenset(
            topic
            for topic, b in bindings.items()
            if self._sources_only
            and b.ordering is None
            and b.value_deserializer is bytes_value
            and b.ctx.id_header is None
        )

    # -- a main consumer's poll, run by run ------------------------------------------------------------------

    def plain_runs(self, batch: list[Message]) -> list[tuple[Binding, Run]] | None:
        """`batch` as runs per partition, when each record would be handed to its handler as it is: on a
        source topic nothing is decided per record (no retry state, so no due time and no audit key; never
        queued in memory), so `step.decide` would say HANDLE for every record that is accepted and was not
        handed off downstream already. None: read the records one by one."""
        if not self._sources_only:
            return None
        # rare: only after a previous owner died between hand-off and commit. Asked before any `accept`,
        # which the records' ordinary path then asks again (accepting a sought-back record forgets the seek)
        duplicates = self._duplicates
        if duplicates.seeded and any(duplicates.was_handed_off(m, None, None) for m in batch):
            return None
        waiting, accept = self._waiting, self._waiting.accept
        runs: dict[TopicPartition, list[Message]] = {}
        run: list[Message] = []
        tp: TopicPartition = ("", -1)
        open_ = False  # every record of `tp` is accepted without asking (a poll comes in runs per partition)
        for msg in batch:
            if msg.partition != tp[1] or msg.topic != tp[0]:
                tp = (msg.topic, msg.partition)
                run = runs.setdefault(tp, [])
                open_ = waiting.accepts_all(tp)
            if open_ or accept(msg):
                run.append(msg)
        return [(self._bindings[tp[0]], run) for tp, run in runs.items() if run]

    def runs_of(self, polled: Polled) -> tuple[list[Message], list[tuple[Binding, Run]] | None]:
        """`polled` as `plain_runs` makes it, its runs of Records built by the consumer included, each as
        it is; when those runs cannot be taken as they are (a partition sought back, records handed off
        downstream already), every record as a Message again. With None: read `batch` record by record."""
        batch, built = polled
        if built:
            duplicates, waiting = self._duplicates, self._waiting
            if not (
                duplicates.seeded
                and any(duplicates.was_handed_off(message_of(r), None, None) for run in built for r in run)
            ) and all(waiting.accepts_all((run[0].topic, run[0].partition)) for run in built):
                runs = self.plain_runs(batch)
                if runs is not None:
                    taken: list[tuple[Binding, Run]] = [(self._bindings[run[0].topic], run) for run in built]
                    return batch, taken + runs
            batch = batch + [message_of(r) for run in built for r in run]
        return batch, self.plain_runs(batch)

    def call_run(self, binding: Binding, run: Run) -> Iterator[Outcome]:
        """A plain run of one partition: one call per record in offset order (a batch handler: one call,
        runtime/records/batches.py). The calls that returned between two failures are one `SucceededRun`. A
        record this consumer may no longer act on ends the run with `Abandoned`. However the run ends
        (stopping, a BaseException from a handler), the calls that returned are yielded first."""
        if binding.batch and binding.ordering is None:
            yield from self.batches.call_run(binding, run)
            return
        if binding.ordering is not None:
            yield from self._ordered_run(binding, cast(list[Message], run))  # never built (`run_topics`)
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

    def unparked(self, msg: Message) -> Iterator[Outcome]:
        """A record key order parked and took back (`KeyOrder.unpark`): admitted again, and parked again
        rather than left (its offset is tracked, later records of its partition were acted on). A batch
        handler's is called at once, alone: nothing deferred may be read again behind it."""
        binding = self._bindings[msg.topic]
        outcomes = self._handle(binding, msg, None, None, None, parked=True)
        if binding.batch:
            outcomes = itertools.chain(outcomes, self.batches.settle(msg.tp))
        for outcome in outcomes:
            if type(outcome) is Abandoned:
                assert self._key_order is not None
                self._key_order.park(msg, again=True)
                yield Parked(msg)
                return
            yield outcome

    def _ordered_run(self, binding: Binding, msgs: list[Message]) -> Iterator[Outcome]:
        """A plain run of a key-ordered handler: record by record, each admitted by key order first
        (`_handle`); the run ends at a record key order stops (`Held`) or that this consumer must leave. A
        batch handler's records are deferred, its call cut where `_handle` says, and the rest called at the
        end."""
        for msg in msgs:
            if self._stop.is_set():
                return
            for outcome in self._handle(binding, msg, None, None, None):
                yield outcome
                if type(outcome) is Held or type(outcome) is Abandoned:
                    return
        if binding.batch:
            yield from self.batches.settle(msgs[0].tp)

    # -- one record at a time ------------------------------------------------------------------------------

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
            follower = None
            try:
                if binding.ordering is not None and msg.key is not None and self._tier_order is not None:
                    follower = read_follower(binding.ctx, msg)  # a follower carries no retry state
                if follower is None:
                    state = read_retry_state(binding.ctx, msg, now_ms=self._now_ms())
            except HeaderDecodeError as exc:
                bad = exc
            if follower is not None:
                if self._waiting.queued(msg.tp):  # behind records waiting in memory: decided in its turn
                    yield Waiting(msg, None, _FOLLOWER)
                    return
                yield from self._follower(binding, msg, follower)
                return
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

    def take_queued(self, msg: Message, queued: Queued) -> Iterator[Outcome]:
        """A record that waited in memory came to its turn: carry out what was decided when it was read."""
        binding = self._bindings[msg.topic]
        if queued == _FOLLOWER and self._tier_order is not None:  # read and checked when it was queued
            follower = read_follower(binding.ctx, msg)
            assert follower is not None
            yield from self._follower(binding, msg, follower)
            return
        if queued.duplicate is not None:
            if self.batches.holds(msg.tp) and not (yield from self.batches.settle(msg.tp)):
                return
            yield queued.duplicate
            return
        yield from self._handle(self._bindings[msg.topic], msg, queued.key, queued.state, queued.bad)

    def _follower(self, binding: Binding, msg: Message, follower: Follower) -> Iterator[Outcome]:
        """A follower read in a tier (docs/key-ordering.md, section 4), decided by what this tier did with the
        record it waits behind: handled now (as its source record's first attempt), forwarded behind it,
        dead-lettered unhandled as ``blocked_by_key``, finished as a copy, or kept in memory at its partition's head
        until its predecessor's hop is acknowledged (held, when the tier's key state is not read yet)."""
        assert self._tier_order is not None
        if not (yield from self._settled_before(binding, msg)):  # what it waits behind may be deferred
            return
        tier_order = self._tier_order
        decision = tier_order.on_follower(msg, follower)
        step = decision.step
        if step is Step.WAIT:
            # its predecessor's hop is in flight: it waits in memory at its partition's head (`TierOrder.started`)
            yield Waiting(msg, self._now_ms() + _ACK_RECHECK_MS, _FOLLOWER) if tier_order.started(msg.tp) else Held(msg)
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
            if failure is _ABANDONED:
                yield Abandoned(msg)
                return
        if failure is None:
            yield Succeeded(msg, None, record)
            return
        # a released follower that fails starts its own schedule: a first failure, from its own coordinates
        first = route(ctx, source, failure, now_ms=self._now_ms(), rng=self._rng, previous=None)
        yield Failed(msg, None, record, failure, first, ctx)

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
        *,
        parked: bool = False,
    ) -> Iterator[Outcome]:
        """Call the handler (or defer the record to its batch handler's call): its outcome. A source record of
        a key-ordered handler is admitted by key order first: it may follow its key's predecessor into a tier
        unhandled (`Follow`), wait in memory for its key's last hop (`Parked`; `parked`: it did already), or
        stop its partition (`Held`). A batch handler's call never holds two records of one key: it is cut
        before the second, which is admitted once the call settled (docs/key-ordering.md, section 8)."""
        if binding.ordering is not None and msg.key is not None:
            if binding.batch and self.batches.holds(msg.tp) and self._cuts(msg, msg.key):
                if not (yield from self.batches.settle(msg.tp)):
                    return
            if self._key_order is not None and msg.topic == binding.topic:
                admission = self._key_order.admit(msg, unparked=parked)
                if admission.action is Admit.FOLLOW:
                    assert admission.tier is not None and admission.after is not None
                    ctx, after = binding.ctx, admission.after
                    decided: Outcome
                    if after >= msg.offset:
                        # read again after a restart or rebalance: every record of its key up to the frontier
                        # is terminal or handed off already, durably (the chain record says so)
                        decided = Duplicate(msg, origin_message_id(ctx, msg), 1, downstream=True)
                    else:
                        follower = source_follower(ctx, msg, after=after, held_at=max(0, self._now_ms()))
                        decided = Follow(msg, admission.tier, follower, ctx, after)
                    if binding.batch and self.batches.holds(msg.tp):  # in its place among the call's records
                        self.batches.defer_ordered(Deferred(binding, msg, None, _UNCALLED, None, None, decided))
                    else:
                        yield decided
                    return
                if admission.action is not Admit.HANDLE:
                    waits = not parked and admission.action is Admit.WAIT and self._key_order.park(msg)
                    if waits and binding.batch and self.batches.holds(msg.tp):
                        # parked in its place among the call's records; its key's later ones park behind it
                        self.batches.defer(Deferred(binding, msg, None, _UNCALLED, None, None, Parked(msg)))
                        return
                    if not (yield from self._settled_before(binding, msg)):
                        return
                    if parked or waits:
                        if parked:
                            self._key_order.park(msg, again=True)
                        yield Parked(msg)
                    else:
                        yield Held(msg)
                    return
            elif self._tier_order is not None and state is not None:
                if self._tier_order.on_retry(msg, state).step is Step.WAIT:
                    if not (yield from self._settled_before(binding, msg)):
                        return
                    # a hop of its chain is in flight: it waits in memory at its partition's head
                    if self._tier_order.started(msg.tp):
                        yield Waiting(msg, self._now_ms() + _ACK_RECHECK_MS, Queued(state, key, bad, None))
                    else:
                        yield Held(msg)
                    return
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
            if failure is _ABANDONED:
                yield Abandoned(msg)
                return
        if failure is None:
            yield Succeeded(msg, key, record)
        else:
            yield self.failed(binding, msg, key, record, state, failure)

    def _dropped(self, group: list[Deferred]) -> None:
        """A batch call dropped uncalled is read again from its first record: the records key order parked in it
        are forgotten (they come again)."""
        if self._key_order is not None:
            for d in group:
                if type(d.decided) is Parked:
                    self._key_order.unpark_dropped(d.msg)

    def _cuts(self, msg: Message, key: bytes) -> bool:
        """Whether a keyed record of a key-ordered batch handler must wait for the call deferred for its
        partition to settle: that call holds its key (its outcome decides this record's admission), or, on a
        main consumer, as many keys as may still open chains (`max_blocked_keys` holds if they all fail)."""
        if self.batches.holds_key(msg.tp, key):
            return True
        return self._key_order is not None and self.batches.keyed(msg.tp) >= self._key_order.room(msg.tp)

    def _settled_before(self, binding: Binding, msg: Message) -> Generator[Outcome, None, bool]:
        """Call what is deferred for `msg`'s partition before acting on `msg` (a batch handler's outcomes come
        in offset order); False when that call may have cost this consumer the partition."""
        if binding.batch and self.batches.holds(msg.tp):
            return (yield from self.batches.settle(msg.tp))
        return True

    def _call(self, binding: Binding, msg: Message, record: Record[Any]) -> BaseException | None:
        """Call the handler on `record` (a batch handler: on a list of it): None, its failure, or `_ABANDONED`.
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
            return _ABANDONED
        return failure

    def _due_at(self, binding: Binding, msg: Message, state: RetryHeaders | None, now: int) -> int | None:
        """When `msg` is due here: its `retry.due_at`, bounded by its tier's longest wait from when this
        consumer first saw it (retrytopics/core/due.py); a record due already costs one comparison."""
        if state is None or state.due_at is None or state.due_at <= now:
            return None if state is None else state.due_at
        return self._waiting.bounded_due(msg, state.due_at, binding.wait_bounds_ms.get(msg.topic, 0), now)


#: what a follower waiting in memory behind its partition's queue is kept with: it is decided in its turn
_FOLLOWER = Queued(None, None, None, None)
#: how soon a follower waiting in memory for its predecessor's acknowledgement is asked again (one poll)
_ACK_RECHECK_MS = 1
#: the Record of a batch handler's deferred record that key order decided before the call: never passed to it
_UNCALLED: Record[Any] = Record("", 0, 0, -1, None, None, None, (), None, "")


class _Abandoned(Exception):
    """The marker `_call` returns for a call this consumer may no longer act on (never raised)."""


_ABANDONED = _Abandoned()


def _run(tp: TopicPartition, run: Run, start: int, end: int) -> SucceededRun:
    return SucceededRun(tp, run if start == 0 and end == len(run) else run[start:end], None, [])
