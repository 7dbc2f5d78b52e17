"""The in-memory share group (`MemoryBroker.share_consumer`) keeps KIP-932's rules, which the share-group
consumer's unit tests rely on; `tests/integration/test_share_contract.py` holds it to Apache Kafka."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import AckType, Message
from retrytopics.testing import MemoryBroker, ShareRecordState

TOPIC = "orders"


def _broker(records: int, *, limit: int = 5, lock_ms: int = 30_000) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic(TOPIC)
    broker.configure_share_group(
        "g", auto_offset_reset="earliest", delivery_count_limit=limit, record_lock_duration_ms=lock_ms
    )
    for i in range(records):
        broker.append(TOPIC, f"v{i}".encode())
    return broker


def _settle(consumer: object, batch: list[Message], ack: AckType) -> None:
    for msg in batch:
        consumer.acknowledge(msg, ack)  # type: ignore[attr-defined]
    consumer.commit(asynchronous=False)  # type: ignore[attr-defined]


def test_members_on_one_partition_each_get_records_and_none_twice() -> None:
    """Any number of members read one partition; a record acquired by one is not delivered to another."""
    broker = _broker(6)
    members = [broker.share_consumer("g", max_records=2) for _ in range(3)]
    seen: dict[int, int] = {}
    for i, member in enumerate(members):
        member.subscribe([TOPIC])
        batch = member.poll(1.0)
        assert [m.delivery_count for m in batch] == [1, 1]
        for msg in batch:
            assert msg.offset not in seen
            seen[msg.offset] = i
        _settle(member, batch, AckType.ACCEPT)
    assert sorted(seen) == list(range(6))
    assert set(seen.values()) == {0, 1, 2}
    assert members[0].poll(1.0) == []


def test_release_redelivers_at_once_with_the_count_raised() -> None:
    """RELEASE makes a record available at once; its next delivery carries delivery count + 1."""
    broker = _broker(1)
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    [first] = consumer.poll(1.0)
    _settle(consumer, [first], AckType.RELEASE)
    before = broker.clock.monotonic()
    [again] = consumer.poll(1.0)
    assert broker.clock.monotonic() == before  # no wait: it was there at once
    assert (again.offset, again.value, again.delivery_count) == (0, b"v0", 2)


def test_reject_archives_and_accept_acknowledges() -> None:
    """REJECT archives a record, ACCEPT acknowledges it: neither is delivered again."""
    broker = _broker(2)
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    first, second = consumer.poll(1.0)
    consumer.acknowledge(first, AckType.REJECT)
    consumer.acknowledge(second, AckType.ACCEPT)
    assert consumer.commit(asynchronous=False) == {(TOPIC, 0): None}
    assert consumer.poll(5.0) == []
    assert broker.share_state("g", TOPIC) == {
        (0, 0): (ShareRecordState.ARCHIVED, 1),
        (0, 1): (ShareRecordState.ACKNOWLEDGED, 1),
    }


def test_a_killed_member_records_come_back_after_the_lock() -> None:
    """A member that dies holding records (no release) blocks them until their lock expires, then another
    member gets them with the count raised; its late acknowledgement is refused."""
    broker = _broker(3, lock_ms=2000)
    dying, survivor = broker.share_consumer("g"), broker.share_consumer("g")
    dying.subscribe([TOPIC])
    survivor.subscribe([TOPIC])
    held = dying.poll(1.0)
    assert len(held) == 3
    dying.kill()
    start = broker.clock.monotonic()
    batch: list[Message] = []
    while not batch:
        batch = survivor.poll(0.5)
    assert broker.clock.monotonic() - start >= 2.0
    assert [(m.offset, m.delivery_count) for m in batch] == [(0, 2), (1, 2), (2, 2)]


def test_a_lock_that_expired_makes_the_acknowledgement_fail() -> None:
    """An acknowledgement sent after the record's lock expired is refused for its partition."""
    broker = _broker(1, lock_ms=1000)
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    [msg] = consumer.poll(1.0)
    broker.clock.advance(1.5)
    consumer.acknowledge(msg, AckType.ACCEPT)
    answer = consumer.commit(asynchronous=False)
    failure = answer[(TOPIC, 0)]
    assert failure is not None and failure.code == "INVALID_RECORD_STATE"


def test_renew_restarts_the_lock_and_can_be_refused() -> None:
    """RENEW keeps a record acquired past its first lock; a client without RENEW refuses it by name."""
    broker = _broker(1, lock_ms=2000)
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    [msg] = consumer.poll(1.0)
    broker.clock.advance(1.5)
    consumer.acknowledge(msg, AckType.RENEW)
    consumer.commit(asynchronous=False)
    broker.clock.advance(1.5)  # 3 s after the poll: past the first lock, within the renewed one
    consumer.acknowledge(msg, AckType.ACCEPT)
    assert consumer.commit(asynchronous=False) == {(TOPIC, 0): None}
    without = _broker(1).share_consumer("g", supports_renew=False)
    with pytest.raises(KafkaClientError) as refused:
        without.acknowledge(msg, AckType.RENEW)
    assert refused.value.code == "UNSUPPORTED_ACKNOWLEDGEMENT"


