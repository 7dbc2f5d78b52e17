"""The consumer loop's own logic, on the in-memory broker (`retrytopics/testing/broker.py`).

Guarantees, each asserted on topic contents, decoded retry headers, committed offsets and a per-id ledger:

- at-least-once: a failure is republished to its tier, and its source offset is committed only after the
  broker acknowledged the hand-off; a failing republish holds its partition and nothing is committed past
  the record until a later produce succeeds (a too-large one goes to the DLQ instead);
- a rebalance mid-way commits what is finished, and the new owner reads the rest: every id is handled once;
- a lost partition commits nothing; its records are read again by the new membership;
- exactly-once: an aborted transaction leaves no visible hand-off, and its records are handled again;
- a tier record not yet due pauses its partition and is handled once due, not before.

The broker's clock is the loop's (`clock=broker.clock`): a consume that finds nothing advances it by its
timeout, so waits cost no real time. What Kafka does is proven on Apache Kafka
(`tests/integration/runtime/`), and this broker's behaviour by the contract test there.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import DlqReason, decode
from retrytopics.observe.events import Event
from retrytopics.runtime.consumer.loop import ConsumerLoop

from ..kit import (
    DLQ,
    GROUP,
    TIER,
    Ledger,
    StopWhen,
    build_loop,
    committed_all,
    delivered_at,
    fill,
    first_commit_past,
    hand_offs,
    new_broker,
    run,
    short_publish_backoff,
    tier_record,
)

# -- at-least-once -----------------------------------------------------------------------------------------


def test_a_failure_is_handed_off_to_its_tier_and_committed_only_after_the_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: six records, two of which fail; the broker acknowledges a republish only three polls later
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    broker.ack_after_polls = 3
    ledger = Ledger(broker, failing={"id-1", "id-4"})
    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: each id handled once; the failures are on the tier with their origin in the headers
    assert ledger.calls == Counter(ids)
    tier = hand_offs(broker, TIER)
    assert [(i, h.original_topic, h.original_offset, h.reconsume_times, h.tier) for i, h in tier] == [
        ("id-1", "orders", 1, 1, 0),
        ("id-4", "orders", 4, 1, 0),
    ]
    assert all(h.due_at is not None and h.due_at >= h.last_failed_at + 5000 for _, h in tier)
    # and: the commit covering each failed offset came after the ack of its hand-off
    for tier_offset, (_, headers) in enumerate(tier):
        acked = delivered_at(broker, TIER, 0, tier_offset)
        assert first_commit_past(broker, "orders", 0, headers.original_offset) > acked
    assert [d["offset"] for d in ledger.of(Event.RETRY_SCHEDULED)] == [1, 4]


def test_a_failed_asynchronous_commit_of_an_idle_partition_is_made_again() -> None:
    """The asynchronous commit covering three handled records fails (the client reports it later, as
    librdkafka's commit callback does) and the partition gets nothing more: the commit is made again at the
    next commit interval, so the group's committed offset catches up (before: it stayed behind for good, only
    logged), and never past a record not finished."""
    broker = new_broker()
    ids = ["id-0", "id-1", "id-2"]
    fill(broker, {0: ids})
    ledger = Ledger(broker, failing=set())
    consumer = broker.consumer(GROUP)
    consumer.fail_asynchronous_commits(1)
    stop = StopWhen(committed_all(broker, GROUP, {0: 3}))

    run(build_loop(broker, ledger, stop, consumer=consumer), stop)

    assert ledger.calls == Counter(ids)
    assert consumer.failed_commits() == {}, "the failure was taken by the hand-off"
    commits = [e for e in broker.journal if e[0] == "committed"]
    assert commits and {e[4] for e in commits} == {3}, "stored after the failed one, at the finished end only"


@pytest.mark.parametrize("code", ["NOT_ENOUGH_REPLICAS", "_MSG_TIMED_OUT"])
def test_a_failing_republish_holds_its_partition_and_nothing_is_committed_past_it_until_it_succeeds(
    code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOT_ENOUGH_REPLICAS is retried on the same producer; _MSG_TIMED_OUT replaces the producer first."""
    # setup: id-2 fails, and its first three republishes are refused
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    broker.fail_produces(3, code, retriable=code == "NOT_ENOUGH_REPLICAS", topic=TIER)
    ledger = Ledger(broker, failing={"id-2"})
    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: the republish was attempted 4 times and landed once; every id was handled once
    assert [d["attempt"] for d in ledger.of(Event.PUBLISH_FAILED)] == [1, 2, 3]
    assert [(i, h.original_offset) for i, h in hand_offs(broker, TIER)] == [("id-2", 2)]
    assert ledger.calls == Counter(ids)
    # and: no commit went past offset 2 before its hand-off was written; the partition was held meanwhile
    commits = [e[4] for e in broker.journal[: delivered_at(broker, TIER, 0, 0)] if e[0] == "committed"]
    assert commits and max(commits) <= 2
    assert {"partition": 0, "until": None}.items() <= ledger.of(Event.PARTITION_PAUSED)[0].items()
    assert bool(ledger.of(Event.PRODUCER_RECREATED)) == (code == "_MSG_TIMED_OUT")


