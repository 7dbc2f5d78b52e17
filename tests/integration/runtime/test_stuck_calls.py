"""No stuck call hides, on Apache Kafka: a frozen or dead broker, a handler past the poll
interval.

Guarantees:

- exactly-once, broker frozen (SIGSTOP) with a transaction open: `healthy` turns False within the call bound
  (5 s, plus 1 s of grace: runtime/bounded.py), and the batch's commit holds the loop no longer than the
  commit's deadline (`commit_transaction` asked again while librdkafka reports a retriable error, as its own
  timeout at a coordinator's failover: runtime/handoff/transactional.py) plus one call bound: the call is
  abandoned at its bound and the transaction aborted (the app goes on), or librdkafka's own timeout comes
  first each time until the deadline and the outcome is unknown (the consumer stops with
  `TransactionOutcomeUnknown`, and is restarted): which of the two is a race. After SIGCONT the batch is
  handled again on a new producer and committed: each record in the tier once (read_committed), the source
  committed to its end, healthy again;
- at-least-once, broker frozen during a handler call long enough for the loop to ask the group coordinator
  whether it still owns the partition (a synchronous commit, which librdkafka waits for without a bound):
  the question is given up within the call bound, the batch ends, and the offset is committed after SIGCONT;
- a broker that dies after the group join turns `healthy` False once the client reports the assignment lost
  (`session.timeout.ms` without an answer), and True again after the broker is back and the group rejoined;
- a handler call past `max.poll.interval.ms` turns `healthy` False and is counted abandoned while it runs;
  when it returns, its record is not handed off here, and it is handled again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from retrytopics import Event, Record, RetryApp, RetryPolicy
from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.config import KafkaConfig
from retrytopics.runtime.handoff.transactional import COMMIT_DEADLINE_S, TransactionOutcomeUnknown

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
#: the documented bound on one transactional call (runtime/handoff/transactional.py), with room for a busy machine
CALL_BOUND_S = 6.0


@pytest.fixture(scope="module")
def module_broker() -> Iterator[ApacheKafkaBroker]:
    with ApacheKafkaBroker() as started:
        try:
            yield started
        finally:
            if started.pid is not None:
                os.kill(started.pid, signal.SIGCONT)  # a frozen broker would not stop


@pytest.fixture
def own_broker(module_broker: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    """The module's broker, which each test may freeze or kill: one JVM start for the module, not one per
    test; each test leaves it running and thawed (names are unique per test, so nothing of one test's
    topics, groups or transactional ids meets another's)."""
    yield module_broker
    if module_broker.pid is None:
        module_broker.start()
    else:
        os.kill(module_broker.pid, signal.SIGCONT)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[float, Event, dict[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.seen.append((time.monotonic(), event, dict(data)))

    def at(self, event: Event, after: float) -> list[float]:
        return [at for at, e, _ in self.seen if e is event and at >= after]


def test_a_frozen_broker_never_holds_an_exactly_once_commit_past_the_call_bound(
    own_broker: ApacheKafkaBroker, unique_name: Any
) -> None:
    # setup: exactly-once main consumer; every record fails (to the tier: a first hand-off reads the tier's
    # metadata, so that b's commit is the first call to meet the frozen broker); b's handler waits for the freeze
    kafka = own_broker.kafka_config()
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    events = Events()
    frozen, handled = threading.Event(), threading.Event()

    def exactly_once_app() -> RetryApp:
        app = RetryApp(
            kafka=kafka,
            group=group,
            consumer_overrides=CONSUMER,
            exactly_once=True,
            instance_id="replica-1",
            hooks=[events],
        )

        @app.handler(source, policy=RetryPolicy(delays=["200ms"]))
        def handle(record: Record[bytes]) -> None:
            if record.value == b"b" and not frozen.is_set():
                handled.set()
                assert frozen.wait(30)
            raise RuntimeError(f"{record.value!r} fails")

        return app

    app = exactly_once_app()
    app.provision()
    tier = app.topics(source).tiers[0].topic
    kit.produce(source, [(None, b"a", [])])
    app.start(main=True)
    try:
        wait_until(lambda: kit.committed(group, source, 1) == {0: 1}, 60, "record a committed")
        assert app.healthy
        kit.produce(source, [(None, b"b", [])])
        assert handled.wait(30)

        # when: the broker freezes while b's transaction is open; the handler returns, the batch ends
        assert own_broker.pid is not None
        os.kill(own_broker.pid, signal.SIGSTOP)
        released = time.monotonic()
        frozen.set()

        # then: the app says so within the call bound, and gives up on the commit by the commit's deadline
        wait_until(lambda: not app.healthy, 2 * CALL_BOUND_S, "the app to report itself unhealthy")
        given_up = COMMIT_DEADLINE_S + 2 * CALL_BOUND_S  # a call's bound past the deadline, room for a busy machine
        wait_until(
            lambda: events.at(Event.TRANSACTION_ABORTED, released) or app.error is not None,
            given_up,
            "the transaction aborted, or the consumer stopped on its unknown outcome",
        )
        if app.error is None:  # a call abandoned at its bound: aborted, and the app goes on
            aborted_after = events.at(Event.TRANSACTION_ABORTED, released)[0] - released
            print(f"the frozen commit was given up after {aborted_after:.1f} s")
            assert aborted_after < given_up
            assert not app.healthy and app.running
        else:  # librdkafka's own timeout each time until the deadline: of unknown outcome, the consumer stops
            assert isinstance(app.error, TransactionOutcomeUnknown), app.error
            print(f"the frozen commit's outcome was unknown after {time.monotonic() - released:.1f} s")

        # when: the broker wakes up (a consumer stopped on an unknown outcome is restarted, as an operator would)
        os.kill(own_broker.pid, signal.SIGCONT)
        if app.error is not None:
            assert app.stop(30)
            app = exactly_once_app()
            app.start(main=True)
        wait_until(lambda: kit.committed(group, source, 1) == {0: 2}, 90, "record b's batch committed")
        wait_until(lambda: app.healthy, 30, "the app healthy again")
    finally:
        os.kill(own_broker.pid or 0, signal.SIGCONT)
        assert app.stop(30)

    # then: a and b reached the tier once each
    assert [r.value for r in kit.read_all(tier)] == [b"a", b"b"]


def test_a_frozen_broker_never_holds_the_ownership_question_past_the_call_bound(
    own_broker: ApacheKafkaBroker, unique_name: Any
) -> None:
    # setup: at-least-once; record "slow"'s call lasts longer than half the session (3 s), so that the loop
    # then asks the group coordinator (a synchronous commit) whether it still owns the partition
    kafka = own_broker.kafka_config()
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    events = Events()
    frozen, entered = threading.Event(), threading.Event()
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=CONSUMER, hooks=[events])

    @app.handler(source)
    def handle(record: Record[bytes]) -> None:
        if record.value == b"slow" and not frozen.is_set():
            started = time.monotonic()
            entered.set()
            assert frozen.wait(30)
            time.sleep(max(0.0, 3.5 - (time.monotonic() - started)))

    app.provision()
    kit.produce(source, [(None, b"a", [])])
    app.start(main=True)
    try:
        wait_until(lambda: kit.committed(group, source, 1) == {0: 1}, 60, "record a committed")
        kit.produce(source, [(None, b"slow", [])])
        assert entered.wait(30)

        # when: the broker freezes during the call
        assert own_broker.pid is not None
        os.kill(own_broker.pid, signal.SIGSTOP)
        frozen.set()
        returned = time.monotonic() + 3.5

        # then: the question is given up within the call bound, and the loop ends its batch
        wait_until(lambda: events.at(Event.RECORDS_HANDLED, returned - 3.5), 3 * CALL_BOUND_S, "the batch to end")
        ended_after = events.at(Event.RECORDS_HANDLED, returned - 3.5)[0] - returned
        print(f"the batch ended {ended_after:.1f} s after the call returned, the broker frozen")
        assert ended_after < 2 * CALL_BOUND_S

        # when: the broker wakes up; then: slow's offset is committed
        os.kill(own_broker.pid, signal.SIGCONT)
        wait_until(lambda: kit.committed(group, source, 1) == {0: 2}, 90, "record slow committed")
    finally:
        os.kill(own_broker.pid or 0, signal.SIGCONT)
        assert app.stop(30)


def test_a_dead_broker_turns_health_false_until_it_is_back(own_broker: ApacheKafkaBroker, unique_name: Any) -> None:
    kafka = own_broker.kafka_config()
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=CONSUMER)
    app.handler(source)(lambda record: None)
    app.provision()
    kit.produce(source, [(None, b"a", [])])
    app.start(main=True)
    try:
        wait_until(lambda: kit.committed(group, source, 1) == {0: 1}, 60, "record a committed")
        assert app.healthy

        # when: the broker dies; then: unhealthy once the client reports the assignment lost
        own_broker.kill()
        wait_until(lambda: not app.healthy, 30, "the app to report itself unhealthy")

        # when: it is back; then: healthy once the group is joined again, and the loop goes on
        own_broker.start()
        wait_until(lambda: app.healthy, 60, "the app healthy again")
        kit = Kit(own_broker.kafka_config())
        kit.produce(source, [(None, b"b", [])])
        wait_until(lambda: kit.committed(group, source, 1) == {0: 2}, 60, "record b committed")
    finally:
        assert app.stop(30)


def test_a_handler_past_the_poll_interval_is_unhealthy_and_counted_abandoned_while_it_runs(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Any,
    apps: list[RetryApp],
) -> None:
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    release, calls = threading.Event(), []
    app = RetryApp(kafka=kafka, group=group, consumer_overrides={**CONSUMER, "max.poll.interval.ms": 6000})
    apps.append(app)

    @app.handler(source, policy=RetryPolicy(delays=["200ms"]))
    def handle(record: Record[bytes]) -> None:
        calls.append(record.value)
        if len(calls) == 1:
            release.wait(60)
        raise RuntimeError("fails")

    app.provision()
    kit.produce(source, [(None, b"slow", [])])
    app.start(main=True, tiers="all")
    try:
        # when: the first call outlives max.poll.interval.ms (6 s)
        wait_until(lambda: calls, 60, "the first call")
        wait_until(lambda: not app.healthy, 30, "the app to report itself unhealthy")
        wait_until(lambda: app.stats.abandoned == 1, 10, "the call counted abandoned")
        assert len(calls) == 1  # counted while it runs
    finally:
        release.set()
    # then: not handed off by the expelled member; read again, handed off once, healthy again
    wait_until(lambda: app.stats.retried == 1, 60, "the record handled again and retried once")
    wait_until(lambda: app.healthy, 30, "the app healthy again")
    assert app.stats.abandoned == 1
    assert [r.value for r in kit.read_all(app.topics(source).tiers[0].topic)] == [b"slow"]
