"""The console's Kafka reads: pipeline state (`retrytopics.operator.ops.describe_pipeline`), DLQ pages read backwards
by offset, records by coordinates, one origin id's records, and a background tally of the tiers and DLQ.

Every read is assign()-only (no group joined, nothing committed) and bounded: a page holds at most one block
per partition, a lineage scan keeps only matching records, the tally keeps counters.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.ranges import follow_from_start, partition_bounds, range_reader, read_range
from retrytopics.connectors.record_headers import read_headers
from retrytopics.console.entries import Entry, entry_of
from retrytopics.console.filters import Cursor, DlqFilter
from retrytopics.console.paging import Page, read_page
from retrytopics.console.tally import Tally
from retrytopics.core.errors import ConfigError, HeaderDecodeError
from retrytopics.core.headers import ORIGIN_MESSAGE_ID, REPLAY_ORIGIN_ID, Header, decode
from retrytopics.core.naming import TopicSet
from retrytopics.operator.config import AppSettings
from retrytopics.operator.guard import FloodGuardView, describe_flood_guard
from retrytopics.operator.ops import PartitionState, describe_pipeline

__all__ = ["PipelineReader"]

log = logging.getLogger("retrytopics.console")
_ID_HEADERS = (ORIGIN_MESSAGE_ID, REPLAY_ORIGIN_ID)


def entry_from(message: Any, *, whole: bool = False, read: tuple[list[Header], Any] | None = None) -> Entry:
    """An entry for a consumed message (`read`: its `read_headers` answer, when the caller has it already)."""
    headers, unreadable = read_headers(message) if read is None else read
    return entry_of(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        timestamp_ms=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=headers,
        unreadable=None if unreadable is None else str(unreadable),
        whole=whole,
    )


#: Bytes of whole records one read may hold before they are cut to entries: a read spans as many offsets as
#: the largest record seen so far allows, between 1 and `_MAX_READ_SPAN` (a page; 2,000 for a scan), starting at `_FIRST_READ_SPAN`.
_READ_BYTES = 8 * 1024 * 1024
_FIRST_READ_SPAN = 8
_MAX_READ_SPAN = 128


def _messages(
    consumer: Any, topic: str, partition: int, start: int, end: int, span: list[int], *, most: int = _MAX_READ_SPAN
) -> Iterator[Any]:
    """The records at offsets `[start, end)`, read in spans sized from the records seen (`span`: the current
    span, one element, updated as records are read), so that records of a megabyte are held a few at a time,
    never a block of hundreds whole."""
    while start < end:
        stop = min(end, start + span[0])
        batch = read_range(consumer, topic, partition, start, stop)
        largest = max((len(m.value() or b"") + len(m.key() or b"") for m in batch), default=0)
        span[0] = max(1, min(most, _READ_BYTES // max(largest, 1)))
        while batch:  # handed out one by one, each dropped once the caller has it
            yield batch.pop(0)
        start = stop


#: Offsets one read of `records_at` may span: nearby records are read in one go, far ones apart (a span's
#: records are all held while it is read, whole).
_RUN_SPAN = 100


def _runs(coordinates: Iterable[tuple[int, int]], bounds: dict[int, tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
    """(partition, start, end) ranges covering the existing `coordinates`, each at most `_RUN_SPAN` long."""
    by_partition: dict[int, list[int]] = {}
    for partition, offset in coordinates:
        low, high = bounds.get(partition, (0, 0))
        if low <= offset < high:
            by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in sorted(by_partition.items()):
        offsets.sort()
        start = previous = offsets[0]
        for offset in offsets[1:]:
            if offset - start >= _RUN_SPAN:
                yield partition, start, previous + 1
                start = offset
            previous = offset
        yield partition, start, previous + 1


@dataclass(kw_only=True)
class PipelineReader:
    """Reads one pipeline's topics for the console (thread-safe: each call uses its own consumer)."""

    kafka: KafkaConfig
    pipeline: AppSettings
    topics: TopicSet
    grace_ms: int = 30_000
    tally: Tally = field(default_factory=Tally)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counted: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _cache: tuple[float, list[PartitionState]] | None = None
    _total: tuple[float, int] | None = None
    _guard_cache: tuple[float, FloodGuardView | None] | None = None

    def _reading(self) -> Any:
        return range_reader(self.kafka)

    def partition_states(self, *, max_age_s: float = 1.0) -> list[PartitionState]:
        """`retrytopics topics describe`'s rows, at most `max_age_s` old (several browsers poll at once)."""
        with self._lock:
            cached = self._cache
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        rows = describe_pipeline(self.kafka, self.pipeline, grace_ms=self.grace_ms)
        with self._lock:
            self._cache = (time.monotonic(), rows)
        return rows

    def flood_guard(self, *, max_age_s: float = 1.0) -> FloodGuardView | None:
        """What the handler's flood-guard topic says (`retrytopics topics describe`'s section), at most
        `max_age_s` old; None when the handler has no guard."""
        with self._lock:
            cached = self._guard_cache
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        view = describe_flood_guard(self.kafka, self.pipeline)
        with self._lock:
            self._guard_cache = (time.monotonic(), view)
        return view

    def bounds(self, topic: str) -> dict[int, tuple[int, int]]:
        consumer = self._reading()
        try:
            found = partition_bounds(consumer, topic)
        finally:
            consumer.close()
        if found is None:
            raise ConfigError("app.topic", topic, "topic does not exist; run `retrytopics topics create` first")
        return found

    def dlq_page(self, dlq_filter: DlqFilter, cursor: Cursor, *, size: int = 50, scan_limit: int = 50_000) -> Page:
        """One page of the DLQ, newest first (see `retrytopics.console.paging`)."""
        consumer = self._reading()
        try:
            bounds = partition_bounds(consumer, self.topics.dlq) or {}

            spans = {p: [_FIRST_READ_SPAN] for p in bounds}

            def block(partition: int, start: int, end: int) -> list[Entry]:
                spanned = _messages(consumer, self.topics.dlq, partition, start, end, spans[partition])
                return [entry_from(m) for m in spanned]

            return read_page(
                bounds=bounds,
                cursor=cursor,
                keep=dlq_filter.matches,
                size=size,
                read_block=block,
                scan_limit=scan_limit,
                since_ms=dlq_filter.since_ms,
            )
        finally:
            consumer.close()

    def matching(self, dlq_filter: DlqFilter, *, limit: int) -> tuple[list[tuple[int, int]], bool]:
        """The DLQ coordinates of up to `limit` records matching `dlq_filter`, newest first, and whether more
        match (the whole DLQ is scanned when fewer do: a replay by filter must not miss a match)."""
        found: list[tuple[int, int]] = []
        cursor: Cursor | None = Cursor()
        while cursor is not None and len(found) <= limit:
            page = self.dlq_page(dlq_filter, cursor, size=limit + 1 - len(found), scan_limit=200_000)
            found += [(e.partition, e.offset) for e in page.entries]
            cursor = page.next
        return found[:limit], len(found) > limit

    def records_at(self, topic: str, coordinates: Iterable[tuple[int, int]], *, whole: bool = False) -> list[Entry]:
        """The records at (partition, offset) of `topic` that exist, in the order given."""
        wanted = list(dict.fromkeys(coordinates))
        chosen = set(wanted)
        consumer = self._reading()
        found: dict[tuple[int, int], Entry] = {}
        try:
            bounds = partition_bounds(consumer, topic) or {}
            for partition, start, end in _runs(wanted, bounds):
                for message in read_range(consumer, topic, partition, start, end):
                    where = (partition, message.offset() or 0)
                    if where in chosen:
                        found[where] = entry_from(message, whole=whole)
        finally:
            consumer.close()
        return [found[c] for c in wanted if c in found]

    def lineage(self, origin_id: str, *, limit: int = 500) -> tuple[Entry | None, list[Entry]]:
        """The source record an origin id stands for (when its retry headers name the source topic), and every
        tier, DLQ and replayed record of the id (its own, or naming it as `retry.replay_origin_id`), at most
        `limit` of them. Scans the tiers and the DLQ whole, and the source from the replays' first start."""
        wanted = origin_id.encode("utf-8")

        consumer = self._reading()
        hops: list[Entry] = []
        try:
            starts = self._replay_starts(consumer)
            for topic in (*(tier.topic for tier in self.topics.tiers), self.topics.dlq, self.topics.source):
                for message in self._scan(consumer, topic, starts if topic == self.topics.source else None):
                    read = read_headers(message)
                    # raw header bytes first: most records are skipped undecoded
                    if len(hops) < limit and any(k in _ID_HEADERS and v == wanted for k, v in read[0]):
                        hops.append(entry_from(message, read=read))
            first = next(
                (h.retry for h in hops if h.retry is not None and h.retry.origin_message_id == origin_id), None
            )
            origin = None
            if first is not None and first.original_topic == self.topics.source:
                found = self.records_at(self.topics.source, [(first.original_partition, first.original_offset)])
                origin = found[0] if found else None
            return origin, hops
        finally:
            consumer.close()

    def _scan(self, consumer: Any, topic: str, starts: dict[int, int] | None) -> Iterator[Any]:
        """Every record of `topic` (of the source: from `starts`, nothing without them), block by block."""
        for partition, (low, high) in (partition_bounds(consumer, topic) or {}).items():
            start = low if starts is None else max(low, starts.get(partition, high))
            yield from _messages(consumer, topic, partition, start, high, [_FIRST_READ_SPAN], most=2000)

    def _replay_starts(self, consumer: Any) -> dict[int, int]:
        """Per source partition, the lowest high watermark a replay recorded before writing (its `started`
        marks in the replay ledger, `<dlq>.replays`): replayed records of the source lie at or after it."""
        ledger = f"{self.topics.dlq}.replays"
        starts: dict[int, int] = {}
        for message in self._scan(consumer, ledger, None):
            try:
                entry = json.loads(message.value() or b"")
                marks = entry["marks"][self.topics.source] if entry.get("event") == "started" else {}
                for partition, offset in marks.items():
                    starts[int(partition)] = min(int(offset), starts.get(int(partition), int(offset)))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not a ledger entry of this pipeline's source
        return starts

    # -- the background tally -------------------------------------------------------------------------------

    def counted(self, *, max_age_s: float = 1.0) -> tuple[int, int]:
        """(records tallied, records in the tiers and the DLQ), the second at most `max_age_s` old."""
        with self._lock:
            cached = self._total
        if cached is None or time.monotonic() - cached[0] >= max_age_s:
            total = 0
            for topic in (*(t.topic for t in self.topics.tiers), self.topics.dlq):
                total += sum(high - low for low, high in self.bounds(topic).values())
            cached = (time.monotonic(), total)
        with self._lock:
            self._total = cached
            return self._counted, cached[1]

    def snapshot(self, view: Callable[[Tally], Any]) -> Any:
        """`view(tally)` while the tally is not being updated."""
        with self._lock:
            return view(self.tally)

    def start_tally(self) -> threading.Thread:
        """Count every tier and DLQ record in a daemon thread, from the start of each topic, then follow."""
        thread = threading.Thread(target=self._tally_loop, name="retrytopics-console-tally", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _tally_loop(self) -> None:
        kinds = {t.topic: "tier" for t in self.topics.tiers} | {self.topics.dlq: "dlq"}
        consumer = self._reading()
        try:
            sizes = {t: len(self.bounds(t)) for t in kinds}
            for batch in follow_from_start(consumer, sizes):
                if self._stop.is_set():
                    return
                self._add(batch, kinds)
        except Exception:
            log.exception("the console's tally of the tiers and DLQ stopped")
        finally:
            consumer.close()

    def _add(self, batch: Sequence[Any], kinds: dict[str, str]) -> None:
        decoded = []
        for message in batch:
            try:
                retry = decode(read_headers(message)[0])
            except HeaderDecodeError:  # counted as a record with unreadable headers
                retry = None
            decoded.append((message.topic(), message.timestamp()[1], retry))
        with self._lock:
            for topic, timestamp_ms, retry in decoded:
                self.tally.add(topic=topic, kind=kinds[topic], timestamp_ms=timestamp_ms, retry=retry)
            self._counted += len(decoded)
