"""Signed retry headers (retrytopics/core/signing.py): what the signature covers, rotation, key rules,
and the router's use of it (tier records must verify, every route is signed, seeding trusts only verified
tails). A principal with WRITE on a tier or the DLQ must not be able to forge, alter or move retry state.
"""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from retrytopics.app import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.dedupe import HandOffs
from retrytopics.core.errors import ConfigError, HeaderDecodeError, NonRetryable
from retrytopics.core.headers import DlqReason, RetryHeaders, encode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.router import InboundRecord, RouteContext, RouteKind, read_retry_state, route
from retrytopics.core.signing import SIGNATURE, HeaderKeys, sign, sign_state, verify, verify_state
from retrytopics.runtime.records.duplicates import seed, verified_tails

KEY = b"k" * 32
OLD = "an older key, still accepted: 32b"
KEYS = HeaderKeys.of(KEY)
NOW = 1_700_000_000_000
POLICY = RetryPolicy(delays=["1s", "5s"])
TOPICS = topics_for("orders", "billing", POLICY.tier_delays_ms)
CTX = RouteContext(policy=POLICY, topics=TOPICS, group="billing", header_keys=KEYS)
PLAIN = RouteContext(policy=POLICY, topics=TOPICS, group="billing")
TIER = TOPICS.tiers[0].topic

HEADERS = (("user", b"u"), ("retry.reconsume_times", b"1"), ("retry.due_at", b"5"), ("retry.tier", b"0"))
text = st.binary(max_size=40)


# -- the signature itself ---------------------------------------------------------------------------------


def test_a_signed_record_verifies_and_signing_again_replaces_the_signature() -> None:
    signed = sign(KEYS, TIER, b"key", b"value", HEADERS)
    assert signed[:-1] == HEADERS and signed[-1][0] == SIGNATURE and len(signed[-1][1] or b"") == 64
    assert verify(KEYS, TIER, b"key", b"value", signed) is None
    assert sign(KEYS, TIER, b"key", b"value", signed) == signed  # one signature, never two


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(["topic", "key", "value", "header_value", "header_name", "extra_header", "drop_header"]),
    data=text,
)
def test_any_change_to_a_signed_field_breaks_verification(field: str, data: bytes) -> None:
    signed = list(sign(KEYS, TIER, b"key", b"value", HEADERS))
    topic, key, value = TIER, b"key", b"value"
    if field == "topic":
        topic = TOPICS.tiers[1].topic if not data else TOPICS.dlq  # moved to another tier or to the DLQ
    elif field == "key":
        key = None if data == b"key" else data
    elif field == "value":
        value = None if data == b"value" else data
    elif field == "header_value":
        signed[1] = ("retry.reconsume_times", data if data != b"1" else b"2")
    elif field == "header_name":
        signed[2] = ("retry.due_at_", signed[2][1])
    elif field == "extra_header":
        signed.insert(0, ("retry.replay_id", data))
    else:
        del signed[3]
    assert verify(KEYS, topic, key, value, signed) is not None


_USER_NAMES = st.sampled_from(["tenant", "role", "trace", "retry"])  # "retry": no prefix, a user header


@settings(max_examples=200, deadline=None)
@given(
    user=st.lists(st.tuples(_USER_NAMES, st.one_of(st.none(), text)), min_size=1, max_size=4),
    change=st.sampled_from(["rewrite", "add", "drop", "duplicate", "reorder"]),
    data=text,
)
def test_user_headers_their_order_and_duplicates_are_signed(
    user: list[tuple[str, bytes | None]], change: str, data: bytes
) -> None:
    """A user header is part of what a record means (`tenant`, `role`): rewriting, adding, dropping,
    duplicating or reordering one fails verification, like a retry header."""
    signed = list(sign(KEYS, TIER, None, b"v", [*user, *HEADERS]))
    assert verify(KEYS, TIER, None, b"v", signed) is None
    name, old = signed[0]
    if change == "rewrite":
        signed[0] = (name, data if data != old else data + b"x")
    elif change == "add":
        signed.insert(len(user), ("tenant", data))
    elif change == "drop":
        del signed[0]
    elif change == "duplicate":
        signed.insert(0, signed[0])
    else:
        assume(len(user) > 1 and user[0] != user[-1])
        signed[0], signed[len(user) - 1] = signed[len(user) - 1], signed[0]
    assert verify(KEYS, TIER, None, b"v", signed) is not None


