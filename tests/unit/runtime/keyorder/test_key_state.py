"""Reading a key-state topic at assignment (runtime/keyorder/key_state.py) on the in-memory broker.

Guarantee: a new owner gets every well-formed key-state record of the partitions it asked for, in log order,
decoded; malformed records and records written to another partition than their chain's are skipped and
counted, never trusted, and the warning names no byte of them (with header keys, so are unsigned and forged
records); the rebuilt state blocks exactly the keys the
records show open; a topic or partition that is not there is an error, never an empty (unordered) start.
"""

from __future__ import annotations

import logging

import pytest

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import Admit, SourceChains
from retrytopics.core.keyorder.state_records import (
    Chain,
    Closed,
    Fate,
    KeyStateRecord,
    Passage,
    encode_record,
    encode_signed,
)
from retrytopics.core.keyorder.tier_passages import TierPassages
from retrytopics.core.signing import HeaderKeys, sign_state
from retrytopics.runtime.keyorder.key_state import Skipped, decode_message, read_key_state
from retrytopics.testing import MemoryBroker, MemoryClientFactory

TOPIC = "orders.billing.keys"
SECRET_KEY = b"acct-secret-7"  # a record key that must never reach a log line
A, B, C = (ChainKey("orders", p, key_id(k)) for p, k in ((0, SECRET_KEY), (1, b"acct-2"), (1, b"acct-3")))
CHAIN_A = Chain(chain=A, head=41, frontier=57, at_tier=0, followers=1, since_ms=1_000)
SENT_A = Passage(tier=0, chain=A, seen=57, fate=Fate.SENT, to_tier=1, after=57)
CHAIN_B = Chain(chain=B, head=3, frontier=3, at_tier=0, followers=0, since_ms=2_000)
CHAIN_C = Chain(chain=C, head=5, frontier=5, at_tier=0, followers=0, since_ms=3_000)
CLOSED_C = Closed(chain=C)


def _write(broker: MemoryBroker, record: KeyStateRecord) -> None:
    key, value, partition = encode_record(record)
    broker.append(TOPIC, value, key=key, partition=partition)


def _broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic(TOPIC, partitions=3)
    for record in (CHAIN_A, CHAIN_B, CHAIN_C, SENT_A, CLOSED_C):
        _write(broker, record)
    broker.append(TOPIC, b"{not json", key=b"chain/orders/0/00" + SECRET_KEY.hex().encode(), partition=0)
    misplaced_key, misplaced_value, _ = encode_record(CHAIN_B)
    broker.append(TOPIC, misplaced_value, key=misplaced_key, partition=0)  # B's chain lives in partition 1
    return broker


def test_a_main_consumer_reads_its_partitions_and_rebuilds_the_keys_they_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clients = MemoryClientFactory(_broker())

    with caplog.at_level(logging.WARNING, logger="retrytopics.runtime"):
        state = read_key_state(clients.read_to_end, TOPIC, [0], timeout_s=1)

    assert state.records == (CHAIN_A, SENT_A)
    assert state.malformed == 2
    [warning] = caplog.records
    assert "2 key-state records skipped" in warning.getMessage()
    assert SECRET_KEY.hex() not in warning.getMessage() and "acct" not in warning.getMessage()
    chains, closed = SourceChains.rebuild(KeyOrdering(), state.records, source="orders", partition=0)
    assert chains.blocked() == 1 and closed == []
    follow = chains.admit(key_id(SECRET_KEY))
    assert (follow.action, follow.tier, follow.after) == (Admit.FOLLOW, 1, 57), "behind 57, where tier 0 sent it"
    assert chains.admit(key_id(b"acct-2")).action is Admit.HANDLE, "B is blocked in partition 1, not here"


