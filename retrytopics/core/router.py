"""The router: given a failed record, say where it goes next, when it is due, and with which headers.

Pure: a function of the policy, the topics, the record, the failure, ``now_ms`` and an ``rng``. It never
publishes, commits or pauses; the runtime carries out the :class:`Route` it returns::

    ctx = RouteContext(policy=policy, topics=topics_for("orders", "billing", policy.tier_delays_ms),
                       group="billing")
    r = route(ctx, record, exc, now_ms=clock_ms(), rng=random.Random())
    producer.produce(r.topic, key=record.key, value=value, headers=list(r.headers), partition=...)

Counting: ``retry.reconsume_times`` is the number of failures so far. The first republish carries 1; a
record allowed N retries fails N + 1 times and lands in the DLQ with ``reconsume_times == N + 1``.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Final, Literal, NamedTuple, Protocol

from retrytopics.core.backoff import schedule_delay_ms, tier_for_hint
from retrytopics.core.classify import Verdict, classify, lone_verdict, plain_classes, retry_after_ms
from retrytopics.core.diagnostics import describe
from retrytopics.core.due import due_problem, longest_wait_ms, next_due_ms
from retrytopics.core.errors import ConfigError, DeliveryLimitReached, HeaderDecodeError
from retrytopics.core.headers import (
    MAX_USER_HEADERS,
    DlqReason,
    Header,
    RetryHeaders,
    decode,
    decode_lineage,
    encode,
    redact,
    retry_state,
    user_headers,
)
from retrytopics.core.naming import NamingStrategy, TierTopic, TopicSet
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.signing import SIGNATURE, HeaderKeys, sign, verify

__all__ = [
    "Consumed",
    "InboundRecord",
    "Route",
    "RouteContext",
    "RouteKind",
    "Unread",
    "delivery_limit_route",
    "origin_message_id",
    "read_retry_state",
    "route",
    "tier_wait_bounds_ms",
    "too_large_reference",
    "too_large_reference_record",
    "too_large_route",
]

_ID_LIMIT_BYTES: Final = 512
_MAX_RECONSUME_TIMES: Final = 2**31 - 2
_VERDICT_REASON: Final = {Verdict.POISON: DlqReason.POISON, Verdict.NON_RETRYABLE: DlqReason.NON_RETRYABLE}


@dataclass(frozen=True, slots=True, kw_only=True)
class InboundRecord:
    """What the runtime tells the router about a consumed record. ``value`` is read only when the context
    has ``header_keys``: the signature covers its SHA-256."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[Header, ...]
    value: bytes | None = None


