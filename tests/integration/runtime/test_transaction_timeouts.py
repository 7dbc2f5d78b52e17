"""Exactly-once when a transactional call's answer is lost (the fault tests' own broker, behind this test's TCP
proxy on loopback).

librdkafka has no Transactions V2 (KIP-890): the broker bumps a producer's epoch only when a producer (re)starts
with `init_transactions()`, so a request of a finished transaction still in flight is fenced only then. And
`send_offsets_to_transaction()` ignores its timeout and can hang. So after a transactional call that timed out
or was abandoned at the runtime's own bound, the producer is never used again: a new one with the same
transactional id starts (`init_transactions`, which aborts the open transaction and fences the old epoch), the
batch is read again, and only its new transaction commits.

The toxic: the broker's answers to the next `TxnOffsetCommit` (the request `send_offsets_to_transaction` makes
of the group coordinator, after it added the offsets to the transaction) are swallowed: the broker acted on it,
the client never learns. Guarantees: the call returns within its bound (librdkafka's timeout or the runtime's),
the producer is replaced and a transaction aborted; read_committed, every retried hop is in the tier once and
every record was retried once (no committed duplicate, nothing lost); the group's committed offsets reach the
end of the source; the app never stopped.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping

import pytest

from retrytopics import Event, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until
from .proxy import KafkaProxy

pytestmark = pytest.mark.broker

#: the Kafka protocol's api key of TxnOffsetCommit
TXN_OFFSET_COMMIT = 28
RECORDS = 6
CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class _Events:
    def __init__(self) -> None:
        self.counts: Counter[Event] = Counter()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.counts[event] += 1


def test_a_lost_offsets_answer_replaces_the_producer_and_commits_each_hop_once(
    proxied: tuple[KafkaConfig, KafkaProxy], unique_name: Callable[[str], str]
) -> None:
    kafka, proxy = proxied
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    events = _Events()
    app = RetryApp(
        kafka=kafka, group=group, consumer_overrides=CONSUMER, exactly_once=True, hooks=[events], instance_id="p0"
    )
    lock = threading.Lock()
    calls: list[tuple[bytes, int]] = []

    @app.handler(source, policy=RetryPolicy(delays=["100ms"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls.append((record.value, record.attempt))
        if record.attempt == 1:
            raise RuntimeError("fails once")

    app.provision()
    tier = app.topics(source).tiers[0].topic
    proxy.drop_responses(TXN_OFFSET_COMMIT, times=1)  # the first transaction's offsets: acted on, answer lost
    kit.produce(source, [(None, f"r{i}".encode(), []) for i in range(RECORDS)])
    app.start(main=True, tiers="all")
    every = {f"r{i}".encode() for i in range(RECORDS)}
    try:
        wait_until(lambda: {v for v, attempt in list(calls) if attempt == 2} >= every, 90, "every record retried")
        wait_until(lambda: kit.committed(group, source, 1) == {0: RECORDS}, 30, "the source committed to its end")
    finally:
        assert app.stop(30)
    assert app.error is None

    # then: the toxic hit a transaction's offsets, whose producer was replaced and the transaction aborted
    assert proxy.responses_dropped[TXN_OFFSET_COMMIT] == 1
    assert events.counts[Event.PRODUCER_RECREATED] >= 1 and events.counts[Event.TRANSACTION_ABORTED] >= 1
    # then: read_committed, each record's hop once (no committed duplicate), each record retried
    hops = Counter((read.value, decode(list(read.headers)).reconsume_times) for read in kit.read_all(tier))
    assert hops == Counter({(value, 1): 1 for value in every}), f"committed hops: {hops}"
    assert kit.read_all(app.topics(source).dlq) == []
