"""The router: every path a failed record can take, and the invariants that hold across hops."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core import headers as H
from retrytopics.core.errors import ConfigError, HeaderDecodeError, NonRetryable, PoisonRecordError, Retry
from retrytopics.core.headers import DlqReason, Lineage
from retrytopics.core.naming import NamingStrategy, topics_for
from retrytopics.core.policy import UNLIMITED, RetryPolicy
from retrytopics.core.router import InboundRecord, Route, RouteContext, RouteKind, read_retry_state, route

T0 = 1_700_000_000_000
USER = (("trace-id", b"\x00abc\xff"), ("empty", None), ("trace-id", b"dup"))


def context(policy: RetryPolicy | None = None, **kwargs: object) -> RouteContext:
    policy = policy or RetryPolicy()
    strategy = kwargs.pop("strategy", NamingStrategy.BY_DELAY)
    topics = topics_for("orders", "billing", policy.tier_delays_ms, strategy=strategy)  # type: ignore[arg-type]
    return RouteContext(policy=policy, topics=topics, group="billing", **kwargs)  # type: ignore[arg-type]


def source(*, key: bytes | None = b"k", headers: tuple[H.Header, ...] = USER, offset: int = 42) -> InboundRecord:
    return InboundRecord(topic="orders", partition=3, offset=offset, timestamp_ms=T0 - 5, key=key, headers=headers)


def arrive(r: Route, *, offset: int = 7, key: bytes | None = b"k") -> InboundRecord:
    """The record as the next consumer sees it after the runtime published ``r``."""
    return InboundRecord(topic=r.topic, partition=0, offset=offset, timestamp_ms=T0, key=key, headers=r.headers)


def run(ctx: RouteContext, failures: Sequence[BaseException], *, seed: int = 0) -> list[Route]:
    """Fail a record once per entry of ``failures``, each time at its due time; stop at the DLQ."""
    rng, record, now, routes = random.Random(seed), source(), T0, []
    for failure in failures:
        r = route(ctx, record, failure, now_ms=now, rng=rng)
        routes.append(r)
        if r.kind is RouteKind.DLQ:
            break
        assert r.due_at_ms is not None
        now = r.due_at_ms
        record = arrive(r, offset=len(routes))
    return routes


def test_first_failure_on_the_source_topic() -> None:
    r = route(context(), source(), OSError("db down"), now_ms=T0, rng=random.Random(0))
    assert (r.kind, r.topic, r.due_at_ms, r.reason) == (RouteKind.TIER, "orders.billing.retry.5s", T0 + 5_000, None)
    h = r.retry
    assert (h.reconsume_times, h.tier, h.due_at, h.first_failed_at, h.last_failed_at) == (1, 0, T0 + 5_000, T0, T0)
    assert (h.origin_message_id, h.original_topic, h.original_partition, h.original_offset) == (
        "orders-3-42",
        "orders",
        3,
        42,
    )
    assert h.original_timestamp == T0 - 5 and h.consumer_group == "billing"
    assert h.exception_type == "builtins.OSError" and h.exception_message == "db down"
    assert r.headers == (*USER, *H.encode(h))
    assert r.partition_hint is None  # keyed: key hashing picks the tier partition
    keyless = route(context(), source(key=None), OSError(), now_ms=T0, rng=random.Random(0))
    assert keyless.partition_hint == 3


def test_exhausted_after_one_retry_per_tier_counts_failures() -> None:
    routes = run(context(), [OSError(str(i)) for i in range(10)])
    assert [r.topic for r in routes] == [
        "orders.billing.retry.5s",
        "orders.billing.retry.30s",
        "orders.billing.retry.5m",
        "orders.billing.dlq",
    ]
    dlq = routes[-1]
    assert dlq.reason is DlqReason.EXHAUSTED and dlq.retry.dlq_reason is DlqReason.EXHAUSTED
    assert dlq.retry.reconsume_times == 4  # three retries, four failures
    assert dlq.retry.tier is None and dlq.due_at_ms is None
    assert dlq.retry.exception_message == "3"  # the last failure is described


@pytest.mark.parametrize(("max_retries", "tiers"), [(0, []), (1, [0]), (5, [0, 1, 2, 2, 2])])
def test_max_retries(max_retries: int, tiers: list[int]) -> None:
    routes = run(context(RetryPolicy(max_retries=max_retries)), [OSError()] * 10)
    assert [r.retry.tier for r in routes[:-1]] == tiers
    assert routes[-1].reason is DlqReason.EXHAUSTED and routes[-1].retry.reconsume_times == max_retries + 1


@settings(max_examples=25)
@given(st.integers(min_value=4, max_value=200))
def test_unlimited_reuses_the_last_tier_topic(hops: int) -> None:
    ctx = context(RetryPolicy(max_retries=UNLIMITED))
    routes = run(ctx, [OSError()] * hops)
    assert all(r.kind is RouteKind.TIER for r in routes)
    assert {r.topic for r in routes[2:]} == {"orders.billing.retry.5m"}
    assert {r.topic for r in routes} <= set(ctx.topics.all_topics)  # no topic explosion


def test_timeout_counts_from_the_first_failure() -> None:
    ctx = context(RetryPolicy(max_retries=UNLIMITED, timeout="16m"))
    routes = run(ctx, [OSError()] * 50)
    # 5s, 30s, 5m, 5m, 5m = 15m35s; the next 5m would end past 16m
    assert [r.retry.tier for r in routes[:-1]] == [0, 1, 2, 2, 2]
    assert routes[-1].reason is DlqReason.TIMEOUT and routes[-1].retry.reconsume_times == 6
    assert all(r.due_at_ms is None or r.due_at_ms <= T0 + 16 * 60_000 for r in routes)


def test_timeout_also_applies_to_a_long_first_delay() -> None:
    ctx = context(RetryPolicy(delays=["5s", "1h"], timeout="10m"))
    routes = run(ctx, [OSError()] * 5)
    assert [r.kind for r in routes] == [RouteKind.TIER, RouteKind.DLQ] and routes[-1].reason is DlqReason.TIMEOUT


@pytest.mark.parametrize(
    ("failure", "reason", "described"),
    [
        (NonRetryable(KeyError("sku")), DlqReason.NON_RETRYABLE, "builtins.KeyError"),
        (ValueError("bad"), DlqReason.NON_RETRYABLE, "builtins.ValueError"),
        (
            PoisonRecordError("orders", 3, 42, b"\xff", ValueError("json")),
            DlqReason.POISON,
            "retrytopics.errors.PoisonRecordError",
        ),
        (
            HeaderDecodeError("retry.tier", b"x", "bad"),
            DlqReason.INVALID_RETRY_HEADERS,
            "retrytopics.errors.HeaderDecodeError",
        ),
    ],
)
def test_straight_to_the_dlq(failure: BaseException, reason: DlqReason, described: str) -> None:
    ctx = context(RetryPolicy(non_retryable=(ValueError,)))
    r = route(ctx, source(), failure, now_ms=T0, rng=random.Random(0))
    assert (r.kind, r.topic, r.reason) == (RouteKind.DLQ, "orders.billing.dlq", reason)
    assert r.retry.reconsume_times == 1 and r.retry.exception_type == described
    assert r.headers[: len(USER)] == USER


def test_retry_after_hint_picks_a_tier_that_is_never_early() -> None:
    ctx = context(RetryPolicy(jitter=0.5))
    for seed in range(200):
        r = route(ctx, source(), Retry(after="20s"), now_ms=T0, rng=random.Random(seed))
        assert r.topic == "orders.billing.retry.30s" and r.due_at_ms is not None
        assert T0 + 20_000 <= r.due_at_ms <= T0 + 300_000


def test_a_hint_beyond_the_longest_tier_is_capped_to_it() -> None:
    r = route(context(), source(), Retry(after="2h"), now_ms=T0, rng=random.Random(0))
    assert r.topic == "orders.billing.retry.5m" and r.due_at_ms == T0 + 300_000


def test_per_exception_schedule_routes_to_its_own_tiers() -> None:
    ctx = context(RetryPolicy(per_exception={TimeoutError: ["1m", "10m"]}))
    assert ctx.topics.all_topics == (
        *tuple(f"orders.billing.retry.{d}" for d in ("5s", "30s", "1m", "5m", "10m")),
        "orders.billing.dlq",
    )
    routes = run(ctx, [TimeoutError(), TimeoutError(), TimeoutError()])
    assert [r.topic.rsplit(".", 1)[1] for r in routes] == ["1m", "10m", "dlq"]


@given(
    st.lists(st.sampled_from([OSError, TimeoutError, ConnectionError]), min_size=1, max_size=30),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(),
)
def test_invariants_across_hops(kinds: list[type[Exception]], jitter: float, seed: int) -> None:
    ctx = context(RetryPolicy(max_retries=UNLIMITED, jitter=jitter, per_exception={TimeoutError: ["1s", "1m"]}))
    routes = run(ctx, [k("x") for k in kinds], seed=seed)
    first = routes[0].retry
    for n, r in enumerate(routes, start=1):
        h = r.retry
        assert h.reconsume_times == n  # exactly one per hop
        assert (
            h.origin_message_id,
            h.original_topic,
            h.original_partition,
            h.original_offset,
            h.original_timestamp,
            h.first_failed_at,
        ) == (first.origin_message_id, "orders", 3, 42, T0 - 5, T0)
        keys = Counter(k for k, _ in r.headers if k.startswith(H.RETRY_PREFIX))
        assert max(keys.values()) == 1  # no header key duplicated
        assert r.headers[: len(USER)] == USER  # user headers byte for byte, in order
        assert H.decode(r.headers) == h  # what the next consumer reads is what was decided
        tier = ctx.topics.tier_by_topic(r.topic)
        assert tier is not None and h.due_at is not None
        wait = h.due_at - h.last_failed_at
        assert tier.delay_ms * (1 - jitter) - 1 <= wait <= min(tier.delay_ms * (1 + jitter) + 1, 60_000 * 5)


@given(
    st.lists(st.sampled_from([OSError, TimeoutError, ValueError, PoisonRecordError]), min_size=1, max_size=12),
    st.integers(),
)
def test_a_state_the_caller_read_once_routes_exactly_as_if_route_read_it(
    kinds: list[type[Exception]], seed: int
) -> None:
    # the runtime reads a record's retry state when it arrives and hands it to route() (headers
    # are decoded once); every hop must route byte for byte as if route() had read the headers itself
    ctx = context(RetryPolicy(max_retries=UNLIMITED, jitter=0.5, per_exception={TimeoutError: ["1s", "1m"]}))
    record, now = source(), T0
    for n, kind in enumerate(kinds, start=1):
        failure = kind("t", 0, 1, b"", ValueError("x")) if kind is PoisonRecordError else kind("x")  # type: ignore[call-arg]
        previous = read_retry_state(ctx, record, now_ms=now)
        read_here = route(ctx, record, failure, now_ms=now, rng=random.Random(seed))
        passed_in = route(ctx, record, failure, now_ms=now, rng=random.Random(seed), previous=previous)
        assert passed_in == read_here
        assert passed_in.retry.reconsume_times == n
        if passed_in.kind is RouteKind.DLQ:
            break
        assert passed_in.due_at_ms is not None
        now, record = passed_in.due_at_ms, arrive(passed_in, offset=n)


def test_headers_the_caller_could_not_read_go_to_the_dlq_as_invalid() -> None:
    # the runtime passes previous=None and the HeaderDecodeError it got as the failure
    ctx = context()
    first = route(ctx, source(), OSError("down"), now_ms=T0, rng=random.Random(0))
    forged = arrive(
        dataclasses.replace(
            first, headers=tuple((k, b"x") if k == H.RECONSUME_TIMES else (k, v) for k, v in first.headers)
        )
    )
    with pytest.raises(HeaderDecodeError) as bad:
        read_retry_state(ctx, forged, now_ms=T0 + 5_000)
    r = route(ctx, forged, bad.value, now_ms=T0 + 5_000, rng=random.Random(0), previous=None)
    assert (r.kind, r.reason, r.retry.exception_type) == (
        RouteKind.DLQ,
        DlqReason.INVALID_RETRY_HEADERS,
        "retrytopics.errors.HeaderDecodeError",
    )
    assert H.RECONSUME_TIMES in r.retry.exception_message


@given(st.lists(st.integers(min_value=0, max_value=10**7), min_size=2, max_size=20))
def test_due_times_are_monotone_per_tier_without_jitter(fail_times: list[int]) -> None:
    ctx = context()
    dues = [
        route(ctx, source(offset=i), OSError(), now_ms=T0 + t, rng=random.Random(i)).due_at_ms
        for i, t in enumerate(sorted(fail_times))
    ]
    assert dues == sorted(dues)  # type: ignore[type-var]


forged_keys = st.sampled_from(
    [
        H.RECONSUME_TIMES,
        H.TIER,
        H.DUE_AT,
        H.ORIGIN_MESSAGE_ID,
        H.ORIGINAL_TOPIC,
        H.DLQ_REASON,
        H.CONSUMER_GROUP,
        H.FIRST_FAILED_AT,
        H.SCHEMA_VERSION,
        "retry.anything",
    ]
)
forged = st.lists(st.tuples(forged_keys, st.none() | st.binary(max_size=20) | st.sampled_from([b"999", b"0"])))


@given(forged, st.sampled_from([OSError(), ValueError(), Retry(after="1s")]))
def test_forged_headers_on_a_source_record_change_nothing(extra: list[H.Header], failure: BaseException) -> None:
    ctx = context(RetryPolicy(non_retryable=(ValueError,)))
    clean = route(ctx, source(), failure, now_ms=T0, rng=random.Random(1))
    dirty = route(ctx, source(headers=(*extra, *USER)), failure, now_ms=T0, rng=random.Random(1))
    assert dirty == clean


@pytest.mark.parametrize("failure", [OSError(), Retry(after="1s")])
def test_a_complete_well_formed_forged_header_set_on_a_source_record_is_ignored(failure: BaseException) -> None:
    ctx = context()
    genuine = route(ctx, source(), OSError(), now_ms=T0, rng=random.Random(0))
    forged = dataclasses.replace(
        genuine.retry, reconsume_times=3, tier=2, due_at=T0, origin_message_id="payments-0-1", first_failed_at=0
    )
    record = source(headers=(*H.encode(forged), *USER))
    assert read_retry_state(ctx, record, now_ms=T0) is None
    r = route(ctx, record, failure, now_ms=T0, rng=random.Random(0))
    assert r == route(ctx, source(), failure, now_ms=T0, rng=random.Random(0))
    assert (r.kind, r.retry.reconsume_times, r.retry.origin_message_id) == (RouteKind.TIER, 1, "orders-3-42")
    assert r.retry.first_failed_at == T0


def test_lineage_is_the_only_thing_kept_from_a_source_record() -> None:
    replayed = (
        *USER,
        (H.REPLAY_ID, b"run-9"),
        (H.REPLAY_COUNT, b"2"),
        (H.REPLAY_ORIGIN_ID, b"orders-1-1"),
        (H.ORIGIN_MESSAGE_ID, b"orders-1-1"),
    )
    r = route(context(), source(headers=replayed), OSError(), now_ms=T0, rng=random.Random(0))
    assert r.retry.lineage == Lineage(replay_id="run-9", replay_count=2, replay_origin_id="orders-1-1")
    assert r.retry.origin_message_id == "orders-3-42"  # an incoming origin id never becomes ours
    assert r.headers[: len(USER)] == USER and H.decode(r.headers).lineage == r.retry.lineage


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ((("msg-id", b"abc-123"),), "abc-123"),
        ((("msg-id", b"a"), ("msg-id", b"b")), "orders-3-42"),  # ambiguous
        ((("msg-id", b"\xff"),), "orders-3-42"),
        ((("msg-id", b"x" * 600),), "orders-3-42"),
        ((("msg-id", None),), "orders-3-42"),
        ((), "orders-3-42"),
    ],
)
def test_origin_id_from_a_configured_header(headers: tuple[H.Header, ...], expected: str) -> None:
    r = route(context(id_header="msg-id"), source(headers=headers), OSError(), now_ms=T0, rng=random.Random(0))
    assert r.retry.origin_message_id == expected


def tier_record(**changes: object) -> InboundRecord:
    first = route(context(), source(), OSError(), now_ms=T0, rng=random.Random(0))
    h = dataclasses.replace(first.retry, **changes)  # type: ignore[arg-type]
    return dataclasses.replace(arrive(first), headers=(*USER, *H.encode(h)))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tier": 1}, H.TIER),
        ({"consumer_group": "other"}, H.CONSUMER_GROUP),
        ({"original_topic": "payments"}, H.ORIGINAL_TOPIC),
        ({"reconsume_times": 4}, H.RECONSUME_TIMES),
        ({"due_at": T0 + 10**12}, H.DUE_AT),
        ({"due_at": T0 + 5_000 + 1}, H.DUE_AT),  # more than the tier's delay after the failure
        ({"last_failed_at": T0 + 10**9, "due_at": T0 + 10**9}, H.LAST_FAILED_AT),
    ],
)
def test_forged_or_corrupt_tier_headers_go_to_the_dlq(changes: dict[str, object], field: str) -> None:
    ctx, record = context(), tier_record(**changes)
    with pytest.raises(HeaderDecodeError) as info:
        read_retry_state(ctx, record, now_ms=T0 + 5_000)
    assert info.value.field == field
    r = route(ctx, record, OSError(), now_ms=T0 + 5_000, rng=random.Random(0))
    assert (r.kind, r.reason) == (RouteKind.DLQ, DlqReason.INVALID_RETRY_HEADERS)
    assert r.retry.origin_message_id == "orders.billing.retry.5s-0-7"  # untrusted: restarts from its coordinates
    assert field in r.retry.exception_message and r.headers[: len(USER)] == USER


def test_an_unlimited_policy_still_bounds_the_failure_count() -> None:
    ctx = context(RetryPolicy(max_retries=UNLIMITED))
    first = route(ctx, source(), OSError(), now_ms=T0, rng=random.Random(0))
    h = dataclasses.replace(first.retry, reconsume_times=2**31 - 1)
    record = dataclasses.replace(arrive(first), headers=tuple(H.encode(h)))
    r = route(ctx, record, OSError(), now_ms=T0 + 5_000, rng=random.Random(0))
    assert r.reason is DlqReason.INVALID_RETRY_HEADERS and H.RECONSUME_TIMES in r.retry.exception_message


def test_with_max_retries_zero_no_tier_record_is_legitimate() -> None:
    zero = context(RetryPolicy(max_retries=0))
    with pytest.raises(HeaderDecodeError) as info:
        read_retry_state(zero, tier_record(), now_ms=T0 + 5_000)
    assert info.value.field == H.RECONSUME_TIMES


def test_garbage_on_a_tier_goes_to_the_dlq() -> None:
    record = InboundRecord(
        topic="orders.billing.retry.30s",
        partition=1,
        offset=9,
        timestamp_ms=T0,
        key=None,
        headers=((H.TIER, b"\xff"), ("u", b"1")),
    )
    r = route(context(), record, OSError(), now_ms=T0, rng=random.Random(0))
    assert r.reason is DlqReason.INVALID_RETRY_HEADERS and r.partition_hint == 1
    assert r.headers[0] == ("u", b"1") and [k for k, _ in r.headers].count(H.TIER) == 0


def test_a_valid_tier_record_is_read_back() -> None:
    assert read_retry_state(context(), tier_record(), now_ms=T0 + 5_000) == H.decode(tier_record().headers)
    assert read_retry_state(context(), source(), now_ms=T0) is None


def test_shared_tiers_accept_other_source_topics() -> None:
    ctx = context(strategy=NamingStrategy.SHARED)
    first = route(ctx, source(), OSError(), now_ms=T0, rng=random.Random(0))
    h = dataclasses.replace(first.retry, original_topic="payments")
    record = dataclasses.replace(arrive(first), headers=tuple(H.encode(h)))
    assert read_retry_state(ctx, record, now_ms=T0 + 5_000) == h


def test_a_clock_step_back_never_moves_failure_time_backwards() -> None:
    ctx = context()
    first = route(ctx, source(), OSError(), now_ms=T0, rng=random.Random(0))
    second = route(ctx, arrive(first), OSError(), now_ms=T0 - 1_000, rng=random.Random(0))
    assert second.retry.last_failed_at == T0 and second.due_at_ms == T0 + 30_000


def test_fifty_hops_stay_within_a_fixed_bound_of_the_original() -> None:
    ctx = context(RetryPolicy(max_retries=UNLIMITED))
    original = sum(len(k) + len(v or b"") for k, v in USER)
    failures = [RuntimeError(f"password=secret{i} " + "é" * 5_000) for i in range(50)]
    routes = run(ctx, failures)
    sizes = [sum(len(k) + len(v or b"") for k, v in r.headers) for r in routes]
    assert len(routes) == 50
    assert max(sizes) <= original + H.MAX_RETRY_HEADERS_BYTES
    assert max(sizes) - min(sizes[1:]) < 100  # no growth hop after hop, only digits vary
    assert len({len(r.headers) for r in routes}) == 1
    last = routes[-1].retry
    assert "secret" not in last.exception_message and last.exception_message.endswith("…[truncated]")
    assert len(last.exception_trace.encode()) <= H.TRACE_LIMIT_BYTES


def test_an_unprintable_exception_still_routes() -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    r = route(context(), source(), Nasty(), now_ms=T0, rng=random.Random(0))
    assert r.kind is RouteKind.TIER and "unprintable" in r.retry.exception_message


def test_context_and_topic_errors() -> None:
    policy = RetryPolicy()
    with pytest.raises(ConfigError) as info:
        RouteContext(policy=policy, topics=topics_for("orders", "billing", (1_000,)), group="billing")
    assert info.value.field == "topics"
    with pytest.raises(ConfigError) as info:
        RouteContext(policy=policy, topics=topics_for("orders", "billing", policy.tier_delays_ms), group="x")
    assert info.value.field == "group"
    stranger = dataclasses.replace(source(), topic="elsewhere")
    with pytest.raises(ConfigError) as info:
        route(context(), stranger, OSError(), now_ms=T0, rng=random.Random(0))
    assert info.value.field == "record.topic"


def _retry_from(cause: BaseException, *, after: str | None = "5s", suppress: bool = False) -> Retry:
    """`raise Retry(after=...) from cause` (or `from None`), caught, as the runtime receives it."""
    try:
        try:
            raise cause
        except BaseException as exc:
            if suppress:
                raise Retry(after=after) from None
            raise Retry(after=after) from exc
    except Retry as signal:
        return signal


def test_retry_from_an_exception_describes_the_cause_on_the_tier_and_in_the_dlq() -> None:
    # the tier and the DLQ described the signal ("retrytopics.errors.Retry", "retry requested")
    ctx = context(RetryPolicy(delays=["5s", "30s"]))
    routes = run(ctx, [_retry_from(TimeoutError("gateway slow"), after="20s") for _ in range(3)])
    assert [r.kind for r in routes] == [RouteKind.TIER, RouteKind.TIER, RouteKind.DLQ]
    assert routes[0].topic == "orders.billing.retry.30s"  # the hint still picks the delay
    for r in routes:
        assert (r.retry.exception_type, r.retry.exception_message) == ("builtins.TimeoutError", "gateway slow")
        assert "TimeoutError: gateway slow" in r.retry.exception_trace and "retrytopics.errors.Retry" not in (
            r.retry.exception_trace
        )


def test_retry_inside_except_describes_the_context_and_a_bare_retry_itself() -> None:
    ctx = context()
    try:
        try:
            raise ConnectionError("reset")
        except ConnectionError:
            raise Retry(after="1s")  # noqa: B904 - the implicit context is the real failure
    except Retry as implicit:
        assert route(ctx, source(), implicit, now_ms=T0, rng=random.Random(0)).retry.exception_type == (
            "builtins.ConnectionError"
        )
    for signal in (Retry(after="1s"), _retry_from(ConnectionError("x"), suppress=True)):
        r = route(ctx, source(), signal, now_ms=T0, rng=random.Random(0))
        assert (r.retry.exception_type, r.retry.exception_message) == ("retrytopics.errors.Retry", "retry requested")


def test_wrapped_signals_unwrap_to_the_innermost_failure() -> None:
    inner = KeyError("sku")
    nested = NonRetryable(_retry_from(inner))
    r = route(context(), source(), nested, now_ms=T0, rng=random.Random(0))
    assert (r.kind, r.retry.exception_type) == (RouteKind.DLQ, "builtins.KeyError")


def test_verdicts_remembered_per_class_route_as_classifying_each_failure_and_stay_bounded() -> None:
    """The router remembers a lone failure's verdict per exception class: every route equals the route of a
    context that classifies each failure afresh, and the memory never holds more than its bound, however
    many classes a handler raises. Routes are real, frozen `Route`s."""
    policy = RetryPolicy(non_retryable=(ValueError,), max_retries=2, per_exception={TimeoutError: ["1m"]})
    remembering, fresh = context(policy), context(policy)
    object.__setattr__(fresh, "_verdicts", None)  # classify every failure
    classes = [type(f"Failure{i}", (RuntimeError if i % 3 else ValueError,), {}) for i in range(300)]
    failures = [*(cls("x") for cls in classes), TimeoutError("t"), Retry(after="30s"), NonRetryable("n"), OSError()]
    for attempt, failure in enumerate(failures * 2):
        record = source(offset=attempt)
        got = route(remembering, record, failure, now_ms=T0, rng=random.Random(attempt))
        want = route(fresh, record, failure, now_ms=T0, rng=random.Random(attempt))
        assert type(got) is Route
        assert got == want
        assert got.retry == want.retry
        assert remembering._verdicts is not None
        assert len(remembering._verdicts) <= 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.topic = "elsewhere"  # type: ignore[misc]
