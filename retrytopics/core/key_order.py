"""Key-ordered retries, the pure core: which records of a key wait, where, and when they may run.

Pure: standard library and the pure core only, no clock of its own, no I/O. The design, its failure cases and its
costs are in docs/key-ordering.md; in one paragraph: a record whose key has an earlier record of the same
source partition still in the retry chain (a *blocked* key) is not handled but handed off as a *follower*
behind the key's last record, into the same tier (same key, so the same partition: Kafka's partition order is
the lock). Whoever reads a follower has read its predecessor first, so it knows the predecessor's fate: handled
(the follower runs), dead-lettered (the policy says), or sent on to tier Y (the follower follows it there).
What each consumer knows is also written to a compacted key-state topic, so a new owner of a partition knows
it before it reads anything::

    chains = SourceChains(KeyOrdering(), source="orders", partition=0)
    k = key_id(b"acct-7")
    chains.admit(k)                                   # Admission(HANDLE): the key is not blocked
    chains.handed_off(k, 41, now_ms=t)                # its handler failed; the router sent it to a tier
    chains.admit(k)                                   # Admission(WAIT): until that hop is acknowledged
    chains.acked(k, 41, landed=0)                     # Chain(head=41, frontier=41, at_tier=0, ...): write it
    chains.admit(k)                                   # Admission(FOLLOW, tier=0, after=41)

The module holds one state machine and the wire forms it writes and reads (follower headers, key-state
records): they change together, so they stay in one file past the usual size.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, NamedTuple, TypeAlias

from retrytopics.core.errors import ConfigError, HeaderDecodeError, KeyStateDecodeError
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
from retrytopics.core.signing import HeaderKeys, sign_state

__all__ = [
    "BLOCKED_BY_KEY",
    "BlockedByKey",
    "HELD_AT",
    "KEY_ORDER_AFTER",
    "Admission",
    "Admit",
    "Chain",
    "ChainKey",
    "Closed",
    "DeadHeadPolicy",
    "Fate",
    "Follower",
    "KeyOrdering",
    "KeyStateRecord",
    "Passage",
    "SourceChains",
    "Step",
    "TierDecision",
    "TierPassages",
    "batch_end",
    "decode_follower",
    "decode_record",
    "encode_follower",
    "encode_record",
    "encode_signed",
    "key_id",
]

#: The follower headers (docs/headers.md style: UTF-8 decimal text). A record carrying `KEY_ORDER_AFTER` is a
#: follower: a source record never handled yet, waiting behind the record of its key at that source offset.
KEY_ORDER_AFTER: Final = "retry.key_order.after"
#: Epoch ms at which the main consumer first held the follower back (the audit's wait behind a head).
HELD_AT: Final = "retry.key_order.held_at"
#: `retry.dlq_reason` of a follower dead-lettered behind a dead-lettered head (policy `dead_letter`), or one
#: whose predecessor's fate cannot be proven (see `Step.UNPROVEN`).
BLOCKED_BY_KEY: Final = "blocked_by_key"


class BlockedByKey(Exception):
    """Why a follower is in the DLQ unhandled (`retry.exception_type` of a ``blocked_by_key`` record): it waited
    behind a record of its key that was dead-lettered (policy ``dead_letter``), or whose fate nothing proves."""


_INT32: Final = 2**31 - 1
_INT64: Final = 2**63 - 1
_SHORT_KEY: Final = 32
_TOPIC: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_CANONICAL_INT: Final = re.compile(r"0|-?[1-9][0-9]{0,18}")
_ID_LIMIT_BYTES: Final = 512
#: A key-state record's key and value are never longer than this (a source topic name, a partition, a key id).
_MAX_STATE_BYTES: Final = 512
_MAX_TIER: Final = 99  # as `retry.tier`


def key_id(key: bytes) -> bytes:
    """What the state remembers of a record key: a short key itself (tagged ``00``), a longer one by its
    BLAKE2b-128 digest (tagged ``01``), so memory per blocked key is bounded whatever the keys are. The tags
    keep the two forms apart; a digest collision (2⁻⁶⁴ for a billion keys) only orders two keys together."""
    if len(key) <= _SHORT_KEY:
        return b"\x00" + key
    return b"\x01" + hashlib.blake2b(key, digest_size=16).digest()


class ChainKey(NamedTuple):
    """One ordered sequence: the records of one key (its `key_id`) from one source partition."""

    source_topic: str
    source_partition: int
    key: bytes


class DeadHeadPolicy(StrEnum):
    """What a dead-lettered record does to the records of its key waiting behind it."""

    RELEASE = "release"
    """The followers proceed in order; the dead-lettered record is simply terminal (the default)."""
    DEAD_LETTER = "dead_letter"
    """The followers already waiting behind it are dead-lettered too, in order, with reason
    ``blocked_by_key``, so that a replay of the DLQ restores the whole sequence in source order."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "expected an int >= 1")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyOrdering:
    """Key ordering for one handler (``@app.handler("orders", ordering=KeyOrdering())``).

    ``dead_head``: what a dead-lettered record does to its followers (`DeadHeadPolicy`).
    ``max_blocked_keys``: open chains per source partition; the main consumer pauses the partition before a
    record of a new key when it has this many (blocking, counted and logged), about 200 bytes each.
    ``max_tracked_records``: records of open chains a tier consumer remembers (for every partition it owns),
    about 150 bytes each; past it, the least recently used idle chain is forgotten (a late follower of it is
    dead-lettered, never handled out of order).

    Example: ``KeyOrdering(dead_head="dead_letter", max_blocked_keys=500)``. A bound too low pauses source
    partitions whenever that many keys fail at once; too high costs memory only when keys do fail.
    """

    dead_head: DeadHeadPolicy = DeadHeadPolicy.RELEASE
    max_blocked_keys: int = 1_000
    max_tracked_records: int = 100_000

    def __post_init__(self) -> None:
        if self.dead_head not in set(DeadHeadPolicy):
            raise ConfigError("dead_head", self.dead_head, f"expected one of {[p.value for p in DeadHeadPolicy]}")
        object.__setattr__(self, "dead_head", DeadHeadPolicy(self.dead_head))
        _positive_int("max_blocked_keys", self.max_blocked_keys)
        _positive_int("max_tracked_records", self.max_tracked_records)
        if self.max_tracked_records < self.max_blocked_keys:
            raise ConfigError("max_tracked_records", self.max_tracked_records, "expected at least max_blocked_keys")


