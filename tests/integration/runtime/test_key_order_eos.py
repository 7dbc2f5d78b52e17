"""Key-ordered retries with `exactly_once=True` on Apache Kafka (docs/key-ordering.md, section 8).

Guarantee: with follower hops, key-state records and offsets in one transaction per batch, committed outcomes
are in order and each is committed once. A per-key ledger of every handler call and DLQ write shows no record
handled before every earlier record of its key was terminal (its success, or its dead letter committed); what
a read_committed reader sees holds every retried hop once and every dead letter once; the group's committed
offsets reach the end of the source. Also when a transaction holding a follower hop aborts while keys are
blocked: the key state is rebuilt from the key-state topic (read_committed) and the batch read again, so the
aborted follower is handed off again, not taken for a record already behind its chain, and nothing is lost.
And across SIGKILLs of the tier consumers and of the main consumer inside their transactions: a key-state
read at assignment waits for every transaction open in the topic when it began, so a restarted consumer
rebuilds what its predecessor committed behind another producer's open transaction.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from retrytopics import Event, KeyOrdering, RetryApp, RetryPolicy
from retrytopics.client_factory import KafkaClientFactory
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_producer
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import Header
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import Admission, Admit, SourceChains
from retrytopics.core.keyorder.state_records import Chain, Fate, Passage, encode_record
from retrytopics.core.ports import DeliveryCallback, Message, ProducerPort
from retrytopics.runtime.keyorder.key_state import read_key_state

from .conftest import Kit, wait_until
from .test_key_order import (
    _KEYS,
    _PER_KEY,
    _assert_key_order,
    _KeyLedger,
    _ledger,
    _spawn_worker,
    _terminal,
    _until_killed,
    _worker_app,
)
from .test_key_order import _produce as _produce_seqs

pytestmark = pytest.mark.broker

_POLICY = RetryPolicy(delays=["200ms", "400ms"], max_retries=3)
_FOLLOWER_HEADER = "retry.key_order.after"


class _Aborts:
    """How many transactions the app's consumers aborted."""

    def __init__(self) -> None:
        self.count = 0

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is Event.TRANSACTION_ABORTED:
            self.count += 1


class _FailFirstFollower(KafkaClientFactory):
    """Apache Kafka clients whose producers refuse the first follower hop they are given (as librdkafka refuses
    a record at once): the transaction it was meant for fails, and its commit aborts it."""

    def __init__(self, kafka: KafkaConfig) -> None:
        super().__init__(kafka)
        self.lock = threading.Lock()
        self.left = 1

    def producer(self, transactional_id: str | None, overrides: Mapping[str, Any]) -> ProducerPort:
        return _FailingProducer(super().producer(transactional_id, overrides), self)


class _FailingProducer:
    """A producer that refuses the first follower hop its factory sees; the rest is its own."""

    def __init__(self, inner: ProducerPort, factory: _FailFirstFollower) -> None:
        self._inner = inner
        self._factory = factory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        partition: int | None,
        on_delivery: DeliveryCallback,
    ) -> None:
        if any(name == _FOLLOWER_HEADER for name, _ in headers):
            with self._factory.lock:
                fail, self._factory.left = self._factory.left > 0, self._factory.left - 1
            if fail:
                raise KafkaClientError(f"produce to {topic} refused (injected)", code="INVALID_RECORD")
        self._inner.produce(topic, key=key, value=value, headers=headers, partition=partition, on_delivery=on_delivery)


def _produce(kit: Kit, source: str) -> None:
    """Records `"<key>:<seq>"` of key `acct-<key>`, key k in partition k % 3, in seq order."""
    for seq in range(_PER_KEY):
        for p in range(3):
            records = [(f"acct-{k}".encode(), f"{k}:{seq}".encode(), []) for k in range(_KEYS) if k % 3 == p]
            kit.produce(source, records, partition=p)  # type: ignore[arg-type]


