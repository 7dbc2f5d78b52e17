"""The retry-flood guard on a real broker (docs/flood-guard.md): a handler whose dependency goes down, then
comes back, with tiers of 200 ms, 400 ms and 800 ms (1.4 s in all, less than the outage lasts).

Guarantees: the guard opens on the failures, holds the handler's source and tier partitions, probes one call
at a time after a growing back-off and closes once the dependency is back; no good record is dead-lettered and
each is handled exactly once; a poison record still reaches the DLQ with its reason; while the dependency is
down it sees only the calls that opened the guard, at most one call in flight per other consumer, and the
probes; every group (the app's on the source, each tier's own) commits past every record in its topic. A
SIGKILL while the guard is open loses nothing: no group had committed past a record not handed on, and the
restarted app handles every record (flood_worker.py runs the killed process). An operator's command
(`retrytopics guard open|close`) reaches the running app through its flood-guard topic, and `topics describe`
shows the guard open by hand.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from retrytopics import FloodGuard, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode
from retrytopics.observe.events import Event
from retrytopics.operator import cli

from .conftest import Kit, wait_until
from .fault_worker import read_ledger

pytestmark = pytest.mark.broker

N = 200
PARTITIONS = 2
POISON = 77
POLICY = RetryPolicy(delays=["200ms", "400ms", "800ms"], non_retryable=(ValueError,))
GUARD = FloodGuard(
    failure_ratio=0.5, min_calls=10, window="5s", backoff="500ms", max_backoff="1s", ramp="1s", ramp_start=100.0
)
FLOOD_WORKER = Path(__file__).with_name("flood_worker.py")
#: consumers of the handler besides the one whose failure opens the guard: main + 3 tiers, less one
OTHER_CONSUMERS = 3


class Dependency:
    """What the handler calls: down until `recover()`. Counts calls while down, successes, dead letters and the
    guard's events."""

    wanted_events = frozenset({Event.FLOOD_GUARD_OPENED, Event.FLOOD_GUARD_PROBED, Event.FLOOD_GUARD_CLOSED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.up = False
        self.calls_while_down = 0
        self.succeeded: Counter[int] = Counter()
        self.dead_lettered: Counter[int] = Counter()
        self.events: Counter[tuple[Event, object]] = Counter()

    def handle(self, record: Record[bytes]) -> None:
        i = int(record.value)
        if i == POISON:
            raise ValueError(f"record {i} is malformed")
        with self.lock:
            if not self.up:
                self.calls_while_down += 1
                raise ConnectionError("the payment gateway is down")
            self.succeeded[i] += 1

    def recover(self) -> int:
        with self.lock:
            self.up = True
            return self.calls_while_down

    def on_dead_letter(self, record: Any, route: Any) -> None:
        with self.lock:
            self.dead_lettered[int(record.value)] += 1

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            self.events[event, data.get("succeeded", data.get("reason"))] += 1

    def count(self, event: Event, detail: object) -> int:
        with self.lock:
            return self.events[event, detail]

    def settled(self) -> bool:
        with self.lock:
            return len(self.succeeded) == N - 1 and self.dead_lettered[POISON] == 1


def test_an_outage_dead_letters_no_good_record_and_the_dependency_sees_only_probes(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: 200 keyed records over two partitions; the dependency is down from the start
    source = kit.create(unique_name("orders"), PARTITIONS)
    group = unique_name("billing")
    dependency = Dependency()
    app = RetryApp(
        kafka=kafka,
        group=group,
        consumer_overrides=consumer_overrides,
        on_dead_letter=dependency.on_dead_letter,
        hooks=[dependency],
    )
    apps.append(app)
    app.handler(source, policy=POLICY, flood_guard=GUARD)(dependency.handle)
    app.provision()
    kit.produce(source, [(str(i).encode(), str(i).encode(), []) for i in range(N)])

    # when: the app runs through the outage until the guard opened and two probes failed (the back-off grew
    # from 0.5 s to 1 s: longer than the tiers' 1.4 s in all), then the dependency comes back
    app.start(main=True, tiers="all")
    wait_until(lambda: dependency.count(Event.FLOOD_GUARD_PROBED, False) >= 2, 60, "two failed probes")
    calls_while_down = dependency.recover()
    wait_until(dependency.settled, 60, "every record to end")

    # then: every good record handled exactly once and none dead-lettered; the poison one in the DLQ, with its reason
    topics = app.topics(source)
    wait_until(lambda: kit.read_all(topics.dlq), 10, "the DLQ record")
    assert dependency.succeeded == Counter(i for i in range(N) if i != POISON)
    assert dependency.dead_lettered == Counter([POISON])
    dead = [(int(r.value or b"-1"), decode(list(r.headers))) for r in kit.read_all(topics.dlq)]
    assert [(i, h.dlq_reason, h.exception_type) for i, h in dead] == [
        (POISON, DlqReason.NON_RETRYABLE, "builtins.ValueError")
    ]
    # and: the guard opened on the failure ratio, failed probes re-opened it, a probe closed it
    assert dependency.count(Event.FLOOD_GUARD_OPENED, "failure_ratio") >= 1
    assert dependency.count(Event.FLOOD_GUARD_OPENED, "probe_failed") >= 2
    assert dependency.count(Event.FLOOD_GUARD_CLOSED, "probe_succeeded") >= 1
    # and: while down, the dependency saw the calls that opened the guard, one in flight per other consumer,
    # and the probes (without the guard: every record three times over; bench/ measures it)
    probes_failed = dependency.count(Event.FLOOD_GUARD_PROBED, False)
    assert calls_while_down <= GUARD.min_calls + OTHER_CONSUMERS + probes_failed, (calls_while_down, probes_failed)
    # and: every group committed past every record in its topic: nothing left behind, nothing lost
    app.stop()
    assert app.error is None
    for topic, group_id in [(source, group), *((t.topic, t.topic) for t in topics.tiers)]:
        ends: dict[int, int] = {}
        for r in kit.read_all(topic):
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        committed = kit.committed(group_id, topic, PARTITIONS)
        assert {p: o for p, o in committed.items() if p in ends} == ends, topic


def test_sigkill_while_the_guard_is_open_loses_nothing_and_commits_nothing_early(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    """The guarded app (main consumer and both tiers, 200 ms and 400 ms) runs in a child process while its
    dependency is down, until the guard opened and two probes failed (longer than the tiers' 0.6 s: without the
    guard, records ran out of attempts meanwhile); it is SIGKILLed there, and restarted here with the dependency
    up. Every group's commit at the kill is checked against what was handed on: a record below it was republished
    to the next tier (nothing succeeded, nothing may be dead-lettered), so nothing was committed early."""
    sys.path.insert(0, str(FLOOD_WORKER.parent))
    from flood_worker import build_app  # type: ignore[import-not-found]

    # setup: 60 records over two partitions; the dependency is down (no file `up`)
    source = kit.create(unique_name("orders"), PARTITIONS)
    up = tmp_path / "up"
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "up": str(up),
        "ledger": str(tmp_path / "worker.jsonl"),
    }
    count = 60
    worker_log = Path(settings["ledger"])
    names = build_app(settings, str(tmp_path / "unused.jsonl"))  # provisions the topics; never started
    names.provision()
    topics = names.topics(source)
    tiers = [t.topic for t in topics.tiers]
    kit.produce(source, [(str(i).encode(), str(i).encode(), []) for i in range(count)])
    with open(tmp_path / "worker.log", "wb") as worker_stderr:
        worker = subprocess.Popen(
            [sys.executable, str(FLOOD_WORKER), json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=worker_stderr,
            start_new_session=True,
        )
    try:
        # when: the guard opened and two probes failed (or, were it not holding, a record was dead-lettered)
        def open_long_enough() -> bool:
            entries = read_ledger(worker_log)
            failed_probes = [e for e in entries if e.get("event") == "flood_guard.probed" and e["detail"] is False]
            return len(failed_probes) >= 2 or any("dead" in e for e in entries)

        wait_until(open_long_enough, 60, "two failed probes in the worker")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    at_kill = read_ledger(worker_log)

    # then: the worker was killed open, having dead-lettered nothing and had nothing succeed
    assert any(e.get("event") == "flood_guard.opened" for e in at_kill)
    assert [e for e in at_kill if "dead" in e] == []
    assert not any(e.get("ok") for e in at_kill)
    # and: each group committed only past records handed on to the next tier (the DLQ is empty)
    assert kit.read_all(topics.dlq) == []
    stages = [(source, settings["group"]), *((t, t) for t in tiers)]
    for (topic, group), after in zip(stages, [*tiers, None], strict=True):
        handed_on = {int(r.value or b"-1") for r in kit.read_all(after)} if after else set()
        committed = kit.committed(group, topic, PARTITIONS)
        early = [
            (r.partition, r.offset)
            for r in kit.read_all(topic)
            if r.offset < committed.get(r.partition, -1) and int(r.value or b"-1") not in handed_on
        ]
        assert early == [], (topic, committed)

    # when: restarted in this process with the dependency up
    up.touch()
    app = build_app(settings, str(tmp_path / "restart.jsonl"))
    apps.append(app)
    app.start(main=True, tiers="all")
    restart_log = tmp_path / "restart.jsonl"
    wait_until(
        lambda: {e["id"] for e in read_ledger(restart_log) if e.get("ok")} == set(range(count)),
        90,
        "every record to succeed after the restart",
    )
    app.stop()
    assert app.error is None

    # then: every id handled once or more, none dead-lettered, every group committed past every record
    assert kit.read_all(topics.dlq) == []
    assert [e for e in read_ledger(restart_log) if "dead" in e] == []
    for topic, group in stages:
        ends: dict[int, int] = {}
        for r in kit.read_all(topic):
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        assert {p: o for p, o in kit.committed(group, topic, PARTITIONS).items() if p in ends} == ends, topic


def test_an_operator_opens_and_closes_the_guard_from_the_command_line_and_describe_shows_it(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`retrytopics guard open|close` (its main, signed with the app's header key from the environment) reaches the
    running app through its flood-guard topic: nothing is called between the two commands, every record is
    handled once after the close, and `topics describe --json` shows the process's guard open by hand."""
    source = kit.create(unique_name("orders"), PARTITIONS)
    group = unique_name("billing")
    header_key = "h" * 32
    calls: list[tuple[int, int]] = []  # (record, wall-clock ms of the call)
    opened_by_hand: list[object] = []

    class Opened:
        wanted_events = frozenset({Event.FLOOD_GUARD_OPENED})

        def on_event(self, event: Event, data: Mapping[str, object]) -> None:
            if "gateway maintenance" in str(data["reason"]):
                opened_by_hand.append(data)

    app = RetryApp(
        kafka=kafka, group=group, consumer_overrides=consumer_overrides, header_key=header_key, hooks=[Opened()]
    )
    apps.append(app)
    app.handler(source, policy=POLICY, flood_guard=GUARD)(
        lambda record: calls.append((int(record.value), int(time.time() * 1000)))
    )
    app.provision()
    app.start(main=True, tiers="all")
    pipeline = ["--bootstrap", kafka.bootstrap, "--topic", source, "--group", group, "--delays", "200ms,400ms,800ms"]
    monkeypatch.setenv("RETRYTOPICS_APP_HEADER_KEY", header_key)

    def run(*args: str) -> str:
        # the command's own main (a subprocess costs seconds of imports on a loaded machine per call)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert cli.main([*args, *pipeline]) == 0
        return out.getvalue()

    # when: the operator opens the guard, and records arrive
    assert "gateway maintenance" in run("guard", "open", "--reason", "gateway maintenance")

    def described() -> dict[str, Any]:
        return json.loads(run("topics", "describe", "--json"))["flood_guard"]  # type: ignore[no-any-return]

    wait_until(lambda: opened_by_hand, 30, "the guard opened by hand")
    guard = wait_until(lambda: (d := described())["processes"][0]["by_hand"] and d, 30, "the report of it")
    assert guard["processes"][0]["state"] == "open" and "gateway maintenance" in guard["processes"][0]["reason"]
    assert guard["last_command"]["action"] == "open" and guard["untrusted_records"] == 0
    kit.produce(source, [(str(i).encode(), str(i).encode(), []) for i in range(20)])
    # and: closes it
    closed_at = int(time.time() * 1000)
    run("guard", "close", "--reason", "gateway back")

    # then: nothing was called while it was open, every record once after
    wait_until(lambda: len(calls) >= 20, 30, "every record handled after the close")
    assert sorted(i for i, _ in calls) == list(range(20))
    assert all(at >= closed_at for _, at in calls)
    app.stop()
    assert app.error is None
    # and: the process that stopped left the board (its report's tombstone is the last record)
    last = kit.read_all(app.topics(source).flood_guard_topic)[-1]
    assert last.key is not None and last.key.startswith(b"report/") and last.value is None
