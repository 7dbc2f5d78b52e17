"""Successful handler calls counted per partition over one poll batch: the loop emits one
`records.handled` event per partition at the batch end instead of one event per record (issue 13: events
aggregated per batch keep the success path lean; `record.handled` still goes to hooks that ask for it)."""

from __future__ import annotations

from collections.abc import Callable

from retrytopics.core.offsets import TopicPartition
from retrytopics.observe.events import Event

__all__ = ["HandledTally"]


class _Entry:
    __slots__ = ("count", "first", "last", "lateness_ms")

    def __init__(self, offset: int) -> None:
        self.count = 0
        self.first = self.last = offset
        self.lateness_ms: list[int] = []


class HandledTally:
    """Counts, first and last offsets, and the lateness of retried records, per partition."""

    def __init__(self) -> None:
        self._entries: dict[TopicPartition, _Entry] = {}

    def add(self, tp: TopicPartition, offset: int, lateness_ms: int | None) -> None:
        entry = self._entries.get(tp)
        if entry is None:
            entry = self._entries[tp] = _Entry(offset)
        entry.count += 1
        entry.last = offset
        if lateness_ms is not None:
            entry.lateness_ms.append(lateness_ms)

    def add_run(self, tp: TopicPartition, first: int, last: int, count: int, lateness_ms: list[int]) -> None:
        """`add` for `count` records of `tp` from `first` to `last` at once (a batch handler's call)."""
        entry = self._entries.get(tp)
        if entry is None:
            entry = self._entries[tp] = _Entry(first)
        entry.count += count
        entry.last = last
        entry.lateness_ms.extend(lateness_ms)

    def flush(self, emit: Callable[..., None]) -> None:
        """Emit one `RECORDS_HANDLED` per partition counted since the last flush, and start again."""
        entries, self._entries = self._entries, {}
        for (topic, partition), e in entries.items():
            emit(
                Event.RECORDS_HANDLED,
                topic=topic,
                partition=partition,
                count=e.count,
                first_offset=e.first,
                last_offset=e.last,
                lateness_ms=tuple(e.lateness_ms),
            )