def _run(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    dead_head: str,
    clients: KafkaClientFactory | None = None,
    *,
    batch: bool = False,
) -> tuple[_KeyLedger, _Aborts, RetryApp, str, str]:
    source = kit.create(unique_name("orders"), 3)
    group = unique_name("billing")
    ledger, aborts = _KeyLedger(), _Aborts()
    app = RetryApp(
        kafka=kafka,
        group=group,
        on_dead_letter=ledger.dead_lettered,
        consumer_overrides=consumer_overrides,
        exactly_once=True,
        hooks=[aborts],
        clients=clients,
    )
    register = app.batch_handler if batch else app.handler
    register(source, policy=_POLICY, ordering=KeyOrdering(dead_head=dead_head))(
        ledger.handle_batch if batch else ledger.handle
    )
    app.provision()
    _produce(kit, source)
    apps.append(app)
    app.start(main=True, tiers="all")
    every = {(k, s) for k in range(_KEYS) for s in range(_PER_KEY)}
    wait_until(lambda: ledger.terminal() >= every, 120, "every record handled or dead-lettered")
    wait_until(lambda: kit.committed(group, source, 3) == {0: 20, 1: 20, 2: 20}, 30, "the source committed")
    assert app.stop(30) and app.error is None
    return ledger, aborts, app, source, group


def _check(kit: Kit, ledger: _KeyLedger, app: RetryApp, source: str, dead_head: str) -> None:
    """The ledger's order, every record accounted for once, and each committed hop and dead letter once."""
    every = {(k, s) for k in range(_KEYS) for s in range(_PER_KEY)}
    done: set[tuple[int, int]] = set()
    for what, key, seq, _ in ledger.events:
        if what != "dlq":
            missing = [(key, s) for s in range(seq) if (key, s) not in done]
            assert not missing, f"key {key} record {seq} handled before {missing} were terminal"
        if what != "fail":
            done.add((key, seq))
    dlq: dict[tuple[int, int], str] = {}
    for read in kit.read_all(app.topics(source).dlq):
        assert read.value is not None
        key, seq = (int(part) for part in read.value.decode().split(":"))
        assert (key, seq) not in dlq, "each record is dead-lettered once (read_committed)"
        dlq[(key, seq)] = (read.header("retry.dlq_reason") or b"").decode()
    ok = {(k, s) for what, k, s, _ in ledger.events if what == "ok"}
    assert ok | set(dlq) == every and not ok & set(dlq)
    assert {r for r, why in dlq.items() if why == "exhausted"} == {(k, 2) for k in range(_KEYS) if k % 4 == 3}
    blocked = {r for r, why in dlq.items() if why == "blocked_by_key"}
    assert all(k % 4 == 3 and s > 2 for k, s in blocked) and bool(blocked) == (dead_head == "dead_letter")
    hops: Counter[tuple[str, int, bytes | None, bytes | None]] = Counter()  # tier, partition, value, attempt
    for tier in app.topics(source).tiers:
        for read in kit.read_all(tier.topic):
            if read.header(_FOLLOWER_HEADER) is None:
                hops[(tier.topic, read.partition, read.value, read.header("retry.reconsume_times"))] += 1
    assert hops and max(hops.values()) == 1, f"retried hops committed more than once: {hops.most_common(3)}"


@pytest.mark.parametrize("dead_head", ["release", "dead_letter"])
def test_exactly_once_every_key_is_handled_in_source_order_and_each_outcome_committed_once(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    dead_head: str,
) -> None:
    """Guarantee (module docstring), with no transaction aborted: no handler call repeated either, and
    followers were handled in the tiers."""
    ledger, aborts, app, source, _ = _run(kafka, kit, apps, unique_name, consumer_overrides, dead_head)
    _check(kit, ledger, app, source, dead_head)
    assert aborts.count == 0
    assert max(Counter((k, s) for what, k, s, _ in ledger.events if what == "ok").values()) == 1
    assert any(in_tier and what == "ok" and ledger.calls[(k, s)] == 1 for what, k, s, in_tier in ledger.events)