def test_a_republish_refused_as_too_large_goes_to_the_dlq(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: the broker refuses id-1's tier record as too large, and again when it is sent alone
    broker = new_broker()
    fill(broker, {0: ["id-0", "id-1", "id-2"]})
    broker.fail_produces(2, "MSG_SIZE_TOO_LARGE", topic=TIER)
    ledger = Ledger(broker, failing={"id-1"})
    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, GROUP, {0: 3}))

    # when
    run(build_loop(broker, ledger, stop), stop)

    # then: nothing on the tier; the DLQ has id-1 with reason too_large and its origin
    assert hand_offs(broker, TIER) == []
    [(record_id, headers)] = hand_offs(broker, DLQ)
    assert (record_id, headers.dlq_reason, headers.original_offset) == ("id-1", DlqReason.TOO_LARGE, 1)


# -- rebalances --------------------------------------------------------------------------------------------


def test_a_rebalance_mid_way_commits_what_is_finished_and_the_new_owner_reads_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: two partitions of 8 records; every third id fails; a second member joins after the 5th call
    broker = new_broker(partitions=2)
    ids = {p: [f"id-{p}-{i}" for i in range(8)] for p in (0, 1)}
    fill(broker, ids)
    broker.ack_after_polls = 10  # hand-offs are in flight when the rebalance comes
    failing = {f"id-{p}-{i}" for p in (0, 1) for i in range(1, 8, 3)}
    ledger = Ledger(broker, failing)
    short_publish_backoff(monkeypatch)
    newcomer = broker.consumer(GROUP)

    def join_after_five(_id: str) -> None:
        if sum(ledger.calls.values()) == 5:
            newcomer.subscribe(["orders"], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)

    ledger.on_call = join_after_five
    first_stop = StopWhen(lambda: broker.committed(GROUP).get(("orders", 0)) == 8)

    # when: the first member runs until its remaining partition is done, then the newcomer runs
    run(build_loop(broker, ledger, first_stop), first_stop)
    handed_over = broker.committed(GROUP)[("orders", 1)]
    second_stop = StopWhen(committed_all(broker, GROUP, {0: 8, 1: 8}))
    run(build_loop(broker, ledger, second_stop, consumer=newcomer), second_stop)

    # then: the first member revoked both partitions before keeping one; it had finished part of partition 1
    assert next(d["partitions"] for d in ledger.of(Event.PARTITIONS_REVOKED)) == [("orders", 0), ("orders", 1)]
    assert [d["partitions"] for d in ledger.of(Event.PARTITIONS_ASSIGNED)][1] == [("orders", 0)]
    assert 0 < handed_over < 8
    # and: every id was handled exactly once, every failure handed off exactly once
    assert ledger.calls == Counter(i for p in (0, 1) for i in ids[p])
    tier = Counter(i for i, _ in hand_offs(broker, TIER))
    assert tier == Counter(failing)


