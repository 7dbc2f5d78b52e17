"""How key order names what it orders: a record key by its `key_id`, one ordered sequence by its `ChainKey`."""

from __future__ import annotations

import hashlib
from typing import Final, NamedTuple

__all__ = ["ChainKey", "key_id"]


_SHORT_KEY: Final = 32


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
