"""Signed key state on Apache Kafka (docs/key-ordering.md, section 9).

Guarantee: with `RetryApp(header_key=...)`, a key-ordered app's key-state records are signed, and records that a
writer on `<source>.<group>.keys` forges (unsigned, or signed with another key) are refused and counted
(`key_state.refused`), whether the main consumer reads them when its partitions are assigned or live:

- a forged chain record (head = frontier = 0) of a key with no failure does not block it: the key's next record
  is handled on the main consumer, not handed off behind a head that never was;
- a forged chain tombstone (read at assignment) and a forged passage that says the frontier succeeded (read
  live) do not release a blocked key: its next record is handed off behind its head, never handled before it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import Event, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import Chain, Closed, Fate, Passage, encode_record
from retrytopics.core.signing import HeaderKeys, sign_state, verify_state

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

KEY = "a key-state test key of at least 32 bytes, never logged"
OTHER_KEY = "another key of at least 32 bytes that the app does not hold"


class _Watch:
    """The values the handler saw, and the refused key-state records and releases the app reported."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled: list[str] = []
        self.forged = 0
        self.released = 0

    def handle(self, record: Record[bytes]) -> None:
        value = record.value.decode()
        with self.lock:
            self.handled.append(value)
        if value == "B0":
            raise RuntimeError("the head of key B fails")

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            if event is Event.KEY_STATE_REFUSED:
                forged = data.get("forged")
                self.forged += forged if isinstance(forged, int) else 0
            elif event is Event.KEY_ORDER_RELEASED:
                self.released += 1

    def saw(self, value: str) -> bool:
        with self.lock:
            return value in self.handled


def _followers(kit: Kit, tier: str) -> dict[str, int]:
    """The followers in `tier`: value -> the source offset each waits behind."""
    return {
        r.value.decode(): int(after)
        for r in kit.read_all(tier)
        if r.value is not None and (after := r.header("retry.key_order.after")) is not None
    }


def test_forged_key_state_records_are_refused_and_counted_on_apache_kafka(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
) -> None:
    source, group = kit.create(unique_name("orders"), 1), unique_name("billing")
    watch = _Watch()

    def build() -> RetryApp:
        app = RetryApp(kafka=kafka, group=group, header_key=KEY, consumer_overrides=consumer_overrides, hooks=[watch])
        app.handler(source, policy=RetryPolicy(delays=["200ms"], max_retries=3), ordering=KeyOrdering())(watch.handle)
        apps.append(app)
        return app

    def produce(*values: str) -> None:
        kit.produce(source, [(f"acct-{v[0]}".encode(), v.encode(), []) for v in values], partition=0)

    # key B blocked for real: its head B0 (offset 0) went to the first tier, whose consumers never run here
    first = build()
    topics = first.topics(source)
    state_topic, tier = topics.key_state_topic, topics.tiers[0].topic
    first.provision()
    produce("B0")
    first.start(main=True)
    chain_b = ChainKey(source, 0, key_id(b"acct-B"))
    chain_key = encode_record(Chain(chain=chain_b, head=0, frontier=0, at_tier=0, followers=0, since_ms=0))[0]
    genuine = wait_until(
        lambda: [r for r in kit.read_all(state_topic) if r.key == chain_key], 60, "key B's chain record written"
    )
    assert verify_state(HeaderKeys.of(KEY), state_topic, genuine[0].key, genuine[0].value, genuine[0].headers) is None
    assert first.stop(30) and first.error is None

    # forged at rest, read when the partition is assigned: key B's chain tombstone (unsigned), a chain record
    # blocking key K (unsigned) and one blocking key J (signed with a key the app does not hold)
    wrong = HeaderKeys.of(OTHER_KEY)
    tombstone = encode_record(Closed(chain=chain_b))[0]
    forged_k, forged_j = (
        encode_record(
            Chain(chain=ChainKey(source, 0, key_id(key)), head=0, frontier=0, at_tier=0, followers=0, since_ms=0)
        )[:2]
        for key in (b"acct-K", b"acct-J")
    )
    kit.produce(
        state_topic,
        [
            (tombstone, None, []),
            (forged_k[0], forged_k[1], []),
            (forged_j[0], forged_j[1], [sign_state(wrong, state_topic, forged_j[0], forged_j[1])]),
        ],
        partition=0,
    )
    second = build()
    second.start(main=True)
    produce("B1", "K0", "J0", "S1")
    wait_until(lambda: watch.saw("S1"), 60, "the records after the forgeries acted on")
    assert not watch.saw("B1"), "a forged tombstone released key B: its record ran before its head"
    assert watch.saw("K0") and watch.saw("J0"), "a forged chain record blocked a key"
    wait_until(lambda: _followers(kit, tier).get("B1") == 0, 60, "B1 handed off behind its head B0")
    assert watch.forged >= 3

    # forged live: a passage saying key B's frontier succeeded in the first tier, read by the main consumer's
    # key-state feed while it runs
    chain = max(
        (r for r in kit.read_all(state_topic) if r.key == chain_key and r.value is not None), key=lambda r: r.offset
    )
    frontier = int(json.loads(chain.value or b"{}")["frontier"])
    passage = encode_record(Passage(tier=0, chain=chain_b, seen=frontier, fate=Fate.SUCCEEDED))
    refused_before = watch.forged
    kit.produce(state_topic, [(passage[0], passage[1], [])], partition=0)
    wait_until(lambda: watch.forged > refused_before or watch.released, 60, "the forged passage read live")
    produce("B2", "S2")
    wait_until(lambda: watch.saw("S2"), 60, "the records after the forged passage acted on")
    assert not watch.released and not watch.saw("B2"), "a forged passage released key B"
    wait_until(lambda: "B2" in _followers(kit, tier), 60, "B2 handed off behind key B's frontier")
    assert second.stop(30) and second.error is None