def test_a_lost_partition_commits_nothing_and_its_records_are_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: the group expels the member while it handles id-2 (its session lapsed, say)
    broker = new_broker()
    ids = [f"id-{i}" for i in range(6)]
    fill(broker, {0: ids})
    ledger = Ledger(broker, failing=set())
    short_publish_backoff(monkeypatch)
    consumer = broker.consumer(GROUP)
    seen: dict[str, Any] = {}

    def expel_at_id_2(record_id: str) -> None:
        if record_id == "id-2" and "expelled" not in seen:
            consumer.expel()
            seen["expelled"] = (broker.committed(GROUP), len(broker.journal))

    ledger.on_call = expel_at_id_2
    stop = StopWhen(committed_all(broker, GROUP, {0: 6}))

    # when
    run(build_loop(broker, ledger, stop, consumer=consumer, batch_size=2), stop)

    # then: the batch finished by the expelled member was not committed (the commit was refused) ...
    committed_then, journal_then = seen["expelled"]
    assert committed_then == {("orders", 0): 2}
    assert consumer.refused_commits == [{("orders", 0): 4}]
    assert [d["partitions"] for d in ledger.of(Event.PARTITIONS_LOST)] == [[("orders", 0)]]
    # the next commit the group took is the new membership's, after it read id-2 and id-3 again
    assert broker.journal[journal_then:][0] == ("committed", GROUP, "orders", 0, 4)
    assert len(ledger.of(Event.PARTITIONS_ASSIGNED)) == 2
    # ... and the new membership read its records again from the committed offset: at least once
    assert ledger.calls == Counter({**Counter(ids), "id-2": 2, "id-3": 2})


# -- exactly-once ------------------------------------------------------------------------------------------


def test_an_aborted_transaction_leaves_no_visible_hand_off_and_its_records_are_handled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: id-1 and id-2 fail; the first transaction's second hand-off is refused, so it aborts
    broker = new_broker()
    ids = [f"id-{i}" for i in range(4)]
    fill(broker, {0: ids})
    ledger = Ledger(broker, failing={"id-1", "id-2"})
    short_publish_backoff(monkeypatch)
    broker.fail_produces(1, "NOT_ENOUGH_REPLICAS", topic=TIER)
    first_written = len(broker.journal)
    stop = StopWhen(committed_all(broker, GROUP, {0: 4}))

    # when
    run(build_loop(broker, ledger, stop, exactly_once=True, batch_size=4), stop)

    # then: the transaction aborted once; the batch was handled again and handed off in the next one
    assert len(ledger.of(Event.TRANSACTION_ABORTED)) == 1
    assert ledger.calls == Counter(dict.fromkeys(ids, 2))
    visible = hand_offs(broker, TIER)
    assert [(i, h.original_offset) for i, h in visible] == [("id-1", 1), ("id-2", 2)]
    # and: the aborted hand-off was written but no read_committed reader sees it
    everything = broker.records(TIER, read_committed=False)
    aborted = [m for m in everything if m.offset not in {v.offset for v in broker.records(TIER)}]
    assert [m.value for m in aborted] == [b"id-2"]
    tier_writes = [e for e in broker.journal[first_written:] if e[:2] == ("delivered", TIER)]
    assert tier_writes[0][3] == aborted[0].offset  # the first write to the tier is the aborted one


# -- tiers -------------------------------------------------------------------------------------------------


