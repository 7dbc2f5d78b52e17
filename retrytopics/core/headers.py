"""The retry header contract: names, the :class:`RetryHeaders` value, and a total, bounded codec.

Pure: standard library only. Every value is UTF-8 text, numbers are decimal, times are epoch milliseconds,
so Spark, kcat or any language reads them without a custom decoder (docs/headers.md)::

    decode(encode(h)) == h              # for every valid RetryHeaders h
    decode([("retry.tier", b"x")])      # raises HeaderDecodeError, never anything else

Headers are untrusted wire data. Nothing here unpickles, evaluates or imports; exception headers are
write-only diagnostics; every count, length and number is bounded before it is used.

This module runs past the 300-line budget on purpose: the names, the per-field rules (``_Spec``) and the codec
are one contract, and a reader checking a header against docs/headers.md should find all of it in one place.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, TypeAlias, TypeVar

from retrytopics.core.errors import ConfigError, HeaderDecodeError
from retrytopics.core.redaction import redact  # re-exported: the exception headers are redacted with it

__all__ = [
    "CONSUMER_GROUP",
    "DLQ_REASON",
    "DUE_AT",
    "EXCEPTION_MESSAGE",
    "EXCEPTION_TRACE",
    "EXCEPTION_TYPE",
    "FIRST_FAILED_AT",
    "LAST_FAILED_AT",
    "MAX_HEADER_COUNT",
    "MAX_RETRY_HEADERS_BYTES",
    "MAX_USER_HEADERS",
    "MAX_VALUE_BYTES",
    "MESSAGE_LIMIT_BYTES",
    "ORIGINAL_OFFSET",
    "ORIGINAL_PARTITION",
    "ORIGINAL_TIMESTAMP",
    "ORIGINAL_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIMES",
    "REPLAYED_AT",
    "REPLAY_COUNT",
    "REPLAY_ID",
    "REPLAY_ORIGIN_ID",
    "RETRY_PREFIX",
    "SCHEMA_VERSION",
    "TIER",
    "TRACE_LIMIT_BYTES",
    "TYPE_LIMIT_BYTES",
    "DlqReason",
    "Header",
    "Lineage",
    "RetryHeaders",
    "decode",
    "decode_lineage",
    "encode",
    "redact",
    "retry_state",
    "to_record",
    "truncate_utf8",
    "user_headers",
]

Header: TypeAlias = tuple[str, bytes | None]

#: Every header whose key starts with this belongs to retrytopics and is replaced on each hop.
RETRY_PREFIX: Final = "retry."
SCHEMA_VERSION: Final = "retry.schema_version"
RECONSUME_TIMES: Final = "retry.reconsume_times"
ORIGIN_MESSAGE_ID: Final = "retry.origin_message_id"
ORIGINAL_TOPIC: Final = "retry.original_topic"
ORIGINAL_PARTITION: Final = "retry.original_partition"
ORIGINAL_OFFSET: Final = "retry.original_offset"
ORIGINAL_TIMESTAMP: Final = "retry.original_timestamp"
CONSUMER_GROUP: Final = "retry.consumer_group"
TIER: Final = "retry.tier"
DUE_AT: Final = "retry.due_at"
FIRST_FAILED_AT: Final = "retry.first_failed_at"
LAST_FAILED_AT: Final = "retry.last_failed_at"
EXCEPTION_TYPE: Final = "retry.exception_type"
EXCEPTION_MESSAGE: Final = "retry.exception_message"
EXCEPTION_TRACE: Final = "retry.exception_trace"
DLQ_REASON: Final = "retry.dlq_reason"
REPLAY_ID: Final = "retry.replay_id"
REPLAYED_AT: Final = "retry.replayed_at"
REPLAY_COUNT: Final = "retry.replay_count"
REPLAY_ORIGIN_ID: Final = "retry.replay_origin_id"

#: Limits. A decoder refuses a record with more headers, or a retry header value longer than this; a writer
#: stays within the same bounds (`MAX_USER_HEADERS`; no spec below allows a longer value).
MAX_HEADER_COUNT: Final = 1024
MAX_VALUE_BYTES: Final = 16 * 1024
MESSAGE_LIMIT_BYTES: Final = 1024
TRACE_LIMIT_BYTES: Final = 8 * 1024
TYPE_LIMIT_BYTES: Final = 512
_ID_LIMIT_BYTES: Final = 512
_INT32: Final = 2**31 - 1
_INT64: Final = 2**63 - 1
_CANONICAL_INT: Final = re.compile(r"0|-?[1-9][0-9]{0,18}")
_TOPIC: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class DlqReason(StrEnum):
    """Why a record is in the DLQ (``retry.dlq_reason``)."""

    EXHAUSTED = "exhausted"
    """The retries allowed by ``max_retries`` are used up."""
    NON_RETRYABLE = "non_retryable"
    """The failure was classified non-retryable (type rules, ``retry_if``, or ``NonRetryable``)."""
    POISON = "poison"
    """The record could not be deserialized."""
    TIMEOUT = "timeout"
    """The next retry would be due after ``first_failed_at + timeout``."""
    INVALID_RETRY_HEADERS = "invalid_retry_headers"
    """A tier record's retry headers were missing, malformed, out of range or inconsistent with its topic."""
    TOO_LARGE = "too_large"
    """Its republish was refused as too large (retry headers pushed it over the size limit); the DLQ record has
    no exception message or trace, and if even that is too large, a reference instead of the value."""
    TOO_MANY_HEADERS = "too_many_headers"
    """With the retry headers added, it would carry more than ``MAX_HEADER_COUNT`` headers, which no decoder
    reads back; the DLQ record has no user headers (the consumed record still has them)."""
    DELIVERY_LIMIT = "delivery_limit"
    """A share group delivered it as often as its ``share.delivery.count.limit`` allows and no hand-off of it was
    ever recorded: the process stopped on it each time (a crash loop). Its handler is not called again; the
    exception message gives the delivery count and the limit."""
    BLOCKED_BY_KEY = "blocked_by_key"
    """A key-ordered handler's record dead-lettered unhandled behind a dead-lettered record of its key (policy
    ``dead_letter``), or one whose predecessor's fate nothing proves (docs/key-ordering.md, section 6); its
    ``retry.reconsume_times`` is 0: it never ran, and no other reason allows 0."""


