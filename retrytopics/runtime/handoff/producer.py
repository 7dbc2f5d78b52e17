"""An acknowledged producer: records in flight until the broker acknowledges them, written once for the hand-off's
republishes (`Publisher`, runtime/handoff/publish.py) and key order's writes (`OrderedHandOffs`,
runtime/handoff/ordered.py).

What both need and this holds: a producer made lazily, and a second one made at the first too-large refusal
that sends one record per batch (`ALONE_OVERRIDES`: librdkafka batches the records of a partition, and the
broker refuses a batch as a whole when one record of it is too large, so a refusal names the record only
when it was alone); every unacknowledged record by id; a back-off heap of the failed ones, produced again
from the poll loop, never from inside a delivery report (a client call made there broke confluent-kafka's
callback state); and the acknowledged ones, which wait for their owner to take them (what they lead to may
produce again, so it runs outside the delivery reports).

Its owner produces each record (on `producer_for` it) with the record as the delivery callback, which
reports to the owner; what to do with a failed delivery is the owner's, which asks this class to retry the
record, take it as done, or drop it. So calls go one way: the owner calls this class, never the reverse.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import ProducerPort

__all__ = ["ALONE_OVERRIDES", "TOO_LARGE_CODES", "AckedProducer", "Outgoing"]

#: Delivery errors no retry can fix: the record itself is too large for the producer or the broker. Retried,
#: it wedged its partition forever (never acknowledged, never committed).
TOO_LARGE_CODES = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})

#: The producer a record refused as too large is sent again on: one record per batch (see the module docstring).
ALONE_OVERRIDES = {"batch.num.messages": 1}


class Outgoing(Protocol):
    """One record in flight: its owner produces it (on `producer_for` its `alone`), with itself as the
    delivery callback, which reports to the owner."""

    #: set by `AckedProducer.track`: the record's id while in flight
    record_id: int
    #: sent on the one-record-per-batch producer: a too-large refusal is then this record's own
    alone: bool


T = TypeVar("T", bound=Outgoing)


class AckedProducer(Generic[T]):
    """Records in flight on a lazy producer (and a lazy one-record-per-batch producer), a back-off heap of the
    failed ones, and the acknowledged ones until taken (see the module docstring)."""

    def __init__(
        self,
        make_producer: Callable[[], ProducerPort],
        *,
        make_alone_producer: Callable[[], ProducerPort] | None = None,
    ) -> None:
        self._make_producer = make_producer
        self._producer: ProducerPort | None = None
        # without a factory (a client that does not batch, as the memory broker's) a refused record is sent
        # again on the main producer
        self._make_alone_producer = make_alone_producer
        self._alone: ProducerPort | None = None
        self._ids = itertools.count()
        self.in_flight: dict[int, T] = {}  # every unacknowledged record, by id
        self._retries: list[tuple[float, int]] = []  # (when, record id), a heap
        self._done: dict[int, T] = {}  # acknowledged, not taken yet

    @property
    def started(self) -> bool:
        """Whether the producer was made (at the first send, or by `start`)."""
        return self._producer is not None

    def start(self) -> ProducerPort:
        """The producer, made now if it was not yet."""
        producer = self._producer
        if producer is None:
            producer = self._producer = self._make_producer()
        return producer

    def track(self, record: T) -> ProducerPort:
        """Put `record` in flight under a new id; returns the producer its owner produces it on next."""
        record_id = record.record_id = next(self._ids)
        self.in_flight[record_id] = record
        return self.producer_for(record) if record.alone or self._producer is None else self._producer

    def producer_for(self, record: T) -> ProducerPort:
        """The producer `record` goes on: the one-record-per-batch producer once it is `alone` (made then),
        the main one otherwise (made at the first record)."""
        producer = self._producer or self.start()
        if not record.alone or self._make_alone_producer is None:
            return producer
        if self._alone is None:
            self._alone = self._make_alone_producer()
        return self._alone

    @staticmethod
    def refused(record: T, exc: KafkaClientError) -> None:
        """The producer refused `record` at once: a too-large refusal judged this record by itself."""
        record.alone = record.alone or exc.code in TOO_LARGE_CODES

    @property
    def unsettled(self) -> int:
        """Records in flight or acknowledged and not taken yet."""
        return len(self.in_flight) + len(self._done)

    def records(self) -> Iterator[T]:
        """The records in flight, then those acknowledged and not taken yet."""
        yield from self.in_flight.values()
        yield from self._done.values()

    def is_current(self, record: T) -> bool:
        """Whether `record` is the one in flight under its id: not a report of a replaced producer (the record
        went out again as a copy), of a dropped record, or of one acknowledged already."""
        return self.in_flight.get(record.record_id) is record

    def find(self, record_id: int) -> T | None:
        """The record of `record_id`, in flight or acknowledged and not taken yet."""
        return self.in_flight.get(record_id) or self._done.get(record_id)

    def acked(self, record: T) -> bool:
        """`record` is acknowledged (or settled otherwise by its owner): out of flight, waiting for `take_done`;
        False (nothing changes) when it is not current (`is_current`)."""
        record_id = record.record_id
        if self.in_flight.get(record_id) is not record:
            return False
        del self.in_flight[record_id]
        self._done[record_id] = record
        return True

    def take_done(self) -> list[T]:
        """The records acknowledged (or done) since the last call."""
        if not self._done:
            return []
        done = list(self._done.values())
        self._done = {}
        return done

    def retry_at(self, when: float, record: T) -> None:
        """Produce `record` again once the clock reaches `when` (`due`)."""
        heapq.heappush(self._retries, (when, record.record_id))

    def due(self, now: float) -> Iterator[T]:
        """The records in flight whose retry time came, taken off the heap (skipping those gone meanwhile)."""
        retries, in_flight = self._retries, self.in_flight
        while retries and retries[0][0] <= now:
            _, record_id = heapq.heappop(retries)
            record = in_flight.get(record_id)
            if record is not None:
                yield record

    def forget(self, record_id: int) -> None:
        """Stop tracking and retrying a record in flight."""
        self.in_flight.pop(record_id, None)

    def drop_all(self) -> list[T]:
        """Stop tracking and retrying every record in flight, and return them."""
        dropped = list(self.in_flight.values())
        self.in_flight.clear()
        self._retries.clear()
        return dropped

    def poll(self, timeout_s: float) -> None:
        """Serve delivery reports (raises KafkaClientError when a producer in a fatal state refuses to)."""
        if self._producer is None:
            return
        self._producer.poll(timeout_s)
        if self._alone is not None:
            self._alone.poll(0)

    def replace(self, copy: Callable[[T], T], retry_in: Callable[[T], float], now: float) -> None:
        """Drop both producers (purged: a dead one may refuse even that) for a new one, and put every record in
        flight out again on it as a new object (`copy`: a late report of the old producer finds its record
        gone), each once `retry_in` of it passed."""
        for producer in (self._producer, self._alone):
            try:
                if producer is not None:
                    producer.purge()
            except KafkaClientError:
                pass  # a dead producer may refuse even this; it is dropped either way
        self._producer, self._alone = self._make_producer(), None
        self.in_flight = {record_id: copy(record) for record_id, record in self.in_flight.items()}
        self._retries = [(now + retry_in(record), record_id) for record_id, record in self.in_flight.items()]
        heapq.heapify(self._retries)
