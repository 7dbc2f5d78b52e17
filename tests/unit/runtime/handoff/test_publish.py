"""Publishing a record too large for the producer: two steps down to the DLQ, never a retry loop;
a batch the broker refuses for one record dead-letters that record alone."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import DlqReason, Header
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import InboundRecord, RouteContext, RouteKind, route
from retrytopics.observe.events import Emitter
from retrytopics.runtime.handoff.publish import Publisher, PublishJob, too_large_fallback
from retrytopics.runtime.handoff.transactional import TransactionalPublisher
from retrytopics.testing import MemoryBroker

CTX = RouteContext(policy=RetryPolicy(delays=["5s"]), topics=topics_for("orders", "billing", (5_000,)), group="billing")
T0 = 1_700_000_000_000


class SizeLimitedProducer:
    """Refuses at once, like librdkafka's local `message.max.bytes` check, records larger than `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.written: list[tuple[str, bytes | None, bytes | None, tuple[Header, ...]]] = []

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: Callable[[PublishError | None], None],
    ) -> None:
        size = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)
        if size > self.limit:
            raise KafkaClientError("Broker: Message size too large", code="MSG_SIZE_TOO_LARGE")
        self.written.append((topic, key, value, tuple(headers)))
        on_delivery(None)

    def poll(self, timeout_s: float) -> None:
        pass

    def partition_count(self, topic: str) -> int:
        return 1


def _job(value: bytes, user: tuple[Header, ...]) -> PublishJob:
    record = InboundRecord(topic="orders", partition=0, offset=7, timestamp_ms=T0, key=b"k", headers=user)
    r = route(CTX, record, RuntimeError("m" * 1000), now_ms=T0, rng=random.Random(0))
    assert r.kind is RouteKind.TIER
    return PublishJob(
        route=r,
        key=b"k",
        value=value,
        source=("orders", 0),
        offset=7,
        shrink=too_large_fallback(CTX),
    )


@pytest.mark.parametrize(
    ("value_size", "user", "step"),
    [(99_000, (("trace", b"t" * 100),), 1), (99_500, (("trace", b"t" * 2_000),), 2)],
)
def test_a_too_large_republish_is_dead_lettered_in_at_most_two_steps(
    value_size: int, user: tuple[Header, ...], step: int
) -> None:
    # setup: a 100,000-byte limit; the retry headers (with a 1 KB message and a trace) push the record over it
    producer, acked = SizeLimitedProducer(100_000), []
    publisher = Publisher(lambda: producer, Emitter(), wait=lambda _: 0.0)  # type: ignore[arg-type,return-value]
    value = b"v" * value_size

    # when
    publisher.send(_job(value, user))
    for _ in range(3):  # each smaller record goes out from the next poll, without a back-off
        acked.extend(publisher.poll())

    # then: acknowledged, in the DLQ as too_large, the partition is not held
    assert len(acked) == 1 and publisher.healthy and not publisher.is_failing(("orders", 0))
    topic, key, written, headers = producer.written[0]
    assert (topic, acked[0].route.reason) == (CTX.topics.dlq, DlqReason.TOO_LARGE)
    names = dict(headers)
    assert names["retry.dlq_reason"] == b"too_large" and names["retry.exception_type"] == b"builtins.RuntimeError"
    assert names["retry.exception_message"] == b"" and names["retry.exception_trace"] == b""
    if step == 1:  # the exception details were enough: value and user headers kept
        assert (written, key, names["trace"]) == (value, b"k", user[0][1])
    else:  # the value became a reference, the user headers went
        assert json.loads(written or b"") == {
            "too_large": True,
            "topic": "orders",
            "partition": 0,
            "offset": 7,
            "value_bytes": value_size,
        }
        assert "trace" not in names


def test_a_record_too_large_even_as_a_reference_is_retried_not_dropped() -> None:
    producer, acked = SizeLimitedProducer(10), []
    publisher = Publisher(lambda: producer, Emitter(), wait=lambda _: 60.0)  # type: ignore[arg-type,return-value]
    publisher.send(_job(b"v", ()))
    for _ in range(3):
        acked.extend(publisher.poll())
    assert acked == [] and publisher.is_failing(("orders", 0)) and publisher.in_flight == 1