_REASONS: Final = frozenset(r.value for r in DlqReason)


@dataclass(frozen=True, slots=True)
class _Spec:
    header: str
    attr: str
    kind: Literal["int", "text", "topic", "reason"]
    lo: int = 0  # int: smallest value; text: fewest bytes
    hi: int = _INT64  # int: largest value; text: most bytes
    optional: bool = False


_RETRY_SPECS: Final = (
    _Spec(SCHEMA_VERSION, "schema_version", "int", 1, 1),
    _Spec(RECONSUME_TIMES, "reconsume_times", "int", 0, _INT32),  # 0: blocked_by_key only (`_check_consistency`)
    _Spec(ORIGIN_MESSAGE_ID, "origin_message_id", "text", 1, _ID_LIMIT_BYTES),
    _Spec(ORIGINAL_TOPIC, "original_topic", "topic"),
    _Spec(ORIGINAL_PARTITION, "original_partition", "int", 0, _INT32),
    _Spec(ORIGINAL_OFFSET, "original_offset", "int"),
    _Spec(ORIGINAL_TIMESTAMP, "original_timestamp", "int", -1),  # -1: Kafka's "no timestamp"
    _Spec(CONSUMER_GROUP, "consumer_group", "topic"),
    _Spec(TIER, "tier", "int", 0, 99, optional=True),
    _Spec(DUE_AT, "due_at", "int", optional=True),
    _Spec(FIRST_FAILED_AT, "first_failed_at", "int"),
    _Spec(LAST_FAILED_AT, "last_failed_at", "int"),
    _Spec(EXCEPTION_TYPE, "exception_type", "text", 1, TYPE_LIMIT_BYTES),
    _Spec(EXCEPTION_MESSAGE, "exception_message", "text", 0, MESSAGE_LIMIT_BYTES),
    _Spec(EXCEPTION_TRACE, "exception_trace", "text", 0, TRACE_LIMIT_BYTES),
    _Spec(DLQ_REASON, "dlq_reason", "reason", optional=True),
)
_LINEAGE_SPECS: Final = (
    _Spec(REPLAY_ID, "replay_id", "text", 1, _ID_LIMIT_BYTES, optional=True),
    _Spec(REPLAYED_AT, "replayed_at", "int", optional=True),
    _Spec(REPLAY_COUNT, "replay_count", "int", 0, _INT32, optional=True),
    _Spec(REPLAY_ORIGIN_ID, "replay_origin_id", "text", 1, _ID_LIMIT_BYTES, optional=True),
)
_HEADER_OF: Final = {s.attr: s.header for s in (*_RETRY_SPECS, *_LINEAGE_SPECS)}
#: Headers outside the specs that a hop can carry: `retry.signature`, and on a replayed record
#: `retry.replay_original` and `retry.replay_mark` (spark/ledger.py).
_UNSPECIFIED_RETRY_HEADERS: Final = 3
#: The most user headers a record may carry into the pipeline: with every retry header a hop can have (each
#: spec, and `_UNSPECIFIED_RETRY_HEADERS`), every hop it makes (tiers, DLQ, a replay to a tier) stays within
#: `MAX_HEADER_COUNT`, so it is always read back. The router dead-letters a record with more as
#: `too_many_headers` at once.
MAX_USER_HEADERS: Final = MAX_HEADER_COUNT - len(_RETRY_SPECS) - len(_LINEAGE_SPECS) - _UNSPECIFIED_RETRY_HEADERS
#: Upper bound of the encoded retry headers (names + values) of one record: what a hop can add.
MAX_RETRY_HEADERS_BYTES: Final = sum(
    len(s.header) + {"int": 20, "text": s.hi, "topic": 249, "reason": 32}[s.kind]
    for s in (*_RETRY_SPECS, *_LINEAGE_SPECS)
)


