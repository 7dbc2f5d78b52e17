"""The DLQ browser's filters and its paging cursor, read from a URL's query string (untrusted input).

Pure. A filter keeps an :class:`~retrytopics.console.entries.Entry` when every given criterion holds::

    DlqFilter.from_query({"reason": ["timeout"], "header": ["trace-id=abc"]}).matches(entry)

Criteria: DLQ reason and exception type (any of the listed values), the DLQ record's time in
`[since, until)`, the key (its text, exactly), the origin message id, and one header `name=value` (any header,
`retry.*` ones included, exactly). A bad value is a `ConfigError` naming the query parameter, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from retrytopics.console.entries import Entry, header_text
from retrytopics.core.errors import ConfigError
from retrytopics.operator.config import parse_instant

__all__ = ["PARAMETERS", "Cursor", "DlqFilter"]

#: The query parameters a filter reads (anything else in the query string is not the filter's).
PARAMETERS: Final = ("reason", "exception_type", "since", "until", "key", "origin_id", "header")
_TEXT_LIMIT: Final = 1024
_MAX_CHOICES: Final = 32
_MAX_PARTITIONS: Final = 100_000


def _texts(query: Mapping[str, Sequence[str]], name: str) -> list[str]:
    values = [v.strip() for v in query.get(name, ()) if v.strip()]
    if len(values) > _MAX_CHOICES:
        raise ConfigError(name, len(values), f"at most {_MAX_CHOICES} values")
    for value in values:
        if len(value) > _TEXT_LIMIT:
            raise ConfigError(name, value[:64] + "...", f"longer than {_TEXT_LIMIT} characters")
    return values


def _one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = _texts(query, name)
    if len(values) > 1:
        raise ConfigError(name, values[:2], "give it once")
    return values[0] if values else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DlqFilter:
    """What the DLQ browser shows; an empty filter keeps every record."""

    reasons: frozenset[str] = frozenset()
    exception_types: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    key: str | None = None
    origin_id: str | None = None
    header: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.since_ms is not None and self.until_ms is not None and self.since_ms >= self.until_ms:
            raise ConfigError("until", self.until_ms, "must be later than since")

    @classmethod
    def from_query(cls, query: Mapping[str, Sequence[str]]) -> DlqFilter:
        """The filter a query string asks for (`query`: parameter → every value given)."""
        since, until = _one(query, "since"), _one(query, "until")
        header = _one(query, "header")
        pair: tuple[str, str] | None = None
        if header is not None:
            name, equals, value = header.partition("=")
            if not equals or not name.strip():
                raise ConfigError("header", header, "expected NAME=VALUE, e.g. trace-id=abc")
            pair = (name.strip(), value.strip())
        return cls(
            reasons=frozenset(_texts(query, "reason")),
            exception_types=frozenset(_texts(query, "exception_type")),
            since_ms=None if since is None else parse_instant(since, field="since"),
            until_ms=None if until is None else parse_instant(until, field="until"),
            key=_one(query, "key"),
            origin_id=_one(query, "origin_id"),
            header=pair,
        )

    @property
    def empty(self) -> bool:
        return self == DlqFilter()

    def matches(self, entry: Entry) -> bool:
        retry = entry.retry
        if self.reasons and (retry is None or retry.dlq_reason is None or retry.dlq_reason.value not in self.reasons):
            return False
        if self.exception_types and (retry is None or retry.exception_type not in self.exception_types):
            return False
        if self.since_ms is not None and entry.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and entry.timestamp_ms >= self.until_ms:
            return False
        if self.key is not None and (entry.key is None or entry.key.decode("utf-8", "replace") != self.key):
            return False
        if self.origin_id is not None and (retry is None or retry.origin_message_id != self.origin_id):
            return False
        return self.header is None or self.header[1] in header_text(entry, self.header[0])

    def query(self) -> list[tuple[str, str]]:
        """The filter as query parameters (for links to the next page; times as epoch ms)."""
        pairs = [("reason", r) for r in sorted(self.reasons)]
        pairs += [("exception_type", t) for t in sorted(self.exception_types)]
        for name, value in (
            ("since", self.since_ms),
            ("until", self.until_ms),
            ("key", self.key),
            ("origin_id", self.origin_id),
        ):
            if value is not None:
                pairs.append((name, str(value)))
        if self.header is not None:
            pairs.append(("header", f"{self.header[0]}={self.header[1]}"))
        return pairs


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: per partition, the offset below which it reads (exclusive). A partition
    not named starts at its end (newest record)."""

    before: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """`"0:120,1:98"` → before offset 120 of partition 0 and 98 of partition 1."""
        if not text:
            return cls({})
        before: dict[int, int] = {}
        for part in text.split(","):
            partition, colon, offset = part.partition(":")
            digits = partition.isascii() and offset.isascii()  # `isdigit` alone takes superscripts `int` refuses
            if (
                not (colon and digits and partition.isdigit() and offset.isdigit())
                or len(partition) > 6
                or len(offset) > 19
            ):
                raise ConfigError("after", text[:64], "expected PARTITION:OFFSET,... as the page links give it")
            if int(partition) >= _MAX_PARTITIONS or int(partition) in before:
                raise ConfigError("after", text[:64], "a partition out of range or named twice")
            before[int(partition)] = int(offset)
        return cls(before)

    def text(self) -> str:
        return ",".join(f"{p}:{o}" for p, o in sorted(self.before.items()))
