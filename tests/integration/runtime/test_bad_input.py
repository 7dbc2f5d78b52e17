"""Untrusted input on a real broker, one app for the module (each test uses its own source topic).

Guarantees: forged `retry.*` headers on a source topic change nothing (normal first delivery, own origin id,
every tier in order); an undecodable value goes straight to the DLQ with reason `poison` and the decoder's
error, without a handler call, while its neighbours flow; malformed or out-of-bounds retry headers on a tier
record send it to the DLQ as `invalid_retry_headers` (never a crash, never an endless pause).
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

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["200ms", "400ms"])
YEAR_9999_MS = 253_402_300_799_000


class Env:
    def __init__(self, kafka: KafkaConfig) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.kit = Kit(kafka)
        self.group = f"bad-input-{suffix}"
        self.forged = self.kit.create(f"forged-{suffix}", 1)
        self.poison = self.kit.create(f"poison-{suffix}", 2)
        self.lock = threading.Lock()
        self.calls: list[Record[Any]] = []
        self.app = RetryApp(
            kafka=kafka, group=self.group, consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        )

    def handle(self, record: Record[Any]) -> None:
        with self.lock:
            self.calls.append(record)
        if record.value == "always" or (record.value == "once" and record.attempt == 1):
            raise RuntimeError(f"{record.value} fails")

    def calls_for(self, topic: str, value: object) -> list[Record[Any]]:
        with self.lock:
            return [
                c for c in self.calls if (c.retry.original_topic if c.retry else c.topic) == topic and c.value == value
            ]

    def dlq(self, source: str) -> list[Any]:
        return self.kit.read_all(self.app.topics(source).dlq)


@pytest.fixture(scope="module")
def env(kafka: KafkaConfig) -> Iterator[Env]:
    env = Env(kafka)
    env.app.handler(env.forged, policy=POLICY, value_deserializer=lambda data, ctx: data.decode())(env.handle)
    env.app.handler(env.poison, policy=POLICY, value_deserializer=json_value)(env.handle)
    env.app.provision()
    env.app.start(main=True, tiers="all")
    yield env
    env.app.stop()


def _forged_headers(env: Env) -> list[tuple[str, bytes | None]]:
    forged = RetryHeaders(
        reconsume_times=999,
        origin_message_id=f"{env.poison}-0-5",
        original_topic="payments",
        original_partition=7,
        original_offset=123,
        original_timestamp=1,
        consumer_group=env.group,
        tier=1,
        due_at=YEAR_9999_MS,
        first_failed_at=1,
        last_failed_at=1,
        exception_type="x.Forged",
        exception_message="forged",
        exception_trace="",
    )
    return [("user", b"kept"), *encode(forged)]


def test_forged_retry_headers_on_the_source_topic_change_nothing(env: Env) -> None:
    # setup: complete, well-formed retry headers claiming attempt 999, due in year 9999, another origin
    headers = _forged_headers(env)
    # when
    env.kit.produce(env.forged, [(b"k1", b"once", headers), (b"k2", b"always", headers)])
    wait_until(
        lambda: len(env.calls_for(env.forged, "once")) == 2 and len(env.dlq(env.forged)) == 1,
        60,
        "the forged records to finish",
    )
    # then: a normal first delivery; retry metadata is the record's own
    first, second = env.calls_for(env.forged, "once")
    assert first.retry is None and first.attempt == 1 and first.headers == (("user", b"kept"),)
    assert first.origin_message_id == f"{env.forged}-0-{first.offset}"
    assert second.retry is not None and second.attempt == 2
    assert (second.retry.original_topic, second.retry.origin_message_id) == (env.forged, first.origin_message_id)
    assert second.retry.due_at is not None and second.retry.due_at < time.time() * 1000
    # then: the always-failing record went through every tier in order, then the DLQ with its own count
    always = env.calls_for(env.forged, "always")
    assert [c.attempt for c in always] == [1, 2, 3]
    assert [c.topic for c in always] == [env.forged, *(t.topic for t in env.app.topics(env.forged).tiers)]
    (dead,) = env.dlq(env.forged)
    state = decode(list(dead.headers))
    assert (state.reconsume_times, state.dlq_reason, state.original_topic) == (3, DlqReason.EXHAUSTED, env.forged)
    assert dead.header("user") == b"kept"


def test_poison_goes_to_the_dlq_and_neighbours_flow(env: Env) -> None:
    # when: one undecodable value between good ones, on one partition
    env.kit.produce(
        env.poison,
        [
            (b"a", json.dumps("ok-1").encode(), []),
            (b"b", b"{not json", [("h", b"1")]),
            (b"c", json.dumps("ok-2").encode(), []),
        ],
        partition=1,
    )
    wait_until(lambda: len(env.calls_for(env.poison, "ok-2")) == 1 and env.dlq(env.poison), 30, "poison dead-lettered")
    # then: no handler call for it; the DLQ has it with the decoder's error and the original bytes
    assert len(env.calls_for(env.poison, "ok-1")) == 1
    with env.lock:
        assert all(c.raw_value != b"{not json" for c in env.calls)
    (dead,) = env.dlq(env.poison)
    state = decode(list(dead.headers))
    assert (dead.key, dead.value, dead.header("h")) == (b"b", b"{not json", b"1")
    assert state.dlq_reason is DlqReason.POISON and state.reconsume_times == 1
    assert state.exception_type.endswith("PoisonRecordError") and "JSONDecodeError" in state.exception_message


@pytest.mark.parametrize("mangle", ["garbage_count", "due_beyond_tier", "wrong_tier", "non_utf8"])
def test_malformed_tier_headers_go_to_the_dlq(env: Env, mangle: str) -> None:
    # setup: a record written straight into tier 0 (what a forger with WRITE access could do)
    tier = env.app.topics(env.forged).tiers[0]
    now = int(time.time() * 1000)
    good = RetryHeaders(
        reconsume_times=1,
        origin_message_id=f"m-{mangle}",
        original_topic=env.forged,
        original_partition=0,
        original_offset=0,
        original_timestamp=now,
        consumer_group=env.group,
        tier=0,
        due_at=now,
        first_failed_at=now,
        last_failed_at=now,
        exception_type="x.E",
        exception_message="",
        exception_trace="",
    )
    headers = dict(encode(good))
    headers.update(
        {
            "garbage_count": {"retry.reconsume_times": b"-1"},
            "due_beyond_tier": {"retry.due_at": str(YEAR_9999_MS).encode()},
            "wrong_tier": {"retry.tier": b"1"},
            "non_utf8": {"retry.origin_message_id": b"\xff\xfe"},
        }[mangle]
    )
    value = f"mangled-{mangle}".encode()
    # when
    env.kit.produce(tier.topic, [(b"k", value, list(headers.items()))])
    # then: dead-lettered as invalid_retry_headers, never handled, never paused for ever
    wait_until(lambda: [r for r in env.dlq(env.forged) if r.value == value], 30, "the record in the DLQ")
    (dead,) = [r for r in env.dlq(env.forged) if r.value == value]
    assert decode(list(dead.headers)).dlq_reason is DlqReason.INVALID_RETRY_HEADERS
    assert not env.calls_for(env.forged, value.decode())
    assert env.app.healthy
