"""Exactly-once publishing: the republishes of a poll batch and its consumed offsets commit in one transaction.

`TransactionalPublisher` is the exactly-once counterpart of `Publisher` (runtime/handoff/publish.py): it sends the
same `PublishJob`s, but inside a transaction the hand-off's finisher (`TransactionPerBatch`, runtime/handoff/exactly_once.py)
commits together with the offsets, or aborts. A failed delivery is not retried here: it fails the
transaction's commit, which aborts it, and the batch is read again.

The broker refuses a produce batch as a whole when one of its records is larger than the topic accepts, and
reports that error on every record of the batch. So a record refused as too large is first sent again alone
(flushed before and after, a batch of its own) in the next attempt of its transaction; only a record refused
alone takes a shrinking step (`PublishJob.shrink`) toward the DLQ: its batch neighbours go out unchanged.

Key order's records that are no `PublishJob` (key-state records, follower hops: runtime/handoff/ordered.py) go
into the same transaction through `send_record`; a follower hop refused as too large goes alone next, and once
refused alone the hand-off dead-letters it instead (`refused_alone`).

A delivery error belongs to the transaction its record was sent in. librdkafka reports the records an abort
purged ("Purged in queue") at a later poll, when the next transaction is open: those reports are ignored.
Once `commit_transaction()` returned, the transaction is committed, whatever arrives after.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.headers import Header
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ProducerPort
from retrytopics.core.transactions import CALL_TIMEOUT_MS
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.bounded import BoundedCalls, CallAbandoned
from retrytopics.runtime.clock import SYSTEM_CLOCK
from retrytopics.runtime.handoff.publish import TOO_LARGE_CODES, PublishJob, produce_job

__all__ = ["COMMIT_DEADLINE_S", "TransactionOutcomeUnknown", "TransactionalPublisher"]

log = logging.getLogger("retrytopics.publish")

#: Errors that say another producer took over this transactional id (fatal on Apache Kafka).
_FENCED_CODES = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})

#: how much longer than librdkafka's own timeout a call is waited for before it is abandoned
_GRACE_S = 1.0

#: how long a commit is asked again while librdkafka reports retriable errors (a transaction coordinator's
#: failover took 8-13 s on a 3-broker cluster); the broker aborts a transaction older than its timeout,
#: which ends the wait with a clear refusal
COMMIT_DEADLINE_S = 30.0

#: records whose too-large publish is remembered for their next attempt (exactly-once); a bound, not a budget
_MAX_REMEMBERED_SHRINKS = 10_000


def _produce_job_shrinking(
    producer: ProducerPort, job: PublishJob, on_delivery: Callable[[PublishError | None], None]
) -> None:
    """`produce_job`, stepping the job down while the producer refuses it at once as too large (its local
    `message.max.bytes` check). A broker's later refusal is not handled here: it fails the transaction."""
    while True:
        try:
            produce_job(producer, job, on_delivery)
            return
        except KafkaClientError as exc:
            if exc.code not in TOO_LARGE_CODES or job.shrink is None or not job.shrink(job):
                raise


class TransactionOutcomeUnknown(KafkaClientError):
    """A transaction's commit did not answer within its bound: it may have committed or not, and only the
    broker knows. Neither rewinding (a committed batch would be handled twice) nor going on (an aborted one
    would be lost) is safe: the consumer loop stops, and a restart reads the committed offsets."""


