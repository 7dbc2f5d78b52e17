"""The records stage (runtime/records/stage.py), on the in-memory broker.

Driven directly, it yields the documented outcome value for each case (runtime/records/outcome.py):
success, failure with its route, duplicate, waiting in memory or in Kafka, abandoned after a call past
max.poll.interval.ms, and the calls that returned before a handler's BaseException.

In a loop, a record is decided once: one that waits in memory has its retry headers read once, and a second
copy of a hop read while the first waits is suppressed as a duplicate.

A main consumer's polls go to single-record handlers partition by partition (`SourceStage.call_run`):
no decision per record, the successes between two failures finished in one step. These tests hold it to
what the ordinary path guarantees:

- every record is called once, in offset order within its partition; a failure is handed off and its offset
  committed only after the acknowledgement; a poison record is dead-lettered in its place;
- a call that outlives max.poll.interval.ms is left alone (not handed off), and it and the rest of the
  poll, in every partition, are read again;
- a failure while the app stops is neither handed off nor committed, and nothing after it is called;
- a bytes handler is called with the Records its consumer built (`ports.consume_runs`), and the two cases
  above hold for those runs too.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics.connectors.serde import Deserializer, bytes_value, json_value
from retrytopics.core.dedupe import DuplicateAudit, audit_key
from retrytopics.core.headers import DlqReason, RetryHeaders, decode
from retrytopics.core.offsets import OffsetTracker
from retrytopics.core.ports import Message, Polled, split_runs
from retrytopics.core.record import Record
from retrytopics.core.router import RouteKind
from retrytopics.core.step import Action
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records import tier as stage_module
from retrytopics.runtime.records.calls import Binding, Invoker
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import (
    Abandoned,
    Duplicate,
    Failed,
    Outcome,
    Queued,
    Succeeded,
    SucceededRun,
    Waiting,
)
from retrytopics.runtime.records.ownership import OwnershipCheck, OwnershipGuard
from retrytopics.runtime.records.source import SourceStage
from retrytopics.runtime.records.tier import TierStage
from retrytopics.runtime.waiting import PauseController
from retrytopics.testing.broker import DEFAULT_MAX_POLL_INTERVAL_MS, MemoryBroker, MemoryConsumer

from ..kit import (
    CTX,
    DLQ,
    GROUP,
    POLICY,
    TIER,
    Ledger,
    StopWhen,
    build_loop,
    committed_all,
    delivered_at,
    first_commit_past,
    new_broker,
    run,
    short_publish_backoff,
    tier_record,
)


class JsonLedger(Ledger):
    """The ledger, for records whose value is a JSON string (the id); handler calls in order, with coordinates."""

    def __init__(self, broker: MemoryBroker, failing: set[str]) -> None:
        super().__init__(broker, failing)
        self.order: list[tuple[int, int, str]] = []

    def handle(self, record: Record[Any]) -> None:
        # a bytes handler's value (the Record its consumer built) is the JSON text itself
        value = json.loads(record.value) if isinstance(record.value, bytes) else record.value
        self.order.append((record.partition, record.offset, value))
        super().handle(record._replace(value=value.encode()))


def json_loop(
    broker: MemoryBroker,
    ledger: Ledger,
    stop: threading.Event,
    *,
    consumer: MemoryConsumer | None = None,
    value_deserializer: Deserializer = json_value,
    **settings: Any,
) -> ConsumerLoop:
    member = consumer or broker.consumer(GROUP)
    binding = Binding(
        topic="orders", handler=ledger.handle, policy=POLICY, ctx=CTX, value_deserializer=value_deserializer
    )
    options: dict[str, Any] = {"max_wait_ms": 100, "commit_every": 1, "batch_size": 50, **settings}
    return ConsumerLoop(
        LoopSettings(name="main", group_id=GROUP, topics=("orders",), **options),
        {"orders": binding},
        clients=LoopClients(consumer=lambda: member, producer=broker.producer),
        emitter=Emitter([ledger]),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )


def hand_offs(broker: MemoryBroker, topic: str) -> list[tuple[bytes | None, RetryHeaders]]:
    """(value bytes, decoded retry headers) of every record a read_committed reader finds in `topic`."""
    return [(m.value, decode(list(m.headers))) for m in broker.records(topic)]


def fill_json(broker: MemoryBroker, ids: dict[int, list[str]], *, poison: dict[int, int] | None = None) -> None:
    """`ids` as JSON strings; `poison` puts a value that is not JSON at {partition: index}."""
    for partition, values in ids.items():
        for i, record_id in enumerate(values):
            bad = poison is not None and poison.get(partition) == i
            broker.append("orders", b"{not json" if bad else b'"%s"' % record_id.encode(), partition=partition)


#: a main consumer's runs as the stage builds each Record (a decoding handler) and as the consumer built them
#: (a bytes handler: `SourceStage.run_topics`)
BOTH_RUNS = pytest.mark.parametrize("deserializer", [json_value, bytes_value], ids=["decoded", "built"])


class BuildingConsumer(MemoryConsumer):
    """A consumer port that builds the handlers' Records itself (`ports.consume_runs`), as the Kafka adapter
    does, and keeps every Record it built."""

    built: list[Record[Any]]

    def consume_runs(self, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
        polled = split_runs(self.consume(max_records, timeout_s), topics)
        self.built += [r for run in polled.runs for r in run]
        return polled


def test_a_bytes_handler_is_called_with_the_records_its_consumer_built_and_a_failure_keeps_its_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A single-record bytes handler on a main consumer is called with the very Records the consumer built
    (one object per consumed record, no Message and second Record first), once each in offset order; a failure
    is handed off with its coordinates, key, value and user headers, and every offset is committed."""
    # setup: two partitions, a user header on every record; one failure in each partition
    broker = new_broker(partitions=2)
    for i in range(8):
        broker.append("orders", b"id-%d" % i, key=b"k%d" % i, partition=i % 2, headers=[("trace", b"t%d" % i)])
    consumer = BuildingConsumer(
        broker,
        broker._group(GROUP),
        read_committed=True,
        auto_offset_reset="earliest",
        max_poll_interval_ms=DEFAULT_MAX_POLL_INTERVAL_MS,
        session_timeout_ms=45_000,
    )
    consumer.built = []
    handed: list[Record[Any]] = []

    def handle(record: Record[Any]) -> None:
        handed.append(record)
        if record.value in (b"id-2", b"id-5"):
            raise RuntimeError(f"{record.value!r} fails")

    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, GROUP, {0: 4, 1: 4}))
    binding = Binding(topic="orders", handler=handle, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    loop = ConsumerLoop(
        LoopSettings(name="main", group_id=GROUP, topics=("orders",), max_wait_ms=100, commit_every=1),
        {"orders": binding},
        clients=LoopClients(consumer=lambda: consumer, producer=broker.producer),
        emitter=Emitter(),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )

    # when
    run(loop, stop)

    # then: each record was called once, as the object its consumer built, in offset order per partition
    assert len(handed) == 8 and all(h is b for h, b in zip(handed, consumer.built, strict=True))
    assert sorted((r.partition, r.offset) for r in handed) == [(p, o) for p in (0, 1) for o in range(4)]
    assert [(r.value, r.headers, r.origin_message_id) for r in handed if r.partition == 1] == [
        (b"id-%d" % i, (("trace", b"t%d" % i),), f"orders-1-{i // 2}") for i in (1, 3, 5, 7)
    ]
    # and: the failures are on the tier with their key, value, user headers and coordinates
    tier = broker.records(TIER)
    assert sorted((m.key, m.value, [h for h in m.headers if not h[0].startswith("retry.")]) for m in tier) == [
        (b"k2", b"id-2", [("trace", b"t2")]),
        (b"k5", b"id-5", [("trace", b"t5")]),
    ]
    assert sorted((h.original_partition, h.original_offset, h.reconsume_times) for _, h in hand_offs(broker, TIER)) == [
        (0, 1, 1),
        (1, 2, 1),
    ]


def test_each_partition_is_called_in_offset_order_and_a_failure_is_committed_only_after_its_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: three partitions in one poll; failures in two of them, a poison record in the third
    broker = new_broker(partitions=3)
    ids = {p: [f"id-{p}-{i}" for i in range(6)] for p in range(3)}
    fill_json(broker, ids, poison={2: 3})
    broker.ack_after_polls = 3
    failing = {"id-0-0", "id-0-4", "id-1-5"}
    ledger = JsonLedger(broker, failing)
    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, GROUP, {0: 6, 1: 6, 2: 6}))

    # when
    run(json_loop(broker, ledger, stop), stop)

    # then: every id but the poison one was called once, in offset order within its partition
    called = [i for p in range(3) for i in ids[p] if i != "id-2-3"]
    assert ledger.calls == Counter(called)
    for p in range(3):
        assert [o for q, o, _ in ledger.order if q == p] == [o for o in range(6) if (p, o) != (2, 3)]
    # and: the failures are on the tier, with their coordinates; the poison record is in the DLQ as poison
    tier = {json.loads(value or b""): h for value, h in hand_offs(broker, TIER)}
    assert {i: (h.original_partition, h.original_offset, h.reconsume_times) for i, h in tier.items()} == {
        "id-0-0": (0, 0, 1),
        "id-0-4": (0, 4, 1),
        "id-1-5": (1, 5, 1),
    }
    assert [(v, h.original_partition, h.original_offset, h.dlq_reason) for v, h in hand_offs(broker, DLQ)] == [
        (b"{not json", 2, 3, DlqReason.POISON)
    ]
    # and: no commit covered a failed offset before its hand-off was acknowledged
    for m in broker.records(TIER):
        headers = tier[json.loads(m.value or b"")]
        acked = delivered_at(broker, TIER, m.partition, m.offset)
        assert first_commit_past(broker, "orders", headers.original_partition, headers.original_offset) > acked
    # and: the successes were counted per partition, each exactly once
    handled: Counter[int] = Counter()
    for d in ledger.of(Event.RECORDS_HANDLED):
        handled[d["partition"]] += d["count"]
    assert handled == Counter({0: 4, 1: 5, 2: 5})


