"""Signed retry headers: an HMAC-SHA256 over what the framework writes, so that a principal with WRITE on a
tier or the DLQ cannot forge retry state, move a record to another topic, or mark one as handed off.

Pure: standard library only. Optional (``RetryApp(header_key=...)``); without keys nothing is signed or
checked, exactly as before. See docs/headers.md (*Trust*) for the threat model::

    keys = HeaderKeys.of([new_key, old_key])      # each >= 32 bytes; the first signs, any verifies
    headers = sign(keys, "orders.retry.5s", key, value, headers)    # appends retry.signature
    verify(keys, "orders.retry.5s", key, value, headers)            # None, or why it does not verify

The signed message is unambiguous: a domain tag naming the version, then length-prefixed fields (the
destination topic, the record key, the SHA-256 of the value, and every header but the signature, user
headers included, in the order they are on the record, duplicates kept), each field tagged as null or bytes,
so no two different records encode alike. A user header (``tenant``, ``role``) is as much a record's
meaning as its value: changing, adding, dropping or reordering one fails verification.

Key-state records (docs/key-ordering.md, section 5) are signed too (`sign_state`, `verify_state`), with a
domain of their own: a ``retry.signature`` header over the key-state topic, the record key and the SHA-256
of the value, or the null tag for a tombstone (a tombstone has no value, so the tag is what says "delete").

Version 1 signed only the ``retry.*`` headers (sorted). Its signatures are recognised and refused with a
reason that says so, unless the keys were built with ``accept_v1=True``: for an upgrade's window only,
since a v1 record's user headers can be rewritten without breaking its signature (docs/headers.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from retrytopics.core.errors import ConfigError

__all__ = [
    "MIN_KEY_BYTES",
    "SIGNATURE",
    "HeaderKeys",
    "KeyLike",
    "mark_keys",
    "mark_verifies",
    "replay_mark",
    "sign",
    "sign_guard",
    "sign_state",
    "signed_message",
    "started_mark_keys",
    "verify",
    "verify_guard",
    "verify_state",
]

#: The header carrying the signature: 64 lowercase hex digits. Under ``retry.``, so each hop replaces it.
SIGNATURE: Final = "retry.signature"
#: The shortest key accepted (HMAC-SHA256's block-size guidance: a key shorter than the hash is weak).
MIN_KEY_BYTES: Final = 32
_DOMAIN: Final = b"retrytopics/retry.signature/v2"
_DOMAIN_V1: Final = b"retrytopics/retry.signature/v1"
_PREFIX: Final = "retry."
_NULL: Final = b"\x00"

KeyLike = str | bytes | Sequence[str | bytes]


@dataclass(frozen=True, slots=True)
class HeaderKeys:
    """The HMAC keys of one app: ``keys[0]`` signs, every key verifies (rotation). Never shown in a repr.
    ``accept_v1``: also accept signatures of version 1, which did not cover user headers (an upgrade's
    window: see the module docstring)."""

    keys: tuple[bytes, ...] = field(repr=False)
    accept_v1: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("header_key", "[hidden]", "expected at least one key")

    @classmethod
    def of(cls, value: KeyLike | HeaderKeys, *, field: str = "header_key", accept_v1: bool = False) -> HeaderKeys:
        """Keys from a str/bytes key or a list of them (the first signs); a key under 32 bytes is a
        `ConfigError` naming `field` (the key itself never appears in the error)."""
        if isinstance(value, HeaderKeys):
            return value if not accept_v1 else cls(value.keys, accept_v1=True)
        items = [value] if isinstance(value, str | bytes) else value
        if not isinstance(items, list | tuple) or not items:
            raise ConfigError(field, "[hidden]", "expected a key (str or bytes) or a non-empty list of keys")
        keys: list[bytes] = []
        for i, item in enumerate(items):
            name = field if len(items) == 1 else f"{field}[{i}]"
            if not isinstance(item, str | bytes):
                raise ConfigError(name, f"<{type(item).__name__}>", "expected a key as str or bytes")
            raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            if len(raw) < MIN_KEY_BYTES:
                raise ConfigError(name, "[hidden]", f"a key must be at least {MIN_KEY_BYTES} bytes, got {len(raw)}")
            keys.append(raw)
        return cls(tuple(keys), accept_v1=accept_v1)

    def __repr__(self) -> str:
        return f"HeaderKeys(<{len(self.keys)} hidden>{', accept_v1=True' if self.accept_v1 else ''})"


def _field(data: bytes | None) -> bytes:
    if data is None:
        return _NULL
    return b"\x01" + len(data).to_bytes(4, "big") + data


def signed_message(topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]) -> bytes:
    """The bytes the signature covers (see the module docstring); header values may be bytes or None."""
    covered = [(name, data) for name, data in headers if name != SIGNATURE]
    return _message(_DOMAIN, topic, key, value, covered)


def _signed_message_v1(
    topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]
) -> bytes:
    """Version 1: the ``retry.*`` headers only, sorted by name then value."""
    retry = sorted(
        ((name, data) for name, data in headers if name.startswith(_PREFIX) and name != SIGNATURE),
        key=lambda item: (_name(item[0]), _bytes(item[1]) is not None, _bytes(item[1]) or b""),
    )
    return _message(_DOMAIN_V1, topic, key, value, retry)


def _message(
    domain: bytes, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]
) -> bytes:
    digest = None if value is None else hashlib.sha256(value).digest()
    parts = [domain, _field(topic.encode("utf-8")), _field(key), _field(digest), len(headers).to_bytes(4, "big")]
    for name, data in headers:
        parts += (_field(_name(name)), _field(_bytes(data)))
    return b"".join(parts)


def _name(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def _bytes(data: object) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):  # Spark hands binary columns over as bytearray
        return bytes(data)
    return str(data).encode("utf-8", "surrogatepass")  # total on odd input; the wire only carries bytes


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def sign(
    keys: HeaderKeys, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> tuple[tuple[str, bytes | None], ...]:
    """``headers`` without any earlier signature, then ``retry.signature`` for a record on ``topic``."""
    kept = tuple(h for h in headers if h[0] != SIGNATURE)
    mac = _mac(keys.keys[0], signed_message(topic, key, value, kept))
    return (*kept, (SIGNATURE, mac.hex().encode("ascii")))


def verify(
    keys: HeaderKeys, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]
) -> str | None:
    """None when exactly one ``retry.signature`` verifies with one of ``keys`` for this record on ``topic``;
    otherwise why not (missing, repeated, malformed, or wrong)."""
    expected_mac = _given_mac(headers, "this consumer requires signed retry headers (header_key is configured)")
    if isinstance(expected_mac, str):
        return expected_mac
    if _verifies(keys, signed_message(topic, key, value, headers), expected_mac):
        return None
    if _verifies(keys, _signed_message_v1(topic, key, value, headers), expected_mac):
        if keys.accept_v1:
            return None
        return (
            "version 1: an earlier release's signature, which does not cover user headers; refused "
            "unless the keys accept version 1"
        )
    return "wrong: does not verify with any configured key (forged, altered, or moved from another topic)"


def _given_mac(headers: Sequence[tuple[str, object]], required: str) -> bytes | str:
    """The one ``retry.signature`` of `headers` as bytes, or why there is none to check."""
    found = [data for name, data in headers if name == SIGNATURE]
    if not found:
        return f"missing: {required}"
    if len(found) > 1:
        return "repeated retry.signature header"
    given = found[0]
    if not isinstance(given, bytes | bytearray) or len(given) != 64:
        return "malformed: expected 64 hex digits"
    try:
        return bytes.fromhex(bytes(given).decode("ascii"))
    except ValueError:
        return "malformed: expected 64 hex digits"


_STATE_DOMAIN: Final = b"retrytopics/key_state/v1"


def sign_state(keys: HeaderKeys, topic: str, key: bytes, value: bytes | None) -> tuple[str, bytes]:
    """The ``retry.signature`` header of the key-state record `key` -> `value` (None: a tombstone) on `topic`."""
    return SIGNATURE, _mac(keys.keys[0], _message(_STATE_DOMAIN, topic, key, value, ())).hex().encode("ascii")


def verify_state(
    keys: HeaderKeys, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]
) -> str | None:
    """None when exactly one ``retry.signature`` of a key-state record read from `topic` verifies with one of
    `keys` (its other headers, which the writers never set, are not covered); otherwise why not."""
    expected_mac = _given_mac(headers, "key-state records are signed when header_key is configured")
    if isinstance(expected_mac, str):
        return expected_mac
    if _verifies(keys, _message(_STATE_DOMAIN, topic, key, value, ()), expected_mac):
        return None
    return "wrong: does not verify with any configured key (forged, altered, or moved from another topic)"


_GUARD_DOMAIN: Final = b"retrytopics/flood_guard/v1"


def sign_guard(keys: HeaderKeys, topic: str, key: bytes, value: bytes | None) -> tuple[str, bytes]:
    """The ``retry.signature`` header of the flood-guard record `key` -> `value` (None: a tombstone) on `topic`
    (a guard's report or an operator's command: core/flood_records.py)."""
    return SIGNATURE, _mac(keys.keys[0], _message(_GUARD_DOMAIN, topic, key, value, ())).hex().encode("ascii")


def verify_guard(
    keys: HeaderKeys, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, object]]
) -> str | None:
    """None when exactly one ``retry.signature`` of a flood-guard record read from `topic` verifies with one of
    `keys`; otherwise why not. Its own domain: a signed key-state record or retry header cannot pass for one."""
    expected_mac = _given_mac(headers, "flood-guard records are signed when header_key is configured")
    if isinstance(expected_mac, str):
        return expected_mac
    if _verifies(keys, _message(_GUARD_DOMAIN, topic, key, value, ()), expected_mac):
        return None
    return "wrong: does not verify with any configured key (forged, altered, or moved from another topic)"


def _verifies(keys: HeaderKeys, message: bytes, expected_mac: bytes) -> bool:
    return any(hmac.compare_digest(_mac(candidate, message), expected_mac) for candidate in keys.keys)


_MARK_DOMAIN: Final = b"retrytopics/retry.replay_mark/v1"


def mark_keys(nonce: bytes, keys: HeaderKeys | None) -> tuple[bytes, ...]:
    """The keys of one replay id's marks (the first makes them, every one checks): the run's random `nonce`
    (kept in the replay ledger) itself, or with header keys one key per header key derived from the nonce,
    so that reading the ledger is not enough to make a mark."""
    if keys is None:
        return (nonce,)
    return tuple(_mac(key, _MARK_DOMAIN + nonce) for key in keys.keys)


def started_mark_keys(started: Mapping[str, object], keys: HeaderKeys | None) -> tuple[bytes, ...] | None:
    """The mark keys of a replay id from its first `started` ledger entry (`mark_keys` of its hex nonce);
    None for an entry without a nonce (written by a release before marks), whose markers a rerun trusts as
    they are. With header keys such an entry is a `ConfigError` naming the replay id: anyone with WRITE on the
    ledger can plant one, and the keys are what a rerun's trust rests on (rerun under a new replay id)."""
    nonce = started.get("nonce")
    if nonce is None:
        if keys is not None:
            raise ConfigError(
                "replay_id",
                started.get("replay_id"),
                "its started ledger entry has no nonce, so "
                "its markers cannot be checked with the header keys; replay under a new replay id",
            )
        return None
    try:
        return mark_keys(bytes.fromhex(str(nonce)), keys)
    except ValueError:
        raise ConfigError("replay_id", started.get("replay_id"), "its ledger entry has a malformed nonce") from None


def replay_mark(key: bytes, replay_id: str, topic: str, source_record: str) -> str:
    """`retry.replay_mark`: 64 hex digits that attribute a record on `topic` to the replay `replay_id`
    writing the source record `source_record` (`<topic>-<partition>-<offset>`); see spark/ledger.py."""
    parts = [
        _MARK_DOMAIN,
        *(_field(text.encode("utf-8", "surrogatepass")) for text in (replay_id, topic, source_record)),
    ]
    return _mac(key, b"".join(parts)).hex()


def mark_verifies(keys: Sequence[bytes], replay_id: str, topic: str, source_record: str, given: bytes | None) -> bool:
    """Whether `given` (a `retry.replay_mark` as read) is the mark of one of `keys` for this record."""
    return given is not None and any(
        hmac.compare_digest(replay_mark(key, replay_id, topic, source_record).encode(), given) for key in keys
    )
