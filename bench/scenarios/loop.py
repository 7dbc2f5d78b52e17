"""0. The runtime's own cost per record, without a broker: the consumer loop on the in-memory broker
(`retrytopics/testing/broker.py`) against a plain loop over the same in-memory consumer, in this process.

A broker run mixes the runtime's CPU with the client's fetches and the broker sharing two cores; this one
measures only what retrytopics adds per record, so that a change to the loop shows as a change here. Both
sides get the same records (4 partitions, 100-byte values) and commit every 500 records; CPU time of this
process, best of three. Failure path: every call fails once and is republished to the tier, against plain
produces of the same records into the in-memory broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from bench.context import Bench
from bench.report import Result, Target
from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.record import Record
from retrytopics.core.router import RouteContext
from retrytopics.observe.events import Emitter, Event, LoggingHook, StatsCollector
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Binding
from retrytopics.testing import MemoryBroker

NAME = "0.loop"
BATCH = 500
POLICY = RetryPolicy(delays=["1h"])
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")


def _broker(n: int) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=4)
    broker.create_topics(CTX.topics.all_topics, partitions=4)
    for i in range(n):
        broker.append("orders", b"v" * 100, key=b"%d" % i, partition=i % 4)
    return broker


def _cpu(run: Callable[[], None]) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


def _raw_consume(n: int) -> float:
    consumer = _broker(n).consumer("raw")
    consumer.subscribe(["orders"], on_assign=lambda tps: None, on_revoke=lambda tps: None, on_lost=lambda tps: None)

    def run() -> None:
        seen, positions = 0, {}
        while seen < n:
            for msg in consumer.consume(BATCH, 0.1):
                (lambda m: None)(msg)
                positions[msg.tp] = msg.offset + 1
                seen += 1
            consumer.commit(positions, asynchronous=True)

    return n / _cpu(run)


def _raw_produce(n: int) -> float:
    producer = _broker(0).producer()

    def run() -> None:
        for i in range(n):
            producer.produce(
                CTX.topics.tiers[0].topic,
                key=b"%d" % i,
                value=b"v" * 100,
                headers=[],
                partition=None,
                on_delivery=lambda err: None,
            )
            if i % BATCH == 0:
                producer.poll(0)
        producer.flush(10)

    return n / _cpu(run)


class _Counter:
    wanted_events = frozenset({Event.RECORDS_HANDLED, Event.RETRY_SCHEDULED})

    def __init__(self, n: int, stop: threading.Event) -> None:
        self.n, self.count, self.stop = n, 0, stop

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        count = data.get("count", 1)
        self.count += count if isinstance(count, int) else 1
        if self.count >= self.n:
            self.stop.set()


def _app(n: int, handler: Callable[[Any], None], *, batch: bool) -> float:
    broker, stop = _broker(n), threading.Event()
    binding = Binding(
        topic="orders", handler=handler, policy=POLICY, ctx=CTX, value_deserializer=bytes_value, batch=batch
    )
    loop = ConsumerLoop(
        LoopSettings(name="main", group_id="billing", topics=("orders",), max_wait_ms=100),
        {"orders": binding},
        clients=LoopClients(consumer=lambda: broker.consumer("billing"), producer=broker.producer),
        emitter=Emitter([StatsCollector(), LoggingHook(), _Counter(n, stop)]),
        stop=stop,
        audit=DuplicateAudit(),
    )
    seconds = _cpu(loop.run)
    if loop.crash is not None:
        raise loop.crash
    return n / seconds


def _fail(record: Record[bytes]) -> None:
    raise RuntimeError("fails once")


def run(b: Bench) -> list[Result]:
    n, n_fail = b.size(100_000, 300_000), b.size(10_000, 30_000)
    raw = max(_raw_consume(n) for _ in range(3))
    single = max(_app(n, lambda record: None, batch=False) for _ in range(3))
    batch = max(_app(n, lambda records: None, batch=True) for _ in range(3))
    produce = max(_raw_produce(n_fail) for _ in range(3))
    failure = max(_app(n_fail, _fail, batch=False) for _ in range(3))
    note = "in process, no broker: records/s of CPU time"
    return [
        Result(
            scenario=f"{NAME}.success",
            n=n,
            value=single,
            unit="records/s",
            baseline=raw,
            target=Target(">=", 0.35, on="ratio"),
            extra={"note": note},
        ),
        Result(
            scenario=f"{NAME}.batch",
            n=n,
            value=batch,
            unit="records/s",
            baseline=raw,
            target=Target(">=", 0.8, on="ratio"),
            extra={"note": note},
        ),
        Result(
            scenario=f"{NAME}.failure",
            n=n_fail,
            value=failure,
            unit="records/s",
            baseline=produce,
            target=Target(">=", 0.5, on="ratio"),
            extra={"note": note},
        ),
    ]
