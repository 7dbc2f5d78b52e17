"""`retrytopics demo`: the whole pipeline on a real broker in one command.

It starts a local broker (`broker="tansu"`, the embedded one, by default: it starts in well under a second;
`broker="apache"` starts Apache Kafka from the Maven cache in about 5 s), or uses `--bootstrap`, provisions a source topic with its tiers and DLQ,
produces Avro orders, and runs a deliberately flaky handler through the main consumer and every tier until
each order is accounted for. Each order's fate is drawn from a seeded generator: most succeed, some fail once
or twice (recovered by the tiers), some always fail (exhausted), some raise a non-retryable error, a few
values are not Avro at all (poison).

Every number in the summary is counted from what happened: successes from the handler's own call log,
dead letters from reading the DLQ topic back and decoding its headers, lateness from handled_at − due_at of
each retried call. None comes from the configured fractions.

The orders are produced once every consumer (main and tiers) has joined its group: a fresh broker's first
group join (about 3 s on Apache Kafka while it creates `__consumer_offsets`) is start-up, reported on its
own line, never retry lateness. The lateness is what a running pipeline gives.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TextIO

from retrytopics.app import RetryApp
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.brokers import BROKER_NAMES, local_broker
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer, open_tail
from retrytopics.connectors.record_headers import read_headers
from retrytopics.connectors.serde import avro, avro_serializer
from retrytopics.core.errors import ConfigError, HeaderDecodeError
from retrytopics.core.headers import decode
from retrytopics.core.naming import TopicSet
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.record import Record
from retrytopics.observe.events import PER_BATCH, Event
from retrytopics.operator.progress import ProgressBoard, Stage
from retrytopics.schemas import schema_text

if TYPE_CHECKING:
    from retrytopics.observe.metrics import PrometheusHook

__all__ = ["DemoOptions", "Fate", "HandlerCall", "assign_fates", "run_demo", "summarize"]

ID_HEADER = "order-id"


class Fate(StrEnum):
    """What the flaky handler does with an order (decided up front, by a seeded generator)."""

    OK = "ok"
    """Succeeds on the first delivery."""
    FAIL_ONCE = "fail_once"
    """Times out once, then succeeds in the first tier."""
    FAIL_TWICE = "fail_twice"
    """Times out twice, then succeeds in the second tier."""
    ALWAYS = "always"
    """Always times out: exhausts every tier and lands in the DLQ (`exhausted`)."""
    NON_RETRYABLE = "non_retryable"
    """Raises ValueError, which the policy calls non-retryable: straight to the DLQ."""
    POISON = "poison"
    """The value is not Avro: the deserializer fails and the record goes to the DLQ (`poison`)."""


#: Fractions of each fate (the rest succeeds first time). They shape the data, never the reported numbers.
FATE_FRACTIONS: Mapping[Fate, float] = {
    Fate.FAIL_ONCE: 0.10,
    Fate.FAIL_TWICE: 0.05,
    Fate.ALWAYS: 0.02,
    Fate.NON_RETRYABLE: 0.01,
    Fate.POISON: 0.005,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    records: int = 2000
    partitions: int = 3
    delays: tuple[str, ...] = ("200ms", "500ms", "1s")
    seed: int = 7
    bootstrap: str | None = None
    broker: str = "tansu"
    spark: bool = True
    timeout_s: float = 300.0
    #: serve the demo app's Prometheus metrics on this loopback port (None: not served)
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.records <= 10_000_000:
            raise ConfigError("records", self.records, "expected 1..10000000")
        if not 1 <= self.partitions <= 64:
            raise ConfigError("partitions", self.partitions, "expected 1..64")
        RetryPolicy(delays=self.delays)  # validates the delays, naming the field
        if self.broker not in BROKER_NAMES:
            raise ConfigError("broker", self.broker, f"expected one of {', '.join(BROKER_NAMES)}")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ConfigError("metrics_port", self.metrics_port, "expected a TCP port, 1 to 65535")


@dataclass(frozen=True, slots=True)
class HandlerCall:
    order_id: str
    topic: str
    reconsume_times: int
    handled_at_ms: int
    due_at_ms: int | None
    ok: bool


def assign_fates(records: int, seed: int) -> list[Fate]:
    """The fate of each order, reproducible from the seed."""
    rng = random.Random(seed)
    fates: list[Fate] = []
    for _ in range(records):
        draw, threshold = rng.random(), 0.0
        chosen = Fate.OK
        for fate, fraction in FATE_FRACTIONS.items():
            threshold += fraction
            if draw < threshold:
                chosen = fate
                break
        fates.append(chosen)
    return fates


class FlakyHandler:
    """Fails as each order's fate says; failures are counted from `record.reconsume_times`, which comes from
    the retry headers (durable), never from memory."""

    def __init__(self, fates: Mapping[str, Fate]) -> None:
        self.fates = fates
        self.calls: list[HandlerCall] = []  # list.append is atomic: consumer threads share it safely

    def __call__(self, record: Record[dict[str, Any]]) -> None:
        order_id = record.value["order_id"]
        fate = self.fates[order_id]
        failures = record.reconsume_times
        failing = fate in (Fate.ALWAYS, Fate.NON_RETRYABLE) or (
            (fate is Fate.FAIL_ONCE and failures < 1) or (fate is Fate.FAIL_TWICE and failures < 2)
        )
        due_at = record.retry.due_at if record.retry else None
        self.calls.append(HandlerCall(order_id, record.topic, failures, int(time.time() * 1000), due_at, not failing))
        if fate is Fate.NON_RETRYABLE:
            raise ValueError(f"order {order_id}: currency conversion rejected")
        if failing:
            raise TimeoutError(f"payment gateway timed out for order {order_id}")


class _StageCounter:
    """A hook counting records processed per topic (handler calls, and poison records, which fail before a
    call) and republishes per destination, for the progress bars only."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.scheduled: Counter[str] = Counter()
        self.assigned: set[tuple[str, int]] = set()

    wanted_events = PER_BATCH

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is Event.RECORDS_HANDLED:
            count = data.get("count")
            self.calls[str(data.get("topic"))] += count if isinstance(count, int) else 1
        elif event is Event.RECORD_FAILED:
            self.calls[str(data.get("topic"))] += 1
        elif event is Event.RETRY_SCHEDULED:
            self.scheduled[str(data.get("destination"))] += 1
        elif event is Event.PARTITIONS_ASSIGNED:
            partitions = data.get("partitions")
            for topic, partition in partitions if isinstance(partitions, list | tuple) else ():
                self.assigned.add((str(topic), int(partition)))


