"""Carrying out a `Route`: produce the failed record to its tier or the DLQ, and learn when it is durable.

At-least-once (`Publisher`): the source offset becomes committable only in the delivery callback of an
acknowledged publish (acks=all, idempotent producer). A failed delivery is produced again after a tenacity
back-off, from the poll loop, never by sleeping in it; the source partition is held paused meanwhile and the
app reports unhealthy. A fatal or indefinite producer error (idempotence state lost, a timeout, a fenced epoch)
replaces the producer and produces every unacknowledged record again; nothing is committed for them until
the new producer's acks arrive (a copy the old producer did write is suppressed by the tier's duplicate audit).

Exactly-once (`TransactionalPublisher`, runtime/handoff/transactional.py): the publish and the source offset commit go
into one transaction. Both publishers send the `PublishJob`s defined here, through `produce_job`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import tenacity

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ProducerPort
from retrytopics.core.router import Route, RouteContext, too_large_reference_record, too_large_route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import SYSTEM_CLOCK
from retrytopics.runtime.handoff.producer import ALONE_OVERRIDES, TOO_LARGE_CODES, AckedProducer

__all__ = ["ALONE_OVERRIDES", "TOO_LARGE_CODES", "PublishJob", "Publisher", "produce_job", "too_large_fallback"]

log = logging.getLogger("retrytopics.publish")

#: Delivery errors after which the producer is replaced, not just retried: fatal ones, and indefinite ones
#: (a timeout may have left a request in flight, and a delayed write could land later; Jepsen's advice for
#: Kafka clients is to re-initialize the producer), and the broker disowning the producer's id or epoch.
_RESTART_CODES = frozenset(
    {
        "_MSG_TIMED_OUT",
        "_TIMED_OUT",
        "_FENCED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "UNKNOWN_PRODUCER_ID",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "INVALID_PRODUCER_ID_MAPPING",
    }
)

#: Back-off between attempts to publish a record whose delivery failed (seconds).
DEFAULT_RETRY_WAIT = tenacity.wait_exponential(multiplier=0.2, max=10.0) + tenacity.wait_random(0, 0.2)


@dataclass(slots=True, kw_only=True)
class PublishJob:
    """One record on its way to a tier or the DLQ, and what to do once it is durable."""

    route: Route
    key: bytes | None
    value: bytes | None
    source: TopicPartition
    offset: int
    #: the assignment of `source` the record was read in (offsets.py): an acknowledgement from an earlier
    #: assignment finishes nothing
    epoch: int = 0
    attempt: int = 0
    context: Any = None  # the handler's Record, for `on_dead_letter` or key order (else None: not kept in flight)
    #: sent on the one-record-per-batch producer: a too-large refusal is then this record's own
    alone: bool = False
    #: makes the job smaller after a too-large refusal (see `too_large_fallback`); False when it cannot
    shrink: Callable[[PublishJob], bool] | None = None
    shrunk: int = 0  # steps `shrink` took
    partition: int | None = field(default=None, init=False)
    #: the `Publisher` this job is in flight with (set by `Publisher.send`): the job is its own delivery
    #: callback, so a hand-off in flight is this one object, not a closure per hop
    publisher: Publisher | None = field(default=None, init=False, repr=False, compare=False)
    record_id: int = field(default=-1, init=False, repr=False, compare=False)

    def __call__(self, error: PublishError | None) -> None:
        """The delivery report of this job's latest produce, handed to its publisher."""
        if self.publisher is not None:
            self.publisher.delivered(self, error)

    def copy(self) -> PublishJob:
        """The same job as a new object, in flight with the same publisher under the same id: a producer that
        is replaced may still report on the old object, which is no longer in flight (`Publisher.delivered`)."""
        again = replace(self)
        again.partition, again.publisher, again.record_id = self.partition, self.publisher, self.record_id
        return again


