"""One clock for the whole runtime (runtime/clock.py): a consumer loop given the in-memory broker's
`MemoryClock` measures its commit interval and its records' due times on that clock, so a test moves time
instead of waiting for it (the broker advances the clock by a consume's timeout when it has nothing to
deliver).
"""

from __future__ import annotations

from typing import Any

from retrytopics.core.headers import decode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import RouteContext
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker

from .kit import GROUP, Ledger, StopWhen, build_loop, committed_all, fill, new_broker, run, tier_record

SLOW = RouteContext(policy=RetryPolicy(delays=["30s"]), topics=topics_for("orders", GROUP, (30_000,)), group=GROUP)
SLOW_TIER = SLOW.topics.tiers[0].topic


class Commits:
    """When (on the broker's clock) each commit was made, and what it committed."""

    wanted_events = frozenset({Event.OFFSETS_COMMITTED})

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.seen: list[tuple[int, dict[Any, int]]] = []

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        self.seen.append((self.broker.clock.now_ms(), dict(data["offsets"])))


def test_a_loop_commits_by_commit_interval_measured_on_its_clock() -> None:
    """Successes are committed once `commit_interval_ms` has passed on the loop's clock, not on the
    process's: no commit before it, and the first commit within one poll's wait after it."""
    # setup: three records that succeed; only the interval (5 s) can make the loop commit
    broker = new_broker()
    fill(broker, {0: ["id-0", "id-1", "id-2"]})
    ledger = Ledger(broker, failing=set())
    commits = Commits(broker)
    stop = StopWhen(committed_all(broker, GROUP, {0: 3}))
    loop = build_loop(
        broker,
        ledger,
        stop,
        hooks=[commits],
        commit_every=1_000,
        commit_interval_ms=5_000,
        commit_on_ack=False,
        max_wait_ms=100,
    )

    # when
    run(loop, stop)

    # then: all three handled at once, and committed 5 s later on the broker's clock (one poll's wait late
    # at most, and a float's rounding)
    handled_at = {t for times in ledger.called_at.values() for t in times}
    assert len(handled_at) == 1
    (committed_at, offsets), *at_shutdown = commits.seen
    assert offsets == {("orders", 0): 3}
    assert 5_000 <= committed_at - handled_at.pop() <= 5_000 + 2 * 100
    assert all(same == offsets for _, same in at_shutdown)  # the shutdown commits the same offsets again


def test_a_tier_record_due_in_30_s_is_handled_once_the_loops_clock_has_advanced_30_s() -> None:
    """A record due 30 s from now waits, paused in Kafka, until the loop's clock says it is due: never
    before, and within one poll's wait after."""
    # setup: a record that failed just now on the 30 s tier
    broker = MemoryBroker()
    broker.create_topics(["orders", SLOW_TIER, SLOW.topics.dlq])
    msg = tier_record(broker, 0, "id-0", ctx=SLOW)
    due = decode(list(msg.headers)).due_at
    assert due == broker.clock.now_ms() + 30_000
    ledger = Ledger(broker, failing=set())
    stop = StopWhen(committed_all(broker, SLOW_TIER, {0: 1}, topic=SLOW_TIER))

    # when
    run(build_loop(broker, ledger, stop, topic=SLOW_TIER, ctx=SLOW, max_wait_ms=1_000), stop)

    # then: handled once, when due on the broker's clock; the partition was paused until then
    [handled_at] = ledger.called_at["id-0"]
    assert due <= handled_at <= due + 1_000
    assert [d["until"] for d in ledger.of(Event.PARTITION_PAUSED)] == [due]
