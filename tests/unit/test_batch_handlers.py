"""Batch handlers (`RetryApp.batch_handler`, issue 13) on the consumer loop with in-memory client fakes: one
call per partition and poll, in offset order; each failure named by `BatchFailed` is routed as a single
handler's would be, the others succeed; a record that fails before any call (poison) is settled in its place;
offsets are committed over settled records only; a consumer that lost its partition during the call settles
nothing and reads the records again."""

from __future__ import annotations

import random
import threading
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
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.core.router import RouteContext, route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import TailReader

from .test_loop import Clock, FakeConsumer, FakeProducer

POLICY = RetryPolicy(delays=["1s"], non_retryable=(ValueError,))
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
TIER, DLQ = CTX.topics.tiers[0].topic, CTX.topics.dlq


class Producer(FakeProducer):
    """Acknowledges every produce at once; keeps what was produced, headers included."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, bytes | None, list[tuple[str, bytes | None]]]] = []

    def produce(self, topic: str, *, on_delivery: Callable[[Any], None], **fields: Any) -> None:
        self.records.append((topic, fields["value"], list(fields["headers"])))
        super().produce(topic, on_delivery=on_delivery)


def source(partition: int, offset: int, value: bytes) -> Message:
    return Message("orders", partition, offset, 1, None, value, ())


def run(
    batches: list[list[Message]],
    handler: Callable[[list[Record[Any]]], None],
    monkeypatch: pytest.MonkeyPatch,
    *,
    clock: Clock | None = None,
    value_deserializer: Deserializer = json_value,
    emitter: Emitter | None = None,
    tail_reader: TailReader | None = None,
) -> tuple[FakeConsumer, Producer]:
    clock = clock or Clock()
    stop = threading.Event()
    steps: list[Callable[[FakeConsumer], list[Message]]] = []
    for i, batch in enumerate(batches):
        steps.append(
            lambda c, b=batch, first=(i == 0): (
                (c.on_assign([("orders", 0), ("orders", 1)]) if first else None) or list(b)
            )
        )
    consumer, producer = FakeConsumer(steps, stop), Producer()
    binding = Binding(
        topic="orders", handler=handler, policy=POLICY, ctx=CTX, value_deserializer=value_deserializer, batch=True
    )
    loop = ConsumerLoop(
        LoopSettings(name="main", group_id="billing", topics=("orders",), max_wait_ms=10, commit_on_ack=False),
        {"orders": binding},
        consumer_factory=lambda: consumer,
        producer_factory=lambda: producer,
        emitter=emitter or Emitter(),
        stop=stop,
        audit=DuplicateAudit(100),
        tail_reader=tail_reader,
        clock=clock,
    )
    loop.run()
    assert loop.crash is None
    return consumer, producer


def routed(producer: Producer) -> dict[bytes | None, tuple[str, DlqReason | None, str]]:
    out = {}
    for topic, value, headers in producer.records:
        state = decode(headers)
        out[value] = (topic, state.dlq_reason, state.exception_type)
    return out


def test_one_call_per_partition_and_poll_and_each_failure_routed_by_the_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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
    consumer, producer = run([batch], handle, monkeypatch)

    # then: the poison record never reached the handler, and each partition's records came in one call
    assert calls == [(0, [0, 2, 3], ["a", "c", "e"]), (1, [0, 1], ["b", "d"])]
    assert routed(producer) == {
        b"{not json": (DLQ, DlqReason.POISON, "retrytopics.errors.PoisonRecordError"),
        b'"c"': (TIER, None, "builtins.RuntimeError"),
        b'"d"': (DLQ, DlqReason.NON_RETRYABLE, "builtins.ValueError"),
    }
    assert consumer.commits[-1] == {("orders", 0): 4, ("orders", 1): 2}


@pytest.mark.parametrize("value_deserializer", [bytes_value, json_value], ids=["raw bytes", "decoded"])
def test_a_poll_that_all_succeeds_is_finished_and_counted_per_partition(
    monkeypatch: pytest.MonkeyPatch, value_deserializer: Deserializer
) -> None:
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
    consumer, producer = run(
        polls, handle, monkeypatch, value_deserializer=value_deserializer, emitter=Emitter([Recorder()])
    )

    # then: one call per partition and poll, in offset order; nothing handed off; every offset committed
    value = (lambda v: v) if value_deserializer is bytes_value else (lambda v: v.strip(b'"').decode())
    assert calls == [
        (0, [0, 1], [value(b'"a"'), value(b'"c"')], ["orders-0-0", "orders-0-1"]),
        (1, [0], [value(b'"b"')], ["orders-1-0"]),
        (1, [1], [value(b'"d"')], ["orders-1-1"]),
        (0, [2], [value(b'"e"')], ["orders-0-2"]),
    ]
    assert producer.produced == []
    assert consumer.commits[-1] == {("orders", 0): 3, ("orders", 1): 2}
    handled = [(d["partition"], d["offset"]) for e, d in seen if e is Event.RECORD_HANDLED]
    assert sorted(handled) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    counted = [
        (d["partition"], d["count"], d["first_offset"], d["last_offset"]) for e, d in seen if e is Event.RECORDS_HANDLED
    ]
    assert counted == [(0, 2, 0, 1), (1, 1, 0, 0), (1, 1, 1, 1), (0, 1, 2, 2)]


def test_a_record_handed_off_by_a_previous_owner_is_not_passed_to_the_handler_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: a previous owner handled record 1, handed it off to the tier and died before committing it
    polled = [source(0, 0, b'"a"'), source(0, 1, b'"b"'), source(0, 2, b'"c"')]
    hop = route(CTX, polled[1], RuntimeError("failed before"), now_ms=1, rng=random.Random(0))
    downstream = Message(hop.topic, 0, 0, 1, None, polled[1].value, tuple(hop.headers))
    calls: list[list[int]] = []

    # when: the new owner reads the tier's tail at assignment, then polls the three records
    consumer, producer = run(
        [polled],
        lambda records: calls.append([r.offset for r in records]),
        monkeypatch,
        tail_reader=lambda topics, last, timeout_s: [downstream],
    )

    # then: records 0 and 2 go to the handler; record 1 is finished without a call or a second hand-off
    assert calls == [[0], [2]]
    assert producer.produced == []
    assert consumer.commits[-1] == {("orders", 0): 3}


def test_after_a_seek_back_a_stale_copy_is_skipped_on_the_ordinary_path_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: a previous owner handed record 3 off; the first call outlives the poll interval, so the
    # partition is sought back to 0, and the next poll starts with a stale copy of record 2 fetched before it
    clock = Clock()
    hop = route(CTX, source(0, 3, b'"d"'), RuntimeError("failed before"), now_ms=1, rng=random.Random(0))
    downstream = Message(hop.topic, 0, 0, 1, None, b'"d"', tuple(hop.headers))
    calls: list[list[int]] = []

    def handle(records: list[Record[Any]]) -> None:
        calls.append([r.offset for r in records])
        if len(calls) == 1:
            clock.jump_s += FakeConsumer.max_poll_interval_ms / 1000 + 1

    first = [source(0, 0, b'"a"'), source(0, 1, b'"b"')]
    again = [source(0, 2, b'"c"'), *first, source(0, 2, b'"c"'), source(0, 3, b'"d"')]

    # when
    consumer, _ = run(
        [first, again], handle, monkeypatch, clock=clock, tail_reader=lambda topics, last, timeout_s: [downstream]
    )

    # then: read again from 0 in offset order; the stale copy never reached the handler; 3 was not called
    assert (("orders", 0), 0) in consumer.seeks
    assert calls == [[0, 1], [0, 1, 2]]
    assert consumer.commits[-1] == {("orders", 0): 4}


def test_any_other_exception_fails_every_record_of_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def handle(records: list[Record[Any]]) -> None:
        raise ConnectionError("the database is down")

    consumer, producer = run([[source(0, 0, b"1"), source(0, 1, b"2")], [source(0, 2, b"3")]], handle, monkeypatch)
    assert routed(producer) == dict.fromkeys((b"1", b"2", b"3"), (TIER, None, "builtins.ConnectionError"))
    assert consumer.commits[-1] == {("orders", 0): 3}


def test_naming_a_record_that_is_not_in_the_call_fails_the_whole_call(monkeypatch: pytest.MonkeyPatch) -> None:
    stranger = Record("orders", 0, 99, 1, None, "x", b"x", (), None, "orders-0-99")

    def handle(records: list[Record[Any]]) -> None:
        raise BatchFailed([(records[0], RuntimeError("first")), (stranger, RuntimeError("not ours"))])

    _, producer = run([[source(0, 0, b"1"), source(0, 1, b"2")]], handle, monkeypatch)
    assert routed(producer) == dict.fromkeys((b"1", b"2"), (TIER, None, "builtins.RuntimeError"))


def test_a_call_that_outlived_the_poll_interval_settles_nothing_and_reads_the_records_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: the call takes longer than max.poll.interval.ms (the clock jumps inside it)
    clock = Clock()

    def handle(records: list[Record[Any]]) -> None:
        clock.jump_s += FakeConsumer.max_poll_interval_ms / 1000 + 1
        raise RuntimeError("would be handed off by a consumer that no longer owns the partition")

    # when
    consumer, producer = run([[source(0, 5, b"1"), source(0, 6, b"2")]], handle, monkeypatch, clock=clock)

    # then: no hand-off, nothing committed, and the partition is read again from the group's first record
    assert producer.produced == []
    assert all(("orders", 0) not in commit for commit in consumer.commits)
    assert (("orders", 0), 5) in consumer.seeks


def test_registration_refuses_in_process_retries_and_names_the_field() -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    with pytest.raises(ConfigError) as info:
        app.batch_handler("orders", policy=RetryPolicy(delays=["1s"], in_process=InProcessRetry(attempts=2)))
    assert info.value.field == "policy.in_process"

    @app.batch_handler("orders", policy=POLICY)
    def handle(records: list[Record[Any]]) -> None:
        pass

    assert app.handlers["orders"].batch and app.handlers["orders"].handler is handle
