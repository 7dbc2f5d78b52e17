"""The retry-flood guard wired into a whole `RetryApp` on the in-memory broker (docs/flood-guard.md).

Guarantee: while a handler's dependency is down, its guard opens and its consumers stop calling it (its source
and tier partitions held, one probe at a time after a back-off); once the dependency is back, every good record
is handled exactly once and none is dead-lettered, a poison record still reaches the DLQ with its reason, and
every group commits past every record it read: nothing lost, nothing twice. Without the guard the same outage
dead-letters good records (the control that shows the scenario is a flood). The same holds for a batch
handler, whose calls the guard admits one by one, and for a key-ordered handler, whose records of one key are
handled in their order through the outage (the parked ones key order gives back admitted by the guard too). A record that runs out of
attempts while the guard is open is read again later, never dead-lettered for it. A guard is refused, naming
`flood_guard`, where it cannot work yet.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from retrytopics import (
    BatchFailed,
    ConfigError,
    FloodGuard,
    KafkaConfig,
    KeyOrdering,
    Record,
    RetryApp,
    RetryPolicy,
)
from retrytopics.core.flood_guard import GuardState
from retrytopics.core.headers import DlqReason, decode
from retrytopics.core.ports import Message
from retrytopics.core.router import route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.flood.breaker import HandlerGuard
from retrytopics.runtime.flood.stage import FloodGuardedStage
from retrytopics.runtime.records.outcome import Failed, Held, Outcome, Parked
from retrytopics.runtime.records.stage import RecordStage
from retrytopics.testing import MemoryBroker, MemoryClientFactory

IDS = [f"id-{i:02d}" for i in range(60)]
POISON = "id-13"  # non-retryable (a ValueError) on every call: the DLQ whatever the guard says
POLICY = RetryPolicy(delays=["100ms", "200ms"], non_retryable=[ValueError])
GUARD = FloodGuard(
    failure_ratio=0.5, min_calls=5, window="5s", backoff="150ms", max_backoff="300ms", ramp="300ms", ramp_start=50.0
)
#: a bound on how long each phase may take, never reached when all is well (a phase takes about a second)
DEADLINE_S = 20.0


class Dependency:
    """What the handler calls: down until `recover()`; counts the calls made while it was down, per id."""

    wanted_events = frozenset({Event.FLOOD_GUARD_OPENED, Event.FLOOD_GUARD_PROBED, Event.FLOOD_GUARD_CLOSED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.up = False
        self.calls_while_down = 0
        self.succeeded: Counter[str] = Counter()
        #: the ids handled, in the order their calls returned
        self.handled: list[str] = []
        self.dead_lettered: Counter[str] = Counter()
        self.events: Counter[tuple[Event, object]] = Counter()

    def handle(self, record: Record[bytes]) -> None:
        record_id = record.value.decode()
        if record_id == POISON:
            raise ValueError(f"{record_id} is malformed")
        with self.lock:
            if not self.up:
                self.calls_while_down += 1
                raise ConnectionError("the payment gateway is down")
            self.succeeded[record_id] += 1
            self.handled.append(record_id)

    def handle_batch(self, records: list[Record[bytes]]) -> None:
        """The batch handler's call: each record as `handle` would take it, the failures named."""
        failed: list[tuple[Record[bytes], BaseException]] = []
        for record in records:
            try:
                self.handle(record)
            except (ValueError, ConnectionError) as exc:
                failed.append((record, exc))
        if failed:
            raise BatchFailed(failed)

    def recover(self) -> int:
        with self.lock:
            self.up = True
            return self.calls_while_down

    def on_dead_letter(self, record: Any, route: Any) -> None:
        with self.lock:
            self.dead_lettered[record.value.decode()] += 1

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            self.events[event, data.get("succeeded", data.get("reason"))] += 1

    def count(self, event: Event, detail: object) -> int:
        with self.lock:
            return self.events[event, detail]

    def good_dead_letters(self) -> int:
        with self.lock:
            return sum(n for i, n in self.dead_lettered.items() if i != POISON)

    def settled(self) -> bool:
        with self.lock:
            return len(self.succeeded) == len(IDS) - 1 and self.dead_lettered[POISON] == 1


def wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not done():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


def _app(
    broker: MemoryBroker,
    dependency: Dependency,
    flood_guard: FloodGuard | None,
    *,
    exactly_once: bool,
    wait_in_memory: str,
    batch: bool = False,
    ordering: KeyOrdering | None = None,
) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9092"),
        group="billing",
        exactly_once=exactly_once,
        wait_in_memory=wait_in_memory,
        clients=MemoryClientFactory(broker),
        on_dead_letter=dependency.on_dead_letter,
        hooks=[dependency],
    )
    if batch:
        app.batch_handler("orders", policy=POLICY, flood_guard=flood_guard)(dependency.handle_batch)
    else:
        app.handler("orders", policy=POLICY, flood_guard=flood_guard, ordering=ordering)(dependency.handle)
    app.provision()
    return app


@pytest.mark.parametrize(
    ("guarded", "exactly_once", "wait_in_memory", "batch", "ordered"),
    [
        (True, False, "1s", False, False),
        (True, False, "0s", False, False),
        (True, True, "1s", False, False),
        (False, False, "1s", False, False),
        (True, False, "1s", True, False),
        (True, True, "0s", True, False),
        (False, False, "1s", True, False),
        (True, False, "1s", False, True),
        (True, True, "0s", False, True),
        (False, False, "1s", False, True),
    ],
    ids=[
        "with_the_guard",
        "with_the_guard-paused_in_the_broker",
        "with_the_guard-exactly_once",
        "without_it",
        "batch_handler-with_the_guard",
        "batch_handler-with_the_guard-exactly_once-paused_in_the_broker",
        "batch_handler-without_it",
        "key_ordering-with_the_guard",
        "key_ordering-with_the_guard-exactly_once-paused_in_the_broker",
        "key_ordering-without_it",
    ],
)
def test_an_outage_dead_letters_no_good_record_with_the_guard_and_many_without(
    guarded: bool, exactly_once: bool, wait_in_memory: str, batch: bool, ordered: bool
) -> None:
    # setup: 60 records over two partitions (key-ordered: ten records of each of six keys); the handler's
    # dependency is down from the start
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    for i, record_id in enumerate(IDS):
        broker.append("orders", record_id.encode(), key=f"k{i % 6}".encode() if ordered else record_id.encode())
    dependency = Dependency()
    app = _app(
        broker,
        dependency,
        GUARD if guarded else None,
        exactly_once=exactly_once,
        wait_in_memory=wait_in_memory,
        batch=batch,
        ordering=KeyOrdering() if ordered else None,
    )

    # when: the app runs through the outage (with the guard: until two probes failed, so the back-off grew;
    # without: until a good record was dead-lettered), then the dependency comes back
    app.start(main=True, tiers="all")
    try:
        if guarded:
            outage = wait_until(lambda: dependency.count(Event.FLOOD_GUARD_PROBED, False) >= 2, DEADLINE_S)
        else:
            outage = wait_until(lambda: dependency.good_dead_letters() > 0, DEADLINE_S)
        calls_while_down = dependency.recover()
        settled = wait_until(
            dependency.settled
            if guarded
            else lambda: len(dependency.succeeded) + dependency.good_dead_letters() >= len(IDS) - 1,
            DEADLINE_S,
        )
    finally:
        stopped = app.stop(timeout=10)
    assert outage and settled, f"{dependency.succeeded=} {dependency.dead_lettered=} {dependency.events=}"
    assert stopped and app.error is None

    topics = app.topics("orders")
    dead = [(m.value.decode(), decode(list(m.headers))) for m in broker.records(topics.dlq) if m.value]
    if not guarded:
        # the control: the same outage drains good records into the DLQ, each after its every attempt
        assert dependency.good_dead_letters() > 0
        assert {h.dlq_reason for i, h in dead if i != POISON} == {DlqReason.EXHAUSTED}
        return
    # then: every good record handled exactly once, none dead-lettered; the poison record in the DLQ with its reason
    assert dependency.succeeded == Counter(set(IDS) - {POISON})
    assert dependency.dead_lettered == Counter([POISON])
    if ordered:  # and: each key's records handled in their order, through the outage
        for k in range(6):
            of_key = [i for i in dependency.handled if int(i[3:]) % 6 == k]
            assert of_key == sorted(of_key), (k, of_key)
    assert [(i, h.dlq_reason, h.exception_type) for i, h in dead] == [
        (POISON, DlqReason.NON_RETRYABLE, "builtins.ValueError")
    ]
    # and: the guard opened on the failure ratio, probes failed and re-opened it, one succeeded and closed it
    assert dependency.count(Event.FLOOD_GUARD_OPENED, "failure_ratio") >= 1
    assert dependency.count(Event.FLOOD_GUARD_OPENED, "probe_failed") >= 2
    assert dependency.count(Event.FLOOD_GUARD_PROBED, True) >= 1
    assert dependency.count(Event.FLOOD_GUARD_CLOSED, "probe_succeeded") >= 1
    # and: while down, the dependency saw the calls that opened the guard, one call in flight per other
    # consumer thread (two tiers), and the probes; nothing more (without the guard: every record 3 times).
    # A batch handler's call that opened it holds at most one partition's records.
    probes_failed = dependency.count(Event.FLOOD_GUARD_PROBED, False)
    opening = max(Counter(m.partition for m in broker.records("orders")).values()) if batch else GUARD.min_calls
    assert calls_while_down <= opening + 2 + probes_failed, (calls_while_down, probes_failed)
    # and: every group committed past every record it read: nothing left behind, nothing committed early (at
    # most to the partition's end: past a transaction's marker, once the consumer saw it idle)
    for group, topic in [("billing", "orders"), *((t.topic, t.topic) for t in topics.tiers)]:
        ends: dict[tuple[str, int], int] = {}
        for m in broker.records(topic):
            ends[m.tp] = max(ends.get(m.tp, 0), m.offset + 1)
        committed, end = broker.committed(group), broker.end_offsets(topic)
        assert committed.keys() == ends.keys(), group
        assert all(ends[tp] <= committed[tp] <= end[tp[1]] for tp in ends), (group, committed, ends, end)