class BatchingProducer:
    """Like librdkafka against a broker whose `topic` takes at most `limit` bytes a batch: records wait for
    `poll`, which sends them as one batch (of `batch` records at most) and reports the broker's refusal of a
    batch on every record of it. A produce from inside a delivery report fails the test (confluent-kafka's
    callback state does not survive a client call made there)."""

    def __init__(self, topic: str, limit: int, batch: int) -> None:
        self.topic, self.limit, self.batch = topic, limit, batch
        self.queued: list[tuple[tuple[str, bytes | None, bytes | None], Callable[[PublishError | None], None]]] = []
        self.written: list[tuple[str, bytes | None, bytes | None]] = []
        self.reporting = False

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: Callable[[PublishError | None], None],
    ) -> None:
        assert not self.reporting, "produce() called from inside a delivery report"
        self.queued.append(((topic, key, value), on_delivery))

    def poll(self, timeout_s: float) -> None:
        while self.queued:
            batch, self.queued = self.queued[: self.batch], self.queued[self.batch :]
            refused = sum(len(v or b"") for (t, _, v), _ in batch if t == self.topic) > self.limit
            self.reporting = True
            for record, report in batch:
                if not refused:
                    self.written.append(record)
                report(
                    PublishError(record[0], "Broker: Message size too large", code="MSG_SIZE_TOO_LARGE")
                    if refused
                    else None
                )
            self.reporting = False

    def partition_count(self, topic: str) -> int:
        return 1


def test_a_batch_refused_for_one_record_dead_letters_that_record_alone() -> None:
    # setup: a tier taking 20,000 bytes a batch; seven jobs of one partition, the 4th 30,000 bytes
    tier, dlq = CTX.topics.tiers[0].topic, CTX.topics.dlq
    batched, alone, acked = BatchingProducer(tier, 20_000, batch=100), BatchingProducer(tier, 20_000, batch=1), []
    publisher = Publisher(
        lambda: batched,
        Emitter(),
        make_alone_producer=lambda: alone,  # type: ignore[arg-type,return-value]
        wait=lambda _: 60.0,
    )
    values = [b"v" * 30_000 if i == 3 else f"small-{i}".encode() for i in range(7)]

    # when: all seven are sent before the producer is polled, so they share a batch, then a few polls
    for value in values:
        publisher.send(_job(value, ()))
    for _ in range(4):
        acked.extend(publisher.poll())

    # then: the six small ones reach the tier, alone and unchanged; only the big one is dead-lettered
    assert batched.written == []
    assert sorted(alone.written) == sorted(
        [(tier, b"k", v) for i, v in enumerate(values) if i != 3] + [(dlq, b"k", values[3])]
    )
    assert sorted(j.route.reason or "" for j in acked) == [""] * 6 + [DlqReason.TOO_LARGE]
    assert publisher.in_flight == 0 and publisher.healthy


class FencedAbortableProducer(SizeLimitedProducer):
    """A transactional producer fenced the way tansu reports it: PRODUCER_FENCED without the fatal flag, so
    librdkafka treats it as abortable, and an abort then hangs until its timeout."""

    def __init__(self, made: list[FencedAbortableProducer]) -> None:
        super().__init__(10**9)
        self.fenced = not made  # the first producer is the one another producer fenced
        self.aborts = 0
        made.append(self)

    def produce(self, topic: str, *, on_delivery: Callable[[PublishError | None], None], **kwargs: Any) -> None:
        if self.fenced:
            on_delivery(
                PublishError(topic, "There is a newer producer with the same transactionalId", code="PRODUCER_FENCED")
            )
            return
        super().produce(topic, on_delivery=on_delivery, **kwargs)

    def init_transactions(self, timeout_s: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: object, timeout_s: float) -> None:
        pass

    def commit_transaction(self, timeout_s: float) -> None:
        pass

    def abort_transaction(self, timeout_s: float) -> None:
        self.aborts += 1
        raise KafkaClientError("Timed out waiting for operation to finish", code="_TIMED_OUT", retriable=True)


def test_a_fenced_transactional_producer_is_replaced_without_a_hanging_abort() -> None:
    made: list[FencedAbortableProducer] = []
    publisher = TransactionalPublisher(lambda: FencedAbortableProducer(made), Emitter())  # type: ignore[arg-type,return-value]
    publisher.send(_job(b"v", ()))
    with pytest.raises(KafkaClientError, match="newer producer"):
        publisher.commit({("orders", 0): 8}, None)
    assert made[0].aborts == 0  # never asked to abort: it would wait out its whole timeout
    assert len(made) == 2 and publisher.healthy  # replaced; the batch is read again by the loop
    publisher.send(_job(b"v", ()))
    publisher.commit({("orders", 0): 8}, None)
    assert [w[0] for w in made[1].written] == [CTX.topics.tiers[0].topic]


