"""End to end on a real broker: 2,000 records, of which 10% fail once, 5% twice, 2% always and 1% raise a
non-retryable error, through tiers of 200 ms, 500 ms and 1 s.

Guarantees: every record id ends exactly once, either in the handler's success log or in the DLQ with the right
reason; DLQ records carry the full header contract and the original key and value bytes; no handler call
happens before its due time; each call's attempt number equals the failures before it; keyless records keep
their partition; at the end every consumer has committed everything it read. The same scenario runs with a
sync and an `async def` handler.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy, json_value
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

N = 2_000
PARTITIONS = 3
POLICY = RetryPolicy(delays=["200ms", "500ms", "1s"], non_retryable=(ValueError,))


def failures_planned(i: int) -> int | None:
    """How many times record i fails: 0, 1, 2, None (always) or -1 (non-retryable)."""
    bucket = i % 100
    if bucket < 10:
        return 1
    if bucket < 15:
        return 2
    if bucket < 17:
        return None
    if bucket == 17:
        return -1
    return 0


class Ledger:
    """Every handler call, as the handler saw it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.succeeded: Counter[int] = Counter()

    def handle(self, record: Record[Any]) -> None:
        now_ms = int(time.time() * 1000)
        i = record.value["id"]
        with self.lock:
            self.calls[i].append(
                {
                    "attempt": record.attempt,
                    "at": now_ms,
                    "due_at": record.retry.due_at if record.retry else None,
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                }
            )
            planned = failures_planned(i)
            if planned == -1:
                raise ValueError(f"record {i} is invalid")
            if planned is None or record.attempt <= planned:
                raise RuntimeError(f"record {i} failed on attempt {record.attempt}")
            self.succeeded[i] += 1


def _handler(ledger: Ledger, kind: str) -> Callable[[Record[Any]], Any]:
    if kind == "sync":
        return ledger.handle

    async def handle_async(record: Record[Any]) -> None:
        await asyncio.sleep(0)
        ledger.handle(record)

    return handle_async


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_record_ends_exactly_once(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    kind: str,
) -> None:
    # setup
    source = kit.create(unique_name("orders"), PARTITIONS)
    group = unique_name("billing")
    ledger = Ledger()
    dead: list[tuple[Record[Any], Any]] = []
    app = RetryApp(
        kafka=kafka,
        group=group,
        consumer_overrides=consumer_overrides,
        on_dead_letter=lambda record, route: dead.append((record, route)),
    )
    apps.append(app)
    app.handler(source, policy=POLICY, value_deserializer=json_value)(_handler(ledger, kind))
    app.provision()
    sent = {}
    records = []
    for i in range(N):
        key = None if i % 10 == 3 else f"id-{i}".encode()
        value = json.dumps({"id": i}).encode()
        sent[i] = (key, value)
        records.append((key, value, [("trace", f"t-{i}".encode())]))
    kit.produce(source, records)

    # when
    app.start(main=True, tiers="all")
    expected_dlq = {i for i in range(N) if failures_planned(i) in (None, -1)}
    wait_until(
        lambda: (
            app.stats.handled == N - len(expected_dlq) and sum(app.stats.dead_lettered.values()) == len(expected_dlq)
        ),
        90,
        "every record to finish",
    )
    assert app.stop(timeout=30)

    # then: exactly one terminal fate per id
    assert set(ledger.succeeded) | expected_dlq == set(range(N))
    assert not set(ledger.succeeded) & expected_dlq
    assert set(ledger.succeeded.values()) == {1}, "a record succeeded twice"
    dlq = kit.read_all(app.topics(source).dlq)
    by_id = {json.loads(r.value)["id"]: r for r in dlq}
    assert len(dlq) == len(by_id) == len(expected_dlq) and set(by_id) == expected_dlq
    assert len(dead) == len(expected_dlq)

    # then: attempts, due times and the failure count in the headers
    for i, calls in ledger.calls.items():
        planned = failures_planned(i)
        assert [c["attempt"] for c in calls] == list(range(1, len(calls) + 1)), (i, calls)
        expected_calls = {None: 4, -1: 1}.get(planned, (planned or 0) + 1)
        assert len(calls) == expected_calls, (i, calls)
        early = [c for c in calls if c["due_at"] is not None and c["at"] < c["due_at"]]
        assert not early, f"record {i} handled before its due time: {early}"
        assert calls[0]["topic"] == source and all(c["topic"] != source for c in calls[1:])

    # then: the DLQ keeps the original bytes and the full header contract
    for i, read in by_id.items():
        state = decode(list(read.headers))
        first = ledger.calls[i][0]
        assert (read.key, read.value) == sent[i]
        assert read.header("trace") == f"t-{i}".encode()
        assert state.dlq_reason is (DlqReason.NON_RETRYABLE if failures_planned(i) == -1 else DlqReason.EXHAUSTED)
        assert state.reconsume_times == len(ledger.calls[i])
        assert (state.original_topic, state.original_partition, state.original_offset) == (
            source,
            first["partition"],
            first["offset"],
        )
        assert state.origin_message_id == f"{source}-{first['partition']}-{first['offset']}"
        assert state.consumer_group == group
        expected_type = "builtins.ValueError" if failures_planned(i) == -1 else "builtins.RuntimeError"
        assert state.exception_type == expected_type and str(i) in state.exception_message
        if i % 10 == 3:
            assert read.partition == first["partition"] % PARTITIONS  # keyless: same partition

    # then: keyless retries stay on their original partition in every tier
    for i, calls in ledger.calls.items():
        if i % 10 == 3:
            assert {c["partition"] for c in calls} == {calls[0]["partition"]}, (i, calls)

    # then: every consumer committed everything it read (clean stop: committed == handled)
    for consumer_group, topic in [(group, source)] + [(t.topic, t.topic) for t in app.topics(source).tiers]:
        ends: dict[int, int] = {}
        for read in kit.read_all(topic):
            ends[read.partition] = max(ends.get(read.partition, 0), read.offset + 1)
        committed = kit.committed(consumer_group, topic, PARTITIONS)
        assert all(committed[p] == end for p, end in ends.items()), (topic, committed, ends)
    assert app.stats.duplicates_suppressed == 0