def too_large_fallback(ctx: RouteContext) -> Callable[[PublishJob], bool]:
    """A job's two steps down after a too-large refusal: to the DLQ (reason `too_large`) without exception
    message and trace; then with the value replaced by a reference to the consumed record, no user headers
    and no key longer than 1 KiB. Each step is logged; after the second there is nothing left to drop."""

    def shrink(job: PublishJob) -> bool:
        if job.shrunk >= 2:
            return False
        job.shrunk += 1
        steps = job.shrunk
        if steps == 2:
            job.key, job.value = too_large_reference_record(
                job.source[0], job.source[1], job.offset, job.key, job.value
            )
        # built after the value and key changed: with header_key, the signature covers what is published
        job.route = too_large_route(ctx, job.route, keep_user_headers=steps == 1, key=job.key, value=job.value)
        log.warning(
            "%s[%d]@%d: republish refused as too large; %s",
            job.source[0],
            job.source[1],
            job.offset,
            "dead-lettering it as too_large without exception details"
            if steps == 1
            else "dead-lettering a reference to it instead of its value",
        )
        return True

    return shrink


def _partition(producer: ProducerPort, route: Route) -> int | None:
    # Keyless records keep their original partition (modulo the destination's size); keyed ones are
    # partitioned by key, as on the source.
    if route.partition_hint is None:
        return None
    return route.partition_hint % producer.partition_count(route.topic)


def produce_job(producer: ProducerPort, job: PublishJob, on_delivery: Callable[[PublishError | None], None]) -> None:
    """Send `job` to its route's topic (raises KafkaClientError when the producer refuses it at once)."""
    job.partition = _partition(producer, job.route)
    producer.produce(
        job.route.topic,
        key=job.key,
        value=job.value,
        headers=job.route.headers,
        partition=job.partition,
        on_delivery=on_delivery,
    )


def _sent_again(job: PublishJob) -> bool:
    """After a too-large refusal, whether `job` goes out again: alone, when it was refused in a batch (maybe
    for a neighbour); made smaller (`too_large_fallback`) when it was refused alone and still can shrink."""
    if not job.alone:
        job.alone = True
        return True
    return job.shrink is not None and job.shrink(job)


def _wait_s(wait: tenacity.wait.wait_base, attempt: int) -> float:
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return float(wait(state))