def test_a_tier_record_not_yet_due_pauses_its_partition_and_is_handled_once_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: two tier records failed 1 s apart; waiting happens in Kafka (paused), not in memory
    broker = new_broker()
    tier_record(broker, 0, "id-0")
    broker.clock.advance(1.0)
    tier_record(broker, 1, "id-1")
    due = {m.value.decode(): decode(list(m.headers)).due_at for m in broker.records(TIER)}
    ledger = Ledger(broker, failing=set())
    short_publish_backoff(monkeypatch)
    stop = StopWhen(committed_all(broker, TIER, {0: 2}, topic=TIER))

    # when
    run(build_loop(broker, ledger, stop, topic=TIER, wait_in_memory_ms=0, max_wait_ms=1000), stop)

    # then: each handled once, when due (the clock only moves in waits, so "late" is the loop's own rounding)
    assert ledger.calls == Counter({"id-0": 1, "id-1": 1})
    for record_id, (handled_at,) in ledger.called_at.items():
        assert 0 <= handled_at - due[record_id] <= 10, record_id
    # and: the partition was paused until each one was due, and resumed
    paused = [d["until"] for d in ledger.of(Event.PARTITION_PAUSED)]
    assert paused[:2] == [due["id-0"], due["id-1"]]
    assert len(ledger.of(Event.PARTITION_RESUMED)) >= 2


# -- lifecycle of the loop ---------------------------------------------------------------------------------


def test_a_client_that_cannot_be_created_stops_the_app_with_the_error() -> None:
    """A consumer or producer that cannot be created stops the app with `crash` set, rather than ending the
    loop's thread silently while the app reports itself running and healthy."""
    broker = new_broker()
    stop = threading.Event()

    def refuse() -> Any:
        raise KafkaClientError("the client could not be created", code="_INVALID_ARG")

    loop = build_loop(broker, Ledger(broker, failing=set()), stop, consumer_factory=refuse)

    loop.run()  # returns: the thread ends with the error recorded, not with an uncaught exception
    assert isinstance(loop.crash, KafkaClientError)
    assert stop.is_set()  # every other loop of the app stops too, and run() re-raises the crash
    assert not loop.running and not loop.healthy
    assert broker.committed(GROUP) == {}


def test_a_consumer_that_never_joins_its_group_is_unhealthy_within_the_join_timeout() -> None:
    """A member that cannot join (here: the group's rebalance waits for a member that holds the partition
    and never polls again) makes the loop unhealthy once `join_timeout_s` has passed on its clock, and
    healthy again once it joins."""
    # setup: a first member holds the topic's partition and stops polling
    broker = new_broker()
    fill(broker, {0: ["id-0"]})
    blocker = broker.consumer(GROUP)
    blocker.subscribe(["orders"], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)
    blocker.consume(1, 0)
    assert blocker.assignment == [("orders", 0)]
    ledger = Ledger(broker, failing=set())
    started = broker.clock.monotonic()
    health: list[tuple[float, bool]] = []
    loop: ConsumerLoop

    def sample() -> bool:
        elapsed = broker.clock.monotonic() - started
        health.append((elapsed, loop.healthy))
        if elapsed > 95 and blocker.assignment:
            blocker.consume(1, 0)  # it polls at last: it revokes, and the group settles with both members
        return bool(ledger.of(Event.PARTITIONS_ASSIGNED)) and elapsed > 96

    stop = StopWhen(sample)
    loop = build_loop(broker, ledger, stop, join_timeout_s=30, max_wait_ms=1000)

    # when
    run(loop, stop)

    # then: healthy while joining within 30 s, unhealthy from past 30 s until it joined, healthy after
    joined_at = next(t for t, _ in health if t > 95)  # the blocker revoked then; the loop joins at once
    assert all(ok for t, ok in health if t <= 30)
    late = [ok for t, ok in health if 31 <= t < joined_at]
    assert late and not any(late)
    assert health[-1][1]
    # and: once joined, it owns the partition (the range plan gives it to the later member) and handles it
    assert [d["partitions"] for d in ledger.of(Event.PARTITIONS_ASSIGNED)] == [[("orders", 0)]]
    assert ledger.calls == Counter({"id-0": 1})
