"""The share-group main consumer (runtime/consumer/share_loop.py and its hand-off, runtime/handoff/acknowledge.py),
on the in-memory share group (`MemoryBroker.share_consumer`) and its clock.

Guarantees, each asserted on the share group's record states and delivery counts, the tier and DLQ contents
with decoded retry headers, and a per-id ledger of handler calls:

- every outcome ends in its acknowledgement: a success, a failure handed off to its tier, a poison record
  dead-lettered: ACCEPT, each once; nothing else is acknowledged;
- a hand-off the broker refuses RELEASEs its record, which comes back and is handed off then: nothing lost;
- a record that kills its consumer every time reaches our DLQ as `delivery_limit`, with its delivery count,
  before the group's limit archives it, and every other record of the topic is handled;
- stopping mid-batch releases what was not handled; a call that outlives the record lock is not handed off;
- exactly-once with a share consumer is refused at start-up, naming the field.

The broker's clock is the loop's: a poll that finds nothing advances it by its timeout, so lock expiry costs
no real time. What Kafka does is proven on Apache Kafka (tests/integration/share/).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import KafkaConfig, RetryApp
from retrytopics.connectors.serde import json_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import DlqReason
from retrytopics.core.naming import topics_for
from retrytopics.core.record import Record
from retrytopics.core.router import RouteContext
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.consumer.share_loop import ShareConsumerLoop, handling_order
from retrytopics.runtime.records.calls import Binding
from retrytopics.testing import MemoryBroker, MemoryClientFactory, MemoryShareConsumer, ShareRecordState

from ..kit import CTX, DLQ, GROUP, TIER, Ledger, StopWhen, eventually, hand_offs, new_broker

ACCEPTED = ShareRecordState.ACKNOWLEDGED


class Died(BaseException):
    """What the handler raises after killing its share consumer: the process is gone."""


def fill(broker: MemoryBroker, ids: list[str]) -> None:
    for record_id in ids:
        broker.append("orders", record_id.encode(), key=b"k", partition=0)


def share_loop(
    broker: MemoryBroker,
    ledger: Ledger,
    stop: threading.Event,
    *,
    consumer: MemoryShareConsumer | None = None,
    handler: Callable[[Record[Any]], None] | None = None,
    binding: Binding | None = None,
    hooks: tuple[Any, ...] = (),
    **settings: Any,
) -> ShareConsumerLoop:
    """A share-group main consumer of "orders" on `broker` and its clock; events go to the ledger."""
    member = consumer or broker.share_consumer(GROUP, supports_renew=False)
    binding = binding or Binding(
        topic="orders", handler=handler or ledger.handle, policy=CTX.policy, ctx=CTX, value_deserializer=json_or_bytes
    )
    return ShareConsumerLoop(
        LoopSettings(name="orders", group_id=GROUP, topics=("orders",), **{"max_wait_ms": 100, **settings}),
        {"orders": binding},
        consumer_factory=lambda: member,
        producer_factory=broker.producer,
        group_config=lambda: broker.share_group_config(GROUP),
        emitter=Emitter([ledger, *hooks]),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )


def json_or_bytes(value: bytes | None, ctx: Any = None) -> Any:
    """The record's value as it is; `{` starts JSON, so a record `{oops` is poison."""
    if value is not None and value.startswith(b"{"):
        return json_value(value, ctx)
    return value


def configured(limit: int = 5, lock_ms: int = 1000) -> MemoryBroker:
    broker = new_broker()
    broker.configure_share_group(
        GROUP, auto_offset_reset="earliest", record_lock_duration_ms=lock_ms, delivery_count_limit=limit
    )
    return broker


def states(broker: MemoryBroker) -> dict[int, tuple[ShareRecordState, int]]:
    return {offset: state for (_p, offset), state in broker.share_state(GROUP, "orders").items()}


def ids_in(broker: MemoryBroker, topic: str) -> list[str]:
    return [record_id for record_id, _h in hand_offs(broker, topic)]


def run_until(loop: ShareConsumerLoop, stop: StopWhen) -> None:
    loop.run()
    assert loop.crash is None, loop.crash
    assert not stop.gave_up, "the loop never reached the expected end state"


