"""The hops key ordering adds to a record's path (docs/key-ordering.md, sections 6 and 11), pure: the headers of a
follower handed off behind its key's predecessor, and the DLQ route of one dead-lettered unhandled.

A follower has never failed: it carries the record's user headers byte for byte, its replay lineage, the
follower headers of `follower.encode_follower` and, with header keys, a signature over all of them (as every
hop the router builds).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import (
    CONSUMER_GROUP,
    ORIGINAL_TOPIC,
    REPLAY_COUNT,
    REPLAY_ID,
    REPLAY_ORIGIN_ID,
    REPLAYED_AT,
    DlqReason,
    Header,
    RetryHeaders,
    decode_lineage,
    encode,
    user_headers,
)
from retrytopics.core.keyorder.follower import Follower, decode_follower, encode_follower
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.record import Record
from retrytopics.core.router import Consumed, Route, RouteContext, RouteKind, origin_message_id
from retrytopics.core.signing import SIGNATURE, sign, verify

__all__ = [
    "BLOCKED_BY_KEY",
    "BLOCKED_TYPE",
    "WAITED_BEHIND",
    "BlockedByKey",
    "Origin",
    "blocked_by_key_route",
    "follower_headers",
    "origin_of",
    "read_follower",
    "source_follower",
    "waited_behind",
]

#: `retry.dlq_reason` of a follower dead-lettered behind a dead-lettered head (policy `dead_letter`), or one
#: whose predecessor's fate cannot be proven (see `Step.UNPROVEN`).
BLOCKED_BY_KEY: Final = "blocked_by_key"


class BlockedByKey(Exception):
    """Why a follower is in the DLQ unhandled (`retry.exception_type` of a ``blocked_by_key`` record): it waited
    behind a record of its key that was dead-lettered (policy ``dead_letter``), or whose fate nothing proves."""


#: `retry.exception_type` of a record dead-lettered as ``blocked_by_key``: nothing was raised, it waited. A wire
#: value DLQ readers match on, so it keeps the name the class was first written under, whatever its module now.
BLOCKED_TYPE: Final = "retrytopics.core.key_order.BlockedByKey"


class Origin(NamedTuple):
    """Which record of which chain a hop is about: its chain, and its source offset."""

    chain: ChainKey
    offset: int


def origin_of(record: Record[object]) -> Origin | None:
    """The chain and source offset of a handler's record (a source record, a retried one by its original
    coordinates, or a follower's, built from them); None without a key: never ordered."""
    if record.key is None:
        return None
    retry = record.retry
    if retry is None:
        return Origin(ChainKey(record.topic, record.partition, key_id(record.key)), record.offset)
    return Origin(ChainKey(retry.original_topic, retry.original_partition, key_id(record.key)), retry.original_offset)


def read_follower(ctx: RouteContext, record: Consumed) -> Follower | None:
    """The follower state of a tier record of an ordered handler (None: a retried record), checked as
    `read_retry_state` checks a retried one: signed with header keys, of this group and source. Raises
    `HeaderDecodeError`."""
    follower = decode_follower(record.headers)
    if follower is None:
        return None
    if ctx.header_keys is not None:
        problem = verify(ctx.header_keys, record.topic, record.key, record.value, record.headers)
        if problem is not None:
            raise HeaderDecodeError(SIGNATURE, None, problem)
    if follower.consumer_group != ctx.group:
        raise HeaderDecodeError(CONSUMER_GROUP, follower.consumer_group, f"expected {ctx.group!r}")
    if follower.original_topic != ctx.topics.source:
        raise HeaderDecodeError(ORIGINAL_TOPIC, follower.original_topic, f"expected {ctx.topics.source!r}")
    return follower