def test_exactly_once_a_key_ordered_batch_handler_commits_each_key_in_source_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
) -> None:
    """Guarantee (module docstring) for a batch handler (failures reported per record through `BatchFailed`)
    under `dead_letter`: the same ledger, each committed hop and dead letter once, and no call held two
    records of one key."""
    ledger, _aborts, app, source, _ = _run(kafka, kit, apps, unique_name, consumer_overrides, "dead_letter", batch=True)
    _check(kit, ledger, app, source, "dead_letter")
    assert ledger.batches, "the batch handler was called"
    for keys in ledger.batches:
        keyed = [k for k in keys if k is not None]
        assert len(keyed) == len(set(keyed)), f"a call held two records of one key: {keys}"


def test_exactly_once_an_aborted_transaction_while_keys_are_blocked_keeps_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
) -> None:
    """Guarantee (module docstring): the first follower hop is refused by the producer, so the transaction
    holding it (and the chain record that moved its key's frontier to it) aborts while its key is blocked; the
    ledger still holds and every record and hop is accounted for once."""
    clients = _FailFirstFollower(kafka)
    ledger, aborts, app, source, _ = _run(kafka, kit, apps, unique_name, consumer_overrides, "release", clients)
    assert clients.left <= 0, "the follower hop failed"
    assert aborts.count >= 1
    _check(kit, ledger, app, source, "release")


