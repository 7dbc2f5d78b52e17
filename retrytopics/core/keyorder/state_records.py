"""The records of the compacted key-state topic (docs/key-ordering.md, section 5) and their wire form: what a main
consumer writes of its open chains (`Chain`) and of the followers it keeps in the source (`Waiting`), what a tier
consumer writes of a record's passage (`Passage`), the tombstones (`Closed`); `encode_record` / `encode_signed`
write them, `decode_record` reads untrusted bytes back (every version written so far).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias

from retrytopics.core.errors import ConfigError, KeyStateDecodeError
from retrytopics.core.headers import (
    Header,
)
from retrytopics.core.keyorder.bounds import INT32_MAX, INT64_MAX, excerpt
from retrytopics.core.keyorder.keys import ChainKey
from retrytopics.core.signing import HeaderKeys, sign_state

__all__ = [
    "Chain",
    "Closed",
    "Fate",
    "KeyStateRecord",
    "Passage",
    "Waiting",
    "decode_record",
    "encode_record",
    "encode_signed",
]


#: A key-state record's key and value are never longer than this (a source topic name, a partition, a key id).
_MAX_STATE_BYTES: Final = 512
_MAX_TIER: Final = 99  # as `retry.tier`


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
    only. `settled`: the frontier is a follower that this owner released from the source and settled itself
    (handled, or dead-lettered), so no tier's passage will say so (written as version 2; a version 1 record has
    none)."""

    chain: ChainKey
    head: int
    frontier: int
    at_tier: int
    followers: int
    since_ms: int
    settled: Fate | None = None

    def __post_init__(self) -> None:
        if self.settled is Fate.SENT:
            raise ConfigError("settled", self.settled, "a settled frontier succeeded or was dead-lettered")


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """A follower the main consumer keeps in the source (docs/key-ordering.md, section 4): the record at source
    `offset` of `chain`, committed past unhandled, to be read again from the source when every earlier record
    of its key is terminal. Written by the owner of the source partition before its commit passes `offset`;
    tombstoned once the follower is released and settled or in a tier."""

    chain: ChainKey
    offset: int
    since_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Closed:
    """A tombstone: the main consumer's chain is closed (`tier`, `seen` and `waiting` None), tier `tier` no
    longer needs its passage of `seen`, or the follower kept in the source at `waiting` is no longer waiting."""

    chain: ChainKey
    tier: int | None = None
    seen: int | None = None
    waiting: int | None = None

    def __post_init__(self) -> None:
        if (self.tier is None) != (self.seen is None):
            raise ConfigError("seen", self.seen, "a passage's tombstone names its tier and offset, a chain's neither")
        if self.waiting is not None and self.tier is not None:
            raise ConfigError("waiting", self.waiting, "a tombstone is of a passage or of a waiting follower")

    @property
    def closes_chain(self) -> bool:
        """Whether this is the tombstone of the main consumer's chain record."""
        return self.tier is None and self.waiting is None


KeyStateRecord: TypeAlias = Chain | Passage | Waiting | Closed


def _record_key(chain: ChainKey, tier: int | None, seen: int | None, *, waiting: int | None = None) -> bytes:
    where = f"{chain.source_topic}/{chain.source_partition}/{chain.key.hex()}"
    if waiting is not None:
        return f"wait/{where}/{waiting}".encode()
    return f"chain/{where}".encode() if tier is None else f"tier{tier}/{where}/{seen}".encode()


def encode_record(record: KeyStateRecord) -> tuple[bytes, bytes | None, int]:
    """The Kafka key, value (None: a tombstone) and partition (the source partition: everything about one
    chain is in one partition, in the order it was written) of a key-state record."""
    if isinstance(record, Closed):
        key = _record_key(record.chain, record.tier, record.seen, waiting=record.waiting)
        return key, None, record.chain.source_partition
    value: dict[str, object]
    if isinstance(record, Chain):
        key = _record_key(record.chain, None, None)
        value = {
            "v": 1 if record.settled is None else 2,
            "head": record.head,
            "frontier": record.frontier,
            "at": record.at_tier,
            "followers": record.followers,
            "since": record.since_ms,
        }
        if record.settled is not None:
            value["settled"] = record.settled.value
    elif isinstance(record, Waiting):
        key = _record_key(record.chain, None, None, waiting=record.offset)
        value = {"v": 1, "since": record.since_ms}
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
    r"(?:chain|wait|tier(0|[1-9][0-9]?))/([a-zA-Z0-9._-]{1,249})/(0|[1-9][0-9]{0,9})/((?:[0-9a-f]{2}){1,33})"
    r"(?:/(0|[1-9][0-9]{0,18}))?"
)
_CHAIN_FIELDS: Final = {"v", "head", "frontier", "at", "followers", "since"}