def test_a_bad_record_among_successes_never_opens_the_guard_and_reaches_the_dlq() -> None:
    """The dependency up, one record failing retryably on every call (a bad record, not an outage): it goes
    through both tiers to the DLQ as `exhausted`, every other record is handled once, and the guard never
    opens (its failures are a small share of the window's calls)."""
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    for record_id in IDS:
        broker.append("orders", record_id.encode(), key=record_id.encode())
    dependency = Dependency()
    dependency.up = True
    broken = "id-42"

    def handle(record: Record[bytes]) -> None:
        if record.value.decode() == broken:
            raise ConnectionError("this record's account is locked")
        dependency.handle(record)

    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9092"),
        group="billing",
        clients=MemoryClientFactory(broker),
        on_dead_letter=dependency.on_dead_letter,
        hooks=[dependency],
    )
    app.handler("orders", policy=POLICY, flood_guard=GUARD)(handle)
    app.provision()
    app.start(main=True, tiers="all")
    try:
        settled = wait_until(
            lambda: len(dependency.succeeded) == len(IDS) - 2 and sum(dependency.dead_lettered.values()) == 2,
            DEADLINE_S,
        )
    finally:
        stopped = app.stop(timeout=10)
    assert settled and stopped and app.error is None, f"{dependency.succeeded=} {dependency.dead_lettered=}"
    assert dependency.succeeded == Counter(set(IDS) - {POISON, broken})
    dead = {m.value.decode(): decode(list(m.headers)).dlq_reason for m in broker.records(app.topics("orders").dlq)}
    assert dead == {broken: DlqReason.EXHAUSTED, POISON: DlqReason.NON_RETRYABLE}
    assert sum(n for (event, _), n in dependency.events.items() if event is Event.FLOOD_GUARD_OPENED) == 0


