"""Key-ordered retries with `exactly_once=True` on the in-memory broker (docs/key-ordering.md, section 8): the
main consumer and the tier consumers put follower hops, key-state records and offsets in one transaction per
batch.

Guarantees, proven by the per-key ledger of `test_key_order_ledger` (every handler call and DLQ write) and by
what a read_committed reader sees: for every key and source partition, no record is handled before every
earlier record of its key is terminal; every record is accounted for, handled successfully or in the DLQ,
never both; each retried hop is in its tier once and each dead letter in the DLQ once (no duplicate committed
outcome); the group's committed offsets reach the end of the source. Under both `dead_head` policies, and when
a transaction holding heads' hops and their chain records aborts: the key state is rebuilt from the topic, the
batch is read again, and nothing is lost or reordered.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from retrytopics import KafkaConfig, KeyOrdering, NonRetryable, Record, RetryApp
from retrytopics.core.headers import decode
from retrytopics.core.keyorder.follower import decode_follower
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..kit import eventually
from .test_key_order_ledger import (
    KEYS,
    PARTITIONS,
    PER_KEY,
    POLICY,
    Ledger,
    build,
    check,
    dead_letters,
    produce,
    terminal,
)


class Aborts:
    """How many transactions the app's consumers aborted."""

    wanted_events = frozenset({Event.TRANSACTION_ABORTED})

    def __init__(self) -> None:
        self.count = 0

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.count += 1


def retried_hops(broker: MemoryBroker, app: RetryApp) -> Counter[tuple[str, int, int, int]]:
    """The retried records (not followers) in the tiers as a read_committed reader sees them: (tier, source
    partition and offset, attempt) -> copies."""
    hops: Counter[tuple[str, int, int, int]] = Counter()
    for tier in app.topics("orders").tiers:
        for msg in broker.records(tier.topic):
            if decode_follower(list(msg.headers)) is None:
                state = decode(list(msg.headers))
                hops[(tier.topic, state.original_partition, state.original_offset, state.reconsume_times)] += 1
    return hops


def run_to_the_end(broker: MemoryBroker, app: RetryApp, ledger: Ledger) -> None:
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: terminal(ledger, dead_letters(broker, app)), timeout_s=60)
        eventually(lambda: sum(broker.committed("billing").values()) == KEYS * PER_KEY, timeout_s=30)
    finally:
        assert app.stop(30)
    assert app.error is None


@pytest.mark.parametrize("dead_head", ["release", "dead_letter"])
def test_exactly_once_every_key_is_handled_in_order_and_every_outcome_is_committed_once(dead_head: str) -> None:
    """Many keys over three partitions, failing once, several times, or to the DLQ, exactly-once: the ledger
    holds the guarantee with no handler call repeated, each retried hop and dead letter is committed once, and
    followers ran in the tiers."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    aborts = Aborts()
    app = build(broker, ledger, dead_head, hooks=[aborts], exactly_once=True)
    produce(broker, range(PER_KEY))
    run_to_the_end(broker, app, ledger)

    check(ledger, dead_letters(broker, app), dead_head)
    calls = Counter((key, seq, what) for what, key, seq, _ in ledger.events if what == "ok")
    assert aborts.count == 0 and all(n == 1 for n in calls.values()), "no transaction aborted: no call repeated"
    hops = retried_hops(broker, app)
    assert hops and all(n == 1 for n in hops.values()), f"hops committed twice: {hops}"


def test_an_aborted_transaction_with_heads_in_it_rebuilds_the_key_state_and_loses_nothing() -> None:
    """The first hop to tier 0 fails, so the main consumer's transaction holding it (heads' hops, their chain
    records, followers behind them) aborts while keys are blocked in memory. The key state is rebuilt from the
    topic and the batch read again: the heads are handled again and handed off, not taken for records already
    behind a chain; the ledger holds, every record is accounted for, and each hop is committed once."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    ledger = Ledger()
    aborts = Aborts()
    app = build(broker, ledger, "release", hooks=[aborts], exactly_once=True)
    produce(broker, range(PER_KEY))
    broker.fail_produces(1, "INVALID_RECORD", topic=app.topics("orders").tiers[0].topic)
    run_to_the_end(broker, app, ledger)

    assert aborts.count >= 1
    check(ledger, dead_letters(broker, app), "release", repeats=True)
    hops = retried_hops(broker, app)
    assert hops and all(n == 1 for n in hops.values()), f"hops committed twice: {hops}"


def test_a_record_behind_a_head_dead_lettered_at_once_waits_for_the_dead_letter_to_commit() -> None:
    """Exactly-once, one partition, one poll: a key's first record is dead-lettered at once (non-retryable) and
    its second record comes right behind it. The second is handled only once the dead letter is committed (an
    abort would run the first again, after it): the main consumer stops the partition at it, without parking,
    and reads it again after the commit. Both records are accounted for: one in the DLQ, one handled."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    seen: list[str] = []
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        exactly_once=True,
        on_dead_letter=lambda record, route: seen.append(f"dlq {record.value.decode()}"),
    )

    @app.handler("orders", policy=POLICY, ordering=KeyOrdering())
    def handle(record: Record[bytes]) -> None:
        seen.append(f"call {record.value.decode()}")
        if record.value == b"first":
            raise NonRetryable(ValueError("malformed"))

    app.provision(partitions=1)
    for value in (b"first", b"second", b"other"):
        broker.append("orders", value, key=b"acct-9" if value != b"other" else b"acct-1", partition=0)
    app.start(main=True)
    try:
        eventually(lambda: "call second" in seen and broker.committed("billing") == {("orders", 0): 3})
    finally:
        assert app.stop(30)
    assert app.error is None
    assert seen.index("dlq first") < seen.index("call second"), seen
    assert seen.count("call first") == seen.count("call second") == 1
    [dead] = broker.records(app.topics("orders").dlq)
    assert dead.value == b"first" and str(decode(list(dead.headers)).dlq_reason) == "non_retryable"


def test_a_follower_too_large_for_its_tier_is_dead_lettered_after_its_transaction_aborts_alone() -> None:
    """Exactly-once: a head fails twice (tier 0, then tier 1); the follower behind it is too large for tier 1.
    Its refusal fails the transaction it was in (aborted, read again); sent alone it is refused again, and the
    next attempt dead-letters it unhandled as `blocked_by_key`, naming the refusal. The key's next record still
    waits behind the head: its first call comes after the head's success. Nothing else is lost."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    calls: list[tuple[bytes, int]] = []
    aborts = Aborts()

    def handle(record: Record[bytes]) -> None:
        calls.append((record.value[:1], record.attempt))
        if record.value == b"head" and record.attempt < 3:
            raise RuntimeError("the head fails twice")

    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        exactly_once=True,
        hooks=[aborts],
    )
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

    assert aborts.count >= 2, "refused in its transaction, then refused alone"
    assert calls.index((b"h", 3)) < calls.index((b"t", 1)) and (b"b", 1) not in calls
    [dead] = broker.records(topics.dlq)
    headers = decode(list(dead.headers))
    assert (dead.value, headers.dlq_reason, headers.original_offset) == (b"b" * 32_000, "blocked_by_key", 1)
    assert headers.exception_message.startswith(f"behind orders-0-0 (its hop to {topics.tiers[1].topic} was refused")
