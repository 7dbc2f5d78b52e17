"""Batch handlers (`RetryApp.batch_handler`; runtime/records/batches.py) on the in-memory broker: one
call per partition and poll, in offset order; each failure named by `BatchFailed` is routed as a single
handler's would be, the others succeed; a record that fails before any call (poison) is settled in its place;
offsets are committed over settled records only; a consumer that lost its partition during the call settles
nothing and reads the records again."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import BatchFailed, NonRetryable, RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.serde import Deserializer, bytes_value, json_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import DlqReason, decode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import InProcessRetry, RetryPolicy
from retrytopics.core.ports import Message, Polled, split_runs
from retrytopics.core.record import Record
from retrytopics.core.router import RouteContext, route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import TailReader
from retrytopics.testing.broker import DEFAULT_MAX_POLL_INTERVAL_MS, MemoryBroker, MemoryConsumer

from ..kit import StopWhen

POLICY = RetryPolicy(delays=["1s"], non_retryable=(ValueError,))
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
TIER, DLQ = CTX.topics.tiers[0].topic, CTX.topics.dlq
SOURCE = (("orders", 0), ("orders", 1))


def source(partition: int, offset: int, value: bytes) -> tuple[int, int, bytes]:
    """A record the test writes to orders[partition]; `offset` says where it lands (checked when written)."""
    return partition, offset, value


class Polls:
    """Writes `polls[0]` now and each next one once the consumer has fetched everything written so far, so
    that each list is one poll of the consumer (the broker's fetch takes the partitions in turn)."""

    def __init__(self, broker: MemoryBroker, consumer: MemoryConsumer, polls: list[list[tuple[int, int, bytes]]]):
        self.broker, self.consumer, self.left = broker, consumer, list(polls)
        self._write_next()

    def _write_next(self) -> None:
        for partition, offset, value in self.left.pop(0):
            if offset < self.broker.end_offsets("orders")[partition]:
                continue  # written already: the record a stale copy stands for
            written = self.broker.append("orders", value, partition=partition)
            assert written.offset == offset, written

    def done(self) -> bool:
        ends = self.broker.end_offsets("orders")
        fetched = all(self.consumer.position(tp) == ends[tp[1]] for tp in SOURCE)
        if fetched and self.left:
            self._write_next()
            return False
        return fetched and self.broker.committed("billing") == {tp: ends[tp[1]] for tp in SOURCE if ends[tp[1]]}


def run(
    polls: list[list[tuple[int, int, bytes]]],
    handler: Callable[[list[Record[Any]]], None],
    *,
    broker: MemoryBroker | None = None,
    consumer: MemoryConsumer | None = None,
    value_deserializer: Deserializer = json_value,
    emitter: Emitter | None = None,
    tail_reader: TailReader | None = None,
) -> tuple[MemoryBroker, MemoryConsumer]:
    """A main consumer with a batch handler over `polls` on the in-memory broker and its clock, until every
    record is committed."""
    broker = broker or new_broker()
    consumer = consumer or broker.consumer("billing")
    stop = StopWhen(Polls(broker, consumer, polls).done)
    binding = Binding(
        topic="orders", handler=handler, policy=POLICY, ctx=CTX, value_deserializer=value_deserializer, batch=True
    )
    loop = ConsumerLoop(
        LoopSettings(name="main", group_id="billing", topics=("orders",), max_wait_ms=10, commit_on_ack=False),
        {"orders": binding},
        clients=LoopClients(consumer=lambda: consumer, producer=broker.producer, tail_reader=tail_reader),
        emitter=emitter or Emitter(),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )
    loop.run()
    assert loop.crash is None and not stop.gave_up
    return broker, consumer


def new_broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    broker.create_topics([TIER, DLQ])
    return broker


def routed(broker: MemoryBroker) -> dict[bytes | None, tuple[str, DlqReason | None, str]]:
    """What was handed off, by value: (topic, DLQ reason, exception type), from the decoded headers."""
    out = {}
    for topic in (TIER, DLQ):
        for m in broker.records(topic):
            state = decode(list(m.headers))
            out[m.value] = (topic, state.dlq_reason, state.exception_type)
    return out


def handed_off(broker: MemoryBroker) -> list[Message]:
    return broker.records(TIER) + broker.records(DLQ)


def test_one_call_per_partition_and_poll_and_each_failure_routed_by_the_policy() -> None:
    # setup: partition 0 has a poison record (not JSON) between good ones; the handler fails two records
    batch = [
        source(0, 0, b'"a"'),
        source(1, 0, b'"b"'),
        source(0, 1, b"{not json"),
        source(0, 2, b'"c"'),
        source(1, 1, b'"d"'),
        source(0, 3, b'"e"'),
    ]
    calls: list[tuple[int, list[int], list[Any]]] = []

    def handle(records: list[Record[Any]]) -> None:
        calls.append((records[0].partition, [r.offset for r in records], [r.value for r in records]))
        failed = [(r, RuntimeError("later")) for r in records if r.value == "c"]
        failed += [(r, NonRetryable(ValueError("bad"))) for r in records if r.value == "d"]
        if failed:
            raise BatchFailed(failed)

    # when
    broker, _ = run([batch], handle)

    # then: the poison record never reached the handler, and each partition's records came in one call
    assert calls == [(0, [0, 2, 3], ["a", "c", "e"]), (1, [0, 1], ["b", "d"])]
    assert routed(broker) == {
        b"{not json": (DLQ, DlqReason.POISON, "retrytopics.errors.PoisonRecordError"),
        b'"c"': (TIER, None, "builtins.RuntimeError"),
        b'"d"': (DLQ, DlqReason.NON_RETRYABLE, "builtins.ValueError"),
    }
    assert broker.committed("billing") == {("orders", 0): 4, ("orders", 1): 2}


@pytest.mark.parametrize("value_deserializer", [bytes_value, json_value], ids=["raw bytes", "decoded"])
def test_a_poll_that_all_succeeds_is_finished_and_counted_per_partition(value_deserializer: Deserializer) -> None:
    # setup: two polls over two partitions, every record succeeds; a hook wants one event per record too
    polls = [
        [source(0, 0, b'"a"'), source(1, 0, b'"b"'), source(0, 1, b'"c"')],
        [source(1, 1, b'"d"'), source(0, 2, b'"e"')],
    ]
    calls: list[tuple[int, list[int], list[Any], list[str]]] = []
    seen: list[tuple[Event, dict[str, object]]] = []

    class Recorder:
        wanted_events = frozenset({Event.RECORD_HANDLED, Event.RECORDS_HANDLED})

        def on_event(self, event: Event, data: dict[str, object]) -> None:
            seen.append((event, dict(data)))

    def handle(records: list[Record[Any]]) -> None:
        calls.append(
            (
                records[0].partition,
                [r.offset for r in records],
                [r.value for r in records],
                [r.origin_message_id for r in records],
            )
        )
        assert all(r.retry is None and r.attempt == 1 and r.headers == () for r in records)

    # when
    broker, _ = run(polls, handle, value_deserializer=value_deserializer, emitter=Emitter([Recorder()]))

    # then: one call per partition and poll, in offset order; nothing handed off; every offset committed
    value = (lambda v: v) if value_deserializer is bytes_value else (lambda v: v.strip(b'"').decode())
    assert calls == [
        (0, [0, 1], [value(b'"a"'), value(b'"c"')], ["orders-0-0", "orders-0-1"]),
        (1, [0], [value(b'"b"')], ["orders-1-0"]),
        (1, [1], [value(b'"d"')], ["orders-1-1"]),
        (0, [2], [value(b'"e"')], ["orders-0-2"]),
    ]
    assert handed_off(broker) == []
    assert broker.committed("billing") == {("orders", 0): 3, ("orders", 1): 2}
    handled = [(d["partition"], d["offset"]) for e, d in seen if e is Event.RECORD_HANDLED]
    assert sorted(handled) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    counted = [
        (d["partition"], d["count"], d["first_offset"], d["last_offset"]) for e, d in seen if e is Event.RECORDS_HANDLED
    ]
    assert counted == [(0, 2, 0, 1), (1, 1, 0, 0), (1, 1, 1, 1), (0, 1, 2, 2)]


def hop_of(broker: MemoryBroker, offset: int, value: bytes) -> None:
    """A previous owner handled orders[0]@offset, written now, handed it off to the tier and died before
    committing it."""
    failed = Message("orders", 0, offset, broker.clock.now_ms(), None, value, ())
    hop = route(CTX, failed, RuntimeError("failed before"), now_ms=broker.clock.now_ms(), rng=random.Random(0))
    broker.append(hop.topic, value, headers=hop.headers)


def tails(broker: MemoryBroker) -> TailReader:
    """Reads the destinations' tails from the broker, as the loop does at assignment."""
    return lambda topics, last, timeout_s: [m for t in topics for m in broker.records(t)[-last:]]


def test_a_record_handed_off_by_a_previous_owner_is_not_passed_to_the_handler_again() -> None:
    # setup: a previous owner handed record 1 off to the tier
    broker = new_broker()
    hop_of(broker, 1, b'"b"')
    calls: list[list[int]] = []

    # when: the new owner reads the tier's tail at assignment, then polls the three records
    run(
        [[source(0, 0, b'"a"'), source(0, 1, b'"b"'), source(0, 2, b'"c"')]],
        lambda records: calls.append([r.offset for r in records]),
        broker=broker,
        tail_reader=tails(broker),
    )

    # then: records 0 and 2 go to the handler; record 1 is finished without a call or a second hand-off
    assert calls == [[0], [2]]
    assert len(handed_off(broker)) == 1
    assert broker.committed("billing") == {("orders", 0): 3}


def test_after_a_seek_back_a_stale_copy_is_skipped_on_the_ordinary_path_too() -> None:
    # setup: a previous owner handed record 3 off; the first call outlives the poll interval, so the
    # partition is sought back to 0, and the next poll starts with a stale copy of record 2 fetched before it
    broker = new_broker()
    written_at = broker.clock.now_ms()
    hop_of(broker, 3, b'"d"')
    consumer = broker.consumer("billing")
    calls: list[list[int]] = []

    def handle(records: list[Record[Any]]) -> None:
        calls.append([r.offset for r in records])
        if len(calls) == 1:
            broker.clock.advance(DEFAULT_MAX_POLL_INTERVAL_MS / 1000 + 1)
            broker.append("orders", b'"c"', partition=0, timestamp_ms=written_at)
            broker.append("orders", b'"d"', partition=0, timestamp_ms=written_at)
            consumer.deliver_stale([m for m in broker.records("orders") if m.offset == 2])

    # when
    run(
        [[source(0, 0, b'"a"'), source(0, 1, b'"b"')]],
        handle,
        broker=broker,
        consumer=consumer,
        tail_reader=tails(broker),
    )

    # then: read again from 0 in offset order; the stale copy never reached the handler; 3 was not called
    assert calls == [[0, 1], [0, 1, 2]]
    assert len(handed_off(broker)) == 1
    assert broker.committed("billing") == {("orders", 0): 4}


def test_any_other_exception_fails_every_record_of_the_call() -> None:
    def handle(records: list[Record[Any]]) -> None:
        raise ConnectionError("the database is down")

    broker, _ = run([[source(0, 0, b"1"), source(0, 1, b"2")], [source(0, 2, b"3")]], handle)
    assert routed(broker) == dict.fromkeys((b"1", b"2", b"3"), (TIER, None, "builtins.ConnectionError"))
    assert len(handed_off(broker)) == 3
    assert broker.committed("billing") == {("orders", 0): 3}


def test_naming_a_record_that_is_not_in_the_call_fails_the_whole_call() -> None:
    stranger = Record("orders", 0, 99, 1, None, "x", b"x", (), None, "orders-0-99")

    def handle(records: list[Record[Any]]) -> None:
        raise BatchFailed([(records[0], RuntimeError("first")), (stranger, RuntimeError("not ours"))])

    broker, _ = run([[source(0, 0, b"1"), source(0, 1, b"2")]], handle)
    assert routed(broker) == dict.fromkeys((b"1", b"2"), (TIER, None, "builtins.RuntimeError"))
    assert len(handed_off(broker)) == 2


def test_a_call_that_outlived_the_poll_interval_settles_nothing_and_reads_the_records_again() -> None:
    # setup: the first call takes longer than max.poll.interval.ms (the clock moves inside it); every call fails
    broker = new_broker()
    calls: list[tuple[list[int], int]] = []

    def handle(records: list[Record[Any]]) -> None:
        calls.append(([r.offset for r in records], len(broker.journal)))
        if len(calls) == 1:
            broker.clock.advance(DEFAULT_MAX_POLL_INTERVAL_MS / 1000 + 1)
        raise RuntimeError("handed off only by a consumer that still owns the partition")

    # when
    run([[source(0, 0, b"1"), source(0, 1, b"2")]], handle, broker=broker)

    # then: the first call settled nothing (no hand-off, no commit before the second call); the records were
    # read again from the first, and the second call handed each off once
    assert [offsets for offsets, _ in calls] == [[0, 1], [0, 1]]
    assert [e for e in broker.journal[: calls[1][1]] if e[0] == "committed" or e[1] != "orders"] == []
    assert [m.value for m in broker.records(TIER)] == [b"1", b"2"]
    assert broker.committed("billing") == {("orders", 0): 2}


def test_registration_refuses_in_process_retries_and_names_the_field() -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    with pytest.raises(ConfigError) as info:
        app.batch_handler("orders", policy=RetryPolicy(delays=["1s"], in_process=InProcessRetry(attempts=2)))
    assert info.value.field == "policy.in_process"

    @app.batch_handler("orders", policy=POLICY)
    def handle(records: list[Record[Any]]) -> None:
        pass

    assert app.handlers["orders"].batch and app.handlers["orders"].handler is handle


class BuildingConsumer(MemoryConsumer):
    """A consumer port that builds a batch handler's Records itself (`ports.consume_runs`), as the Kafka
    adapter does, and keeps every Record it built."""

    built: list[Record[Any]]

    def consume_runs(self, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
        polled = split_runs(self.consume(max_records, timeout_s), topics)
        self.built += [r for run in polled.runs for r in run]
        return polled


def test_a_plain_run_hands_the_handler_the_records_its_consumer_built_one_object_each() -> None:
    """On a main consumer with a bytes batch handler, a poll's records reach the handler as the very Records
    the consumer built (one object per consumed record, no Message first), in one call per partition and
    poll; a run that fails goes to the tier record by record, and every offset is committed."""
    broker = new_broker()
    consumer = BuildingConsumer(
        broker,
        broker._group("billing"),
        read_committed=True,
        auto_offset_reset="earliest",
        max_poll_interval_ms=DEFAULT_MAX_POLL_INTERVAL_MS,
        session_timeout_ms=45_000,
    )
    consumer.built = []
    calls: list[list[Record[Any]]] = []

    def handle(records: list[Record[Any]]) -> None:
        calls.append(list(records))
        if records[0].value == b"fails":
            raise RuntimeError("the whole call fails")

    run(
        [[source(0, 0, b"a"), source(1, 0, b"b"), source(0, 1, b"c")], [source(1, 1, b"fails"), source(1, 2, b"d")]],
        handle,
        broker=broker,
        consumer=consumer,
        value_deserializer=bytes_value,
    )

    handed = [r for call in calls for r in call]
    assert [(r.partition, r.offset, r.value) for r in handed] == [
        (0, 0, b"a"),
        (0, 1, b"c"),
        (1, 0, b"b"),
        (1, 1, b"fails"),
        (1, 2, b"d"),
    ]
    assert len(handed) == len(consumer.built) and all(h is b for h, b in zip(handed, consumer.built, strict=True))
    assert [r.origin_message_id for r in handed] == [
        "orders-0-0",
        "orders-0-1",
        "orders-1-0",
        "orders-1-1",
        "orders-1-2",
    ]
    assert routed(broker) == {
        b"fails": (TIER, None, "builtins.RuntimeError"),
        b"d": (TIER, None, "builtins.RuntimeError"),
    }
    assert broker.committed("billing") == {("orders", 0): 2, ("orders", 1): 3}