def _problem(spec: _Spec, value: object) -> str | None:
    """Why ``value`` is not valid for ``spec``, or None."""
    if value is None:
        return None if spec.optional else "missing"
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not spec.lo <= value <= spec.hi:
            return f"expected an integer in {spec.lo}..{spec.hi}"
        return None
    if spec.kind == "reason":
        return None if isinstance(value, DlqReason) else f"expected one of {[r.value for r in DlqReason]}"
    if not isinstance(value, str):
        return "expected text"
    if spec.kind == "topic":
        return None if _TOPIC.fullmatch(value) else "expected a legal topic/group name ([a-zA-Z0-9._-], 1..249)"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "not encodable as UTF-8 (lone surrogate)"
    return None if spec.lo <= size <= spec.hi else f"expected {spec.lo}..{spec.hi} UTF-8 bytes, got {size}"


def _fast_check(spec: _Spec) -> Callable[[object], str | None]:
    """`_problem` for `spec`, with the common valid case decided in one comparison (a retry state is
    validated each time the router builds one, once per failed record): a plain int in range, or ASCII
    text within bounds (its length is its UTF-8 size). Anything else takes the full check."""
    lo, hi, optional = spec.lo, spec.hi, spec.optional
    if spec.kind == "int":

        def check(value: object) -> str | None:
            if (type(value) is int and lo <= value <= hi) or (value is None and optional):
                return None
            return _problem(spec, value)

    elif spec.kind == "text":

        def check(value: object) -> str | None:
            return None if type(value) is str and value.isascii() and lo <= len(value) <= hi else _problem(spec, value)

    elif spec.kind == "topic":

        def check(value: object) -> str | None:
            if type(value) is str and value in _valid_names:
                return None
            reason = _problem(spec, value)
            if reason is None and type(value) is str and len(_valid_names) < _KNOWN_NAMES:
                _valid_names.add(value)
            return reason

    else:

        def check(value: object) -> str | None:
            return None if (value is None and optional) or type(value) is DlqReason else _problem(spec, value)

    return check


_KNOWN_NAMES: Final = 4096
#: topic and group names a check found legal: a process sees few, and each is matched against `_TOPIC` once
_valid_names: Final[set[str]] = set()


def _validate(
    obj: object,
    checks: tuple[tuple[_Spec, Callable[[object], str | None]], ...],
    values: Callable[[object], tuple[object, ...]],
) -> None:
    """Each field of `obj` by its check; `values` reads them all at once (in the order of `checks`)."""
    for (spec, check), value in zip(checks, values(obj), strict=False):
        reason = check(value)
        if reason is not None:
            raise ConfigError(spec.attr, value if not isinstance(value, str) else _excerpt(value), reason)


_RETRY_CHECKS: Final = tuple((spec, _fast_check(spec)) for spec in _RETRY_SPECS)


