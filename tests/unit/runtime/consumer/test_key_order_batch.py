"""Key-ordered retries for a batch handler (docs/key-ordering.md, section 8), end to end on the in-memory broker:
a `RetryApp` running its main consumer and its tier consumers, one batch handler for the source and every tier.

Guarantees, proven by a ledger of every call (the records it held, each record's outcome) and of every DLQ write,
for any interleaving of a few keys' records (null keys among them), any mix of successes, failures (reported
per record through `BatchFailed`) and dead letters, any batch size, and both `dead_head` policies:

- a call never holds two records of one key;
- for every key, no record is handled before every earlier record of its key is terminal (handled
  successfully, or committed in the DLQ: what a read_committed reader of the DLQ sees when the call starts,
  not when `on_dead_letter` runs, which with exactly-once is after the commit, on the thread that committed,
  while another consumer may already have released the key);
- every record is accounted for: handled successfully, or in the DLQ once with its reason: `exhausted` for
  those that always fail, `blocked_by_key` only under `dead_letter`, never handled, behind one of its key's
  exhausted records (one that always fails may be either); records with a null key are handled or
  dead-lettered like any other;
- a partition never has more than `max_blocked_keys` open chains, however many records of a call fail.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from retrytopics import BatchFailed, KafkaConfig, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.core.headers import decode
from retrytopics.observe.events import Event
from retrytopics.testing import MemoryBroker, MemoryClientFactory

from ..kit import eventually

POLICY = RetryPolicy(delays=["20ms", "40ms"], max_retries=2)
PARTITIONS = 2
ALWAYS = 99  # a record that always fails: dead-lettered as exhausted after its retries


class CallLedger:
    """Every batch call (the records it held) and every outcome, in the order they happened."""

    def __init__(self, failures: dict[int, int], committed_dead_letters: Callable[[], set[int]]) -> None:
        self.lock = threading.Lock()
        self.failures = failures  # record number -> how many times its handler fails
        self.committed_dead_letters = committed_dead_letters  # read_committed, as a reader of the DLQ sees it
        self.attempts: dict[int, int] = {}
        self.calls: list[list[tuple[bytes | None, int]]] = []
        #: (what, record number): ok, fail, or dlq (seen committed in the DLQ before a call)
        self.events: list[tuple[str, int]] = []
        self.announced: list[int] = []  # `on_dead_letter` calls
        #: (dead-lettered record, record): its `on_dead_letter` returns once that record was handled
        self.hold_announcement: tuple[int, int] | None = None
        self.handled = threading.Condition(self.lock)
        #: the most open chains a partition had (`key_order.blocked` events)
        self.most_blocked = 0

    wanted_events = frozenset({Event.KEY_ORDER_BLOCKED})

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        with self.lock:
            self.most_blocked = max(self.most_blocked, int(data["blocked_keys"]))

    def handle(self, records: list[Record[bytes]]) -> None:
        failed: list[tuple[Record[bytes], BaseException]] = []
        with self.lock:
            seen = {n for what, n in self.events if what == "dlq"}
            self.events += [("dlq", n) for n in sorted(self.committed_dead_letters() - seen)]
            self.calls.append([(r.key, int(r.value)) for r in records])
            for r in records:
                n = int(r.value)
                attempt = self.attempts[n] = self.attempts.get(n, 0) + 1
                if attempt <= self.failures[n]:
                    failed.append((r, RuntimeError(f"record {n} fails ({attempt})")))
                self.events.append(("fail" if attempt <= self.failures[n] else "ok", n))
            self.handled.notify_all()
        if failed:
            raise BatchFailed(failed)

    def dead_lettered(self, record: Record[bytes], route: Any) -> None:
        with self.lock:
            n = int(record.value)
            self.announced.append(n)
            if self.hold_announcement is not None and self.hold_announcement[0] == n:
                waited_for = self.hold_announcement[1]
                self.handled.wait_for(lambda: ("ok", waited_for) in self.events, timeout=30)


def dead_letters(broker: MemoryBroker, app: RetryApp) -> dict[int, str]:
    out: dict[int, str] = {}
    for msg in broker.records(app.topics("orders").dlq):
        assert msg.value is not None
        n = int(msg.value)
        assert n not in out, "each record is dead-lettered once"
        out[n] = str(decode(list(msg.headers)).dlq_reason)
    return out


def run_app(
    keys: list[int | None],
    failures: list[int],
    batch_size: int,
    dead_head: str,
    max_blocked_keys: int = 1_000,
    exactly_once: bool = False,
    hold_announcement: tuple[int, int] | None = None,
) -> tuple[CallLedger, dict[int, str]]:
    """Records 0..n-1 (`keys[n]`: key `k<keys[n]>`, or none) in one batch-handler app until each is terminal;
    `hold_announcement` (m, n): the `on_dead_letter` call of record m returns only once n was handled."""
    broker = MemoryBroker()
    broker.create_topics(["orders"], PARTITIONS)
    app: RetryApp | None = None

    def committed_dead_letters() -> set[int]:
        return set() if app is None else {int(m.value or b"") for m in broker.records(app.topics("orders").dlq)}

    ledger = CallLedger(dict(enumerate(failures)), committed_dead_letters)
    ledger.hold_announcement = hold_announcement
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        clients=MemoryClientFactory(broker),
        on_dead_letter=ledger.dead_lettered,
        batch_size=batch_size,
        hooks=[ledger],
        exactly_once=exactly_once,
    )
    ordering = KeyOrdering(dead_head=dead_head, max_blocked_keys=max_blocked_keys)
    app.batch_handler("orders", policy=POLICY, ordering=ordering)(ledger.handle)
    app.provision(partitions=PARTITIONS)
    for n, key in enumerate(keys):
        partition = n % PARTITIONS if key is None else key % PARTITIONS
        broker.append("orders", str(n).encode(), key=None if key is None else f"k{key}".encode(), partition=partition)

    def terminal() -> bool:
        with ledger.lock:
            ok = {n for what, n in ledger.events if what == "ok"}
        return ok | set(dead_letters(broker, app)) >= set(range(len(keys)))

    app.start(main=True, tiers="all")
    try:
        eventually(terminal, timeout_s=60)
    finally:
        assert app.stop(30)
    assert app.error is None
    dlq = dead_letters(broker, app)
    assert sorted(ledger.announced) == sorted(dlq), "on_dead_letter runs once for each committed dead letter"
    return ledger, dlq


def check(keys: list[int | None], failures: list[int], dead_head: str, ledger: CallLedger, dlq: dict[int, str]) -> None:
    """The module docstring's guarantees, from the ledger."""
    for call in ledger.calls:
        keyed = [key for key, _ in call if key is not None]
        assert len(keyed) == len(set(keyed)), f"a call held two records of one key: {call}"
    done: set[int] = set()
    for what, n in ledger.events:
        if what != "dlq" and keys[n] is not None:
            earlier = [m for m in range(n) if keys[m] == keys[n] and m not in done]
            assert not earlier, f"record {n} (key {keys[n]}) handled before {earlier} were terminal"
        if what != "fail":
            done.add(n)
    ok = {n for what, n in ledger.events if what == "ok"}
    assert ok | set(dlq) == set(range(len(keys))) and not ok & set(dlq), "handled or dead-lettered, not both"
    assert set(dlq.values()) <= {"exhausted", "blocked_by_key"}
    exhausted = {n for n, why in dlq.items() if why == "exhausted"}
    blocked = {n for n, why in dlq.items() if why == "blocked_by_key"}
    always = {n for n, f in enumerate(failures) if f == ALWAYS}
    if dead_head == "release":
        assert exhausted == always and not blocked
    else:  # one that always fails may wait behind a dead-lettered one: then it never ran
        assert exhausted <= always <= exhausted | blocked
    for n in blocked:  # behind an exhausted record of its key, and never handled
        assert any(keys[m] == keys[n] and dlq.get(m) == "exhausted" for m in range(n)), n
        assert n not in ledger.attempts, f"record {n} is blocked_by_key but was handled"


