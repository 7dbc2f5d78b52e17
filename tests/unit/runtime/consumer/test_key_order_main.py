"""Key order on the main consumer (runtime/keyorder/ordering.py, runtime/handoff/ordered.py), on the in-memory
broker, with the tier's side written by hand (its passages in the key-state topic), so that what the main
consumer does is seen alone.

Guarantees, asserted on topic contents, decoded follower headers, key-state records and committed offsets:

- a record whose key has an earlier record in a tier is never handled by the main consumer: it follows that
  record into the tier, unhandled, its key, value and user headers byte for byte; other keys and null keys are
  handled at once;
- a source offset is committed only once its hop and its chain record are acknowledged (write before commit);
- a passage that settles the chain's frontier closes the chain (a tombstone), and the key's next record is
  handled on the main consumer;
- a new owner rebuilds the blocked keys from the key-state topic before it handles anything;
- a batch handler's record parked in its place in a call that is dropped uncalled is read again with the call's
  records, parked once, and follows its key's head once;
- past `PARKED_PER_PARTITION` records parked behind unacknowledged hops the partition stops (blocking, counted
  and logged once), and nothing is lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from retrytopics import BatchFailed
from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import DlqReason, decode
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.keyorder.follower import decode_follower
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import Chain, Fate, Passage, decode_record, encode_record
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.keyorder.key_state import KeyStateReader
from retrytopics.runtime.keyorder.ordering import PARKED_PER_PARTITION
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..kit import CTX, DLQ, GROUP, TIER, StopWhen, run

STATE = CTX.topics.key_state_topic


class KeyLedger:
    """Every handler call, as (key, source offset), and the loop's events."""

    def __init__(self, failing: set[int]) -> None:
        self.failing = failing
        self.calls: list[tuple[bytes | None, int]] = []
        self.seen: list[tuple[Event, dict[str, Any]]] = []

    def handle(self, record: Record[bytes]) -> None:
        self.calls.append((record.key, record.offset))
        if record.offset in self.failing:
            raise RuntimeError(f"{record.offset} fails")

    def handle_batch(self, records: list[Record[bytes]]) -> None:
        """A batch handler's call: `handle` for each record, the failed ones named in a `BatchFailed`."""
        failed: list[tuple[Record[bytes], BaseException]] = []
        for record in records:
            try:
                self.handle(record)
            except RuntimeError as exc:
                failed.append((record, exc))
        if failed:
            raise BatchFailed(failed)

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append((event, dict(data)))


def ordered_broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topics(["orders", TIER, DLQ, STATE], 1)
    return broker


def ordered_loop(
    broker: MemoryBroker,
    ledger: KeyLedger,
    stop: threading.Event,
    read: KeyStateReader | None = None,
    batch_size: int = 10,
    batch: bool = False,
    **ordering: Any,
) -> ConsumerLoop:
    clients = MemoryClientFactory(broker, clock=broker.clock)
    binding = Binding(
        topic="orders",
        handler=ledger.handle_batch if batch else ledger.handle,
        policy=CTX.policy,
        ctx=CTX,
        value_deserializer=bytes_value,
        batch=batch,
        ordering=KeyOrdering(**ordering),
    )
    return ConsumerLoop(
        LoopSettings(
            name="orders", group_id=GROUP, topics=("orders",), max_wait_ms=100, commit_every=1, batch_size=batch_size
        ),
        {"orders": binding},
        clients=LoopClients(
            consumer=lambda: broker.consumer(GROUP),
            producer=lambda: broker.producer(),
            key_state_reader=read or clients.read_to_end,
            key_state_feed=clients.key_state_feed,
        ),
        emitter=Emitter([ledger]),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )


