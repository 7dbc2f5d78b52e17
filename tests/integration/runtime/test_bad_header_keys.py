"""A header key that is not UTF-8 never stops a consumer.

Before: confluent-kafka's `headers()` raised SystemError on such a key, so the main consumer (or a tier's)
exited on every restart, its neighbours in the same fetch were never handled and nothing was committed:
WRITE on the source topic was enough to stop the pipeline. Guarantee: the record goes to the DLQ as
`poison`, with its key, value and other headers byte for byte, the bad header's value under its key decoded
with U+FFFD, and the raw key bytes in the exception message; the records around it are handled and the
consumer commits past it. The records are written before the app starts, so they share one fetch.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy, json_value
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, RetryHeaders, decode, encode

from ..raw_produce import produce_raw_record
from .conftest import Kit, Read, wait_until

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["200ms", "400ms"])
BAD_KEY = b"\xff\xfe"


class Env:
    def __init__(self, kafka: KafkaConfig) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.kit = Kit(kafka)
        self.kafka = kafka
        self.group = f"bad-keys-{suffix}"
        self.source = self.kit.create(f"bad-keys-src-{suffix}", 1)
        self.lock = threading.Lock()
        self.calls: list[Record[Any]] = []
        self.app = RetryApp(
            kafka=kafka, group=self.group, consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        )

    def handle(self, record: Record[Any]) -> None:
        with self.lock:
            self.calls.append(record)

    def handled(self) -> list[object]:
        with self.lock:
            return [c.value for c in self.calls]

    def dead(self, value: bytes) -> list[Read]:
        return [r for r in self.kit.read_all(self.app.topics(self.source).dlq) if r.value == value]


def _tier_headers(env: Env, now_ms: int) -> list[tuple[bytes, bytes | None]]:
    good = RetryHeaders(
        # an offset no source record has: a tier record that names a real source record's first hop makes
        # the main consumer's seeded audit treat that record as handed off already
        reconsume_times=1,
        origin_message_id="forged-tier",
        original_topic=env.source,
        original_partition=0,
        original_offset=999,
        original_timestamp=now_ms,
        consumer_group=env.group,
        tier=0,
        due_at=now_ms,
        first_failed_at=now_ms,
        last_failed_at=now_ms,
        exception_type="x.E",
        exception_message="",
        exception_trace="",
    )
    return [(BAD_KEY, b"v"), *((k.encode(), v) for k, v in encode(good))]


@pytest.fixture(scope="module")
def env(kafka: KafkaConfig) -> Iterator[Env]:
    env = Env(kafka)
    env.app.handler(env.source, policy=POLICY, value_deserializer=json_value)(env.handle)
    env.app.provision()
    # setup: on the source, a good record, the bad one, a good one; on tier 0, a due record with a bad key
    env.kit.produce(env.source, [(b"a", json.dumps("before").encode(), [])], partition=0)
    produce_raw_record(
        kafka,
        env.source,
        0,
        key=b"k",
        value=json.dumps("bad-key").encode(),
        headers=[(b"trace", b"t-1"), (BAD_KEY, b"v"), (b"user", b"kept")],
    )
    env.kit.produce(env.source, [(b"c", json.dumps("after").encode(), [])], partition=0)
    tier = env.app.topics(env.source).tiers[0].topic
    produce_raw_record(
        kafka,
        tier,
        0,
        key=b"t",
        value=json.dumps("bad-key-on-tier").encode(),
        headers=_tier_headers(env, int(time.time() * 1000)),
    )
    env.app.start(main=True, tiers="all")
    yield env
    env.app.stop()


def test_a_bad_header_key_on_the_source_is_poison_and_its_neighbours_flow(env: Env) -> None:
    # when: the main consumer reads the three records (one fetch)
    value = json.dumps("bad-key").encode()
    wait_until(lambda: "after" in env.handled() and env.dead(value), 60, "the neighbours and the DLQ record")
    # then: the neighbours were handled once each, the bad record never
    assert sorted(map(str, env.handled())) == ["after", "before"]
    (dead,) = env.dead(value)
    state = decode(list(dead.headers))
    assert state.dlq_reason is DlqReason.POISON and state.original_offset == 1
    assert "\\xff\\xfe" in state.exception_message and "not UTF-8" in state.exception_message
    # then: key, value and the other headers byte for byte, the bad one's value in its place
    user = [(k, v) for k, v in dead.headers if not k.startswith("retry.")]
    assert dead.key == b"k" and user == [("trace", b"t-1"), ("\ufffd\ufffd", b"v"), ("user", b"kept")]
    # then: committed past all three, and the app stayed up
    wait_until(lambda: env.kit.committed(env.group, env.source, 1) == {0: 3}, 30, "the commit past the records")
    assert env.app.healthy


def test_a_bad_header_key_on_a_tier_is_dead_lettered_not_a_crash(env: Env) -> None:
    value = json.dumps("bad-key-on-tier").encode()
    wait_until(lambda: env.dead(value), 60, "the tier record in the DLQ")
    (dead,) = env.dead(value)
    state = decode(list(dead.headers))
    assert state.dlq_reason is DlqReason.POISON and "not UTF-8" in state.exception_message
    assert "bad-key-on-tier" not in env.handled()
    assert env.app.healthy


def test_a_bad_header_key_before_a_bytes_batch_handler_is_poison_and_its_neighbours_flow(kafka: KafkaConfig) -> None:
    """A main consumer whose batch handler takes raw bytes gets its records built by the consumer port
    (`ports.consume_runs`); a record with a header key that is not UTF-8 in the same fetch makes that poll
    come as Messages, so the bad record is poison in the DLQ and never passed to the handler, both
    neighbours are handled once, and the consumer commits past all three."""
    env = Env(kafka)
    calls: list[list[bytes | None]] = []

    @env.app.batch_handler(env.source, policy=POLICY)
    def handle(records: list[Record[bytes]]) -> None:
        with env.lock:
            calls.append([r.value for r in records])

    env.app.provision()
    env.kit.produce(env.source, [(b"a", b"before", [])], partition=0)
    produce_raw_record(kafka, env.source, 0, key=b"k", value=b"bad-key", headers=[(BAD_KEY, b"v"), (b"user", b"kept")])
    env.kit.produce(env.source, [(b"c", b"after", [])], partition=0)
    env.app.start(main=True, tiers=None)
    try:
        wait_until(lambda: env.dead(b"bad-key"), 60, "the bad record in the DLQ")
        wait_until(lambda: env.kit.committed(env.group, env.source, 1) == {0: 3}, 30, "the commit past the records")
        with env.lock:
            handled = [v for call in calls for v in call]
        assert handled == [b"before", b"after"]
        (dead,) = env.dead(b"bad-key")
        state = decode(list(dead.headers))
        assert state.dlq_reason is DlqReason.POISON and state.original_offset == 1
        assert [(k, v) for k, v in dead.headers if not k.startswith("retry.")] == [
            ("\ufffd\ufffd", b"v"),
            ("user", b"kept"),
        ]
        assert env.app.healthy
    finally:
        env.app.stop()