scenarios = st.integers(min_value=1, max_value=24).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(st.integers(0, 3), st.integers(0, 3), st.none()), min_size=n, max_size=n),
        st.lists(st.sampled_from([0, 0, 0, 1, 2, ALWAYS]), min_size=n, max_size=n),
    )
)


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=scenarios,
    batch_size=st.integers(1, 8),
    dead_head=st.sampled_from(["release", "dead_letter"]),
    max_blocked_keys=st.sampled_from([1, 2, 1_000]),
)
@example(scenario=([0, 2, 0, 2], [1, 1, 0, 0]), batch_size=8, dead_head="release", max_blocked_keys=1)
def test_a_batch_handler_keeps_every_key_in_source_order(
    scenario: tuple[list[int | None], list[int]], batch_size: int, dead_head: str, max_blocked_keys: int
) -> None:
    """Any interleaving of a few keys' records with any mix of outcomes, any batch size, either policy, a bound
    of 1, 2 or 1,000 blocked keys: no call holds two records of one key, each key's records are handled in
    source order behind terminal ones, every record is handled or dead-lettered with its reason, and the bound
    holds (module docstring)."""
    keys, failures = scenario
    ledger, dlq = run_app(keys, failures, batch_size, dead_head, max_blocked_keys)
    check(keys, failures, dead_head, ledger, dlq)
    assert ledger.most_blocked <= max_blocked_keys