@BOTH_RUNS
def test_a_call_that_outlives_the_poll_interval_is_left_alone_and_the_rest_of_the_poll_is_read_again(
    monkeypatch: pytest.MonkeyPatch, deserializer: Deserializer
) -> None:
    # setup: two partitions in one poll; the first call on id-0-2 takes longer than max.poll.interval.ms,
    # then fails (a consumer that may have lost its partition must not hand that failure off)
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(5)] for p in range(2)}
    fill_json(broker, ids)
    ledger = JsonLedger(broker, failing=set())
    short_publish_backoff(monkeypatch)

    def slow_once(record_id: str) -> None:
        if record_id == "id-0-2" and ledger.calls[record_id] == 1:
            broker.clock.advance(DEFAULT_MAX_POLL_INTERVAL_MS / 1000 + 1)
            raise RuntimeError("outlived the poll interval")

    ledger.on_call = slow_once
    stop = StopWhen(committed_all(broker, GROUP, {0: 5, 1: 5}))

    # when
    run(json_loop(broker, ledger, stop, value_deserializer=deserializer), stop)

    # then: id-0-2 was left alone once, then handled; nothing else was called twice, nothing was lost
    assert ledger.calls == Counter({**Counter(i for p in (0, 1) for i in ids[p]), "id-0-2": 2})
    assert [(d["partition"], d["offset"]) for d in ledger.of(Event.RECORD_ABANDONED)] == [(0, 2)]
    assert broker.records(TIER) == [] and broker.records(DLQ) == []
    # and: partition 0 was read again from id-0-2, in order (the calls before it were not repeated)
    assert [o for q, o, _ in ledger.order if q == 0] == [0, 1, 2, 2, 3, 4]


