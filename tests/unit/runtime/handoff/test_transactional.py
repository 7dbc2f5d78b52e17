"""The transactional publisher (runtime/handoff/transactional.py) goes on after a stuck call: a producer call
that outlives its bound (runtime/bounded.py) is abandoned with its producer, and the next transaction runs
on a new one, unhealthy until a transaction commits; a commit abandoned that way is reported as of unknown
outcome, never as aborted; a commit that times out in librdkafka is asked again. On the in-memory broker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from retrytopics.core.errors import KafkaClientError
from retrytopics.observe.events import Emitter
from retrytopics.runtime.bounded import CallAbandoned
from retrytopics.runtime.handoff.transactional import TransactionalPublisher, TransactionOutcomeUnknown
from retrytopics.testing import MemoryBroker


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


class _OffsetsFail:
    """A memory broker's transactional producer whose first `send_offsets_to_transaction` raises `error`; it
    counts its aborts."""

    def __init__(self, broker: MemoryBroker, error: KafkaClientError | None, made: list[Any]) -> None:
        self._producer = broker.producer(transactional_id="billing-1")
        self.error = error
        self.aborts = 0
        made.append(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: object, timeout_s: float) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error
        self._producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self.aborts += 1
        self._producer.abort_transaction(timeout_s)


@pytest.mark.parametrize(
    ("error", "replaced"),
    [
        (KafkaClientError("rebalanced", code="ILLEGAL_GENERATION", abortable=True), False),
        (KafkaClientError("Timed out", code="_TIMED_OUT", retriable=True), True),
        (KafkaClientError("unknown state", code="INVALID_TXN_STATE"), True),
    ],
    ids=["abortable", "timed_out", "neither"],
)
def test_a_failed_offsets_call_aborts_on_its_producer_only_when_abortable_else_a_new_one_fences_it(
    error: KafkaClientError, replaced: bool
) -> None:
    """librdkafka has no Transactions V2 (KIP-890): a stale request of a finished transaction is fenced only by a
    new epoch. So after a call that timed out, or failed neither abortably nor retriably (taken as fatal), the
    producer is never used again: a new one (`init_transactions`, same transactional id) runs the next
    transaction, and the failed one's transaction is not committed. An abortable failure (`txn_requires_abort`)
    aborts on the same producer. Either way nothing of the failed transaction is committed, and the next
    transaction commits."""
    broker, made = MemoryBroker(), []
    broker.create_topics(["orders", "out"])
    member = _group_member(broker)
    publisher = TransactionalPublisher(
        lambda: _OffsetsFail(broker, error if not made else None, made),  # type: ignore[arg-type,return-value]
        Emitter(),
        timeout_s=0.1,
    )
    publisher.begin()
    publisher.send_record("out", key=b"k", value=b"first", partition=0)

    with pytest.raises(KafkaClientError):
        publisher.commit({("orders", 0): 1}, member)
    publisher.end_abandoned()  # what a rewind does before reading key state: the new producer now, if any

    first = made[0]
    assert (len(made) == 2) is replaced and first.aborts == (0 if replaced else 1)
    assert broker.records("out") == [] and broker.committed("billing") == {}
    publisher.begin()
    publisher.send_record("out", key=b"k", value=b"second", partition=0)
    publisher.commit({("orders", 0): 1}, member)
    assert [m.value for m in broker.records("out")] == [b"second"] and broker.committed("billing") == {("orders", 0): 1}
    assert publisher.healthy
