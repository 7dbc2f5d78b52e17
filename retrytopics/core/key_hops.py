"""The hops key ordering adds to a record's path (docs/key-ordering.md, sections 6 and 11), pure: the headers of a
follower handed off behind its key's predecessor.

A follower has never failed: it carries the record's user headers byte for byte, its replay lineage, the
follower headers of `key_order.encode_follower` and, with header keys, a signature over all of them (as every
hop the router builds).
"""

from __future__ import annotations

from retrytopics.core.headers import (
    REPLAY_COUNT,
    REPLAY_ID,
    REPLAY_ORIGIN_ID,
    REPLAYED_AT,
    Header,
    decode_lineage,
    user_headers,
)
from retrytopics.core.key_order import Follower, encode_follower
from retrytopics.core.router import Consumed, RouteContext, origin_message_id
from retrytopics.core.signing import sign

__all__ = ["follower_headers"]


def follower_headers(
    ctx: RouteContext, record: Consumed, topic: str, *, after: int, held_at: int
) -> tuple[Header, ...]:
    """The headers of source `record` handed off to tier `topic` behind the record of its key at source offset
    `after`, first held back at `held_at` (epoch ms)."""
    follower = Follower(
        original_topic=record.topic,
        original_partition=record.partition,
        original_offset=record.offset,
        original_timestamp=max(-1, record.timestamp_ms),
        consumer_group=ctx.group,
        origin_message_id=origin_message_id(ctx, record),
        after=after,
        held_at=held_at,
    )
    headers = (*user_headers(record.headers), *encode_follower(follower), *_lineage(record.headers))
    return headers if ctx.header_keys is None else sign(ctx.header_keys, topic, record.key, record.value, headers)


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