class _FailingStage(RecordStage):
    """An inner stage whose every record fails with the route `failed` decides (nothing else is asked)."""

    def __init__(self, failed: Callable[[Message], Failed]) -> None:
        self._make = failed

    def read(self, msg: Message) -> Iterator[Outcome]:
        yield self._make(msg)


class _Clock:
    """A clock the test moves (runtime/clock.py's protocol)."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def monotonic(self) -> float:
        return self.ms / 1000

    def now_ms(self) -> int:
        return self.ms


def test_a_record_out_of_attempts_while_the_guard_is_open_is_held_not_dead_lettered_up_to_a_bound() -> None:
    """The stage's own rule, with a failure routed to the DLQ as `exhausted`: held (read again later) while
    the guard is not closed, at most `max_deferrals` times; dead-lettered as ever while it is closed, and
    after that bound (a bad record alone would otherwise be every probe and keep the guard open for good)."""
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    app.handler("orders", policy=RetryPolicy(delays=["100ms"]))(lambda record: None)
    binding = app.handlers["orders"]
    tier = binding.ctx.topics.tiers[0].topic
    source = Message(topic="orders", partition=0, offset=7, key=b"k", value=b"v", headers=(), timestamp_ms=1)
    first = route(binding.ctx, source, ConnectionError("down"), now_ms=1_000, rng=random.Random(1))
    hop = Message(topic=tier, partition=0, offset=3, key=b"k", value=b"v", headers=first.headers, timestamp_ms=2)

    def exhausted(msg: Message) -> Failed:
        decided = route(binding.ctx, msg, ConnectionError("down"), now_ms=1_200, rng=random.Random(1))
        assert decided.reason is DlqReason.EXHAUSTED
        return Failed(msg, None, None, ConnectionError("down"), decided, binding.ctx)  # type: ignore[arg-type]

    clock = _Clock()
    config = FloodGuard(min_calls=2, backoff="1s", max_backoff="1s", jitter=0.0, max_deferrals=2)
    guard = HandlerGuard("orders", config, emitter=Emitter([]), clock=clock, rng=random.Random(1))
    stage = FloodGuardedStage(
        _FailingStage(exhausted), {tier: guard}, consumer="tier", emitter=Emitter([]), clock=clock
    )
    # closed: a record out of attempts goes to the DLQ as ever (one failure is no outage)
    (outcome,) = stage.read(hop)
    assert type(outcome) is Failed and outcome.route.reason is DlqReason.EXHAUSTED
    assert guard.state is GuardState.CLOSED
    # the failure that opens the guard ran out of attempts as it opened: held, read again later
    again = hop._replace(offset=4)
    (outcome,) = stage.read(again)
    assert guard.state is GuardState.OPEN
    assert outcome == Held(again) and guard.deferred == 1
    # open: the next record is not even called, and not lost: held too
    (outcome,) = stage.read(hop._replace(offset=5))
    assert outcome == Held(hop._replace(offset=5)) and guard.refused == 1 and guard.deferred == 1
    # after the back-off the held record is the probe, fails again: held a second time, the guard open again
    clock.ms += 1_000
    (outcome,) = stage.read(again)
    assert outcome == Held(again) and guard.deferred == 2 and guard.state is GuardState.OPEN
    # and a third time it has been spared `max_deferrals` times: the DLQ, as a bad record would
    clock.ms += 1_000
    (outcome,) = stage.read(again)
    assert type(outcome) is Failed and outcome.route.reason is DlqReason.EXHAUSTED and guard.deferred == 2


def test_a_guard_is_checked_at_registration_and_refused_where_it_cannot_work_yet() -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    with pytest.raises(ConfigError, match="flood_guard"):
        app.handler("orders", flood_guard={"failure_ratio": 0.5})(lambda record: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="flood_guard"):
        app.batch_handler("orders", ordering=KeyOrdering(), flood_guard=FloodGuard())(lambda records: None)
    with pytest.raises(ConfigError, match="min_calls"):
        FloodGuard(min_calls=0)
    with pytest.raises(ConfigError, match="max_deferrals"):
        FloodGuard(max_deferrals=0)
    share = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        consumer="share",
        clients=MemoryClientFactory(MemoryBroker()),
    )
    share.handler("orders", flood_guard=FloodGuard())(lambda record: None)
    with pytest.raises(ConfigError, match="flood_guard"):
        share.start()


class _ParkingStage(RecordStage):
    """An inner stage that parks records as key order's does: each record it gives back (`released`) is asked
    of `admits_unparked` first, then fails as `failed` decides; one not admitted is parked again."""

    def __init__(self, failed: Callable[[Message], Failed]) -> None:
        self._make = failed
        self.parked: list[Message] = []
        self.called: list[int] = []
        self.admits_unparked: Callable[[Message], bool] = lambda msg: True

    def read(self, msg: Message) -> Iterator[Outcome]:
        yield self._make(msg)

    def released(self) -> Iterator[Iterator[Outcome]]:
        given_back, self.parked = self.parked, []
        return (self._unparked(msg) for msg in given_back)

    def _unparked(self, msg: Message) -> Iterator[Outcome]:
        if not self.admits_unparked(msg):
            yield self.park_again(msg)
            return
        self.called.append(msg.offset)
        yield self._make(msg)

    def park_again(self, msg: Message) -> Parked:
        self.parked.append(msg)
        return Parked(msg)


def test_a_parked_record_given_back_is_admitted_by_the_guard_and_parked_again_not_held() -> None:
    """Key order's parked records (given back by `released`, below records of their partition acted on since)
    are admitted by the guard like any call: refused, or spared the DLQ, they are parked again, never `Held`
    (which would read their partition again from below what was acted on); a probe among them counts."""
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    app.handler("orders", policy=RetryPolicy(delays=["100ms"], max_retries=0))(lambda record: None)
    binding = app.handlers["orders"]
    source = Message(topic="orders", partition=0, offset=7, key=b"k", value=b"v", headers=(), timestamp_ms=1)

    def exhausted_at_once(msg: Message) -> Failed:  # no retry: a source record's failure runs out of attempts at once
        decided = route(binding.ctx, msg, ConnectionError("down"), now_ms=10_000, rng=random.Random(1))
        assert decided.reason is DlqReason.EXHAUSTED
        return Failed(msg, None, None, ConnectionError("down"), decided, binding.ctx)  # type: ignore[arg-type]

    clock = _Clock()
    config = FloodGuard(min_calls=1, backoff="1s", max_backoff="1s", jitter=0.0)
    guard = HandlerGuard("orders", config, emitter=Emitter([]), clock=clock, rng=random.Random(1))
    inner = _ParkingStage(exhausted_at_once)
    stage = FloodGuardedStage(
        inner, {"orders": guard}, consumer="main", emitter=Emitter([]), clock=clock, unparking=inner
    )
    # the read that opens the guard: spared, held (it is the partition's latest record)
    (outcome,) = stage.read(source)
    assert outcome == Held(source) and guard.state is GuardState.OPEN
    # open: a parked record given back is not called, and parked again
    parked = source._replace(offset=3)
    inner.parked = [parked]
    assert [list(outcomes) for outcomes in stage.released()] == [[Parked(parked)]]
    assert inner.called == [] and inner.parked == [parked] and guard.refused == 1
    # after the back-off it is the probe: it fails (out of attempts), is spared, and parked again, not held
    clock.ms += 1_000
    assert [list(outcomes) for outcomes in stage.released()] == [[Parked(parked)]]
    assert inner.called == [3] and inner.parked == [parked]
    assert guard.probes == 1 and guard.deferred == 2 and guard.state is GuardState.OPEN
