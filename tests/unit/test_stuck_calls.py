"""No stuck call hides, and a stop always ends in a bound (issues 22.2, 21.9), without a broker:

- a client call that outlives its bound is abandoned in its thread (runtime/bounded.py), and the
  transactional publisher then goes on with a new producer, unhealthy until a transaction commits; a
  commit abandoned that way is reported as of unknown outcome, never as aborted;
- a handler call past `max.poll.interval.ms` makes the app unhealthy and is counted abandoned while it runs,
  once, on the in-memory broker;
- `run_until_stopped` returns within its bound after SIGTERM, or at once on a second one, with a handler
  that never returns, and nothing of that record is committed.

The same on Apache Kafka: runtime/test_stuck_calls.py and runtime/test_signals.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import KafkaConfig, Record, RetryApp
from retrytopics.client_factory import MemoryClientFactory
from retrytopics.core.errors import KafkaClientError
from retrytopics.memory import MemoryBroker
from retrytopics.observe.events import Emitter
from retrytopics.runtime.bounded import BoundedCalls, BoundedCommits, CallAbandoned
from retrytopics.runtime.handoff.transactional import TransactionalPublisher, TransactionOutcomeUnknown

KAFKA = KafkaConfig(bootstrap="127.0.0.1:9")


def _eventually(done: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_call_past_its_bound_is_abandoned_and_the_next_runs_on_a_fresh_thread() -> None:
    calls = BoundedCalls(timeout_s=0.2, name="test")
    forever = threading.Event()
    started = time.monotonic()
    with pytest.raises(CallAbandoned, match=r"stuck did not return within 0\.2 s"):
        calls.call("stuck", forever.wait)
    assert time.monotonic() - started < 2
    assert calls.call("quick", lambda x: x + 1, 41) == 42
    with pytest.raises(KafkaClientError, match="refused"):
        calls.call("failing", _raise, KafkaClientError("refused", code="X"))
    forever.set()


def _raise(exc: BaseException) -> None:
    raise exc


class _CommitBlocks:
    """A consumer whose synchronous commit waits for `release`."""

    max_poll_interval_ms = 300_000

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.committed: list[dict[Any, int]] = []
        self.closed = False

    def commit(self, offsets: dict[Any, int], *, asynchronous: bool) -> None:
        if not asynchronous:
            self.release.wait()
        self.committed.append(dict(offsets))

    def close(self) -> None:
        self.closed = True


def test_a_stuck_synchronous_commit_is_abandoned_and_its_consumer_closed_only_once_it_returned() -> None:
    release = threading.Event()
    consumer = _CommitBlocks(release)
    bounded = BoundedCommits(consumer, BoundedCalls(timeout_s=0.1, name="test"))  # type: ignore[arg-type]
    bounded.commit({("orders", 0): 1}, asynchronous=True)
    with pytest.raises(CallAbandoned):
        bounded.commit({("orders", 0): 2}, asynchronous=False)
    bounded.close()
    assert not consumer.closed  # the commit's thread is still inside it
    release.set()
    _eventually(lambda: len(consumer.committed) == 2)
    bounded.close()
    assert consumer.closed


class _StuckOn:
    """A memory broker's transactional producer whose named call blocks until `release` is set."""

    def __init__(self, broker: MemoryBroker, stuck: str, release: threading.Event, made: list[Any]) -> None:
        self._producer = broker.producer(transactional_id="billing-1")
        self._stuck = stuck if not made else ""  # only the first producer gets stuck
        self._release = release
        made.append(self)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._producer, name)
        if name != self._stuck:
            return target

        def stuck(*args: Any) -> Any:
            self._release.wait()
            return target(*args)

        return stuck


def _publisher(broker: MemoryBroker, stuck: str, release: threading.Event, made: list[Any]) -> TransactionalPublisher:
    return TransactionalPublisher(
        lambda: _StuckOn(broker, stuck, release, made),
        Emitter(),
        timeout_s=0.1,  # type: ignore[arg-type,return-value]
        consumer="billing:main",
    )


def _group_member(broker: MemoryBroker) -> object:
    consumer = broker.consumer("billing")
    consumer.subscribe(["orders"], on_assign=lambda tps: None, on_revoke=lambda tps: None, on_lost=lambda tps: None)
    consumer.consume(10, 0)
    return consumer.group_metadata()


def test_stuck_offsets_abandon_the_producer_and_the_next_transaction_runs_on_a_new_one() -> None:
    broker, release, made = MemoryBroker(), threading.Event(), []
    broker.create_topics(["orders", "out"])
    member = _group_member(broker)
    publisher = _publisher(broker, "send_offsets_to_transaction", release, made)
    publisher.begin()

    started = time.monotonic()
    with pytest.raises(CallAbandoned):
        publisher.commit({("orders", 0): 1}, member)
    assert time.monotonic() - started < 2  # 0.1 s + 1 s of grace
    assert not publisher.healthy and broker.committed("billing") == {}

    publisher.begin()  # a new producer with the same transactional id
    publisher.commit({("orders", 0): 1}, member)
    assert len(made) == 2 and publisher.healthy and broker.committed("billing") == {("orders", 0): 1}
    release.set()


def test_a_producer_whose_start_is_stuck_fails_the_publisher_start_within_its_bound() -> None:
    broker, release, made = MemoryBroker(), threading.Event(), []
    started = time.monotonic()
    with pytest.raises(CallAbandoned, match="init_transactions"):
        TransactionalPublisher(
            lambda: _StuckOn(broker, "init_transactions", release, made),
            Emitter(),  # type: ignore[arg-type,return-value]
            start_timeout_s=0.1,
        )
    assert time.monotonic() - started < 2
    release.set()