def test_a_closed_chain_blocks_nothing_and_a_tier_reads_every_partition() -> None:
    clients = MemoryClientFactory(_broker())

    mine = read_key_state(clients.read_to_end, TOPIC, [1], timeout_s=1)
    everything = read_key_state(clients.read_to_end, TOPIC, None, timeout_s=1)

    assert mine.records == (CHAIN_B, CHAIN_C, CLOSED_C) and mine.malformed == 0
    chains, _ = SourceChains.rebuild(KeyOrdering(), mine.records, source="orders", partition=1)
    assert chains.blocked() == 1
    assert chains.admit(key_id(b"acct-3")).action is Admit.HANDLE, "C's chain was closed"
    assert chains.admit(key_id(b"acct-2")).action is Admit.FOLLOW
    assert everything.records == (CHAIN_A, SENT_A, CHAIN_B, CHAIN_C, CLOSED_C) and everything.malformed == 2
    passages, _ = TierPassages.rebuild(KeyOrdering(), everything.records, tier=0)
    assert passages.tracked() == 1


def test_a_missing_topic_or_partition_is_an_error_not_an_empty_state() -> None:
    clients = MemoryClientFactory(_broker())
    with pytest.raises(KafkaClientError):
        read_key_state(clients.read_to_end, "orders.other.keys", None, timeout_s=1)
    with pytest.raises(KafkaClientError):
        read_key_state(clients.read_to_end, TOPIC, [0, 3], timeout_s=1)


def test_with_header_keys_only_signed_records_are_read_and_forgeries_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Guarantee (docs/key-ordering.md, section 9): with header keys, records written by the runtime
    (`encode_signed`) are read as before, while a tombstone or chain record that is unsigned, signed with
    another key, or copied from another key's signature is skipped and counted as forged, never trusted: the
    blocked key stays blocked and no key is blocked by a forgery; the warning holds no key or signature."""
    keys, wrong = HeaderKeys.of(b"k" * 32), HeaderKeys.of(b"w" * 32)
    broker = MemoryBroker()
    broker.create_topic(TOPIC, partitions=3)
    for record in (CHAIN_B, SENT_A):
        key, value, partition, headers = encode_signed(record, TOPIC, keys)
        broker.append(TOPIC, value, key=key, partition=partition, headers=headers)
    closed_b, _, _ = encode_record(Closed(chain=B))
    chain_c, value_c, _ = encode_record(CHAIN_C)
    stolen = encode_signed(CHAIN_B, TOPIC, keys)[3]  # a genuine signature, on another record
    broker.append(TOPIC, None, key=closed_b, partition=1)
    broker.append(TOPIC, None, key=closed_b, partition=1, headers=[sign_state(wrong, TOPIC, closed_b, None)])
    broker.append(TOPIC, None, key=closed_b, partition=1, headers=stolen)
    broker.append(TOPIC, value_c, key=chain_c, partition=1)
    clients = MemoryClientFactory(broker)

    with caplog.at_level(logging.WARNING, logger="retrytopics.runtime"):
        state = read_key_state(clients.read_to_end, TOPIC, None, timeout_s=1, keys=keys)
        unchecked = read_key_state(clients.read_to_end, TOPIC, None, timeout_s=1)

    assert state.records == (SENT_A, CHAIN_B) and (state.malformed, state.forged) == (0, 4)
    assert state.next_offsets == {0: 1, 1: 5}, "a live reader goes on after the forgeries"
    chains, closed = SourceChains.rebuild(KeyOrdering(), state.records, source="orders", partition=1)
    assert chains.blocked() == 1 and closed == []
    assert chains.admit(key_id(b"acct-2")).action is Admit.FOLLOW, "a forged tombstone released nothing"
    assert chains.admit(key_id(b"acct-3")).action is Admit.HANDLE, "a forged chain record blocked nothing"
    assert unchecked.forged == 0 and CHAIN_C in unchecked.records, "without keys nothing is checked"
    message = caplog.records[0].getMessage()
    assert "4 as unsigned or forged" in message and "acct" not in message and stolen[0][1].decode() not in message
    unsigned_c = next(m for m in broker.records(TOPIC) if m.key == chain_c)
    assert decode_message(unsigned_c, keys) == Skipped(
        "signature missing: key-state records are signed when header_key is configured", forged=True
    )
