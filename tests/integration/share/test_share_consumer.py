"""The share-group main consumer (`RetryApp(consumer="share")`) on Apache Kafka 4.4.0: several members on one
partition, failures through the tiers, a member SIGKILLed mid-batch, and a record that kills its process
every time. Every id is accounted for: handled, or in our DLQ with its reason (docs/share-groups.md)."""

from __future__ import annotations

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
from confluent_kafka import TopicPartition

from retrytopics import KafkaConfig, NonRetryable, RetryApp, RetryPolicy
from retrytopics.connectors.kafka import make_consumer
from retrytopics.core.headers import RetryHeaders, decode
from retrytopics.core.record import Record
from retrytopics.observe.events import Event

from .conftest import ShareKit

pytestmark = pytest.mark.broker

SHARE_APP = Path(__file__).with_name("share_app.py")
POLICY = RetryPolicy(delays=["1s"], max_retries=1)


class Tail:
    """Every record of a one-partition topic so far, read without a group: (value, decoded retry headers)."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self._consumer = make_consumer(kafka, group_id=None)
        self._consumer.assign([TopicPartition(topic, 0, 0)])
        self.records: list[tuple[str, RetryHeaders]] = []

    def read(self) -> list[tuple[str, RetryHeaders]]:
        while (msg := self._consumer.poll(0.05)) is not None:
            if msg.error() is None:
                self.records.append((msg.value().decode(), decode(list(msg.headers() or []))))
        return self.records

    def close(self) -> None:
        self._consumer.close()


class Acknowledged:
    """A hook summing the apps' `records.acknowledged` events (thread-safe: each app's loop emits)."""

    wanted_events = frozenset({Event.RECORDS_ACKNOWLEDGED})

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_type: Counter[str] = Counter()
        self.delivery_counts: Counter[int] = Counter()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self._lock:
            for kind in ("accepted", "released", "rejected", "renewed"):
                value = data[kind]
                assert isinstance(value, int)
                self.by_type[kind] += value
            counts = data["delivery_counts"]
            assert isinstance(counts, dict)
            self.delivery_counts.update(counts)


def share_app(
    share: ShareKit, handle: Callable[[Record[bytes]], None], *, hooks: tuple[Any, ...] = (), **options: Any
) -> RetryApp:
    app = RetryApp(kafka=share.kafka, group=share.group, consumer="share", hooks=hooks, **options)
    app.handler(share.topic, policy=POLICY)(handle)
    app.provision()
    return app


def wait_for(done: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_four_share_consumers_on_one_partition_account_for_every_id(share: ShareKit) -> None:
    """Four apps (a share consumer each, one group) on a one-partition topic, a 10 ms handler: every id is
    handled exactly once, or, for the ids it refuses (`NonRetryable`), in our DLQ with reason
    `non_retryable`; every acknowledgement is an ACCEPT of a first delivery."""
    values = [v.decode() for v in share.setup(240)]
    refused = {v for i, v in enumerate(values) if i % 10 == 7}
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(record: Record[bytes]) -> None:
        time.sleep(0.01)
        with lock:
            calls[record.value.decode()] += 1
        if record.value.decode() in refused:
            raise NonRetryable(ValueError("refused"))

    acknowledged = Acknowledged()
    apps = [share_app(share, handle, hooks=(acknowledged,), batch_size=10) for _ in range(4)]
    dlq = Tail(share.kafka, apps[0].topics(share.topic).dlq)
    try:
        for app in apps:
            app.start(main=True)
        wait_for(
            lambda: set(calls) == set(values) and len(dlq.read()) >= len(refused),
            30,
            lambda: (len(calls), len(dlq.records)),
        )
        wait_for(lambda: acknowledged.by_type["accepted"] >= len(values), 10, lambda: acknowledged.by_type)
    finally:
        for app in apps:
            app.stop(15)
        dlq.close()
    assert all(app.error is None for app in apps)
    assert calls == dict.fromkeys(values, 1), {v: c for v, c in calls.items() if c != 1}
    assert sorted(v for v, _h in dlq.records) == sorted(refused)
    assert {h.dlq_reason for _v, h in dlq.records} == {"non_retryable"}
    assert acknowledged.by_type == {"accepted": len(values), "released": 0, "rejected": 0, "renewed": 0}
    assert acknowledged.delivery_counts == {1: len(values)}


def ledger_of(
    kafka: KafkaConfig, app: RetryApp, topic: str, kinds: Mapping[str, str], calls: Counter[str]
) -> dict[str, Any]:
    """Per id (`kinds`: value -> ok/once/always): handler calls, and the DLQ reason (None: handled), once
    every id is settled."""
    failing = sum(kind == "always" for kind in kinds.values())
    dlq = Tail(kafka, app.topics(topic).dlq)
    try:
        wait_for(
            lambda: (
                all(calls[v] == (1 if kind == "ok" else 2) for v, kind in kinds.items()) and len(dlq.read()) >= failing
            ),
            40,
            lambda: (calls, len(dlq.records)),
        )
        reasons = {v: h.dlq_reason for v, h in dlq.read()}
    finally:
        dlq.close()
    return {f"{kind}:{v}": (calls[v], reasons.get(v)) for v, kind in kinds.items()}


def test_failures_through_the_tiers_and_into_the_dlq_as_with_a_consumer_group(
    share: ShareKit, unique_name: Callable[[str], str]
) -> None:
    """One topic, two apps: a consumer group and a share group, each with its tier consumer (one 1 s tier,
    one retry). Ids that fail once succeed from the tier; ids that always fail reach the DLQ `exhausted`;
    the rest succeed at once. The per-id ledger (calls, DLQ reason) is the same for both, and as expected."""
    values = [v.decode() for v in share.setup(12)]
    kinds = {v: ["ok", "once", "always"][i % 3] for i, v in enumerate(values)}
    ledgers: dict[str, Counter[str]] = {"group": Counter(), "share": Counter()}
    lock = threading.Lock()

    def handler(model: str) -> Callable[[Record[bytes]], None]:
        def handle(record: Record[bytes]) -> None:
            value = record.value.decode()
            with lock:
                ledgers[model][value] += 1
            if kinds[value] == "always" or (kinds[value] == "once" and record.attempt == 1):
                raise RuntimeError(f"{value} fails")

        return handle

    group_app = RetryApp(kafka=share.kafka, group=unique_name("group"))
    group_app.handler(share.topic, policy=POLICY)(handler("group"))
    group_app.provision()
    share_app_ = share_app(share, handler("share"))
    try:
        group_app.start(main=True, tiers="all")
        share_app_.start(main=True, tiers="all")
        by_group = ledger_of(share.kafka, group_app, share.topic, kinds, ledgers["group"])
        by_share = ledger_of(share.kafka, share_app_, share.topic, kinds, ledgers["share"])
    finally:
        group_app.stop(15)
        share_app_.stop(15)
    assert group_app.error is None and share_app_.error is None
    expected = {
        f"{kind}:{v}": (1, None) if kind == "ok" else (2, None if kind == "once" else "exhausted")
        for v, kind in kinds.items()
    }
    assert by_group == expected
    assert by_share == expected


def start_share_process(share: ShareKit, calls_file: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SHARE_APP), share.kafka.bootstrap, share.group, share.topic, str(calls_file), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def calls_in(calls_file: Path) -> list[tuple[int, str]]:
    if not calls_file.exists():
        return []
    return [(int(pid), value) for pid, value in (line.split() for line in calls_file.read_text().splitlines() if line)]


def test_a_share_consumer_killed_mid_batch_loses_nothing(share: ShareKit, tmp_path: Path) -> None:
    """A share-consumer process handles one record of its batch and is SIGKILLed in the next call. After the
    lock (2 s) expires, a surviving app gets every record the dead one held, with delivery count 2: every id
    is handled (by the survivor, or by the dead process with its acknowledgement committed), and the
    duplicates (handled in both) include the call the process died in."""
    values = [v.decode() for v in share.setup(30, record_lock_duration_ms=2000)]
    calls_file = tmp_path / "calls"
    share_app(share, lambda _r: None)  # provisions the tier and the DLQ
    doomed = start_share_process(share, calls_file, "hold")
    try:
        line = doomed.stdout.readline() if doomed.stdout else ""
        assert line.strip() == "holding", line
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
    dead_calls = [value for _pid, value in calls_in(calls_file)]
    assert len(dead_calls) == 2

    survivor_calls: Counter[str] = Counter()
    acknowledged = Acknowledged()
    survivor = share_app(share, lambda r: survivor_calls.update([r.value.decode()]), hooks=(acknowledged,))
    survivor.start(main=True)
    try:
        wait_for(lambda: set(survivor_calls) | set(dead_calls) == set(values), 30, lambda: sorted(survivor_calls))
        wait_for(lambda: acknowledged.by_type["accepted"] >= len(survivor_calls), 10, lambda: acknowledged.by_type)
    finally:
        survivor.stop(15)
    assert survivor.error is None
    assert set(survivor_calls) | set(dead_calls) == set(values)
    assert all(count == 1 for count in survivor_calls.values()), survivor_calls
    duplicates = set(dead_calls) & set(survivor_calls)
    # the call the process died in was never acknowledged: that record came back, after its lock expired
    assert dead_calls[1] in duplicates
    assert acknowledged.delivery_counts[2] >= len(duplicates)
    assert acknowledged.by_type["accepted"] == len(survivor_calls)
    assert acknowledged.by_type["released"] == 0


def test_a_record_that_kills_its_process_every_time_reaches_our_dlq_as_a_crash_loop(
    share: ShareKit, tmp_path: Path
) -> None:
    """`id-4` SIGKILLs whichever process handles it. Processes are started one after another (each after
    the last died), the group's delivery count limit is 4 and its lock 2 s: `id-4` reaches our DLQ as
    `delivery_limit` with its delivery count, handled only on deliveries 1-3; every other id is handled,
    none dead-lettered."""
    # a 2 s lock: a batch of redeliveries (a synchronous commit before each) ends well within it when loaded
    values = [v.decode() for v in share.setup(12, record_lock_duration_ms=2000, delivery_count_limit=4)]
    killer = "id-4"
    calls_file = tmp_path / "calls"
    app = share_app(share, lambda _r: None)  # provisions the tier and the DLQ
    dlq = Tail(share.kafka, app.topics(share.topic).dlq)
    process: subprocess.Popen[str] | None = None
    started = 0
    deadline = time.monotonic() + 60
    try:
        while not dlq.read() or {v for _pid, v in calls_in(calls_file)} != set(values):
            assert time.monotonic() < deadline, (calls_in(calls_file), dlq.records)
            if process is None or process.poll() is not None:
                process = start_share_process(share, calls_file, f"kill:{killer}")
                started += 1
            time.sleep(0.2)
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        dlq.close()
    [(dlq_value, headers)] = dlq.records
    assert (dlq_value, headers.dlq_reason, headers.original_offset) == (killer, "delivery_limit", 4)
    assert "delivered 4 times" in (headers.exception_message or "")
    handled = Counter(value for _pid, value in calls_in(calls_file))
    assert handled[killer] == 3
    assert set(handled) == set(values)
    assert started >= 4  # one per delivery of the killer, and the one that dead-lettered it