def test_many_records_of_one_key_in_one_poll_cut_the_call_and_followers_wait_behind_a_failure() -> None:
    """One poll of 12 records of one partition: keys a, b, a, c, a, b and again; the second record of `a` fails
    once. Calls are cut before a key's second record, so no call holds a key twice; `a`'s later records follow
    the failed one into the tier (not one of them is handled before its retry succeeded), while `b` and `c` go
    on; all terminal."""
    keys: list[int | None] = [0, 2, 0, 4, 0, 2] * 2  # even keys: partition 0
    failures = [0] * 12
    failures[2] = 1
    ledger, dlq = run_app(keys, failures, 500, "release")
    check(keys, failures, "release", ledger, dlq)
    first = ledger.calls[0]
    assert [n for _, n in first] == [0, 1], "the first call is cut before record 2, key a's second"
    assert ledger.attempts[2] == 2 and not dlq
    retried = ledger.events.index(("ok", 2))
    assert all(ledger.events.index(("ok", n)) > retried for n in (4, 6, 8, 10)), "a's later records wait behind 2"


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=scenarios,
    batch_size=st.integers(1, 8),
    dead_head=st.sampled_from(["release", "dead_letter"]),
    max_blocked_keys=st.sampled_from([1, 2, 1_000]),
)
@example(  # record 9 dead-lettered as blocked_by_key in a tier; 12 handled on the main consumer once committed
    scenario=([0, None, None, None, None, None, 3, 2, 1, 2, 1, 0, 2, 2], [0, 0, 0, 99, 99, 0, 2, 99, 0, 0, 0, 0, 0, 0]),
    batch_size=4,
    dead_head="dead_letter",
    max_blocked_keys=1,
)
def test_a_batch_handler_keeps_every_key_in_source_order_with_exactly_once(
    scenario: tuple[list[int | None], list[int]], batch_size: int, dead_head: str, max_blocked_keys: int
) -> None:
    """The same guarantees with `exactly_once=True`: hops, key-state records and offsets in each batch's
    transaction, a dead letter acknowledged to key order at its commit."""
    keys, failures = scenario
    ledger, dlq = run_app(keys, failures, batch_size, dead_head, max_blocked_keys, exactly_once=True)
    check(keys, failures, dead_head, ledger, dlq)
    assert ledger.most_blocked <= max_blocked_keys


def test_with_exactly_once_a_follower_released_by_a_dead_letter_runs_once_it_is_committed_not_announced() -> None:
    """Key 3's head (record 9) always fails; key 1's record 11 cannot open a second chain (`max_blocked_keys=1`),
    so partition 1 waits until the tier's dead letter of 9 closes key 3's chain, and the main consumer, which
    learns that from the committed passage, then handles 11 and 12 itself. 9's `on_dead_letter` runs after the
    tier's commit, on the tier's thread: here it returns only once 12 was handled, so 12 runs before 9 is
    announced (a ledger that counted a dead letter terminal at its announcement saw an inversion there), yet
    after the dead letter was committed, which is what the guarantee is about."""
    keys: list[int | None] = [0, 0, None, None, 0, 0, None, 0, None, 3, None, 1, 3, None, None, None]
    failures = [0] * len(keys)
    failures[9] = ALWAYS
    ledger, dlq = run_app(keys, failures, 2, "release", 1, exactly_once=True, hold_announcement=(9, 12))
    check(keys, failures, "release", ledger, dlq)
    assert ledger.events.index(("dlq", 9)) < ledger.events.index(("ok", 12)), "9 was committed before 12 ran"