def test_a_replacement_that_cannot_start_leaves_the_next_transaction_to_try_again() -> None:
    """A fenced producer is replaced at once; when the new one cannot start (no answer), the abort does not
    raise (it ran in a rebalance callback, where that stopped the app): the next transaction tries again."""
    broker = MemoryBroker()
    made: list[object] = []

    def make() -> Any:
        made.append(None)
        producer = broker.producer(transactional_id="billing-1")
        if len(made) == 2:
            producer.init_transactions = _raise_timeout  # type: ignore[method-assign]
        return producer

    publisher = TransactionalPublisher(make, Emitter(), timeout_s=0.1)
    publisher.begin()
    publisher.abort(KafkaClientError("fenced", code="_FENCED", fatal=True))
    assert not publisher.healthy and len(made) == 2
    publisher.begin()
    publisher.commit({}, None)
    assert publisher.healthy and len(made) == 3


def _raise_timeout(timeout_s: float) -> None:
    raise KafkaClientError("Timed out", code="_TIMED_OUT", retriable=True)


def test_a_stuck_commit_is_of_unknown_outcome_not_aborted() -> None:
    broker, release, made = MemoryBroker(), threading.Event(), []
    broker.create_topics(["orders", "out"])
    publisher = _publisher(broker, "commit_transaction", release, made)
    publisher.begin()
    with pytest.raises(TransactionOutcomeUnknown):
        publisher.commit({}, None)
    assert not publisher.healthy
    release.set()


class _CommitTimesOut:
    """A memory broker's transactional producer whose commit times out in librdkafka (retriable) `times` times."""

    def __init__(self, broker: MemoryBroker, times: int) -> None:
        self._producer = broker.producer(transactional_id="billing-1")
        self.times = times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def commit_transaction(self, timeout_s: float) -> None:
        if self.times:
            self.times -= 1
            raise KafkaClientError("Timed out", code="_TIMED_OUT", retriable=True)
        self._producer.commit_transaction(timeout_s)


def test_a_commit_that_times_out_in_librdkafka_is_asked_again_and_commits() -> None:
    broker = MemoryBroker()
    broker.create_topics(["orders", "out"])
    member = _group_member(broker)
    producer = _CommitTimesOut(broker, times=2)
    publisher = TransactionalPublisher(lambda: producer, Emitter(), timeout_s=0.1)  # type: ignore[arg-type,return-value]
    publisher.begin()
    publisher.commit({("orders", 0): 1}, member)
    assert producer.times == 0 and publisher.healthy and broker.committed("billing") == {("orders", 0): 1}


def _stuck_app(broker: MemoryBroker, entered: threading.Event, release: threading.Event, **options: Any) -> RetryApp:
    app = RetryApp(kafka=KAFKA, group="billing", clients=MemoryClientFactory(broker), **options)

    @app.handler("orders")
    def handle(record: Record[bytes]) -> None:
        if record.value == b"stuck":
            entered.set()
            release.wait()

    app.provision()
    return app


def test_a_handler_call_past_the_poll_interval_is_unhealthy_and_counted_abandoned_once_while_it_runs() -> None:
    broker, entered, release = MemoryBroker(), threading.Event(), threading.Event()
    broker.create_topic("orders")
    broker.append("orders", b"stuck")
    app = _stuck_app(broker, entered, release, consumer_overrides={"max.poll.interval.ms": 300})
    app.start(main=True)
    try:
        assert entered.wait(10)
        _eventually(lambda: not app.healthy and app.stats.abandoned == 1)
        release.set()
        _eventually(lambda: app.healthy)
    finally:
        release.set()
        assert app.stop(10)
    assert app.stats.abandoned == 1  # not counted again when the call returned


def _sigterm_once_handled(original: Any, count: int) -> None:
    """SIGTERM to this process `count` times, each once `run_until_stopped` handles it (`original`, the handler
    before, would end the test process)."""
    deadline = time.monotonic() + 10
    while signal.getsignal(signal.SIGTERM) is original and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(count):
        if signal.getsignal(signal.SIGTERM) is original:
            return  # never installed, or already restored: run_until_stopped returned
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)


@pytest.mark.parametrize("second_signal", [False, True], ids=["bound", "second-sigterm"])
def test_sigterm_with_a_handler_that_never_returns_stops_waiting_in_its_bound(
    second_signal: bool, caplog: pytest.LogCaptureFixture
) -> None:
    broker, entered, release = MemoryBroker(), threading.Event(), threading.Event()
    broker.create_topic("orders")
    broker.append("orders", b"ok")
    broker.append("orders", b"stuck")
    app = _stuck_app(broker, entered, release)
    app.start(main=True)
    runner = app._runner
    try:
        assert entered.wait(10)
        threading.Thread(
            target=_sigterm_once_handled,
            args=(signal.getsignal(signal.SIGTERM), 2 if second_signal else 1),
            daemon=True,
        ).start()
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="retrytopics"):
            runner.run_until_stopped(stop_timeout_s=60.0 if second_signal else 0.5)
        waited = time.monotonic() - started
        assert waited < 5, waited
        assert app.running  # the stuck loop was left behind
        assert any("did not stop" in r.getMessage() for r in caplog.records)
        # nothing past the stuck record is committed (the first record may be, or not yet)
        assert broker.committed("billing").get(("orders", 0), 0) <= 1
    finally:
        release.set()
        assert app.wait(10)
