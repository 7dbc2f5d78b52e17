"""A producer-chosen id never makes two source records duplicates of each other.

Guarantee: with `RetryApp(id_header="order-id")`, different source records carrying the same `order-id` that
each fail once are each handled again in the tier: none is suppressed as a duplicate of another, every tier
offset is committed, and `record.origin_message_id` is still the user's id on every call.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker


def test_records_sharing_an_id_header_are_each_retried(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: six records on two partitions, three ids, each id on two different records; every record fails once
    source = kit.create(unique_name("orders"), 2)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, id_header="order-id", consumer_overrides=consumer_overrides)
    apps.append(app)
    calls: Counter[tuple[bytes, int]] = Counter()
    ids: dict[bytes, set[str]] = {}
    lock = threading.Lock()

    @app.handler(source, policy=RetryPolicy(delays=["200ms"]))
    def handle(record: Record[bytes]) -> None:
        assert record.value is not None
        with lock:
            calls[(record.value, record.attempt)] += 1
            ids.setdefault(record.value, set()).add(record.origin_message_id)
        if record.attempt == 1:
            raise RuntimeError("fails once")

    app.provision()
    values = [f"r{n}".encode() for n in range(6)]
    for partition in (0, 1):
        kit.produce(
            source,
            [(None, v, [("order-id", f"id-{n % 3}".encode())]) for n, v in enumerate(values) if n // 3 == partition],
            partition=partition,
        )

    # when
    app.start(main=True, tiers="all")
    tier = app.topics(source).tiers[0].topic
    wait_until(lambda: sum(kit.committed(tier, tier, 2).values()) == 6, 30, "every tier offset committed")
    assert app.stop()

    # then: every record was handled in the tier, once; none was taken for a copy of another with its id
    assert calls == {**{(v, 1): 1 for v in values}, **{(v, 2): 1 for v in values}}
    assert ids == {v: {f"id-{n % 3}"} for n, v in enumerate(values)}
    assert app.stats.duplicates_suppressed == 0
    assert kit.read_all(app.topics(source).dlq) == []