def test_every_outcome_ends_in_its_acknowledgement() -> None:
    """Successes, a failure (handed off to its tier) and a poison record (to the DLQ) are each ACCEPTed once,
    on their first delivery; the tier and the DLQ hold exactly the failed and the poison record."""
    broker = configured()
    ids = ["id-0", "id-1", "{oops", "id-3", "id-4"]
    fill(broker, ids)
    ledger = Ledger(broker, failing={"id-1"})
    stop = StopWhen(
        lambda: len(broker.records(TIER)) == 1 and len(broker.records(DLQ)) == 1 and len(states(broker)) == 5
    )
    run_until(share_loop(broker, ledger, stop), stop)

    assert states(broker) == dict.fromkeys(range(5), (ACCEPTED, 1))
    [(tier_id, tier_headers)] = hand_offs(broker, TIER)
    assert (tier_id, tier_headers.original_offset, tier_headers.reconsume_times) == ("id-1", 1, 1)
    [(_dlq_id, dlq_headers)] = hand_offs(broker, DLQ)
    assert (dlq_headers.dlq_reason, dlq_headers.original_offset) == (DlqReason.POISON, 2)
    assert ledger.calls == {"id-0": 1, "id-1": 1, "id-3": 1, "id-4": 1}
    acknowledged = ledger.of(Event.RECORDS_ACKNOWLEDGED)
    assert sum(a["accepted"] for a in acknowledged) == 5
    assert sum(a["released"] + a["rejected"] + a["renewed"] for a in acknowledged) == 0
    assert sum(a["delivery_counts"].get(1, 0) for a in acknowledged) == 5


def test_a_refused_hand_off_releases_the_record_and_it_comes_back() -> None:
    """The broker refuses the failed record's republish: the record is RELEASEd (not accepted, not lost),
    delivered again with count 2, failed again and handed off then: one tier record, ACCEPTed on delivery 2."""
    broker = configured()
    fill(broker, ["id-0", "id-1", "id-2"])
    broker.fail_produces(1, "NOT_ENOUGH_REPLICAS", retriable=True)
    ledger = Ledger(broker, failing={"id-1"})
    stop = StopWhen(lambda: len(broker.records(TIER)) == 1 and all(s is ACCEPTED for s, _ in states(broker).values()))
    run_until(share_loop(broker, ledger, stop), stop)

    assert states(broker) == {0: (ACCEPTED, 1), 1: (ACCEPTED, 2), 2: (ACCEPTED, 1)}
    assert ids_in(broker, TIER) == ["id-1"]
    assert ledger.calls == {"id-0": 1, "id-1": 2, "id-2": 1}
    acknowledged = ledger.of(Event.RECORDS_ACKNOWLEDGED)
    assert sum(a["released"] for a in acknowledged) == 1
    assert sum(a["accepted"] for a in acknowledged) == 3
    assert len(ledger.of(Event.PUBLISH_FAILED)) == 1


def test_a_crash_loop_reaches_our_dlq_as_delivery_limit_and_the_rest_is_handled() -> None:
    """`id-3` kills its consumer (nothing acknowledged, nothing released) every time it is handled. Each new
    consumer gets the batch again once the locks expire. At the group's limit (5) `id-3` goes to our DLQ as
    `delivery_limit` with its delivery count instead of to its handler, and is ACCEPTed; every other id is
    handled (those behind `id-3` too) and ACCEPTed, none dead-lettered."""
    broker = configured(limit=5)
    ids = [f"id-{i}" for i in range(8)]
    fill(broker, ids)
    ledger = Ledger(broker, failing=set())
    member: list[MemoryShareConsumer] = []

    def handle(record: Record[Any]) -> None:
        ledger.handle(record)
        if record.value == b"id-3":
            member[-1].kill()
            raise Died()

    def finished() -> bool:
        return len(broker.records(DLQ)) == 1 and all(s is ACCEPTED for s, _ in states(broker).values())

    for _process in range(8):
        member.append(broker.share_consumer(GROUP, supports_renew=False))
        stop = StopWhen(finished)
        loop = share_loop(broker, ledger, stop, consumer=member[-1], handler=handle)
        loop.run()
        if loop.crash is None:
            break
        assert isinstance(loop.crash, Died)
    assert not stop.gave_up and finished()

    [(dlq_id, headers)] = hand_offs(broker, DLQ)
    assert (dlq_id, headers.dlq_reason, headers.original_offset) == ("id-3", DlqReason.DELIVERY_LIMIT, 3)
    assert headers.exception_type.endswith("DeliveryLimitReached")
    assert "delivered 5 times" in (headers.exception_message or "")
    assert ledger.calls["id-3"] == 4  # deliveries 1-4; the fifth went to the DLQ, not to the handler
    assert set(ledger.calls) == set(ids)
    assert states(broker)[3] == (ACCEPTED, 5)
    assert all(state is ACCEPTED and count < 5 for offset, (state, count) in states(broker).items() if offset != 3)
    assert ids_in(broker, TIER) == []
    [dispatched] = ledger.of(Event.DLQ_DISPATCHED)
    assert dispatched["reason"] == "delivery_limit"