def test_a_tier_record_with_rewritten_tenant_and_role_headers_goes_to_the_dlq() -> None:
    """A forgery that user headers alone would allow: a genuine signed tier record copied with `tenant` and `role`
    rewritten no longer verifies, so its consumer dead-letters it instead of handing it to the handler."""
    source = InboundRecord(
        topic="orders",
        partition=0,
        offset=9,
        timestamp_ms=NOW,
        key=b"k",
        value=b"v",
        headers=(("tenant", b"acme"), ("role", b"viewer")),
    )
    hop = route(CTX, source, OSError("down"), now_ms=NOW, rng=random.Random(0))
    genuine = InboundRecord(
        topic=TIER, partition=0, offset=1, timestamp_ms=NOW, key=b"k", value=b"v", headers=hop.headers
    )
    assert read_retry_state(CTX, genuine, now_ms=NOW + 1_000) is not None
    rewritten = tuple((k, {"tenant": b"globex", "role": b"admin"}.get(k, v)) for k, v in hop.headers)
    forged = dataclasses.replace(genuine, headers=rewritten)
    with pytest.raises(HeaderDecodeError) as caught:
        read_retry_state(CTX, forged, now_ms=NOW + 1_000)
    assert caught.value.field == SIGNATURE and "wrong" in caught.value.reason
    r = route(CTX, forged, OSError("down"), now_ms=NOW + 1_000, rng=random.Random(0))
    assert r.kind is RouteKind.DLQ and r.reason is DlqReason.INVALID_RETRY_HEADERS


#: A record signed by version 1 (the release before user headers were signed), with key `KEY`.
_V1_HEADERS = (
    ("tenant", b"acme"),
    ("role", b"viewer"),
    ("retry.reconsume_times", b"1"),
    ("retry.due_at", b"5"),
    ("retry.tier", b"0"),
    (SIGNATURE, b"8994675531f1eca81d30b594e07912a910fafb3711e91287926eb1ee110f7ddb"),
)


def test_a_version_1_signature_is_named_and_accepted_only_when_asked() -> None:
    """Records signed before the change verify only with keys that accept version 1 (an upgrade's window);
    otherwise the reason says which version signed them. Either way a v1 record is v1: no v2 signature
    verifies it, and with `accept_v1` its user headers are not covered (why it is opt-in)."""
    topic = "orders.billing.retry.1s"
    problem = verify(KEYS, topic, b"key", b"value", _V1_HEADERS)
    assert problem is not None and problem.startswith("version 1")
    lenient = HeaderKeys.of(KEY, accept_v1=True)
    assert verify(lenient, topic, b"key", b"value", _V1_HEADERS) is None
    assert verify(lenient, topic, b"key", b"other value", _V1_HEADERS) is not None  # v1 still covers the value
    assert HeaderKeys.of(lenient).accept_v1 and "accept_v1=True" in repr(lenient) and "k" * 32 not in repr(lenient)


@settings(max_examples=100, deadline=None)
@given(
    a=st.lists(st.tuples(st.sampled_from(["retry.a", "retry.b", "user"]), st.one_of(st.none(), text)), max_size=3),
    b=st.lists(st.tuples(st.sampled_from(["retry.a", "retry.b", "user"]), st.one_of(st.none(), text)), max_size=3),
)
def test_the_encoding_is_unambiguous(a: list, b: list) -> None:
    # two different header lists never share a signature: fields are length-prefixed, order counts
    signed = sign(KEYS, TIER, None, b"", a)
    assert (verify(KEYS, TIER, None, b"", [*b, signed[-1]]) is None) == (a == b)


def test_missing_repeated_malformed_and_wrong_signatures_are_named() -> None:
    signed = sign(KEYS, TIER, None, b"v", HEADERS)
    assert "missing" in (verify(KEYS, TIER, None, b"v", HEADERS) or "")
    assert "repeated" in (verify(KEYS, TIER, None, b"v", [*signed, signed[-1]]) or "")
    assert "malformed" in (verify(KEYS, TIER, None, b"v", [*HEADERS, (SIGNATURE, b"zz" * 32)]) or "")
    assert "malformed" in (verify(KEYS, TIER, None, b"v", [*HEADERS, (SIGNATURE, None)]) or "")
    other = HeaderKeys.of(b"x" * 32)
    assert "wrong" in (verify(other, TIER, None, b"v", signed) or "")


