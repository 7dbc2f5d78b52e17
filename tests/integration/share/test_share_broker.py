"""What confluent-kafka's share consumer (2.16, preview) and Apache Kafka 4.4.0's share groups actually do,
through `connectors.share.KafkaShareConsumer`: the facts the share-group consumer is built on
(docs/share-groups.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType

from retrytopics.connectors.admin import SHARE_DLQ_TOPIC_CONFIG, TopicSpec, ensure_topics, share_group_config
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import AckType, Message

from .conftest import SMALL_BATCHES, ShareKit, deliveries_until, poll_settling, quiet, read_topic

pytestmark = pytest.mark.broker

HOLDER = Path(__file__).with_name("share_holder.py")


def test_several_members_on_one_partition_all_receive_records(share: ShareKit) -> None:
    """Three share consumers on a one-partition topic each get records; every record is delivered once,
    with delivery count 1, and accepted."""
    values = share.setup(60)
    members = [share.consumer(**SMALL_BATCHES) for _ in range(3)]
    by_member: dict[int, list[Message]] = {i: [] for i in range(3)}
    deadline = time.monotonic() + 30
    while sum(map(len, by_member.values())) < len(values):
        assert time.monotonic() < deadline, {i: len(got) for i, got in by_member.items()}
        for i, member in enumerate(members):
            batch = member.poll(0.3)
            by_member[i] += batch
            # a slow handler (20 ms a record): a member alone would take seconds, so the others join and share
            time.sleep(0.02 * len(batch))
            for msg in batch:
                member.acknowledge(msg, AckType.ACCEPT)
            if batch:
                assert all(error is None for error in member.commit(asynchronous=False).values())
    delivered = [m for got in by_member.values() for m in got]
    assert sorted(m.value for m in delivered if m.value) == sorted(values)
    assert {m.delivery_count for m in delivered} == {1}
    assert all(by_member.values()), "a member got nothing"
    assert quiet(members, 1.5) == []


def test_a_producer_batch_is_acquired_whole_by_one_member(share: ShareKit) -> None:
    """The broker acquires records by producer batch and the 2.16 client returns what it acquired, past
    `max.poll.records`: 40 records written as one batch all go to one member, in one poll, even with two
    members polling and a limit of 5 per poll. (How work spreads over members follows how it was produced.)"""
    values = share.setup(40, one_per_batch=False)
    members = [share.consumer(**SMALL_BATCHES) for _ in range(2)]
    batches: list[tuple[int, list[Message]]] = []
    deadline = time.monotonic() + 20
    while not batches:
        assert time.monotonic() < deadline, "nothing delivered"
        for i, member in enumerate(members):
            batch = poll_settling(member, lambda _m: AckType.ACCEPT, 0.3)
            if batch:
                batches.append((i, batch))
    [(_member, batch)] = batches
    assert sorted(m.value for m in batch if m.value) == sorted(values)
    assert quiet(members, 1.5) == []


def test_release_redelivers_at_once_with_the_count_raised(share: ShareKit) -> None:
    """RELEASE puts a record back at once: it is delivered again (well within its 30 s lock) with delivery
    count 2, key, value and headers intact."""
    share.setup(1)
    consumer = share.consumer()

    def release_first(msg: Message) -> AckType:
        return AckType.RELEASE if msg.delivery_count == 1 else AckType.ACCEPT

    seen = deliveries_until([consumer], release_first, lambda s: len(s) >= 1, 20)
    released_at = time.monotonic()
    seen = deliveries_until([consumer], release_first, lambda s: len(s) >= 1, 20)
    assert time.monotonic() - released_at < 25  # the lock is 30 s: this came from the RELEASE, not expiry
    [again] = seen
    assert (again.offset, again.delivery_count, again.key, again.value) == (0, 2, b"id-0", b"id-0")
    assert again.headers == (("origin", b"test"),)
    assert quiet([consumer], 1.5) == []


def test_reject_archives(share: ShareKit) -> None:
    """REJECT ends a record: it is never delivered again, and the rest of the topic is unaffected."""
    share.setup(4)
    consumer = share.consumer()
    seen = deliveries_until(
        [consumer], lambda m: AckType.REJECT if m.value == b"id-1" else AckType.ACCEPT, lambda s: len(s) >= 4, 20
    )
    assert sorted((m.offset, m.delivery_count) for m in seen) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert quiet([consumer], 2.0) == []


def test_a_killed_member_records_come_back_after_the_lock(share: ShareKit) -> None:
    """A member SIGKILLed while holding records: after their lock (2 s here) another member gets every one
    of them, with delivery count 2; none is lost, and none comes back before the lock expired."""
    values = share.setup(5, record_lock_duration_ms=2000)
    started = time.monotonic()  # the holder acquires after this, so its lock ends 2 s after this at the earliest
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), share.kafka.bootstrap, share.group, share.topic],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        line = holder.stdout.readline() if holder.stdout else ""
        assert line.startswith("held"), line
        held = {int(o) for o in line.split()[1:]}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    survivor = share.consumer()
    seen = deliveries_until([survivor], lambda _m: AckType.ACCEPT, lambda s: len(s) >= len(values), 30)
    assert time.monotonic() - started >= 2.0
    counts = {m.offset: m.delivery_count for m in seen}
    assert {o for o, c in counts.items() if c == 2} == held
    assert {o for o, c in counts.items() if c == 1} == set(range(len(values))) - held
    assert sorted(m.value for m in seen if m.value) == sorted(values)
    assert quiet([survivor], 1.5) == []


def test_an_acknowledgement_after_the_lock_expired_is_refused(share: ShareKit) -> None:
    """A member whose lock expired (2 s) while it held a record: another member gets the record with count 2,
    and the first member's late ACCEPT is answered with an error for the partition, so the record is not
    accepted twice over the second delivery."""
    share.setup(1, record_lock_duration_ms=2000)
    slow = share.consumer()
    held: list[Message] = []
    deadline = time.monotonic() + 20
    while not held:
        assert time.monotonic() < deadline, "nothing delivered"
        held = slow.poll(0.3)
    other = share.consumer()
    [again] = deliveries_until([other], lambda _m: AckType.RELEASE, lambda s: len(s) >= 1, 20)
    assert (again.offset, again.delivery_count) == (held[0].offset, 2)
    slow.acknowledge(held[0], AckType.ACCEPT)
    answers = slow.commit(asynchronous=False)
    failure = answers[(share.topic, 0)]
    assert failure is not None, answers
    [third] = deliveries_until([other], lambda _m: AckType.ACCEPT, lambda s: len(s) >= 1, 20)
    assert third.delivery_count == 3


def test_the_delivery_count_limit_archives(share: ShareKit) -> None:
    """A record released on every delivery is delivered exactly `share.delivery.count.limit` times (2
    here), then archived: never delivered again."""
    share.setup(2, delivery_count_limit=2)
    consumer = share.consumer()
    seen = deliveries_until(
        [consumer],
        lambda m: AckType.RELEASE if m.value == b"id-0" else AckType.ACCEPT,
        lambda s: Counter(m.offset for m in s)[0] >= 2,
        20,
    )
    seen += quiet([consumer], 2.0)
    assert sorted((m.offset, m.delivery_count) for m in seen) == [(0, 1), (0, 2), (1, 1)]


def test_renew_is_missing_from_the_client(share: ShareKit) -> None:
    """Kafka 4.4.0 accepts RENEW (KIP-1222: the group's `share.renew.acknowledge.enable` is true), but
    confluent-kafka 2.16 cannot send it: its AcknowledgeType has no RENEW, so the port refuses it by name.
    When this test fails, the client has gained RENEW: wire it in connectors/share.py."""
    share.setup(1)
    assert share_group_config(share.admin, share.group)["share.renew.acknowledge.enable"] == "true"
    assert [t.name for t in AcknowledgeType] == ["ACCEPT", "RELEASE", "REJECT"]
    consumer = share.consumer()
    assert consumer.supports_renew is False
    [msg] = deliveries_until([consumer], lambda _m: AckType.ACCEPT, lambda s: len(s) >= 1, 20)
    with pytest.raises(KafkaClientError) as refused:
        consumer.acknowledge(msg, AckType.RENEW)
    assert refused.value.code == "UNSUPPORTED_ACKNOWLEDGEMENT"


def test_the_broker_writes_a_dead_letter_for_rejected_and_exhausted_records(share: ShareKit) -> None:
    """KIP-1191 ships in 4.4.0: with the group's `errors.deadletterqueue.topic.name` set (a `dlq.` topic
    created with `errors.deadletterqueue.group.enable=true`), a REJECTed record and one released to the
    delivery limit each reach it, with the key and value copied and `__dlq.errors.*` headers naming topic,
    partition, offset, group, delivery count and why; the record's own headers are not copied."""
    dlq = "dlq." + share.topic
    ensure_topics(share.admin, [TopicSpec(name=dlq, config=SHARE_DLQ_TOPIC_CONFIG)])
    share.setup(3, delivery_count_limit=2, dlq_topic=dlq, dlq_copy_record=True)
    consumer = share.consumer()
    fate = {b"id-0": AckType.ACCEPT, b"id-1": AckType.REJECT, b"id-2": AckType.RELEASE}
    seen = deliveries_until(
        [consumer], lambda m: fate[m.value or b""], lambda s: Counter(m.offset for m in s)[2] >= 2, 20
    )
    assert sorted((m.offset, m.delivery_count) for m in seen) == [(0, 1), (1, 1), (2, 1), (2, 2)]
    letters = {key: (value, dict(headers)) for key, value, headers in read_topic(share.kafka, dlq, 2)}
    assert set(letters) == {b"id-1", b"id-2"}
    for key, offset, count, why in [
        (b"id-1", b"1", b"1", b"Offset rejected by client."),
        (b"id-2", b"2", b"2", b"Offset delivery count exceeded the threshold."),
    ]:
        value, headers = letters[key]
        assert value == key
        assert headers == {
            "__dlq.errors.topic": share.topic.encode(),
            "__dlq.errors.partition": b"0",
            "__dlq.errors.offset": offset,
            "__dlq.errors.group": share.group.encode(),
            "__dlq.errors.delivery.count": count,
            "__dlq.errors.message": why,
        }
