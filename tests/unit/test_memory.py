"""The in-memory broker's injected failures and fake clock, which the contract test cannot compare with Kafka
(Apache Kafka cannot be told to refuse a produce or expel a member on cue): each does what its docstring says.
"""

from __future__ import annotations

import pytest

from retrytopics.core.errors import KafkaClientError, PublishError
from retrytopics.core.ports import TopicPartition
from retrytopics.testing import MemoryBroker, MemoryConsumer

TP: TopicPartition = ("orders", 0)


def subscribed(broker: MemoryBroker, log: list[tuple[str, list[TopicPartition]]]) -> MemoryConsumer:
    consumer = broker.consumer("g", session_timeout_ms=6000)
    consumer.subscribe(
        ["orders"],
        on_assign=lambda tps: log.append(("assign", tps)),
        on_revoke=lambda tps: log.append(("revoke", tps)),
        on_lost=lambda tps: log.append(("lost", tps)),
    )
    return consumer


def test_injected_produce_failures_are_reported_at_the_next_poll_or_raised_at_once() -> None:
    # setup
    broker = MemoryBroker()
    broker.create_topic("orders")
    producer, reports = broker.producer(), []
    broker.fail_produces(1, "_MSG_TIMED_OUT")
    broker.fail_produces(1, "MSG_SIZE_TOO_LARGE", at_once=True)

    # when: the first is refused in its report, the second by produce() itself, the third lands
    producer.produce("orders", key=None, value=b"a", headers=[], partition=0, on_delivery=reports.append)
    with pytest.raises(KafkaClientError) as refused:
        producer.produce("orders", key=None, value=b"b", headers=[], partition=0, on_delivery=reports.append)
    producer.produce("orders", key=None, value=b"c", headers=[], partition=0, on_delivery=reports.append)
    assert reports == []  # nothing before a poll
    producer.poll(0)

    # then
    assert refused.value.code == "MSG_SIZE_TOO_LARGE"
    assert isinstance(reports[0], PublishError) and reports[0].code == "_MSG_TIMED_OUT" and reports[1] is None
    assert [m.value for m in broker.records("orders")] == [b"c"]


def test_a_record_larger_than_its_topics_max_message_bytes_is_refused_each_time_it_is_produced() -> None:
    """A topic's size limit counts key, value and headers; a record over it is refused as too large in its
    report, every time (a property of the record, not a passing failure); other topics are not limited."""
    broker = MemoryBroker()
    broker.create_topics(["orders", "other"])
    broker.max_message_bytes["orders"] = 10
    producer, reports = broker.producer(), []

    for topic, value, headers in [
        ("orders", b"0123456789", []),
        ("orders", b"012345678", [("h", b"x")]),
        ("orders", b"012345678", [("h", b"x")]),
        ("other", b"x" * 100, []),
    ]:
        producer.produce(topic, key=None, value=value, headers=headers, partition=0, on_delivery=reports.append)
    producer.poll(0)

    assert reports[0] is None and reports[3] is None
    assert all(isinstance(r, PublishError) and r.code == "MSG_SIZE_TOO_LARGE" for r in reports[1:3])
    assert [m.value for m in broker.records("orders")] == [b"0123456789"]
    assert len(broker.records("other")) == 1


def test_acks_wait_the_polls_they_are_told_to_and_a_flush_waits_for_all() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders")
    broker.ack_after_polls = 2
    producer, reports = broker.producer(), []
    producer.produce("orders", key=None, value=b"a", headers=[], partition=0, on_delivery=reports.append)
    producer.poll(0)
    producer.poll(0)
    assert reports == [] and broker.records("orders") == []
    producer.poll(0)
    assert reports == [None]
    producer.produce("orders", key=None, value=b"b", headers=[], partition=0, on_delivery=reports.append)
    assert producer.flush(1) == 0 and reports == [None, None]


def test_an_expelled_member_has_commits_refused_at_once_and_loses_its_partitions_at_the_next_consume() -> None:
    # setup
    broker = MemoryBroker()
    broker.create_topic("orders")
    broker.append("orders", b"a")
    log: list[tuple[str, list[TopicPartition]]] = []
    consumer = subscribed(broker, log)
    assert [m.offset for m in consumer.consume(10, 1)] == [0]

    # when
    consumer.expel()

    # then: refused (synchronous: raised; asynchronous: only noted, as librdkafka only logs it)
    with pytest.raises(KafkaClientError) as refused:
        consumer.commit({TP: 1}, asynchronous=False)
    consumer.commit({TP: 1}, asynchronous=True)
    assert refused.value.code == "UNKNOWN_MEMBER_ID" and consumer.refused_commits == [{TP: 1}]
    assert broker.committed("g") == {}
    # and: lost, then joined again and assigned, reading from the committed offset (none: the start)
    assert [m.offset for m in consumer.consume(10, 1)] == [0]
    assert log == [("assign", [TP]), ("lost", [TP]), ("assign", [TP])]


def test_a_freeze_longer_than_the_session_costs_the_membership_and_moves_the_clock() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders")
    log: list[tuple[str, list[TopicPartition]]] = []
    consumer = subscribed(broker, log)
    consumer.consume(10, 0)
    start = broker.clock.monotonic()

    consumer.freeze(20)
    assert consumer.consume(10, 0) == []  # wakes with nothing, the loss not reported yet
    assert broker.clock.monotonic() - start == 20
    with pytest.raises(KafkaClientError):
        consumer.commit({TP: 0}, asynchronous=False)
    consumer.consume(10, 0)
    assert log == [("assign", [TP]), ("lost", [TP]), ("assign", [TP])]


def test_a_triggered_rebalance_revokes_then_assigns_and_a_consume_with_nothing_advances_the_clock() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders")
    log: list[tuple[str, list[TopicPartition]]] = []
    consumer = subscribed(broker, log)
    consumer.consume(10, 0)
    start = broker.clock.time()

    consumer.trigger_rebalance()
    consumer.consume(10, 0.25)

    assert log == [("assign", [TP]), ("revoke", [TP]), ("assign", [TP])]
    assert broker.clock.time() - start == 0.25


def test_a_new_producer_with_the_same_transactional_id_fences_the_old_one_and_aborts_its_transaction() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders")
    old = broker.producer(transactional_id="t")
    old.init_transactions(1)
    old.begin_transaction()
    old.produce("orders", key=None, value=b"zombie", headers=[], partition=0, on_delivery=lambda e: None)
    old.poll(0)

    new = broker.producer(transactional_id="t")
    new.init_transactions(1)

    with pytest.raises(KafkaClientError) as fenced:
        old.commit_transaction(1)
    assert fenced.value.fatal and fenced.value.code == "_FENCED"
    assert broker.records("orders") == [] and len(broker.records("orders", read_committed=False)) == 1


def test_stale_copies_come_first_in_the_next_consume_only() -> None:
    """`deliver_stale`: the next consume returns the given copies before what the positions say (records
    fetched before a seek), within `max_records`; the consume after it does not repeat them."""
    broker = MemoryBroker()
    broker.create_topic("orders")
    for value in (b"a", b"b", b"c"):
        broker.append("orders", value, partition=0)
    consumer = subscribed(broker, [])
    assert [m.offset for m in consumer.consume(10, 0)] == [0, 1, 2]
    consumer.seek(TP, 0)

    consumer.deliver_stale(broker.records("orders")[2:])

    assert [m.offset for m in consumer.consume(2, 0)] == [2, 0]
    assert [m.offset for m in consumer.consume(10, 0)] == [1, 2]