@BOTH_RUNS
def test_a_failure_while_stopping_is_neither_handed_off_nor_committed_and_nothing_after_it_is_called(
    monkeypatch: pytest.MonkeyPatch, deserializer: Deserializer
) -> None:
    # setup: the app is told to stop during the call on id-0-2, which then fails
    broker = new_broker()
    ids = {0: [f"id-0-{i}" for i in range(6)]}
    fill_json(broker, ids)
    ledger = JsonLedger(broker, failing={"id-0-2"})
    short_publish_backoff(monkeypatch)
    stop = StopWhen(lambda: False)
    ledger.on_call = lambda record_id: stop.set() if record_id == "id-0-2" else None

    # when
    loop = json_loop(broker, ledger, stop, commit_every=100, value_deserializer=deserializer)
    loop.run()

    # then: the calls before it finished and were committed at shutdown; it was not handed off
    assert loop.crash is None
    assert ledger.calls == Counter(["id-0-0", "id-0-1", "id-0-2"])
    assert broker.committed(GROUP) == {("orders", 0): 2}
    assert broker.records(TIER) == [] and broker.records(DLQ) == []
    assert [d["offset"] for d in ledger.of(Event.RECORD_ABANDONED)] == [2]


def test_a_base_exception_from_a_handler_stops_the_app_and_the_calls_before_it_are_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: id-0-1 fails (to the tier), id-0-2 succeeds, then id-0-3 raises KeyboardInterrupt
    broker = new_broker()
    fill_json(broker, {0: [f"id-0-{i}" for i in range(6)]})
    ledger = JsonLedger(broker, failing={"id-0-1"})
    short_publish_backoff(monkeypatch)

    def interrupt(record_id: str) -> None:
        if record_id == "id-0-3":
            raise KeyboardInterrupt

    ledger.on_call = interrupt
    stop = StopWhen(lambda: False)
    loop = json_loop(broker, ledger, stop, commit_every=100)

    # when
    loop.run()

    # then: the app stopped on it; everything before it is committed, it is not handed off
    assert isinstance(loop.crash, KeyboardInterrupt)
    assert ledger.calls == Counter(["id-0-0", "id-0-1", "id-0-2", "id-0-3"])
    assert broker.committed(GROUP) == {("orders", 0): 3}
    assert [v for v, _ in hand_offs(broker, TIER)] == [b'"id-0-1"'] and broker.records(DLQ) == []