def _percentile(values: Sequence[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(
    *,
    records: int,
    calls: Sequence[HandlerCall],
    dead_letters: Mapping[str, str],
    duplicates_suppressed: int,
    wall_s: float,
) -> dict[str, Any]:
    """The demo's summary, from the handler's call log and the DLQ's contents (origin id → reason)."""
    succeeded: dict[str, int] = {}
    for call in calls:
        if call.ok:
            succeeded.setdefault(call.order_id, call.reconsume_times)
    lateness = [c.handled_at_ms - c.due_at_ms for c in calls if c.due_at_ms is not None]
    accounted = set(succeeded) | set(dead_letters)
    return {
        "records": records,
        "succeeded_first_try": sum(1 for failures in succeeded.values() if failures == 0),
        "succeeded_after_retry": sum(1 for failures in succeeded.values() if failures > 0),
        "dead_lettered": dict(sorted(Counter(dead_letters.values()).items())),
        "lost": records - len(accounted),
        "duplicates_suppressed": duplicates_suppressed,
        "both_succeeded_and_dead_lettered": len(set(succeeded) & set(dead_letters)),
        "handler_calls": len(calls),
        "early_calls": sum(1 for late in lateness if late < 0),
        "lateness_ms": {
            "p50": _percentile(lateness, 0.5),
            "p99": _percentile(lateness, 0.99),
            "max": max(lateness) if lateness else None,
        },
        "wall_s": round(wall_s, 3),
    }


class _DlqReader:
    """Reads the DLQ back from its beginning (assign(), no group) and keeps origin id → reason."""

    def __init__(self, kafka: KafkaConfig, topic: str, partitions: int) -> None:
        self._consumer = open_tail(kafka, topic, partitions, last=2**62)
        self.reasons: dict[str, str] = {}
        self.undecodable = 0

    def drain(self, timeout_s: float = 0.05) -> None:
        for message in self._consumer.consume(1000, timeout_s):
            if message.error() is not None:
                continue
            try:
                retry = decode(read_headers(message)[0])
            except HeaderDecodeError:
                self.undecodable += 1
                continue
            self.reasons[retry.origin_message_id] = str(retry.dlq_reason)

    def close(self) -> None:
        self._consumer.close()


def _order_id(i: int) -> str:
    return f"order-{i:07d}"


def _produce_orders(kafka: KafkaConfig, topic: str, fates: Sequence[Fate], seed: int) -> None:
    serialize = avro_serializer(schema_text("order"))
    rng = random.Random(seed + 1)
    producer = make_producer(kafka)
    for i, fate in enumerate(fates):
        order_id = _order_id(i)
        order: dict[str, Any] = {
            "order_id": order_id,
            "customer_id": f"customer-{rng.randrange(500):03d}",
            "amount_cents": rng.randrange(100, 100_000),
            "currency": rng.choice(["EUR", "USD", "GBP"]),
            "created_at": int(time.time() * 1000),
            "items": [{"sku": f"sku-{rng.randrange(50)}", "quantity": rng.randrange(1, 4)}],
        }
        value = (
            b'{"order_id": "%s", "note": "JSON, not Avro"}' % order_id.encode()
            if fate is Fate.POISON
            else serialize(order, None)
        )
        producer.produce(
            topic, key=order["customer_id"].encode(), value=value, headers=[(ID_HEADER, order_id.encode())]
        )
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the demo's orders were not all acknowledged by the broker")


def _stages(app: RetryApp, source: str, counter: _StageCounter, records: int, dlq_seen: int) -> list[Stage]:
    topics = app.topics(source)
    stages = [Stage("main", counter.calls[source], records)]
    for tier in topics.tiers:
        stages.append(
            Stage(f"tier {tier.topic.rsplit('.', 1)[-1]}", counter.calls[tier.topic], counter.scheduled[tier.topic])
        )
    stages.append(Stage("dlq", dlq_seen, records, "dead-lettered"))
    return stages


Then = Callable[[dict[str, Any], KafkaConfig], None]


def run_demo(options: DemoOptions, *, progress_out: TextIO | None = None, then: Then | None = None) -> dict[str, Any]:
    """Run the demo and return its summary (see the module docstring). `then(summary, kafka)` runs before a
    local broker stops (`retrytopics demo --console` serves the console on the demo's pipeline there)."""
    started = time.monotonic()
    if options.bootstrap:
        kafka = KafkaConfig(bootstrap=options.bootstrap)
        summary = _run(options, kafka, progress_out, started)
        if then is not None:
            then(summary, kafka)
        return summary
    with local_broker(options.broker) as broker:
        summary = _run(options, broker.kafka_config(), progress_out, started)
        summary["broker"] = broker.description
        if then is not None:
            then(summary, broker.kafka_config())
        return summary


def _run(options: DemoOptions, kafka: KafkaConfig, progress_out: TextIO | None, started: float) -> dict[str, Any]:
    source = f"demo-orders-{uuid.uuid4().hex[:6]}"
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=options.partitions)])
    counter = _StageCounter()
    hooks, metrics_url = _metrics(options.metrics_port)
    app = RetryApp(
        kafka=kafka,
        group="demo",
        id_header=ID_HEADER,
        hooks=[counter, *hooks],
        # short sessions: a demo's group joins and rebalances should take seconds, not tens of seconds
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )
    for hook in hooks:
        hook.track_health(lambda: bool(app.healthy))
    fates = assign_fates(options.records, options.seed)
    handler = FlakyHandler({_order_id(i): fate for i, fate in enumerate(fates)})  # known before the first call
    policy = RetryPolicy(delays=options.delays, non_retryable=(ValueError,))
    app.handler(source, policy=policy, value_deserializer=avro(schema_text("order")))(handler)
    app.provision(partitions=options.partitions)
    board = ProgressBoard(progress_out or sys.stderr)
    app.start(main=True, tiers="all")
    dlq: _DlqReader | None = None
    try:
        _wait_until_joined(app, source, counter, options)
        startup_s = time.monotonic() - started
        # after the joins: on a fresh Apache Kafka a just-created partition has no leader for a moment
        dlq = _DlqReader(kafka, app.topics(source).dlq, options.partitions)
        producing = time.monotonic()
        _produce_orders(kafka, source, fates, options.seed)
        _wait_until_accounted(app, source, handler, dlq, counter, board, options)
    finally:
        app.stop()
        if dlq is not None:
            dlq.drain(0.5)
            dlq.close()
    assert dlq is not None  # reached only when the run completed
    summary = summarize(
        records=options.records,
        calls=handler.calls,
        dead_letters=dlq.reasons,
        duplicates_suppressed=app.stats.duplicates_suppressed,
        wall_s=time.monotonic() - producing,
    )
    summary["startup_s"] = round(startup_s, 3)
    summary["delays"] = list(options.delays)
    summary["topics"] = {
        "source": source,
        "tiers": [t.topic for t in app.topics(source).tiers],
        "dlq": app.topics(source).dlq,
    }
    summary["bootstrap"] = kafka.bootstrap
    if metrics_url is not None:
        summary["metrics"] = metrics_url
    if options.spark:
        summary["audit"] = _spark_audit(kafka, app.topics(source))
    return summary


