"""Signed retry headers and a bounded wait on a real broker.

Guarantees:
- With `RetryApp(header_key=...)`, a tier record written by a plain producer (valid headers, but no signature
  or one made with another key) goes to the DLQ as `invalid_retry_headers` naming the signature, a forged hop
  in a tier's tail does not mark its source record as handed off (it is handled, not silently skipped), and
  legitimate records retry and succeed or dead-letter as usual, signed, with every id accounted for.
- A tier record whose forged `retry.due_at` lies 50 s beyond its 1 s tier (inside the clock-skew allowance the
  header checks accept) is handled within about the tier's delay, not after 50 s, while the legitimate
  records around it are still never handled before their due time.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, RetryHeaders, decode, encode
from retrytopics.core.signing import HeaderKeys, sign, verify

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

KEY = "a test key of at least 32 bytes, never logged"
OVERRIDES = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, int | None, int]] = []  # value, attempt, due_at, handled_at

    def handle(self, record: Record[Any]) -> None:
        with self.lock:
            self.seen.append(
                (record.value, record.attempt, record.retry.due_at if record.retry else None, int(time.time() * 1000))
            )
        if record.value == "always" or (record.value.startswith("once") and record.attempt == 1):
            raise RuntimeError(f"{record.value} fails")

    def of(self, value: str) -> list[tuple[str, int, int | None, int]]:
        with self.lock:
            return [c for c in self.seen if c[0] == value]


def _state(
    source: str, group: str, offset: int, *, now: int, last_failed_at: int | None = None, due_at: int | None = None
) -> RetryHeaders:
    failed = now if last_failed_at is None else last_failed_at
    return RetryHeaders(
        reconsume_times=1,
        origin_message_id=f"{source}-0-{offset}",
        original_topic=source,
        original_partition=0,
        original_offset=offset,
        original_timestamp=now,
        consumer_group=group,
        tier=0,
        due_at=failed if due_at is None else due_at,
        first_failed_at=failed,
        last_failed_at=failed,
        exception_type="x.Forged",
        exception_message="forged",
        exception_trace="",
    )


def test_with_a_key_forged_tier_records_are_dead_lettered_and_legit_records_flow(
    kafka: KafkaConfig, kit: Kit, apps: list[RetryApp]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source, group = kit.create(f"signed-{suffix}", 1), f"signed-{suffix}"
    calls = Calls()
    app = RetryApp(kafka=kafka, group=group, header_key=KEY, consumer_overrides=OVERRIDES)
    app.handler(
        source, policy=RetryPolicy(delays=["300ms"], max_retries=1), value_deserializer=lambda data, ctx: data.decode()
    )(calls.handle)
    app.provision()
    topics = app.topics(source)
    tier = topics.tiers[0].topic
    # setup: source records 0..2, and, before the app starts, three forged records in the tier written by a
    # plain producer: a hop naming source record 0 (to make it look handed off already), the same without a
    # signature, and one signed with another key
    kit.produce(source, [(b"k0", b"once-0", []), (b"k1", b"always", []), (b"k2", b"ok", [])])
    now = int(time.time() * 1000)
    hop = encode(_state(source, group, 0, now=now))
    other = HeaderKeys.of("somebody else's key, 32 bytes long")
    kit.produce(
        tier,
        [
            (b"k0", b"once-0", list(hop)),  # forged hop, unsigned
            (b"f1", b"forged-unsigned", list(encode(_state(source, group, 91, now=now)))),
            (
                b"f2",
                b"forged-wrong-key",
                list(sign(other, tier, b"f2", b"forged-wrong-key", encode(_state(source, group, 92, now=now)))),
            ),
        ],
    )
    # when
    apps.append(app)
    app.start(main=True, tiers="all")
    wait_until(lambda: len(kit.read_all(topics.dlq)) >= 4, 60, "four DLQ records")
    dead = kit.read_all(topics.dlq)
    wait_until(lambda: len(calls.of("once-0")) >= 2, 30, "once-0 retried")
    # then: the forged hop did not make source record 0 be skipped: it was handled, failed, retried, succeeded
    assert [c[1] for c in calls.of("once-0")] == [1, 2]
    assert [c[1] for c in calls.of("ok")] == [1]
    assert [c[1] for c in calls.of("always")] == [1, 2]
    assert not calls.of("forged-unsigned") and not calls.of("forged-wrong-key")  # never handled
    # and: every forged record is in the DLQ as invalid_retry_headers naming the signature; the legit one exhausted
    by_value = {d.value: d for d in dead}
    assert sorted(by_value) == [b"always", b"forged-unsigned", b"forged-wrong-key", b"once-0"] and len(dead) == 4
    for value, why in ((b"once-0", b"missing"), (b"forged-unsigned", b"missing"), (b"forged-wrong-key", b"wrong")):
        record = by_value[value]
        assert record.header("retry.dlq_reason") == DlqReason.INVALID_RETRY_HEADERS.value.encode()
        assert b"retry.signature" in (record.header("retry.exception_message") or b"")
        assert why in (record.header("retry.exception_message") or b"")
    assert by_value[b"always"].header("retry.dlq_reason") == b"exhausted"
    # and: everything the app wrote is signed for the topic it is on, and nothing logged the key
    keys = HeaderKeys.of(KEY)
    for record in [*dead, *(r for r in kit.read_all(tier) if r.value in (b"always",))]:
        assert verify(keys, record.topic, record.key, record.value, record.headers) is None, record
    assert decode(list(by_value[b"always"].headers)).reconsume_times == 2


def test_a_forged_due_time_holds_its_partition_for_about_one_tier_delay(
    kafka: KafkaConfig, kit: Kit, apps: list[RetryApp]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source, group = kit.create(f"skew-{suffix}", 1), f"skew-{suffix}"
    calls = Calls()
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=OVERRIDES)
    app.handler(source, policy=RetryPolicy(delays=["1s"]), value_deserializer=lambda data, ctx: data.decode())(
        calls.handle
    )
    app.provision()
    tier = app.topics(source).tiers[0].topic
    apps.append(app)
    app.start(main=True, tiers="all")
    # setup: a legit record A in the tier, then a forged record due 1 s + 50 s from now (its failure time 50 s
    # ahead, inside the 60 s skew allowance), then a legit record B behind it
    kit.produce(source, [(b"a", b"once-a", [])])
    wait_until(lambda: calls.of("once-a"), 30, "A's first call")
    now = int(time.time() * 1000)
    forged = _state(source, group, 77, now=now, last_failed_at=now + 50_000, due_at=now + 51_000)
    kit.produce(tier, [(b"f", b"forged-late", list(encode(forged)))])
    produced_at = time.monotonic()
    kit.produce(source, [(b"b", b"once-b", [])])
    # when
    wait_until(lambda: calls.of("forged-late"), 30, "the forged record handled (it was due 51 s out)")
    waited_s = time.monotonic() - produced_at
    wait_until(lambda: len(calls.of("once-a")) >= 2 and len(calls.of("once-b")) >= 2, 30, "A and B retried")
    # then: the forged record cost about one tier delay (generous bound, far under the old 51 s)
    assert waited_s < 20, waited_s
    # and: no legit retry ran before its due time, and B (behind the forged record) was not held 50 s either
    for value in ("once-a", "once-b"):
        first, retry = calls.of(value)[:2]
        assert retry[1] == 2 and retry[2] is not None and retry[3] >= retry[2], (value, retry)
        assert retry[3] - first[3] < 20_000
