"""The acknowledged producer both the hand-off's publisher and key order's writes are built on
(runtime/handoff/producer.py): producers made when first needed, the one-record-per-batch producer only for a
record marked alone, a report of a record no longer in flight settles nothing, acknowledged records wait for
their owner in acknowledgement order, retries come due in time order, and a replaced producer puts every
record in flight out again as a new object."""

from __future__ import annotations

from dataclasses import dataclass, replace

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import ProducerPort
from retrytopics.runtime.handoff.producer import AckedProducer


@dataclass
class Item:
    name: str
    alone: bool = False
    record_id: int = -1
    attempt: int = 0


class Producers:
    """Counts the producers made, by kind; each is a distinct object the test can tell apart."""

    def __init__(self) -> None:
        self.made: list[tuple[str, object]] = []
        self.purged: list[object] = []

    def factory(self, kind: str) -> object:
        def make() -> ProducerPort:
            producer = _Producer(kind, self)
            self.made.append((kind, producer))
            return producer  # type: ignore[return-value]

        return make


class _Producer:
    def __init__(self, kind: str, producers: Producers) -> None:
        self.kind, self._producers = kind, producers

    def purge(self) -> None:
        self._producers.purged.append(self)

    def poll(self, timeout_s: float) -> int:
        return 0


def new(producers: Producers, *, alone: bool = True) -> AckedProducer[Item]:
    return AckedProducer(
        producers.factory("main"),  # type: ignore[arg-type]
        make_alone_producer=producers.factory("alone") if alone else None,  # type: ignore[arg-type]
    )


def test_producers_are_made_when_first_needed_and_an_alone_record_goes_on_its_own() -> None:
    # setup
    producers = Producers()
    acked = new(producers)
    assert producers.made == [] and not acked.started

    # when: a record, then one marked alone (refused at once as too large), then another plain one
    first = acked.track(Item("a"))
    refused = Item("b")
    acked.track(refused)
    acked.refused(refused, KafkaClientError("too large", code="MSG_SIZE_TOO_LARGE"))
    alone = acked.producer_for(refused)
    plain = acked.track(Item("c"))

    # then: one main producer for the plain records, one alone producer, made once each
    assert [kind for kind, _ in producers.made] == ["main", "alone"]
    assert first is plain is producers.made[0][1] and alone is producers.made[1][1]
    assert refused.alone


def test_without_an_alone_factory_an_alone_record_goes_on_the_main_producer() -> None:
    producers = Producers()
    acked = new(producers, alone=False)
    item = Item("a", alone=True)
    assert acked.track(item) is producers.made[0][1]
    assert [kind for kind, _ in producers.made] == ["main"]


def test_another_refusal_does_not_mark_a_record_alone() -> None:
    acked = new(Producers())
    item = Item("a")
    acked.track(item)
    acked.refused(item, KafkaClientError("queue full", code="_QUEUE_FULL"))
    assert not item.alone


def test_acknowledged_records_wait_in_order_and_a_stale_report_settles_nothing() -> None:
    # setup: three records in flight, one of them dropped
    acked = new(Producers())
    a, b, c = Item("a"), Item("b"), Item("c")
    for item in (a, b, c):
        acked.track(item)
    acked.forget(b.record_id)

    # when: acknowledgements arrive for c, the dropped b, a, and c again (a late duplicate report)
    results = [acked.acked(c), acked.acked(b), acked.acked(a), acked.acked(c)]

    # then: the owner takes c then a, once; nothing is left in flight
    assert results == [True, False, True, False]
    assert acked.take_done() == [c, a]
    assert acked.take_done() == []
    assert acked.in_flight == {} and acked.unsettled == 0


def test_an_acknowledged_record_is_found_until_its_owner_takes_it() -> None:
    acked = new(Producers())
    item = Item("a")
    acked.track(item)
    assert acked.find(item.record_id) is item and acked.unsettled == 1
    acked.acked(item)
    assert acked.find(item.record_id) is item and list(acked.records()) == [item] and acked.unsettled == 1
    acked.take_done()
    assert acked.find(item.record_id) is None and acked.unsettled == 0


def test_retries_come_due_in_time_order_and_skip_records_gone_meanwhile() -> None:
    # setup
    acked = new(Producers())
    a, b, c = Item("a"), Item("b"), Item("c")
    for item in (a, b, c):
        acked.track(item)
    acked.retry_at(3.0, a)
    acked.retry_at(1.0, b)
    acked.retry_at(2.0, c)
    acked.forget(c.record_id)

    # when / then: nothing before its time; then b, then a (c is gone)
    assert list(acked.due(0.5)) == []
    assert list(acked.due(2.5)) == [b]
    assert list(acked.due(10.0)) == [a]
    assert list(acked.due(10.0)) == []


def test_a_replaced_producer_puts_every_record_in_flight_out_again_as_a_new_object() -> None:
    # setup: two records in flight (one failed once), one acknowledged and not taken
    producers = Producers()
    acked = new(producers)
    fresh, failed, done = Item("fresh"), Item("failed", attempt=1), Item("done")
    for item in (fresh, failed, done):
        acked.track(item)
    acked.acked(done)
    old_main = producers.made[0][1]

    # when
    acked.replace(lambda item: replace(item), lambda item: 5.0 if item.attempt else 0.0, now=100.0)

    # then: the old producer purged, a new one made; the old objects no longer current, their copies are
    assert producers.purged == [old_main] and [kind for kind, _ in producers.made] == ["main", "main"]
    assert not acked.is_current(fresh) and not acked.is_current(failed)
    copies = {item.name: item for item in acked.in_flight.values()}
    assert set(copies) == {"fresh", "failed"} and copies["fresh"] is not fresh
    # the fresh one at once, the failed one after its back-off; the acknowledged one is still the owner's
    assert [item.name for item in acked.due(100.0)] == ["fresh"]
    assert [item.name for item in acked.due(105.0)] == ["failed"]
    assert acked.take_done() == [done]


def test_drop_all_returns_what_is_in_flight_and_stops_its_retries() -> None:
    acked = new(Producers())
    a, b = Item("a"), Item("b")
    acked.track(a)
    acked.track(b)
    acked.retry_at(1.0, a)
    assert acked.drop_all() == [a, b]
    assert list(acked.due(10.0)) == [] and acked.in_flight == {}
