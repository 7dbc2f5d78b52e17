"""Reading a consumed record's headers when a header key is not UTF-8.

Kafka header keys are bytes on the wire, and any producer speaking the protocol can write `b"\\xff\\xfe"`
(confluent-kafka's own producer cannot: it writes the key's `str()`). confluent-kafka's `Message.headers()`
decodes every key as strict UTF-8 and, on such a key, raises `SystemError` (its C code returns a list with
an exception set). Unhandled, that crashed every consumer and tool reading the record, on every restart.

A second call returns the list confluent-kafka cached, in which the bad key is a NULL pointer inside its
tuple: reading that item would crash the interpreter. :func:`read_headers` never touches it. It asks the
garbage collector for the tuple's members (`gc.get_referents` visits only non-NULL ones), so a header whose
key is missing is recognised without being read. Such a header keeps its value and its place, with its key
decoded as Java and Spark decode keys (invalid bytes become U+FFFD); the raw key bytes are known for the
first bad key only (they travel in the `UnicodeDecodeError`; later bad keys read as a single U+FFFD) and are
kept, escaped and bounded, in the :class:`UndecodableHeaderError` that the runtime dead-letters the record
with (reason `poison`).
"""

from __future__ import annotations

import gc
from typing import Any, Final

from retrytopics.core.headers import Header

__all__ = ["UndecodableHeaderError", "drop_pending_error", "headers_after_error", "listed_headers", "read_headers"]

_REPLACEMENT: Final = "\ufffd"
_EXCERPT_BYTES: Final = 64
_POSITIONS_SHOWN: Final = 8


class UndecodableHeaderError(ValueError):
    """A record has header keys that are not UTF-8. `raw_key` is the first bad key's bytes (None if unknown)."""

    def __init__(self, positions: list[int], total: int, raw_key: bytes | None) -> None:
        self.positions = positions
        self.raw_key = raw_key
        shown = "unknown bytes" if raw_key is None else repr(_excerpt(raw_key))
        where = ", ".join(map(str, positions[:_POSITIONS_SHOWN])) or "?"
        if len(positions) > _POSITIONS_SHOWN:
            where += f", … ({len(positions)} in all)"
        super().__init__(
            f"header key {shown} is not UTF-8 (header {where} of {total}; kept with invalid bytes as U+FFFD)"
        )


def _excerpt(raw: bytes) -> bytes:
    return raw if len(raw) <= _EXCERPT_BYTES else raw[:_EXCERPT_BYTES] + b"..."


def read_headers(message: Any) -> tuple[list[Header], UndecodableHeaderError | None]:
    """The headers of a confluent-kafka message, and the error describing undecodable keys (else None).

    Call it once per message. confluent-kafka may also return its cached list, NULL keys included, without
    an error (seen in a reused Spark worker): such a list is salvaged as well, never iterated."""
    try:
        found = message.headers()
    except (SystemError, UnicodeDecodeError) as exc:
        return headers_after_error(message, exc)
    return listed_headers(message, found)


def listed_headers(message: Any, found: Any) -> tuple[list[Header], UndecodableHeaderError | None]:
    """What `read_headers` returns, given what `message.headers()` just returned (`found`). For hot paths
    that call `headers()` themselves (and need nothing of this for a record without headers)."""
    try:
        # gc's calls are checked calls into C: a decode error headers() left pending is raised here
        null = bool(found) and _holds_null(found)
    except (SystemError, UnicodeDecodeError) as exc:
        return headers_after_error(message, exc)
    if not found:
        return [], None
    if null:
        return _salvage(found, None)
    return list(found), None


def _holds_null(cached: Any) -> bool:
    # gc.get_referents skips NULL slots: fewer referents than items means a slot (or a key) is NULL
    if not isinstance(cached, list) or len(gc.get_referents(cached)) != len(cached):
        return True
    return any(len(gc.get_referents(item)) != 2 for item in cached)


def drop_pending_error() -> None:
    """Clear a decode error that confluent-kafka's `headers()` left pending (the next checked call into C
    would raise it as SystemError somewhere unrelated)."""
    try:
        gc.get_referents()
    except SystemError:
        pass


def headers_after_error(message: Any, exc: Exception) -> tuple[list[Header], UndecodableHeaderError]:
    """What `read_headers` returns once `message.headers()` (or a check of what it returned) has raised `exc`
    (re-raised unless it is the undecodable-key failure). For hot paths that call `headers()` themselves."""
    cause = _first_decode_error(exc)
    if cause is None:
        raise exc
    raw_key = cause.object if isinstance(cause.object, bytes) else None
    salvaged = _salvage(message.headers(), raw_key)
    drop_pending_error()  # the salvage's own headers() call may leave it pending again
    return salvaged


def _first_decode_error(exc: BaseException) -> UnicodeDecodeError | None:
    """The first bad key's error: each later one failed while it was still set, so each is a SystemError
    whose cause is the error before it, and the first is at the end of the chain (one link per bad key)."""
    found: UnicodeDecodeError | None = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UnicodeDecodeError):
            found = current
        current = current.__cause__ or current.__context__
    return found


def _salvage(cached: Any, raw_key: bytes | None) -> tuple[list[Header], UndecodableHeaderError]:
    if not isinstance(cached, list) or len(gc.get_referents(cached)) != len(cached):
        return [], UndecodableHeaderError([], 0, raw_key)  # a slot is NULL too: nothing is safe to read
    headers: list[Header] = []
    bad: list[int] = []
    for position, item in enumerate(cached, start=1):
        members = gc.get_referents(item)  # safe: never reads a NULL member
        if len(members) == 2:
            headers.append((item[0], item[1]))
            continue
        value = members[0] if len(members) == 1 and isinstance(members[0], bytes | None) else None
        headers.append((_REPLACEMENT, value))
        bad.append(position)
    if bad and raw_key is not None:  # the bytes known are the first bad key's
        headers[bad[0] - 1] = (raw_key.decode("utf-8", "replace"), headers[bad[0] - 1][1])
    return headers, UndecodableHeaderError(bad, len(cached), raw_key)
