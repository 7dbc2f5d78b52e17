"""The consumer loop against in-memory client fakes.

- A consumer frozen past its session (SIGSTOP, a VM pause) wakes inside `consume()`, which then returns at
  once; librdkafka delivers `partitions.lost` only some ms later. Records waiting in memory must not be acted
  on in between (issue 12.2): the loop judges the gap from before the wake and asks the coordinator first.
- A client that cannot be created stops the app with the error recorded, and a consumer that never joins its
  group (an unreachable bootstrap) makes the loop unhealthy within a bounded time (issue 16.6).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message, PartitionsCallback, TopicPartition
from retrytopics.core.record import Record
from retrytopics.core.router import InboundRecord, RouteContext, route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Binding

POLICY = RetryPolicy(delays=["1s"])
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
TIER = CTX.topics.tiers[0].topic
TP: TopicPartition = (TIER, 0)


class Clock:
    """The loop's view of time: real time plus a jump that stands for a freeze."""

    def __init__(self) -> None:
        self.jump_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.jump_s

    def time(self) -> float:
        return time.time() + self.jump_s

    def now_ms(self) -> int:
        return int(self.time() * 1000)


class FakeConsumer:
    """Plays `steps`, one per consume(); each returns a batch. Commits are refused once `expelled` is set."""

    max_poll_interval_ms = 300_000
    session_timeout_ms = 6_000

    def __init__(self, steps: list[Callable[[FakeConsumer], list[Message]]], stop: threading.Event) -> None:
        self.steps = steps
        self.stop = stop
        self.expelled = False
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.on_assign: PartitionsCallback = lambda tps: None
        self.on_lost: PartitionsCallback = lambda tps: None

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        self.on_assign, self.on_lost = on_assign, on_lost

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        if not self.steps:
            self.stop.set()
            return []
        return self.steps.pop(0)(self)

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        if self.expelled:
            raise KafkaClientError("commit refused", code="UNKNOWN_MEMBER_ID")
        self.commits.append(dict(offsets))

    def group_metadata(self) -> object:
        return None

    def close(self) -> None:
        pass


class FakeProducer:
    def __init__(self) -> None:
        self.produced: list[str] = []

    def produce(self, topic: str, *, on_delivery: Callable[[Any], None], **_: Any) -> None:
        self.produced.append(topic)
        on_delivery(None)

    def poll(self, timeout_s: float) -> None:
        pass

    def flush(self, timeout_s: float) -> int:
        return 0

    def partition_count(self, topic: str) -> int:
        return 1

    def purge(self) -> None:
        pass


def tier_message(offset: int, *, due_in_ms: int) -> Message:
    """A tier record whose retry is due `due_in_ms` from now."""
    failed_at = int(time.time() * 1000) + due_in_ms - 1000
    source = InboundRecord(topic="orders", partition=0, offset=offset, timestamp_ms=failed_at, key=b"k", headers=())
    r = route(CTX, source, OSError("down"), now_ms=failed_at, rng=random.Random(0))
    return Message(TIER, 0, offset, failed_at, b"k", str(offset).encode(), r.headers)