def decode_record(key: bytes | None, value: bytes | None) -> KeyStateRecord:
    """Read a key-state record. Untrusted bytes: total and bounded; any problem raises
    `KeyStateDecodeError` (naming the field, a bounded excerpt and the reason) and nothing else."""
    if not isinstance(key, bytes) or len(key) > _MAX_STATE_BYTES:
        raise KeyStateDecodeError("key", excerpt(key), f"expected at most {_MAX_STATE_BYTES} bytes")
    form = _KEY_FORM.fullmatch(key.decode("ascii", "replace"))
    chain_key = None if form is None else _chain_key(form.group(2), form.group(3), form.group(4))
    is_chain = key.startswith(b"chain/")
    if form is None or chain_key is None or is_chain != (form.group(5) is None):
        raise KeyStateDecodeError(
            "key", excerpt(key), "expected chain/<topic>/<partition>/<key id> or tierN|wait/<...>/<offset>"
        )
    offset = None if is_chain else int(form.group(5))
    if offset is not None and offset > INT64_MAX:
        raise KeyStateDecodeError("key", excerpt(key), "offset out of range")
    if key.startswith(b"wait/"):
        assert offset is not None
        if value is None:
            return Closed(chain=chain_key, waiting=offset)
        fields = _json_object(value, versions=(1,))
        _exact(fields, {"v", "since"})
        return Waiting(chain=chain_key, offset=offset, since_ms=_int(fields, "since", -1, INT64_MAX))
    tier = None if is_chain else int(form.group(1))
    seen = offset
    if value is None:
        return Closed(chain=chain_key, tier=tier, seen=seen)
    if tier is None or seen is None:
        return _chain(chain_key, _json_object(value, versions=(1, 2)))
    fields = _json_object(value, versions=(1,))
    fate_text = fields.get("fate")
    if fate_text not in {f.value for f in Fate}:
        raise KeyStateDecodeError("fate", excerpt(fate_text), f"expected one of {[f.value for f in Fate]}")
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


def _chain(chain_key: ChainKey, fields: dict[str, object]) -> Chain:
    """A chain record, version 1 (no `settled`) or 2 (`settled` names the fate of a frontier its owner settled)."""
    settled: Fate | None = None
    if fields["v"] == 2:
        _exact(fields, _CHAIN_FIELDS | {"settled"})
        text = fields["settled"]
        if text not in (Fate.SUCCEEDED.value, Fate.DEAD_LETTERED.value):
            raise KeyStateDecodeError("settled", excerpt(text), "expected succeeded or dead_lettered")
        settled = Fate(str(text))
    else:
        _exact(fields, _CHAIN_FIELDS)
    head, frontier = _offset(fields, "head"), _offset(fields, "frontier")
    if frontier < head:
        raise KeyStateDecodeError("frontier", frontier, "earlier than head")
    return Chain(
        chain=chain_key,
        head=head,
        frontier=frontier,
        at_tier=_int(fields, "at", 0, _MAX_TIER),
        followers=_int(fields, "followers", 0, INT64_MAX),
        since_ms=_int(fields, "since", -1, INT64_MAX),
        settled=settled,
    )


def _chain_key(topic: str, partition: str, key_hex: str) -> ChainKey | None:
    """The chain a record key names, or None if its partition or key id cannot be one."""
    kid = bytes.fromhex(key_hex)
    if int(partition) > INT32_MAX or kid[0] not in (0, 1) or (kid[0] == 1 and len(kid) != 17) or len(kid) > 33:
        return None
    return ChainKey(topic, int(partition), kid)


def _json_object(value: bytes, *, versions: tuple[int, ...]) -> dict[str, object]:
    if not isinstance(value, bytes) or len(value) > _MAX_STATE_BYTES:
        raise KeyStateDecodeError("value", excerpt(value), f"expected at most {_MAX_STATE_BYTES} bytes")
    try:
        parsed = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise KeyStateDecodeError("value", excerpt(value), "not a JSON object in UTF-8") from None
    if not isinstance(parsed, dict):
        raise KeyStateDecodeError("value", excerpt(value), "not a JSON object")
    version = parsed.get("v")
    if isinstance(version, bool) or version not in versions:
        raise KeyStateDecodeError("v", excerpt(version), f"expected version {' or '.join(map(str, versions))}")
    return parsed


def _exact(fields: dict[str, object], expected: set[str]) -> None:
    if set(fields) != expected:
        raise KeyStateDecodeError("value", sorted(set(fields) ^ expected)[:4], f"expected exactly {sorted(expected)}")


def _int(fields: dict[str, object], name: str, lo: int, hi: int) -> int:
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise KeyStateDecodeError(name, excerpt(value), f"expected an integer in {lo}..{hi}")
    return value


def _offset(fields: dict[str, object], name: str) -> int:
    return _int(fields, name, 0, INT64_MAX)
