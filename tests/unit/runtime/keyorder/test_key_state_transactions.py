"""Reading a key-state topic at assignment while transactions are open in it, on the in-memory broker (its
Apache Kafka counterpart: tests/integration/runtime/test_key_order_eos.py).

Guarantee: with exactly-once, a key-state partition is written in the transactions of several producers (the
main consumer's chain records, each tier consumer's passages). A read_committed reader stops at the first open
transaction, and what another producer committed after that transaction began lies beyond it. The read at
assignment therefore goes on to the end as it was when it began, once every transaction open then is decided:
it never answers a state without a chain record its predecessor committed (a new owner rebuilt from such a
state handled a blocked key's record, or sent it behind an older record, before earlier ones). A transaction
left open past the read's timeout is a retriable error, and the partition is not started.
"""

from __future__ import annotations

import threading

import pytest

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import Admission, Admit, SourceChains
from retrytopics.core.keyorder.state_records import Chain, Fate, KeyStateRecord, Passage, encode_record
from retrytopics.runtime.keyorder.key_state import read_key_state
from retrytopics.testing import MemoryBroker, MemoryClientFactory, MemoryProducer

TOPIC = "orders.billing.keys"
KEY = key_id(b"acct-7")
CHAIN = ChainKey("orders", 0, KEY)
OPENED = Chain(chain=CHAIN, head=41, frontier=41, at_tier=0, followers=0, since_ms=1_000)
MOVED = Chain(chain=CHAIN, head=41, frontier=57, at_tier=0, followers=1, since_ms=1_000)
SENT = Passage(tier=0, chain=CHAIN, seen=41, fate=Fate.SENT, to_tier=1, after=41)


def _produce(producer: MemoryProducer, record: KeyStateRecord) -> None:
    key, value, partition = encode_record(record)
    producer.produce(TOPIC, key=key, value=value, headers=(), partition=partition, on_delivery=lambda error: None)
    assert producer.flush(1) == 0


def _transactional(broker: MemoryBroker, name: str) -> MemoryProducer:
    producer = broker.producer(transactional_id=name)
    producer.init_transactions(1)
    producer.begin_transaction()
    return producer


def test_a_chain_record_committed_behind_another_producers_open_transaction_is_read_once_it_is_decided() -> None:
    # setup: the main consumer's chain opened; a tier consumer's transaction holds a passage, open; the main
    # consumer's next transaction moves the chain's frontier to 57 and commits
    broker = MemoryBroker()
    broker.create_topic(TOPIC, partitions=1)
    main = _transactional(broker, "billing-main")
    _produce(main, OPENED)
    main.commit_transaction(1)
    tier = _transactional(broker, "billing.retry.0-main")
    _produce(tier, SENT)
    main.begin_transaction()
    _produce(main, MOVED)
    main.commit_transaction(1)
    clients = MemoryClientFactory(broker)

    # then: while the tier's transaction is open, no state is given (a retriable error: the partition waits)
    with pytest.raises(KafkaClientError) as raised:
        read_key_state(clients.read_to_end, TOPIC, [0], timeout_s=0.05)
    assert raised.value.retriable and raised.value.code == "TIMED_OUT"

    # when: the tier's transaction aborts (its consumer was killed and a new one fenced it) while a read waits
    def abort() -> None:
        with clients.lock:
            tier.abort_transaction(1)

    threading.Timer(0.05, abort).start()
    state = read_key_state(clients.read_to_end, TOPIC, [0], timeout_s=10)

    # then: the chain as its predecessor left it, without the aborted passage: the next record follows 57
    assert state.records == (OPENED, MOVED)
    chains, _ = SourceChains.rebuild(KeyOrdering(), state.records, source="orders", partition=0)
    assert chains.admit(KEY) == Admission(Admit.FOLLOW, 0, 57)
