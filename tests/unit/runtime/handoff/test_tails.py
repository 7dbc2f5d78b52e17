"""A partition that ends in transaction markers or aborted records is committed to its end (runtime/handoff/tails.py),
on the in-memory broker, whose consumer position moves past them as a Kafka fetch does; and never past a record
that is not finished."""

from __future__ import annotations

import pytest

from retrytopics.testing import MemoryBroker

from ..kit import GROUP, TIER, Ledger, StopWhen, build_loop, new_broker, run


def _write_transactions(broker: MemoryBroker, committed: list[str], aborted: list[str]) -> None:
    producer = broker.producer(transactional_id="writer")
    producer.init_transactions(1)
    for ids, commit in ((committed, True), (aborted, False)):
        producer.begin_transaction()
        for record_id in ids:
            producer.produce(
                "orders", key=b"k", value=record_id.encode(), headers=[], partition=0, on_delivery=lambda *_: None
            )
        assert producer.flush(1) == 0  # written, so that an abort leaves aborted records, not purged ones
        (producer.commit_transaction if commit else producer.abort_transaction)(1)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_the_group_commits_past_markers_and_aborted_records(exactly_once: bool) -> None:
    # setup: a committed transaction of three records, then an aborted one of two: 3 + 1 + 2 + 1 offsets
    broker = new_broker()
    _write_transactions(broker, ["a", "b", "c"], ["x", "y"])
    end = broker.end_offsets("orders")[0]
    assert end == 7
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(lambda: broker.committed(GROUP).get(("orders", 0)) == end)

    # when
    run(build_loop(broker, ledger, stop, exactly_once=exactly_once), stop)

    # then: each committed record handled once, no aborted one, the end committed
    assert dict(ledger.calls) == {"a": 1, "b": 1, "c": 1}
    assert broker.committed(GROUP) == {("orders", 0): end}


def test_a_record_waiting_for_its_retry_holds_the_tail() -> None:
    # setup: an exactly-once main consumer fails a record into the tier, in a transaction (a marker follows it)
    broker = new_broker()
    _write_transactions(broker, ["a"], [])
    ledger = Ledger(broker, failing={"a"})
    stop = StopWhen(lambda: broker.committed(GROUP).get(("orders", 0)) == broker.end_offsets("orders")[0])
    run(build_loop(broker, ledger, stop, exactly_once=True), stop)
    tier_end = broker.end_offsets(TIER)[0]
    assert tier_end == 2
    tier_ledger = Ledger(broker, failing=set())
    committed_while_waiting: list[int] = []

    def handled_and_committed() -> bool:
        committed = broker.committed(TIER).get((TIER, 0), 0)
        if not tier_ledger.calls:
            committed_while_waiting.append(committed)
        return tier_ledger.calls["a"] == 1 and committed == tier_end

    waited = StopWhen(handled_and_committed)

    # when: the tier consumer reads the record, waits 5 s (the broker's clock) for it, handles it
    run(build_loop(broker, tier_ledger, waited, topic=TIER, exactly_once=True), waited)

    # then: while it waited, idle polls never committed past it; once handled, the marker is committed too
    assert len(committed_while_waiting) > 3 and set(committed_while_waiting) == {0}
    assert dict(tier_ledger.calls) == {"a": 1}
    assert broker.committed(TIER) == {(TIER, 0): tier_end}


def test_a_new_owner_that_reads_nothing_commits_past_the_tail() -> None:
    # setup: the group committed past the last record (3) but not past the marker and the aborted transaction
    broker = new_broker()
    _write_transactions(broker, ["a", "b", "c"], ["x", "y"])
    joined = broker.consumer(GROUP)
    joined.subscribe(["orders"], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)
    joined.consume(1, 0)
    joined.commit({("orders", 0): 3}, asynchronous=False)
    joined.close()
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(lambda: broker.committed(GROUP).get(("orders", 0)) == 7)

    # when: a new owner starts at 3 and is handed nothing
    run(build_loop(broker, ledger, stop, exactly_once=True), stop)

    # then: nothing handled, the end committed
    assert not ledger.calls
    assert broker.committed(GROUP) == {("orders", 0): 7}
