"""The consumer loop's own logic, on the in-memory broker (`retrytopics/memory.py`; issue 13).

Guarantees, each asserted on topic contents, decoded retry headers, committed offsets and a per-id ledger:

- at-least-once: a failure is republished to its tier, and its source offset is committed only after the
  broker acknowledged the hand-off; a failing republish holds its partition and nothing is committed past
  the record until a later produce succeeds (a too-large one goes to the DLQ instead);
- a rebalance mid-way commits what is finished, and the new owner reads the rest: every id is handled once;
- a lost partition commits nothing; its records are read again by the new membership;
- exactly-once: an aborted transaction leaves no visible hand-off, and its records are handled again;
- a tier record not yet due pauses its partition and is handled once due, not before.

The broker's clock is the loop's (`loop.time` is monkeypatched, as in test_loop.py): a consume that finds
nothing advances it by its timeout, so waits cost no real time. What Kafka does is proven on Apache Kafka
(`tests/integration/runtime/`), and this broker's behaviour by the contract test there.
"""

from __future__ import annotations

import functools
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import tenacity

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.headers import DlqReason, RetryHeaders, decode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.core.router import InboundRecord, RouteContext, route
from retrytopics.memory import MemoryBroker, MemoryConsumer
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.handoff import at_least_once
from retrytopics.runtime.handoff.publish import Publisher
from retrytopics.runtime.records.calls import Binding

POLICY = RetryPolicy(delays=["5s"])
GROUP = "billing"
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", GROUP, POLICY.tier_delays_ms), group=GROUP)
TIER = CTX.topics.tiers[0].topic
DLQ = CTX.topics.dlq

#: iterations of the loop (stop checks) after which a test gives up: a bound, never reached when all is well
MAX_CHECKS = 20_000


class StopWhen(threading.Event):
    """The loop's stop event, set once `done()` holds (or after MAX_CHECKS checks: `gave_up`)."""

    def __init__(self, done: Callable[[], bool]) -> None:
        super().__init__()
        self.done = done
        self.checks = 0
        self.gave_up = False

    def is_set(self) -> bool:
        if super().is_set():
            return True
        self.checks += 1
        if self.done() or self.checks > MAX_CHECKS:
            self.gave_up = self.checks > MAX_CHECKS
            self.set()
        return super().is_set()


class Ledger:
    """What happened to each id: handler calls, and the events the loop emitted."""

    def __init__(self, broker: MemoryBroker, failing: set[str]) -> None:
        self.broker = broker
        self.failing = failing
        self.calls: Counter[str] = Counter()
        self.called_at: dict[str, list[int]] = {}
        self.seen: list[tuple[Event, dict[str, Any]]] = []
        self.on_call: Callable[[str], None] = lambda _id: None

    def handle(self, record: Record[bytes]) -> None:
        record_id = record.value.decode()
        self.calls[record_id] += 1
        self.called_at.setdefault(record_id, []).append(self.broker.clock.now_ms())
        self.on_call(record_id)
        if record_id in self.failing:
            raise RuntimeError(f"{record_id} fails")

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append((event, dict(data)))

    def of(self, event: Event) -> list[dict[str, Any]]:
        return [d for e, d in self.seen if e is event]


def new_broker(partitions: int = 1) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topics(["orders", TIER, DLQ], partitions)
    return broker


def fill(broker: MemoryBroker, ids_by_partition: dict[int, list[str]]) -> None:
    for partition, ids in ids_by_partition.items():
        for record_id in ids:
            broker.append("orders", record_id.encode(), key=b"k", partition=partition)


def hand_offs(broker: MemoryBroker, topic: str) -> list[tuple[str, RetryHeaders]]:
    """(id, decoded retry headers) of every record a read_committed reader finds in `topic`."""
    return [(m.value.decode(), decode(list(m.headers))) for m in broker.records(topic)]


def use_broker_clock(monkeypatch: pytest.MonkeyPatch, broker: MemoryBroker) -> None:
    """The publisher's retry back-off is short and fixed (the loop reads the broker's clock: `build_loop`)."""
    monkeypatch.setattr(at_least_once, "Publisher", functools.partial(Publisher, wait=tenacity.wait_fixed(0.5)))