def append(broker: MemoryBroker, key: bytes | None, value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> int:
    return broker.append("orders", value, key=key, partition=0, headers=headers).offset


def settled_in_tier(broker: MemoryBroker, key: bytes, offset: int) -> None:
    """What tier 0's consumer writes once the record at source `offset` of `key` succeeded there."""
    passage = Passage(tier=0, chain=ChainKey("orders", 0, key_id(key)), seen=offset, fate=Fate.SUCCEEDED)
    record_key, value, partition = encode_record(passage)
    broker.append(STATE, value, key=record_key, partition=partition)


def state(broker: MemoryBroker) -> dict[bytes, Any]:
    """The key-state topic as compaction would keep it: record key -> its latest record (None: a tombstone)."""
    latest: dict[bytes, Any] = {}
    for msg in broker.records(STATE):
        assert msg.key is not None
        latest[msg.key] = None if msg.value is None else decode_record(msg.key, msg.value)
    return latest


def committed(broker: MemoryBroker, end: int) -> Callable[[], bool]:
    return lambda: broker.committed(GROUP).get(("orders", 0)) == end


def test_a_blocked_keys_records_follow_its_head_into_the_tier_unhandled_and_other_keys_run() -> None:
    """Key a's first record fails: a's later records are handed off behind it, never handled here, with the
    follower headers naming what they wait behind; b and null keys are handled; every offset is committed, each
    after its chain record is durable."""
    broker = ordered_broker()
    a1 = append(broker, b"a", b"a1")
    a2 = append(broker, b"a", b"a2", headers=(("trace", b"\x00\xff"),))
    b1 = append(broker, b"b", b"b1")
    n1 = append(broker, None, b"n1")
    a3 = append(broker, b"a", b"a3")
    ledger = KeyLedger(failing={a1})
    stop = StopWhen(committed(broker, a3 + 1))
    run(ordered_loop(broker, ledger, stop), stop)

    assert ledger.calls == [(b"a", a1), (b"b", b1), (None, n1)]
    in_tier = broker.records(TIER)
    assert [m.value for m in in_tier] == [b"a1", b"a2", b"a3"]
    followers = [decode_follower(list(m.headers)) for m in in_tier]
    assert followers[0] is None  # the head is a retried record
    assert [(f.original_offset, f.after) for f in followers[1:] if f is not None] == [(a2, a1), (a3, a2)]
    assert in_tier[1].key == b"a" and ("trace", b"\x00\xff") in in_tier[1].headers
    chain = state(broker)[
        encode_record(
            Chain(chain=ChainKey("orders", 0, key_id(b"a")), head=0, frontier=0, at_tier=0, followers=0, since_ms=0)
        )[0]
    ]
    assert isinstance(chain, Chain) and (chain.head, chain.frontier, chain.at_tier, chain.followers) == (a1, a3, 0, 2)
    # write before commit: no commit covers a follower before its chain record was written
    journal = broker.journal
    written = [i for i, e in enumerate(journal) if e[0] == "delivered" and e[1] == STATE]
    covering = next(i for i, e in enumerate(journal) if e[0] == "committed" and e[2:4] == ("orders", 0) and e[4] > a3)
    assert len(written) == 3 and written[-1] < covering


def test_a_settled_frontier_closes_the_chain_and_the_keys_next_record_is_handled_here() -> None:
    """Once the tier settles the chain's last record, the main consumer writes the chain's tombstone and
    handles the key's next record itself."""
    broker = ordered_broker()
    a1 = append(broker, b"a", b"a1")
    a2 = append(broker, b"a", b"a2")
    ledger = KeyLedger(failing={a1})
    phase = {"settled": False}

    def done() -> bool:
        if not phase["settled"] and broker.committed(GROUP).get(("orders", 0)) == a2 + 1:
            phase["settled"] = True
            settled_in_tier(broker, b"a", a2)
            phase["a3"] = append(broker, b"a", b"a3")
        return "a3" in phase and broker.committed(GROUP).get(("orders", 0)) == phase["a3"] + 1

    stop = StopWhen(done)
    run(ordered_loop(broker, ledger, stop), stop)

    assert ledger.calls == [(b"a", a1), (b"a", phase["a3"])]
    assert [m.value for m in broker.records(TIER)] == [b"a1", b"a2"]
    chain_key = encode_record(
        Chain(chain=ChainKey("orders", 0, key_id(b"a")), head=0, frontier=0, at_tier=0, followers=0, since_ms=0)
    )[0]
    assert state(broker)[chain_key] is None  # closed: a tombstone
    assert [d["blocked_keys"] for e, d in ledger.seen if e is Event.KEY_ORDER_RELEASED] == [0]


def test_a_new_owner_knows_the_blocked_keys_before_it_handles_anything() -> None:
    """A consumer that stops with key a blocked, and a new one started after it: the new one hands a's next
    record off behind the same head, and handles other keys."""
    broker = ordered_broker()
    a1 = append(broker, b"a", b"a1")
    first = KeyLedger(failing={a1})
    stop = StopWhen(committed(broker, a1 + 1))
    run(ordered_loop(broker, first, stop), stop)

    a2 = append(broker, b"a", b"a2")
    b1 = append(broker, b"b", b"b1")
    second = KeyLedger(failing=set())
    stop = StopWhen(committed(broker, b1 + 1))
    run(ordered_loop(broker, second, stop), stop)

    assert second.calls == [(b"b", b1)]
    follower = decode_follower(list(broker.records(TIER)[-1].headers))
    assert follower is not None and (follower.original_offset, follower.after) == (a2, a1)


def test_a_partition_whose_key_state_cannot_be_read_is_not_started_until_it_is(caplog: Any) -> None:
    """The read at assignment fails twice: the partition is held (nothing handled, the loop unhealthy, one ERROR
    line), read again, and once read the blocked key's record follows its head instead of being handled."""
    broker = ordered_broker()
    a1 = append(broker, b"a", b"a1")
    first = KeyLedger(failing={a1})
    stop = StopWhen(committed(broker, a1 + 1))
    run(ordered_loop(broker, first, stop), stop)

    a2 = append(broker, b"a", b"a2")
    clients = MemoryClientFactory(broker, clock=broker.clock)
    refusals = [KafkaClientError("key-state read timed out", code="TIMED_OUT")] * 2
    health: list[bool] = []

    def flaky(topic: str, partitions: Any, timeout_s: float) -> list[Any]:
        if refusals:
            raise refusals.pop()
        return clients.read_to_end(topic, partitions, timeout_s)

    second = KeyLedger(failing=set())
    stop = StopWhen(
        lambda: health.append(loop.healthy) is None and broker.committed(GROUP).get(("orders", 0)) == a2 + 1
    )
    loop = ordered_loop(broker, second, stop, read=flaky)
    run(loop, stop)

    assert not refusals and second.calls == []
    assert False in health, "unhealthy while the partition was not started"
    assert [r.levelname for r in caplog.records if "not started" in r.getMessage()] == ["ERROR"]
    follower = decode_follower(list(broker.records(TIER)[-1].headers))
    assert follower is not None and (follower.original_offset, follower.after) == (a2, a1)


def test_a_record_waiting_for_its_keys_acknowledgement_is_parked_and_its_partition_goes_on() -> None:
    """Key a's second record arrives while the hop of its first is unacknowledged: it waits in memory
    (parked) while b's records behind it are handled at once, before that acknowledgement; then a's records
    follow a's first into the tier, in a's order; no commit passes a's second record before its hop and chain
    record are durable."""
    broker = ordered_broker()
    a1 = append(broker, b"a", b"a1")
    a2 = append(broker, b"a", b"a2")
    b1 = append(broker, b"b", b"b1")
    a3 = append(broker, b"a", b"a3")
    b2 = append(broker, b"b", b"b2")
    ledger = KeyLedger(failing={a1})
    in_tier_at_call: dict[int, int] = {}
    handle = ledger.handle

    def handle_and_look(record: Record[bytes]) -> None:
        in_tier_at_call[record.offset] = len(broker.records(TIER))
        handle(record)

    ledger.handle = handle_and_look  # type: ignore[method-assign]
    stop = StopWhen(committed(broker, b2 + 1))
    run(ordered_loop(broker, ledger, stop), stop)

    assert ledger.calls == [(b"a", a1), (b"b", b1), (b"b", b2)]
    # b ran before a1's hop was even acknowledged: nothing waited for it but a's records
    assert in_tier_at_call == {a1: 0, b1: 0, b2: 0}, "b's records waited behind a2's stop"
    in_tier = broker.records(TIER)
    assert [m.value for m in in_tier] == [b"a1", b"a2", b"a3"]
    followers = [decode_follower(list(m.headers)) for m in in_tier[1:]]
    assert [(f.original_offset, f.after) for f in followers if f is not None] == [(a2, a1), (a3, a2)]
    journal = broker.journal
    a2_chain = [i for i, e in enumerate(journal) if e[0] == "delivered" and e[1] == STATE][1]
    commits = [(i, e[4]) for i, e in enumerate(journal) if e[0] == "committed" and e[2:4] == ("orders", 0)]
    assert all(i > a2_chain for i, position in commits if position > a2), "a commit passed a2 before it was durable"
    assert commits[-1][1] == b2 + 1


def test_a_follower_refused_as_too_large_goes_to_the_dlq_unhandled_and_the_next_waits_behind_the_same_head() -> None:
    """Key a's head is in the tier; its next record is too large for the tier (the broker refuses it, alone
    too): it is dead-lettered unhandled as `blocked_by_key`, its message naming the refusal, instead of being
    produced again for ever; a's record after it follows behind the same head; every record is accounted for
    (handled, in the tier, or in the DLQ) and every offset committed."""
    broker = ordered_broker()
    broker.max_message_bytes[TIER] = 16_000
    a1 = append(broker, b"a", b"a1")
    a2 = append(broker, b"a", b"x" * 32_000, headers=(("trace", b"t-2"),))
    a3 = append(broker, b"a", b"a3")
    b1 = append(broker, b"b", b"b1")
    ledger = KeyLedger(failing={a1})
    stop = StopWhen(committed(broker, b1 + 1))
    run(ordered_loop(broker, ledger, stop), stop)

    assert ledger.calls == [(b"a", a1), (b"b", b1)]
    in_tier = broker.records(TIER)
    assert [m.value for m in in_tier] == [b"a1", b"a3"]
    follower = decode_follower(list(in_tier[1].headers))
    assert follower is not None and (follower.original_offset, follower.after) == (a3, a1)
    [dead] = broker.records(DLQ)
    state_of_dead = decode(list(dead.headers))
    assert (dead.key, dead.value, dead.headers[0]) == (b"a", b"x" * 32_000, ("trace", b"t-2"))
    assert (state_of_dead.dlq_reason, state_of_dead.original_offset, state_of_dead.reconsume_times) == (
        DlqReason.BLOCKED_BY_KEY,
        a2,
        0,
    )
    assert state_of_dead.exception_message == f"behind orders-0-{a1} (its hop to {TIER} was refused as too large)"
    chain_key = encode_record(
        Chain(chain=ChainKey("orders", 0, key_id(b"a")), head=0, frontier=0, at_tier=0, followers=0, since_ms=0)
    )[0]
    chain = state(broker)[chain_key]
    assert isinstance(chain, Chain) and (chain.head, chain.frontier, chain.followers) == (a1, a3, 1)
    assert [d["offset"] for e, d in ledger.seen if e is Event.DLQ_DISPATCHED] == [a2]


def test_a_follower_too_large_for_the_dlq_as_well_is_dead_lettered_as_a_reference() -> None:
    """The DLQ refuses the too-large follower too: it is dead-lettered once more as a reference to the consumed
    record (its value replaced, no user headers), still `blocked_by_key`, and its offset committed."""
    broker = ordered_broker()
    broker.max_message_bytes[TIER] = broker.max_message_bytes[DLQ] = 16_000
    a1 = append(broker, b"a", b"a1")
    a2 = append(broker, b"a", b"x" * 32_000, headers=(("trace", b"t-2"),))
    ledger = KeyLedger(failing={a1})
    stop = StopWhen(committed(broker, a2 + 1))
    run(ordered_loop(broker, ledger, stop), stop)

    [dead] = broker.records(DLQ)
    assert dead.key == b"a" and json.loads(dead.value or b"") == {
        "too_large": True,
        "topic": "orders",
        "partition": 0,
        "offset": a2,
        "value_bytes": 32_000,
    }
    assert all(k.startswith("retry.") for k, _ in dead.headers)
    headers = decode(list(dead.headers))
    assert (headers.dlq_reason, headers.original_offset) == (DlqReason.BLOCKED_BY_KEY, a2)
    assert "so was its dead letter" in headers.exception_message


def test_past_the_bound_of_parked_records_the_partition_stops_counted_and_logged_and_nothing_is_lost(
    caplog: Any,
) -> None:
    """One poll: a's first record fails, its hop acknowledged only a poll later, so a's next
    `PARKED_PER_PARTITION` records are parked; b's record behind them is handled at once (the partition goes
    on). a's next record finds the bound reached: the partition stops there (one WARNING line, one
    `key_order.bound_reached` event with `bound="parked"`), so b's record behind it waits until a's parked
    records move on (a follower of a is in the tier by then). In the end every record of a is in the tier in
    source order, each follower behind the one before, b's are handled once each, and the partition is
    committed to its end."""
    broker = ordered_broker()
    broker.ack_after_polls = 1  # a hop is acknowledged a poll after it is produced
    a_offsets = [append(broker, b"a", b"a0")]
    a_offsets += [append(broker, b"a", f"a{i}".encode()) for i in range(1, PARKED_PER_PARTITION + 1)]
    b0 = append(broker, b"b", b"b0")
    a_offsets.append(append(broker, b"a", b"past-the-bound"))
    b1 = append(broker, b"b", b"b1")
    ledger = KeyLedger(failing={a_offsets[0]})
    in_tier_at_call: dict[int, int] = {}
    handle = ledger.handle

    def handle_and_look(record: Record[bytes]) -> None:
        in_tier_at_call[record.offset] = len(broker.records(TIER))
        handle(record)

    ledger.handle = handle_and_look  # type: ignore[method-assign]
    stop = StopWhen(committed(broker, b1 + 1))
    with caplog.at_level("WARNING", logger="retrytopics.runtime"):
        run(ordered_loop(broker, ledger, stop, batch_size=2 * PARKED_PER_PARTITION), stop)

    assert ledger.calls == [(b"a", a_offsets[0]), (b"b", b0), (b"b", b1)]
    assert in_tier_at_call[b0] == 0, "b0 was handled while a's records were parked"
    assert in_tier_at_call[b1] >= 2, "b1 was handled before any of a's parked records moved on"
    reached = [data for event, data in ledger.seen if event is Event.KEY_ORDER_BOUND_REACHED]
    assert reached == [{"consumer": "orders", "topic": "orders", "partition": 0, "bound": "parked"}]
    warnings = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
    assert len(warnings) == 1 and f"{PARKED_PER_PARTITION} records parked" in warnings[0]
    in_tier = broker.records(TIER)
    assert [m.value for m in in_tier] == [b"a0"] + [f"a{i}".encode() for i in range(1, 1001)] + [b"past-the-bound"]
    followers = [decode_follower(list(m.headers)) for m in in_tier[1:]]
    assert [(f.original_offset, f.after) for f in followers if f is not None] == list(
        zip(a_offsets[1:], a_offsets[:-1], strict=True)
    )
    assert not broker.records(DLQ)


def test_a_record_parked_in_a_dropped_batch_call_is_read_again_and_follows_once(monkeypatch: Any) -> None:
    """A key-ordered batch handler: a's first record fails and its hop is acknowledged two polls late; the next
    poll holds b's record, a's second and c's, so a2 is parked in its place in the call of b and c. That call
    ends with the ownership in doubt (the consumer may have lost the partition, and still owns it): it is
    dropped and read again from b's record, a2 included. a2 is then parked once, not twice: it follows a1 into
    the tier once, behind it; b and c are handled (again), nothing is dead-lettered, and the partition is
    committed to its end."""
    broker = ordered_broker()
    broker.ack_after_polls = 2
    a1 = append(broker, b"a", b"a1")
    ledger = KeyLedger(failing={a1})
    later: list[int] = []
    handle = ledger.handle

    def handle_then_write(record: Record[bytes]) -> None:
        if not later:  # the next poll's records, written during a1's call
            later.extend(append(broker, key, key + b"-" + str(i).encode()) for i, key in enumerate([b"b", b"a", b"c"]))
        handle(record)

    ledger.handle = handle_then_write  # type: ignore[method-assign]
    lost, in_doubt = OwnershipGuard.lost_ownership, [True]

    def lost_once(guard: OwnershipGuard, msg: Message) -> bool:
        """The first call of b's record ends in doubt; everything else is asked as usual."""
        if in_doubt and later and msg.offset == later[0]:
            in_doubt.clear()
            return True
        return lost(guard, msg)

    monkeypatch.setattr(OwnershipGuard, "lost_ownership", lost_once)
    stop = StopWhen(committed(broker, a1 + 4))
    run(ordered_loop(broker, ledger, stop, batch=True), stop)

    b, a2, c = later
    assert ledger.calls == [(b"a", a1), (b"b", b), (b"c", c), (b"b", b), (b"c", c)]
    in_tier = broker.records(TIER)
    assert [m.value for m in in_tier] == [b"a1", b"a-1"]
    follower = decode_follower(list(in_tier[1].headers))
    assert follower is not None and (follower.original_offset, follower.after) == (a2, a1)
    assert not broker.records(DLQ)