class Consumed(Protocol):
    """What the router reads of a consumed record: an :class:`InboundRecord`, or any record with these
    fields (the runtime passes its `ports.Message` as it is, without a copy per record)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def headers(self) -> tuple[Header, ...]: ...
    @property
    def value(self) -> bytes | None: ...


class RouteKind(StrEnum):
    """Where a route leads."""

    TIER = "tier"
    """A retry tier topic; the record is due at ``Route.due_at_ms``."""
    DLQ = "dlq"
    """The dead-letter topic; ``Route.reason`` says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """The decision for one failed record.

    ``headers`` are the record's user headers byte for byte, then ``encode(retry)``: earlier retry headers
    are replaced, never appended. A record with more than ``MAX_USER_HEADERS`` user headers is routed to the
    DLQ as ``too_many_headers`` without them, whatever its failure: no hop of it could be read back. ``partition_hint`` is None when the record has a key (key hashing picks
    the partition, as on the source); otherwise it is the original partition, which the runtime takes
    modulo the destination's partition count.
    """

    kind: RouteKind
    topic: str
    due_at_ms: int | None
    reason: DlqReason | None
    retry: RetryHeaders
    headers: tuple[Header, ...]
    partition_hint: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteContext:
    """Everything the router needs besides the record: policy, topics, group.

    ``id_header``: a user header whose value is the message id (else ``<topic>-<partition>-<offset>``).
    ``clock_skew_ms``: how far ahead of this consumer's clock another instance's clock may run before its
    due times and failure times are treated as forged. ``redact`` hides secrets in the exception headers
    (``Redactor.with_patterns([...])`` adds patterns to the built-in ones). ``header_keys``: sign every
    route's headers (``retry.signature``, see retrytopics/core/signing.py) and refuse tier records whose
    signature is missing or wrong; None (default): nothing is signed or checked.
    """

    policy: RetryPolicy
    topics: TopicSet
    group: str
    id_header: str | None = None
    clock_skew_ms: int = 60_000
    redact: Callable[[str], str] = redact
    header_keys: HeaderKeys | None = None
    #: the verdict on a lone failure, per exception class (`classify.lone_verdict`); bounded by
    #: `_VERDICTS_KEPT`, since failure classes are the handler's to choose. Empty and unused when the policy
    #: has a `retry_if` or an unusual class (`classify.plain_classes`).
    _verdicts: dict[type[BaseException], tuple[Verdict, tuple[int, ...]]] | None = field(
        init=False, repr=False, compare=False, default=None
    )
    #: the most failures a tier record may carry (`_check_bounds`, for every tier record read)
    _reconsume_bound: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.header_keys is not None and not isinstance(self.header_keys, HeaderKeys):
            raise ConfigError("header_keys", "[hidden]", "expected HeaderKeys (HeaderKeys.of(key) or a list of keys)")
        delays = tuple(t.delay_ms for t in self.topics.tiers)
        if delays != self.policy.tier_delays_ms:
            raise ConfigError(
                "topics",
                delays,
                f"tier delays differ from policy.tier_delays_ms {self.policy.tier_delays_ms}; "
                "build the TopicSet from the policy",
            )
        if self.group != self.topics.group:
            raise ConfigError("group", self.group, f"the TopicSet was built for group {self.topics.group!r}")
        if isinstance(self.clock_skew_ms, bool) or not isinstance(self.clock_skew_ms, int) or self.clock_skew_ms < 0:
            raise ConfigError("clock_skew_ms", self.clock_skew_ms, "expected an int >= 0")
        object.__setattr__(self, "_verdicts", {} if plain_classes(self.policy) else None)
        # Unlimited retries still stop one short of the header's int32 range, so that "+1" always encodes.
        bound = self.policy.max_reconsume_times
        object.__setattr__(self, "_reconsume_bound", _MAX_RECONSUME_TIMES if bound is None else bound)


def read_retry_state(ctx: RouteContext, record: Consumed, *, now_ms: int) -> RetryHeaders | None:
    """The retry state a record carries: None on the source topic (incoming ``retry.*`` headers never steer
    there); on a tier topic, the decoded headers, checked against this topic and clock.

    Raises :class:`HeaderDecodeError` when a tier record's headers are missing, malformed or out of bounds (wrong
    tier, wrong group or source, more failures than the policy allows, due or failure times too far ahead), or, with
    ``header_keys``, when its signature is missing or does not verify for this topic. Raises :class:`ConfigError`
    for a topic that is neither this context's source nor one of its tiers.
    """
    if record.topic == ctx.topics.source:
        return None
    tier = ctx.topics.tier_by_topic(record.topic)
    if tier is None:
        raise ConfigError("record.topic", record.topic, "neither the source nor a tier topic of this RouteContext")
    if ctx.header_keys is not None:
        problem = verify(ctx.header_keys, record.topic, record.key, record.value, record.headers)
        if problem is not None:
            raise HeaderDecodeError(SIGNATURE, None, problem)
    state = decode(record.headers)
    _check_bounds(ctx, tier, state, now_ms)
    return state


def tier_wait_bounds_ms(ctx: RouteContext) -> dict[str, int]:
    """The longest a record of each tier topic of ``ctx`` is meant to wait (due.longest_wait_ms): a tier
    consumer never waits longer than this after first seeing a record, whatever its ``retry.due_at`` says."""
    return {t.topic: longest_wait_ms(t.delay_ms, ctx.policy.jitter) for t in ctx.topics.tiers}


