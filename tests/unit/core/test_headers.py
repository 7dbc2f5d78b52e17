"""The header contract: round trip, a total bounded decoder, tolerant lineage, user headers kept byte for byte."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core import headers as H
from retrytopics.core.errors import ConfigError, HeaderDecodeError
from retrytopics.core.headers import DlqReason, Lineage, RetryHeaders, decode, decode_lineage, encode, truncate_utf8

INT64 = 2**63 - 1
names = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True)
ids = st.text(min_size=1, max_size=40)
times = st.integers(min_value=0, max_value=INT64)

lineages = st.builds(
    Lineage,
    replay_id=st.none() | ids,
    replayed_at=st.none() | times,
    replay_count=st.integers(min_value=0, max_value=2**31 - 1),
    replay_origin_id=st.none() | ids,
)


@st.composite
def retry_headers(draw: st.DrawFn) -> RetryHeaders:
    first = draw(st.integers(min_value=0, max_value=INT64 // 2))
    last = first + draw(st.integers(min_value=0, max_value=10**12))
    on_tier = draw(st.booleans())
    return RetryHeaders(
        reconsume_times=draw(st.integers(min_value=1, max_value=2**31 - 1)),
        origin_message_id=draw(ids),
        original_topic=draw(names),
        original_partition=draw(st.integers(min_value=0, max_value=2**31 - 1)),
        original_offset=draw(times),
        original_timestamp=draw(st.integers(min_value=-1, max_value=INT64)),
        consumer_group=draw(names),
        tier=draw(st.integers(min_value=0, max_value=99)) if on_tier else None,
        due_at=draw(times) if on_tier else None,
        first_failed_at=first,
        last_failed_at=last,
        exception_type=draw(st.text(min_size=1, max_size=60)),
        exception_message=draw(st.text(max_size=200)),
        exception_trace=draw(st.text(max_size=300)),
        dlq_reason=None if on_tier else draw(st.sampled_from(DlqReason)),
        lineage=draw(lineages),
    )


def sample(**changes: Any) -> RetryHeaders:
    base = RetryHeaders(
        reconsume_times=2,
        origin_message_id="orders-0-42",
        original_topic="orders",
        original_partition=0,
        original_offset=42,
        original_timestamp=1_700_000_000_000,
        consumer_group="billing",
        tier=1,
        due_at=1_700_000_035_000,
        first_failed_at=1_700_000_000_100,
        last_failed_at=1_700_000_005_000,
        exception_type="builtins.OSError",
        exception_message="down",
        exception_trace="Traceback ...",
    )
    return dataclasses.replace(base, **changes)


@given(retry_headers())
def test_round_trip_is_identity(h: RetryHeaders) -> None:
    encoded = encode(h)
    assert decode(encoded) == h
    keys = [k for k, _ in encoded]
    assert len(keys) == len(set(keys)), "no header key is duplicated"
    assert all(k.startswith(H.RETRY_PREFIX) and isinstance(v, bytes) for k, v in encoded)
    assert sum(len(k) + len(v or b"") for k, v in encoded) <= H.MAX_RETRY_HEADERS_BYTES


def test_encoding_is_readable_text() -> None:
    encoded = dict(encode(sample()))
    assert encoded[H.SCHEMA_VERSION] == b"1"
    assert encoded[H.RECONSUME_TIMES] == b"2"
    assert encoded[H.DUE_AT] == b"1700000035000"
    assert encoded[H.REPLAY_COUNT] == b"0"
    assert H.DLQ_REASON not in encoded and H.REPLAY_ID not in encoded  # None fields are left out
    assert dict(encode(sample(tier=None, due_at=None, dlq_reason=DlqReason.TIMEOUT)))[H.DLQ_REASON] == b"timeout"


def replace_header(headers: list[H.Header], key: str, value: bytes | None) -> list[H.Header]:
    return [(k, value if k == key else v) for k, v in headers]


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (H.RECONSUME_TIMES, b"abc", "decimal integer"),
        (H.RECONSUME_TIMES, b"-1", "0.."),
        (H.RECONSUME_TIMES, b"+3", "decimal integer"),
        (H.RECONSUME_TIMES, b"\xd9\xa3", "decimal integer"),  # an Arabic-Indic digit, which int() would accept
        (H.RECONSUME_TIMES, b"007", "decimal integer"),
        (H.ORIGINAL_OFFSET, b"99999999999999999999", "decimal integer"),
        (H.ORIGINAL_PARTITION, b"2147483648", "0.."),
        (H.TIER, b"100", "0..99"),
        (H.ORIGIN_MESSAGE_ID, b"\xff\xfe", "UTF-8"),
        (H.ORIGIN_MESSAGE_ID, b"", "1..512"),
        (H.ORIGINAL_TOPIC, b"no spaces allowed", "topic"),
        (H.SCHEMA_VERSION, b"2", "1..1"),
        (H.DUE_AT, None, "together"),  # a null value counts as absent; tier without due_at is refused
        (H.CONSUMER_GROUP, None, "missing"),
    ],
)
def test_bad_values_name_the_header_and_value(key: str, value: bytes | None, reason: str) -> None:
    with pytest.raises(HeaderDecodeError) as info:
        decode(replace_header(encode(sample()), key, value))
    assert info.value.field == key
    assert info.value.value == value
    assert reason in info.value.reason


def test_a_retry_count_of_0_is_read_only_on_a_blocked_by_key_record() -> None:
    """A record that never ran (dead-lettered unhandled behind its key's dead-lettered predecessor) carries
    `retry.reconsume_times` 0; on any other record 0 is refused, naming the header."""
    with pytest.raises(HeaderDecodeError) as info:
        decode(replace_header(encode(sample()), H.RECONSUME_TIMES, b"0"))
    assert info.value.field == H.RECONSUME_TIMES and ">= 1" in info.value.reason
    blocked = sample(reconsume_times=0, tier=None, due_at=None, dlq_reason=DlqReason.BLOCKED_BY_KEY)
    assert decode(encode(blocked)) == blocked


def test_missing_duplicated_oversized_and_too_many() -> None:
    good = encode(sample())
    with pytest.raises(HeaderDecodeError) as info:
        decode([(k, v) for k, v in good if k != H.ORIGINAL_OFFSET])
    assert (info.value.field, info.value.reason) == (H.ORIGINAL_OFFSET, "missing")
    with pytest.raises(HeaderDecodeError) as info:
        decode([*good, (H.TIER, b"0")])
    assert info.value.field == H.TIER and "duplicated" in info.value.reason
    with pytest.raises(HeaderDecodeError) as info:
        decode(replace_header(good, H.EXCEPTION_TRACE, b"x" * (H.MAX_VALUE_BYTES + 1)))
    assert info.value.field == H.EXCEPTION_TRACE
    assert isinstance(info.value.value, bytes) and len(info.value.value) <= 67  # a bounded excerpt
    with pytest.raises(HeaderDecodeError) as info:
        decode([*good, *[("user", b"")] * H.MAX_HEADER_COUNT])
    assert info.value.field == "headers"


def test_a_future_schema_version_is_reported_before_anything_else() -> None:
    with pytest.raises(HeaderDecodeError) as info:
        decode([(H.SCHEMA_VERSION, b"2")])
    assert info.value.field == H.SCHEMA_VERSION


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({H.FIRST_FAILED_AT: b"9", H.LAST_FAILED_AT: b"8"}, H.LAST_FAILED_AT),
        ({H.DLQ_REASON: b"exhausted"}, H.DLQ_REASON),
        ({H.DLQ_REASON: b"bored"}, H.DLQ_REASON),
    ],
)
def test_cross_field_rules_are_header_errors(changes: dict[str, bytes], field: str) -> None:
    hs = [(k, changes.pop(k, v)) for k, v in encode(sample())]
    hs += list(changes.items())
    with pytest.raises(HeaderDecodeError) as info:
        decode(hs)
    assert info.value.field == field


def test_due_at_without_tier_is_refused() -> None:
    hs = [(k, v) for k, v in encode(sample()) if k != H.TIER]
    with pytest.raises(HeaderDecodeError) as info:
        decode(hs)
    assert info.value.field == H.DUE_AT


known_keys = st.sampled_from([k for k, _ in encode(sample(lineage=Lineage(replay_id="r", replayed_at=1)))])
values = st.none() | st.binary(max_size=40) | st.sampled_from([b"0", b"1", b"-1", b"orders", b"exhausted", b"9" * 30])
entries = st.tuples(known_keys | st.text(max_size=12), values)
garbage = st.integers() | st.text(max_size=5) | st.tuples(st.integers(), st.binary()) | st.tuples(st.text(), st.text())


@given(st.lists(entries | garbage, max_size=40))
def test_decode_is_total(items: list[Any]) -> None:
    try:
        decode(items)
    except HeaderDecodeError as error:
        assert isinstance(error.field, str) and error.reason
        assert not isinstance(error.value, bytes | str) or len(error.value) <= 67


@given(st.data(), retry_headers())
def test_decode_is_total_on_mutations_of_valid_headers(data: st.DataObject, h: RetryHeaders) -> None:
    hs = encode(h)
    index = data.draw(st.integers(min_value=0, max_value=len(hs) - 1))
    hs[index] = (hs[index][0], data.draw(values))
    try:
        assert decode(hs) is not None
    except HeaderDecodeError as error:
        assert error.field.startswith(H.RETRY_PREFIX)


@given(st.lists(entries | garbage, max_size=40))
def test_decode_lineage_never_raises(items: list[Any]) -> None:
    assert isinstance(decode_lineage(items), Lineage)


def test_decode_lineage_keeps_valid_fields_and_drops_the_rest() -> None:
    lineage = decode_lineage(
        [
            ("user", b"x"),
            (H.REPLAY_ID, b"replay-7"),
            (H.REPLAY_COUNT, b"many"),
            (H.REPLAYED_AT, b"5"),
            (H.REPLAYED_AT, b"6"),  # duplicated: ambiguous, dropped
            (H.REPLAY_ORIGIN_ID, b"orders-0-1"),
            (H.TIER, b"3"),  # not lineage: never read here
        ]
    )
    assert lineage == Lineage(replay_id="replay-7", replay_origin_id="orders-0-1")


def test_user_headers_are_kept_byte_for_byte_in_order_with_duplicates() -> None:
    user = [("trace", b"\x00\xff"), ("a", None), ("trace", b"2"), ("Retry.tier", b"mine")]
    mixed = [user[0], *encode(sample()), user[1], user[2], ("retry.custom", b"?"), user[3]]
    assert H.user_headers(mixed) == user


@given(st.text(max_size=300), st.integers(min_value=14 * 3, max_value=400), st.sampled_from(["head", "tail"]))
def test_truncate_utf8_bounds_and_marks(text: str, limit: int, keep: Any) -> None:
    out = truncate_utf8(text, limit, keep=keep)
    assert len(out.encode("utf-8")) <= limit
    if len(text.encode("utf-8")) <= limit:
        assert out == text
    else:
        marker = "…[truncated]"
        assert out.endswith(marker) if keep == "head" else out.startswith(marker)
        body = out.removesuffix(marker) if keep == "head" else out.removeprefix(marker)
        assert text.startswith(body) if keep == "head" else text.endswith(body)


def test_truncate_utf8_examples_and_surrogates() -> None:
    assert truncate_utf8("abcdef", 5, marker="~") == "abcd~"
    assert truncate_utf8("abcdef", 5, marker="~", keep="tail") == "~cdef"
    assert truncate_utf8("ééé", 4, marker="~") == "é~"  # 3 bytes of room: never half of the second "é"
    assert truncate_utf8("bad \udc80", 100) == "bad \\udc80"
    # a text that fits is returned as a plain str, whatever its type (the header encoder remembers str values)
    assert type(truncate_utf8(type("Text", (str,), {})("abc"), 100)) is str
    with pytest.raises(ConfigError):
        truncate_utf8("abcdef", 2, marker="~~~")


def test_redact() -> None:
    text = "auth failed password=hunter2 api_key: abc Authorization: Bearer x.y.z for https://bob:pw@db/x"
    out = H.redact(text)
    for secret in ("hunter2", "abc", "x.y.z", "bob:pw"):
        assert secret not in out
    assert out.count("[hidden]") == 4


#: a bad value of one field each, and the field the error must name
FIELD_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"reconsume_times": 0}, "reconsume_times"),
    ({"original_topic": "a b"}, "original_topic"),
    ({"exception_message": "x" * 2000}, "exception_message"),
    ({"exception_message": "\udc80"}, "exception_message"),
    ({"lineage": "none"}, "lineage"),
]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        *FIELD_ERRORS,
        ({"tier": 1, "dlq_reason": DlqReason.EXHAUSTED}, "dlq_reason"),
        ({"first_failed_at": 10, "last_failed_at": 9}, "last_failed_at"),
    ],
)
def test_constructor_errors_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        sample(**changes)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        *FIELD_ERRORS,
        ({"tier": 1, "due_at": 5, "dlq_reason": DlqReason.EXHAUSTED}, "dlq_reason"),
        ({"last_failed_at": -5}, "last_failed_at"),
        ({"due_at": None}, "due_at"),
    ],
)
def test_evolve_checks_what_it_changes_and_the_rules_between_fields(changes: dict[str, Any], field: str) -> None:
    # the router's copies are as strict as the constructor on what they change (sample() is a tier record)
    with pytest.raises(ConfigError) as info:
        sample().evolve(**changes)
    assert info.value.field == field


@given(h=retry_headers(), data=st.data())
def test_evolve_equals_replace_for_valid_changes(h: RetryHeaders, data: st.DataObject) -> None:
    other = data.draw(retry_headers())
    names = data.draw(st.sets(st.sampled_from(sorted(f.name for f in dataclasses.fields(RetryHeaders)))))
    changes = {name: getattr(other, name) for name in names}
    try:
        expected = dataclasses.replace(h, **changes)
    except ConfigError as exc:
        with pytest.raises(ConfigError) as info:
            h.evolve(**changes)
        assert info.value.field == exc.field
    else:
        assert h.evolve(**changes) == expected
    with pytest.raises(TypeError):
        h.evolve(colour="red")


@given(
    value=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.text(max_size=300),
        st.binary(max_size=10),
        st.floats(allow_nan=False),
    )
)
def test_the_fast_checks_agree_with_the_full_check(value: object) -> None:
    for spec, check in (*H._RETRY_CHECKS, *H._LINEAGE_CHECKS):
        assert check(value) == H._problem(spec, value), (spec.attr, value)


_RAW_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda i: str(i).encode()),
    st.from_regex(rb"\A0[0-9]{1,25}\Z"),  # leading zeros, and too many digits for an int64
    st.sampled_from([b"", b"0", b"-0", b"+1", b" 1", b"1 ", "\u0661\u0662".encode(), "\u00b2".encode(), b"1e3"]),
    st.sampled_from([r.value.encode() for r in DlqReason] + [b"EXHAUSTED", b"orders", b"orders.billing", b"a/b"]),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
    st.integers(min_value=0, max_value=9000).map(lambda n: b"x" * n),
)


@given(spec=st.sampled_from([*H._RETRY_SPECS, *H._LINEAGE_SPECS]), raw=_RAW_VALUES)
def test_the_fast_field_parser_reads_and_refuses_exactly_as_the_full_one(spec: Any, raw: bytes | None) -> None:
    # decode reads the common valid value of each field in a few comparisons; whatever it reads, and every
    # error it raises (header, excerpt, reason), must be what the full parser gives
    parse = H._fast_parser(spec)

    def outcome(read: Any) -> tuple[str, Any]:
        try:
            value = read()
        except HeaderDecodeError as exc:
            return ("refused", (exc.field, exc.value, exc.reason))
        return ("read", (type(value), value))

    assert outcome(lambda: parse(raw)) == outcome(lambda: H._parse(spec, raw))
    assert outcome(lambda: parse(raw)) == outcome(lambda: H._parse(spec, raw))  # the second time from a cache


def _encoded_field_by_field(h: RetryHeaders) -> list[tuple[str, bytes]]:
    """The encoding docs/headers.md states: every field in spec order as `str(value)` in UTF-8, None left out."""
    fields = [(s.header, getattr(h, s.attr)) for s in H._RETRY_SPECS]
    fields += [(s.header, getattr(h.lineage, s.attr)) for s in H._LINEAGE_SPECS]
    return [(header, str(value).encode("utf-8")) for header, value in fields if value is not None]


class _Loud(int):
    """An int that prints otherwise: the remembered pair of an equal plain int must not stand for it."""

    def __str__(self) -> str:
        return "loud"


@given(retry_headers())
def test_encode_writes_every_byte_as_the_field_by_field_encoding(h: RetryHeaders) -> None:
    # encode shares the pairs of values that recur (names, tiers, exception types, traces): the first encoding
    # of a value and every later one are the bytes the field-by-field encoding gives
    assert encode(h) == _encoded_field_by_field(h)
    assert encode(h) == _encoded_field_by_field(h)


def test_a_remembered_pair_never_stands_for_a_value_that_prints_otherwise() -> None:
    plain = sample(original_partition=7)
    loud = sample(original_partition=_Loud(7))
    assert dict(encode(plain))[H.ORIGINAL_PARTITION] == b"7"
    assert dict(encode(loud))[H.ORIGINAL_PARTITION] == b"loud"
    assert encode(loud) == _encoded_field_by_field(loud)


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-2, -1, 0, 1, 2, 98, 99, 100, 2**31 - 2, 2**31 - 1, 2**31, INT64, INT64 + 1]),
    st.text(max_size=30),
    st.sampled_from(["", "é", "\udc80", "a b", "orders", "billing", "x" * 249, "x" * 250, "x" * 512, "x" * 513]),
    st.sampled_from(["y" * 1024, "y" * 1025, "z" * 8192, "z" * 8193, "é" * 600]),
    st.sampled_from([*DlqReason, "exhausted"]),
    st.floats(allow_nan=False),
)


def _edges(spec: Any) -> list[object]:
    """The values either side of each of `spec`'s bounds, and the near misses of its kind."""
    if spec.kind == "int":
        return [spec.lo - 1, spec.lo, spec.hi, spec.hi + 1, True, float(spec.lo), str(spec.lo)]
    if spec.kind == "text":
        sizes = {max(0, spec.lo - 1), spec.lo, spec.hi, spec.hi + 1}
        return [c * n for n in sizes for c in ("a", "é")] + [b"a", "\udc80"]
    return ["orders", "", "a b", "x" * 249, "x" * 250, b"orders", DlqReason.TIMEOUT, "timeout"]


def _accepts_only_valid(spec: Any, value: object) -> None:
    values = list(H._all_retry_fields(sample()))
    values[H._RETRY_FIELD_INDEX[spec.attr]] = value
    if H._plainly_valid(tuple(values)):
        assert all(H._problem(s, values[H._RETRY_FIELD_INDEX[s.attr]]) is None for s in H._RETRY_SPECS), (
            spec.attr,
            value,
        )


@pytest.mark.parametrize("spec", H._RETRY_SPECS, ids=lambda s: s.attr)
def test_the_one_expression_check_accepts_nothing_a_field_check_refuses_at_the_bounds(spec: Any) -> None:
    # a state is checked in one expression first; whatever it accepts, every field check must accept (else the
    # field-by-field checks run and name the first bad field)
    for value in _edges(spec):
        _accepts_only_valid(spec, value)


@given(spec=st.sampled_from(H._RETRY_SPECS), value=_FIELD_VALUES)
def test_the_one_expression_check_accepts_nothing_a_field_check_refuses(spec: Any, value: object) -> None:
    _accepts_only_valid(spec, value)


def test_the_one_expression_check_accepts_the_states_the_router_builds() -> None:
    # the point of it: a state of plain values takes one expression, not sixteen calls
    assert H._plainly_valid(H._all_retry_fields(sample()))
    assert H._plainly_valid(H._all_retry_fields(sample(tier=None, due_at=None, dlq_reason=DlqReason.TIMEOUT)))


@given(h=retry_headers(), field=st.sampled_from(H._RETRY_FIELD_NAMES), value=_FIELD_VALUES)
def test_retry_state_is_the_constructor_for_any_values(h: RetryHeaders, field: str, value: object) -> None:
    """`retry_state` (the router's builder) gives the state the constructor gives, or fails on the field the
    constructor names: a valid state with one field replaced by anything."""
    values = list(H._all_retry_fields(h))
    values[H._RETRY_FIELD_INDEX[field]] = value
    try:
        expected = RetryHeaders(**dict(zip(H._RETRY_FIELD_NAMES, values, strict=True)))
    except ConfigError as exc:
        with pytest.raises(ConfigError) as info:
            H.retry_state(values)
        assert info.value.field == exc.field
    else:
        built = H.retry_state(values)
        assert type(built) is RetryHeaders
        assert built == expected
        assert hash(built) == hash(expected)
        assert encode(built) == _encoded_field_by_field(expected)


def test_a_state_built_by_attribute_stores_is_a_frozen_retry_headers() -> None:
    """The fast builders (`retry_state`, `evolve`) hand out real, frozen `RetryHeaders`, equal to the
    constructor's."""
    h = sample()
    for built in (
        H.retry_state(H._all_retry_fields(h)),
        h.evolve(reconsume_times=9).evolve(reconsume_times=h.reconsume_times),
    ):
        assert type(built) is RetryHeaders
        assert built == h
        assert repr(built) == repr(h)
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.tier = 3  # type: ignore[misc]
        assert pickle.loads(pickle.dumps(built)) == built
    assert H._UnfrozenRetryHeaders.__slots__ == tuple(f.name for f in dataclasses.fields(RetryHeaders))


def test_decode_shares_the_empty_lineage_and_encodes_the_same_bytes() -> None:
    """A tier record without lineage headers decodes to the shared `Lineage()` (which `encode` has ready); one
    with lineage keeps it; both re-encode to the bytes they were decoded from."""
    plain = sample()
    traced = sample(lineage=Lineage(replay_id="r-1", replayed_at=5, replay_count=2, replay_origin_id="o-1"))
    assert decode(encode(plain)).lineage is H._NO_LINEAGE
    assert decode(encode(traced)).lineage == traced.lineage
    for h in (plain, traced):
        assert encode(decode(encode(h))) == encode(h) == _encoded_field_by_field(h)


@given(
    headers=st.lists(
        st.one_of(
            st.tuples(st.sampled_from([H.TIER, H.DUE_AT, "x-user", H.REPLAY_ID]), st.none() | st.binary(max_size=4)),
            st.tuples(st.sampled_from([H.TIER, "x-user"]), st.text(max_size=2)),
            st.sampled_from([("a",), ("a", b"1", b"2"), [H.TIER, b"1"], (b"retry.tier", b"1"), (None, b"1")]),
        ),
        max_size=6,
    )
)
def test_collecting_retry_headers_is_the_checked_collection(headers: list[Any]) -> None:
    """The one-pass collection of retry headers gives what the field-by-field one gives, or its error."""
    try:
        expected = H._collect_checked(headers)
    except HeaderDecodeError as exc:
        with pytest.raises(HeaderDecodeError) as info:
            H._collect(headers)
        assert (info.value.field, info.value.reason) == (exc.field, exc.reason)
    else:
        assert H._collect(headers) == expected


def test_repeated_values_share_their_header_pair_and_never_another_values() -> None:
    """Failure and due times, timestamps and the cached message and trace of consecutive records share one
    (header, bytes) pair when equal (fewer objects kept per hand-off in flight), and every encoding is still
    the field-by-field one, including an int subclass that prints otherwise between equal plain ints."""
    states = [
        sample(original_timestamp=ts, exception_message=msg, exception_trace=msg * 3)
        for ts, msg in [(5, "a"), (5, "a"), (_Loud(5), "a"), (5, "b"), (6, "b"), (6, "a")]
    ]
    encoded = [encode(h) for h in states]
    for h, pairs in zip(states, encoded, strict=True):
        assert pairs == _encoded_field_by_field(h)
    shared = {H.ORIGINAL_TIMESTAMP, H.EXCEPTION_MESSAGE, H.EXCEPTION_TRACE, H.DUE_AT, H.FIRST_FAILED_AT}
    assert all(a is b for a, b in zip(encoded[0], encoded[1], strict=True) if a[0] in shared)
    assert dict(encoded[2])[H.ORIGINAL_TIMESTAMP] == b"loud"
    assert dict(encoded[3])[H.ORIGINAL_TIMESTAMP] == b"5"