def test_rotation_signs_with_the_first_key_and_accepts_every_key() -> None:
    by_old = sign(HeaderKeys.of(OLD), TIER, b"k", b"v", HEADERS)
    rotated = HeaderKeys.of([KEY, OLD])
    assert verify(rotated, TIER, b"k", b"v", by_old) is None  # records signed before the rotation still pass
    assert sign(rotated, TIER, b"k", b"v", HEADERS) == sign(KEYS, TIER, b"k", b"v", HEADERS)
    assert verify(HeaderKeys.of(OLD), TIER, b"k", b"v", sign(rotated, TIER, b"k", b"v", HEADERS)) is not None


@pytest.mark.parametrize(
    "bad, field",
    [
        ("short", "header_key"),
        (b"x" * 31, "header_key"),
        ([KEY, "short"], "header_key[1]"),
        ([], "header_key"),
        (12345, "header_key"),
        ([KEY, 7], "header_key[1]"),
    ],
)
def test_a_short_or_ill_typed_key_fails_at_start_up_naming_the_field(bad: object, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", header_key=bad)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert "short" not in str(caught.value)  # a key, even a refused one, is never echoed


def test_keys_never_show_in_a_repr_or_an_error() -> None:
    secret = "s3cret-" * 6
    keys = HeaderKeys.of(secret)
    ctx = dataclasses.replace(CTX, header_keys=keys)
    assert secret not in repr(keys) and secret not in repr(ctx) and "s3cret" not in str(ctx)
    with pytest.raises(ConfigError) as caught:
        HeaderKeys.of("s3cret-short")
    assert "s3cret" not in str(caught.value) and "s3cret" not in repr(caught.value)


# -- in the router ----------------------------------------------------------------------------------------


def _tier_record(ctx: RouteContext = CTX, *, value: bytes | None = b"v", key: bytes | None = b"k") -> InboundRecord:
    """A genuine tier-0 record as `route()` writes it for a failed source record."""
    source = InboundRecord(topic="orders", partition=0, offset=9, timestamp_ms=NOW, key=key, headers=(), value=value)
    r = route(ctx, source, OSError("down"), now_ms=NOW, rng=random.Random(0))
    assert r.kind is RouteKind.TIER and r.topic == TIER
    return InboundRecord(
        topic=r.topic, partition=0, offset=1, timestamp_ms=NOW, key=key, headers=r.headers, value=value
    )


def test_every_route_is_signed_for_its_destination() -> None:
    record = _tier_record()
    assert verify(KEYS, TIER, b"k", b"v", record.headers) is None
    dead = route(CTX, record, NonRetryable(ValueError("no")), now_ms=NOW + 2_000, rng=random.Random(0))
    assert dead.kind is RouteKind.DLQ
    assert verify(KEYS, TOPICS.dlq, b"k", b"v", dead.headers) is None
    assert verify(KEYS, TIER, b"k", b"v", dead.headers) is not None  # not valid on any other topic
    assert SIGNATURE not in dict(
        route(PLAIN, dataclasses.replace(record, headers=()), OSError(), now_ms=NOW, rng=random.Random(0)).headers
    )  # without keys: nothing signed


def test_a_genuine_signed_tier_record_is_read_and_retried_normally() -> None:
    state = read_retry_state(CTX, _tier_record(), now_ms=NOW + 1_000)
    assert state is not None and state.reconsume_times == 1


@pytest.mark.parametrize(
    "forge", ["unsigned", "wrong_key", "altered_value", "altered_key", "altered_state", "moved_from_tier_1"]
)
def test_a_forged_tier_record_goes_to_the_dlq_as_invalid_retry_headers(forge: str) -> None:
    record = _tier_record()
    headers = list(record.headers)
    if forge == "unsigned":
        record = dataclasses.replace(record, headers=tuple(h for h in headers if h[0] != SIGNATURE))
    elif forge == "wrong_key":
        record = dataclasses.replace(record, headers=sign(HeaderKeys.of(b"y" * 32), TIER, b"k", b"v", headers))
    elif forge == "altered_value":
        record = dataclasses.replace(record, value=b"other")
    elif forge == "altered_key":
        record = dataclasses.replace(record, key=b"other")
    elif forge == "altered_state":
        record = dataclasses.replace(
            record, headers=tuple((k, b"2") if k == "retry.reconsume_times" else (k, v) for k, v in headers)
        )
    else:  # headers the app signed for another topic (tier 1), copied verbatim into tier 0
        state = read_retry_state(CTX, record, now_ms=NOW)
        assert state is not None
        record = dataclasses.replace(record, headers=sign(KEYS, TOPICS.tiers[1].topic, b"k", b"v", encode(state)))
    with pytest.raises(HeaderDecodeError) as caught:
        read_retry_state(CTX, record, now_ms=NOW + 1_000)
    assert caught.value.field == SIGNATURE
    r = route(CTX, record, OSError("down"), now_ms=NOW + 1_000, rng=random.Random(0))
    assert r.kind is RouteKind.DLQ and r.reason is DlqReason.INVALID_RETRY_HEADERS
    message = r.retry.exception_message
    assert "signature" in message and ("missing" in message) == (forge == "unsigned")
    assert verify(KEYS, TOPICS.dlq, record.key, record.value, r.headers) is None  # the DLQ record itself is signed


def test_without_keys_an_unsigned_tier_record_is_read_as_before() -> None:
    record = _tier_record(PLAIN)
    assert SIGNATURE not in dict(record.headers)
    assert isinstance(read_retry_state(PLAIN, record, now_ms=NOW + 1_000), RetryHeaders)


# -- seeding ----------------------------------------------------------------------------------------------


def test_seeding_ignores_tail_records_whose_signature_does_not_verify(caplog: pytest.LogCaptureFixture) -> None:
    # given: a genuine hop of source record 9, and a forged hop naming source record 10 (valid headers,
    # written by a principal with WRITE on the tier but without the key)
    genuine = _tier_record()
    forged_state = dataclasses.replace(
        read_retry_state(CTX, genuine, now_ms=NOW) or _fail(), original_offset=10, origin_message_id="orders-0-10"
    )
    forged = Message(TIER, 0, 2, NOW, b"k", b"v", tuple(encode(forged_state)), None)
    tail = [Message(TIER, 0, 1, NOW, b"k", b"v", genuine.headers, None), forged]
    audit = HandOffs()
    # when
    with caplog.at_level(logging.WARNING):
        seed(audit, verified_tails(lambda topics, last, timeout_s: tail, KEYS), [TIER], last=10, timeout_s=1)
    # then: only the genuine hop marks its source record as handed off; record 10 is handled, not skipped
    ts = forged_state.original_timestamp
    assert ("orders", 0, 9, ts, 0, 1) in audit and ("orders", 0, 10, ts, 0, 1) not in audit
    assert "ignored 1 tail records" in caplog.text and KEY.decode() not in caplog.text
    # and without keys, the reader is used as it is
    reader = lambda topics, last, timeout_s: tail  # noqa: E731
    assert verified_tails(reader, None) is reader


def _fail() -> RetryHeaders:
    raise AssertionError("no state")


# -- replay marks -----------------------------------------------------------------------------------------


def test_a_replay_mark_binds_its_replay_id_topic_and_source_record_and_needs_the_key() -> None:
    """A mark made for one (replay id, topic, source record) is no mark for another, and without the nonce
    (or, with header keys, without a header key) none can be made: what a source writer cannot forge."""
    from retrytopics.core.signing import mark_keys, replay_mark

    nonce = bytes(range(32))
    (plain,) = mark_keys(nonce, None)
    mark = replay_mark(plain, "fix-1", "orders", "orders-0-7")
    assert len(mark) == 64 and mark == replay_mark(plain, "fix-1", "orders", "orders-0-7")
    others = {
        replay_mark(plain, "fix-2", "orders", "orders-0-7"),
        replay_mark(plain, "fix-1", "orders.dlq.parked", "orders-0-7"),
        replay_mark(plain, "fix-1", "orders", "orders-0-8"),
        replay_mark(b"\0" * 32, "fix-1", "orders", "orders-0-7"),
    }
    assert mark not in others and len(others) == 4
    rotated = mark_keys(nonce, HeaderKeys.of([KEY, OLD]))
    assert len(rotated) == 2 and plain not in rotated  # the ledger's nonce alone makes no keyed mark
    assert rotated[1] == mark_keys(nonce, HeaderKeys.of(OLD))[0]  # a rerun after a rotation still checks old marks
    assert mark_keys(bytes(32), KEYS) != mark_keys(nonce, KEYS)


def test_with_header_keys_a_started_entry_without_a_nonce_is_refused_not_trusted() -> None:
    """A `started` ledger entry without a nonce makes a rerun trust plain `retry.replay_id` markers, which any
    source writer can put on a record. Anyone with WRITE on the ledger can plant one for a replay id not
    started yet, so with header keys (what a rerun's trust rests on) such an entry is refused, naming the
    replay id; without keys it is trusted as before, and a nonce gives the keyed mark keys."""
    from retrytopics.core.signing import mark_keys, started_mark_keys

    planted = {"event": "started", "replay_id": "fix-1", "marks": {"orders": {"0": 0}}}
    with pytest.raises(ConfigError) as refused:
        started_mark_keys(planted, KEYS)
    assert refused.value.field == "replay_id" and "fix-1" in str(refused.value)
    assert started_mark_keys(planted, None) is None
    nonce = bytes(range(32))
    assert started_mark_keys({**planted, "nonce": nonce.hex()}, KEYS) == mark_keys(nonce, KEYS)
    with pytest.raises(ConfigError):
        started_mark_keys({**planted, "nonce": "not hex"}, KEYS)


# -- key-state records (docs/key-ordering.md, section 9) ---------------------------------------------------------

STATE_TOPIC = "orders.billing.keys"
CHAIN_KEY = b"chain/orders/0/00" + b"acct-7".hex().encode()


@pytest.mark.parametrize("value", [b'{"v":1,"head":0,"frontier":0,"at":0,"followers":0,"since":0}', None])
def test_a_signed_key_state_record_or_tombstone_verifies_and_nothing_else_does(value: bytes | None) -> None:
    header = sign_state(KEYS, STATE_TOPIC, CHAIN_KEY, value)
    assert header[0] == SIGNATURE and len(header[1]) == 64
    assert verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, value, [header]) is None
    other_value = None if value is not None else b'{"v":1}'  # a record's signature never signs its tombstone
    assert verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, other_value, [header]) is not None
    assert verify_state(KEYS, STATE_TOPIC, CHAIN_KEY + b"0", value, [header]) is not None  # another key
    assert verify_state(KEYS, "orders.other-group.keys", CHAIN_KEY, value, [header]) is not None  # moved
    assert verify_state(HeaderKeys.of(OLD), STATE_TOPIC, CHAIN_KEY, value, [header]) is not None
    assert (verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, value, []) or "").startswith("missing")
    assert verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, value, [header, header]) == "repeated retry.signature header"
    assert (verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, value, [(SIGNATURE, b"zz" * 32)]) or "").startswith("malformed")


