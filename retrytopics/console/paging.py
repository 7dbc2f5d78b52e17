"""Newest-first pages of a topic, read backwards in bounded blocks, with a filter and a scan budget.

Pure over one I/O callback, `read_block(partition, start, end) -> entries of [start, end) in offset order`,
so a page of a DLQ of a million records holds at most one block per partition in memory, and a filter that
matches nothing stops at `scan_limit` records with a cursor to go on from (the page says so)::

    page = read_page(bounds={0: (0, 1_000_000)}, cursor=Cursor(), keep=DlqFilter().matches, size=50,
                     read_block=reader)

Across partitions, records come newest first by timestamp; within a partition, by offset (a partition's
timestamps need not grow with its offsets, so the order across partitions is best effort).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from retrytopics.console.entries import Entry
from retrytopics.console.filters import Cursor

__all__ = ["BlockReader", "Page", "read_page"]

BlockReader = Callable[[int, int, int], list[Entry]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """The matching entries of one page; `next` is None at the end of the topic."""

    entries: list[Entry]
    next: Cursor | None
    scanned: int
    #: the scan budget ran out before the page filled up: `next` goes on where the scan stopped
    budget_spent: bool


def _newest_first(
    partition: int, low: int, upper: int, read_block: BlockReader, block: int, older_than_wanted: Callable[[int], bool]
) -> Iterator[Entry]:
    end = upper
    while end > low:
        start = max(low, end - block)
        entries = read_block(partition, start, end)
        yield from reversed(entries)
        # a whole block older than the time range: what lies below it is older still (best effort, as above)
        if entries and all(older_than_wanted(e.timestamp_ms) for e in entries):
            return
        end = start


def read_page(
    *,
    bounds: Mapping[int, tuple[int, int]],
    cursor: Cursor,
    keep: Callable[[Entry], bool],
    size: int,
    read_block: BlockReader,
    block: int = 500,
    scan_limit: int = 50_000,
    since_ms: int | None = None,
) -> Page:
    """Up to `size` entries that `keep` accepts, newest first, below `cursor`. `bounds`: partition → (low,
    high) watermarks. Records older than `since_ms` end a partition's scan early."""

    def older(timestamp_ms: int) -> bool:
        return since_ms is not None and timestamp_ms < since_ms

    streams = [
        _newest_first(p, low, min(high, cursor.before.get(p, high)), read_block, block, older)
        for p, (low, high) in sorted(bounds.items())
    ]
    merged = heapq.merge(*streams, key=lambda e: (-e.timestamp_ms, e.partition, -e.offset))
    position = {p: min(high, cursor.before.get(p, high)) for p, (_, high) in bounds.items()}
    found: list[Entry] = []
    scanned = 0
    for entry in merged:
        scanned += 1
        position[entry.partition] = entry.offset
        if keep(entry):
            found.append(entry)
            if len(found) == size:
                break
        if scanned >= scan_limit:
            return Page(entries=found, next=Cursor(position), scanned=scanned, budget_spent=True)
    else:  # every partition read to its start
        return Page(entries=found, next=None, scanned=scanned, budget_spent=False)
    more = any(position[p] > low for p, (low, _) in bounds.items())
    return Page(entries=found, next=Cursor(position) if more else None, scanned=scanned, budget_spent=False)
