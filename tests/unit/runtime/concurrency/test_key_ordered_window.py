"""Key-ordered retries with handler concurrency on the in-memory broker: a `RetryApp` whose key-ordered
handler runs with `concurrency=50`, its main consumer and tier consumers (threads), many keys, records failing
once, several times, or to the DLQ.

Guarantee, proven by the per-key ledger of the key-order suite (tests/unit/runtime/consumer/
test_key_order_ledger.py): no record is handled before every earlier record of its key is terminal (0
inversions, through the tiers), every record is handled or dead-lettered, keys that never fail are never held;
and calls did run side by side. Key order is asked as each record starts, after the outcome of the call before
it was acted on: skipping that check breaks the ledger."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from retrytopics import Concurrency, KafkaConfig, KeyOrdering, OrderMode, Record, RetryApp
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.ports import Message
from retrytopics.runtime.keyorder.windowed import KeyOrderStarts
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.outcome import Outcome
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..consumer.test_key_order_ledger import (
    KEYS,
    PARTITIONS,
    PER_KEY,
    POLICY,
    Assignments,
    Ledger,
    check,
    dead_letters,
    produce,
)
from ..kit import eventually

CALLS = 50


class Overlap:
    """The most calls in flight at once, over every consumer (each call waits a little: the calls overlap)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __call__(self, record: Record[bytes]) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.002)
            self.ledger.handle(record)
        finally:
            with self.lock:
                self.now -= 1


def build(broker: MemoryBroker, handle: Overlap, ledger: Ledger, dead_head: str, hooks: Sequence[Any] = ()) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        on_dead_letter=ledger.dead_lettered,
        commit_every=1,
        hooks=list(hooks),
    )
    app.handler("orders", policy=POLICY, ordering=KeyOrdering(dead_head=dead_head), concurrency=CALLS)(handle)
    app.provision(partitions=PARTITIONS)
    return app


def every_record_terminal(ledger: Ledger, broker: MemoryBroker, app: RetryApp) -> bool:
    dlq = dead_letters(broker, app)
    with ledger.lock:
        ok = {(k, s) for what, k, s, _ in ledger.events if what == "ok"}
    return all((k, s) in ok or (k, s) in dlq for k in range(KEYS) for s in range(PER_KEY))


def run_ledger(dead_head: str) -> tuple[Ledger, Overlap, MemoryBroker, RetryApp]:
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    handle = Overlap(ledger)
    app = build(broker, handle, ledger, dead_head)
    produce(broker, range(PER_KEY))
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: every_record_terminal(ledger, broker, app), timeout_s=60)
    finally:
        assert app.stop(30)
    assert app.error is None
    return ledger, handle, broker, app


@pytest.mark.parametrize("dead_head", ["release", "dead_letter"])
def test_a_failing_keys_later_records_follow_it_through_the_tiers_while_other_keys_run(dead_head: str) -> None:
    ledger, handle, broker, app = run_ledger(dead_head)
    check(ledger, dead_letters(broker, app), dead_head)
    assert handle.most > 1, "calls ran side by side"


def test_a_second_instance_joining_mid_window_keeps_the_order() -> None:
    """A second app instance of the same group joins while calls are in flight and keys are blocked: the
    revoked partitions' calls are waited for (or abandoned), what waited in their windows never starts, and the
    ledger holds across both instances (calls may repeat: a partition changed hands before its commit)."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    first = build(broker, Overlap(ledger), ledger, "release")
    produce(broker, range(PER_KEY))
    first.start(main=True, tiers="all")
    joined = Assignments()
    second = build(broker, Overlap(ledger), ledger, "release", hooks=[joined])
    try:
        eventually(lambda: any(what == "fail" for what, *_ in ledger.events))
        second.start(main=True, tiers="all")
        eventually(lambda: every_record_terminal(ledger, broker, first), timeout_s=60)
    finally:
        assert second.stop(30) and first.stop(30)
    assert first.error is None and second.error is None
    assert any(("orders", p) in joined.partitions for p in range(PARTITIONS)), "the second took a partition"
    check(ledger, dead_letters(broker, first), "release", repeats=True)


def test_without_the_check_at_start_a_key_runs_ahead_of_its_failed_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ledger with key order's check at start skipped (every record called): a key's later record is
    handled while its failed one waits in a tier."""

    def call_every_record(
        self: KeyOrderStarts, binding: Binding, msg: Message, state: RetryHeaders | None
    ) -> Outcome | None:
        return None

    monkeypatch.setattr(KeyOrderStarts, "before_start", call_every_record)
    ledger, _, broker, app = run_ledger("release")
    with pytest.raises(AssertionError, match="handled before"):
        check(ledger, dead_letters(broker, app), "release")


def test_a_blocked_key_holds_only_its_own_records() -> None:
    """No tier consumer runs: the keys whose first record fails stay blocked (their heads in tier 0). Every
    record of the other keys is handled on the main consumer all the same, no later record of a blocked key
    is, and each partition is committed to its end (the blocked keys' records are handed off as followers)."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    calls: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handle(record: Record[bytes]) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        time.sleep(0.002)
        with lock:
            calls.append((key, seq))
        if key % 3 == 0 and seq == 0:
            raise RuntimeError("the head fails")

    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=MemoryClientFactory(broker), commit_every=1
    )
    app.handler("orders", policy=POLICY, ordering=KeyOrdering(), concurrency=CALLS)(handle)
    app.provision(partitions=PARTITIONS)
    produce(broker, range(PER_KEY))
    app.start(main=True)
    ends = {p: len([k for k in range(KEYS) if k % PARTITIONS == p]) * PER_KEY for p in range(PARTITIONS)}
    try:
        eventually(lambda: all(broker.committed("billing").get(("orders", p)) == n for p, n in ends.items()), 60)
    finally:
        assert app.stop(30)
    assert app.error is None
    blocked = {k for k in range(KEYS) if k % 3 == 0}
    assert sorted(calls) == sorted(
        [(k, s) for k in range(KEYS) for s in range(PER_KEY) if k not in blocked] + [(k, 0) for k in blocked]
    )


def test_key_order_with_no_order_in_the_window_is_refused_naming_the_field() -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    with pytest.raises(ConfigError) as refused:
        app.handler("orders", ordering=KeyOrdering(), concurrency=Concurrency(calls=8, order=OrderMode.NONE))(
            lambda record: None
        )
    assert refused.value.field == "concurrency.order"
