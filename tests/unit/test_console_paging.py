"""The console's pure parts: DLQ filters and the page cursor read from untrusted query strings, newest-first
paging over bounded blocks, and the tally behind the pipeline page."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.console.entries import VALUE_KEEP_BYTES, Entry, entry_of
from retrytopics.console.filters import Cursor, DlqFilter
from retrytopics.console.paging import read_page
from retrytopics.console.tally import MAX_KEYS, OTHER, Tally
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import DlqReason, RetryHeaders, encode


def retry(
    *,
    origin: str = "o-1",
    attempts: int = 1,
    reason: DlqReason | None = DlqReason.EXHAUSTED,
    exception_type: str = "builtins.TimeoutError",
    tier: int | None = None,
) -> RetryHeaders:
    return RetryHeaders(
        reconsume_times=attempts,
        origin_message_id=origin,
        original_topic="orders",
        original_partition=0,
        original_offset=7,
        original_timestamp=-1,
        consumer_group="billing",
        tier=tier,
        due_at=None if tier is None else 1,
        first_failed_at=1,
        last_failed_at=2,
        exception_type=exception_type,
        exception_message="m",
        exception_trace="t",
        dlq_reason=None if tier is not None else reason,
    )


def entry(
    partition: int = 0,
    offset: int = 0,
    *,
    timestamp_ms: int = 0,
    key: bytes | None = b"k",
    headers: Sequence[tuple[str, bytes | None]] | None = None,
    value: bytes | None = b"v",
) -> Entry:
    return entry_of(
        topic="orders.billing.dlq",
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key=key,
        value=value,
        headers=list(encode(retry())) if headers is None else headers,
    )


def test_each_filter_criterion_keeps_only_matching_records() -> None:
    timeout = entry(
        headers=[("trace-id", b"abc"), *encode(retry(origin="a", reason=DlqReason.TIMEOUT))], timestamp_ms=500
    )
    poison = entry(key=b"other", headers=encode(retry(origin="b", reason=DlqReason.POISON, exception_type="x.Bad")))
    broken = entry(headers=[("retry.schema_version", b"9")])
    query = DlqFilter.from_query
    assert [query({"reason": ["timeout"]}).matches(e) for e in (timeout, poison, broken)] == [True, False, False]
    assert [query({"exception_type": ["x.Bad"]}).matches(e) for e in (timeout, poison, broken)] == [False, True, False]
    assert [query({"key": ["other"]}).matches(e) for e in (timeout, poison, broken)] == [False, True, False]
    assert [query({"origin_id": ["a"]}).matches(e) for e in (timeout, poison, broken)] == [True, False, False]
    assert [query({"header": ["trace-id=abc"]}).matches(e) for e in (timeout, poison, broken)] == [True, False, False]
    assert [query({"since": ["100"]}).matches(e) for e in (timeout, poison, broken)] == [True, False, False]
    assert [query({"until": ["100"]}).matches(e) for e in (timeout, poison, broken)] == [False, True, True]
    assert all(DlqFilter.from_query({"reason": [""]}).matches(e) for e in (timeout, poison, broken))


def test_a_filter_round_trips_through_its_query() -> None:
    chosen = DlqFilter.from_query(
        {"reason": ["timeout", "poison"], "since": ["2026-11-23T16:50:00Z"], "key": ["k"], "header": ["a=b=c"]}
    )
    again = DlqFilter.from_query({name: [v for n, v in chosen.query() if n == name] for name, _ in chosen.query()})
    assert again == chosen and chosen.header == ("a", "b=c")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"header": ["no-equals"]}, "header"),
        ({"since": ["yesterday"]}, "since"),
        ({"key": ["a", "b"]}, "key"),
        ({"since": ["200"], "until": ["100"]}, "until"),
        ({"origin_id": ["x" * 2000]}, "origin_id"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_parameter(query: dict[str, list[str]], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        DlqFilter.from_query(query)
    assert refused.value.field == field


@pytest.mark.parametrize("text", ["0:1,0:2", "x:1", "1:-5", "1", "0:1;drop", "9999999:1", "1:" + "9" * 30])
def test_a_forged_cursor_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        Cursor.parse(text)


def test_a_cursor_round_trips() -> None:
    assert Cursor.parse("1:98,0:120").text() == "0:120,1:98" and Cursor.parse(None).before == {}


class Topic:
    """An in-memory topic (partition → entries by offset) that counts the records each block read returns."""

    def __init__(self, partitions: dict[int, list[Entry]]) -> None:
        self.partitions = partitions
        self.largest_block = 0

    def read(self, partition: int, start: int, end: int) -> list[Entry]:
        block = [e for e in self.partitions[partition] if start <= e.offset < end]
        self.largest_block = max(self.largest_block, end - start)
        return block

    @property
    def bounds(self) -> dict[int, tuple[int, int]]:
        return {p: (0, len(es)) for p, es in self.partitions.items()}


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    page_size=st.integers(1, 15),
    block=st.integers(1, 9),
    wanted=st.sets(st.integers(0, 160)),
)
def test_paging_visits_every_matching_record_once_newest_first(
    sizes: list[int], page_size: int, block: int, wanted: set[int]
) -> None:
    """Following `next` from the first page lists each matching record exactly once, newest first by
    timestamp, with at most one block per read."""
    partitions = {p: [entry(p, o, timestamp_ms=o * 10 + p) for o in range(n)] for p, n in enumerate(sizes)}
    topic = Topic(partitions)
    keep = lambda e: e.offset * 4 + e.partition in wanted  # noqa: E731
    seen: list[Entry] = []
    cursor: Cursor | None = Cursor()
    while cursor is not None:
        page = read_page(
            bounds=topic.bounds, cursor=cursor, keep=keep, size=page_size, read_block=topic.read, block=block
        )
        assert len(page.entries) <= page_size and not page.budget_spent
        seen += page.entries
        cursor = page.next
    expected = sorted((e for es in partitions.values() for e in es if keep(e)), key=lambda e: -e.timestamp_ms)
    assert [(e.partition, e.offset) for e in seen] == [(e.partition, e.offset) for e in expected]
    assert topic.largest_block <= block


def test_a_filter_matching_nothing_stops_at_the_scan_budget_and_goes_on_from_there() -> None:
    topic = Topic({0: [entry(0, o, timestamp_ms=o) for o in range(1000)]})
    page = read_page(
        bounds=topic.bounds,
        cursor=Cursor(),
        keep=lambda e: e.offset == 3,
        size=10,
        read_block=topic.read,
        block=100,
        scan_limit=250,
    )
    assert page.budget_spent and page.entries == [] and page.scanned == 250 and page.next == Cursor({0: 750})
    rest = read_page(
        bounds=topic.bounds,
        cursor=Cursor({0: 750}),
        keep=lambda e: e.offset == 3,
        size=10,
        read_block=topic.read,
        block=100,
    )
    assert [e.offset for e in rest.entries] == [3] and rest.next is None


def test_the_time_range_ends_a_partitions_scan_at_the_first_block_older_than_it() -> None:
    topic = Topic({0: [entry(0, o, timestamp_ms=o) for o in range(1000)]})
    since = DlqFilter(since_ms=900)
    page = read_page(
        bounds=topic.bounds,
        cursor=Cursor(),
        keep=since.matches,
        size=500,
        read_block=topic.read,
        block=50,
        since_ms=900,
    )
    assert [e.offset for e in page.entries] == list(range(999, 899, -1)) and page.scanned <= 150 and page.next is None


def test_an_entry_keeps_a_bounded_value_unless_read_whole() -> None:
    big = b"x" * (VALUE_KEEP_BYTES * 4)
    cut = entry(value=big)
    assert cut.value is not None and len(cut.value) == VALUE_KEEP_BYTES and cut.value_size == len(big)
    whole = entry_of(topic="t", partition=0, offset=0, timestamp_ms=0, key=None, value=big, headers=[], whole=True)
    assert whole.value == big and whole.retry is None and whole.header_error


def test_the_tally_counts_recovery_per_tier_from_failure_counts() -> None:
    """Tier 1 held 10 first failures; 4 failed again (3 to tier 2, 1 dead-lettered at once): 6 recovered.
    Tier 2 held 3 with 1 still waiting (lag): of the 2 handled, 2 failed again (to the DLQ): none recovered."""
    tally = Tally()
    for _ in range(10):
        tally.add(topic="t1", kind="tier", timestamp_ms=0, retry=retry(attempts=1, tier=0))
    for _ in range(3):
        tally.add(topic="t2", kind="tier", timestamp_ms=0, retry=retry(attempts=2, tier=1))
    tally.add(topic="dlq", kind="dlq", timestamp_ms=0, retry=retry(attempts=2, reason=DlqReason.NON_RETRYABLE))
    for _ in range(2):
        tally.add(topic="dlq", kind="dlq", timestamp_ms=0, retry=retry(attempts=3))
    tally.add(topic="dlq", kind="dlq", timestamp_ms=0, retry=None)
    first, second = tally.recovery(["t1", "t2"], {"t2": 1})
    assert (first.held, first.handled, first.failed_again, first.recovered, first.rate) == (10, 10, 4, 6, 0.6)
    assert (second.held, second.handled, second.failed_again, second.recovered, second.rate) == (3, 2, 2, 0, 0.0)
    assert tally.dlq_by_reason == {"exhausted": 2, "non_retryable": 1, "bad headers": 1}
    assert tally.undecodable == 1 and tally.records == 17


def test_the_tally_stays_bounded_whatever_the_headers_say() -> None:
    tally = Tally(bucket_ms=1000, buckets=5)
    for i in range(MAX_KEYS * 3):
        tally.add(topic="dlq", kind="dlq", timestamp_ms=i * 1000, retry=retry(attempts=i + 1, exception_type=f"t{i}"))
    assert len(tally.dlq_by_type) == MAX_KEYS + 1 and tally.dlq_by_type[OTHER] == MAX_KEYS * 2  # the rest in one
    series = tally.series(now_ms=(MAX_KEYS * 3 - 1) * 1000)
    assert len(series) == 5 and [dead for *_, dead in series] == [1] * 5
    assert len(tally._series) <= 5 and len(tally._dlq_attempts) <= MAX_KEYS + 1


def test_records_are_read_in_runs_of_nearby_offsets() -> None:
    from retrytopics.console.reader import _RUN_SPAN, _runs

    bounds = {0: (5, 1000), 1: (0, 10)}
    wanted = [(0, 7), (0, 8), (0, 7 + _RUN_SPAN), (0, 3), (0, 999), (1, 2), (2, 0), (1, 10)]
    runs = list(_runs(wanted, bounds))
    assert runs == [(0, 7, 9), (0, 7 + _RUN_SPAN, 8 + _RUN_SPAN), (0, 999, 1000), (1, 2, 3)]  # outside bounds: skipped
    assert all(end - start <= _RUN_SPAN for _, start, end in runs)
