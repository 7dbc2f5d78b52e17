"""A bounded duplicate audit for tier records (ActiveMQ's ConnectionAudit, Kafka edition).

Pure: standard library and `headers` only. A crash between an acknowledged republish and the commit of its
source offset republishes the record again, so a tier topic can hold two copies of the same hop. Both carry
the same original coordinates (topic, partition, offset of the source record), its timestamp
(``original_timestamp``), ``lineage.replay_count`` and ``reconsume_times``; the second is suppressed (counted
and logged, never dead-lettered) when the audit still remembers the first::

    audit = DuplicateAudit(capacity=2)
    audit.check_and_remember(("orders", 0, 42, 1700000000000, 0, 1))   # False: first sighting
    audit.check_and_remember(("orders", 0, 42, 1700000000000, 0, 1))   # True: a duplicate

The key never holds ``origin_message_id``: with ``id_header`` that is a value a producer chooses, and two
different source records sharing it are not copies of each other (suppressing the second lost it). The
coordinates name one source record, whatever its headers say. They name it only within one life of its topic:
a topic deleted and recreated under the same name numbers its records from 0 again, so the key also holds the
source record's timestamp, which the hops already carry (records handed off by older versions too, on any
broker), and a hop found downstream must carry the record's own key and value: a new record at an old offset
is told apart from the first life's hops (docs/architecture.md).

A second store, `HandOffs`, seeded from the recent tail of a record's destinations (the tiers and the DLQ)
when its partition is assigned, holds the keys of hops already written downstream: a record whose
`hand_off_key` is there, and whose key and value are the bytes that hop carries (`record_digest`; or, for a
hop dead-lettered as a `too_large` reference, the reference it would make: runtime/records/duplicates.py), was
handed off by a previous owner that died before committing it, and is suppressed rather than handled and
handed off again. The digest is only computed for a record whose key is found.

The audit is an LRU of `capacity` keys: memory stays bounded whatever the headers say, and a duplicate
further back than `capacity` handled records is handled again (at-least-once, never lost).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TypeAlias

from retrytopics.core.headers import RetryHeaders

__all__ = ["DEFAULT_CAPACITY", "AuditKey", "DuplicateAudit", "HandOffs", "audit_key", "hand_off_key", "record_digest"]

#: (original_topic, original_partition, original_offset, original_timestamp, lineage.replay_count, reconsume_times)
AuditKey: TypeAlias = tuple[str, int, int, int, int, int]

#: Keys remembered by default: about 10 MB at ~100 bytes a key.
DEFAULT_CAPACITY = 100_000


def audit_key(state: RetryHeaders) -> AuditKey:
    """What identifies one copy of one hop of one source record (see the module docstring)."""
    return (
        state.original_topic,
        state.original_partition,
        state.original_offset,
        state.original_timestamp,
        state.lineage.replay_count,
        state.reconsume_times,
    )


def hand_off_key(
    state: RetryHeaders | None, coords: tuple[str, int, int], timestamp_ms: int, replay_count: int
) -> AuditKey:
    """The audit key of the hop that handing off a record writes downstream (next tier or DLQ): the record's
    own key with one more failure; for a source record (`state` None), its `coords` (topic, partition,
    offset) and timestamp (as the router writes it to ``retry.original_timestamp``) with `replay_count` and one
    failure. Seen in a destination's tail, it says the record was handed off already (see
    `runtime/records/duplicates.py`)::

        hand_off_key(None, ("orders", 0, 42), 1700000000000, 0)   # ("orders", 0, 42, 1700000000000, 0, 1)
    """
    if state is None:
        return (*coords, max(-1, timestamp_ms), replay_count, 1)
    return (*audit_key(state)[:5], state.reconsume_times + 1)


def _checked_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity={capacity!r}: expected an int >= 1")
    return capacity


class DuplicateAudit:
    """Remembers the last `capacity` audit keys it was shown."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = _checked_capacity(capacity)
        self._keys: OrderedDict[AuditKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: AuditKey) -> bool:
        return key in self._keys

    def remember(self, key: AuditKey) -> None:
        """Add `key` (or refresh it), evicting the least recently seen key beyond capacity."""
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def forget(self, key: AuditKey) -> None:
        """Drop `key` (its handling was rolled back, e.g. by an aborted transaction)."""
        self._keys.pop(key, None)

    def check_and_remember(self, key: AuditKey) -> bool:
        """True if `key` was already remembered (a duplicate); remembers it either way."""
        seen = key in self._keys
        self.remember(key)
        return seen


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """A 16-byte digest of a record's key and value (None and empty told apart): what a hop carries of the
    record it hands off, byte for byte."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (key, value):
        digest.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    return digest.digest()


class HandOffs:
    """Hops found downstream: the audit keys of the last `capacity` of them (an LRU, as `DuplicateAudit`),
    each with the digests of the key and value its copies carry (`record_digest`) and when each copy was
    written (the latest, for a digest found twice)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = _checked_capacity(capacity)
        self._hops: OrderedDict[AuditKey, dict[bytes, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hops)

    def __contains__(self, key: AuditKey) -> bool:
        return key in self._hops

    def remember(self, key: AuditKey, digest: bytes, written_ms: int = -1) -> None:
        """A hop with `key`, carrying `digest`, written at `written_ms` (-1: its timestamp is unknown)."""
        copies = self._hops.pop(key, None) or {}
        copies[digest] = max(written_ms, copies.get(digest, -1))
        self._hops[key] = copies
        while len(self._hops) > self.capacity:
            self._hops.popitem(last=False)

    def carries(self, key: AuditKey, digest: bytes, since_ms: int = 0) -> bool:
        """Whether a hop with `key` carrying the key and value of `digest` was found, written at `since_ms`
        or later (`since_ms` 0: whenever it was written, its timestamp known or not)."""
        written = self._hops.get(key, {}).get(digest)
        return written is not None and (since_ms <= 0 or written >= since_ms)
