"""`ops.open_chains`, what `topics describe` and the audit show of a key-state topic: compaction's rule, and
nothing malformed trusted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import Chain, Closed, encode_record
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys, sign_state
from retrytopics.operator.ops import open_chains
from retrytopics.operator.reports import key_state_text

SOURCE = "orders"
KEYS = [b"acct-1", b"acct-2", b"x" * 40]


def _message(partition: int, offset: int, key: bytes | None, value: bytes | None) -> Message:
    return Message("orders.billing.keys", partition, offset, -1, key, value, ())


def _log(writes: list[tuple[int, int, int | None]]) -> list[Message]:
    """(source partition, key index, frontier or None for a tombstone) → the key-state records, in order."""
    out = []
    for offset, (partition, key, frontier) in enumerate(writes):
        chain = ChainKey(SOURCE, partition, key_id(KEYS[key]))
        record = (
            Closed(chain=chain)
            if frontier is None
            else Chain(chain=chain, head=0, frontier=frontier, at_tier=0, followers=frontier, since_ms=offset)
        )
        k, v, p = encode_record(record)
        out.append(_message(p, offset, k, v))
    return out


writes = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 2), st.one_of(st.none(), st.integers(0, 50))), max_size=30
)


@given(writes)
def test_the_open_chains_are_those_a_compacted_topic_keeps(log: list[tuple[int, int, int | None]]) -> None:
    """Folding the whole log gives exactly the chains whose latest record is not a tombstone, with that
    latest record's fields: the same answer as after the broker compacts."""
    chains, malformed, _ = open_chains(_log(log), SOURCE)

    latest: dict[tuple[int, int], int | None] = {}
    for partition, key, frontier in log:
        latest[(partition, key)] = frontier
    expected = {(p, key_id(KEYS[k]).hex()): f for (p, k), f in latest.items() if f is not None}
    assert {(c.partition, c.key_id): c.frontier for c in chains} == expected
    assert malformed == 0
    assert [c.partition for c in chains] == sorted(c.partition for c in chains)


def test_malformed_or_misplaced_chain_records_are_counted_never_shown() -> None:
    """A value that does not decode, a chain of another source, and one read from another partition than its
    chain's are counted; a malformed record later replaced by a valid one is not; a passage is ignored."""
    good = _log([(0, 0, 3)])[0]
    other_source = encode_record(
        Chain(chain=ChainKey("refunds", 0, key_id(b"k")), head=1, frontier=1, at_tier=0, followers=0, since_ms=1)
    )
    log = [
        _message(0, 0, b"chain/orders/0/0061", b'{"v":1,"head":"x"}'),
        _message(0, 1, other_source[0], other_source[1]),
        _message(1, 2, good.key, good.value),  # written to partition 1, about source partition 0
        _message(0, 3, b"chain/orders/0/0062", b"not json"),
        _message(0, 4, b"chain/orders/0/0062", _log([(0, 0, 9)])[0].value),  # replaces the line above
        _message(0, 5, b"tier0/orders/0/0061/7", b'{"v":1,"fate":"succeeded"}'),
        good,
    ]
    chains, malformed, _ = open_chains(log, SOURCE)

    assert malformed == 3
    assert [(c.partition, c.key_id, c.frontier) for c in chains] == [
        (0, key_id(KEYS[0]).hex(), 3),
        (0, "0062", 9),
    ]


def test_the_text_shows_key_ids_in_hex_never_a_long_keys_bytes() -> None:
    """A long key is shown by its `01` digest id; its bytes appear nowhere in the text."""
    chains, _, _ = open_chains(_log([(0, 2, 4)]), SOURCE)
    view = {"topic": "orders.billing.keys", "malformed": 0, "chains": [c.as_dict() for c in chains]}

    text = key_state_text(view)

    assert key_id(KEYS[2]).hex() in text and key_id(KEYS[2]).hex().startswith("01")
    assert "xxxx" not in text and KEYS[2].hex() not in text
    assert text.splitlines()[0] == "key-state topic orders.billing.keys: 1 blocked keys"


def test_with_header_keys_forged_records_are_skipped_before_the_fold_and_counted() -> None:
    """With the app's header keys, a record whose signature is missing or wrong is skipped before compaction's
    fold, as the runtime skips it: a forged tombstone does not hide a genuine open chain, a forged chain record
    shows no blocked key, and both are counted (and said in the text)."""
    keys = HeaderKeys.of(b"k" * 32)
    genuine, forged_chain = _log([(0, 0, 3), (0, 1, 5)])
    tombstone = _log([(0, 0, None)])[0]
    signed = genuine._replace(headers=(sign_state(keys, genuine.topic, genuine.key or b"", genuine.value),))
    log = [signed, tombstone._replace(offset=1), forged_chain._replace(offset=2)]

    chains, malformed, forged = open_chains(log, SOURCE, keys=keys)

    assert [(c.key_id, c.frontier) for c in chains] == [(key_id(KEYS[0]).hex(), 3)]
    assert (malformed, forged) == (0, 2)
    view = {"topic": "orders.billing.keys", "malformed": 0, "forged": forged, "chains": [c.as_dict() for c in chains]}
    assert "2 unsigned or forged records skipped" in key_state_text(view).splitlines()[0]