# ---------------------------------------------------------------------------------------------------------------
# Durable records (the compacted key-state topic)


class Fate(StrEnum):
    """What happened to the last record of a key that a tier consumer read."""

    SENT = "sent"
    """Handed on to another tier (retried, or a follower that followed its predecessor there)."""
    SUCCEEDED = "succeeded"
    """Its handler returned: it and every earlier record of its key are terminal."""
    DEAD_LETTERED = "dead_lettered"
    """It is in the DLQ: it and every earlier record of its key are terminal."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Passage:
    """What a tier's consumer did with one record of a chain (`seen`, a source offset), the last time it read
    it: `fate`, and, when `SENT`, the tier it went to and the offset a follower forwarded from here waits
    behind there (`after`: `seen` itself, or `seen`'s own predecessor if `seen` was dead-lettered unhandled on
    its way). Written by that tier's consumer only, once the hop is acknowledged and before the commit that
    passes the record; one record per (tier, chain, `seen`), tombstoned when no longer needed."""

    tier: int
    chain: ChainKey
    seen: int
    fate: Fate
    to_tier: int | None = None
    after: int | None = None

    def __post_init__(self) -> None:
        if (self.fate is Fate.SENT) != (self.to_tier is not None and self.after is not None):
            raise ConfigError("to_tier", self.to_tier, "a SENT passage names its tier and `after`, no other does")


@dataclass(frozen=True, slots=True, kw_only=True)
class Chain:
    """The main consumer's record of an open chain: its first record (`head`), the offset the next follower
    waits behind (`frontier`), a tier on that record's path (`at_tier`, where followers are sent), how many
    records joined behind the head, and when the chain opened. Written by the owner of the source partition
    only."""

    chain: ChainKey
    head: int
    frontier: int
    at_tier: int
    followers: int
    since_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Closed:
    """A tombstone: the main consumer's chain is closed (`tier` and `seen` None), or tier `tier` no longer
    needs its passage of `seen`."""

    chain: ChainKey
    tier: int | None = None
    seen: int | None = None

    def __post_init__(self) -> None:
        if (self.tier is None) != (self.seen is None):
            raise ConfigError("seen", self.seen, "a passage's tombstone names its tier and offset, a chain's neither")


KeyStateRecord: TypeAlias = Chain | Passage | Closed


def _record_key(chain: ChainKey, tier: int | None, seen: int | None) -> bytes:
    where = f"{chain.source_topic}/{chain.source_partition}/{chain.key.hex()}"
    return f"chain/{where}".encode() if tier is None else f"tier{tier}/{where}/{seen}".encode()


def encode_record(record: KeyStateRecord) -> tuple[bytes, bytes | None, int]:
    """The Kafka key, value (None: a tombstone) and partition (the source partition: everything about one
    chain is in one partition, in the order it was written) of a key-state record."""
    if isinstance(record, Closed):
        return _record_key(record.chain, record.tier, record.seen), None, record.chain.source_partition
    value: dict[str, object]
    if isinstance(record, Chain):
        key = _record_key(record.chain, None, None)
        value = {
            "v": 1,
            "head": record.head,
            "frontier": record.frontier,
            "at": record.at_tier,
            "followers": record.followers,
            "since": record.since_ms,
        }
    else:
        key = _record_key(record.chain, record.tier, record.seen)
        value = {"v": 1, "fate": record.fate.value}
        if record.fate is Fate.SENT:
            value |= {"to": record.to_tier, "after": record.after}
    return key, json.dumps(value, separators=(",", ":")).encode(), record.chain.source_partition


def encode_signed(
    record: KeyStateRecord, topic: str, keys: HeaderKeys | None
) -> tuple[bytes, bytes | None, int, tuple[Header, ...]]:
    """`encode_record` and the headers of `record` written to key-state topic `topic`: with `keys`, its
    `retry.signature` (`signing.sign_state`; docs/key-ordering.md, section 9), else none."""
    key, value, partition = encode_record(record)
    return key, value, partition, (() if keys is None else (sign_state(keys, topic, key, value),))


_KEY_FORM: Final = re.compile(
    r"(?:chain|tier(0|[1-9][0-9]?))/([a-zA-Z0-9._-]{1,249})/(0|[1-9][0-9]{0,9})/((?:[0-9a-f]{2}){1,33})"
    r"(?:/(0|[1-9][0-9]{0,18}))?"
)
_CHAIN_FIELDS: Final = {"v", "head", "frontier", "at", "followers", "since"}


def decode_record(key: bytes | None, value: bytes | None) -> KeyStateRecord:
    """Read a key-state record. Untrusted bytes: total and bounded; any problem raises
    `KeyStateDecodeError` (naming the field, a bounded excerpt and the reason) and nothing else."""
    if not isinstance(key, bytes) or len(key) > _MAX_STATE_BYTES:
        raise KeyStateDecodeError("key", _excerpt(key), f"expected at most {_MAX_STATE_BYTES} bytes")
    form = _KEY_FORM.fullmatch(key.decode("ascii", "replace"))
    chain_key = None if form is None else _chain_key(form.group(2), form.group(3), form.group(4))
    is_chain = key.startswith(b"chain/")
    if form is None or chain_key is None or is_chain != (form.group(5) is None):
        raise KeyStateDecodeError(
            "key", _excerpt(key), "expected chain/<topic>/<partition>/<key id> or tierN/<...>/<offset>"
        )
    tier = None if is_chain else int(form.group(1))
    seen = None if is_chain else int(form.group(5))
    if seen is not None and seen > _INT64:
        raise KeyStateDecodeError("key", _excerpt(key), "offset out of range")
    if value is None:
        return Closed(chain=chain_key, tier=tier, seen=seen)
    fields = _json_object(value)
    if tier is None or seen is None:
        _exact(fields, _CHAIN_FIELDS)
        head, frontier = _offset(fields, "head"), _offset(fields, "frontier")
        if frontier < head:
            raise KeyStateDecodeError("frontier", frontier, "earlier than head")
        return Chain(
            chain=chain_key,
            head=head,
            frontier=frontier,
            at_tier=_int(fields, "at", 0, _MAX_TIER),
            followers=_int(fields, "followers", 0, _INT64),
            since_ms=_int(fields, "since", -1, _INT64),
        )
    fate_text = fields.get("fate")
    if fate_text not in {f.value for f in Fate}:
        raise KeyStateDecodeError("fate", _excerpt(fate_text), f"expected one of {[f.value for f in Fate]}")
    fate = Fate(str(fate_text))
    _exact(fields, {"v", "fate"} | ({"to", "after"} if fate is Fate.SENT else set()))
    if fate is not Fate.SENT:
        return Passage(tier=tier, chain=chain_key, seen=seen, fate=fate)
    after = _offset(fields, "after")
    if after > seen:
        raise KeyStateDecodeError("after", after, "later than the record it follows")
    return Passage(
        tier=tier, chain=chain_key, seen=seen, fate=fate, to_tier=_int(fields, "to", 0, _MAX_TIER), after=after
    )


def _chain_key(topic: str, partition: str, key_hex: str) -> ChainKey | None:
    """The chain a record key names, or None if its partition or key id cannot be one."""
    kid = bytes.fromhex(key_hex)
    if int(partition) > _INT32 or kid[0] not in (0, 1) or (kid[0] == 1 and len(kid) != 17) or len(kid) > 33:
        return None
    return ChainKey(topic, int(partition), kid)


def _json_object(value: bytes) -> dict[str, object]:
    if not isinstance(value, bytes) or len(value) > _MAX_STATE_BYTES:
        raise KeyStateDecodeError("value", _excerpt(value), f"expected at most {_MAX_STATE_BYTES} bytes")
    try:
        parsed = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise KeyStateDecodeError("value", _excerpt(value), "not a JSON object in UTF-8") from None
    if not isinstance(parsed, dict):
        raise KeyStateDecodeError("value", _excerpt(value), "not a JSON object")
    if parsed.get("v") != 1 or isinstance(parsed.get("v"), bool):
        raise KeyStateDecodeError("v", _excerpt(parsed.get("v")), "expected version 1")
    return parsed


def _exact(fields: dict[str, object], expected: set[str]) -> None:
    if set(fields) != expected:
        raise KeyStateDecodeError("value", sorted(set(fields) ^ expected)[:4], f"expected exactly {sorted(expected)}")


def _int(fields: dict[str, object], name: str, lo: int, hi: int) -> int:
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise KeyStateDecodeError(name, _excerpt(value), f"expected an integer in {lo}..{hi}")
    return value


def _offset(fields: dict[str, object], name: str) -> int:
    return _int(fields, name, 0, _INT64)


# ---------------------------------------------------------------------------------------------------------------
# Follower headers


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
    (ORIGINAL_PARTITION, "original_partition", 0, _INT32),
    (ORIGINAL_OFFSET, "original_offset", 0, _INT64),
    (ORIGINAL_TIMESTAMP, "original_timestamp", -1, _INT64),
    (CONSUMER_GROUP, "consumer_group", None, None),
    (ORIGIN_MESSAGE_ID, "origin_message_id", 1, _ID_LIMIT_BYTES),
    (KEY_ORDER_AFTER, "after", 0, _INT64),
    (HELD_AT, "held_at", 0, _INT64),
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
            raise HeaderDecodeError(name, _excerpt(raw), "a follower has never failed: no retry count")
        if name in _FOLLOWER_HEADERS:
            if name in found:
                raise HeaderDecodeError(name, _excerpt(raw), "duplicated retry header")
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
        raise HeaderDecodeError(header, _excerpt(raw), f"longer than {MAX_VALUE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderDecodeError(header, _excerpt(raw), "not valid UTF-8") from None
    if lo is None or hi is None:  # a topic or group name
        if not _TOPIC.fullmatch(text):
            raise HeaderDecodeError(header, _excerpt(raw), "expected a legal topic/group name")
        return text
    if header == ORIGIN_MESSAGE_ID:
        if not lo <= len(raw) <= hi:
            raise HeaderDecodeError(header, _excerpt(raw), f"expected {lo}..{hi} UTF-8 bytes")
        return text
    if not _CANONICAL_INT.fullmatch(text) or not lo <= int(text) <= hi:
        raise HeaderDecodeError(header, _excerpt(raw), f"expected a decimal integer in {lo}..{hi}")
    return int(text)


def _excerpt(value: object) -> object:
    """A bounded, printable stand-in for untrusted data in an error."""
    if isinstance(value, bytes | str):
        return value if len(value) <= 64 else value[:64]
    if value is None or isinstance(value, bool | int):
        return value
    return f"<{type(value).__name__}>"


def batch_end(keys: Sequence[bytes | None]) -> int:
    """How many records, from the start of `keys` (a run of one partition, as `key_id`s; None: no key), one batch
    call may take: up to the second record of a key already in it, which must wait for the call's outcome (it
    follows the first if that one fails). Records without a key never end a call::

        batch_end([b"a", b"b", None, None, b"a", b"c"])   # 4
    """
    seen: set[bytes] = set()
    for index, key in enumerate(keys):
        if key is not None:
            if key in seen:
                return index
            seen.add(key)
    return len(keys)


# ---------------------------------------------------------------------------------------------------------------
# The main consumer: open chains of one source partition


class Admit(StrEnum):
    """What the main consumer does with a source record, before any handler runs."""

    HANDLE = "handle"
    """Its key is not blocked (or it has no key): handle it as usual."""
    FOLLOW = "follow"
    """Its key is blocked: hand it off as a follower to `Admission.tier`, waiting behind `Admission.after`."""
    WAIT = "wait"
    """The hand-off of its key's last record is not acknowledged yet: stop the partition at this record until
    it is (a refused hand-off changes where this one must go)."""
    PAUSE = "pause"
    """`max_blocked_keys` chains are open and this record could open one more: pause the partition until a
    chain closes (blocking, counted and logged)."""


@dataclass(frozen=True, slots=True)
class Admission:
    action: Admit
    tier: int | None = None
    after: int | None = None


_HANDLE: Final = Admission(Admit.HANDLE)
_WAIT: Final = Admission(Admit.WAIT)
_PAUSE: Final = Admission(Admit.PAUSE)


@dataclass(slots=True)
class _Open:
    head: int
    frontier: int
    at_tier: int
    followers: int
    since_ms: int
    pending: int | None = None  # offset of a follower whose hand-off is not acknowledged yet
    anchor: tuple[int, int] = (0, 0)  # (tier, frontier) as the chain record says: where `_chase` walks from

    def __post_init__(self) -> None:
        self.anchor = (self.at_tier, self.frontier)


class SourceChains:
    """The open chains of one source partition, held by its main consumer (one instance per assignment).

    Ask it about every source record before its handler (`admit`); tell it of every hand-off (`handed_off`,
    then `acked` with where the record landed) and of every key-state record of its partition as it is read
    (`learn`); write what `acked` and `learn` return before committing past the record. `rebuild` makes the
    state a new owner starts from. Its own chain records are never read back live: this instance is their
    only writer, and its memory is newer than any of them.
    """

    def __init__(self, config: KeyOrdering, *, source: str, partition: int) -> None:
        self.config = config
        self.source = source
        self.partition = partition
        self._open: dict[bytes, _Open] = {}
        self._passages: dict[bytes, dict[tuple[int, int], Passage]] = {}  # key -> (tier, seen) -> passage
        self._settled: dict[bytes, int] = {}  # key -> highest offset a passage shows terminal (all below are too)
        self._starting: dict[bytes, tuple[int, int]] = {}  # key -> (offset, now_ms) of a new head in flight

    @classmethod
    def rebuild(
        cls, config: KeyOrdering, records: Iterable[KeyStateRecord], *, source: str, partition: int
    ) -> tuple[SourceChains, list[Closed]]:
        """The state a new owner of the partition starts from, from the key-state records of its partition in
        the order they were read (compacted or not: a later record of a key wins, as compaction keeps it), and
        the tombstones to write for chains the records show closed."""
        chains = cls(config, source=source, partition=partition)
        latest: dict[bytes, Chain | None] = {}
        for record in records:
            if not chains._ours(record.chain):
                continue
            key = record.chain.key
            if isinstance(record, Passage):
                chains._remember(record)
            elif isinstance(record, Chain):
                latest[key] = record
            elif record.tier is None or record.seen is None:
                latest[key] = None
                chains._passages.pop(key, None)  # facts about the closed chain's records, as `_close` drops them
                chains._settled.pop(key, None)
            else:
                chains._passages.get(key, {}).pop((record.tier, record.seen), None)
        closed: list[Closed] = []
        for key, chain in latest.items():
            if chain is not None:
                chains._open[key] = _Open(chain.head, chain.frontier, chain.at_tier, chain.followers, chain.since_ms)
                if chains._chase(key, chains._open[key]):
                    closed.append(chains._close(key))
        for key in [k for k in chains._passages if k not in chains._open]:
            del chains._passages[key]
        chains._settled = {k: v for k, v in chains._settled.items() if k in chains._open}
        return chains, closed

    def blocked(self) -> int:
        """How many keys of this partition are blocked (open chains)."""
        return len(self._open)

    def room(self) -> int:
        """How many more chains may open before `max_blocked_keys` (a head whose hop is in flight counts): a
        batch call admits its records before any of them fails, so it holds at most this many."""
        return self.config.max_blocked_keys - len(self._open) - len(self._starting)

    def chain(self, key: bytes) -> Chain | None:
        """The open chain of `key` (a `key_id`), as it would be written."""
        state = self._open.get(key)
        return None if state is None else self._record(key, state)

    def admit(self, key: bytes | None) -> Admission:
        """What to do with the next source record of key `key` (a `key_id`; None: no key, never ordered)."""
        if key is None:
            return _HANDLE
        state = self._open.get(key)
        if state is None:
            if key in self._starting:
                return _WAIT
            return _PAUSE if len(self._open) + len(self._starting) >= self.config.max_blocked_keys else _HANDLE
        if state.pending is not None:
            return _WAIT
        return Admission(Admit.FOLLOW, state.at_tier, state.frontier)

    def handed_off(self, key: bytes, offset: int, *, now_ms: int) -> None:
        """The record at `offset` was produced to a tier or the DLQ: a failed record of an unblocked key (a new
        head, or dead-lettered at once) or a follower (`Admit.FOLLOW`). Until `acked`, the key's next record
        waits: it may be handled only once this one is durably where it goes."""
        state = self._open.get(key)
        if state is None:
            self._starting[key] = (offset, now_ms)
        else:
            state.pending = offset

    def acked(self, key: bytes, offset: int, *, landed: int | None) -> Chain | Closed | None:
        """The hand-off of `offset` was acknowledged in tier `landed` (None: in the DLQ, routed there or
        refused by its tier as too large). Returns the key-state record to write before committing past
        `offset`, if any."""
        state = self._open.get(key)
        if state is None:
            start = self._starting.get(key)
            if start is None or start[0] != offset:
                return None
            del self._starting[key]
            if landed is None:  # a head dead-lettered at once is terminal: no chain
                self._passages.pop(key, None)
                self._settled.pop(key, None)
                return None
            state = self._open[key] = _Open(offset, offset, landed, 0, start[1])
        elif state.pending != offset:
            return None
        else:
            state.pending = None
            if landed is not None:
                state.frontier, state.at_tier, state.followers = offset, landed, state.followers + 1
                state.anchor = (landed, offset)
            # else: dropped on its way (in the DLQ unhandled); the next follower waits behind the same record
        if self._chase(key, state):
            return self._close(key)
        if landed is None:
            return None
        state.anchor = (state.at_tier, state.frontier)
        return self._record(key, state)

    def learn(self, record: KeyStateRecord) -> Closed | None:
        """Apply a key-state record of this partition read live (tiers' passages and their tombstones; chain
        records are this instance's own). Returns the tombstone to write when the key is no longer blocked."""
        if isinstance(record, Chain) or not self._ours(record.chain):
            return None
        key = record.chain.key
        state = self._open.get(key)
        if state is None and key not in self._starting:
            return None  # about a chain closed already
        if isinstance(record, Closed):
            if record.tier is not None and record.seen is not None:
                self._passages.get(key, {}).pop((record.tier, record.seen), None)
            return None
        self._remember(record)
        return self._close(key) if state is not None and self._chase(key, state) else None

    def _remember(self, passage: Passage) -> None:
        key = passage.chain.key
        self._passages.setdefault(key, {})[(passage.tier, passage.seen)] = passage
        if passage.fate is not Fate.SENT:
            self._settled[key] = max(passage.seen, self._settled.get(key, -1))

    def _ours(self, chain: ChainKey) -> bool:
        return chain.source_topic == self.source and chain.source_partition == self.partition

    def _chase(self, key: bytes, state: _Open) -> bool:
        """Follow the passages of the frontier from where the chain record last put it; True when they show it
        terminal (and no follower is in flight). A record settled at or after the frontier settles it
        (everything before a handled record is terminal), whichever tier says so: a tier forgets its passages
        below one it settled. A record can visit a tier twice, so the walk stops before a position it has been
        at: any tier on the record's path is a good place to send a follower (that tier forwards it), and
        walking from the recorded position makes a rebuilt state decide as the live one."""
        if self._settled.get(key, -1) >= state.anchor[1]:
            return state.pending is None
        passages = self._passages.get(key, {})
        position, visited = state.anchor, {state.anchor}
        while (passage := passages.get(position)) is not None:
            if passage.fate is not Fate.SENT or passage.to_tier is None or passage.after is None:
                return state.pending is None
            if (passage.to_tier, passage.after) in visited:
                break
            position = (passage.to_tier, passage.after)
            visited.add(position)
            if self._settled.get(key, -1) >= position[1]:
                return state.pending is None
        state.at_tier, state.frontier = position
        return False

    def _close(self, key: bytes) -> Closed:
        del self._open[key]
        self._passages.pop(key, None)
        self._settled.pop(key, None)
        return Closed(chain=ChainKey(self.source, self.partition, key))

    def _record(self, key: bytes, state: _Open) -> Chain:
        return Chain(
            chain=ChainKey(self.source, self.partition, key),
            head=state.head,
            frontier=state.frontier,
            at_tier=state.at_tier,
            followers=state.followers,
            since_ms=state.since_ms,
        )


# ---------------------------------------------------------------------------------------------------------------
# A tier consumer: what it knows of each chain whose records it read


class Step(StrEnum):
    """What a tier consumer does with a record of an ordered handler."""

    HANDLE = "handle"
    """Every earlier record of its key is terminal: handle it now (a follower's first attempt: a failure
    routes as a source record's first failure would)."""
    FORWARD = "forward"
    """A follower whose predecessor went on to `TierDecision.tier`: hand it off there, waiting behind
    `TierDecision.after`."""
    DEAD_LETTER = "dead_letter"
    """A follower whose predecessor was dead-lettered, under `dead_letter`: to the DLQ, reason
    ``blocked_by_key``."""
    DUPLICATE = "duplicate"
    """A copy of a follower this consumer has read already (a crash repeated a hop): finish it."""
    WAIT = "wait"
    """The hop of the key's last record read here is not acknowledged yet: stop the partition at this record
    until it is."""
    UNPROVEN = "unproven"
    """A follower whose predecessor nothing here accounts for (a forged record, a key-state topic lost, a
    key forgotten past `max_tracked_records`): never handled out of order; the runtime dead-letters it as
    ``blocked_by_key``."""


@dataclass(frozen=True, slots=True)
class TierDecision:
    step: Step
    tier: int | None = None
    after: int | None = None


_T_HANDLE: Final = TierDecision(Step.HANDLE)
_T_WAIT: Final = TierDecision(Step.WAIT)
_T_DUPLICATE: Final = TierDecision(Step.DUPLICATE)
_T_UNPROVEN: Final = TierDecision(Step.UNPROVEN)
_T_DEAD_LETTER: Final = TierDecision(Step.DEAD_LETTER)


@dataclass(slots=True)
class _Entry:
    fate: Fate
    to_tier: int | None = None
    after: int | None = None
    fallback: tuple[Fate, int | None, int | None] | None = None  # kept if a forwarded follower is dropped


@dataclass(slots=True)
class _Known:
    entries: dict[int, _Entry] = field(default_factory=dict)  # source offset -> its last fate here
    floor: int = -1  # every record of the chain up to this offset is terminal
    pending: int | None = None  # the record whose hop is not acknowledged yet


class TierPassages:
    """What one tier's consumer knows of the chains whose records it read (for every partition it owns): per
    record, what it did with it the last time it read it. A record can pass one tier more than once (it
    failed there and was sent back, or followed its predecessor back), so this is per record, not per key;
    everything below a record settled here is terminal and forgotten. It reads the key-state topic only at
    assignment (`rebuild`): what it needs of a follower's predecessor it learnt itself, because the
    predecessor was placed in its partition first.

    Ask it about each record of an ordered handler (`on_retry` for a retried record, `on_follower`); tell it
    what became of each (`handled`, `forwarded`, `dead_lettered`, then `acked` for hops); write the records
    they return before committing past the record.
    """

    def __init__(self, config: KeyOrdering, *, tier: int) -> None:
        self.config = config
        self.tier = tier
        self._known: OrderedDict[ChainKey, _Known] = OrderedDict()
        self._entries = 0

    @classmethod
    def rebuild(
        cls, config: KeyOrdering, records: Iterable[KeyStateRecord], *, tier: int
    ) -> tuple[TierPassages, list[Closed]]:
        """The state a consumer of `tier` starts from at assignment, from every key-state record in the order
        read (it keeps its own passages and their tombstones), and the tombstones to write for passages it no
        longer needs."""
        passages = cls(config, tier=tier)
        stale: dict[tuple[ChainKey, int | None], Closed] = {}
        for record in records:
            if isinstance(record, Passage) and record.tier == tier:
                entry = _Entry(record.fate, record.to_tier, record.after)
                written = passages._put(record.chain, record.seen, entry)
                stale |= {(c.chain, c.seen): c for c in written if isinstance(c, Closed)}
            elif isinstance(record, Closed) and record.tier == tier and record.seen is not None:
                stale.pop((record.chain, record.seen), None)
                known = passages._known.get(record.chain)
                if known is not None and known.entries.pop(record.seen, None) is not None:
                    passages._entries -= 1
        return passages, list(stale.values())

    def tracked(self) -> int:
        """How many records of open chains this consumer remembers."""
        return self._entries

    def on_retry(self, chain: ChainKey) -> TierDecision:
        """A retried record of `chain` (it was handled once, so every earlier record of its key is terminal):
        handle it, unless a hop of its chain read here is still in flight."""
        known = self._known.get(chain)
        return _T_WAIT if known is not None and known.pending is not None else _T_HANDLE

    def on_follower(self, chain: ChainKey, offset: int, after: int) -> TierDecision:
        """What to do with the follower at source `offset` of `chain` that waits behind `after`."""
        known = self._known.get(chain)
        if known is not None and known.pending is not None:
            return _T_WAIT
        entry = None if known is None else known.entries.get(after)
        if entry is None:  # a copy of a record at or below one settled here, or nothing here accounts for it
            return _T_DUPLICATE if known is not None and offset <= known.floor else _T_UNPROVEN
        if entry.fate is Fate.SENT:
            return TierDecision(Step.FORWARD, entry.to_tier, entry.after)
        if entry.fate is Fate.DEAD_LETTERED and self.config.dead_head is DeadHeadPolicy.DEAD_LETTER:
            return _T_DEAD_LETTER
        return _T_HANDLE

    def handled(
        self, chain: ChainKey, offset: int, *, to_tier: int | None, dead_lettered: bool = False
    ) -> list[KeyStateRecord]:
        """The handler ran for the record at source `offset` (retried, or a follower on `Step.HANDLE`): it
        succeeded (`to_tier` None and not `dead_lettered`: returns the records to write), or it was routed to
        `to_tier` or to the DLQ (`dead_lettered`), and `acked` settles it."""
        if to_tier is None and not dead_lettered:
            return self._put(chain, offset, _Entry(Fate.SUCCEEDED))
        entry = _Entry(Fate.DEAD_LETTERED) if to_tier is None else _Entry(Fate.SENT, to_tier, offset)
        return self._put(chain, offset, entry, pending=True)

    def forwarded(self, chain: ChainKey, offset: int, *, after: int, to_tier: int) -> list[KeyStateRecord]:
        """The follower at `offset`, waiting behind `after`, was produced to `to_tier` (on `Step.FORWARD`);
        `acked` settles it."""
        behind = self._known[chain].entries[after]
        entry = _Entry(Fate.SENT, to_tier, offset, fallback=(behind.fate, behind.to_tier, behind.after))
        return self._put(chain, offset, entry, pending=True)

    def dead_lettered(self, chain: ChainKey, offset: int) -> list[KeyStateRecord]:
        """The follower at `offset` was produced to the DLQ unhandled (`Step.DEAD_LETTER` or `Step.UNPROVEN`);
        `acked` settles it. The records behind it are dead-lettered too under `dead_letter`, released under
        `release`."""
        return self._put(chain, offset, _Entry(Fate.DEAD_LETTERED), pending=True)

    def acked(self, chain: ChainKey, offset: int, *, landed: int | None) -> list[KeyStateRecord]:
        """The hop of `offset` was acknowledged in tier `landed`, or in the DLQ (None: routed there, or refused
        by its tier as too large). Returns the records to write."""
        known = self._known.get(chain)
        entry = None if known is None or known.pending != offset else known.entries.get(offset)
        if known is None or entry is None:
            return []
        known.pending = None
        if landed is not None:
            entry.to_tier = landed
        elif entry.fallback is None:  # a handled record (or a follower dead-lettered unhandled) is in the DLQ
            entry.fate, entry.to_tier, entry.after = Fate.DEAD_LETTERED, None, None
        else:  # a follower dropped on its way: the next one waits where it would have waited
            entry.fate, entry.to_tier, entry.after = entry.fallback
        entry.fallback = None
        return self._put(chain, offset, entry)

    def _put(self, chain: ChainKey, offset: int, entry: _Entry, *, pending: bool = False) -> list[KeyStateRecord]:
        """Remember `entry` for `offset`; a final one returns its passage to write, and, when terminal, the
        tombstones of the passages below it (no follower can need them)."""
        known = self._known.get(chain)
        if known is None:
            known = self._known[chain] = _Known()
        self._known.move_to_end(chain)
        self._entries += offset not in known.entries
        known.entries[offset] = entry
        if pending:
            known.pending = offset
            return self._bound()
        out: list[KeyStateRecord] = [self._passage(chain, offset, entry)]
        if entry.fate is not Fate.SENT and offset > known.floor:
            known.floor = offset
            for below in [o for o in known.entries if o < offset]:
                del known.entries[below]
                self._entries -= 1
                out.append(Closed(chain=chain, tier=self.tier, seen=below))
        return out + self._bound()

    def _bound(self) -> list[KeyStateRecord]:
        """Past `max_tracked_records` records remembered, forget the least recently used idle chain (a late
        follower of it is then unproven, never handled out of order); returns the tombstones of its passages."""
        out: list[KeyStateRecord] = []
        while self._entries > self.config.max_tracked_records:
            idle = next((c for c, k in self._known.items() if k.pending is None), None)
            if idle is None:
                break
            known = self._known.pop(idle)
            self._entries -= len(known.entries)
            out += [Closed(chain=idle, tier=self.tier, seen=seen) for seen in known.entries]
        return out

    def _passage(self, chain: ChainKey, offset: int, entry: _Entry) -> Passage:
        sent = entry.fate is Fate.SENT
        return Passage(
            tier=self.tier,
            chain=chain,
            seen=offset,
            fate=entry.fate,
            to_tier=entry.to_tier if sent else None,
            after=entry.after if sent else None,
        )
