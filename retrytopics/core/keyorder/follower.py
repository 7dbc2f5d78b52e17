"""The follower's wire form (docs/key-ordering.md, section 4): the ``retry.key_order.*`` headers a record carries
when it is handed off unhandled behind an earlier record of its key, written and read back strictly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import (
    CONSUMER_GROUP,
    MAX_HEADER_COUNT,
    MAX_VALUE_BYTES,
    ORIGIN_MESSAGE_ID,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    RECONSUME_TIMES,
    SCHEMA_VERSION,
    Header,
)
from retrytopics.core.keyorder.bounds import INT32_MAX, INT64_MAX, excerpt

__all__ = ["HELD_AT", "KEY_ORDER_AFTER", "Follower", "decode_follower", "encode_follower"]


#: The follower headers (docs/headers.md style: UTF-8 decimal text). A record carrying `KEY_ORDER_AFTER` is a
#: follower: a source record never handled yet, waiting behind the record of its key at that source offset.
KEY_ORDER_AFTER: Final = "retry.key_order.after"
#: Epoch ms at which the main consumer first held the follower back (the audit's wait behind a head).
HELD_AT: Final = "retry.key_order.held_at"

_TOPIC: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_CANONICAL_INT: Final = re.compile(r"0|-?[1-9][0-9]{0,18}")
_ID_LIMIT_BYTES: Final = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class Follower:
    """What a follower hop carries besides the record's key, value and user headers (byte for byte) and its
    replay lineage (``retry.replay_*``, copied): the source record it is, and the source offset of the record
    of its key it waits behind (`after`, always earlier than its own)."""

    original_topic: str
    original_partition: int
    original_offset: int
    original_timestamp: int
    consumer_group: str
    origin_message_id: str
    after: int
    held_at: int


_FOLLOWER_SPECS: Final = (
    (SCHEMA_VERSION, "schema_version", 1, 1),
    (ORIGINAL_TOPIC, "original_topic", None, None),
    (ORIGINAL_PARTITION, "original_partition", 0, INT32_MAX),
    (ORIGINAL_OFFSET, "original_offset", 0, INT64_MAX),
    (ORIGINAL_TIMESTAMP, "original_timestamp", -1, INT64_MAX),
    (CONSUMER_GROUP, "consumer_group", None, None),
    (ORIGIN_MESSAGE_ID, "origin_message_id", 1, _ID_LIMIT_BYTES),
    (KEY_ORDER_AFTER, "after", 0, INT64_MAX),
    (HELD_AT, "held_at", 0, INT64_MAX),
)
_FOLLOWER_HEADERS: Final = frozenset(spec[0] for spec in _FOLLOWER_SPECS)


def encode_follower(f: Follower) -> list[Header]:
    """The ``retry.*`` headers of a follower hop (the runtime adds the lineage and, with keys, a signature)."""
    values = {**{attr: getattr(f, attr) for _, attr, _, _ in _FOLLOWER_SPECS[1:]}, "schema_version": 1}
    return [(header, str(values[attr]).encode()) for header, attr, _, _ in _FOLLOWER_SPECS]


def decode_follower(headers: Sequence[Header]) -> Follower | None:
    """The follower state of a tier record, or None when it is not a follower (no `KEY_ORDER_AFTER`).
    Untrusted headers: strict and bounded; a problem raises `HeaderDecodeError`, so the record is
    dead-lettered as ``invalid_retry_headers`` like any tier record with bad headers."""
    if len(headers) > MAX_HEADER_COUNT:
        raise HeaderDecodeError("headers", len(headers), f"more than {MAX_HEADER_COUNT} headers")
    if not any(item[0] == KEY_ORDER_AFTER for item in headers):
        return None
    found: dict[str, bytes | None] = {}
    for name, raw in headers:
        if name == RECONSUME_TIMES:
            raise HeaderDecodeError(name, excerpt(raw), "a follower has never failed: no retry count")
        if name in _FOLLOWER_HEADERS:
            if name in found:
                raise HeaderDecodeError(name, excerpt(raw), "duplicated retry header")
            found[name] = raw
    values: dict[str, object] = {}
    for header, attr, lo, hi in _FOLLOWER_SPECS:
        values[attr] = _follower_field(header, found.get(header), lo, hi)
    values.pop("schema_version")
    follower = Follower(**values)  # type: ignore[arg-type]
    if follower.after >= follower.original_offset:
        raise HeaderDecodeError(KEY_ORDER_AFTER, follower.after, "a follower waits behind an earlier record")
    return follower


def _follower_field(header: str, raw: bytes | None, lo: int | None, hi: int | None) -> object:
    if raw is None:
        raise HeaderDecodeError(header, None, "missing")
    if len(raw) > MAX_VALUE_BYTES:
        raise HeaderDecodeError(header, excerpt(raw), f"longer than {MAX_VALUE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderDecodeError(header, excerpt(raw), "not valid UTF-8") from None
    if lo is None or hi is None:  # a topic or group name
        if not _TOPIC.fullmatch(text):
            raise HeaderDecodeError(header, excerpt(raw), "expected a legal topic/group name")
        return text
    if header == ORIGIN_MESSAGE_ID:
        if not lo <= len(raw) <= hi:
            raise HeaderDecodeError(header, excerpt(raw), f"expected {lo}..{hi} UTF-8 bytes")
        return text
    if not _CANONICAL_INT.fullmatch(text) or not lo <= int(text) <= hi:
        raise HeaderDecodeError(header, excerpt(raw), f"expected a decimal integer in {lo}..{hi}")
    return int(text)