def source_follower(ctx: RouteContext, record: Consumed, *, after: int, held_at: int) -> Follower:
    """What a follower hop of source `record` carries: it waits behind its key's record at offset `after`, held
    back since `held_at` (epoch ms)."""
    return Follower(
        original_topic=record.topic,
        original_partition=record.partition,
        original_offset=record.offset,
        original_timestamp=max(-1, record.timestamp_ms),
        consumer_group=ctx.group,
        origin_message_id=origin_message_id(ctx, record),
        after=after,
        held_at=held_at,
    )


def follower_headers(ctx: RouteContext, follower: Follower, record: Consumed, topic: str) -> tuple[Header, ...]:
    """The headers of a follower hop of `record` (a source record, or a follower read in a tier) to `topic`:
    `record`'s user headers byte for byte and lineage, the follower headers, signed with header keys."""
    headers = (*user_headers(record.headers), *encode_follower(follower), *_lineage(record.headers))
    return headers if ctx.header_keys is None else sign(ctx.header_keys, topic, record.key, record.value, headers)


#: What a `blocked_by_key` DLQ record's `retry.exception_message` says it waited behind: a source record
#: `<topic>-<partition>-<offset>` (as `blocked_by_key_route` writes it; a regular expression Spark reads too).
WAITED_BEHIND: Final = r"^behind ([a-zA-Z0-9._-]{1,249}-[0-9]{1,10}-[0-9]{1,19}) "
_waited_behind = re.compile(WAITED_BEHIND)


def waited_behind(retry: RetryHeaders) -> str | None:
    """The source record (`<topic>-<partition>-<offset>`) a `blocked_by_key` DLQ record waited behind; None
    for any other record, or a message that does not say (cut, or not written by this library)."""
    if retry.dlq_reason != DlqReason.BLOCKED_BY_KEY:
        return None
    found = _waited_behind.match(retry.exception_message)
    return None if found is None else found.group(1)


def blocked_by_key_route(ctx: RouteContext, follower: Follower, record: Consumed, *, why: str, now_ms: int) -> Route:
    """The DLQ route of a follower dead-lettered unhandled (docs/key-ordering.md, section 6): its original
    coordinates, origin id and lineage, `retry.reconsume_times` 0, no tier, and exception headers naming what
    it waited behind and `why` (at most a few words)."""
    behind = f"{follower.original_topic}-{follower.original_partition}-{follower.after}"
    retry = RetryHeaders(
        reconsume_times=0,
        origin_message_id=follower.origin_message_id,
        original_topic=follower.original_topic,
        original_partition=follower.original_partition,
        original_offset=follower.original_offset,
        original_timestamp=follower.original_timestamp,
        consumer_group=ctx.group,
        tier=None,
        due_at=None,
        first_failed_at=now_ms,
        last_failed_at=now_ms,
        exception_type=BLOCKED_TYPE,
        exception_message=f"behind {behind} ({why})",
        exception_trace="",
        dlq_reason=DlqReason.BLOCKED_BY_KEY,
        lineage=decode_lineage(record.headers),
    )
    topic = ctx.topics.dlq
    headers = (*user_headers(record.headers), *encode(retry))
    if ctx.header_keys is not None:
        headers = sign(ctx.header_keys, topic, record.key, record.value, headers)
    return Route(
        kind=RouteKind.DLQ,
        topic=topic,
        due_at_ms=None,
        reason=DlqReason.BLOCKED_BY_KEY,
        retry=retry,
        headers=headers,
        partition_hint=None if record.key is not None else follower.original_partition,
    )


def _lineage(headers: tuple[Header, ...]) -> list[Header]:
    """The record's replay lineage as the router writes it on every hop (an invalid field is dropped)."""
    lineage = decode_lineage(headers)
    values = (
        (REPLAY_ID, lineage.replay_id),
        (REPLAYED_AT, lineage.replayed_at),
        (REPLAY_COUNT, lineage.replay_count),
        (REPLAY_ORIGIN_ID, lineage.replay_origin_id),
    )
    return [(header, str(value).encode("utf-8")) for header, value in values if value is not None]
