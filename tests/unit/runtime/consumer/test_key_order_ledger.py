"""Key-ordered retries end to end on the in-memory broker: a `RetryApp` running its main consumer and its tier
consumers (threads), many keys, some records failing once, some several times, some dead-lettered.

Guarantee, proven by a per-key ledger of every handler call (key, source offset, outcome) and of every DLQ
write: for every key and source partition, no record is handled before every earlier record of its key is
terminal (handled successfully, or in the DLQ); every record is accounted for (handled successfully, or in the
DLQ with its reason: `blocked_by_key` only under `dead_head="dead_letter"`, for records behind a dead-lettered
one); keys that never fail are never held (each of their records is handled once, on the main consumer).
Under both `dead_head` policies, and across a restart of the whole app while keys are blocked.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from retrytopics import KafkaConfig, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.core.headers import decode
from retrytopics.observe.events import Event
from retrytopics.observe.metrics import PrometheusHook
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..kit import eventually

POLICY = RetryPolicy(delays=["50ms", "100ms"], max_retries=3)
KEYS = 24
PER_KEY = 6
PARTITIONS = 3


def failures_of(key: int, seq: int) -> int:
    """How many times the handler fails on record `seq` of key `key` (99: it is dead-lettered, exhausted)."""
    if key % 4 == 0:
        return 0  # keys that never fail
    if key % 4 == 1:
        return 1 if seq % 2 == 0 else 0
    if key % 4 == 2:
        return 3 if seq == 1 else 0
    return 99 if seq == 2 else (1 if seq == 4 else 0)


class Ledger:
    """Every handler call and DLQ write, in the order they happened (one lock: several consumer threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: (what, key, seq, a follower's call: in a tier, never failed before); what: ok, fail or dlq
        self.events: list[tuple[str, int, int, bool]] = []
        self.attempts: dict[tuple[int, int], int] = {}

    def handle(self, record: Record[bytes]) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        follower = record.retry is None and ".retry." in threading.current_thread().name  # a tier consumer's thread
        with self.lock:
            n = self.attempts[(key, seq)] = self.attempts.get((key, seq), 0) + 1
            failed = n <= failures_of(key, seq)
            self.events.append(("fail" if failed else "ok", key, seq, follower))
        if failed:
            raise RuntimeError(f"key {key} record {seq} fails ({n})")

    def dead_lettered(self, record: Record[bytes], route: Any) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        with self.lock:
            self.events.append(("dlq", key, seq, False))


def build(
    broker: MemoryBroker, ledger: Ledger, dead_head: str, hooks: Sequence[Any] = (), *, exactly_once: bool = False
) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        on_dead_letter=ledger.dead_lettered,
        hooks=list(hooks),
        exactly_once=exactly_once,
    )
    app.handler("orders", policy=POLICY, ordering=KeyOrdering(dead_head=dead_head))(ledger.handle)
    app.provision(partitions=PARTITIONS)
    return app


def produce(broker: MemoryBroker, seqs: range) -> None:
    """Records `seq` of every key, interleaved across keys, keyed so that a key stays in one partition."""
    for seq in seqs:
        for key in range(KEYS):
            broker.append("orders", f"{key}:{seq}".encode(), key=f"acct-{key}".encode(), partition=key % PARTITIONS)


def terminal(ledger: Ledger, dlq: dict[tuple[int, int], str]) -> bool:
    with ledger.lock:
        ok = {(k, s) for what, k, s, _ in ledger.events if what == "ok"}
    return all((k, s) in ok or (k, s) in dlq for k in range(KEYS) for s in range(PER_KEY))


def dead_letters(broker: MemoryBroker, app: RetryApp) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for msg in broker.records(app.topics("orders").dlq):
        assert msg.value is not None
        key, seq = (int(part) for part in msg.value.decode().split(":"))
        assert (key, seq) not in out, "each record is dead-lettered once"
        out[(key, seq)] = str(decode(list(msg.headers)).dlq_reason)
    return out


def check(ledger: Ledger, dlq: dict[tuple[int, int], str], dead_head: str, *, repeats: bool = False) -> None:
    """The ledger's guarantees (see the module docstring); `repeats`: calls may repeat (at-least-once, a
    partition changed hands before its commit)."""
    done: set[tuple[int, int]] = set()  # terminal so far, in ledger order
    for what, key, seq, _ in ledger.events:
        if what in ("ok", "fail"):
            earlier = [(key, s) for s in range(seq) if (key, s) not in done]
            assert not earlier, f"key {key} record {seq} handled before {earlier} were terminal"
        if what in ("ok", "dlq"):
            done.add((key, seq))
    ok = {(k, s) for what, k, s, _ in ledger.events if what == "ok"}
    every = {(k, s) for k in range(KEYS) for s in range(PER_KEY)}
    both = {r: dlq[r] for r in ok & set(dlq)}
    assert ok | set(dlq) == every and not both, f"handled or dead-lettered, not both: {both}, {every - ok - set(dlq)}"
    exhausted = {(k, 2) for k in range(KEYS) if k % 4 == 3}
    assert {r for r, reason in dlq.items() if reason == "exhausted"} == exhausted
    blocked = {r for r, reason in dlq.items() if reason == "blocked_by_key"}
    if dead_head == "release":
        assert not blocked
    else:  # only records that waited behind a dead-lettered one, each after its own key's exhausted record
        assert blocked and all(k % 4 == 3 and s > 2 for k, s in blocked)
    clean = [e for e in ledger.events if e[1] % 4 == 0]
    handled = sorted((k, s) for _, k, s, _ in clean)
    assert (sorted(set(handled)) if repeats else handled) == [(k, s) for k in range(0, KEYS, 4) for s in range(PER_KEY)]
    assert not any(follower for *_, follower in clean), "a key that never failed was never held"
    assert any(follower and what == "ok" for what, *_, follower in ledger.events), "followers ran in tiers"


@pytest.mark.parametrize("dead_head", ["release", "dead_letter"])
def test_every_key_is_handled_in_order_and_every_record_is_accounted_for(dead_head: str) -> None:
    """Many keys over three partitions, failing once, several times, or to the DLQ: the ledger holds the
    guarantee, and both the main consumer and the tier consumers took part (followers were handled in tiers).
    The metrics count the followers, and every partition's blocked keys go back to 0 once all is terminal."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    metrics = PrometheusHook()
    app = build(broker, ledger, dead_head, hooks=[metrics])
    produce(broker, range(PER_KEY))
    app.start(main=True, tiers="all")

    def blocked(partition: int) -> float | None:
        return metrics.registry.get_sample_value(
            "retrytopics_key_order_blocked_keys", {"topic": "orders", "partition": str(partition)}
        )

    try:
        eventually(lambda: terminal(ledger, dead_letters(broker, app)), timeout_s=60)
        eventually(lambda: all(blocked(p) == 0 for p in range(PARTITIONS)), timeout_s=30)
        followers = metrics.registry.get_sample_value("retrytopics_key_order_followers_total", {"topic": "orders"})
        assert followers is not None and followers > 0
    finally:
        assert app.stop(30)
    assert app.error is None
    check(ledger, dead_letters(broker, app), dead_head)


def test_a_restarted_app_keeps_the_blocked_keys_blocked() -> None:
    """The app stops while keys are blocked (their first records failing in tiers); a new app on the same
    topics handles the keys' later records only behind them: the ledger holds across the restart."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    first = build(broker, ledger, "release")
    produce(broker, range(3))
    first.start(main=True)  # no tier consumers: the heads stay in their tiers
    eventually(lambda: broker.committed("billing") and sum(broker.committed("billing").values()) == KEYS * 3)
    assert first.stop(30) and first.error is None

    produce(broker, range(3, PER_KEY))
    second = build(broker, ledger, "release")
    second.start(main=True, tiers="all")
    try:
        eventually(lambda: terminal(ledger, dead_letters(broker, second)), timeout_s=60)
    finally:
        assert second.stop(30)
    assert second.error is None
    check(ledger, dead_letters(broker, second), "release")


def test_a_second_instance_joining_while_keys_are_blocked_keeps_the_order() -> None:
    """A second app instance of the same group joins while keys are blocked (heads in tiers, followers behind
    them): the partitions and tier partitions it takes over are rebuilt from the key-state topic, and the
    ledger still holds across both instances; nothing is lost."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    first = build(broker, ledger, "release")
    produce(broker, range(PER_KEY))
    first.start(main=True, tiers="all")
    joined = Assignments()
    second = build(broker, ledger, "release", hooks=[joined])
    try:
        eventually(lambda: any(what == "fail" for what, *_ in ledger.events))
        second.start(main=True, tiers="all")
        eventually(lambda: terminal(ledger, dead_letters(broker, first)), timeout_s=60)
    finally:
        assert second.stop(30) and first.stop(30)
    assert first.error is None and second.error is None
    assert ("orders", 0) in joined.partitions or ("orders", 1) in joined.partitions, "the second took a partition"
    check(ledger, dead_letters(broker, first), "release", repeats=True)


class Assignments:
    """The partitions an app's consumers were assigned."""

    wanted_events = frozenset({Event.PARTITIONS_ASSIGNED})

    def __init__(self) -> None:
        self.partitions: set[tuple[str, int]] = set()

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.partitions.update(tuple(tp) for tp in data["partitions"])  # type: ignore[attr-defined]


def test_a_follower_too_large_for_the_tier_its_head_moved_to_is_dead_lettered_and_the_next_follows_the_head() -> None:
    """A head fails twice (tier 0, then tier 1); the follower behind it is too large for tier 1, whose
    `max.message.bytes` is small: the tier that would forward it (or the main consumer, had it learnt the move
    first) dead-letters it unhandled as `blocked_by_key`, naming the refusal, and the key's next record still
    waits behind the head: it is handled after the head's success, in tier 1. Nothing else is lost."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    lock = threading.Lock()
    calls: list[tuple[bytes, int]] = []

    def handle(record: Record[bytes]) -> None:
        with lock:
            calls.append((record.value[:1], record.attempt))
        if record.value == b"head" and record.attempt < 3:
            raise RuntimeError("the head fails twice")

    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=MemoryClientFactory(broker))
    app.handler("orders", policy=POLICY, ordering=KeyOrdering())(handle)
    app.provision(partitions=1)
    topics = app.topics("orders")
    broker.max_message_bytes[topics.tiers[1].topic] = 16_000
    for value in (b"head", b"b" * 32_000, b"tail"):
        broker.append("orders", value, key=b"acct-1", partition=0)
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: (b"t", 1) in calls and broker.records(topics.dlq), timeout_s=30)
    finally:
        assert app.stop(30)
    assert app.error is None

    assert calls == [(b"h", 1), (b"h", 2), (b"h", 3), (b"t", 1)]
    [dead] = broker.records(topics.dlq)
    headers = decode(list(dead.headers))
    assert (dead.value, headers.dlq_reason, headers.original_offset) == (b"b" * 32_000, "blocked_by_key", 1)
    assert (
        headers.exception_message == f"behind orders-0-0 (its hop to {topics.tiers[1].topic} was refused as too large)"
    )