def test_stopping_mid_batch_releases_what_was_not_handled() -> None:
    """The app stops while `id-1` is handled: `id-0` and `id-1` are ACCEPTed; the rest of the batch is
    RELEASEd (available again, delivery count 1), and the next member gets every one of them, count 2."""
    broker = configured()
    ids = [f"id-{i}" for i in range(5)]
    fill(broker, ids)
    ledger = Ledger(broker, failing=set())
    stop = threading.Event()
    ledger.on_call = lambda record_id: stop.set() if record_id == "id-1" else None
    loop = share_loop(broker, ledger, stop)
    loop.run()
    assert loop.crash is None
    assert states(broker) == {
        0: (ACCEPTED, 1),
        1: (ACCEPTED, 1),
        **dict.fromkeys((2, 3, 4), (ShareRecordState.AVAILABLE, 1)),
    }

    ledger.on_call = lambda _id: None
    again = StopWhen(lambda: all(s is ACCEPTED for s, _ in states(broker).values()))
    run_until(share_loop(broker, ledger, again), again)
    assert {o: c for o, (_s, c) in states(broker).items()} == {0: 1, 1: 1, 2: 2, 3: 2, 4: 2}
    assert ledger.calls == dict.fromkeys(ids, 1)


def test_a_call_past_the_record_lock_is_released_not_handed_off() -> None:
    """A handler call on `id-0` outlives the 1 s lock and fails: the record may be another member's now, so
    its failure is not handed off; it is released, comes back, and is handed off on its second delivery."""
    broker = configured(lock_ms=1000)
    fill(broker, ["id-0", "id-1"])
    ledger = Ledger(broker, failing={"id-0"})
    ledger.on_call = lambda record_id: broker.clock.advance(2.0) if ledger.calls == {"id-0": 1} else None
    stop = StopWhen(lambda: len(broker.records(TIER)) == 1 and all(s is ACCEPTED for s, _ in states(broker).values()))
    run_until(share_loop(broker, ledger, stop), stop)

    assert ids_in(broker, TIER) == ["id-0"]
    assert ledger.calls == {"id-0": 2, "id-1": 1}
    assert states(broker) == {0: (ACCEPTED, 2), 1: (ACCEPTED, 2)}  # id-1's lock expired with id-0's
    assert ledger.of(Event.RECORD_ABANDONED)[0]["offset"] == 0


def test_exactly_once_with_a_share_consumer_is_refused_naming_the_field() -> None:
    """`exactly_once=True` with `consumer="share"` fails when the app is built, naming `exactly_once`; so does
    a share loop given exactly-once settings, and an unknown consumer model names `consumer`."""
    kafka = KafkaConfig(bootstrap="127.0.0.1:9")
    with pytest.raises(ConfigError) as refused:
        RetryApp(kafka=kafka, group="billing", exactly_once=True, consumer="share")
    assert refused.value.field == "exactly_once"
    with pytest.raises(ConfigError) as unknown:
        RetryApp(kafka=kafka, group="billing", consumer="queue")
    assert unknown.value.field == "consumer"
    broker = configured()
    with pytest.raises(ConfigError) as loop_refused:
        share_loop(broker, Ledger(broker, set()), threading.Event(), exactly_once=True)
    assert loop_refused.value.field == "exactly_once"


def test_a_whole_app_with_a_share_consumer_on_the_memory_broker() -> None:
    """`RetryApp(consumer="share")` on `MemoryClientFactory`: `provision()` starts the group at the earliest
    record, the main consumer is a share-group member named as the app's group, every record is accepted
    once and a failure reaches its tier through the partition-based tier consumer's topic."""
    broker = MemoryBroker()
    broker.create_topic("orders")
    fill(broker, ["id-0", "id-1", "id-2"])
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group=GROUP, clients=MemoryClientFactory(broker), consumer="share"
    )
    calls: list[bytes] = []

    @app.handler("orders", policy=CTX.policy)
    def handle(record: Record[bytes]) -> None:
        calls.append(record.value)
        if record.value == b"id-1":
            raise RuntimeError("down")

    app.provision()
    app.start(main=True)
    try:
        eventually(lambda: len(broker.records(TIER)) == 1 and len(states(broker)) == 3)
        eventually(lambda: all(s is ACCEPTED for s, _ in states(broker).values()))
    finally:
        assert app.stop(10)
    assert app.error is None
    assert sorted(calls) == [b"id-0", b"id-1", b"id-2"]
    assert app.stats.acknowledged.get("accepted") == 3


