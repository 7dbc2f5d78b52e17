"""Handler concurrency on a real broker (docs/concurrency.md): one app, three handlers with `concurrency=16`, an
`async def` one, a plain one and a key-ordered `async def` one, many keys over one partition each, one key
slow, one record in ten failing once; and a SIGKILL of a process in the middle of its window.

Guarantees: every id is handled (its first attempt, or its retry in the tier); on the main consumer two
records of one key are never in flight together and each key's records start in offset order (0 inversions);
a slow key does not stall the others (they all end before it); no commit ever passes a record whose call has
not returned; after a SIGKILL with calls in flight nothing is lost, and the committed offset never passed a
call that had not ended. With `ordering=KeyOrdering()`, through the tiers too: no record of a key is called
(first attempt, retry or follower) before every earlier record of its key succeeded.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from retrytopics import KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.observe.events import Event

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

KEYS = 6  # fewer than the window: without the key gate, calls of one key would overlap
PER_KEY = 25
SLOW_KEY = b"slow"
WINDOW = 16
POLICY = RetryPolicy(delays=["200ms"], max_retries=2)


class Ledger:
    """Per source topic: the calls in flight per key, the start order of first attempts, what returned, and
    every commit checked against it (one lock: consumer, task and pool threads)."""

    wanted_events = frozenset({Event.OFFSETS_COMMITTED})

    def __init__(self, topics: list[str], ordered: str) -> None:
        self.lock = threading.Lock()
        self.topics = set(topics)
        #: the key-ordered topic: its followers are committed before their call in the tier (handed off)
        self.ordered = ordered
        #: calls of the ordered topic started while an earlier record of their key had not succeeded
        self.ahead: list[tuple[int, list[int]]] = []
        self.in_flight: dict[tuple[str, bytes], int] = {}
        self.overlaps = 0
        self.most_in_flight: dict[str, int] = dict.fromkeys(topics, 0)
        self.starts: dict[tuple[str, bytes], list[int]] = {}
        self.returned: dict[str, set[int]] = {t: set() for t in topics}
        self.ok: dict[str, set[int]] = {t: set() for t in topics}
        self.attempts: dict[tuple[str, int], int] = {}
        self.commits_checked = 0
        self.passed: list[tuple[str, int, int]] = []
        #: per source topic: set once every first attempt but the slow key's returned
        self.others_returned = {t: threading.Event() for t in topics}
        self.others = 0

    def start(self, record: Record[bytes]) -> bool:
        first = record.retry is None
        key = (record.topic, record.key or b"") if first else (record.topic, b"retry:%d" % record.offset)
        with self.lock:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
            self.overlaps += self.in_flight[key] > 1
            if first:
                self.starts.setdefault(key, []).append(record.offset)
                running = sum(n for (t, k), n in self.in_flight.items() if t == record.topic and b"retry:" not in k)
                self.most_in_flight[record.topic] = max(self.most_in_flight[record.topic], running)
            i, source = int(record.value), self.source_of(record)
            n = self.attempts[(source, i)] = self.attempts.get((source, i), 0) + 1
            if source == self.ordered and (earlier := [j for j in _earlier_of_key(i) if j not in self.ok[source]]):
                self.ahead.append((i, earlier))
        return n == 1 and i % 10 == 3

    def end(self, record: Record[bytes], fails: bool) -> None:
        first = record.retry is None
        key = (record.topic, record.key or b"") if first else (record.topic, b"retry:%d" % record.offset)
        source = self.source_of(record)
        with self.lock:
            self.in_flight[key] -= 1
            if first:
                self.returned[record.topic].add(record.offset)
                if len(self.returned[record.topic]) == self.others:
                    self.others_returned[record.topic].set()
            if not fails:
                self.ok[source].add(int(record.value))

    def source_of(self, record: Record[bytes]) -> str:
        return next(t for t in self.topics if record.topic.startswith(t))

    def on_event(self, event: Event, data: Mapping[str, Any]) -> None:
        for (topic, _partition), position in dict(data.get("offsets") or {}).items():
            if topic not in self.topics or topic == self.ordered:
                continue
            with self.lock:
                self.commits_checked += 1
                unfinished = [o for o in range(position) if o not in self.returned[topic]]
                if unfinished:
                    self.passed.append((topic, position, unfinished[0]))

    def all_ok(self, n: int) -> bool:
        with self.lock:
            return all(len(ok) == n for ok in self.ok.values())


def _earlier_of_key(i: int) -> range:
    """The ids before id `i` of its key (see `records`)."""
    return range(0) if i == 0 else range((i - 1) % KEYS + 1, i, KEYS)


def records() -> list[tuple[bytes, bytes, list[Any]]]:
    """Ids 0..n-1 interleaved over the keys; the slow key's record comes first."""
    out: list[tuple[bytes, bytes, list[Any]]] = [(SLOW_KEY, b"0", [])]
    for _ in range(PER_KEY):
        for k in range(KEYS):
            out.append((b"k%d" % k, str(len(out)).encode(), []))
    return out


