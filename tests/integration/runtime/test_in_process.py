"""In-process retries (`RetryPolicy(in_process=InProcessRetry(...))`, driven by tenacity) on a real broker.

Guarantees: a record that fails twice and then succeeds within its in-process attempts is handled in the same
poll cycle: three calls, no republish (the tier and the DLQ stay empty), its offset committed. A record that
exhausts its in-process attempts is republished once, as its first failure (`reconsume_times` 1): in-process
attempts never count as tiers. A non-retryable failure is not retried in-process.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import InProcessRetry, NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["30s"], in_process=InProcessRetry(attempts=3, wait="50ms"))


def test_in_process_retries_hand_nothing_off_when_an_attempt_succeeds(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: "flaky" fails on its first two calls, "broken" on every call, "bad" is non-retryable
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
    apps.append(app)
    calls: Counter[bytes] = Counter()
    lock = threading.Lock()

    @app.handler(source, policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls[record.value] += 1
            seen = calls[record.value]
        assert record.attempt == 1  # in-process attempts are not tiers
        if record.value == b"flaky" and seen <= 2:
            raise RuntimeError(f"flaky call {seen}")
        if record.value == b"broken":
            raise RuntimeError("broken")
        if record.value == b"bad":
            raise NonRetryable(ValueError("bad"))

    app.provision()
    kit.produce(source, [(None, v, []) for v in (b"flaky", b"broken", b"bad", b"ok")])

    # when
    app.start(main=True)
    wait_until(lambda: kit.committed(group, source, 1) == {0: 4}, 30, "every offset committed")
    assert app.stop()

    # then: flaky succeeded on its third call, in-process, and was never handed off
    assert calls == {b"flaky": 3, b"broken": 3, b"bad": 1, b"ok": 1}
    tier = kit.read_all(app.topics(source).tiers[0].topic)
    assert [(r.value, decode(list(r.headers)).reconsume_times) for r in tier] == [(b"broken", 1)]
    dlq = kit.read_all(app.topics(source).dlq)
    assert [(r.value, decode(list(r.headers)).dlq_reason) for r in dlq] == [(b"bad", DlqReason.NON_RETRYABLE)]
    assert app.stats.handled == 2 and app.stats.retried == 1
