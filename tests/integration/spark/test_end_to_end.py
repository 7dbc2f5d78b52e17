"""The Spark jobs against a pipeline that the real runtime wrote: a RetryApp (main consumer and both tiers,
500 ms and 1 s) runs a deterministic flaky handler over 300 records, of which some succeed first time, some
after one or two retries, some always fail (exhausted), some raise a non-retryable error and a few are not
JSON at all (poison).

Guarantees:

- the audit's summary equals the ground truth counted from what happened: the handler's own call log (every
  call's topic, attempt, outcome, exception type, due time and first failure time) plus the poison values the
  test produced: records per stage, nothing overdue or unhandled, DLQ by reason and by exception type,
  reconsume-times histogram, episodes by outcome, recovered count, attempts and time-to-recover percentiles,
  per-tier success rates;
- a replay of the exhausted and non-retryable DLQ records goes back to the source, where a main consumer
  (whose handler now succeeds) handles every replayed origin id exactly once; the audit then counts them
  replayed and the poison records pending; rerunning the same replay id writes nothing.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from pyspark.sql import SparkSession

from retrytopics import Record, RetryApp, RetryPolicy, json_value
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_consumer, make_producer
from retrytopics.core.errors import PoisonRecordError
from retrytopics.core.naming import TopicSet
from retrytopics.spark import ledger
from retrytopics.spark.audit import audit
from retrytopics.spark.replay import replay

from .conftest import create_topics

pytestmark = [pytest.mark.broker, pytest.mark.spark]

N = 300
PARTITIONS = 2
ID_HEADER = "order-id"
GROUP = "billing"
POLICY = RetryPolicy(delays=["500ms", "1s"], non_retryable=(ValueError,))
#: Group-membership settings for test consumers (as the shared `consumer_overrides` fixture: a 3 s join).
CONSUMER_OVERRIDES = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class Flaky(RuntimeError):
    """A retryable failure."""


class Broken(ValueError):
    """A non-retryable failure (the policy names ValueError)."""


def failures_planned(i: int) -> int | None:
    """How often record i fails before it succeeds: 0, 1, 2, None (always: exhausted) or -1 (non-retryable).
    This only drives the handler; every expectation below is counted from what the handler saw."""
    return {5: 1, 6: 2, 7: None, 8: -1, 9: 1}.get(i % 10, 0)


def is_poison(i: int) -> bool:
    return i % 50 == 49


@dataclass(frozen=True)
class Call:
    """One handler call as the handler saw it."""

    origin: str
    topic: str
    attempt: int
    failed: str | None  # the raised exception's type as the runtime names it, or None on success
    due_at: int | None
    first_failed_at: int | None


@dataclass
class Handler:
    """The flaky handler and its call log; `fixed` makes every call succeed (after the bug fix)."""

    calls: list[Call] = field(default_factory=list)
    fixed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, record: Record[Any]) -> None:
        planned = failures_planned(record.value["i"])
        error: Exception | None = None
        if not self.fixed and planned == -1:
            error = Broken(f"order {record.value['i']} is invalid")
        elif not self.fixed and (planned is None or record.attempt <= planned):
            error = Flaky(f"order {record.value['i']} timed out on attempt {record.attempt}")
        retry = record.retry
        with self.lock:
            self.calls.append(
                Call(
                    record.origin_message_id,
                    record.topic,
                    record.attempt,
                    error and _type_name(type(error)),
                    retry.due_at if retry else None,
                    retry.first_failed_at if retry else None,
                )
            )
        if error is not None:
            raise error


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Pipeline:
    topics: TopicSet
    handler: Handler
    origins: list[str]  # every produced record's origin id (the id header)
    poison: set[str]


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)


def _run_app(kafka: KafkaConfig, topics: TopicSet, handler: Handler, *, tiers: bool, done: Callable[[], bool]) -> None:
    """Run a RetryApp (main consumer, and the tiers if asked) until `done`, then stop it cleanly."""
    app = RetryApp(kafka=kafka, group=GROUP, id_header=ID_HEADER, consumer_overrides=CONSUMER_OVERRIDES)
    app.handler(topics.source, policy=POLICY, value_deserializer=json_value)(handler)
    app.start(main=True, tiers="all" if tiers else None)
    try:
        _wait(lambda: done() or app.error is not None, 90, "the app to handle every record")
        assert app.error is None, app.error
    finally:
        assert app.stop(timeout=30), "the app did not stop cleanly"


def _headers_in(kafka: KafkaConfig, topic: str, name: str) -> Counter[str]:
    """How often each value of header `name` occurs in `topic`, read to the end of every partition."""
    consumer = make_consumer(kafka, group_id=None, overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        found: Counter[str] = Counter()
        eof = 0
        while eof < PARTITIONS:
            for m in consumer.consume(500, 1.0):
                error = m.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    eof += 1
                else:
                    found[dict(m.headers() or [])[name].decode()] += 1
        return found
    finally:
        consumer.close()


def _dead_lettered(kafka: KafkaConfig, dlq: str) -> set[str]:
    """Origin ids in the DLQ, read back from its headers."""
    return set(_headers_in(kafka, dlq, "retry.origin_message_id"))


def _ids_in(kafka: KafkaConfig, topic: str) -> Counter[str]:
    """How often each order id occurs in `topic`."""
    return _headers_in(kafka, topic, ID_HEADER)


@pytest.fixture(scope="module")
def pipeline(kafka: KafkaConfig) -> Iterator[Pipeline]:
    """300 records through the real runtime until each one succeeded or reached the DLQ."""
    source = f"e2e-orders-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, (source, PARTITIONS))
    handler = Handler()
    app = RetryApp(kafka=kafka, group=GROUP, id_header=ID_HEADER)
    app.handler(source, policy=POLICY, value_deserializer=json_value)(handler)
    app.provision()
    topics = app.topics(source)
    producer = make_producer(kafka)
    origins, poison = [f"order-{i:04d}" for i in range(N)], set()
    for i, origin in enumerate(origins):
        value = b"{not json" if is_poison(i) else json.dumps({"i": i}).encode()
        producer.produce(source, key=f"customer-{i % 17}".encode(), value=value, headers=[(ID_HEADER, origin.encode())])
        poison |= {origin} if is_poison(i) else set()
    assert producer.flush(30) == 0

    def finished() -> bool:
        succeeded = {c.origin for c in handler.calls if c.failed is None}
        return len(succeeded) + len(_dead_lettered(kafka, topics.dlq)) >= N

    _run_app(kafka, topics, handler, tiers=True, done=finished)
    yield Pipeline(topics, handler, origins, poison)


def _nearest_rank(values: list[int], p: float) -> int | None:
    """The exact percentile percentile_approx gives when its accuracy exceeds the row count."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)] if ordered else None