class TransactionalPublisher:
    """Exactly-once hand-off: publishes and the consumed offsets commit or abort together.

    Each blocking call (`init_transactions`, `send_offsets_to_transaction`, `commit_transaction`,
    `abort_transaction`) waits at most `timeout_s` plus a second of grace (runtime/bounded.py); librdkafka is
    given `timeout_s` itself. A call still running then is abandoned with its producer, and the next
    transaction starts on a new producer with the same transactional id, which fences the old one and ends
    its transaction. So does a call that timed out in librdkafka: the broker does not answer in time, and an
    abort would wait for it as long. From either until a transaction commits again, `healthy` is False.
    """

    def __init__(
        self,
        make_producer: Callable[[], ProducerPort],
        emitter: Emitter,
        *,
        timeout_s: float = CALL_TIMEOUT_MS / 1000,
        start_timeout_s: float = 30.0,
        consumer: str = "",
        monotonic: Callable[[], float] = SYSTEM_CLOCK.monotonic,
    ) -> None:
        self._make_producer = make_producer
        self._emitter = emitter
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._calls = BoundedCalls(timeout_s=timeout_s + _GRACE_S, name=consumer or "transactions", monotonic=monotonic)
        self._open = False
        #: counts the transactions begun: a delivery report names the one its record was sent in
        self._transaction = 0
        self._error: KafkaClientError | None = None  # the first failure in the open transaction
        self._failing: KafkaClientError | None = None  # a call timed out or abandoned since the last commit
        self._shrinks: dict[tuple[TopicPartition, int], int] = {}  # source record -> steps its next publish takes
        self._alone: set[tuple[TopicPartition, int]] = set()  # source records refused as too large: sent alone
        self._refused_alone: set[tuple[TopicPartition, int]] = set()  # `send_record`'s, refused alone too
        # None once abandoned: the next transaction makes a new one. At start-up, given longer: a broker
        # that just started may still be loading its transaction coordinator.
        self._producer: ProducerPort | None = None
        self._producer = self._start(start_timeout_s)

    def _start(self, timeout_s: float) -> ProducerPort:
        producer = self._make_producer()
        self._bounded("init_transactions", producer.init_transactions, timeout_s, bound_s=timeout_s + _GRACE_S)
        return producer

    def _bounded(self, what: str, fn: Callable[..., object], *args: Any, bound_s: float | None = None) -> None:
        """`fn(*args)`, abandoned with the producer it belongs to when it outlives its bound."""
        try:
            self._calls.call(what, fn, *args, bound_s=bound_s)
        except CallAbandoned as exc:
            log.error(
                "%s: %s; the transactional producer is abandoned, and a new one with the same "
                "transactional id fences it",
                self._consumer,
                exc,
            )
            self._failing = exc
            self._drop_producer()
            raise
        except KafkaClientError as exc:
            if exc.retriable:
                self._failing = exc
            raise

    def _drop_producer(self) -> None:
        """Forget the producer. It is destroyed in a thread of its own: librdkafka's destroy may wait for a
        broker that does not answer."""
        producer, self._producer = self._producer, None
        if producer is not None:
            threading.Thread(
                target=_release, args=(producer,), name="retrytopics:retired-producer", daemon=True
            ).start()

    @property
    def healthy(self) -> bool:
        """False while the open transaction has failed, and from a call that timed out or was abandoned until
        a transaction commits again."""
        return self._error is None and self._failing is None

    def send(self, job: PublishJob) -> None:
        """Produce `job` inside the current transaction (opened on first use)."""
        self.begin()
        source = (job.source, job.offset)
        for _ in range(self._shrinks.get(source, 0)):  # kept until delivered: an abort may purge this attempt
            if job.shrink is None or not job.shrink(job):
                break
        sent_in = self._transaction
        producer = self._producer
        if producer is None or self._error is not None:
            return  # the transaction has failed already: its commit aborts it, and the batch is read again

        alone = source in self._alone

        def delivered(error: PublishError | None) -> None:
            if error is not None and error.code in TOO_LARGE_CODES and job.shrink is not None:
                # The broker refused it (its own, smaller limit) after the producer let it through. The
                # transaction fails and the batch is read again: this record goes alone next time, and once
                # refused alone, its next publish starts smaller.
                self._remember(self._alone, source)
                if alone:
                    if len(self._shrinks) >= _MAX_REMEMBERED_SHRINKS:
                        self._shrinks.clear()
                    self._shrinks[source] = job.shrunk + 1
            elif error is None:
                self._alone.discard(source)
                self._shrinks.pop(source, None)
            if error is not None and self._error is None and self._open and sent_in == self._transaction:
                self._error = error

        self._produce(
            producer, job.route.topic, alone, lambda: _produce_job_shrinking(producer, job, delivered), delivered
        )

    def send_record(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        headers: tuple[Header, ...] = (),
        source: tuple[TopicPartition, int] | None = None,
    ) -> None:
        """Produce a record that is no `PublishJob` inside the current transaction (opened on first use): key
        order's key-state records and follower hops. A failed delivery fails the transaction, as a job's does.
        `source`, a follower hop's consumed record: refused as too large, it goes alone in the next attempt,
        and once refused alone `refused_alone(source)` says so (the hand-off then dead-letters it instead)."""
        self.begin()
        sent_in = self._transaction
        producer = self._producer
        if producer is None or self._error is not None:
            return  # the transaction has failed already (see `send`)
        alone = source is not None and source in self._alone

        def delivered(error: PublishError | None) -> None:
            if source is not None and error is not None and error.code in TOO_LARGE_CODES:
                self._remember(self._alone, source)
                if alone:
                    self._remember(self._refused_alone, source)
            elif source is not None and error is None:
                self._alone.discard(source)
            if error is not None and self._error is None and self._open and sent_in == self._transaction:
                self._error = error

        def produce() -> None:
            producer.produce(topic, key=key, value=value, headers=headers, partition=partition, on_delivery=delivered)

        self._produce(producer, topic, alone, produce, delivered)

    def refused_alone(self, source: tuple[TopicPartition, int]) -> bool:
        """Whether a record sent with `send_record` for consumed record `source` was refused as too large
        alone in an earlier attempt of its transaction."""
        return source in self._refused_alone

    @staticmethod
    def _remember(sources: set[tuple[TopicPartition, int]], source: tuple[TopicPartition, int]) -> None:
        if len(sources) >= _MAX_REMEMBERED_SHRINKS:
            sources.clear()
        sources.add(source)

    def _produce(
        self,
        producer: ProducerPort,
        topic: str,
        alone: bool,
        produce: Callable[[], None],
        delivered: Callable[[PublishError | None], None],
    ) -> None:
        try:
            if alone:  # a batch of its own: what was queued before goes first, what comes after waits
                self._bounded("flush", producer.flush, self._timeout_s)
            produce()
            if alone:
                self._bounded("flush", producer.flush, self._timeout_s)
        except KafkaClientError as exc:
            # A fenced producer refuses records at once (_FATAL) once it learnt of the fencing. Raising here
            # stopped the whole app; recorded instead, it fails this transaction's commit, which aborts it,
            # replaces the producer and rewinds the batch.
            delivered(PublishError(topic, str(exc), code=exc.code, fatal=exc.fatal))

    def end_abandoned(self) -> None:
        """If the last producer was abandoned with its transaction open, start the next one now: its
        `init_transactions` ends that transaction (the epoch bump fences it), so that a read_committed read of
        what it wrote (key order's rebuild after an abort) does not wait for the broker to time it out. Not
        started (the broker does not answer): the next transaction tries again."""
        if self._producer is not None or self._open or not self._start_next():
            return
        self._emitter.emit(Event.PRODUCER_RECREATED, consumer=self._consumer, error=str(self._failing))

    def begin(self) -> None:
        if self._open:
            return
        self._transaction += 1
        self._error = None
        self._open = True
        try:
            if self._producer is None:  # the last one was abandoned
                self._producer = self._start(self._timeout_s)
                self._emitter.emit(Event.PRODUCER_RECREATED, consumer=self._consumer, error=str(self._failing))
            try:
                self._producer.begin_transaction()
            except KafkaClientError as exc:
                if not exc.fatal:
                    raise
                self._replace(exc)  # nothing is open yet: a fresh producer starts the transaction instead
                if self._producer is None:
                    raise self._failing or exc from None
                self._producer.begin_transaction()
        except KafkaClientError as exc:
            # No producer to run it (the broker does not answer, say): the transaction can only fail. Its
            # commit raises this, aborts, and the batch is read again.
            self._error = exc

    @property
    def in_flight(self) -> int:
        """Nonzero while a transaction is open: its delivery reports are worth serving promptly."""
        return int(self._open)

    def poll(self, timeout_s: float = 0.0) -> list[PublishJob]:
        """Serve delivery reports; nothing is acknowledged one by one (a transaction commits its jobs)."""
        if self._producer is None:
            return []
        try:
            self._producer.poll(timeout_s)
        except KafkaClientError as exc:  # e.g. fenced: the transaction's commit raises it and replaces the producer
            if self._error is None:
                self._error = exc
        return []

    def commit(self, offsets: Mapping[TopicPartition, int], group_metadata: object) -> None:
        """Commit the open transaction with `offsets`; raises (after aborting) if anything failed before
        `commit_transaction()` returned. A delivery that failed fails that call, too (librdkafka), so
        nothing reported afterwards can belong to this transaction."""
        if not self._open:
            return
        try:
            if self._error is not None or self._producer is None:
                raise self._error or KafkaClientError("no producer", code="_STATE")  # it cannot commit
            if offsets:
                self._bounded(
                    "send_offsets_to_transaction",
                    self._producer.send_offsets_to_transaction,
                    offsets,
                    group_metadata,
                    self._timeout_s,
                )
        except KafkaClientError as exc:
            self.abort(exc)
            raise
        self._commit_transaction(self._producer)
        self._open = False
        self._error = None
        self._failing = None

    def _commit_transaction(self, producer: ProducerPort) -> None:
        """`commit_transaction`, called again while librdkafka reports a retriable error (its own timeout,
        say, while the transaction coordinator moves to another broker) for up to `COMMIT_DEADLINE_S`; each
        call is bounded. Refused: aborted and raised. Abandoned, or still failing at the deadline: the
        outcome is unknown (`TransactionOutcomeUnknown`)."""
        deadline = self._calls.monotonic() + COMMIT_DEADLINE_S
        while True:
            try:
                self._bounded("commit_transaction", producer.commit_transaction, self._timeout_s)
                return
            except KafkaClientError as exc:
                if not exc.retriable:  # refused: not committed
                    self.abort(exc)
                    raise
                if isinstance(exc, CallAbandoned) or self._calls.monotonic() >= deadline:
                    self._open, self._error = False, None
                    self._drop_producer()
                    raise TransactionOutcomeUnknown(f"commit_transaction: {exc}", code=exc.code) from exc
                log.warning("%s: commit_transaction: %s; asking again", self._consumer, exc)

    def abort(self, cause: BaseException | None = None) -> None:
        """Abort the open transaction; a producer that cannot abort is replaced, and so is a fenced one."""
        self._error = None
        if not self._open:
            return
        self._open = False
        self._emitter.emit(Event.TRANSACTION_ABORTED, consumer=self._consumer, error=str(cause))
        if self._producer is None:
            return  # abandoned: the next producer's start ends this transaction
        if isinstance(cause, KafkaClientError) and (cause.fatal or cause.code in _FENCED_CODES or _neither(cause)):
            # A fenced producer's epoch is stale: its abort can only fail, and a broker that reports the
            # fencing as abortable (tansu: PRODUCER_FENCED without the fatal flag) let it hang for the whole
            # timeout (30 s) first. The producer that fenced it has aborted its transaction already. A call
            # that failed neither abortably nor retriably is taken as fatal too (librdkafka's taxonomy).
            self._replace(cause)
            return
        if isinstance(cause, KafkaClientError) and cause.retriable:
            # The broker did not answer in time (or the call was abandoned): an abort would wait as long. The
            # next transaction's new producer ends this one.
            log.warning(
                "%s: transaction failed (%s); its producer is replaced when the next one begins", self._consumer, cause
            )
            self._drop_producer()
            return
        try:
            self._bounded("abort_transaction", self._producer.abort_transaction, self._timeout_s)
        except KafkaClientError as exc:
            if not exc.retriable:
                self._replace(exc)
                return
            log.error(
                "%s: abort failed (%s); its producer is replaced when the next transaction begins", self._consumer, exc
            )
            self._drop_producer()

    def _replace(self, error: KafkaClientError) -> None:
        """A new producer now; if it cannot start (the broker does not answer), the next transaction tries
        again, and this one can only fail."""
        text = str(error) if not error.code or error.code in str(error) else f"{error.code}: {error}"
        log.error("transactional producer failed (%s); replacing it (its open transaction is aborted)", text)
        self._emitter.emit(Event.PRODUCER_RECREATED, consumer=self._consumer, error=text)
        self._drop_producer()
        self._start_next()

    def _start_next(self) -> bool:
        """Start the next producer; False (kept as the failure) when the broker does not answer: the next
        transaction tries again."""
        try:
            self._producer = self._start(self._timeout_s)
        except KafkaClientError as exc:
            log.warning(
                "%s: the new producer did not start (%s); the next transaction tries again", self._consumer, exc
            )
            self._failing = exc
            return False
        return True

    # What the hand-off asks of any publisher: a transaction's jobs are durable when it commits, so none is
    # acknowledged one by one, waited for, or dropped.

    awaiting_report = False

    def flush(self, timeout_s: float) -> bool:
        return True

    def take_acked(self) -> list[PublishJob]:
        return []

    def drop_all(self) -> list[PublishJob]:
        return []

    def forget(self, sources: list[TopicPartition]) -> None:
        return None

    def is_failing(self, source: TopicPartition) -> bool:
        return False


def _neither(cause: KafkaClientError) -> bool:
    """Whether a transactional call failed with an error that is neither abortable (`txn_requires_abort`) nor
    retriable: the producer's state is unknown, so it is replaced. A record's failed delivery is no call's:
    it only fails its transaction (aborted, the producer kept)."""
    return not isinstance(cause, PublishError) and not cause.abortable and not cause.retriable


def _release(producer: ProducerPort) -> None:
    """The last reference to a retired producer, dropped in this thread (see `_drop_producer`)."""
    del producer