def _plainly_valid(values: Sequence[object]) -> bool:
    """True when every field of a retry state (all of them, in `RetryHeaders`' declaration order) is valid in
    its common form: exact ints in range, ASCII text within bounds (its length is its UTF-8 size), names matched
    before, a `Lineage`. False says nothing: `_validate` then checks field by field and names the first bad one.
    A state is validated each time one is built, once per failed record; this is one expression instead of 16
    calls."""
    (
        times,
        origin,
        topic,
        partition,
        offset,
        timestamp,
        group,
        tier,
        due_at,
        first,
        last,
        kind,
        message,
        trace,
        reason,
        lineage,
        schema,
    ) = values
    return (
        type(times) is int
        and 1 <= times <= _INT32
        and type(origin) is str
        and origin.isascii()
        and 1 <= len(origin) <= _ID_LIMIT_BYTES
        and type(topic) is str
        and topic in _valid_names
        and type(partition) is int
        and 0 <= partition <= _INT32
        and type(offset) is int
        and 0 <= offset <= _INT64
        and type(timestamp) is int
        and -1 <= timestamp <= _INT64
        and type(group) is str
        and group in _valid_names
        and (tier is None or (type(tier) is int and 0 <= tier <= 99))
        and (due_at is None or (type(due_at) is int and 0 <= due_at <= _INT64))
        and type(first) is int
        and 0 <= first <= _INT64
        and type(last) is int
        and 0 <= last <= _INT64
        and type(kind) is str
        and kind.isascii()
        and 1 <= len(kind) <= TYPE_LIMIT_BYTES
        and type(message) is str
        and message.isascii()
        and len(message) <= MESSAGE_LIMIT_BYTES
        and type(trace) is str
        and trace.isascii()
        and len(trace) <= TRACE_LIMIT_BYTES
        and (reason is None or type(reason) is DlqReason)
        and type(lineage) is Lineage
        and type(schema) is int
        and schema == 1
    )


