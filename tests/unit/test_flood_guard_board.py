"""The flood guard seen and steered from outside (docs/flood-guard.md, "Seen and steered from outside"), on the
in-memory broker: a whole `RetryApp` with a guarded handler, signed with header keys, and its flood-guard topic.

Guarantees: each process reports its guard to the topic (on a change, and a tombstone when it stops); an
operator's command opens the guard of every running process, and of a process started later, and keeps it open
(no call, no probe) until a command closes it, after which every record is handled once and none is
dead-lettered; a forged command (unsigned, or signed with another key), a malformed one, and a copy of an old
command written again change nothing. Every byte read is untrusted: the records' decoder refuses anything a
guard or the operator's command does not write.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable

import pytest

from retrytopics import ConfigError, FloodGuard, KafkaConfig, Record, RetryApp, RetryPolicy
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.flood_guard import GuardState
from retrytopics.core.flood_records import (
    GuardAction,
    GuardCommand,
    GuardRecordError,
    GuardReport,
    ProcessLeft,
    board_view,
    decode_guard_record,
    encode_guard_record,
)
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys, verify_guard
from retrytopics.observe.events import Emitter
from retrytopics.runtime.clock import SYSTEM_CLOCK
from retrytopics.runtime.flood.board import GuardBoard
from retrytopics.runtime.flood.breaker import HandlerGuard
from retrytopics.testing import MemoryBroker, MemoryClientFactory

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
IDS = [f"id-{i:02d}" for i in range(20)]
DEADLINE_S = 20.0


def wait_until(done: Callable[[], object], timeout_s: float = DEADLINE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not done():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.dead: list[str] = []

    def handle(self, record: Record[bytes]) -> None:
        with self.lock:
            self.calls.append(record.value.decode())

    def on_dead_letter(self, record: Record[bytes], route: object) -> None:
        with self.lock:
            self.dead.append(record.value.decode())


def _app(broker: MemoryBroker, ledger: Ledger, instance: str) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9092"),
        group="billing",
        clients=MemoryClientFactory(broker),
        header_key=KEY,
        instance_id=instance,
        on_dead_letter=ledger.on_dead_letter,
    )
    app.handler("orders", policy=RetryPolicy(delays=["100ms"]), flood_guard=FloodGuard(backoff="100ms"))(ledger.handle)
    return app


def _command(broker: MemoryBroker, topic: str, action: GuardAction, at_ms: int, *, keys: HeaderKeys | None) -> None:
    command = GuardCommand(handler="orders", action=action, reason="gateway maintenance", by="ops@host", at_ms=at_ms)
    key, value, headers = encode_guard_record(command, topic, keys)
    broker.append(topic, value, key=key, headers=headers, partition=0)


def _reports(broker: MemoryBroker, topic: str) -> dict[str, GuardReport]:
    """The processes' latest reports, read as the guards read them: only the records that verify."""
    keys = HeaderKeys.of(KEY)
    signed = [m for m in broker.records(topic) if verify_guard(keys, topic, m.key, m.value, m.headers) is None]
    view = board_view(decode_guard_record(m.key, m.value) for m in signed)
    return {r.process: r for r in view.reports.values()}


def test_an_operators_command_reaches_every_process_and_a_forged_or_old_one_changes_nothing() -> None:
    # setup: two processes of one app running a guarded handler (the second its tiers only: one main consumer
    # keeps the in-memory group's stop quick), records to come on its source
    broker, ledger = MemoryBroker(), Ledger()
    broker.create_topic("orders", partitions=2)
    first = _app(broker, ledger, "replica-1")
    first.provision()
    topic = first.handlers["orders"].ctx.topics.flood_guard_topic
    keys = HeaderKeys.of(KEY)
    first.start(main=True, tiers="all")
    second = _app(broker, ledger, "replica-2")
    apps = [first, second]
    try:
        second.start(main=False, tiers="all")
        # then: each reports its guard closed
        assert wait_until(lambda: set(_reports(broker, topic)) == {"replica-1", "replica-2"})
        assert {r.state for r in _reports(broker, topic).values()} == {GuardState.CLOSED}

        # when: forged commands (unsigned; signed with a key the app does not have; not a command at all)
        _command(broker, topic, GuardAction.OPEN, 1_000, keys=None)
        _command(broker, topic, GuardAction.OPEN, 1_001, keys=HeaderKeys.of(OTHER_KEY))
        broker.append(topic, b'{"v":1,"action":"explode"}', key=b"command/orders", partition=0)
        # and: an operator's signed command to open it
        _command(broker, topic, GuardAction.OPEN, 2_000, keys=keys)
        # then: both processes report it open by hand, with the operator's reason; the forged ones were skipped
        assert wait_until(
            lambda: [(r.state, r.forced) for r in _reports(broker, topic).values()] == [(GuardState.OPEN, True)] * 2
        )
        assert all("gateway maintenance" in r.reason for r in _reports(broker, topic).values())
        assert wait_until(lambda: all(a._guard_board is not None and a._guard_board.skipped >= 3 for a in apps))

        # when: records arrive and a process starts later: it starts open too, and nothing is called
        for record_id in IDS:
            broker.append("orders", record_id.encode(), key=record_id.encode())
        third = _app(broker, ledger, "replica-3")
        apps.append(third)
        third.start(main=False, tiers="all")
        assert wait_until(lambda: _reports(broker, topic).get("replica-3", None) is not None)
        assert (_reports(broker, topic)["replica-3"].state, _reports(broker, topic)["replica-3"].forced) == (
            GuardState.OPEN,
            True,
        )
        assert not wait_until(lambda: ledger.calls, timeout_s=0.5), "a guard opened by hand let a call through"
        assert all(r.refused >= 0 for r in _reports(broker, topic).values())

        # when: a copy of an old command closing it is written (older than the one applied): still open
        _command(broker, topic, GuardAction.CLOSE, 1_500, keys=keys)
        assert not wait_until(lambda: ledger.calls, timeout_s=0.5)

        # when: the operator closes it
        _command(broker, topic, GuardAction.CLOSE, 3_000, keys=keys)
        # then: every record handled once, none dead-lettered, every process reports it closed
        assert wait_until(lambda: sorted(ledger.calls) == IDS)
        assert wait_until(lambda: {r.state for r in _reports(broker, topic).values()} == {GuardState.CLOSED})
        report = _reports(broker, topic)["replica-1"]
        assert report.openings == 1 and not report.forced and report.open_ms >= 0
    finally:
        for app in apps:
            app.stop()
    assert ledger.dead == [] and sorted(ledger.calls) == IDS
    # and: every process that stopped cleanly left the board (its report's tombstone)
    assert _reports(broker, topic) == {}


