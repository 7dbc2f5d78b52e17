"""The duplicate audit recognises a repeated hop of one source record, and only that: two source records
sharing a producer-chosen id are never copies of each other. It stays bounded and forgets rolled-back keys."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.dedupe import AuditKey, DuplicateAudit, audit_key
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import InboundRecord, Route, RouteContext, read_retry_state, route

T0 = 1_700_000_000_000
A: AuditKey = ("orders", 0, 1, T0, 0, 1)


def test_second_sighting_is_a_duplicate() -> None:
    audit = DuplicateAudit(capacity=10)
    assert audit.check_and_remember(A) is False
    assert audit.check_and_remember(A) is True


def test_other_attempts_replays_and_source_records_are_not_duplicates() -> None:
    audit = DuplicateAudit(capacity=10)
    audit.remember(A)
    assert ("orders", 0, 1, T0, 0, 2) not in audit  # the next hop of the same record
    assert ("orders", 0, 1, T0, 1, 1) not in audit  # the same hop after a replay from the DLQ
    assert ("orders", 0, 2, T0, 0, 1) not in audit  # another source record
    assert ("orders", 1, 1, T0, 0, 1) not in audit and ("payments", 0, 1, T0, 0, 1) not in audit
    assert ("orders", 0, 1, T0 + 1, 0, 1) not in audit  # the same offset in a recreated topic


def test_capacity_bounds_memory_and_evicts_least_recently_seen() -> None:
    a, b, c = (("orders", 0, n, T0, 0, 1) for n in range(3))
    audit = DuplicateAudit(capacity=2)
    audit.remember(a)
    audit.remember(b)
    audit.check_and_remember(a)  # refreshes a
    audit.remember(c)
    assert len(audit) == 2
    assert b not in audit
    assert a in audit and c in audit


def test_forget_undoes_a_rolled_back_handling() -> None:
    audit = DuplicateAudit(capacity=2)
    audit.remember(A)
    audit.forget(A)
    assert A not in audit


@pytest.mark.parametrize("capacity", [0, -1, True, 1.5])
def test_capacity_must_be_a_positive_int(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        DuplicateAudit(capacity=capacity)  # type: ignore[arg-type]


# -- colliding ids ---------------------------------------------------------------------------------------------

CTX = RouteContext(
    policy=RetryPolicy(delays=["5s", "30s"]),
    topics=topics_for("orders", "billing", (5_000, 30_000)),
    group="billing",
    id_header="order-id",
)


def _tier_arrival(r: Route, offset: int) -> InboundRecord:
    return InboundRecord(topic=r.topic, partition=0, offset=offset, timestamp_ms=T0, key=b"k", headers=r.headers)


#: a source record: (partition, offset, order-id); ids come from a tiny alphabet, so they collide often
_sources = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 50), st.sampled_from(["A", "B", "a-very-common-id"])),
    min_size=1,
    max_size=25,
    unique_by=lambda s: (s[0], s[1]),
)


@settings(max_examples=200, deadline=None)
@given(sources=_sources, copies=st.lists(st.integers(1, 3), min_size=25, max_size=25), seed=st.integers(0, 2**16))
def test_only_copies_of_one_hop_of_one_source_record_are_duplicates(
    sources: list[tuple[int, int, str]], copies: list[int], seed: int
) -> None:
    """Every source record fails once; its republish lands in the tier 1-3 times (crashes duplicate it) and
    the copies interleave. The audit suppresses exactly the extra copies, whatever ids the producer chose."""
    arrivals: list[tuple[int, InboundRecord]] = []
    for n, (partition, offset, order_id) in enumerate(sources):
        record = InboundRecord(
            topic="orders",
            partition=partition,
            offset=offset,
            timestamp_ms=T0,
            key=b"k",
            headers=(("order-id", order_id.encode()),),
        )
        r = route(CTX, record, OSError("down"), now_ms=T0, rng=random.Random(seed))
        assert r.retry.origin_message_id == order_id  # the user's idempotency key is kept as it was
        arrivals += [(n, _tier_arrival(r, len(arrivals) + i)) for i in range(copies[n])]
    random.Random(seed).shuffle(arrivals)
    audit, handled = DuplicateAudit(capacity=100), []
    for n, arrival in arrivals:
        state = read_retry_state(CTX, arrival, now_ms=T0)
        assert state is not None
        if not audit.check_and_remember(audit_key(state)):
            handled.append(n)
    assert sorted(handled) == list(range(len(sources)))  # each source record handled once: none lost, none twice
