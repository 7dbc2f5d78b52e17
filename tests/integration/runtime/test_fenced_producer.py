"""A fatal producer error in exactly-once mode: the main consumer's transactional producer is fenced.

The mechanism is real: another producer starts with the same `transactional.id` (what a second replica with
the same `instance_id` does), so the broker fences the app's producer, and librdkafka raises a fatal
`_FENCED` error from then on, both from `produce()` and from `poll()`.

Guarantees: the app does not stop. The open transaction is aborted and nothing in it is committed (no offset
commit between the fencing and the abort); the producer is replaced (`producer.recreated`, one log line naming
the error); the batch is read again and handed off with the new producer, so every failed record reaches its
tier exactly once and the source offsets are committed in the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from confluent_kafka import Producer

from retrytopics import Event, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Event | str, dict[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.events.append((event, dict(data)))


def test_a_fenced_transactional_producer_is_replaced_and_nothing_commits_in_between(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # setup
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    recorder = Recorder()
    app = RetryApp(
        kafka=kafka,
        group=group,
        consumer_overrides=consumer_overrides,
        exactly_once=True,
        instance_id="replica-1",
        hooks=[recorder],
    )
    apps.append(app)
    lock = threading.Lock()
    calls: list[tuple[bytes, int]] = []

    @app.handler(source, policy=RetryPolicy(delays=["200ms"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls.append((record.value, record.attempt))
        if record.value == b"c-fail" and record.attempt == 1:
            time.sleep(0.3)  # by now the producer knows it is fenced: the next produce() raises
        if record.value.endswith(b"fail") and record.attempt == 1:
            raise RuntimeError(f"{record.value!r} fails once")

    app.provision()
    tier = app.topics(source).tiers[0].topic
    kit.produce(source, [(None, b"a-fail", [])])
    app.start(main=True, tiers="all")
    wait_until(lambda: (b"a-fail", 2) in calls, 30, "a first hand-off through a transaction")

    # when: a producer with the same transactional id fences the main consumer's producer
    intruder = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{group}-replica-1"})
    intruder.init_transactions(10)
    recorder.events.append(("fenced", {}))
    with caplog.at_level(logging.WARNING, logger="retrytopics"):
        kit.produce(source, [(None, b"b-fail", []), (None, b"c-fail", []), (None, b"d-ok", [])])
        wait_until(lambda: kit.committed(group, source, 1) == {0: 4}, 30, "every offset committed")
        wait_until(lambda: {(b"b-fail", 2), (b"c-fail", 2)} <= set(calls), 30, "the retries")
    assert app.running and app.error is None
    assert app.stop()

    # then: the fenced transaction was aborted before any commit, and the producer replaced
    main = f"{group}:main"
    after = recorder.events[next(i for i, (e, _) in enumerate(recorder.events) if e == "fenced") :]
    mine = [e for e, d in after if d.get("consumer") == main]
    assert Event.TRANSACTION_ABORTED in mine and Event.PRODUCER_RECREATED in mine, mine
    assert Event.OFFSETS_COMMITTED not in mine[: mine.index(Event.TRANSACTION_ABORTED)], mine
    replaced = [r.getMessage() for r in caplog.records if "replacing it" in r.getMessage()]
    assert replaced and "_FENCED" in replaced[0], replaced
    assert not [r for r in caplog.records if "stopping the app" in r.getMessage()]
    # then: each failed record reached the tier once and was retried once; nothing dead-lettered
    hops = sorted((r.value, decode(list(r.headers)).reconsume_times) for r in kit.read_all(tier))
    assert hops == [(b"a-fail", 1), (b"b-fail", 1), (b"c-fail", 1)]
    assert sorted(c for c in calls if c[1] == 2) == [(b"a-fail", 2), (b"b-fail", 2), (b"c-fail", 2)]
    assert kit.read_all(app.topics(source).dlq) == []
    assert app.stats.transactions_aborted >= 1 and app.stats.duplicates_suppressed == 0
