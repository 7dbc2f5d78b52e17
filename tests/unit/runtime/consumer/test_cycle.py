"""The poll cycle after a freeze (runtime/consumer/cycle.py), on the in-memory broker and its clock.

A consumer frozen past its session (SIGSTOP, a VM pause) wakes inside `consume()`, which then returns at
once; librdkafka delivers `partitions.lost` only at a later consume. Records kept from before the freeze
(waiting in memory) must not be acted on in between: the cycle judges the gap from before the wake and asks
the coordinator first (runtime/records/ownership.py). Each test's records fail again on their only tier, so
a record acted on by a zombie would be a second DLQ record.
"""

from __future__ import annotations

from collections import Counter

from retrytopics.core.headers import decode
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker

from ..kit import DLQ, TIER, Ledger, StopWhen, build_loop, committed_all, hand_offs, new_broker, run, tier_record

#: the tier's delay is 5 s: failed this long ago, a record is due 1 s ago / in 1 s
DUE_ALREADY, DUE_SOON = 6_000, 4_000


def tier_loop_on(
    broker: MemoryBroker, ledger: Ledger, stop: StopWhen, *, session_timeout_ms: int, freeze_s: float
) -> None:
    """Run a tier consumer whose records due within 5 s wait in memory, until `stop`; the process freezes for
    `freeze_s` in the consume after the call of id-0."""
    consumer = broker.consumer(TIER, session_timeout_ms=session_timeout_ms)
    loop = build_loop(
        broker, ledger, stop, topic=TIER, consumer=consumer, wait_in_memory_ms=5_000, max_wait_ms=100, batch_size=3
    )
    ledger.on_call = lambda record_id: consumer.freeze(freeze_s) if record_id == "id-0" else None
    run(loop, stop)


def test_records_waiting_in_memory_are_not_acted_on_after_a_freeze_that_cost_the_membership() -> None:
    """A freeze past the session: records 1 and 2, waiting in memory, are counted abandoned at the wake and
    handled only by the new membership, after the loss; every id ends in the DLQ once."""
    # setup: id-0 is due, id-1 and id-2 due in 1 s (they wait in memory); the freeze comes in the call of id-0
    broker = new_broker()
    tier_record(broker, 0, "id-0", failed_ago_ms=DUE_ALREADY)
    tier_record(broker, 1, "id-1", failed_ago_ms=DUE_SOON)
    tier_record(broker, 2, "id-2", failed_ago_ms=DUE_SOON)
    ledger = Ledger(broker, failing={"id-0", "id-1", "id-2"})
    stop = StopWhen(committed_all(broker, TIER, {0: 3}, topic=TIER))

    # when: the 20 s freeze outlasts the 6 s session
    tier_loop_on(broker, ledger, stop, session_timeout_ms=6_000, freeze_s=20)

    # then: 1 and 2 were counted abandoned at the wake, before librdkafka reported the loss ...
    lost = ledger.first(Event.PARTITIONS_LOST)
    abandoned = [(i, d["offset"]) for i, (e, d) in enumerate(ledger.seen) if e is Event.RECORD_ABANDONED]
    assert [offset for _, offset in abandoned] == [1] and abandoned[0][0] < lost
    # ... and handled only after it, by the new membership, once each: one DLQ record per id
    assert [record_id for record_id, events_before, _ in ledger.moments if events_before <= lost] == ["id-0"]
    assert ledger.calls == Counter({"id-0": 1, "id-1": 1, "id-2": 1})
    dead = hand_offs(broker, DLQ)
    assert [(i, h.original_offset) for i, h in dead] == [("id-0", 0), ("id-1", 1), ("id-2", 2)]
    assert [decode(list(m.headers)).original_topic for m in broker.records(DLQ)] == ["orders"] * 3


def test_a_freeze_that_kept_the_membership_acts_on_the_records_after_asking() -> None:
    """A freeze longer than half the session but shorter than it: the cycle asks the coordinator (a
    synchronous commit of what is finished), which accepts, and the records waiting in memory are handled."""
    # setup: as above, with a 45 s session
    broker = new_broker()
    tier_record(broker, 0, "id-0", failed_ago_ms=DUE_ALREADY)
    tier_record(broker, 1, "id-1", failed_ago_ms=DUE_SOON)
    ledger = Ledger(broker, failing={"id-0", "id-1"})
    stop = StopWhen(committed_all(broker, TIER, {0: 2}, topic=TIER))

    # when: the 30 s freeze is past half the 45 s session (the membership may have lapsed), within the session
    tier_loop_on(broker, ledger, stop, session_timeout_ms=45_000, freeze_s=30)

    # then: nothing lost or abandoned; id-1 was handled after the freeze, once
    assert not ledger.of(Event.PARTITIONS_LOST) and not ledger.of(Event.RECORD_ABANDONED)
    assert ledger.calls == Counter({"id-0": 1, "id-1": 1})
    (_, _, journal_at_0), (_, _, journal_at_1) = ledger.moments
    assert ledger.called_at["id-1"][0] - ledger.called_at["id-0"][0] >= 30_000
    # and: between the two calls, offset 1 was committed twice: on the ack of id-0's hand-off, and as the
    # question asked after the gap
    between = [e for e in broker.journal[journal_at_0:journal_at_1] if e[0] == "committed"]
    assert between == [("committed", TIER, TIER, 0, 1)] * 2


def test_a_freeze_before_anything_was_handled_reads_the_kept_records_again() -> None:
    """Nothing handled yet, so nothing to commit: the coordinator cannot be asked. The records kept from
    before the freeze are read again rather than acted on (librdkafka reports the loss before they arrive
    again)."""
    # setup: both records wait in memory; the freeze is injected before the first consume returns anything
    broker = new_broker()
    tier_record(broker, 1, "id-1", failed_ago_ms=DUE_SOON)
    tier_record(broker, 2, "id-2", failed_ago_ms=DUE_SOON)
    ledger = Ledger(broker, failing={"id-1", "id-2"})
    consumer = broker.consumer(TIER, session_timeout_ms=6_000)
    froze: list[bool] = []

    def freeze_once_queued() -> bool:
        if not froze and consumer.position((TIER, 0)) == 2:  # both fetched, neither due
            froze.append(True)
            consumer.freeze(20)
        return committed_all(broker, TIER, {0: 2}, topic=TIER)()

    stop = StopWhen(freeze_once_queued)
    loop = build_loop(broker, ledger, stop, topic=TIER, consumer=consumer, wait_in_memory_ms=5_000, max_wait_ms=100)

    # when
    run(loop, stop)

    # then: no call before the loss; both read again and handled once each by the new membership
    lost = ledger.first(Event.PARTITIONS_LOST)
    assert all(events_before > lost for _, events_before, _ in ledger.moments)
    assert [d["offset"] for d in ledger.of(Event.RECORD_ABANDONED)] == [0]
    assert ledger.calls == Counter({"id-1": 1, "id-2": 1})
    assert [i for i, _ in hand_offs(broker, DLQ)] == ["id-1", "id-2"]