def test_after_a_long_call_ownership_is_asked_with_the_calls_that_returned_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: the call on id-0-3 outlasts half the session and the group expels the member meanwhile; the
    # group can only be asked with a commit, so the calls that returned before it must be finished by then
    broker = new_broker()
    ids = [f"id-0-{i}" for i in range(6)]
    fill_json(broker, {0: ids})
    ledger = JsonLedger(broker, failing={"id-0-3"})
    short_publish_backoff(monkeypatch)
    consumer = broker.consumer(GROUP)

    def expelled_during(record_id: str) -> None:
        if record_id == "id-0-3" and ledger.calls[record_id] == 1:
            consumer.expel()
            broker.clock.advance(consumer.session_timeout_ms / 1000 / 2 + 1)

    ledger.on_call = expelled_during
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(json_loop(broker, ledger, stop, consumer=consumer), stop)

    # then: the expelled member left id-0-3 alone (no hand-off from it): the commit that asked was refused,
    # so the new membership read the partition again from the start, and handed id-0-3 off once
    assert [(d["partition"], d["offset"]) for d in ledger.of(Event.RECORD_ABANDONED)] == [(0, 3)]
    assert ledger.calls == Counter(ids) + Counter(ids[:4])
    assert [(v, h.reconsume_times) for v, h in hand_offs(broker, TIER)] == [(b'"id-0-3"', 1)]


# -- outcomes, on the stage directly ----------------------------------------------------------------------