def test_a_key_state_signature_is_no_retry_header_signature_and_the_reverse() -> None:
    """Separate domains: a signature of one kind never verifies as the other for the same bytes."""
    value = b'{"v":1,"fate":"succeeded"}'
    state = sign_state(KEYS, STATE_TOPIC, CHAIN_KEY, value)
    assert verify(KEYS, STATE_TOPIC, CHAIN_KEY, value, [state]) is not None
    retry = sign(KEYS, STATE_TOPIC, CHAIN_KEY, value, ())
    assert verify_state(KEYS, STATE_TOPIC, CHAIN_KEY, value, retry) is not None


def test_key_state_rotation_signs_with_the_first_key_and_accepts_every_key() -> None:
    old_header = sign_state(HeaderKeys.of(OLD), STATE_TOPIC, CHAIN_KEY, None)
    rotated = HeaderKeys.of([KEY, OLD])
    assert verify_state(rotated, STATE_TOPIC, CHAIN_KEY, None, [old_header]) is None
    assert sign_state(rotated, STATE_TOPIC, CHAIN_KEY, None) == sign_state(KEYS, STATE_TOPIC, CHAIN_KEY, None)
    assert verify_state(HeaderKeys.of(KEY), STATE_TOPIC, CHAIN_KEY, None, [old_header]) is not None  # retired