def _check_bounds(ctx: RouteContext, tier: TierTopic, h: RetryHeaders, now_ms: int) -> None:
    policy, skew, bound = ctx.policy, ctx.clock_skew_ms, ctx._reconsume_bound
    # each reason is written only when its check fails: every tier record is checked (a tier consumer's hot path)
    if h.tier != tier.index:
        raise HeaderDecodeError("retry.tier", h.tier, f"this record is on tier {tier.index} ({tier.topic})")
    if h.dlq_reason is not None:
        raise HeaderDecodeError("retry.dlq_reason", h.dlq_reason, "a tier record carries no DLQ reason")
    if h.consumer_group != ctx.group:
        raise HeaderDecodeError("retry.consumer_group", h.consumer_group, f"this is group {ctx.group!r}")
    if ctx.topics.strategy is not NamingStrategy.SHARED and h.original_topic != ctx.topics.source:
        raise HeaderDecodeError(
            "retry.original_topic", h.original_topic, f"these tiers carry {ctx.topics.source!r} only"
        )
    if h.reconsume_times > bound:
        raise HeaderDecodeError(
            "retry.reconsume_times", h.reconsume_times, f"the policy allows at most {bound} retries"
        )
    if h.last_failed_at > now_ms + skew:
        raise HeaderDecodeError("retry.last_failed_at", h.last_failed_at, "in the future")
    if h.due_at is not None:
        longest = longest_wait_ms(tier.delay_ms, policy.jitter)
        problem = due_problem(h.due_at, h.last_failed_at, longest_ms=longest, now_ms=now_ms, skew_ms=skew)
        if problem is not None:
            raise HeaderDecodeError("retry.due_at", h.due_at, problem)


class Unread(Enum):
    """`route(previous=...)`'s default: the router reads the record's retry state itself."""

    STATE = "unread"


def route(
    ctx: RouteContext,
    record: Consumed,
    failure: BaseException,
    *,
    now_ms: int,
    rng: random.Random,
    previous: RetryHeaders | Literal[Unread.STATE] | None = Unread.STATE,
) -> Route:
    """Decide the next destination of ``record`` after ``failure`` at ``now_ms`` (see the module docstring).

    ``previous``: the record's retry state as :func:`read_retry_state` returned it, when the caller read it
    already (the runtime reads it once per record, to know when the record is due); headers it could not read
    are passed as ``previous=None`` with the :class:`HeaderDecodeError` as ``failure``.

    Never raises for bad wire data: unreadable retry headers route to the DLQ with reason
    ``invalid_retry_headers``. The only exception is :class:`ConfigError` for a topic this context does not own.
    """
    if previous is Unread.STATE:
        try:
            previous = read_retry_state(ctx, record, now_ms=now_ms)
        except HeaderDecodeError as bad:
            return _invalid(ctx, record, now_ms, bad)
    verdict, schedule_ms, hint, deciding = _classified(ctx, failure)
    if isinstance(deciding, HeaderDecodeError):
        return _invalid(ctx, record, now_ms, deciding)
    hop = _hop(previous, now_ms)
    if verdict is not Verdict.RETRYABLE:
        return _dead_letter(ctx, record, previous, hop, failure, _VERDICT_REASON[verdict])
    allowed = ctx.policy.max_retries_for(schedule_ms)
    if allowed is not None and hop.reconsume_times > allowed:
        return _dead_letter(ctx, record, previous, hop, failure, DlqReason.EXHAUSTED)
    tier, due_at = _next_due(ctx, schedule_ms, hint, hop, rng)
    timeout = ctx.policy.timeout_ms
    if timeout is not None and due_at > hop.first_failed_at + timeout:
        return _dead_letter(ctx, record, previous, hop, failure, DlqReason.TIMEOUT)
    retry = _state(ctx, record, previous, hop, failure, tier=tier.index, due_at=due_at, dlq_reason=None)
    return _make_route(ctx, RouteKind.TIER, tier.topic, retry, record)


_VERDICTS_KEPT: Final = 256


def _classified(
    ctx: RouteContext, failure: BaseException
) -> tuple[Verdict, tuple[int, ...], int | None, BaseException]:
    """`classify` as (verdict, schedule, retry-after hint, deciding link). A lone failure (no cause, no
    context: most of them) is decided by its class, remembered per context; its hint is read each time."""
    verdicts, cls = ctx._verdicts, type(failure)
    if (
        verdicts is None
        or failure.__cause__ is not None
        or failure.__context__ is not None
        or failure.__class__ is not cls
    ):
        c = classify(ctx.policy, failure)
        return c.verdict, c.schedule_ms, c.retry_after_ms, c.deciding
    known = verdicts.get(cls)
    if known is None:
        known = lone_verdict(ctx.policy, cls)
        if len(verdicts) >= _VERDICTS_KEPT:
            verdicts.clear()  # a bound, not an LRU: the classes that recur are back after a few failures
        verdicts[cls] = known
    verdict, schedule_ms = known
    if verdict is not Verdict.RETRYABLE:
        return verdict, schedule_ms, None, failure
    return verdict, schedule_ms, retry_after_ms(failure, ctx.policy.retry_after_attribute), failure