class Stage:
    """A records stage as a loop makes it, over one member of `topic`'s group on the broker and its clock,
    with an audit of records handled already; records due within 2 s wait in memory."""

    def __init__(self, broker: MemoryBroker, topic: str, handler: Callable[[Record[Any]], None]) -> None:
        self.consumer = broker.consumer(topic)
        self.consumer.subscribe([topic], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)
        self.consumer.consume(0, 0)  # joins: the partition is assigned
        stop = threading.Event()
        binding = Binding(topic="orders", handler=handler, policy=POLICY, ctx=CTX, value_deserializer=json_value)
        self.audit = DuplicateAudit(10)
        waiting = self.waiting = PauseController(self.consumer, Emitter(), consumer_name=topic, ahead_ms=2_000)
        check = OwnershipCheck(self.consumer, OffsetTracker())
        self.ownership = OwnershipGuard(check, Emitter().emit, name=topic, stop=stop, monotonic=broker.clock.monotonic)
        duplicates = DuplicateCheck({topic: binding}, tail_reader=None, seed_last=0, seed_timeout_s=0)
        parts = (self.audit, Invoker(stop), self.ownership, duplicates)
        clock, rng = broker.clock, random.Random(0)
        # the stage of the consumer's kind: the source path for a source topic, else the tier path
        self.stage: SourceStage | TierStage = (
            SourceStage({topic: binding}, *parts, clock=clock, rng=rng, stop=stop)
            if topic == binding.topic
            else TierStage({topic: binding}, waiting, *parts, clock=clock, rng=rng, stop=stop)
        )

    def read(self, msg: Message) -> list[Outcome]:
        self.ownership.polled()  # as after the consume that returned `msg`
        return list(self.stage.read(msg))


def tier_json(broker: MemoryBroker, record_id: str, *, failed_ago_ms: int) -> Message:
    """A tier record whose value is the JSON string `record_id` (the stage's binding decodes JSON)."""
    msg = tier_record(broker, 0, record_id, failed_ago_ms=failed_ago_ms)
    return msg._replace(value=json.dumps(record_id).encode())


def test_the_stage_yields_one_outcome_per_record_for_each_case() -> None:
    """Succeeded, Failed with its route, Duplicate, Waiting in memory (with what was decided) and Waiting in
    Kafka, each for the record it describes."""
    broker = new_broker()
    failing = {"fails"}
    calls: list[str] = []

    def handle(record: Record[Any]) -> None:
        calls.append(record.value)
        if record.value in failing:
            raise RuntimeError("fails again")

    stage = Stage(broker, TIER, handle)
    ok, fails = tier_json(broker, "ok", failed_ago_ms=6_000), tier_json(broker, "fails", failed_ago_ms=6_000)

    # a record due, whose handler returns: Succeeded with its audit key and record
    [succeeded] = stage.read(ok)
    assert type(succeeded) is Succeeded and succeeded.msg == ok and succeeded.record.value == "ok"
    assert succeeded.key == audit_key(decode(list(ok.headers)))
    # a record due, whose handler fails on its last tier: Failed, routed to the DLQ
    [failed] = stage.read(fails)
    assert type(failed) is Failed and failed.msg == fails and str(failed.failure) == "fails again"
    assert (failed.route.kind, failed.route.topic) == (RouteKind.DLQ, DLQ)
    assert decode(list(failed.route.headers)).original_offset == 0
    # a record whose hop was handled here already: Duplicate, without a call
    stage.audit.remember(succeeded.key)
    [duplicate] = stage.read(ok._replace(offset=7))
    assert type(duplicate) is Duplicate and duplicate.msg.offset == 7 and not duplicate.downstream
    # a record due in 1 s (within the 2 s horizon): Waiting in memory, with what was decided about it
    soon = tier_json(broker, "soon", failed_ago_ms=4_000)
    [in_memory] = stage.read(soon)
    state = decode(list(soon.headers))
    assert in_memory == Waiting(soon, state.due_at, Queued(state, audit_key(state), None, None))
    # a record due in 5 s, on a partition with nothing waiting in memory: Waiting in Kafka (pause, seek back)
    later = tier_json(broker, "later", failed_ago_ms=0)
    fresh = Stage(broker, TIER, handle)
    assert fresh.read(later) == [Waiting(later, decode(list(later.headers)).due_at, None)]
    assert calls == ["ok", "fails"]


def test_a_call_past_max_poll_interval_yields_abandoned_not_its_result() -> None:
    """The handler returned, but after max.poll.interval.ms: the record is `Abandoned` (read again), neither
    succeeded nor failed."""
    broker = new_broker()

    def handle(record: Record[Any]) -> None:
        broker.clock.advance(DEFAULT_MAX_POLL_INTERVAL_MS / 1000 + 1)
        raise RuntimeError("would be routed by a consumer that no longer owns the partition")

    stage = Stage(broker, TIER, handle)
    msg = tier_json(broker, "slow", failed_ago_ms=6_000)
    assert stage.read(msg) == [Abandoned(msg)]