def test_keys_run_side_by_side_in_order_and_commits_never_pass_a_running_call(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: three source topics of one partition, each with its handler at concurrency=16 (async, plain, and
    # async key-ordered)
    plain, coroutine = kit.create(unique_name("orders-sync"), 1), kit.create(unique_name("orders-async"), 1)
    ordered = kit.create(unique_name("orders-keyed"), 1)
    ledger = Ledger([plain, coroutine, ordered], ordered)
    batch = records()
    ledger.others = len(batch) - 1
    stalled: list[str] = []
    app = RetryApp(
        kafka=kafka, group=unique_name("billing"), consumer_overrides=consumer_overrides, hooks=[ledger], commit_every=5
    )
    apps.append(app)

    @app.handler(plain, policy=POLICY, concurrency=WINDOW)
    def handle(record: Record[bytes]) -> None:
        fails = ledger.start(record)
        if record.key == SLOW_KEY:  # the slow call returns once every other record's call did
            if not ledger.others_returned[record.topic].wait(60):
                stalled.append(record.topic)
        else:
            time.sleep(0.01)
        ledger.end(record, fails)
        if fails:
            raise RuntimeError("fails once")

    @app.handler(coroutine, policy=POLICY, concurrency=WINDOW)
    async def handle_async(record: Record[bytes]) -> None:
        fails = ledger.start(record)
        if record.key == SLOW_KEY:
            if not await asyncio.to_thread(ledger.others_returned[record.topic].wait, 60):
                stalled.append(record.topic)
        else:
            await asyncio.sleep(0.01)
        ledger.end(record, fails)
        if fails:
            raise RuntimeError("fails once")

    app.handler(ordered, policy=POLICY, concurrency=WINDOW, ordering=KeyOrdering())(handle_async)
    app.provision()
    for topic in (plain, coroutine, ordered):
        kit.produce(topic, batch)

    # when: the app runs its main consumer and its tier consumers until every id is handled
    app.start(main=True, tiers="all")
    wait_until(lambda: ledger.all_ok(len(batch)), 90, "every id handled")
    wait_until(
        lambda: all(kit.committed(app.group, t, 1) == {0: len(batch)} for t in (plain, coroutine, ordered)),
        30,
        "commits",
    )
    app.stop()
    assert app.error is None

    # then: one call per key at a time, each key's first attempts started in offset order, calls side by side
    assert ledger.overlaps == 0
    inversions = {k: o for k, o in ledger.starts.items() if o != sorted(o)}
    assert not inversions
    assert all(1 < most <= WINDOW for most in ledger.most_in_flight.values()), ledger.most_in_flight
    # and: the slow key stalled no other key: its call, first in, returned only after all the others had
    assert not stalled
    # and: the failed ones were retried once, in the tier; no commit passed a call still running
    failing = {i for i in range(len(batch)) if i % 10 == 3}
    assert {i for (t, i), n in ledger.attempts.items() if n == 2 and t == plain} == failing
    # and: key order held through the tiers (the failing keys' later records followed them there)
    assert {i for (t, i), n in ledger.attempts.items() if n == 2 and t == ordered} == failing
    assert not ledger.ahead, ledger.ahead[:3]
    assert ledger.commits_checked > 0 and not ledger.passed, ledger.passed[:3]


WORKER = Path(__file__).with_name("window_worker.py")


def test_sigkill_mid_window_loses_nothing_and_no_commit_passed_a_running_call(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(WORKER.parent))
    from window_worker import build_app  # type: ignore[import-not-found]

    # setup: 200 keyed records; a worker process with a window of 16 that SIGKILLs itself inside call 120
    source = kit.create(unique_name("orders"), 1)
    settings = {
        "bootstrap": kafka.bootstrap,
        "source": source,
        "group": unique_name("billing"),
        "consumer_overrides": consumer_overrides,
        "ledger": str(tmp_path / "killed.jsonl"),
        "kill": 120,
    }
    n = 200
    kit.produce(source, [(b"k%d" % (i % 25), str(i).encode(), []) for i in range(n)])
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(settings)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ},
    )
    _, stderr = worker.communicate(timeout=120)
    assert worker.returncode == -9, stderr.decode()[-2000:]

    # then: the committed offset never passed a call that had not ended
    killed = _ledger(tmp_path / "killed.jsonl")
    committed = kit.committed(str(settings["group"]), source, 1).get(0, -1001)
    ended = killed["end"]
    assert killed["start"] - ended, "calls were in flight at the kill"
    assert all(i in ended for i in range(max(committed, 0))), (committed, sorted(set(range(n)) - ended)[:5])

    # when: a new app of the same group takes over
    app = build_app(settings, tmp_path / "after.jsonl", kill=None)
    apps.append(app)
    app.start(main=True)
    wait_until(lambda: _ledger(tmp_path / "after.jsonl")["end"] | ended >= set(range(n)), 60, "every id handled")
    app.stop()
    assert app.error is None
    # then: nothing lost; what was read again is what the kill left unfinished or uncommitted
    again = _ledger(tmp_path / "after.jsonl")["end"]
    assert again >= set(range(n)) - ended
    assert min(again) >= max(committed, 0)


def _ledger(path: Path) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {"start": set(), "end": set()}
    if path.exists():
        for line in path.read_text().splitlines():
            what, i = line.split()
            out[what].add(int(i))
    return out
