"""A whole `RetryApp` on the in-memory broker (`MemoryClientFactory`): provisioning, the main consumer and a
consumer per tier, each in its own thread, as `app.start(main=True, tiers="all")` runs them on Kafka.

Guarantee: every record ends once, handled or in the DLQ with its reason and origin in decoded headers;
nothing is lost, and nothing is handled, handed off or dead-lettered twice (at-least-once repeats work only
after a crash or a lost partition, and this run has neither); no retry is handled before it is due; every
consumer's group has committed past every record it read. Run at-least-once with tier records waiting in
memory or paused in the broker, and exactly-once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import RetryApp, RetryPolicy
from retrytopics.connectors.admin import ProvisionOutcome
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, RetryHeaders, decode
from retrytopics.core.ports import Message, TopicPartition
from retrytopics.core.record import Record
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker, MemoryClientFactory

IDS = [f"id-{i:02d}" for i in range(40)]
FLAKY = {"id-03", "id-10", "id-17", "id-28", "id-35"}  # fail on their first call only
BROKEN = "id-21"  # fails on every call: through both tiers, then the DLQ as exhausted
INVALID = "id-30"  # a ValueError, non-retryable: straight to the DLQ
POLICY = RetryPolicy(delays=["100ms", "200ms"], non_retryable=[ValueError])
#: how long a run may take before the test gives up (a bound, never reached when all is well: about 0.5 s)
DEADLINE_S = 8.0


class Ledger:
    """Handler calls and outcomes per id, from every consumer thread; also a hook counting due-time pauses."""

    wanted_events = frozenset({Event.PARTITION_PAUSED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.succeeded: Counter[str] = Counter()
        self.dead_lettered: Counter[str] = Counter()
        self.early: list[tuple[str, int, float]] = []  # (id, due_at, called at), ms
        self.paused_until_due = 0  # tier partitions paused in the broker until their head record is due

    def handle(self, record: Record[bytes]) -> None:
        record_id = record.value.decode()
        called_at_ms = time.time() * 1000
        with self.lock:
            self.calls[record_id] += 1
            if record.retry is not None and record.retry.due_at is not None and called_at_ms < record.retry.due_at:
                self.early.append((record_id, record.retry.due_at, called_at_ms))
        if record_id == INVALID:
            raise ValueError(f"{record_id} is invalid")
        if record_id == BROKEN or (record_id in FLAKY and record.attempt == 1):
            raise RuntimeError(f"{record_id} failed on attempt {record.attempt}")
        with self.lock:
            self.succeeded[record_id] += 1

    def on_dead_letter(self, record: Any, route: Any) -> None:
        with self.lock:
            self.dead_lettered[record.value.decode()] += 1

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if data.get("until") is not None:
            with self.lock:
                self.paused_until_due += 1

    def settled(self) -> bool:
        with self.lock:
            return sum(self.succeeded.values()) + sum(self.dead_lettered.values()) >= len(IDS)


def wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `done` until it holds or `timeout_s` passed; True if it held."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not done():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


def read(clients: MemoryClientFactory, topic: str) -> list[tuple[str, RetryHeaders]]:
    """(id, decoded retry headers) of every record a read_committed reader finds in `topic`."""
    with clients.lock:
        return [(m.value.decode(), decode(list(m.headers))) for m in clients.broker.records(topic) if m.value]


def past_last_record(messages: list[Message]) -> dict[TopicPartition, int]:
    """Per partition, the offset after its last record: where a group that read them all has committed."""
    ends: dict[TopicPartition, int] = {}
    for m in messages:
        ends[m.tp] = max(ends.get(m.tp, 0), m.offset + 1)
    return ends


@pytest.mark.parametrize(
    ("exactly_once", "wait_in_memory"),
    [(False, "1s"), (False, "0s"), (True, "1s")],
    ids=["at_least_once-waits_in_memory", "at_least_once-pauses_in_the_broker", "exactly_once"],
)
def test_every_record_ends_once_when_the_whole_app_runs_on_the_memory_broker(
    exactly_once: bool, wait_in_memory: str
) -> None:
    # setup: 40 keyed records over two partitions, an app on the memory broker, its topics provisioned
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=2)
    origin = {
        m.value.decode(): m for m in (broker.append("orders", i.encode(), key=i.encode()) for i in IDS) if m.value
    }
    clients = MemoryClientFactory(broker)
    ledger = Ledger()
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9092"),
        group="billing",
        clients=clients,
        exactly_once=exactly_once,
        wait_in_memory=wait_in_memory,
        on_dead_letter=ledger.on_dead_letter,
        hooks=[ledger],
    )
    app.handler("orders", policy=POLICY)(ledger.handle)
    topics = app.topics("orders")
    (tier_100ms, tier_200ms), dlq = [t.topic for t in topics.tiers], topics.dlq
    assert app.provision() == dict.fromkeys([tier_100ms, tier_200ms, dlq], ProvisionOutcome.CREATED)
    assert {broker.partition_count(t) for t in (tier_100ms, tier_200ms, dlq)} == {2}, "the source's count"

    # when: the main consumer and both tier consumers run until every record has an outcome
    app.start(main=True, tiers="all")
    try:
        settled = wait_until(ledger.settled, DEADLINE_S)
    finally:
        stopped = app.stop(timeout=10)
    assert settled, f"not every record ended: {ledger.succeeded=} {ledger.dead_lettered=} {ledger.calls=}"
    assert stopped and app.error is None

    # then: each id handled to its outcome exactly once, with the calls its failures call for
    assert ledger.succeeded == Counter(set(IDS) - {BROKEN, INVALID})
    assert ledger.dead_lettered == Counter([BROKEN, INVALID])
    assert ledger.calls == Counter({i: 2 if i in FLAKY else 3 if i == BROKEN else 1 for i in IDS})
    assert ledger.early == [], "a retry was handled before it was due"
    # (tier records due within `wait_in_memory` wait in the consumer; with "0s" they wait paused in the broker)
    assert (ledger.paused_until_due > 0) == (wait_in_memory == "0s"), ledger.paused_until_due
    # and: each hop is on its tier once, its origin and attempt in the headers, due one delay after failing
    first_tier = read(clients, tier_100ms)
    assert sorted(i for i, _ in first_tier) == sorted(FLAKY | {BROKEN})
    assert sorted(i for i, _ in read(clients, tier_200ms)) == [BROKEN]
    for record_id, h in first_tier:
        assert (h.original_topic, h.original_partition, h.original_offset) == (
            *origin[record_id].tp,
            origin[record_id].offset,
        )
        assert (h.reconsume_times, h.tier, h.exception_type) == (1, 0, "builtins.RuntimeError")
        assert h.due_at is not None and h.due_at >= h.last_failed_at + 100
    # and: the DLQ holds the two dead ends, each once, with its reason and origin
    dead = dict(read(clients, dlq))
    assert len(read(clients, dlq)) == 2 and set(dead) == {BROKEN, INVALID}
    assert (dead[BROKEN].dlq_reason, dead[BROKEN].reconsume_times) == (DlqReason.EXHAUSTED, 3)
    assert dead[BROKEN].exception_message == f"{BROKEN} failed on attempt 3"
    assert (dead[INVALID].dlq_reason, dead[INVALID].reconsume_times) == (DlqReason.NON_RETRYABLE, 1)
    assert dead[INVALID].exception_type == "builtins.ValueError"
    for record_id, h in dead.items():
        m = origin[record_id]
        assert (h.original_topic, h.original_partition, h.original_offset) == ("orders", m.partition, m.offset)
        assert h.origin_message_id == f"orders-{m.partition}-{m.offset}"
    # and: every group committed past every record it read (the source, and each tier in its own group), at
    # most to the partition's end (past a transaction's marker, once the consumer saw it idle)
    with clients.lock:
        for group, topic in (("billing", "orders"), (tier_100ms, tier_100ms), (tier_200ms, tier_200ms)):
            committed, past, end = (
                broker.committed(group),
                past_last_record(broker.records(topic)),
                broker.end_offsets(topic),
            )
            assert committed.keys() == past.keys(), group
            assert all(past[tp] <= committed[tp] <= end[tp[1]] for tp in past), (group, committed, past, end)
    stats = app.stats
    assert (stats.duplicates_suppressed, stats.transactions_aborted, stats.publish_failures) == (0, 0, 0)
    assert dict(stats.dead_lettered) == {"exhausted": 1, "non_retryable": 1}


def test_after_an_offset_reset_the_records_handed_off_before_it_are_handled_again() -> None:
    """The seeded duplicate check (runtime/records/duplicates.py) finds the first run's hops in the tier, but
    the group's offsets were reset by an operator since (no commit mark): every record is handled again."""
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=1)
    for i in range(6):
        broker.append("orders", f"{i}".encode())
    clients = MemoryClientFactory(broker)
    calls: list[tuple[int, int]] = []

    def run(number: int) -> RetryApp:
        app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing", clients=clients)

        @app.handler("orders", policy=RetryPolicy(delays=["1h"]))
        def handle(record: Record[bytes]) -> None:
            calls.append((number, record.offset))
            if number == 1 and record.offset % 2:
                raise RuntimeError("the first run fails the odd offsets")

        app.provision()
        app.start(main=True)
        try:
            assert wait_until(lambda: broker.committed("billing") == {("orders", 0): 6}, DEADLINE_S)
        finally:
            assert app.stop(timeout=10)
        return app

    run(1)
    with clients.lock:
        broker.reset_offsets("billing", {("orders", 0): 0})
    second = run(2)
    assert sorted(offset for number, offset in calls if number == 2) == list(range(6))
    assert second.stats.duplicates_suppressed == 0


def test_the_old_import_path_of_the_memory_client_factory_still_works_and_says_where_it_moved() -> None:
    import retrytopics.client_factory

    with pytest.warns(DeprecationWarning, match="import it from retrytopics.testing"):
        moved = retrytopics.client_factory.MemoryClientFactory
    assert moved is MemoryClientFactory
    with pytest.raises(AttributeError):
        retrytopics.client_factory.NoSuchFactory  # noqa: B018
