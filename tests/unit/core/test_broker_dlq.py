"""Reading the broker's dead letters (KIP-1191 `__dlq.errors.*` headers) as untrusted input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core import broker_dlq as B
from retrytopics.core.errors import ConfigError

#: What Kafka 4.4.0 wrote for a record rejected on its first delivery (tests/integration/share).
WRITTEN = [
    (B.TOPIC, b"orders"),
    (B.PARTITION, b"3"),
    (B.OFFSET, b"41"),
    (B.GROUP, b"billing"),
    (B.DELIVERY_COUNT, b"1"),
    (B.MESSAGE, b"Offset rejected by client."),
]


def test_what_the_broker_writes_decodes_to_its_coordinates_and_reason() -> None:
    """Every header Kafka writes is read: source coordinates, group, delivery count, message, and the reason
    from the message; the origin id is the one retrytopics gives a record without an id header."""
    letter = B.decode_broker_dead_letter(WRITTEN)
    assert letter == B.BrokerDeadLetter(
        topic="orders",
        partition=3,
        offset=41,
        group="billing",
        delivery_count=1,
        message="Offset rejected by client.",
        reason="broker_rejected",
    )
    assert letter.origin_message_id == "orders-3-41"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Offset rejected by client.", "broker_rejected"),
        ("Offset delivery count exceeded the threshold.", "broker_delivery_limit"),
        ("OFFSET DELIVERY COUNT EXCEEDED", "broker_delivery_limit"),
        ("something a later Kafka says", "broker_dlq"),
        (None, "broker_dlq"),
    ],
)
def test_the_reason_comes_from_the_message_else_a_reason_of_its_own(message: str | None, reason: str) -> None:
    assert B.broker_reason(message) == reason


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (B.PARTITION, b"-1"),
        (B.PARTITION, b"03"),
        (B.PARTITION, b"2147483648"),
        (B.OFFSET, b"9223372036854775808"),
        (B.OFFSET, b" 4"),
        (B.OFFSET, b"4e1"),
        (B.DELIVERY_COUNT, b"0"),
        (B.DELIVERY_COUNT, "١".encode()),  # a non-ASCII digit
        (B.TOPIC, b"a/b"),
        (B.TOPIC, b"x" * 250),
        (B.TOPIC, b"\xff"),
    ],
)
def test_a_malformed_header_reads_as_none(key: str, value: bytes) -> None:
    headers = [(k, value if k == key else v) for k, v in WRITTEN]
    letter = B.decode_broker_dead_letter(headers)
    field = {B.PARTITION: "partition", B.OFFSET: "offset", B.DELIVERY_COUNT: "delivery_count", B.TOPIC: "topic"}[key]
    assert getattr(letter, field) is None
    assert (letter.origin_message_id is None) == (key != B.DELIVERY_COUNT)


def test_a_repeated_or_missing_header_reads_as_none() -> None:
    """Two values of one header are ambiguous: neither is believed."""
    letter = B.decode_broker_dead_letter([*WRITTEN, (B.OFFSET, b"42")])
    assert letter.offset is None and letter.partition == 3
    assert B.decode_broker_dead_letter([]) == B.BrokerDeadLetter(
        topic=None, partition=None, offset=None, group=None, delivery_count=None, message=None, reason="broker_dlq"
    )


def test_the_broker_dlq_topic_is_named_after_the_group_under_the_prefix() -> None:
    assert B.broker_dlq_topic("billing") == "dlq.billing"
    with pytest.raises(ConfigError, match="group"):
        B.broker_dlq_topic("x" * 250)


_KEYS = st.sampled_from([*B.HEADERS, "retry.origin_message_id", "__dlq.errors", ""]) | st.text(max_size=30)
_VALUES = st.none() | st.binary(max_size=600) | st.integers(-(2**70), 2**70).map(lambda n: str(n).encode())


@given(st.lists(st.tuples(_KEYS, _VALUES), max_size=12))
def test_any_headers_decode_bounded_without_raising(headers: list[tuple[str, bytes | None]]) -> None:
    """Hostile bytes never raise; what is read is within Kafka's ranges, bounded, and believed only when
    its header is there exactly once with exactly that canonical text."""
    letter = B.decode_broker_dead_letter(headers)
    by_key: dict[str, list[bytes | None]] = {}
    for key, value in headers:
        by_key.setdefault(key, []).append(value)
    for key, value in [(B.PARTITION, letter.partition), (B.OFFSET, letter.offset)]:
        if value is not None:
            assert value >= 0 and by_key[key] == [str(value).encode()]
    if letter.delivery_count is not None:
        assert 1 <= letter.delivery_count < 2**31
        assert by_key[B.DELIVERY_COUNT] == [str(letter.delivery_count).encode()]
    if letter.partition is not None:
        assert letter.partition < 2**31
    if letter.topic is not None:
        assert by_key[B.TOPIC] == [letter.topic.encode()] and len(letter.topic) <= 249
    assert letter.message is None or len(letter.message) <= B.MESSAGE_LIMIT
    assert letter.group is None or len(letter.group) <= B.GROUP_LIMIT
    assert letter.reason in {"broker_rejected", "broker_delivery_limit", "broker_dlq"}
