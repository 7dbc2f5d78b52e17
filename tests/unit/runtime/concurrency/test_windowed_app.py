"""Handler concurrency end to end on the in-memory broker: a `RetryApp` whose handler runs with
`concurrency=N`, its main consumer and tier consumers (threads), many keys, some records failing once.

Guarantee, proven by a ledger of every call's start and end: in key order (the default) two records of one key
are never in flight together on one consumer and each key's first attempts start in offset order; many calls were in flight at
once; every record is handled (first attempt, or its retry in the tier); no commit ever passes a record whose
call had not returned; the window bound holds. Sync and async handlers alike."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from retrytopics import Concurrency, FloodGuard, KafkaConfig, OrderMode, Record, RetryApp, RetryPolicy
from retrytopics.core.errors import ConfigError
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..kit import eventually

KEYS = 12
PER_KEY = 10
CALLS = 16


class Ledger:
    """Starts and ends of every call, the keys in flight, and the commits (one lock: several threads)."""

    wanted_events = frozenset({Event.OFFSETS_COMMITTED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight: dict[bytes, int] = {}  # key -> calls of it in flight now
        self.overlaps = 0
        self.most_in_flight = 0
        self.first_starts: dict[bytes, list[int]] = {}  # key -> source offsets of first attempts, as started
        self.returned: set[int] = set()  # source offsets whose call returned (success or failure)
        self.ok: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.commit_passed_unfinished: list[tuple[int, int]] = []
        self.commits_checked = 0

    def started(self, record: Record[bytes]) -> bool:
        """Count the call in; whether it fails (each record's first attempt fails for one in ten)."""
        # a retry runs on its tier's consumer, beside later records of its key (no KeyOrdering): not counted
        key = (record.key or b"") if record.retry is None else b"retry:%d" % record.offset
        with self.lock:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
            self.overlaps += self.in_flight[key] > 1
            first = sum(n for k, n in self.in_flight.items() if not k.startswith(b"retry:"))
            self.most_in_flight = max(self.most_in_flight, first)  # the main consumer's window
            if record.retry is None:
                self.first_starts.setdefault(key, []).append(record.offset)
            rid = record.value.decode()
            n = self.attempts[rid] = self.attempts.get(rid, 0) + 1
        return n == 1 and int(rid.split(":")[1]) % 10 == 3

    def ended(self, record: Record[bytes], failed: bool) -> None:
        with self.lock:
            self.in_flight[(record.key or b"") if record.retry is None else b"retry:%d" % record.offset] -= 1
            if record.retry is None:
                self.returned.add(record.offset)
            if not failed:
                self.ok.add(record.value.decode())

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        offsets = data.get("offsets") or {}
        items = offsets.items() if isinstance(offsets, dict) else offsets
        for tp, position in items:
            topic = tp[0] if isinstance(tp, tuple) else getattr(tp, "topic", None)
            if topic != "orders":
                continue
            with self.lock:
                self.commits_checked += 1
                unfinished = [o for o in range(position) if o not in self.returned]
            if unfinished:
                self.commit_passed_unfinished.append((position, unfinished[0]))


def build(broker: MemoryBroker, ledger: Ledger, *, asynchronous: bool, order: OrderMode = OrderMode.KEY) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        hooks=[ledger],
        commit_every=1,
    )
    policy = RetryPolicy(delays=["50ms"], max_retries=2)
    window = Concurrency(calls=CALLS, order=order)
    if asynchronous:

        async def handle_async(record: Record[bytes]) -> None:
            fails = ledger.started(record)
            await asyncio.sleep(0.005)
            ledger.ended(record, fails)
            if fails:
                raise RuntimeError("fails once")

        app.handler("orders", policy=policy, concurrency=window)(handle_async)
    else:

        def handle(record: Record[bytes]) -> None:
            fails = ledger.started(record)
            time.sleep(0.005)
            ledger.ended(record, fails)
            if fails:
                raise RuntimeError("fails once")

        app.handler("orders", policy=policy, concurrency=window)(handle)
    app.provision(partitions=1)
    return app


