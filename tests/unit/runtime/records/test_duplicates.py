"""The hand-off audit seeded from the destinations' tails (dedupe.hand_off_key, runtime/records/duplicates.py).

The key a consumer looks up for a record must be exactly the audit key of the hop that `route()` writes for
it downstream: the first republish of a source record, the DLQ record of a tier record. Seeding reads every
tier and the DLQ of the assigned partitions' handlers, skips records that carry no retry headers, and a
failed read seeds nothing rather than stopping the consumer.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping, Sequence

import pytest

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.commit_marks import commit_mark
from retrytopics.core.dedupe import HandOffs, audit_key, hand_off_key, record_digest
from retrytopics.core.errors import KafkaClientError, NonRetryable
from retrytopics.core.headers import decode
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.router import InboundRecord, RouteContext, route
from retrytopics.runtime.handoff.publish import PublishJob, too_large_fallback
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import DuplicateCheck, destinations, seed, seed_floors

POLICY = RetryPolicy(delays=["1s", "5s"])
CTX = RouteContext(policy=POLICY, topics=topics_for("orders", "billing", POLICY.tier_delays_ms), group="billing")
NOW = 1_700_000_000_000


def _hop(topic: str, offset: int, headers: Sequence[tuple[str, bytes]], failure: BaseException) -> tuple[str, tuple]:
    record = InboundRecord(topic=topic, partition=0, offset=offset, timestamp_ms=NOW, key=None, headers=tuple(headers))
    r = route(CTX, record, failure, now_ms=NOW, rng=random.Random(1))
    return r.topic, tuple(r.headers)


def test_the_key_looked_up_is_the_key_of_the_hop_route_writes() -> None:
    # given: a source record failing into the first tier, then that copy failing into the second, then the DLQ
    tier1, first = _hop("orders", 42, [], RuntimeError("boom"))
    tier2, second = _hop(tier1, 7, first, RuntimeError("boom"))
    dlq, dead = _hop(tier2, 3, second, NonRetryable(ValueError("bad")))
    assert (tier1, tier2, dlq) == (CTX.topics.tiers[0].topic, CTX.topics.tiers[1].topic, CTX.topics.dlq)
    # then: each record's hand-off key is the audit key of the next hop
    assert (
        hand_off_key(None, ("orders", 0, 42), NOW, 0) == audit_key(decode(list(first))) == ("orders", 0, 42, NOW, 0, 1)
    )
    assert hand_off_key(decode(list(first)), (tier1, 0, 7), NOW + 5, 0) == audit_key(decode(list(second)))
    assert hand_off_key(decode(list(second)), (tier2, 0, 3), NOW + 9, 0) == audit_key(decode(list(dead)))
    # a record at the same offset of a recreated topic (another timestamp) was not handed off
    assert hand_off_key(None, ("orders", 0, 42), NOW + 1, 0) != audit_key(decode(list(first)))


def test_destinations_are_every_tier_and_the_dlq_of_the_assigned_topics() -> None:
    binding = Binding(topic="orders", handler=lambda r: None, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    bindings = {"orders": binding, **{t.topic: binding for t in CTX.topics.tiers}}
    expected = [*(t.topic for t in CTX.topics.tiers), CTX.topics.dlq]
    assert destinations(bindings, [("orders", 0), ("orders", 1), (CTX.topics.tiers[0].topic, 0)]) == expected
    assert destinations(bindings, []) == []


def _message(topic: str, headers: Sequence[tuple[str, bytes]]) -> Message:
    return Message(topic, 0, 0, NOW, None, b"v", tuple(headers), None)


def test_seed_remembers_the_keys_of_the_tails_and_skips_foreign_records() -> None:
    tier1, first = _hop("orders", 42, [], RuntimeError("boom"))
    asked: list[tuple[Sequence[str], int, float]] = []

    def read(topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        asked.append((topics, last, timeout_s))
        return [_message(tier1, first), _message(tier1, [("user", b"x")])]  # the second carries no retry state

    hand_offs = HandOffs()
    assert seed(hand_offs, read, [tier1, CTX.topics.dlq], last=100, timeout_s=2.0) == 2
    assert asked == [([tier1, CTX.topics.dlq], 100, 2.0)]
    assert len(hand_offs) == 1
    # the hop carries the record's key and value: a record at these coordinates with others is not its hop
    assert hand_offs.carries(("orders", 0, 42, NOW, 0, 1), record_digest(None, b"v"))
    assert not hand_offs.carries(("orders", 0, 42, NOW, 0, 1), record_digest(None, b"w"))
    assert not hand_offs.carries(("orders", 0, 42, NOW, 0, 1), record_digest(b"", b"v"))


def test_hand_offs_are_bounded_and_keep_every_copy_digest() -> None:
    hand_offs = HandOffs(capacity=2)
    a, b, c = (("orders", 0, n, NOW, 0, 1) for n in range(3))
    hand_offs.remember(a, b"1")
    hand_offs.remember(a, b"2")  # two copies of one hop (a too-large reference and the value, say)
    assert hand_offs.carries(a, b"1") and hand_offs.carries(a, b"2")
    hand_offs.remember(b, b"1")
    hand_offs.remember(c, b"1")
    assert a not in hand_offs and b in hand_offs and c in hand_offs and len(hand_offs) == 2


def test_a_failed_or_disabled_read_seeds_nothing() -> None:
    def broken(topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        raise KafkaClientError("no broker", code="_TRANSPORT")

    audit = HandOffs()
    assert seed(audit, broken, ["t"], last=100, timeout_s=1.0) == 0
    assert seed(audit, broken, ["t"], last=0, timeout_s=1.0) == 0  # seed_last=0: not even asked
    assert seed(audit, broken, [], last=100, timeout_s=1.0) == 0
    assert len(audit) == 0


def test_a_record_whose_hop_was_dead_lettered_as_a_too_large_reference_is_found_downstream() -> None:
    """A hop refused as too large twice carries a reference instead of the record's value (and no key over
    1 KiB): seeded from it, the record at the coordinates and timestamp it names, with the value size (and key
    up to 1 KiB) it describes, is still the one handed off (suppressed, not dead-lettered a second time);
    another record at those coordinates is not."""
    # given: a keyed source record whose DLQ hop was shrunk to a reference, as publishing it would do
    key, value = b"k" * 2_000, b"v" * 5_000
    source = Message("orders", 0, 42, NOW, key, value, ())
    failed = route(
        CTX,
        InboundRecord(topic="orders", partition=0, offset=42, timestamp_ms=NOW, key=key, headers=()),
        NonRetryable(ValueError("bad")),
        now_ms=NOW,
        rng=random.Random(1),
    )
    job = PublishJob(
        route=failed, key=key, value=value, source=("orders", 0), offset=42, shrink=too_large_fallback(CTX)
    )
    assert job.shrink is not None and job.shrink(job) and job.shrink(job)
    assert job.key is None and json.loads(job.value or b"")["too_large"] is True
    hop = Message(job.route.topic, 0, 9, NOW + 5, job.key, job.value, tuple(job.route.headers))
    binding = Binding(topic="orders", handler=lambda r: None, policy=POLICY, ctx=CTX, value_deserializer=bytes_value)
    suppressor = DuplicateCheck(
        {"orders": binding},
        tail_reader=lambda topics, last, timeout_s: [hop],
        seed_last=10,
        seed_timeout_s=1.0,
    )
    # when: the partition is assigned
    suppressor.seed([("orders", 0)])
    # then: that record was handed off; one with a value of another size, or a key the hop would keep, was not
    assert suppressor.was_handed_off(source, None, None)
    assert not suppressor.was_handed_off(source._replace(value=b"v" * 4_999), None, None)
    assert not suppressor.was_handed_off(source._replace(key=b"short"), None, None)


def test_a_keyed_record_of_a_key_ordered_handler_is_never_suppressed_as_found_downstream() -> None:
    """The seed says that a record's hop exists, not where it went; key order must know that before the records
    of its key behind it are decided, so a keyed record of an ordered handler found downstream is handled again
    (docs/key-ordering.md, section 9). The same record of an unordered handler, or a keyless one, is
    suppressed."""
    record = InboundRecord(topic="orders", partition=0, offset=42, timestamp_ms=NOW, key=b"acct-7", headers=())
    hop = route(CTX, record, RuntimeError("boom"), now_ms=NOW, rng=random.Random(1))
    downstream = Message(hop.topic, 0, 3, NOW + 5, b"acct-7", b"v", tuple(hop.headers))
    keyless = Message(hop.topic, 0, 4, NOW + 5, None, b"w", tuple(_hop("orders", 43, [], RuntimeError("boom"))[1]))
    source = Message("orders", 0, 42, NOW, b"acct-7", b"v", ())

    def check(ordering: KeyOrdering | None) -> DuplicateCheck:
        binding = Binding(
            topic="orders",
            handler=lambda r: None,
            policy=POLICY,
            ctx=CTX,
            value_deserializer=bytes_value,
            ordering=ordering,
        )
        duplicates = DuplicateCheck(
            {"orders": binding},
            tail_reader=lambda topics, last, timeout_s: [downstream, keyless],
            seed_last=10,
            seed_timeout_s=1.0,
        )
        duplicates.seed([("orders", 0)])
        return duplicates

    assert check(None).was_handed_off(source, None, None)
    ordered = check(KeyOrdering())
    assert not ordered.was_handed_off(source, None, None)
    assert ordered.was_handed_off(Message("orders", 0, 43, NOW, None, b"w", ()), None, None)


def test_a_hop_written_before_a_partitions_seed_floor_is_not_taken_for_its_records_hop() -> None:
    hand_offs = HandOffs()
    key = ("orders", 0, 7, NOW, 0, 1)
    hand_offs.remember(key, b"d", NOW - 10)
    assert hand_offs.carries(key, b"d") and hand_offs.carries(key, b"d", NOW - 10)
    assert not hand_offs.carries(key, b"d", NOW)  # written before the reset: the record is handled again
    hand_offs.remember(key, b"d", NOW + 5)  # a second copy, written after it
    assert hand_offs.carries(key, b"d", NOW)
    hand_offs.remember(("orders", 0, 8, NOW, 0, 1), b"d")  # no timestamp: only counts without a floor
    assert hand_offs.carries(("orders", 0, 8, NOW, 0, 1), b"d")
    assert not hand_offs.carries(("orders", 0, 8, NOW, 0, 1), b"d", NOW)


class _Marks:
    def __init__(self, committed: dict[tuple[str, int], str] | None) -> None:
        self.committed, self.marked = committed, {}

    def committed_metadata(self, tps: Sequence[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], str]:
        if self.committed is None:
            raise KafkaClientError("coordinator gone", code="_TRANSPORT")
        return {tp: m for tp, m in self.committed.items() if tp in tps}

    def mark_commits(self, marks: Mapping[tuple[str, int], str]) -> None:
        self.marked.update(marks)


def test_seed_floors_read_the_committed_metadata_and_mark_later_commits() -> None:
    ours, reset, fresh = ("orders", 0), ("orders", 1), ("orders", 2)
    marks = _Marks({ours: commit_mark(0), reset: ""})  # partition 2 has no committed offset
    floors = seed_floors(marks, [ours, reset, fresh], now_ms=NOW, timeout_s=1.0)
    assert floors == {ours: 0, reset: NOW, fresh: 0}
    assert marks.marked == {ours: commit_mark(0), reset: commit_mark(NOW), fresh: commit_mark(0)}
    # a later owner reads the floor the reset set, whenever it starts
    assert seed_floors(_Marks({reset: commit_mark(NOW)}), [reset], now_ms=NOW + 99, timeout_s=1.0) == {reset: NOW}


def test_when_the_committed_offsets_cannot_be_read_no_hop_found_is_trusted(caplog: pytest.LogCaptureFixture) -> None:
    marks = _Marks(None)
    with caplog.at_level(logging.WARNING):
        assert seed_floors(marks, [("orders", 0)], now_ms=NOW, timeout_s=1.0) == {("orders", 0): NOW}
    assert "could not read the committed offsets" in caplog.text
