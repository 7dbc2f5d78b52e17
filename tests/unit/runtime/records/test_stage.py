"""A main consumer's polls go to single-record handlers partition by partition (`RecordStage.call_run`):
no decision per record, the successes between two failures finished in one step. These tests hold it to
what the ordinary path guarantees, on the in-memory broker:

- every record is called once, in offset order within its partition; a failure is handed off and its offset
  committed only after the acknowledgement; a poison record is dead-lettered in its place;
- a call that outlives max.poll.interval.ms is left alone (not handed off), and it and the rest of the
  poll, in every partition, are read again;
- a failure while the app stops is neither handed off nor committed, and nothing after it is called.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from retrytopics.connectors.serde import json_value
from retrytopics.dedupe import DuplicateAudit
from retrytopics.events import Emitter, Event
from retrytopics.headers import DlqReason, RetryHeaders, decode
from retrytopics.memory import DEFAULT_MAX_POLL_INTERVAL_MS, MemoryBroker, MemoryConsumer
from retrytopics.record import Record
from retrytopics.runtime.consumer.loop import ConsumerLoop
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Binding

from ..kit import (
    CTX,
    DLQ,
    GROUP,
    POLICY,
    TIER,
    Ledger,
    StopWhen,
    committed_all,
    delivered_at,
    first_commit_past,
    new_broker,
    run,
    use_broker_clock,
)


class JsonLedger(Ledger):
    """The ledger, for records whose value is a JSON string (the id); handler calls in order, with coordinates."""

    def __init__(self, broker: MemoryBroker, failing: set[str]) -> None:
        super().__init__(broker, failing)
        self.order: list[tuple[int, int, str]] = []

    def handle(self, record: Record[Any]) -> None:
        self.order.append((record.partition, record.offset, record.value))
        super().handle(record._replace(value=record.value.encode()))


def json_loop(
    broker: MemoryBroker,
    ledger: Ledger,
    stop: threading.Event,
    *,
    consumer: MemoryConsumer | None = None,
    **settings: Any,
) -> ConsumerLoop:
    member = consumer or broker.consumer(GROUP)
    binding = Binding(topic="orders", handler=ledger.handle, policy=POLICY, ctx=CTX, value_deserializer=json_value)
    options: dict[str, Any] = {"max_wait_ms": 100, "commit_every": 1, "batch_size": 50, **settings}
    return ConsumerLoop(
        LoopSettings(name="main", group_id=GROUP, topics=("orders",), **options),
        {"orders": binding},
        consumer_factory=lambda: member,
        producer_factory=broker.producer,
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
    use_broker_clock(monkeypatch, broker)
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


def test_a_call_that_outlives_the_poll_interval_is_left_alone_and_the_rest_of_the_poll_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: two partitions in one poll; the first call on id-0-2 takes longer than max.poll.interval.ms,
    # then fails (a consumer that may have lost its partition must not hand that failure off)
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(5)] for p in range(2)}
    fill_json(broker, ids)
    ledger = JsonLedger(broker, failing=set())
    use_broker_clock(monkeypatch, broker)

    def slow_once(record_id: str) -> None:
        if record_id == "id-0-2" and ledger.calls[record_id] == 1:
            broker.clock.advance(DEFAULT_MAX_POLL_INTERVAL_MS / 1000 + 1)
            raise RuntimeError("outlived the poll interval")

    ledger.on_call = slow_once
    stop = StopWhen(committed_all(broker, GROUP, {0: 5, 1: 5}))

    # when
    run(json_loop(broker, ledger, stop), stop)

    # then: id-0-2 was left alone once, then handled; nothing else was called twice, nothing was lost
    assert ledger.calls == Counter({**Counter(i for p in (0, 1) for i in ids[p]), "id-0-2": 2})
    assert [(d["partition"], d["offset"]) for d in ledger.of(Event.RECORD_ABANDONED)] == [(0, 2)]
    assert broker.records(TIER) == [] and broker.records(DLQ) == []
    # and: partition 0 was read again from id-0-2, in order (the calls before it were not repeated)
    assert [o for q, o, _ in ledger.order if q == 0] == [0, 1, 2, 2, 3, 4]


def test_a_failure_while_stopping_is_neither_handed_off_nor_committed_and_nothing_after_it_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: the app is told to stop during the call on id-0-2, which then fails
    broker = new_broker()
    ids = {0: [f"id-0-{i}" for i in range(6)]}
    fill_json(broker, ids)
    ledger = JsonLedger(broker, failing={"id-0-2"})
    use_broker_clock(monkeypatch, broker)
    stop = StopWhen(lambda: False)
    ledger.on_call = lambda record_id: stop.set() if record_id == "id-0-2" else None

    # when
    loop = json_loop(broker, ledger, stop, commit_every=100)
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
    use_broker_clock(monkeypatch, broker)

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
    use_broker_clock(monkeypatch, broker)
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
