"""Event delivery: hooks receive what they ask for; the per-record success goes only to hooks that want it,
and the loop's per-batch sums (`records.handled`) count every successful call exactly once."""

from __future__ import annotations

from collections.abc import Mapping

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
    assert [e for e, _ in batch_only.seen] == [e for e in Event if e is not Event.RECORD_HANDLED]
    assert nothing.seen == []


def test_the_built_in_hooks_do_not_make_the_loop_build_per_record_successes() -> None:
    assert not Emitter([StatsCollector(), LoggingHook(), NullHook()]).wants(Event.RECORD_HANDLED)
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