def test_redelivered_records_alternate_direction_after_the_fresh_ones() -> None:
    """The handling order: first deliveries as acquired, then redeliveries by offset, reversed when their
    delivery count is even, so a record behind a crashing one in one delivery is ahead of it in the next."""
    broker = configured()
    fill(broker, ["a", "b", "c", "d"])
    fresh, *_ = broker.records("orders")
    batch = [m._replace(delivery_count=c) for m, c in zip(broker.records("orders"), [2, 1, 2, 2], strict=True)]
    assert [m.offset for m in handling_order(batch)] == [1, 3, 2, 0]
    odd = [m._replace(delivery_count=3) for m in broker.records("orders")]
    assert [m.offset for m in handling_order(odd)] == [0, 1, 2, 3]
    assert fresh.delivery_count is None and handling_order([fresh]) == [fresh]


def test_a_record_whose_accept_was_lost_after_its_hand_off_is_not_handled_again() -> None:
    """`id-0` fails and its tier record is acknowledged, but its lock expires before the ACCEPT reaches the
    group (the broker refuses it): the record comes back (delivery 2) and is ACCEPTed as a duplicate, with
    no second handler call and no second tier record."""
    broker = configured(lock_ms=1000)
    fill(broker, ["id-0"])
    ledger = Ledger(broker, failing={"id-0"})

    class LateAccept:
        """Lets the lock expire between the failure and its acknowledgement (a slow commit)."""

        def on_event(self, event: Event, data: Any) -> None:
            if event is Event.RECORD_FAILED:
                broker.clock.advance(1.5)

    stop = StopWhen(lambda: states(broker) == {0: (ACCEPTED, 2)})
    run_until(share_loop(broker, ledger, stop, hooks=(LateAccept(),)), stop)

    assert ledger.calls == {"id-0": 1}
    assert ids_in(broker, TIER) == ["id-0"]
    [duplicate] = ledger.of(Event.DUPLICATE_SUPPRESSED)
    assert (duplicate["offset"], duplicate["origin_message_id"]) == (0, "orders-0-0")
    assert len(ledger.of(Event.ACKNOWLEDGEMENT_FAILED)) == 1


def test_after_a_call_past_the_lock_no_batch_handler_is_called_on_the_batch() -> None:
    """One poll holds `bulk` records (a batch handler: deferred to the batch's end) and then `id-0` (a
    handler). The call on `id-0` outlives the lock, so every record of the poll may be another member's now: the
    batch handler is not called on the `bulk` records in that batch; they are released and handled, once
    each, when they come back (delivery 2)."""
    broker = configured(lock_ms=1000)
    bulk_ctx = RouteContext(policy=CTX.policy, topics=topics_for("bulk", GROUP, CTX.policy.tier_delays_ms), group=GROUP)
    broker.create_topics(["bulk", bulk_ctx.topics.tiers[0].topic, bulk_ctx.topics.dlq], 1)
    fill(broker, ["id-0"])
    for record_id in ("b-0", "b-1"):
        broker.append("bulk", record_id.encode(), key=b"k", partition=0)
    ledger = Ledger(broker, failing=set())
    ledger.on_call = lambda record_id: broker.clock.advance(2.0) if ledger.calls == {"id-0": 1} else None
    bulk_calls: list[dict[str, int]] = []  # per call: each record's delivery count when it was called on

    def handle_bulk(records: list[Record[bytes]]) -> None:
        held = broker.share_state(GROUP, "bulk")
        bulk_calls.append({r.value.decode(): held[(0, r.offset)][1] for r in records})

    bindings = {
        "orders": Binding(
            topic="orders", handler=ledger.handle, policy=CTX.policy, ctx=CTX, value_deserializer=json_or_bytes
        ),
        "bulk": Binding(
            topic="bulk",
            handler=handle_bulk,
            policy=CTX.policy,
            ctx=bulk_ctx,
            value_deserializer=json_or_bytes,
            batch=True,
        ),
    }
    member = broker.share_consumer(GROUP, supports_renew=False)

    def settled() -> bool:
        both = [*states(broker).values(), *broker.share_state(GROUP, "bulk").values()]
        return len(both) == 3 and all(s is ACCEPTED for s, _ in both)

    stop = StopWhen(settled)
    loop = ShareConsumerLoop(
        LoopSettings(name="orders", group_id=GROUP, topics=("bulk", "orders"), max_wait_ms=100),
        bindings,
        consumer_factory=lambda: member,
        producer_factory=broker.producer,
        group_config=lambda: broker.share_group_config(GROUP),
        emitter=Emitter([ledger]),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )
    run_until(loop, stop)

    assert ledger.calls == {"id-0": 2}
    assert bulk_calls == [{"b-0": 2, "b-1": 2}]  # never on the first delivery, whose locks had expired
    assert {o: s for (_p, o), s in broker.share_state(GROUP, "bulk").items()} == {0: (ACCEPTED, 2), 1: (ACCEPTED, 2)}
    assert states(broker) == {0: (ACCEPTED, 2)}