def delivery_limit_route(ctx: RouteContext, record: Consumed, failure: DeliveryLimitReached, *, now_ms: int) -> Route:
    """The DLQ route of a source record a share group delivered to its limit without a hand-off (a crash
    loop): reason ``delivery_limit``, whatever the policy says, from the record's own coordinates."""
    return _dead_letter(ctx, record, None, _hop(None, now_ms), failure, DlqReason.DELIVERY_LIMIT)


def _invalid(ctx: RouteContext, record: Consumed, now_ms: int, bad: HeaderDecodeError) -> Route:
    """Dead-letter a record whose retry headers cannot be trusted: its state restarts from its own
    coordinates on this topic, and the exception headers say which header was wrong and why."""
    return _dead_letter(ctx, record, None, _hop(None, now_ms), bad, DlqReason.INVALID_RETRY_HEADERS)


class _Hop(NamedTuple):
    """A record's counters after one more failure: its destination is decided from these, and its new
    state is built once, with the destination in it."""

    reconsume_times: int
    first_failed_at: int
    last_failed_at: int


def _hop(previous: RetryHeaders | None, now_ms: int) -> _Hop:
    # through tuple.__new__: a NamedTuple's own constructor is Python code, and this runs once per failure
    if previous is None:
        return _new_hop(_Hop, (1, now_ms, now_ms))
    # a clock step back never moves failure time backwards
    return _new_hop(
        _Hop, (previous.reconsume_times + 1, previous.first_failed_at, max(now_ms, previous.last_failed_at))
    )


_new_hop = tuple.__new__


def _next_due(
    ctx: RouteContext, schedule_ms: tuple[int, ...], hint: int | None, hop: _Hop, rng: random.Random
) -> tuple[TierTopic, int]:
    """The tier and due time of the next retry; a retry-after hint picks the tier (due.py floors the wait)."""
    policy = ctx.policy
    if hint is None:
        delay = schedule_delay_ms(schedule_ms, hop.reconsume_times)
    else:
        delay = policy.tier_delays_ms[tier_for_hint(policy.tier_delays_ms, hint)]
    due_at = next_due_ms(
        hop.last_failed_at, delay, jitter=policy.jitter, max_delay_ms=policy.max_delay_ms, hint_ms=hint, rng=rng
    )
    return ctx.topics.tier_by_delay(delay), due_at


def _state(
    ctx: RouteContext,
    record: Consumed,
    previous: RetryHeaders | None,
    hop: _Hop,
    failure: BaseException,
    *,
    tier: int | None,
    due_at: int | None,
    dlq_reason: DlqReason | None,
) -> RetryHeaders:
    """The state a record is published with after `failure`. A first failure starts from the record's own
    coordinates (incoming ``retry.*`` headers are ignored); a later one copies origin and original
    coordinates from `previous`, never recomputing them."""
    described = describe(failure, ctx.redact)
    if previous is not None:
        return previous.evolve(
            reconsume_times=hop.reconsume_times,
            last_failed_at=hop.last_failed_at,
            tier=tier,
            due_at=due_at,
            dlq_reason=dlq_reason,
            exception_type=described.exception_type,
            exception_message=described.exception_message,
            exception_trace=described.exception_trace,
        )
    return retry_state(
        (
            hop.reconsume_times,
            origin_message_id(ctx, record),
            record.topic,
            record.partition,
            record.offset,
            max(-1, record.timestamp_ms),
            ctx.group,
            tier,
            due_at,
            hop.first_failed_at,
            hop.last_failed_at,
            described.exception_type,
            described.exception_message,
            described.exception_trace,
            dlq_reason,
            decode_lineage(record.headers),
            1,  # schema_version
        )
    )


def origin_message_id(ctx: RouteContext, record: Consumed) -> str:
    """The id a source record keeps through every retry: the ``id_header`` value when there is exactly one,
    non-empty, at most 512 bytes and UTF-8; else ``<topic>-<partition>-<offset>`` (always unique)."""
    if ctx.id_header is not None:
        values = [v for k, v in record.headers if k == ctx.id_header]
        if len(values) == 1 and isinstance(values[0], bytes) and 0 < len(values[0]) <= _ID_LIMIT_BYTES:
            try:
                return values[0].decode("utf-8")
            except UnicodeDecodeError:
                pass  # an undecodable id falls back to the coordinates, which are always unique
    return f"{record.topic}-{record.partition}-{record.offset}"