def _sorted_counts(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def ground_truth(p: Pipeline) -> dict[str, Any]:
    """What the audit must report, counted from the handler's calls and the poison the test produced."""
    by_origin: dict[str, list[Call]] = {}
    for call in sorted(p.handler.calls, key=lambda c: c.attempt):
        by_origin.setdefault(call.origin, []).append(call)
    poison_type = _type_name(PoisonRecordError)
    hops = [c for c in p.handler.calls if c.failed]  # every failure wrote one hop: a tier or the DLQ record
    hop_types = Counter(c.failed for c in hops if c.failed)
    terminal = {o: calls[-1] for o, calls in by_origin.items() if calls[-1].failed}
    recovered = {o: calls for o, calls in by_origin.items() if len(calls) > 1 and not calls[-1].failed}
    reasons = Counter("non_retryable" if c.failed == _type_name(Broken) else "exhausted" for c in terminal.values())
    dlq_types = Counter(c.failed for c in terminal.values() if c.failed) + Counter({poison_type: len(p.poison)})
    per_topic = Counter(c.topic for c in p.handler.calls)
    wins = Counter(calls[-1].topic for calls in recovered.values())
    dlq_records = len(terminal) + len(p.poison)
    ttr = [calls[-1].due_at - calls[-1].first_failed_at for calls in recovered.values()]  # type: ignore[operator]
    attempts = [len(calls) for calls in recovered.values()]
    return {
        "stages": [
            (p.topics.source, per_topic[p.topics.source] + len(p.poison)),
            *((t.topic, per_topic[t.topic]) for t in p.topics.tiers),
            (p.topics.dlq, dlq_records),
        ],
        "dlq": {
            "records": dlq_records,
            "by_reason": _sorted_counts(reasons + Counter({"poison": len(p.poison)})),
            "by_exception_type": _sorted_counts(dlq_types),
            "replayed": 0,
            "pending": dlq_records,
        },
        "by_exception_type": _sorted_counts(hop_types + Counter({poison_type: len(p.poison)})),
        "reconsume_times": _sorted_counts(Counter(str(c.attempt) for c in hops) + Counter({"1": len(p.poison)})),
        "lineage": {
            "episodes": len(recovered) + dlq_records,
            "by_outcome": _sorted_counts(Counter({"recovered": len(recovered), "dead_lettered": dlq_records})),
            "recovered": len(recovered),
            "attempts_p50": _nearest_rank(attempts, 0.5),
            "attempts_p99": _nearest_rank(attempts, 0.99),
            "time_to_recover_ms_p50": _nearest_rank(ttr, 0.5),
            "time_to_recover_ms_p99": _nearest_rank(ttr, 0.99),
            "tiers": [
                {
                    "topic": t.topic,
                    "handled": per_topic[t.topic],
                    "recovered": wins[t.topic],
                    "success_rate": round(wins[t.topic] / per_topic[t.topic], 4) if per_topic[t.topic] else None,
                }
                for t in p.topics.tiers
            ],
        },
    }


def test_the_audit_of_a_real_run_equals_the_handlers_ground_truth(
    spark: SparkSession, kafka: KafkaConfig, pipeline: Pipeline
) -> None:
    # setup: every record ended exactly once, as the handler and the DLQ tell
    succeeded = {c.origin for c in pipeline.handler.calls if c.failed is None}
    dead = _dead_lettered(kafka, pipeline.topics.dlq)
    assert not succeeded & dead and succeeded | dead == set(pipeline.origins)
    assert pipeline.poison <= dead and not {c.origin for c in pipeline.handler.calls} & pipeline.poison
    truth = ground_truth(pipeline)

    # when
    summary = audit(spark, kafka, pipeline.topics)

    # then
    assert [(s["topic"], s["records"]) for s in summary["stages"]] == truth["stages"]
    assert [(s["overdue"], s["unhandled"]) for s in summary["stages"]] == [(0, 0)] * 3 + [(0, None)]
    for key in ("dlq", "by_exception_type", "reconsume_times", "lineage"):
        assert summary[key] == truth[key], key
    # the data really exercises every outcome (a guard on the fixture, not on the audit)
    assert set(truth["dlq"]["by_reason"]) == {"exhausted", "non_retryable", "poison"}
    succeeded_in = {c.topic for c in pipeline.handler.calls if c.failed is None}
    assert succeeded_in == {pipeline.topics.source, *(t.topic for t in pipeline.topics.tiers)}


def test_a_replay_is_handled_exactly_once_and_counted_replayed(
    spark: SparkSession, kafka: KafkaConfig, pipeline: Pipeline
) -> None:
    # setup: the bug is fixed; the exhausted and non-retryable records are worth replaying, poison is not
    topics, truth = pipeline.topics, ground_truth(pipeline)
    selected = {c.origin for c in pipeline.handler.calls if c.failed} - {
        c.origin for c in pipeline.handler.calls if c.failed is None
    }
    fixed = Handler(fixed=True)

    # when
    result = replay(spark, kafka, topics, replay_id="fix-1", reasons=["exhausted", "non_retryable"])
    _run_app(kafka, topics, fixed, tiers=False, done=lambda: {c.origin for c in fixed.calls} >= selected)
    after = audit(spark, kafka, topics)
    rerun = replay(spark, kafka, topics, replay_id="fix-1", reasons=["exhausted", "non_retryable"])

    # then: each replayed origin id was written back once and handled exactly once, on the source, successfully
    assert (result["written"], result["selected"]) == (len(selected), len(selected))
    assert _ids_in(kafka, topics.source) == Counter(pipeline.origins) + Counter(selected)
    assert Counter(c.origin for c in fixed.calls) == Counter(selected)
    assert {(c.topic, c.attempt, c.failed) for c in fixed.calls} == {(topics.source, 1, None)}
    # then: the ledger and the audit agree; nothing else moved
    entries = ledger.read_entries(kafka, topics.dlq, "fix-1")
    assert [(e["event"], e.get("written")) for e in entries] == [
        ("started", None),
        ("finished", len(selected)),
        ("finished", 0),
    ]
    assert after["dlq"] == {**truth["dlq"], "replayed": len(selected), "pending": len(pipeline.poison)}
    source_records = truth["stages"][0][1] + len(selected)
    assert [(s["topic"], s["records"]) for s in after["stages"]] == [
        (topics.source, source_records),
        *truth["stages"][1:],
    ]
    assert after["stages"][0]["unhandled"] == 0 and after["lineage"] == truth["lineage"]
    # then: rerunning the replay id wrote nothing new
    assert (rerun["written"], rerun["skipped_already_replayed"]) == (0, len(selected))
    assert _ids_in(kafka, topics.source) == Counter(pipeline.origins) + Counter(selected)