class _SlowReturn:
    """A share consumer whose poll acquires its records and returns `after_s` later (a client's fetch that
    came in early in the poll): the records' locks run from the acquisition, not from the return."""

    def __init__(self, inner: MemoryShareConsumer, broker: MemoryBroker, after_s: float) -> None:
        self._inner, self._broker, self._after_s = inner, broker, after_s

    def poll(self, timeout_s: float) -> list[Any]:
        batch = self._inner.poll(timeout_s)
        if batch:
            self._broker.clock.advance(self._after_s)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_the_lock_is_counted_from_the_poll_that_acquired_the_records_not_from_its_return() -> None:
    """The records are acquired early in a poll that returns 0.8 s later; the handler call on `id-0` then takes
    0.5 s and fails: 1.3 s after the acquisition, past the 1 s lock, so the record may be another member's and
    its failure is not handed off then; it is released, comes back, and is handed off on its second delivery.
    (Counted from the poll's return, the call looked 0.5 s old and its failure was handed off at once.)"""
    broker = configured(lock_ms=1000)
    fill(broker, ["id-0"])
    ledger = Ledger(broker, failing={"id-0"})
    ledger.on_call = lambda record_id: broker.clock.advance(0.5) if ledger.calls == {"id-0": 1} else None
    member = _SlowReturn(broker.share_consumer(GROUP, supports_renew=False), broker, 0.8)
    stop = StopWhen(lambda: len(broker.records(TIER)) == 1 and all(s is ACCEPTED for s, _ in states(broker).values()))
    run_until(share_loop(broker, ledger, stop, consumer=member), stop)  # type: ignore[arg-type]

    assert ids_in(broker, TIER) == ["id-0"]
    assert ledger.calls == {"id-0": 2}
    assert states(broker) == {0: (ACCEPTED, 2)}
    assert ledger.of(Event.RECORD_ABANDONED)[0]["offset"] == 0


def test_a_batch_handler_gets_a_partitions_redelivered_records_in_offset_order() -> None:
    """Three records are acquired by a member that dies (SIGKILL: nothing acknowledged); a fourth arrives. The
    next member gets the three again (delivery 2) with the new one (delivery 1): its batch handler is called on
    them in offset order, whatever their delivery counts (the single-record handling order, fresh first and
    redeliveries reversed on even counts, is for handlers that take one record)."""
    broker = configured(lock_ms=1000)
    fill(broker, ["b-0", "b-1", "b-2"])
    dead = broker.share_consumer(GROUP, supports_renew=False)
    dead.subscribe(["orders"])
    assert len(dead.poll(0.1)) == 3
    dead.kill()
    broker.clock.advance(2.0)  # the dead member's locks expire
    fill(broker, ["b-3"])
    calls: list[list[int]] = []

    def handle_batch(records: list[Record[bytes]]) -> None:
        calls.append([r.offset for r in records])

    binding = Binding(
        topic="orders", handler=handle_batch, policy=CTX.policy, ctx=CTX, value_deserializer=json_or_bytes, batch=True
    )
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(lambda: len(states(broker)) == 4 and all(s is ACCEPTED for s, _ in states(broker).values()))
    run_until(share_loop(broker, ledger, stop, binding=binding), stop)

    assert calls == [[0, 1, 2, 3]]
    assert states(broker) == {0: (ACCEPTED, 2), 1: (ACCEPTED, 2), 2: (ACCEPTED, 2), 3: (ACCEPTED, 1)}