def build_loop(
    broker: MemoryBroker,
    ledger: Ledger,
    stop: threading.Event,
    *,
    topic: str = "orders",
    consumer: MemoryConsumer | None = None,
    **settings: Any,
) -> ConsumerLoop:
    consumer = consumer or broker.consumer(GROUP if topic == "orders" else topic)
    binding = Binding(topic="orders", handler=ledger.handle, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    exactly_once = settings.get("exactly_once", False)
    defaults: dict[str, Any] = {"max_wait_ms": 100, "commit_every": 1, "batch_size": 3}
    return ConsumerLoop(
        LoopSettings(
            name=topic, group_id=GROUP if topic == "orders" else topic, topics=(topic,), **{**defaults, **settings}
        ),
        {topic: binding},
        consumer_factory=lambda: consumer,
        producer_factory=lambda: broker.producer(transactional_id=f"{topic}-1" if exactly_once else None),
        emitter=Emitter([ledger]),
        stop=stop,
        audit=DuplicateAudit(100),
        clock=broker.clock,
    )


def committed_all(broker: MemoryBroker, group: str, ends: dict[int, int], topic: str = "orders") -> Callable[[], bool]:
    return lambda: broker.committed(group) == {(topic, p): end for p, end in ends.items()}


def run(loop: ConsumerLoop, stop: StopWhen) -> None:
    loop.run()
    assert loop.crash is None
    assert not stop.gave_up, "the loop never reached the expected end state"


def first_commit_past(broker: MemoryBroker, topic: str, partition: int, offset: int) -> int:
    """Index in the broker's journal of the first commit that covers `offset` of the partition."""
    return next(
        i
        for i, e in enumerate(broker.journal)
        if e[0] == "committed" and e[2:4] == (topic, partition) and e[4] > offset
    )


def delivered_at(broker: MemoryBroker, topic: str, partition: int, offset: int) -> int:
    return broker.journal.index(("delivered", topic, partition, offset))


# -- at-least-once -----------------------------------------------------------------------------------------


def test_a_failure_is_handed_off_to_its_tier_and_committed_only_after_the_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: six records, two of which fail; the broker acknowledges a republish only three polls later
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    broker.ack_after_polls = 3
    ledger = Ledger(broker, failing={"id-1", "id-4"})
    use_broker_clock(monkeypatch, broker)
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: each id handled once; the failures are on the tier with their origin in the headers
    assert ledger.calls == Counter(ids)
    tier = hand_offs(broker, TIER)
    assert [(i, h.original_topic, h.original_offset, h.reconsume_times, h.tier) for i, h in tier] == [
        ("id-1", "orders", 1, 1, 0),
        ("id-4", "orders", 4, 1, 0),
    ]
    assert all(h.due_at is not None and h.due_at >= h.last_failed_at + 5000 for _, h in tier)
    # and: the commit covering each failed offset came after the ack of its hand-off
    for tier_offset, (_, headers) in enumerate(tier):
        acked = delivered_at(broker, TIER, 0, tier_offset)
        assert first_commit_past(broker, "orders", 0, headers.original_offset) > acked
    assert [d["offset"] for d in ledger.of(Event.RETRY_SCHEDULED)] == [1, 4]


@pytest.mark.parametrize("code", ["NOT_ENOUGH_REPLICAS", "_MSG_TIMED_OUT"])
def test_a_failing_republish_holds_its_partition_and_nothing_is_committed_past_it_until_it_succeeds(
    code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOT_ENOUGH_REPLICAS is retried on the same producer; _MSG_TIMED_OUT replaces the producer first."""
    # setup: id-2 fails, and its first three republishes are refused
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    broker.fail_produces(3, code, retriable=code == "NOT_ENOUGH_REPLICAS", topic=TIER)
    ledger = Ledger(broker, failing={"id-2"})
    use_broker_clock(monkeypatch, broker)
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: the republish was attempted 4 times and landed once; every id was handled once
    assert [d["attempt"] for d in ledger.of(Event.PUBLISH_FAILED)] == [1, 2, 3]
    assert [(i, h.original_offset) for i, h in hand_offs(broker, TIER)] == [("id-2", 2)]
    assert ledger.calls == Counter(ids)
    # and: no commit went past offset 2 before its hand-off was written; the partition was held meanwhile
    commits = [e[4] for e in broker.journal[: delivered_at(broker, TIER, 0, 0)] if e[0] == "committed"]
    assert commits and max(commits) <= 2
    assert {"partition": 0, "until": None}.items() <= ledger.of(Event.PARTITION_PAUSED)[0].items()
    assert bool(ledger.of(Event.PRODUCER_RECREATED)) == (code == "_MSG_TIMED_OUT")


def test_a_republish_refused_as_too_large_goes_to_the_dlq(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: the broker refuses id-1's tier record as too large, and again when it is sent alone
    broker = new_broker()
    fill(broker, {0: ["id-0", "id-1", "id-2"]})
    broker.fail_produces(2, "MSG_SIZE_TOO_LARGE", topic=TIER)
    ledger = Ledger(broker, failing={"id-1"})
    use_broker_clock(monkeypatch, broker)
    stop = StopWhen(committed_all(broker, GROUP, {0: 3}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: nothing on the tier; the DLQ has id-1 with reason too_large and its origin
    assert hand_offs(broker, TIER) == []
    [(record_id, headers)] = hand_offs(broker, DLQ)
    assert (record_id, headers.dlq_reason, headers.original_offset) == ("id-1", DlqReason.TOO_LARGE, 1)


# -- rebalances --------------------------------------------------------------------------------------------


def test_a_rebalance_mid_way_commits_what_is_finished_and_the_new_owner_reads_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: two partitions of 8 records; every third id fails; a second member joins after the 5th call
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(8)] for p in (0, 1)}
    fill(broker, ids)
    broker.ack_after_polls = 10  # hand-offs are in flight when the rebalance comes
    failing = {f"id-{p}-{i}" for p in (0, 1) for i in range(1, 8, 3)}
    ledger = Ledger(broker, failing)
    use_broker_clock(monkeypatch, broker)
    newcomer = broker.consumer(GROUP)

    def join_after_five(_id: str) -> None:
        if sum(ledger.calls.values()) == 5:
            newcomer.subscribe(["orders"], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)

    ledger.on_call = join_after_five
    first_stop = StopWhen(lambda: broker.committed(GROUP).get(("orders", 0)) == 8)

    # when: the first member runs until its remaining partition is done, then the newcomer runs
    run(build_loop(broker, ledger, first_stop), first_stop)
    handed_over = broker.committed(GROUP)[("orders", 1)]
    second_stop = StopWhen(committed_all(broker, GROUP, {0: 8, 1: 8}))
    run(build_loop(broker, ledger, second_stop, consumer=newcomer), second_stop)

    # then: the first member revoked both partitions before keeping one; it had finished part of partition 1
    assert next(d["partitions"] for d in ledger.of(Event.PARTITIONS_REVOKED)) == [("orders", 0), ("orders", 1)]
    assert [d["partitions"] for d in ledger.of(Event.PARTITIONS_ASSIGNED)][1] == [("orders", 0)]
    assert 0 < handed_over < 8
    # and: every id was handled exactly once, every failure handed off exactly once
    assert ledger.calls == Counter(i for p in (0, 1) for i in ids[p])
    tier = Counter(i for i, _ in hand_offs(broker, TIER))
    assert tier == Counter(failing)


def test_a_lost_partition_commits_nothing_and_its_records_are_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: the group expels the member while it handles id-2 (its session lapsed, say)
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    ledger = Ledger(broker, failing=set())
    use_broker_clock(monkeypatch, broker)
    consumer = broker.consumer(GROUP)
    seen: dict[str, Any] = {}

    def expel_at_id_2(record_id: str) -> None:
        if record_id == "id-2" and "expelled" not in seen:
            consumer.expel()
            seen["expelled"] = (broker.committed(GROUP), len(broker.journal))

    ledger.on_call = expel_at_id_2
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop, consumer=consumer, batch_size=2), stop)

    # then: the batch finished by the expelled member was not committed (the commit was refused) ...
    committed_then, journal_then = seen["expelled"]
    assert committed_then == {("orders", 0): 2}
    assert consumer.refused_commits == [{("orders", 0): 4}]
    assert [d["partitions"] for d in ledger.of(Event.PARTITIONS_LOST)] == [[("orders", 0)]]
    # the next commit the group took is the new membership's, after it read id-2 and id-3 again
    assert broker.journal[journal_then:][0] == ("committed", GROUP, "orders", 0, 4)
    assert len(ledger.of(Event.PARTITIONS_ASSIGNED)) == 2
    # ... and the new membership read its records again from the committed offset: at least once
    assert ledger.calls == Counter({**Counter(ids), "id-2": 2, "id-3": 2})


# -- exactly-once ------------------------------------------------------------------------------------------


def test_an_aborted_transaction_leaves_no_visible_hand_off_and_its_records_are_handled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: id-1 and id-2 fail; the first transaction's second hand-off is refused, so it aborts
    broker = new_broker()
    ids = [f"id-{i}" for i in range(4)]
    fill(broker, {0: ids})
    ledger = Ledger(broker, failing={"id-1", "id-2"})
    use_broker_clock(monkeypatch, broker)
    broker.fail_produces(1, "NOT_ENOUGH_REPLICAS", topic=TIER)
    first_written = len(broker.journal)
    stop = StopWhen(committed_all(broker, GROUP, {0: 4}))

    # when
    run(build_loop(broker, ledger, stop, exactly_once=True, batch_size=4), stop)

    # then: the transaction aborted once; the batch was handled again and handed off in the next one
    assert len(ledger.of(Event.TRANSACTION_ABORTED)) == 1
    assert ledger.calls == Counter(dict.fromkeys(ids, 2))
    visible = hand_offs(broker, TIER)
    assert [(i, h.original_offset) for i, h in visible] == [("id-1", 1), ("id-2", 2)]
    # and: the aborted hand-off was written but no read_committed reader sees it
    everything = broker.records(TIER, read_committed=False)
    aborted = [m for m in everything if m.offset not in {v.offset for v in broker.records(TIER)}]
    assert [m.value for m in aborted] == [b"id-2"]
    tier_writes = [e for e in broker.journal[first_written:] if e[:2] == ("delivered", TIER)]
    assert tier_writes[0][3] == aborted[0].offset  # the first write to the tier is the aborted one


# -- tiers -------------------------------------------------------------------------------------------------


def tier_record(broker: MemoryBroker, offset: int, record_id: str) -> Message:
    """Route a failure of orders[0]@offset now, and append the resulting tier record."""
    now = broker.clock.now_ms()
    source = InboundRecord(topic="orders", partition=0, offset=offset, timestamp_ms=now, key=b"k", headers=())
    decision = route(CTX, source, OSError("down"), now_ms=now, rng=random.Random(0))
    return broker.append(TIER, record_id.encode(), key=b"k", headers=decision.headers, partition=0)


def test_a_tier_record_not_yet_due_pauses_its_partition_and_is_handled_once_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: two tier records failed 1 s apart; waiting happens in Kafka (paused), not in memory
    broker = new_broker()
    tier_record(broker, 0, "id-0")
    broker.clock.advance(1.0)
    tier_record(broker, 1, "id-1")
    due = {m.value.decode(): decode(list(m.headers)).due_at for m in broker.records(TIER)}
    ledger = Ledger(broker, failing=set())
    use_broker_clock(monkeypatch, broker)
    stop = StopWhen(committed_all(broker, TIER, {0: 2}, topic=TIER))

    # when
    run(build_loop(broker, ledger, stop, topic=TIER, wait_in_memory_ms=0, max_wait_ms=1000), stop)

    # then: each handled once, when due (the clock only moves in waits, so "late" is the loop's own rounding)
    assert ledger.calls == Counter({"id-0": 1, "id-1": 1})
    for record_id, (handled_at,) in ledger.called_at.items():
        assert 0 <= handled_at - due[record_id] <= 10, record_id
    # and: the partition was paused until each one was due, and resumed
    paused = [d["until"] for d in ledger.of(Event.PARTITION_PAUSED)]
    assert paused[:2] == [due["id-0"], due["id-1"]]
    assert len(ledger.of(Event.PARTITION_RESUMED)) >= 2
