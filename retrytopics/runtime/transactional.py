"""Exactly-once publishing: the republishes of a poll batch and its consumed offsets commit in one transaction.

`TransactionalPublisher` is the exactly-once counterpart of `Publisher` (runtime/publish.py): it sends the
same `PublishJob`s, but inside a transaction the hand-off strategy (`ExactlyOnce`, runtime/exactly_once.py)
commits together with the offsets, or aborts. A failed delivery is not retried here: it fails the
transaction's commit, which aborts it, and the batch is read again.

A delivery error belongs to the transaction its record was sent in. librdkafka reports the records an abort
purged ("Purged in queue") at a later poll, when the next transaction is open: those reports are ignored.
Once `commit_transaction()` returned, the transaction is committed, whatever arrives after.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from retrytopics.errors import KafkaClientError, PublishError
from retrytopics.events import Emitter, Event
from retrytopics.offsets import TopicPartition
from retrytopics.ports import ProducerPort
from retrytopics.runtime.publish import TOO_LARGE_CODES, PublishJob, produce_job

__all__ = ["TransactionalPublisher"]

log = logging.getLogger("retrytopics.publish")

#: Errors that say another producer took over this transactional id (fatal on Apache Kafka).
_FENCED_CODES = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})

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


class TransactionalPublisher:
    """Exactly-once hand-off: publishes and the consumed offsets commit or abort together."""

    def __init__(
        self,
        make_producer: Callable[[], ProducerPort],
        emitter: Emitter,
        *,
        timeout_s: float = 30.0,
        consumer: str = "",
    ) -> None:
        self._make_producer = make_producer
        self._emitter = emitter
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._producer = self._start()
        self._open = False
        #: counts the transactions begun: a delivery report names the one its record was sent in
        self._transaction = 0
        self._error: KafkaClientError | None = None  # the first failure in the open transaction
        self._shrinks: dict[tuple[TopicPartition, int], int] = {}  # source record -> steps its next publish takes

    def _start(self) -> ProducerPort:
        producer = self._make_producer()
        producer.init_transactions(self._timeout_s)
        return producer

    @property
    def healthy(self) -> bool:
        return self._error is None

    def send(self, job: PublishJob) -> None:
        """Produce `job` inside the current transaction (opened on first use)."""
        self.begin()
        source = (job.source, job.offset)
        for _ in range(self._shrinks.pop(source, 0)):
            if job.shrink is None or not job.shrink(job):
                break
        sent_in = self._transaction

        def delivered(error: PublishError | None) -> None:
            if error is not None and error.code in TOO_LARGE_CODES and job.shrink is not None:
                # The broker refused it (its own, smaller limit) after the producer let it through. The
                # transaction fails and the batch is read again; this record's next publish starts smaller.
                if len(self._shrinks) >= _MAX_REMEMBERED_SHRINKS:
                    self._shrinks.clear()
                self._shrinks[source] = job.shrunk + 1
            if error is not None and self._error is None and self._open and sent_in == self._transaction:
                self._error = error

        try:
            _produce_job_shrinking(self._producer, job, delivered)
        except KafkaClientError as exc:
            # A fenced producer refuses records at once (_FATAL) once it learnt of the fencing. Raising here
            # stopped the whole app; recorded instead, it fails this transaction's commit, which aborts it,
            # replaces the producer and rewinds the batch.
            delivered(PublishError(job.route.topic, str(exc), code=exc.code, fatal=exc.fatal))

    def begin(self) -> None:
        if self._open:
            return
        try:
            self._producer.begin_transaction()
        except KafkaClientError as exc:
            if not exc.fatal:
                raise
            self._replace(exc)  # nothing is open yet: a fresh producer starts the transaction instead
            self._producer.begin_transaction()
        self._transaction += 1
        self._error = None
        self._open = True

    @property
    def in_flight(self) -> int:
        """Nonzero while a transaction is open: its delivery reports are worth serving promptly."""
        return int(self._open)

    def poll(self, timeout_s: float = 0.0) -> None:
        try:
            self._producer.poll(timeout_s)
        except KafkaClientError as exc:  # e.g. fenced: the transaction's commit raises it and replaces the producer
            if self._error is None:
                self._error = exc

    def commit(self, offsets: Mapping[TopicPartition, int], group_metadata: object) -> None:
        """Commit the open transaction with `offsets`; raises (after aborting) if anything failed before
        `commit_transaction()` returned. A delivery that failed fails that call, too (librdkafka), so
        nothing reported afterwards can belong to this transaction."""
        if not self._open:
            return
        try:
            if self._error is not None:
                raise self._error  # a record of this transaction was refused: it cannot commit
            if offsets:
                self._producer.send_offsets_to_transaction(offsets, group_metadata, self._timeout_s)
            self._producer.commit_transaction(self._timeout_s)
        except KafkaClientError as exc:
            self.abort(exc)
            raise
        self._open = False
        self._error = None

    def abort(self, cause: BaseException | None = None) -> None:
        """Abort the open transaction; a producer that cannot abort is replaced, and so is a fenced one."""
        self._error = None
        if not self._open:
            return
        self._open = False
        self._emitter.emit(Event.TRANSACTION_ABORTED, consumer=self._consumer, error=str(cause))
        if isinstance(cause, KafkaClientError) and (cause.fatal or cause.code in _FENCED_CODES):
            # A fenced producer's epoch is stale: its abort can only fail, and a broker that reports the
            # fencing as abortable (tansu: PRODUCER_FENCED without the fatal flag) let it hang for the whole
            # timeout (30 s) first. The producer that fenced it has aborted its transaction already.
            self._replace(cause)
            return
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaClientError as exc:
            self._replace(exc)

    def _replace(self, error: KafkaClientError) -> None:
        text = str(error) if not error.code or error.code in str(error) else f"{error.code}: {error}"
        log.error("transactional producer failed (%s); replacing it (its open transaction is aborted)", text)
        self._emitter.emit(Event.PRODUCER_RECREATED, consumer=self._consumer, error=text)
        self._producer = self._start()

    def flush(self, timeout_s: float) -> bool:
        return True

    def forget(self, sources: list[TopicPartition]) -> None:
        return None

    def is_failing(self, source: TopicPartition) -> bool:
        return False