def test_the_records_decoder_refuses_what_no_guard_or_operator_writes() -> None:
    report = GuardReport(
        handler="orders",
        process="pod-1",
        state=GuardState.OPEN,
        forced=False,
        reason="failure_ratio",
        at_ms=5,
        changed_at_ms=4,
        openings=1,
        probes=2,
        refused=30,
        deferred=0,
        open_ms=1_000,
    )
    command = GuardCommand(handler="orders", action=GuardAction.CLOSE, reason="back", by="ops", at_ms=9)
    for record in (report, command, ProcessLeft(handler="orders", process="pod-1")):
        key, value, _ = encode_guard_record(record, "orders.billing.guard", None)
        assert decode_guard_record(key, value) == record
    good_key, good_value, _ = encode_guard_record(command, "t", None)
    body = json.loads(good_value or b"")
    bad: list[tuple[bytes | None, bytes | None]] = [
        (None, good_value),
        (b"x" * 600, good_value),
        (b"\xff", good_value),
        (b"other/orders", good_value),
        (b"command/../x", good_value),
        (good_key, None),
        (good_key, b"not json"),
        (good_key, b"[" * 1500 + b"]" * 1500),
        (good_key, json.dumps({**body, "v": 2}).encode()),
        (good_key, json.dumps({**body, "extra": 1}).encode()),
        (good_key, json.dumps({**body, "action": "delete"}).encode()),
        (good_key, json.dumps({**body, "reason": "line\nbreak"}).encode()),
        (good_key, json.dumps({**body, "reason": "r" * 201}).encode()),
        (good_key, json.dumps({**body, "at_ms": -1}).encode()),
        (good_key, json.dumps({**body, "at_ms": True}).encode()),
        (good_key, json.dumps({**body, "at_ms": 1.5}).encode()),
        (b"report/orders/pod 1", None),
        (b"report/orders/pod-1", good_value),
    ]
    for key, value in bad:
        with pytest.raises(GuardRecordError):
            decode_guard_record(key, value)


def test_a_guard_topic_just_made_is_read_again_and_a_missing_one_fails_the_start_naming_it() -> None:
    """A partition just created answers NOT_LEADER_FOR_PARTITION for a moment (seen on Apache Kafka right after
    `provision()`): the first read is asked again; a missing topic fails at once, naming `flood_guard_topic`."""
    answers: list[Exception] = [KafkaClientError("no leader yet", code="NOT_LEADER_FOR_PARTITION")] * 2

    def read(topic: str, partitions: object, timeout_s: float) -> list[Message]:
        if answers:
            raise answers.pop(0)
        return []

    def board(reader: Callable[[str, object, float], list[Message]]) -> GuardBoard:
        guard = HandlerGuard("orders", FloodGuard(), emitter=Emitter([]), clock=SYSTEM_CLOCK, rng=random.Random(1))
        broker = MemoryBroker()
        broker.create_topic("orders.billing.guard")  # where the started board's thread writes its report
        factory = MemoryClientFactory(broker)
        return GuardBoard(
            {"orders": guard},
            {"orders": "orders.billing.guard"},
            process="p",
            producer=lambda: factory.producer(None, {}),
            feed=factory.key_state_feed,
            read=reader,
            keys=None,
            wall_ms=SYSTEM_CLOCK.now_ms,
            stop=stop,
        )

    stop = threading.Event()
    started = board(read)
    try:
        started.start(5.0)
        assert answers == []  # asked until it answered
    finally:
        stop.set()
        started.join(5.0)

    def missing(topic: str, partitions: object, timeout_s: float) -> list[Message]:
        raise KafkaClientError(f"cannot read {topic}: it does not exist", code="UNKNOWN_TOPIC_OR_PART")

    with pytest.raises(ConfigError, match="flood_guard_topic"):
        board(missing).start(5.0)
