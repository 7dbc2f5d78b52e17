"""A record with more headers than a retry record may carry keeps its lineage.

Guarantee: the bound the tier decoder and the replay enforce (`headers.MAX_HEADER_COUNT`) is applied before
the first hand-off, from the same definition (`MAX_USER_HEADERS`: what is left once every retry header a hop
can carry is counted). A failing source record with more user headers goes straight to the DLQ as
`too_many_headers`, with its own original coordinates and replay lineage, its key and value, and no user
headers (the record on the source still has them); a record with the most user headers allowed reaches its
tier with all of them and is handled there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import MAX_HEADER_COUNT, MAX_USER_HEADERS, DlqReason, decode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker


def test_a_record_with_too_many_headers_is_dead_lettered_with_its_own_lineage(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: offset 0 has the most user headers allowed; offset 1 has 1,100 and replay lineage
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
    apps.append(app)
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    @app.handler(source, policy=RetryPolicy(delays=["1s"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls.append((record.topic, record.offset))
        if record.topic == source:
            raise RuntimeError("fails on the source, succeeds on the tier")

    app.provision()
    tier = app.topics(source).tiers[0].topic
    fitting = [(f"h{i}", b"x") for i in range(MAX_USER_HEADERS)]
    lineage = [("retry.replay_id", b"replay-7"), ("retry.replay_count", b"1")]
    too_many = [(f"h{i}", b"y") for i in range(1_100)] + lineage
    kit.produce(source, [(b"fits", b"v0", fitting), (b"over", b"v1", too_many)])

    # when
    app.start(main=True, tiers="all")
    wait_until(lambda: kit.committed(group, source, 1) == {0: 2}, 60, "both source offsets committed")
    wait_until(lambda: (tier, 0) in list(calls), 60, "the fitting record handled on its tier")
    assert app.stop()

    # then: the fitting record went through its tier, headers intact
    [in_tier] = kit.read_all(tier)
    assert [h for h in in_tier.headers if not h[0].startswith("retry.")] == fitting
    assert len(in_tier.headers) <= MAX_HEADER_COUNT
    # and the other is in the DLQ with its own coordinates and lineage, decodable, not the tier's
    [dead] = kit.read_all(app.topics(source).dlq)
    state = decode(list(dead.headers))
    assert state.dlq_reason == DlqReason.TOO_MANY_HEADERS
    assert (state.original_topic, state.original_partition, state.original_offset) == (source, 0, 1)
    assert (state.lineage.replay_id, state.lineage.replay_count) == ("replay-7", 1)
    assert state.exception_type == "builtins.RuntimeError"
    assert (dead.key, dead.value) == (b"over", b"v1")
    assert [h for h in dead.headers if not h[0].startswith("retry.")] == []
    assert sorted(calls) == sorted([(source, 0), (source, 1), (tier, 0)])
    assert app.stats.dead_lettered.get("too_many_headers") == 1