def test_a_base_exception_from_a_handler_yields_the_calls_that_returned_before_it() -> None:
    """A plain run whose third call raises KeyboardInterrupt: the two calls before it are one SucceededRun,
    yielded before the exception stops the app."""
    broker = new_broker()
    fill_json(broker, {0: ["a", "b", "stop", "d"]})

    def handle(record: Record[Any]) -> None:
        if record.value == "stop":
            raise KeyboardInterrupt

    stage = Stage(broker, "orders", handle)
    msgs = broker.records("orders")
    assert isinstance(stage.stage, SourceStage)
    [(binding, run)] = stage.stage.plain_runs(msgs, stage.waiting) or []
    outcomes: list[Outcome] = []
    with pytest.raises(KeyboardInterrupt):
        for outcome in stage.stage.call_run(binding, run):
            outcomes.append(outcome)
    assert outcomes == [SucceededRun(("orders", 0), msgs[:2], None, [])]


# -- decided once, in a loop -------------------------------------------------------------------------------


def test_a_record_waiting_in_memory_is_not_decided_again_when_it_falls_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its retry headers are read, and `step.decide` asked, once, when it is read; what was decided waits
    with it in memory and is carried out when it falls due."""
    reads: Counter[int] = Counter()
    decisions: list[Action] = []
    read_retry_state, decide = stage_module.read_retry_state, stage_module.decide

    def counting_reads(ctx: Any, msg: Message, **kwargs: Any) -> Any:
        reads[msg.offset] += 1
        return read_retry_state(ctx, msg, **kwargs)

    def counting_decisions(**facts: Any) -> Action:
        decisions.append(decide(**facts))
        return decisions[-1]

    monkeypatch.setattr(stage_module, "read_retry_state", counting_reads)
    monkeypatch.setattr(stage_module, "decide", counting_decisions)
    # setup: two tier records due in 1 s: they wait in memory, one behind the other
    broker = new_broker()
    tier_record(broker, 0, "id-0", failed_ago_ms=4_000)
    tier_record(broker, 1, "id-1", failed_ago_ms=4_000)
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(committed_all(broker, TIER, {0: 2}, topic=TIER))

    # when
    run(build_loop(broker, ledger, stop, topic=TIER, wait_in_memory_ms=5_000), stop)

    # then: each handled once, when due, having waited in memory (never paused); its headers read once
    assert ledger.calls == Counter({"id-0": 1, "id-1": 1})
    due = decode(list(broker.records(TIER)[0].headers)).due_at
    assert all(due <= t <= due + 100 for times in ledger.called_at.values() for t in times)
    assert not ledger.of(Event.PARTITION_PAUSED)
    assert reads == Counter({0: 1, 1: 1})
    assert decisions == [Action.WAIT_IN_MEMORY] * 2


def test_a_second_copy_of_a_hop_read_while_the_first_waits_in_memory_is_suppressed() -> None:
    """A copy of a hop (a producer retry wrote it twice) read while the first copy waits in memory is a
    duplicate: handled once, the copy finished as `duplicate.suppressed`, both offsets committed."""
    # setup: a tier record due in 1 s, and an exact copy of it behind it
    broker = new_broker()
    first = tier_record(broker, 0, "id-0", failed_ago_ms=4_000)
    broker.append(TIER, first.value, key=first.key, headers=first.headers, partition=0)
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(committed_all(broker, TIER, {0: 2}, topic=TIER))

    # when
    run(build_loop(broker, ledger, stop, topic=TIER, wait_in_memory_ms=5_000), stop)

    # then
    assert ledger.calls == Counter({"id-0": 1})
    assert [(d["offset"], d["origin_message_id"]) for d in ledger.of(Event.DUPLICATE_SUPPRESSED)] == [
        (1, decode(list(first.headers)).origin_message_id)
    ]
    assert broker.records(DLQ) == []