def _metrics(port: int | None) -> tuple[list[PrometheusHook], str | None]:
    """The Prometheus hook serving the demo's metrics on loopback `port` (it keeps serving while the process
    lives: with --console, the final counts), and its address."""
    if port is None:
        return [], None
    from retrytopics.observe.metrics import PrometheusHook  # the metrics extra: only when asked

    hook = PrometheusHook(failures_by_exception=True)
    hook.serve(port, addr="127.0.0.1")
    return [hook], f"http://127.0.0.1:{port}/metrics"


def _wait_until_joined(app: RetryApp, source: str, counter: _StageCounter, options: DemoOptions) -> None:
    """Until the main consumer and every tier consumer own all their partitions: the first record produced
    after this is handled by consumers that are already running."""
    topics = [source, *(t.topic for t in app.topics(source).tiers)]
    wanted = {(topic, p) for topic in topics for p in range(options.partitions)}
    deadline = time.monotonic() + options.timeout_s
    while not wanted <= counter.assigned:
        if not app.running:
            raise RuntimeError("the demo's consumers stopped unexpectedly; see the log above")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the demo's consumers did not join their groups within {options.timeout_s:.0f}s")
        threading.Event().wait(0.02)


def _wait_until_accounted(
    app: RetryApp,
    source: str,
    handler: FlakyHandler,
    dlq: _DlqReader,
    counter: _StageCounter,
    board: ProgressBoard,
    options: DemoOptions,
) -> None:
    deadline = time.monotonic() + options.timeout_s
    while time.monotonic() < deadline:
        dlq.drain()
        done = {c.order_id for c in handler.calls if c.ok} | set(dlq.reasons)
        stages = _stages(app, source, counter, options.records, len(dlq.reasons))
        board.update(stages)
        if len(done) >= options.records:
            board.update(stages, force=True)
            return
        if not app.running:
            raise RuntimeError("the demo's consumers stopped unexpectedly; see the log above")
        threading.Event().wait(0.05)


