"""The in-memory share group (`retrytopics/testing/broker.py`) and Apache Kafka 4.4.0 agree on what the share-group
consumer relies on. The same scenarios run on both through `ShareConsumerPort` (`MemoryShareConsumer` and
`connectors.share.KafkaShareConsumer`) and must observe the same outcome:

- per record, the sequence of deliveries (offset, delivery count) that ACCEPT, RELEASE and REJECT lead to,
  with archiving at the delivery count limit, across two members of one partition, and nothing after;
- closing a member sends its acknowledgements and releases the rest at once, to the other member, with the
  delivery count raised.

What Kafka does beyond this is tested on Kafka (test_share_broker.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from retrytopics.core.ports import AckType, Message, ShareConsumerPort
from retrytopics.testing import MemoryBroker

from .conftest import ShareKit

pytestmark = pytest.mark.broker

GROUP = "contract"


class MemorySide:
    def __init__(self) -> None:
        self.broker = MemoryBroker()
        self.topic = "contract"

    def setup(self, records: int, *, limit: int, one_batch: bool = False) -> None:
        self.broker.create_topic(self.topic)
        self.broker.configure_share_group(GROUP, auto_offset_reset="earliest", delivery_count_limit=limit)
        for i in range(records):
            self.broker.append(self.topic, f"id-{i}".encode(), key=f"id-{i}".encode())

    def consumer(self) -> ShareConsumerPort:
        consumer = self.broker.share_consumer(GROUP, max_records=5, supports_renew=False)
        consumer.subscribe([self.topic])
        return consumer

    def rounds(self, seconds: float) -> Iterator[None]:
        for _ in range(int(seconds * 10)):
            yield


class KafkaSide:
    def __init__(self, kit: ShareKit) -> None:
        self.kit = kit
        self.topic = kit.topic

    def setup(self, records: int, *, limit: int, one_batch: bool = False) -> None:
        self.kit.setup(records, delivery_count_limit=limit, one_per_batch=not one_batch)

    def consumer(self) -> ShareConsumerPort:
        return self.kit.consumer(**{"max.poll.records": 5})

    def rounds(self, seconds: float) -> Iterator[None]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            yield


Side = MemorySide | KafkaSide


@pytest.fixture(params=["memory", "kafka"])
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == "memory":
        return MemorySide()
    return KafkaSide(request.getfixturevalue("share"))


def _drive(
    side: Side, members: list[ShareConsumerPort], decide: Callable[[Message], AckType], until: Callable[[int], bool]
) -> list[tuple[int, int]]:
    """Poll the members in turn, settling each batch as `decide` says, until `until(deliveries)`; then as
    long again with nothing expected. Returns every delivery as (offset, delivery count)."""
    seen: list[tuple[int, int]] = []
    for phase in (20.0, 2.0):
        for _ in side.rounds(phase):
            if phase > 2.0 and until(len(seen)):
                break
            for member in members:
                batch = member.poll(0.1)
                for msg in batch:
                    assert msg.delivery_count is not None
                    seen.append((msg.offset, msg.delivery_count))
                    member.acknowledge(msg, decide(msg))
                if batch:
                    assert all(e is None for e in member.commit(asynchronous=False).values())
    return sorted(seen)


def test_fates_of_records_under_each_acknowledgement(side: Side) -> None:
    """ACCEPT ends a record at its first delivery; RELEASE every time ends it archived at the limit (3);
    RELEASE then REJECT ends it at its second delivery. Two members of one partition, same deliveries."""
    side.setup(6, limit=3)
    members = [side.consumer(), side.consumer()]

    def decide(msg: Message) -> AckType:
        kind = msg.offset % 3
        if kind == 0:
            return AckType.ACCEPT
        if kind == 1:
            return AckType.RELEASE
        return AckType.RELEASE if msg.delivery_count == 1 else AckType.REJECT

    expected = sorted(
        [(0, 1), (3, 1)] + [(o, c) for o in (1, 4) for c in (1, 2, 3)] + [(o, c) for o in (2, 5) for c in (1, 2)]
    )
    assert _drive(side, members, decide, lambda n: n >= len(expected)) == expected


def test_close_releases_what_a_member_holds(side: Side) -> None:
    """A member that closes holding records it did not acknowledge gives them back at once: the other
    member gets them with delivery count 2; the one it accepted is not delivered again."""
    side.setup(3, limit=5, one_batch=True)  # so that one poll acquires all three
    leaving = side.consumer()
    held: list[Message] = []
    for _ in side.rounds(20.0):
        held = leaving.poll(0.1)
        if held:
            break
    assert [(m.offset, m.delivery_count) for m in held] == [(0, 1), (1, 1), (2, 1)]
    leaving.acknowledge(held[0], AckType.ACCEPT)
    leaving.close()
    staying = side.consumer()
    again = _drive(side, [staying], lambda _m: AckType.ACCEPT, lambda n: n >= 2)
    assert again == [(1, 2), (2, 2)]