def test_purge_reports_of_an_aborted_transaction_never_fail_the_next_one() -> None:
    """An abort purges the records still queued in the producer, and their reports ("Purged in queue")
    arrive at a later poll, in the next transaction: they belong to the aborted one. The next transaction
    commits, with its records and offsets, and the publisher stays healthy. (The same on Apache Kafka:
    runtime/test_aborted_transaction.py.)"""
    # setup: a member of the group (its metadata goes into the transaction) and a transactional publisher
    broker = MemoryBroker()
    broker.create_topics(["orders", CTX.topics.tiers[0].topic])
    consumer = broker.consumer("billing")
    consumer.subscribe(["orders"], on_assign=lambda tps: None, on_revoke=lambda tps: None, on_lost=lambda tps: None)
    consumer.consume(10, 0)
    publisher = TransactionalPublisher(lambda: broker.producer(transactional_id="billing-1"), Emitter())

    # when: a transaction aborts with a record still queued; the next one serves the purge report, commits
    publisher.send(_job(b"aborted", ()))
    publisher.abort(KafkaClientError("offsets refused", code="UNKNOWN_MEMBER_ID"))
    publisher.send(_job(b"committed", ()))
    publisher.poll(0)
    publisher.commit({("orders", 0): 8}, consumer.group_metadata())

    # then
    assert publisher.healthy
    assert [m.value for m in broker.records(CTX.topics.tiers[0].topic)] == [b"committed"]
    assert broker.committed("billing") == {("orders", 0): 8}


def test_a_refused_record_fails_its_own_transaction_before_its_commit_is_asked() -> None:
    """A delivery error reported while its transaction is open fails that transaction: the commit raises
    (after aborting) without sending its offsets, and nothing of it becomes visible."""
    broker = MemoryBroker()
    tier = CTX.topics.tiers[0].topic
    broker.create_topics(["orders", tier])
    publisher = TransactionalPublisher(lambda: broker.producer(transactional_id="billing-1"), Emitter())
    broker.fail_produces(1, "NOT_ENOUGH_REPLICAS", topic=tier)
    publisher.send(_job(b"refused", ()))
    publisher.poll(0)
    assert not publisher.healthy

    with pytest.raises(PublishError, match="NOT_ENOUGH_REPLICAS"):
        publisher.commit({("orders", 0): 8}, object())  # not a group's metadata: never sent
    assert publisher.healthy and broker.records(tier) == [] and broker.committed("billing") == {}


class HoldingProducer:
    """Keeps every produce's delivery callback, unanswered, until the test answers it."""

    def __init__(self, made: list[HoldingProducer]) -> None:
        self.callbacks: list[Callable[[PublishError | None], None]] = []
        self.purged = False
        made.append(self)

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: Callable[[PublishError | None], None],
    ) -> None:
        self.callbacks.append(on_delivery)

    def poll(self, timeout_s: float) -> None:
        pass

    def purge(self) -> None:
        self.purged = True

    def partition_count(self, topic: str) -> int:
        return 1


def test_a_republish_in_flight_is_one_object_that_is_its_own_delivery_callback() -> None:
    """While a republish waits for its acknowledgement, the producer holds the job itself as its delivery
    callback (no closure and cells per hop stay alive per record in flight), and the acknowledgement gives
    back that same job."""
    made: list[HoldingProducer] = []
    publisher = Publisher(lambda: HoldingProducer(made), Emitter())  # type: ignore[arg-type,return-value]
    jobs = [_job(b"a", ()), _job(b"b", ())]
    for job in jobs:
        publisher.send(job)

    assert made[0].callbacks == jobs and all(c is j for c, j in zip(made[0].callbacks, jobs, strict=True))
    assert publisher.in_flight == 2
    made[0].callbacks[1](None)
    assert publisher.poll(0) == [jobs[1]] and publisher.in_flight == 1


def test_a_late_report_of_a_replaced_producer_neither_acknowledges_nor_fails_a_job() -> None:
    """After a fatal error replaces the producer, every unacknowledged job goes out again on the new one; a
    report the old producer still gives afterwards (success or failure) changes nothing: only the new
    producer's acknowledgement finishes the job, once."""
    made: list[HoldingProducer] = []
    publisher = Publisher(lambda: HoldingProducer(made), Emitter(), wait=lambda _: 0.0)  # type: ignore[arg-type,return-value]
    fatal, waiting = _job(b"fatal", ()), _job(b"waiting", ())
    publisher.send(fatal)
    publisher.send(waiting)
    made[0].callbacks[0](PublishError("t", "fenced", code="PRODUCER_FENCED", fatal=True))
    assert publisher.poll(0) == []  # replaced: both jobs produced again on the new producer
    assert made[0].purged and len(made) == 2 and len(made[1].callbacks) == 2

    made[0].callbacks[1](None)  # the old producer acknowledges late
    made[0].callbacks[0](PublishError("t", "purged", code="_PURGE_QUEUE"))
    assert publisher.poll(0) == [] and publisher.in_flight == 2 and publisher.healthy is False

    made[1].callbacks[0](None)
    made[1].callbacks[1](None)
    acked = publisher.poll(0)
    assert sorted(j.value or b"" for j in acked) == [b"fatal", b"waiting"]
    assert publisher.in_flight == 0 and publisher.healthy
