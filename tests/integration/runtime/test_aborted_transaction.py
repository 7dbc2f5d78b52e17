"""Exactly-once after an aborted transaction: the next transaction's commit stands.

librdkafka's `abort_transaction()` purges the records still queued in the client, and their delivery reports
("Purged in queue") arrive at a later poll, in the next transaction. Those reports belong to the aborted
transaction: they must not fail the next one, and a transaction whose `commit_transaction()` returned is
never treated as failed (aborting it then rewinds the consumer over a committed batch, which is handled and
committed a second time).

The scenario runs the exactly-once hand-off (`exactly_once`: a `HandOff` with a `TransactionPerBatch`) over a
real consumer and a real transactional producer. The first transaction's offsets are refused (UNKNOWN_MEMBER_ID, injected, as a
coordinator answers a member it expelled) while its records still wait in the producer's queue (a long
`linger.ms` keeps them there), so it aborts and the batch is read again.

Guarantees: every source record reaches the tier once in the read_committed view; each offset is handed off
exactly once after the abort (the consumer is never rewound over a committed batch); one transaction
aborted, none after it; the group's committed offset is the end of the source.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.clients import KafkaConsumer, KafkaProducer
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.router import route
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import SYSTEM_CLOCK
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.handoff.exactly_once import exactly_once
from retrytopics.runtime.records.calls import build_record
from retrytopics.runtime.records.outcome import Failed
from retrytopics.runtime.waiting import PauseController

from .conftest import Kit

pytestmark = pytest.mark.broker

RECORDS = 6
BATCH = 3


class _RefusesFirstOffsets(KafkaProducer):
    """A real transactional producer whose first `send_offsets_to_transaction` is refused as the group
    coordinator refuses an expelled member's."""

    refused = False

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout_s: float
    ) -> None:
        if not _RefusesFirstOffsets.refused:
            _RefusesFirstOffsets.refused = True
            raise KafkaClientError("offsets refused (injected)", code="UNKNOWN_MEMBER_ID", abortable=True)
        super().send_offsets_to_transaction(offsets, group_metadata, timeout_s)


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[Event, dict[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.seen.append((event, dict(data)))

    def of(self, event: Event) -> list[dict[str, object]]:
        return [data for e, data in self.seen if e == event]


def test_purge_reports_of_an_aborted_transaction_do_not_fail_the_next_one(
    broker: Any,
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu shows aborted records to read_committed readers (docs/testing.md), which this view counts")
    # setup: a source with 6 records; its tier, from a registered handler's routing context
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, exactly_once=True)
    app.handler(source)(lambda record: None)
    app.provision()
    ctx = app.handlers[source].ctx
    tier = ctx.topics.tiers[0].topic
    kit.produce(source, [(None, f"r{i}".encode(), []) for i in range(RECORDS)])

    events = _Events()
    emitter = Emitter([events])
    settings = LoopSettings(name=f"{group}:main", group_id=group, topics=(source,), exactly_once=True)
    consumer = KafkaConsumer(kafka, group_id=group, overrides=consumer_overrides)
    tracker, assigned = OffsetTracker(), set[TopicPartition]()
    pauses = PauseController(consumer, emitter, consumer_name=settings.name)
    _RefusesFirstOffsets.refused = False
    handoff = exactly_once(
        settings,
        consumer,
        tracker,
        DuplicateAudit(1000),
        emitter,
        None,
        lambda: _RefusesFirstOffsets(kafka, transactional_id=unique_name("txn"), overrides={"linger.ms": 30_000}),
        clock=SYSTEM_CLOCK,
        forget_waiting=pauses.drop,
        assigned=assigned,
    )

    def on_assign(tps: list[TopicPartition]) -> None:
        for tp in tps:
            tracker.assign(tp)
        assigned.update(tps)

    consumer.subscribe([source], on_assign=on_assign, on_revoke=handoff.revoked, on_lost=handoff.lost)
    handed_off: list[int] = []
    rng = random.Random(0)
    binding = app.handlers[source]

    def hand_off_batch(batch: list[Message]) -> None:
        for msg in batch:
            decision = route(ctx, msg, RuntimeError("fails"), now_ms=int(time.time() * 1000), rng=rng)
            record, _ = build_record(binding, msg, None)
            handoff.apply(Failed(msg, None, record, RuntimeError("fails"), decision, ctx))
            handed_off.append(msg.offset)
        handoff.end_batch()

    try:
        # when: the first batch's transaction aborts with its records still queued in the producer
        first: list[Message] = []
        deadline = time.monotonic() + 30
        while len(first) < BATCH and time.monotonic() < deadline:
            first += consumer.consume(BATCH - len(first), 0.2)
        assert [m.offset for m in first] == [0, 1, 2]
        hand_off_batch(first)
        assert len(events.of(Event.TRANSACTION_ABORTED)) == 1 and not events.of(Event.OFFSETS_COMMITTED)
        aborted_at = len(handed_off)

        # when: the batch is read again and handled on, batch after batch, until the end is committed
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = consumer.consume(BATCH, 0.2)
            if batch:
                hand_off_batch(batch)
            commits = events.of(Event.OFFSETS_COMMITTED)
            if commits and commits[-1]["offsets"] == {(source, 0): RECORDS}:
                break
    finally:
        consumer.close()

    # then: one abort, no rewind over a committed batch, each record in the tier once, the end committed
    assert sorted(r.value for r in kit.read_all(tier)) == [f"r{i}".encode() for i in range(RECORDS)]
    assert handed_off[aborted_at:] == list(range(RECORDS))
    assert kit.committed(group, source, 1) == {0: RECORDS}
    assert len(events.of(Event.TRANSACTION_ABORTED)) == 1, events.of(Event.TRANSACTION_ABORTED)
    assert not events.of(Event.PRODUCER_RECREATED), events.of(Event.PRODUCER_RECREATED)