def test_a_batch_must_be_acknowledged_before_the_next_poll() -> None:
    """As the client's explicit mode: polling again with records of the last batch unacknowledged fails."""
    broker = _broker(2)
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    first, _second = consumer.poll(1.0)
    consumer.acknowledge(first, AckType.ACCEPT)
    with pytest.raises(KafkaClientError) as refused:
        consumer.poll(1.0)
    assert refused.value.code == "ILLEGAL_STATE"


def test_close_sends_acknowledgements_and_releases_the_rest() -> None:
    """Closing sends what was acknowledged and releases what was not: another member gets it at once."""
    broker = _broker(2)
    leaving, staying = broker.share_consumer("g"), broker.share_consumer("g")
    leaving.subscribe([TOPIC])
    staying.subscribe([TOPIC])
    first, _second = leaving.poll(1.0)
    leaving.acknowledge(first, AckType.ACCEPT)
    leaving.close()
    assert [(m.offset, m.delivery_count) for m in staying.poll(0.0)] == [(1, 2)]


def test_latest_starts_after_what_is_there() -> None:
    """Kafka's default offset reset for a share group is latest: records written before the first member
    subscribed are not delivered."""
    broker = MemoryBroker()
    broker.create_topic(TOPIC)
    broker.append(TOPIC, b"before")
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC])
    broker.append(TOPIC, b"after")
    assert [m.value for m in consumer.poll(1.0)] == [b"after"]


def test_acknowledgements_reach_the_callback() -> None:
    """`on_acknowledged` hears which offsets the group took, per partition."""
    broker = _broker(3)
    heard: list[object] = []
    consumer = broker.share_consumer("g")
    consumer.subscribe([TOPIC], on_acknowledged=lambda offsets, error: heard.append((offsets, error)))
    _settle(consumer, consumer.poll(1.0), AckType.ACCEPT)
    assert heard == [({(TOPIC, 0): frozenset({0, 1, 2})}, None)]


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(min_value=2, max_value=10),
    choices=st.lists(st.sampled_from([AckType.ACCEPT, AckType.RELEASE, AckType.REJECT, None]), min_size=1, max_size=40),
)
def test_every_record_ends_acknowledged_or_archived_within_the_limit(limit: int, choices: list[AckType | None]) -> None:
    """Whatever members do (accept, release, reject, or die holding it), a record is delivered at most
    `limit` times, with counts 1, 2, ... in order, and ends acknowledged or archived."""
    broker = _broker(3, limit=limit, lock_ms=1000)
    deliveries: dict[int, list[int]] = {0: [], 1: [], 2: []}
    step = 0
    for _ in range(200):
        consumer = broker.share_consumer("g")
        consumer.subscribe([TOPIC])
        batch = consumer.poll(1.0)
        if not batch:
            break
        for msg in batch:
            assert msg.delivery_count is not None
            deliveries[msg.offset].append(msg.delivery_count)
        choice = choices[step % len(choices)]
        step += 1
        if choice is None:
            consumer.kill()
            continue
        _settle(consumer, batch, choice)
        consumer.close()
    state = broker.share_state("g", TOPIC)
    for offset, counts in deliveries.items():
        assert counts == list(range(1, len(counts) + 1))
        assert len(counts) <= limit
        final, count = state[(0, offset)]
        assert final in (ShareRecordState.ACKNOWLEDGED, ShareRecordState.ARCHIVED)
        assert count == len(counts)


def test_share_group_config_names_kafka_settings_and_refuses_bad_values() -> None:
    """`ShareGroupConfig` maps its fields to Kafka's group-config names (booleans as Kafka spells them) and
    refuses a value Kafka would never accept, naming the field, before anything is sent."""
    from retrytopics.connectors.admin import ShareGroupConfig
    from retrytopics.core.errors import ConfigError

    config = ShareGroupConfig(
        auto_offset_reset="earliest", delivery_count_limit=3, dlq_topic="dlq.x", dlq_copy_record=False
    )
    assert config.properties() == {
        "share.auto.offset.reset": "earliest",
        "share.delivery.count.limit": "3",
        "errors.deadletterqueue.topic.name": "dlq.x",
        "errors.deadletterqueue.copy.record.enable": "false",
    }
    assert ShareGroupConfig().properties() == {}
    for bad, field in [
        ({"auto_offset_reset": "earlest"}, "auto_offset_reset"),
        ({"isolation_level": "committed"}, "isolation_level"),
        ({"record_lock_duration_ms": 0}, "record_lock_duration_ms"),
    ]:
        with pytest.raises(ConfigError, match=field):
            ShareGroupConfig(**bad)  # type: ignore[arg-type]


def test_a_consumer_group_record_has_no_delivery_count() -> None:
    """Outside share groups `Message.delivery_count` is None: the client conversion on the consumer-group
    hot path fills every field, the new one included (a tuple one short would fail on access)."""
    from confluent_kafka import Message as ClientMessage

    from retrytopics.connectors.clients import message_from_client

    raw = ClientMessage(topic="t", partition=2, offset=7, key=b"k", value=b"v", headers=[("h", b"x")], timestamp=(1, 5))
    msg = message_from_client(raw)
    assert msg == Message("t", 2, 7, 5, b"k", b"v", (("h", b"x"),), None, None)
    assert msg.delivery_count is None