def test_the_key_state_read_waits_for_transactions_open_when_it_began(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    """Guarantee (reading at assignment, exactly-once): a key-state partition is written in the transactions of
    several producers (the main consumer's chain records, each tier consumer's passages). read_committed stops
    at the first open transaction (the last stable offset), and what other producers committed after its first
    record lies beyond it: a read that took that for the end rebuilt a new owner's chains without the records
    its predecessor had committed last (and the offsets past them), so it handled or sent a blocked key's
    record before earlier ones. The read goes on to the end as it was when it began, once every transaction
    open then is decided: here a producer's transaction (a tier consumer killed mid-batch) holds a passage and
    a chain record is committed after it; the read gives that chain record, and nothing of the aborted one."""
    source = kit.create(unique_name("orders"), 1)
    app = RetryApp(kafka=kafka, group=unique_name("billing"))
    app.handler(source, policy=_POLICY, ordering=KeyOrdering())(lambda record: None)
    app.provision()
    topic = app.topics(source).key_state_topic
    chain = ChainKey(source, 0, key_id(b"acct-1"))
    opened = Chain(chain=chain, head=4, frontier=4, at_tier=0, followers=0, since_ms=1)
    moved = Chain(chain=chain, head=4, frontier=9, at_tier=0, followers=1, since_ms=1)
    kit.produce(topic, [(*encode_record(opened)[:2], [])], partition=0)
    zombie = make_producer(kafka, transactional_id=unique_name("tier-txn"))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    passage = Passage(tier=0, chain=chain, seen=4, fate=Fate.SENT, to_tier=1, after=4)
    zombie.produce(topic, key=encode_record(passage)[0], value=encode_record(passage)[1], partition=0)
    assert zombie.flush(30) == 0
    kit.produce(topic, [(*encode_record(moved)[:2], [])], partition=0)
    clients = KafkaClientFactory(kafka)

    with pytest.raises(KafkaClientError) as raised:  # the transaction stays open: the end is not reached
        clients.read_to_end(topic, [0], 1)
    assert raised.value.retriable

    threading.Timer(0.5, zombie.abort_transaction, args=(30,)).start()
    state = read_key_state(clients.read_to_end, topic, [0], timeout_s=30)
    assert state.records == (opened, moved)
    chains, _ = SourceChains.rebuild(KeyOrdering(), state.records, source=source, partition=0)
    assert chains.admit(key_id(b"acct-1")) == Admission(Admit.FOLLOW, 0, 9)


class _ReadsKeyState(KafkaClientFactory):
    """Apache Kafka clients that tell when a key-state read (at assignment) begins."""

    def __init__(self, kafka: KafkaConfig) -> None:
        super().__init__(kafka)
        self.began = threading.Event()

    def read_to_end(self, topic: str, partitions: Sequence[int] | None, timeout_s: float) -> list[Message]:
        self.began.set()
        return super().read_to_end(topic, partitions, timeout_s)


def test_exactly_once_sigkills_of_the_tier_and_the_main_consumers_inside_transactions_keep_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Guarantee (module docstring) across SIGKILLs of both roles inside their transactions: the main consumer (a
    process of its own) is killed right after a follower hop, its transaction open, and restarted; the tier
    consumers (a process of their own) are killed right after forwarding a follower, their transaction open
    with its passage; the main consumer goes on committing chain records behind that open transaction, then is
    killed again right after a follower hop. A new main consumer
    (same instance: it fences its predecessor) reads its key state while the tiers' transaction is still open,
    and new tier consumers fence that one. The shared ledger shows no record handled before every earlier
    record of its key was terminal, every record handled or dead-lettered as planned (nothing `blocked_by_key`:
    no follower lost its predecessor), and read_committed, each retried hop and each dead letter once.

    Before the fix the new main consumer's read stopped at the open transaction (read_committed's last stable
    offset) and rebuilt its chains without what its predecessor had committed behind it: keys released early
    or followers sent behind a stale record (records handled before earlier ones of their key, or dead-lettered
    as `blocked_by_key`)."""
    worker = _worker_app()
    keys = 12
    source = kit.create(unique_name("orders"), 2)
    ledger, armed = tmp_path / "ledger.jsonl", tmp_path / "kill-the-main-consumer"
    base = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "ledger": str(ledger),
        "exactly_once": True,
        "kill_delay_s": 0.5,
    }
    tiers_settings = {**base, "role": "tiers", "instance": "tiers", "kill_after": 1}
    main_settings = {**base, "instance": "main", "kill_after": 3, "armed_by": str(armed)}
    worker.build_app(base).provision()
    _produce_seqs(kit, source, keys, range(3))
    # no tier consumer yet: the first main consumer is killed right after its third follower hop, inside its
    # transaction; the next one (same instance) fences it and rebuilds the blocked keys from what was committed
    _until_killed(_spawn_worker({**main_settings, "armed_by": None}))
    main = _spawn_worker(main_settings)
    try:
        _until_killed(_spawn_worker(tiers_settings))  # its first forward's transaction stays open
        group = str(base["group"])
        for seq in (3, 4):  # chain records the main consumer commits behind the tiers' open transaction
            _produce_seqs(kit, source, keys, range(seq, seq + 1))
            ends = dict.fromkeys((0, 1), keys // 2 * (seq + 1))
            wait_until(
                lambda ends=ends: kit.committed(group, source, 2) == ends, 60, f"the main consumer committed seq {seq}"
            )
        armed.touch()
        _produce_seqs(kit, source, keys, range(5, 6))
        _until_killed(main)  # its third follower hop of seq 5 in its open transaction
    finally:
        main.kill()
        main.wait(10)

    clients = _ReadsKeyState(kafka)
    restarted = worker.build_app(main_settings, clients=clients)
    apps.append(restarted)
    restarted.start(main=True)
    wait_until(clients.began.is_set, 60, "the new main consumer began reading its key state")
    _produce_seqs(kit, source, keys, range(6, 9))
    tiers = worker.build_app(tiers_settings)
    apps.append(tiers)
    tiers.start(main=False, tiers="all")
    every = {(k, s) for k in range(keys) for s in range(9)}
    wait_until(lambda: _terminal(ledger) >= every, 120, "every record handled or dead-lettered")
    assert restarted.stop(30) and tiers.stop(30) and restarted.error is None and tiers.error is None

    events = _ledger(ledger)
    _assert_key_order(events, every, worker.failures)
    assert {e["pid"] for e in events if "pid" in e} - {os.getpid()}, "the killed workers handled records"
    dead = [read.value for read in kit.read_all(tiers.topics(source).dlq)]
    assert len(dead) == len(set(dead)), "each dead letter committed once"
    hops: Counter[tuple[str, bytes | None, bytes | None]] = Counter()
    for tier in tiers.topics(source).tiers:
        for read in kit.read_all(tier.topic):
            if read.header(_FOLLOWER_HEADER) is None:
                hops[(tier.topic, read.value, read.header("retry.reconsume_times"))] += 1
    assert hops and max(hops.values()) == 1, f"retried hops committed more than once: {hops.most_common(3)}"
