"""One DLQ (or tier) record as the console holds it: its coordinates, bounded bytes, and decoded retry state.

Pure: the Kafka reader builds an :class:`Entry` from a consumed record (`entry_of`) and everything after that
(filters, paging, views, replay plans) works on entries. Record bytes are untrusted: the value is kept up to
`VALUE_KEEP_BYTES` (a page of a DLQ of large records stays small), headers are decoded by the header
contract's total decoder, and nothing here renders, evaluates or imports anything a record names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import Header, Lineage, RetryHeaders, decode, decode_lineage

__all__ = ["VALUE_KEEP_BYTES", "Entry", "entry_of", "header_text"]

#: Bytes of a record's value the console keeps in memory (the page says how long the value really was).
VALUE_KEEP_BYTES: Final = 16 * 1024
#: Bytes of a key or header value kept.
_SMALL_KEEP_BYTES: Final = 1024
#: Headers of one record kept, and their bytes in all (a hostile record may carry thousands): the rest is
#: counted in `headers_cut`, and a header filter does not see it.
_KEEP_HEADERS: Final = 128
_KEEP_HEADER_BYTES: Final = 32 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A consumed record, bounded and decoded. `retry` is None when its retry headers do not decode
    (`header_error` says why); `lineage` is read tolerantly from any record."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    value_size: int
    headers: tuple[Header, ...]
    retry: RetryHeaders | None
    lineage: Lineage
    header_error: str | None
    #: headers not kept (see `_KEEP_HEADERS`); 0 for an entry read whole
    headers_cut: int = 0

    @property
    def coordinates(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def origin_id(self) -> str | None:
        return self.retry.origin_message_id if self.retry is not None else None

    @property
    def source_record(self) -> str | None:
        """`<original_topic>-<original_partition>-<original_offset>`: the source record a retry record stands
        for (the replay ledger's `retry.replay_original`)."""
        r = self.retry
        return None if r is None else f"{r.original_topic}-{r.original_partition}-{r.original_offset}"


def _kept(data: bytes | None, limit: int | None) -> bytes | None:
    return data if data is None or limit is None or len(data) <= limit else data[:limit]


def entry_of(
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    unreadable: str | None = None,
    whole: bool = False,
) -> Entry:
    """An :class:`Entry` for one consumed record (`unreadable`: why some header keys could not be read).
    `whole`: keep every byte (a replay republishes the record); otherwise values, keys and headers are cut."""
    retry: RetryHeaders | None = None
    error = unreadable
    try:
        retry = decode(headers)
    except HeaderDecodeError as exc:
        error = str(exc) if error is None else f"{error}; {exc}"
    small, large = (None, None) if whole else (_SMALL_KEEP_BYTES, VALUE_KEEP_BYTES)
    kept = tuple((name, _kept(data, small)) for name, data in (headers if whole else _bounded(headers)))
    return Entry(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key=_kept(key, small),
        value=_kept(value, large),
        value_size=0 if value is None else len(value),
        headers=kept,
        retry=retry,
        lineage=decode_lineage(list(headers)),
        header_error=error,
        headers_cut=len(headers) - len(kept),
    )


def _bounded(headers: Sequence[Header]) -> Sequence[Header]:
    total = 0
    for count, (name, data) in enumerate(headers[:_KEEP_HEADERS]):
        total += len(name) + min(len(data or b""), _SMALL_KEEP_BYTES)
        if total > _KEEP_HEADER_BYTES:
            return headers[:count]
    return headers[:_KEEP_HEADERS]


def header_text(entry: Entry, name: str) -> list[str]:
    """Every value of header `name`, as text (invalid UTF-8 replaced; a null header as the empty string)."""
    return [(data or b"").decode("utf-8", "replace") for key, data in entry.headers if key == name]
