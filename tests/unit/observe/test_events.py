"""Event delivery: hooks receive what they ask for; the per-record success goes only to hooks that want it,
and the loop's per-batch sums (`records.handled`) count every successful call exactly once."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from retrytopics.core.headers import DlqReason
from retrytopics.observe.events import PER_BATCH, Emitter, Event, LoggingHook, NullHook, StatsCollector


class Recorder:
    def __init__(self, events: frozenset[Event] | None = None) -> None:
        if events is not None:
            self.wanted_events = events
        self.seen: list[tuple[Event, dict[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.seen.append((event, dict(data)))


def test_a_hook_without_an_events_attribute_receives_everything() -> None:
    everything, batch_only, nothing = Recorder(), Recorder(PER_BATCH), Recorder(frozenset())
    emitter = Emitter([everything, batch_only])
    emitter.add(nothing)
    for event in Event:
        emitter.emit(event, n=1)
    assert [e for e, _ in everything.seen] == list(Event)
    assert [e for e, _ in batch_only.seen] == [e for e in Event if e not in (Event.RECORD_HANDLED, Event.LAG_MEASURED)]
    assert nothing.seen == []


def test_the_built_in_hooks_do_not_make_the_loop_build_per_record_successes() -> None:
    assert not Emitter([StatsCollector(), LoggingHook(), NullHook()]).wants(Event.RECORD_HANDLED)
    # nor ask their end offsets once a second (runtime/lag.py)
    assert not Emitter([StatsCollector(), LoggingHook(), NullHook()]).wants(Event.LAG_MEASURED)
    assert Emitter([StatsCollector(), Recorder()]).wants(Event.RECORD_HANDLED)


def test_a_hook_whose_own_attribute_shares_the_name_still_receives_everything() -> None:
    # a user's recorder keeps what it saw in a list of its own; that list must not be taken for a filter
    class Keeper:
        def __init__(self) -> None:
            self.wanted_events: list[Event] = []

        def on_event(self, event: Event, data: Mapping[str, object]) -> None:
            self.wanted_events.append(event)

    keeper = Keeper()
    emitter = Emitter([keeper])
    emitter.emit(Event.TRANSACTION_ABORTED, consumer="c", error="x")
    emitter.emit(Event.RECORD_HANDLED, topic="t")
    assert keeper.wanted_events == [Event.TRANSACTION_ABORTED, Event.RECORD_HANDLED]
    assert emitter.wants(Event.RECORD_HANDLED)


def test_stats_count_every_event_from_every_thread() -> None:
    """`StatsCollector` counts what the hooks are told, exactly, with four consumer threads emitting at once:
    handled records by their `count` (a non-int count as one), failures, retries, DLQ records by reason, share
    acknowledgements by kind; events it does not count change nothing."""
    stats = StatsCollector()
    emitter = Emitter([stats])

    def consumer() -> None:
        for i in range(2_000):
            emitter.emit(Event.RECORDS_HANDLED, count=3)
            emitter.emit(Event.RECORDS_HANDLED, count="many")
            emitter.emit(Event.RECORD_FAILED, topic="t", error="E")
            emitter.emit(Event.RETRY_SCHEDULED, topic="t", due_at=i)
            emitter.emit(Event.DLQ_DISPATCHED, reason="poison" if i % 2 else DlqReason.EXHAUSTED)
            emitter.emit(Event.RECORDS_ACKNOWLEDGED, accepted=2, released=1, rejected="x")
            emitter.emit(Event.PARTITION_PAUSED, topic="t", partition=0)

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = stats.snapshot(paused_partitions=2)
    assert (snap.handled, snap.failed, snap.retried) == (8_000 * 4, 8_000, 8_000)
    assert dict(snap.dead_lettered) == {"poison": 4_000, "exhausted": 4_000}
    assert dict(snap.acknowledged) == {"accepted": 16_000, "released": 8_000}
    assert (snap.duplicates_suppressed, snap.publish_failures, snap.abandoned, snap.paused_partitions) == (0, 0, 0, 2)
