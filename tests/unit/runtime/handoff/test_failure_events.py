"""What every hand-off tells the hooks about failures (runtime/handoff/handoff.py), on the in-memory broker: a
batch's failures are summed per partition in one `records.failed`, acknowledged retries per partition and
tier in `retries.scheduled`; the per-record `record.failed` and `retry.scheduled` are built only for a hook
that wants them one by one, and such a hook gets every one with all its fields, whatever the built-in hooks
beside it count.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from retrytopics.observe.events import PER_BATCH, SUMMED, Emitter, Event, LoggingHook, StatsCollector
from retrytopics.observe.metrics import PrometheusHook

from ..kit import GROUP, TIER, Ledger, StopWhen, build_loop, committed_all, fill, hand_offs, new_broker, run

FAILING = {"id-0-0", "id-0-2", "id-1-1"}
FAILED_AT = [(0, 0), (0, 2), (1, 1)]  # (partition, offset) of each failing id
RECORD_FAILED_FIELDS = {"consumer", "topic", "partition", "offset", "attempt", "error", "due_at", "handled_at"}
RETRY_SCHEDULED_FIELDS = {"consumer", "due_at", "topic", "partition", "offset", "destination"}


class OneByOne:
    """A user's hook that asks for the per-record failure events, and nothing else."""

    wanted_events = frozenset({Event.RECORD_FAILED, Event.RETRY_SCHEDULED})

    def __init__(self) -> None:
        self.seen: list[tuple[Event, dict[str, Any]]] = []

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append((event, dict(data)))

    def of(self, event: Event) -> list[dict[str, Any]]:
        return [d for e, d in self.seen if e is event]


def _run_two_partitions(hooks: list[Any], *, summing_ledger: bool, exactly_once: bool) -> Ledger:
    """Two source partitions of three records, three of them failing once (to the tier); the loop runs until
    every offset is committed. The ledger counts the sums (like the built-in hooks) or wants everything."""
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(3)] for p in (0, 1)}
    fill(broker, ids)
    ledger = Ledger(broker, failing=FAILING)
    if summing_ledger:
        ledger.wanted_events = PER_BATCH  # type: ignore[attr-defined]
        ledger.summed_events = SUMMED  # type: ignore[attr-defined]
    stop = StopWhen(committed_all(broker, GROUP, {0: 3, 1: 3}))
    loop = build_loop(broker, ledger, stop, hooks=hooks, batch_size=4, exactly_once=exactly_once)
    run(loop, stop)
    assert ledger.calls == Counter(ids[0] + ids[1])
    assert sorted((h.original_partition, h.original_offset) for _, h in hand_offs(broker, TIER)) == FAILED_AT
    return ledger


def _sums(ledger: Ledger) -> tuple[Counter[int], Counter[tuple[int, str]]]:
    failed: Counter[int] = Counter()
    for d in ledger.of(Event.RECORDS_FAILED):
        assert d["topic"] == "orders" and d["lateness_ms"] == () and d["consumer"] == "orders"
        failed[d["partition"]] += d["count"]
    retried: Counter[tuple[int, str]] = Counter()
    for d in ledger.of(Event.RETRIES_SCHEDULED):
        assert d["topic"] == "orders" and d["consumer"] == "orders"
        retried[(d["partition"], d["destination"])] += d["count"]
    return failed, retried


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_hook_that_wants_failures_one_by_one_gets_every_one_with_its_fields(exactly_once: bool) -> None:
    """Beside the built-in hooks (which count the sums), a hook that names `record.failed` and
    `retry.scheduled` gets one of each per failed record, with every field; the stats count each failure and
    retry exactly once."""
    one_by_one, stats, metrics = OneByOne(), StatsCollector(), PrometheusHook()
    ledger = _run_two_partitions(
        [stats, LoggingHook(), metrics, one_by_one], summing_ledger=True, exactly_once=exactly_once
    )

    failed = one_by_one.of(Event.RECORD_FAILED)
    assert sorted((d["partition"], d["offset"]) for d in failed) == FAILED_AT
    for d in failed:
        assert set(d) == RECORD_FAILED_FIELDS
        assert (d["consumer"], d["topic"], d["attempt"], d["error"]) == ("orders", "orders", 1, "RuntimeError")
        assert d["due_at"] is None and d["handled_at"] is None  # a source record has no due time
    retried = one_by_one.of(Event.RETRY_SCHEDULED)
    assert sorted((d["partition"], d["offset"]) for d in retried) == FAILED_AT
    for d in retried:
        assert set(d) == RETRY_SCHEDULED_FIELDS
        assert (d["consumer"], d["topic"], d["destination"]) == ("orders", "orders", TIER)
        assert isinstance(d["due_at"], int)

    # the built-in hooks and the summing ledger never got them one by one: they count the sums
    assert ledger.of(Event.RECORD_FAILED) == [] and ledger.of(Event.RETRY_SCHEDULED) == []
    assert _sums(ledger) == (Counter({0: 2, 1: 1}), Counter({(0, TIER): 2, (1, TIER): 1}))
    snap = stats.snapshot()
    assert (snap.handled, snap.failed, snap.retried) == (3, 3, 3)
    assert metrics.registry.get_sample_value("retrytopics_records_failed_total", {"topic": "orders"}) == 3
    labels = {"topic": "orders", "tier_topic": TIER}
    assert metrics.registry.get_sample_value("retrytopics_records_retried_total", labels) == 3


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_without_such_a_hook_failures_are_only_summed(exactly_once: bool) -> None:
    """With only hooks that count sums, no per-record failure event is emitted, and the sums account for
    every failure and every acknowledged retry."""
    stats = StatsCollector()
    ledger = _run_two_partitions([stats, LoggingHook()], summing_ledger=True, exactly_once=exactly_once)

    assert ledger.of(Event.RECORD_FAILED) == [] and ledger.of(Event.RETRY_SCHEDULED) == []
    assert _sums(ledger) == (Counter({0: 2, 1: 1}), Counter({(0, TIER): 2, (1, TIER): 1}))
    snap = stats.snapshot()
    assert (snap.handled, snap.failed, snap.retried) == (3, 3, 3)


def test_a_hook_without_wanted_events_gets_failures_one_by_one_and_summed() -> None:
    """A hook that names no events receives everything: each `record.failed` and `retry.scheduled`, and the
    sums too (as it receives `record.handled` and `records.handled`)."""
    ledger = _run_two_partitions([StatsCollector()], summing_ledger=False, exactly_once=False)

    assert sorted((d["partition"], d["offset"]) for d in ledger.of(Event.RECORD_FAILED)) == FAILED_AT
    assert sorted((d["partition"], d["offset"]) for d in ledger.of(Event.RETRY_SCHEDULED)) == FAILED_AT
    assert _sums(ledger) == (Counter({0: 2, 1: 1}), Counter({(0, TIER): 2, (1, TIER): 1}))


def test_the_built_in_hooks_do_not_make_the_loop_build_per_record_failures() -> None:
    built_in = [StatsCollector(), LoggingHook(), PrometheusHook()]
    assert not any(Emitter(built_in).wants_each(e) for e in SUMMED)
    assert all(Emitter([*built_in, OneByOne()]).wants_each(e) for e in SUMMED)
