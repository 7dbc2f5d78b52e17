"""What the runtime's unit tests share: a retry context, the in-memory broker's topics, a consumer loop on
that broker and its clock (`MemoryClock`), a stop event that ends the loop once an end state holds, and a
ledger of what happened to each record id.

Imported by the test modules under tests/unit/runtime/ (relative imports: the suite runs with
`--import-mode=importlib`).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import tenacity

from retrytopics import KafkaConfig, RetryApp
from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.headers import RetryHeaders, decode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import ConsumerPort, Message
from retrytopics.core.record import Record
from retrytopics.core.router import InboundRecord, RouteContext, route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.handoff import handoff
from retrytopics.runtime.handoff.publish import Publisher
from retrytopics.runtime.records.calls import Binding
from retrytopics.testing import MemoryBroker, MemoryClientFactory, MemoryConsumer

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
        #: per call: (id, events emitted before it, broker journal entries before it): what came before what
        self.moments: list[tuple[str, int, int]] = []
        self.on_call: Callable[[str], None] = lambda _id: None

    def handle(self, record: Record[bytes]) -> None:
        record_id = record.value.decode()
        self.calls[record_id] += 1
        self.called_at.setdefault(record_id, []).append(self.broker.clock.now_ms())
        self.moments.append((record_id, len(self.seen), len(self.broker.journal)))
        self.on_call(record_id)
        if record_id in self.failing:
            raise RuntimeError(f"{record_id} fails")

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append((event, dict(data)))

    def of(self, event: Event) -> list[dict[str, Any]]:
        return [d for e, d in self.seen if e is event]

    def first(self, event: Event) -> int:
        """Index in `seen` of the first `event` (a call's moment after it has an events count above it)."""
        return next(i for i, (e, _) in enumerate(self.seen) if e is event)


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


def short_publish_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The at-least-once publisher (runtime/handoff/handoff.py makes it, for both the partition-based and the share
    hand-off) retries a refused hand-off after a fixed 0.5 s (on the loop's clock), so that a test of refused
    produces needs few polls."""
    monkeypatch.setattr(handoff, "Publisher", functools.partial(Publisher, wait=tenacity.wait_fixed(0.5)))


def build_loop(
    broker: MemoryBroker,
    ledger: Ledger,
    stop: threading.Event,
    *,
    topic: str = "orders",
    consumer: MemoryConsumer | None = None,
    hooks: Sequence[Any] = (),
    consumer_factory: Callable[[], ConsumerPort] | None = None,
    ctx: RouteContext = CTX,
    **settings: Any,
) -> ConsumerLoop:
    """A consumer loop of `topic` on `broker` and its clock, calling `ledger.handle`; events go to the ledger
    and to `hooks`."""
    consumer = consumer or broker.consumer(GROUP if topic == "orders" else topic)
    binding = Binding(topic="orders", handler=ledger.handle, policy=ctx.policy, ctx=ctx, value_deserializer=bytes_value)
    exactly_once = settings.get("exactly_once", False)
    defaults: dict[str, Any] = {"max_wait_ms": 100, "commit_every": 1, "batch_size": 3}
    return ConsumerLoop(
        LoopSettings(
            name=topic, group_id=GROUP if topic == "orders" else topic, topics=(topic,), **{**defaults, **settings}
        ),
        {topic: binding},
        clients=LoopClients(
            consumer=consumer_factory or (lambda: consumer),
            producer=lambda: broker.producer(transactional_id=f"{topic}-1" if exactly_once else None),
        ),
        emitter=Emitter([ledger, *hooks]),
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


def tier_record(
    broker: MemoryBroker, offset: int, record_id: str, *, failed_ago_ms: int = 0, ctx: RouteContext = CTX
) -> Message:
    """Route a failure of orders[0]@offset `failed_ago_ms` ago, and append the resulting tier record (due
    the first tier's delay after that failure: 5 s with CTX; its policy has no jitter)."""
    now = broker.clock.now_ms() - failed_ago_ms
    source = InboundRecord(topic="orders", partition=0, offset=offset, timestamp_ms=now, key=b"k", headers=())
    decision = route(ctx, source, OSError("down"), now_ms=now, rng=random.Random(0))
    return broker.append(decision.topic, record_id.encode(), key=b"k", headers=decision.headers, partition=0)


def eventually(done: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def stuck_app(broker: MemoryBroker, entered: threading.Event, release: threading.Event, **options: Any) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=MemoryClientFactory(broker), **options
    )

    @app.handler("orders")
    def handle(record: Record[bytes]) -> None:
        if record.value == b"stuck":
            entered.set()
            release.wait()

    app.provision()
    return app