def build_loop(
    steps: list[Callable[[FakeConsumer], list[Message]]],
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    *,
    consumer_factory: Callable[[], Any] | None = None,
) -> tuple[ConsumerLoop, FakeConsumer, FakeProducer, list[int], list[Event]]:
    stop = threading.Event()
    consumer, producer = FakeConsumer(steps, stop), FakeProducer()
    calls: list[int] = []
    events: list[Event] = []

    def handle(record: Record[bytes]) -> None:
        calls.append(record.offset)
        raise RuntimeError("fails again")  # a hand-off to the DLQ: what a zombie must not do

    binding = Binding(topic="orders", handler=handle, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    hook = SimpleNamespace(on_event=lambda event, data: events.append(event))
    loop = ConsumerLoop(
        LoopSettings(name="tier", group_id=TIER, topics=(TIER,), max_wait_ms=50, join_timeout_s=30),
        {TIER: binding},
        consumer_factory=consumer_factory or (lambda: consumer),
        producer_factory=lambda: producer,
        emitter=Emitter([hook]),
        stop=stop,
        clock=clock,
        audit=DuplicateAudit(10),
    )
    return loop, consumer, producer, calls, events


def run_loop(
    steps: list[Callable[[FakeConsumer], list[Message]]], clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeConsumer, FakeProducer, list[int], list[Event]]:
    loop, consumer, producer, calls, events = build_loop(steps, clock, monkeypatch)
    loop.run()
    return consumer, producer, calls, events


def test_records_waiting_in_memory_are_not_acted_on_after_a_freeze_that_cost_the_membership(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()

    def assigned(c: FakeConsumer) -> list[Message]:
        c.on_assign([TP])
        return [tier_message(0, due_in_ms=-10), tier_message(1, due_in_ms=400), tier_message(2, due_in_ms=450)]

    def frozen(c: FakeConsumer) -> list[Message]:
        clock.jump_s += 20  # SIGSTOP inside consume(), SIGCONT 20 s later: the group expelled this member
        c.expelled = True
        return []

    def lost(c: FakeConsumer) -> list[Message]:
        c.on_lost([TP])  # librdkafka tells the loop only now
        return []

    consumer, producer, calls, events = run_loop([assigned, frozen, lost], clock, monkeypatch)

    # then: offset 0 was handled before the freeze; 1 and 2 waited in memory and were never touched after it
    assert calls == [0]
    assert producer.produced == [CTX.topics.dlq]
    assert (TP, 1) in consumer.seeks  # read again from the queue head, if the partition is still ours
    assert Event.RECORD_ABANDONED in events


def test_a_freeze_that_kept_the_membership_acts_on_the_records_after_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()

    def assigned(c: FakeConsumer) -> list[Message]:
        c.on_assign([TP])
        return [tier_message(0, due_in_ms=-10), tier_message(1, due_in_ms=400)]

    def frozen(c: FakeConsumer) -> list[Message]:
        clock.jump_s += 20  # the coordinator still counts this member (it accepts the commit)
        return []

    def idle(c: FakeConsumer) -> list[Message]:
        return []

    consumer, _producer, calls, _ = run_loop([assigned, frozen, idle, idle], clock, monkeypatch)
    assert calls == [0, 1]
    assert {TP: 1} in consumer.commits  # the question asked after the gap


def test_a_client_that_cannot_be_created_stops_the_app_with_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> Any:
        raise KafkaClientError("init_transactions timed out", code="_TIMED_OUT")

    loop, *_ = build_loop([], Clock(), monkeypatch, consumer_factory=refuse)
    loop.run()  # returns: the thread ends with the error recorded, not with an uncaught exception
    assert isinstance(loop.crash, KafkaClientError)
    assert loop._stop.is_set()  # every other loop of the app stops too, and run() re-raises the crash
    assert not loop.running and not loop.healthy


def test_a_consumer_that_never_joins_its_group_is_unhealthy_within_the_join_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    health: list[bool] = []
    loop: ConsumerLoop

    def waiting(seconds: float) -> Callable[[FakeConsumer], list[Message]]:
        def step(c: FakeConsumer) -> list[Message]:
            clock.jump_s += seconds  # librdkafka keeps trying an unreachable bootstrap: no assignment ever
            health.append(loop.healthy)
            return []

        return step

    def joins(c: FakeConsumer) -> list[Message]:
        c.on_assign([])
        health.append(loop.healthy)
        return []

    loop, *_ = build_loop([waiting(10), waiting(25), waiting(60), joins], clock, monkeypatch)
    loop.run()
    assert health == [True, False, False, True]  # 10 s: joining; 35 s, 95 s: past the 30 s bound; joined: fine


def test_a_freeze_before_anything_was_handled_reads_the_kept_records_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing handled yet, so nothing to commit: the coordinator cannot be asked. The records kept from before
    the freeze are read again rather than acted on (librdkafka reports the loss before they arrive again)."""
    clock = Clock()

    def assigned(c: FakeConsumer) -> list[Message]:
        c.on_assign([TP])
        return [tier_message(1, due_in_ms=400), tier_message(2, due_in_ms=450)]

    def frozen(c: FakeConsumer) -> list[Message]:
        clock.jump_s += 20
        c.expelled = True
        return []

    def lost(c: FakeConsumer) -> list[Message]:
        c.on_lost([TP])
        return []

    consumer, producer, calls, _ = run_loop([assigned, frozen, lost], clock, monkeypatch)
    assert calls == [] and producer.produced == []
    assert (TP, 1) in consumer.seeks


@pytest.mark.parametrize("per_record_hook", [False, True])
def test_successes_are_summed_per_partition_and_batch_and_finish_their_offsets(per_record_hook: bool) -> None:
    """The lean success path (issue 13): one `records.handled` per partition and batch counts every call,
    offsets finish without being queued, and `record.handled` reaches only a hook that asks for it."""
    # setup: two batches over two source partitions; a failure in between holds partition 0's position
    stop = threading.Event()
    source = [Message("orders", p, o, 1, None, b"v", ()) for o in range(3) for p in (0, 1)]

    def first(c: FakeConsumer) -> list[Message]:
        c.on_assign([("orders", 0), ("orders", 1)])
        return source[:4]

    consumer, producer = FakeConsumer([first, lambda c: source[4:]], stop), FakeProducer()
    batch_hook = SimpleNamespace(wanted_events=frozenset({Event.RECORDS_HANDLED}), seen=[])
    batch_hook.on_event = lambda event, data: batch_hook.seen.append(dict(data))
    every: list[Event] = []
    hooks: list[Any] = [batch_hook]
    if per_record_hook:
        hooks.append(SimpleNamespace(on_event=lambda event, data: every.append(event)))

    def handle(record: Record[bytes]) -> None:
        if (record.partition, record.offset) == (0, 1):
            raise RuntimeError("handed off, then acknowledged")

    binding = Binding(topic="orders", handler=handle, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    loop = ConsumerLoop(
        LoopSettings(name="main", group_id="billing", topics=("orders",), max_wait_ms=10, commit_on_ack=False),
        {"orders": binding},
        consumer_factory=lambda: consumer,
        producer_factory=lambda: producer,
        emitter=Emitter(hooks),
        stop=stop,
        audit=DuplicateAudit(10),
    )

    # when
    loop.run()

    # then: 5 successes in 3 events (two partitions in the first batch, two in the second), the failure routed
    assert [(d["partition"], d["count"], d["first_offset"], d["last_offset"]) for d in batch_hook.seen] == [
        (0, 1, 0, 0),
        (1, 2, 0, 1),
        (0, 1, 2, 2),
        (1, 1, 2, 2),
    ]
    assert producer.produced == [CTX.topics.tiers[0].topic]
    assert every.count(Event.RECORD_HANDLED) == (5 if per_record_hook else 0)
    # every offset finished: the last commit covers both partitions to their end
    assert consumer.commits[-1] == {("orders", 0): 3, ("orders", 1): 3}