class Publisher:
    """At-least-once publishing with retries from the poll loop (see the module docstring), on an
    `AckedProducer` (runtime/handoff/producer.py)."""

    def __init__(
        self,
        make_producer: Callable[[], ProducerPort],
        emitter: Emitter,
        *,
        make_alone_producer: Callable[[], ProducerPort] | None = None,
        wait: tenacity.wait.wait_base = DEFAULT_RETRY_WAIT,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
        consumer: str = "",
    ) -> None:
        # made at the first too-large refusal (`ALONE_OVERRIDES`); without a factory (a client that does not
        # batch, as the memory broker's) a refused record is sent again on the main producer
        self._jobs: AckedProducer[PublishJob] = AckedProducer(make_producer, make_alone_producer=make_alone_producer)
        self._jobs.start()  # at once: a producer that cannot be made fails the loop's start, not its first failure
        self._emitter = emitter
        self._consumer = consumer  # names the consumer loop in events, as for every other event
        self._wait = wait
        self._clock = clock
        self._failing: Counter[TopicPartition] = Counter()  # source partitions with a failed, unacked job
        self._fatal: KafkaClientError | None = None

    @property
    def healthy(self) -> bool:
        """False while some publish has failed and is waiting to be retried."""
        return not self._failing and self._fatal is None

    def is_failing(self, source: TopicPartition) -> bool:
        return self._failing[source] > 0

    @property
    def in_flight(self) -> int:
        return len(self._jobs.in_flight)

    @property
    def awaiting_report(self) -> bool:
        """Whether some job has had no delivery report yet (neither acknowledged nor failed once)."""
        return any(not job.attempt for job in self._jobs.in_flight.values())

    def drop_all(self) -> list[PublishJob]:
        """Stop tracking and retrying every unacknowledged job, and return them: a share consumer gives their
        records back to its group instead (runtime/handoff/acknowledge.py). A copy that is written after all
        is found by the tier's duplicate audit."""
        self._failing.clear()
        return self._jobs.drop_all()

    def send(self, job: PublishJob) -> None:
        """Produce `job`; a later `poll()` returns it once the broker acknowledged it."""
        job.publisher = self
        self._produce(job, self._jobs.track(job))

    def _produce(self, job: PublishJob, producer: ProducerPort) -> None:
        try:
            produce_job(producer, job, job)
        except KafkaClientError as exc:
            self._jobs.refused(job, exc)
            self.delivered(job, PublishError(job.route.topic, str(exc), code=exc.code, fatal=exc.fatal))

    def delivered(self, job: PublishJob, error: PublishError | None) -> None:
        """The delivery report of `job` (None: acknowledged): acknowledged jobs wait for `take_acked`, failed
        ones for their retry."""
        jobs = self._jobs
        if error is None:
            # not current: a report from a replaced producer (the job went out again as a copy), or of a
            # dropped job
            if jobs.acked(job) and job.attempt:
                self._failing[job.source] -= 1
                if self._failing[job.source] <= 0:
                    del self._failing[job.source]
            return
        if not jobs.is_current(job):
            return
        if error.code in TOO_LARGE_CODES and _sent_again(job):
            # at once (a record alone or smaller is a new record, not a retry), but from `poll`, never from
            # inside this delivery report (runtime/handoff/producer.py)
            jobs.retry_at(self._clock(), job)
            return
        if not job.attempt:
            self._failing[job.source] += 1
        job.attempt += 1
        self._emitter.emit(
            Event.PUBLISH_FAILED,
            consumer=self._consumer,
            destination=job.route.topic,
            error=str(error),
            attempt=job.attempt,
        )
        if error.fatal or error.code in _RESTART_CODES:
            self._fatal = error
        jobs.retry_at(self._clock() + _wait_s(self._wait, job.attempt), job)

    def poll(self, timeout_s: float = 0.0) -> list[PublishJob]:
        """Serve delivery reports, replace a failed producer, and produce again what is due for a retry;
        returns the jobs acknowledged since the last call (`take_acked`)."""
        self._serve(timeout_s)
        return self._jobs.take_done()

    def take_acked(self) -> list[PublishJob]:
        """The jobs acknowledged since the last `poll()` or `take_acked()` (a `flush` keeps them here)."""
        return self._jobs.take_done()

    def _serve(self, timeout_s: float) -> None:
        jobs = self._jobs
        try:
            jobs.poll(timeout_s)
        except KafkaClientError as exc:  # a producer in a fatal state may raise here rather than report
            if not exc.fatal:
                raise
            self._fatal = exc
        if self._fatal is not None:
            self._recreate()
        for job in jobs.due(self._clock()):
            self._produce(job, jobs.producer_for(job))

    def _recreate(self) -> None:
        error, self._fatal = self._fatal, None
        log.error("producer failed fatally (%s); replacing it and producing %d records again", error, self.in_flight)
        # Everything unacknowledged goes out again on the new producer: at once if it had not failed yet,
        # after its back-off otherwise (an outage must not turn into a tight produce loop).
        self._jobs.replace(
            PublishJob.copy, lambda j: _wait_s(self._wait, j.attempt) if j.attempt else 0.0, self._clock()
        )
        self._emitter.emit(Event.PRODUCER_RECREATED, consumer=self._consumer, error=str(error))

    def forget(self, sources: list[TopicPartition]) -> None:
        """Stop retrying jobs of revoked source partitions: their new owner handles those records again."""
        dropped = set(sources)
        for record_id, job in list(self._jobs.in_flight.items()):
            if job.source in dropped:
                self._jobs.forget(record_id)
        for tp in dropped:
            self._failing.pop(tp, None)

    def flush(self, timeout_s: float) -> bool:
        """Wait (polling, retrying) until every job is acknowledged or `timeout_s` passed; True if drained. The
        jobs acknowledged meanwhile wait for `take_acked`."""
        deadline = self._clock() + timeout_s
        while self._jobs.in_flight and self._clock() < deadline:
            self._serve(min(0.1, max(0.0, deadline - self._clock())))
        return not self._jobs.in_flight