def too_large_route(
    ctx: RouteContext, refused: Route, *, keep_user_headers: bool, key: bytes | None = None, value: bytes | None = None
) -> Route:
    """The DLQ route for a record whose republish (``refused``, to a tier or the DLQ) was too large: reason
    ``too_large``, no exception message or trace (the part of the headers that grows with the failure), the
    failure's type kept. ``keep_user_headers=False`` is the last resort, which the runtime pairs with a value
    replaced by :func:`too_large_reference`. ``key`` and ``value`` are what will be published (signed with
    ``ctx.header_keys``; unused without keys)."""
    retry = refused.retry.evolve(
        tier=None,
        due_at=None,
        dlq_reason=DlqReason.TOO_LARGE,
        exception_message="",
        exception_trace="",
    )
    users = tuple(user_headers(refused.headers)) if keep_user_headers else ()
    headers = _signed(ctx, ctx.topics.dlq, key, value, (*users, *encode(retry)))
    return dataclasses.replace(
        refused,
        kind=RouteKind.DLQ,
        topic=ctx.topics.dlq,
        due_at_ms=None,
        reason=DlqReason.TOO_LARGE,
        retry=retry,
        headers=headers,
    )


def too_large_reference(topic: str, partition: int, offset: int, value: bytes | None) -> bytes:
    """The value a too-large DLQ record carries instead of its own: where the consumed record still is."""
    size = -1 if value is None else len(value)
    ref = {"too_large": True, "topic": topic, "partition": partition, "offset": offset, "value_bytes": size}
    return json.dumps(ref, separators=(",", ":")).encode()


#: The longest key a record dead-lettered as a reference keeps.
_MAX_REFERENCE_KEY: Final = 1024


def too_large_reference_record(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> tuple[bytes | None, bytes]:
    """The key and value of the DLQ record that stands for the consumed record `topic`[`partition`]@`offset`
    (with `key` and `value`) when even its DLQ record without exception details was too large: the key if at
    most 1 KiB, and `too_large_reference` instead of the value."""
    kept = key if key is None or len(key) <= _MAX_REFERENCE_KEY else None
    return kept, too_large_reference(topic, partition, offset, value)


def _dead_letter(
    ctx: RouteContext,
    record: Consumed,
    previous: RetryHeaders | None,
    hop: _Hop,
    failure: BaseException,
    reason: DlqReason,
) -> Route:
    retry = _state(ctx, record, previous, hop, failure, tier=None, due_at=None, dlq_reason=reason)
    return _make_route(ctx, RouteKind.DLQ, ctx.topics.dlq, retry, record)


def _signed(
    ctx: RouteContext, topic: str, key: bytes | None, value: bytes | None, headers: tuple[Header, ...]
) -> tuple[Header, ...]:
    return headers if ctx.header_keys is None else sign(ctx.header_keys, topic, key, value, headers)


def _make_route(ctx: RouteContext, kind: RouteKind, topic: str, retry: RetryHeaders, record: Consumed) -> Route:
    users = user_headers(record.headers)
    if len(users) > MAX_USER_HEADERS:
        # Some hop of it would not be read back (a tier dead-lettered it with the tier's coordinates, the
        # replay called it foreign): to the DLQ now, with this record's own state and no user headers.
        kind, topic, users = RouteKind.DLQ, ctx.topics.dlq, []
        retry = retry.evolve(tier=None, due_at=None, dlq_reason=DlqReason.TOO_MANY_HEADERS)
    headers = (*users, *encode(retry))
    if ctx.header_keys is not None:
        headers = sign(ctx.header_keys, topic, record.key, record.value, headers)
    decided: Any = _UnfrozenRoute()
    decided.kind = kind
    decided.topic = topic
    decided.due_at_ms = None if kind is RouteKind.DLQ else retry.due_at
    decided.reason = retry.dlq_reason
    decided.retry = retry
    decided.headers = headers
    decided.partition_hint = None if record.key is not None else retry.original_partition
    object.__setattr__(decided, "__class__", Route)
    made: Route = decided
    return made


class _UnfrozenRoute:
    """`Route`'s slots in a mutable class: filled by plain attribute stores, then made a `Route` (one layout,
    so CPython allows the class assignment); the frozen dataclass's `__init__` sets each field through
    `object.__setattr__`, at several times the cost (a route is made per failed record)."""

    __slots__ = tuple(Route.__dataclass_fields__)