def _spark_audit(kafka: KafkaConfig, topics: TopicSet) -> dict[str, Any]:
    """The Spark audit of the demo's pipeline; `table` is its console view. Spark starts only when asked."""
    from retrytopics.spark.audit import audit, format_table
    from retrytopics.spark.session import get_session

    with _without_jvm_notice(b"WARNING: Using incubator modules"):
        spark = get_session(None, "retrytopics-demo-audit", short_job=True)
    spark.sparkContext.setLogLevel("ERROR")
    summary = audit(spark, kafka, topics)
    summary["table"] = format_table(summary)
    return summary


@contextlib.contextmanager
def _without_jvm_notice(prefix: bytes) -> Iterator[None]:
    """Drop lines starting with `prefix` from the standard error of a JVM started inside the block.

    Spark 4 starts its JVM with an incubator module (the vector API), and the JVM announces it on its standard
    error at start-up, with no option to turn it off: noise in the middle of the demo's summary. The JVM
    inherits this process's standard error, so for the block it gets a pipe instead, which a daemon thread
    copies to the real standard error, line by line, without that notice, for as long as the JVM writes."""
    try:
        real = os.dup(2)
    except OSError:  # no standard error to filter
        yield
        return
    read_end, write_end = os.pipe()

    def copy() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not line.startswith(prefix):
                    os.write(real, line)

    threading.Thread(target=copy, name="retrytopics-jvm-stderr", daemon=True).start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # this process writes to the real one again; the JVM keeps the pipe
