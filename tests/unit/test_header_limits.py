"""What the router writes stays within what the decoder reads back.

The decoder refuses a record with more than `MAX_HEADER_COUNT` headers and a retry header value longer than
`MAX_VALUE_BYTES`. The writer keeps every hop within both, from the same definitions: a record with more than
`MAX_USER_HEADERS` user headers goes to the DLQ at its first failure as `too_many_headers` (its own state and
lineage, no user headers), and one with exactly that many can make its largest hop (a replayed record on a
tier, every lineage field set, signed) and still be decoded.
"""

from __future__ import annotations

import random

import pytest

import retrytopics.core.headers as H
from retrytopics.core.headers import MAX_HEADER_COUNT, MAX_USER_HEADERS, DlqReason, Header, decode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import InboundRecord, RouteContext, RouteKind, read_retry_state, route
from retrytopics.core.signing import HeaderKeys

POLICY = RetryPolicy(delays=["5s"], non_retryable=(ValueError,))
TOPICS = topics_for("orders", "billing", POLICY.tier_delays_ms)
NOW = 1_700_000_000_000
LINEAGE: tuple[Header, ...] = (
    ("retry.replay_id", b"r" * 512),
    ("retry.replayed_at", str(NOW).encode()),
    ("retry.replay_count", b"3"),
    ("retry.replay_origin_id", b"o" * 512),
)


def _ctx(signed: bool) -> RouteContext:
    keys = HeaderKeys.of(b"k" * 32) if signed else None
    return RouteContext(policy=POLICY, topics=TOPICS, group="billing", header_keys=keys)


def _source(users: int) -> InboundRecord:
    headers = (*((f"h{i}", b"x") for i in range(users)), *LINEAGE)
    return InboundRecord(
        topic="orders", partition=2, offset=41, timestamp_ms=NOW, key=b"k", headers=headers, value=b"v"
    )


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
def test_the_most_user_headers_allowed_make_every_hop_readable(signed: bool) -> None:
    ctx = _ctx(signed)
    # the first hop, to the tier, with every lineage field set
    first = route(ctx, _source(MAX_USER_HEADERS), RuntimeError("x" * 5000), now_ms=NOW, rng=random.Random(0))
    assert first.kind is RouteKind.TIER and len(first.headers) <= MAX_HEADER_COUNT
    tier = InboundRecord(
        topic=first.topic, partition=2, offset=0, timestamp_ms=NOW, key=b"k", headers=first.headers, value=b"v"
    )
    state = read_retry_state(ctx, tier, now_ms=NOW)
    assert state is not None and state.lineage.replay_count == 3
    # and its DLQ hop
    last = route(ctx, tier, ValueError("y"), now_ms=NOW, rng=random.Random(0))
    assert last.kind is RouteKind.DLQ and len(last.headers) <= MAX_HEADER_COUNT
    assert decode(list(last.headers)).dlq_reason is DlqReason.NON_RETRYABLE


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
@pytest.mark.parametrize("failure", [RuntimeError("retryable"), ValueError("x")], ids=["to_tier", "to_dlq"])
def test_one_user_header_more_goes_to_the_dlq_with_its_own_state(signed: bool, failure: Exception) -> None:
    r = route(_ctx(signed), _source(MAX_USER_HEADERS + 1), failure, now_ms=NOW, rng=random.Random(0))
    assert (r.kind, r.topic, r.reason, r.due_at_ms) == (RouteKind.DLQ, TOPICS.dlq, DlqReason.TOO_MANY_HEADERS, None)
    assert [h for h in r.headers if not h[0].startswith("retry.")] == []
    state = decode(list(r.headers))
    assert (state.original_topic, state.original_partition, state.original_offset) == ("orders", 2, 41)
    assert (state.tier, state.dlq_reason, state.reconsume_times) == (None, DlqReason.TOO_MANY_HEADERS, 1)
    assert (state.lineage.replay_id, state.lineage.replay_count) == ("r" * 512, 3)
    assert state.exception_type == f"builtins.{type(failure).__name__}"


def test_lineage_is_read_past_the_decoders_header_bound() -> None:
    # a record too large for a hop still carries its lineage into its DLQ record
    headers = [*((f"h{i}", b"x") for i in range(MAX_HEADER_COUNT + 10)), ("retry.replay_count", b"2")]
    assert H.decode_lineage(headers).replay_count == 2


def test_no_retry_header_spec_allows_a_value_the_decoder_refuses() -> None:
    for spec in (*H._RETRY_SPECS, *H._LINEAGE_SPECS):
        longest = {"int": 20, "text": spec.hi, "topic": 249, "reason": max(len(r.value) for r in DlqReason)}[spec.kind]
        assert longest <= H.MAX_VALUE_BYTES, spec.header


def test_a_replay_of_the_most_user_headers_allowed_to_the_first_tier_is_read_back() -> None:
    """The largest hop a record makes is a replay of its DLQ record to the first tier, signed: its user
    headers, a tier's retry state, every lineage field, `retry.replay_original`, `retry.replay_mark` and
    the signature. With `MAX_USER_HEADERS` user headers the tier consumer still decodes it (not
    `invalid_retry_headers` with the tier's coordinates)."""
    from retrytopics.console import actions
    from retrytopics.console.entries import entry_of
    from retrytopics.core.signing import mark_keys, sign

    ctx = _ctx(signed=True)
    assert ctx.header_keys is not None
    dead = route(ctx, _source(MAX_USER_HEADERS), ValueError("x" * 5000), now_ms=NOW, rng=random.Random(0))
    assert dead.kind is RouteKind.DLQ and dead.reason is DlqReason.NON_RETRYABLE
    entry = entry_of(
        topic=TOPICS.dlq,
        partition=0,
        offset=0,
        timestamp_ms=NOW,
        key=b"k",
        value=b"v",
        headers=list(dead.headers),
        whole=True,
    )
    tier = TOPICS.tiers[0].topic
    replayed = actions.replay_headers(
        entry,
        to_tier=True,
        replay_id="r" * 512,
        now_ms=NOW,
        topic=tier,
        mark_key=mark_keys(b"n" * 32, ctx.header_keys)[0],
    )
    headers = sign(ctx.header_keys, tier, b"k", b"v", replayed)
    assert len([h for h in headers if not h[0].startswith("retry.")]) == MAX_USER_HEADERS
    assert len(headers) <= MAX_HEADER_COUNT
    record = InboundRecord(topic=tier, partition=0, offset=0, timestamp_ms=NOW, key=b"k", headers=headers, value=b"v")
    state = read_retry_state(ctx, record, now_ms=NOW)
    assert state is not None and state.tier == 0 and state.lineage.replay_id == "r" * 512
