"""Key order on a tier consumer while a follower waits for its predecessor's hop (docs/key-ordering.md, sections
4 and 7), on the in-memory broker with slow acknowledgements (`ack_after_polls`), so that followers are read
while the hop they wait behind is still in flight.

Guarantee, proven by every handler call and every record the tier consumer fetched: a follower that waits for
its predecessor's acknowledgement waits in memory, so the records fetched behind it in its tier partition are
never fetched again (no partition stop and seek back); every key's records are still handled in their order,
each exactly once successfully.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from retrytopics import KafkaConfig, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.testing import MemoryBroker, MemoryClientFactory, MemoryConsumer

from ..kit import eventually

PER_KEY = 8
KEYS = (b"a", b"b", b"c")


def test_a_follower_awaiting_its_predecessors_hop_waits_in_memory_and_its_tier_partition_is_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every record of keys a, b and c fails its first attempt, so in the tier each released follower fails
    and goes back to it while the next one is read before that hop is acknowledged: each tier record is still
    fetched once, and each key's records succeed in order."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    broker.ack_after_polls = 3
    fetched: Counter[tuple[TopicPartition, int]] = Counter()
    consume = MemoryConsumer.consume

    def counting(self: MemoryConsumer, max_records: int, timeout_s: float) -> list[Message]:
        got = consume(self, max_records, timeout_s)
        fetched.update((m.tp, m.offset) for m in got if ".retry." in m.topic)
        return got

    monkeypatch.setattr(MemoryConsumer, "consume", counting)
    lock = threading.Lock()
    attempts: Counter[bytes] = Counter()
    succeeded: list[tuple[bytes, int]] = []

    def handle(record: Record[bytes]) -> None:
        assert record.key is not None
        with lock:
            attempts[record.raw_value or b""] += 1
            if attempts[record.raw_value or b""] == 1:
                raise RuntimeError("every record fails its first attempt")
            succeeded.append((record.key, int((record.raw_value or b"").split(b":")[1])))

    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=MemoryClientFactory(broker))
    app.handler("orders", policy=RetryPolicy(delays=["20ms"], max_retries=3), ordering=KeyOrdering())(handle)
    app.provision(partitions=1)
    for seq in range(PER_KEY):
        for key in KEYS:
            broker.append("orders", key + b":" + str(seq).encode(), key=key, partition=0)
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: len(succeeded) == len(KEYS) * PER_KEY, timeout_s=30)
    finally:
        app.stop()

    for key in KEYS:
        assert [seq for k, seq in succeeded if k == key] == list(range(PER_KEY)), f"key {key!r} out of order"
    assert all(n == 2 for n in attempts.values()), "each record: one failure, one success"
    tier_records = {(m.tp, m.offset) for m in broker.records(app.topics("orders").tiers[0].topic)}
    assert tier_records, "the records went through the tier"
    refetched = {r: n for r, n in fetched.items() if n > 1}
    assert not refetched, f"tier records fetched again: {len(refetched)} of {len(tier_records)}"
    assert set(fetched) == tier_records