_LINEAGE_CHECKS: Final = tuple((spec, _fast_check(spec)) for spec in _LINEAGE_SPECS)
#: every field a spec names, read at once (validation and `encode`, once per built or published state)
_retry_values: Final = operator.attrgetter(*(s.attr for s in _RETRY_SPECS))
_lineage_values: Final = operator.attrgetter(*(s.attr for s in _LINEAGE_SPECS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Lineage:
    """Replay lineage, set by the replay job. The only ``retry.*`` headers read on a source topic, and they
    never steer routing: they are carried along so that audits can follow a record across replays."""

    replay_id: str | None = None
    replayed_at: int | None = None
    replay_count: int = 0
    replay_origin_id: str | None = None

    def __post_init__(self) -> None:
        _validate(self, _LINEAGE_CHECKS, _lineage_values)
        if self.replay_count is None:
            raise ConfigError("replay_count", None, "expected an integer >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryHeaders:
    """The retry state of one record, as carried in its ``retry.*`` headers (see docs/headers.md).

    A tier record has ``tier`` and ``due_at`` and no ``dlq_reason``; a DLQ record the reverse (a state with
    neither is a failure whose destination is not decided yet, and is never published).
    ``reconsume_times`` counts failures so far: 1 on the first republish. The runtime's duplicate-suppression
    key is its original coordinates and timestamp, ``lineage.replay_count`` and ``reconsume_times``
    (``dedupe.audit_key``).
    """

    reconsume_times: int
    origin_message_id: str
    original_topic: str
    original_partition: int
    original_offset: int
    original_timestamp: int
    consumer_group: str
    tier: int | None
    due_at: int | None
    first_failed_at: int
    last_failed_at: int
    exception_type: str
    exception_message: str
    exception_trace: str
    dlq_reason: DlqReason | None = None
    lineage: Lineage = Lineage()
    schema_version: int = 1

    def __post_init__(self) -> None:
        if not _plainly_valid(_all_retry_fields(self)):
            _validate(self, _RETRY_CHECKS, _retry_values)
        if not isinstance(self.lineage, Lineage):
            raise ConfigError("lineage", self.lineage, "expected a Lineage")
        self._check_consistency()

    def evolve(self, **changes: object) -> RetryHeaders:
        """A copy with `changes`, like `dataclasses.replace`, but only the changed fields are validated again
        (with the rules between fields): the others were when this state was built. The failure path makes
        two or three copies per record, and a full validation costs more than the routing itself."""
        unknown = changes.keys() - _RETRY_FIELDS
        if unknown:
            raise TypeError(f"RetryHeaders has no field {sorted(unknown)[0]!r}")
        values = list(_all_retry_fields(self))
        for name, value in changes.items():
            values[_RETRY_FIELD_INDEX[name]] = value
        if _plainly_valid(values):  # then every changed field passes its check below
            copy = _filled(values)
            copy._check_consistency()
            return copy
        copy = object.__new__(RetryHeaders)
        for name, value in zip(_RETRY_FIELD_NAMES, _all_retry_fields(self), strict=False):
            _set(copy, name, value)
        for name, value in changes.items():
            _set(copy, name, value)
            checked = _RETRY_CHECK_OF.get(name)
            if checked is not None and (reason := checked[1](value)) is not None:
                raise ConfigError(name, value if not isinstance(value, str) else _excerpt(value), reason)
        if "lineage" in changes and not isinstance(copy.lineage, Lineage):
            raise ConfigError("lineage", copy.lineage, "expected a Lineage")
        copy._check_consistency()
        return copy

    def _check_consistency(self) -> None:
        """The rules between fields (each field alone is validated by its spec)."""
        if self.first_failed_at > self.last_failed_at:
            raise ConfigError("last_failed_at", self.last_failed_at, "earlier than first_failed_at")
        if (self.tier is None) != (self.due_at is None):
            raise ConfigError("due_at", self.due_at, "tier and due_at are set together (tier records) or not at all")
        if self.tier is not None and self.dlq_reason is not None:
            raise ConfigError("dlq_reason", self.dlq_reason, "a DLQ record has no tier; a tier record no DLQ reason")
        if self.reconsume_times == 0 and self.dlq_reason != DlqReason.BLOCKED_BY_KEY:
            raise ConfigError("reconsume_times", 0, "expected >= 1 (0 only for a blocked_by_key record, never run)")


_RETRY_FIELD_NAMES: Final = tuple(RetryHeaders.__dataclass_fields__)
_RETRY_FIELDS: Final = frozenset(_RETRY_FIELD_NAMES)
_RETRY_FIELD_INDEX: Final = {name: i for i, name in enumerate(_RETRY_FIELD_NAMES)}


class _UnfrozenRetryHeaders:
    """`RetryHeaders`' slots in a mutable class: filled by plain attribute stores, then made a `RetryHeaders`
    (one layout, so CPython allows the class assignment). A frozen dataclass sets each of its 17 fields through
    `object.__setattr__`, which made building a state cost more than validating it (once per failed record)."""

    __slots__ = _RETRY_FIELD_NAMES


def _filled(values: Sequence[object]) -> RetryHeaders:
    """A `RetryHeaders` holding `values` (every field, in declaration order), not validated: the caller has."""
    state: Any = _UnfrozenRetryHeaders()
    (
        state.reconsume_times,
        state.origin_message_id,
        state.original_topic,
        state.original_partition,
        state.original_offset,
        state.original_timestamp,
        state.consumer_group,
        state.tier,
        state.due_at,
        state.first_failed_at,
        state.last_failed_at,
        state.exception_type,
        state.exception_message,
        state.exception_trace,
        state.dlq_reason,
        state.lineage,
        state.schema_version,
    ) = values
    _set(state, "__class__", RetryHeaders)
    built: RetryHeaders = state
    return built


def retry_state(values: Sequence[object]) -> RetryHeaders:
    """`RetryHeaders(**dict(zip(field names, values)))` for `values` in declaration order (lineage and schema
    version included): the same state, or the same `ConfigError`, at a fraction of the cost when the values are
    valid in their common form. The router builds one per failed record."""
    if _plainly_valid(values):
        built = _filled(values)
        built._check_consistency()
        return built
    return RetryHeaders(**dict(zip(_RETRY_FIELD_NAMES, values, strict=True)))  # type: ignore[arg-type]


_RETRY_CHECK_OF: Final = {spec.attr: (spec, check) for spec, check in _RETRY_CHECKS}
_all_retry_fields: Final = operator.attrgetter(*_RETRY_FIELD_NAMES)
_set: Final = object.__setattr__  # RetryHeaders is frozen; evolve fills a fresh instance
_NO_LINEAGE: Final = Lineage()
_NO_LINEAGE_FIELDS: Final = {s.attr: getattr(_NO_LINEAGE, s.attr) for s in _LINEAGE_SPECS}
#: (header, attribute) in encoding order, and every attribute at once: `encode` runs once per republish
_LINEAGE_ENCODING: Final = tuple((s.header, s.attr) for s in _LINEAGE_SPECS)
_LINEAGE_HEADERS: Final = frozenset(s.header for s in _LINEAGE_SPECS)


def _recurring(header: str) -> Callable[[object], Header]:
    """The (header, encoded value) pair of one header, remembered for values that recur from record to record
    (names, tiers, counts, exception types): a pair built once is shared. Only exact `int` and `str` values
    (and DLQ reasons) are remembered: a subclass may print otherwise."""
    known: dict[object, Header] = {}

    def pair(value: object) -> Header:
        found = known.get(value) if type(value) in _REMEMBERED_TYPES else None
        if found is None:
            found = (header, str(value).encode("utf-8"))
            if type(value) in _REMEMBERED_TYPES:
                if len(known) >= _KNOWN_NAMES:
                    known.clear()  # a bound, not an LRU: the values that recur are back after a few records
                known[value] = found
        return found

    return pair


_REMEMBERED_TYPES: Final = frozenset({int, str, DlqReason})
_schema_pair, _times_pair, _topic_pair, _partition_pair, _group_pair, _tier_pair = (
    _recurring(header)
    for header in (SCHEMA_VERSION, RECONSUME_TIMES, ORIGINAL_TOPIC, ORIGINAL_PARTITION, CONSUMER_GROUP, TIER)
)
# not the trace: its last line carries the failure's message, which often names the record (a new text per
# record), and a trace may be 8 KiB: remembering them would cost memory for nothing
_type_pair, _reason_pair = (_recurring(h) for h in (EXCEPTION_TYPE, DLQ_REASON))


def _repeated(header: str) -> Callable[[object], Header]:
    """The (header, encoded value) pair of one header, shared with the previous record's when its value is the
    same: failure times, due times and timestamps repeat within a millisecond, and the records of one failure
    site carry one cached message and trace. One pair is kept, so memory does not grow with the values; only
    exact `int` and `str` values are compared (a subclass may print otherwise)."""
    last: list[tuple[object, Header]] = [(None, (header, b""))]  # swapped whole: threads share it

    def pair(value: object) -> Header:
        seen, found = last[0]
        if type(value) is type(seen) and type(value) in _REMEMBERED_TYPES and (value is seen or value == seen):
            return found
        found = (header, str(value).encode("utf-8"))
        last[0] = (value, found)
        return found

    return pair


_timestamp_pair, _due_pair, _first_pair, _last_pair, _message_pair, _trace_pair = (
    _repeated(h)
    for h in (ORIGINAL_TIMESTAMP, DUE_AT, FIRST_FAILED_AT, LAST_FAILED_AT, EXCEPTION_MESSAGE, EXCEPTION_TRACE)
)


def encode(h: RetryHeaders) -> list[Header]:
    """The ``retry.*`` headers of ``h``: UTF-8 text, decimal numbers, None fields left out."""
    (
        schema,
        times,
        origin,
        topic,
        partition,
        offset,
        timestamp,
        group,
        tier,
        due_at,
        first,
        last,
        kind,
        message,
        trace,
        reason,
    ) = _retry_values(h)
    # in `_RETRY_SPECS` order; one encoding per value, as `str(value).encode("utf-8")`
    out: list[Header] = [
        _schema_pair(schema),
        _times_pair(times),
        (ORIGIN_MESSAGE_ID, str(origin).encode("utf-8")),
        _topic_pair(topic),
        _partition_pair(partition),
        (ORIGINAL_OFFSET, str(offset).encode("utf-8")),
        _timestamp_pair(timestamp),
        _group_pair(group),
    ]
    if tier is not None:
        out.append(_tier_pair(tier))
    if due_at is not None:
        out.append(_due_pair(due_at))
    out += (
        _first_pair(first),
        _last_pair(last),
        _type_pair(kind),
        _message_pair(message),
        _trace_pair(trace),
    )
    if reason is not None:
        out.append(_reason_pair(reason))
    if h.lineage is _NO_LINEAGE:  # most records: encoded once, at import
        out += _NO_LINEAGE_HEADERS
    else:
        out += [
            (header, str(value).encode("utf-8"))
            for (header, _), value in zip(_LINEAGE_ENCODING, _lineage_values(h.lineage), strict=False)
            if value is not None
        ]
    return out


_NO_LINEAGE_HEADERS: Final = [
    (header, str(value).encode("utf-8"))
    for (header, _), value in zip(_LINEAGE_ENCODING, _lineage_values(_NO_LINEAGE), strict=False)
    if value is not None
]


def decode(headers: Sequence[Header]) -> RetryHeaders:
    """Read the ``retry.*`` headers of a tier record. Total: any problem raises :class:`HeaderDecodeError`
    (naming the header, a bounded excerpt of the value, and the reason), and nothing else."""
    found = _collect(headers)
    # The version first, so that a record from a newer writer is reported as such, not as a missing field.
    # (each field's fast parser reads the same value, or raises the same error, as `_parse`)
    schema = _RETRY_PARSERS[0][2](found.get(SCHEMA_VERSION))
    # the other fields in `_RETRY_SPECS` order, which is also their declaration order
    values = [parse(found.get(header)) for header, _, parse in _RETRY_PARSERS[1:]]
    lineage = {attr: parse(found.get(header)) for header, attr, parse in _LINEAGE_PARSERS}
    if lineage["replay_count"] is None:
        lineage["replay_count"] = 0
    # Every field was validated by its parser above; build without validating it a second time (decode is
    # on the tier consumers' hot path) and check only the rules between fields. Most records carry no
    # lineage: they share the one `Lineage()` (which `encode` has ready).
    no_lineage = lineage == _NO_LINEAGE_FIELDS
    values += (_NO_LINEAGE if no_lineage else _prevalidated(Lineage, lineage), schema)
    decoded = _filled(values)
    try:
        decoded._check_consistency()
    except ConfigError as error:  # e.g. first_failed_at > last_failed_at
        raise HeaderDecodeError(_HEADER_OF.get(error.field, error.field), error.value, error.reason) from None
    return decoded


_T = TypeVar("_T")


def _prevalidated(cls: type[_T], values: dict[str, object]) -> _T:
    """An instance of a frozen dataclass from values already checked against its specs."""
    obj = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(obj, name, value)
    return obj


def _collect(headers: Sequence[Header]) -> dict[str, bytes | None]:
    """The ``retry.*`` headers of `headers` by name, each checked (`_collect_checked` names what is wrong)."""
    if (type(headers) is tuple or type(headers) is list) and len(headers) <= MAX_HEADER_COUNT:
        # the common shape in one pass: exact (str, bytes | None) pairs, no duplicated or oversized retry header
        found: dict[str, bytes | None] = {}
        for item in headers:
            if type(item) is not tuple or len(item) != 2:
                break
            key, value = item
            if type(key) is not str or (value is not None and type(value) is not bytes):
                break
            if key.startswith(RETRY_PREFIX):
                if key in found or (value is not None and len(value) > MAX_VALUE_BYTES):
                    break
                found[key] = value
        else:
            return found
    return _collect_checked(headers)


def _collect_checked(headers: Sequence[Header]) -> dict[str, bytes | None]:
    if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
        raise HeaderDecodeError("headers", f"<{type(headers).__name__}>", "expected a list of (key, value) pairs")
    if len(headers) > MAX_HEADER_COUNT:
        raise HeaderDecodeError("headers", len(headers), f"more than {MAX_HEADER_COUNT} headers")
    found: dict[str, bytes | None] = {}
    for i, item in enumerate(headers):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise HeaderDecodeError(f"headers[{i}]", _excerpt(item), "expected a (str, bytes | None) pair")
        key, value = item
        if value is not None and not isinstance(value, bytes):
            raise HeaderDecodeError(f"headers[{i}]", _excerpt(value), "a header value must be bytes or None")
        if not key.startswith(RETRY_PREFIX):
            continue
        if key in found:
            raise HeaderDecodeError(key[:64], _excerpt(value), "duplicated retry header")
        if value is not None and len(value) > MAX_VALUE_BYTES:
            raise HeaderDecodeError(key[:64], _excerpt(value), f"longer than {MAX_VALUE_BYTES} bytes")
        found[key] = value
    return found


def _parse(spec: _Spec, raw: bytes | None) -> object:
    if raw is None:
        if spec.optional:
            return None
        raise HeaderDecodeError(spec.header, None, "missing")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderDecodeError(spec.header, _excerpt(raw), "not valid UTF-8") from None
    value: object = text
    if spec.kind == "int":
        value = int(text) if _CANONICAL_INT.fullmatch(text) else None
        if value is None:
            raise HeaderDecodeError(spec.header, _excerpt(raw), "expected a decimal integer")
    elif spec.kind == "reason":
        value = DlqReason(text) if text in _REASONS else text
    reason = _problem(spec, value)
    if reason is not None:
        raise HeaderDecodeError(spec.header, _excerpt(raw), reason)
    return value


def _fast_parser(spec: _Spec) -> Callable[[bytes | None], object]:
    """`_parse` for `spec`, with the common valid value read in a few comparisons: a tier consumer decodes
    every record it reads. Anything else (and every error) takes `_parse`, so the outcome is the same."""
    lo, hi, optional = spec.lo, spec.hi, spec.optional

    def slow(raw: bytes | None) -> object:
        return _parse(spec, raw)

    if spec.kind == "int":

        def parse(raw: bytes | None) -> object:
            # ASCII digits, canonical (no leading zero), at most 19 of them: int() of it is exact and bounded
            if raw is not None and raw.isdigit() and len(raw) < 20 and (raw[0] != 0x30 or len(raw) == 1):
                value = int(raw)
                if lo <= value <= hi:
                    return value
            return None if raw is None and optional else slow(raw)

    elif spec.kind == "text":

        def parse(raw: bytes | None) -> object:
            if raw is not None and raw.isascii() and lo <= len(raw) <= hi:  # ASCII: its length is its UTF-8 size
                return raw.decode("ascii")
            return None if raw is None and optional else slow(raw)

    else:  # topic and group names, DLQ reasons: a process sees few, each is checked once
        known: dict[bytes, object] = {}

        def parse(raw: bytes | None) -> object:
            if raw is not None and raw in known:
                return known[raw]
            value = None if raw is None and optional else slow(raw)
            if raw is not None and len(known) < _KNOWN_NAMES:
                known[raw] = value
            return value

    return parse


_RETRY_PARSERS: Final = tuple((s.header, s.attr, _fast_parser(s)) for s in _RETRY_SPECS)
_LINEAGE_PARSERS: Final = tuple((s.header, s.attr, _fast_parser(s)) for s in _LINEAGE_SPECS)


def decode_lineage(headers: Sequence[Header]) -> Lineage:
    """Replay lineage from any record's headers; tolerant: an invalid or duplicated field is dropped. Every
    header is looked at, once (the record's size bounds how many): a record with more than `MAX_HEADER_COUNT`
    is dead-lettered with its lineage (`too_many_headers`), and a replay writes it last."""
    items = headers if isinstance(headers, list | tuple) else ()
    # most records carry no lineage header: nothing to read, and one shared (immutable) answer (a loop, not
    # `any()` over a generator: this runs once per failed source record)
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and item[0] in _LINEAGE_HEADERS:
            break
    else:
        return _NO_LINEAGE
    seen: dict[str, list[object]] = {s.header: [] for s in _LINEAGE_SPECS}
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and item[0] in seen:
            seen[item[0]].append(item[1])
    values: dict[str, object] = {}
    for spec in _LINEAGE_SPECS:
        candidates = seen[spec.header]
        if len(candidates) != 1:  # absent, or duplicated and therefore ambiguous
            continue
        value = candidates[0]
        if not isinstance(value, bytes) or len(value) > MAX_VALUE_BYTES:
            continue
        try:
            values[spec.attr] = _parse(spec, value)
        except HeaderDecodeError:
            continue
    if values.get("replay_count") is None:
        values.pop("replay_count", None)
    return Lineage(**values)  # type: ignore[arg-type]


def user_headers(headers: Sequence[Header]) -> list[Header]:
    """Every header not under ``retry.``, byte for byte, in order, duplicates kept."""
    return [item for item in headers if not item[0].startswith(RETRY_PREFIX)]


def truncate_utf8(
    text: str, limit_bytes: int, *, marker: str = "…[truncated]", keep: Literal["head", "tail"] = "head"
) -> str:
    """``text`` cut to at most ``limit_bytes`` UTF-8 bytes, marked when cut; never splits a character.

    Lone surrogates are escaped (``\\udc80``) so the result always encodes. ``keep="tail"`` keeps the end
    (useful for stack traces, whose last lines name the failure) and puts the marker first::

        truncate_utf8("x" * 2000, 1024)               # 1010 x's + '…[truncated]' (14 bytes): 1024 bytes
        truncate_utf8("abcdef", 5, marker="~")         # 'abcd~'
        truncate_utf8("abcdef", 5, marker="~", keep="tail")  # '~cdef'
    """
    if type(text) is str and text.isascii() and len(text) <= limit_bytes:  # most texts: one byte per character
        return text
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit_bytes:
        return data.decode("utf-8")
    mark = marker.encode("utf-8")
    room = limit_bytes - len(mark)
    if room < 0:
        raise ConfigError("limit_bytes", limit_bytes, f"smaller than the marker ({len(mark)} bytes)")
    if keep == "tail":
        return marker + data[len(data) - room :].decode("utf-8", "ignore")
    return data[:room].decode("utf-8", "ignore") + marker


def to_record(h: RetryHeaders) -> dict[str, object]:
    """``h`` as a plain dict matching ``schemas/retry_headers.avsc`` (for Avro writers and Spark)."""
    record: dict[str, object] = {s.attr: getattr(h, s.attr) for s in _RETRY_SPECS}
    record["dlq_reason"] = None if h.dlq_reason is None else h.dlq_reason.value
    record["lineage"] = {s.attr: getattr(h.lineage, s.attr) for s in _LINEAGE_SPECS}
    return record


def _excerpt(value: object) -> object:
    """A bounded, printable stand-in for untrusted data in an error (never calls an unknown ``repr``)."""
    if isinstance(value, bytes):
        return value if len(value) <= 64 else value[:64] + b"..."
    if isinstance(value, str):
        return value if len(value) <= 64 else value[:64] + "..."
    if value is None or isinstance(value, bool | int):
        return value
    return f"<{type(value).__name__}>"