def produce(broker: MemoryBroker) -> list[str]:
    ids = []
    for seq in range(PER_KEY):
        for key in range(KEYS):
            rid = f"{key}:{seq}"
            broker.append("orders", rid.encode(), key=f"k{key}".encode(), partition=0)
            ids.append(rid)
    return ids


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_keys_run_side_by_side_one_call_per_key_and_commits_never_pass_a_running_call(asynchronous: bool) -> None:
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    ledger = Ledger()
    app = build(broker, ledger, asynchronous=asynchronous)
    ids = produce(broker)
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: ledger.ok >= set(ids), timeout_s=60)
        eventually(lambda: broker.committed("billing").get(("orders", 0)) == len(ids), timeout_s=30)
    finally:
        assert app.stop(30)
    assert app.error is None
    assert ledger.overlaps == 0, "two calls of one key were in flight together"
    inversions = {k: o for k, o in ledger.first_starts.items() if o != sorted(o)}
    assert not inversions, f"first attempts started out of offset order: {inversions}"
    assert 1 < ledger.most_in_flight <= CALLS
    assert ledger.commits_checked > 0 and not ledger.commit_passed_unfinished, ledger.commit_passed_unfinished[:3]
    failed_once = {rid for rid in ids if int(rid.split(":")[1]) % 10 == 3}
    assert {rid for rid, n in ledger.attempts.items() if n == 2} == failed_once


def test_without_order_calls_of_one_key_overlap() -> None:
    """`OrderMode.NONE`: the same ledger sees calls of one key in flight together (what the key gate prevents)."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], 1)
    ledger = Ledger()
    app = build(broker, ledger, asynchronous=True, order=OrderMode.NONE)
    ids = produce(broker)
    app.start(main=True, tiers="all")
    try:
        eventually(lambda: ledger.ok >= set(ids), timeout_s=60)
    finally:
        assert app.stop(30)
    assert ledger.overlaps > 0


@pytest.mark.parametrize(
    ("options", "handler_options", "field"),
    [
        ({"exactly_once": True}, {}, "concurrency"),
        ({"consumer": "share"}, {}, "concurrency"),
        ({}, {"flood_guard": FloodGuard()}, "concurrency"),
    ],
    ids=["exactly-once", "share", "flood-guard"],
)
def test_combinations_not_made_right_yet_are_refused_at_start_up(
    options: dict[str, Any], handler_options: dict[str, Any], field: str
) -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", **options)
    with pytest.raises(ConfigError) as refused:
        app.handler("orders", concurrency=8, **handler_options)(lambda record: None)
        app.start()
    assert refused.value.field == field


@pytest.mark.parametrize(
    "other", [{"ordering": KeyOrdering()}, {"flood_guard": FloodGuard()}], ids=["ordered", "guarded"]
)
def test_a_windowed_handler_beside_a_key_ordered_or_guarded_one_is_refused_at_start(other: dict[str, Any]) -> None:
    """One consumer runs every handler of an app: its records stage is one kind, so the app is refused (a
    key-ordered handler with concurrency too is tests/unit/runtime/concurrency/test_key_ordered_window.py's)."""
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    app.handler("orders", concurrency=8)(lambda record: None)
    app.handler("refunds", **other)(lambda record: None)
    with pytest.raises(ConfigError) as refused:
        app.start()
    assert refused.value.field == "concurrency"


@pytest.mark.parametrize("bad", [0, -1, 10_001, 2.5, "200"])
def test_a_bad_concurrency_is_refused_naming_the_field(bad: object) -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")
    with pytest.raises(ConfigError) as refused:
        app.handler("orders", concurrency=bad)(lambda record: None)  # type: ignore[arg-type]
    assert refused.value.field == "concurrency"
    with pytest.raises(ConfigError) as refused:
        Concurrency(calls=8, order="sideways")  # type: ignore[arg-type]
    assert refused.value.field == "concurrency.order"
