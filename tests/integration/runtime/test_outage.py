"""A broker outage while failed records are being handed off (the fault tests' own broker, behind this test's
TCP proxy on loopback).

Guarantees: while the republish of a failed record (to a tier) and the DLQ publish of a non-retryable one go
unacknowledged, the source offset is never committed past them, even though later records succeed and
commits keep flowing; the app reports unhealthy meanwhile and keeps retrying with back-off, through a full
connection cut as well; after recovery both complete exactly once and the offsets are committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until
from .proxy import PRODUCE, KafkaProxy

pytestmark = pytest.mark.broker

#: Short client timeouts so that a swallowed produce request surfaces as a delivery error within seconds.
PRODUCER = {"message.timeout.ms": 3000, "request.timeout.ms": 2000, "retry.backoff.ms": 100}
CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def test_no_commit_past_an_unacknowledged_hand_off(
    proxied: tuple[KafkaConfig, KafkaProxy], unique_name: Callable[[str], str]
) -> None:
    kafka, proxy = proxied
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    dead: list[Any] = []
    calls: list[tuple[int, int]] = []
    lock = threading.Lock()
    app = RetryApp(
        kafka=kafka,
        group=group,
        consumer_overrides=CONSUMER,
        producer_overrides=PRODUCER,
        on_dead_letter=lambda record, route: dead.append(record),
    )

    @app.handler(source, policy=RetryPolicy(delays=["200ms"]), value_deserializer=lambda d, c: int(d))
    def handle(record: Record[int]) -> None:
        with lock:
            calls.append((record.value, record.attempt))
        if record.value == 5 and record.attempt == 1:
            proxy.drop_requests({PRODUCE})  # the broker "disappears" for producers right now
            raise RuntimeError("transient")
        if record.value == 7:
            raise NonRetryable("bad record")

    app.provision()
    kit.produce(source, [(None, str(i).encode(), []) for i in range(10)])
    app.start(main=True, tiers="all")
    try:
        # when: both hand-offs are stuck, everything after them succeeded
        wait_until(lambda: not app.healthy, 30, "the app to report the failing publishes")
        wait_until(lambda: all((i, 1) in calls for i in range(10)), 10, "every record handled once")
        # then: commits flow, but never past offset 5 (the unacknowledged republish)
        wait_until(lambda: kit.committed(group, source, 1) == {0: 5}, 10, "the commit of offsets 0-4")
        assert app.stats.publish_failures >= 1 and not dead
        # when: a full cut, then recovery
        proxy.cut()
        threading.Event().wait(2)
        assert not app.healthy
        proxy.heal()
        # then: both complete, once, and everything is committed
        wait_until(lambda: (5, 2) in calls and dead and app.healthy, 60, "the record to complete after recovery")
        wait_until(lambda: kit.committed(group, source, 1) == {0: 10}, 20, "the commit of every offset")
    finally:
        app.stop()
    assert proxy.requests[PRODUCE] > 0 and proxy.dropped[PRODUCE] > 0  # the traffic really went through the proxy
    tier = kit.read_all(app.topics(source).tiers[0].topic)
    dlq = kit.read_all(app.topics(source).dlq)
    assert [r.value for r in tier] == [b"5"]
    assert [r.value for r in dlq] == [b"7"]
    assert decode(list(dlq[0].headers)).dlq_reason is DlqReason.NON_RETRYABLE
    assert [c for c in calls if c[0] == 5] == [(5, 1), (5, 2)]
    assert len(dead) == 1
