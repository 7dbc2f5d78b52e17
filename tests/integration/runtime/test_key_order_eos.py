"""Key-ordered retries with `exactly_once=True` on Apache Kafka (docs/key-ordering.md, section 8).

Guarantee: with follower hops, key-state records and offsets in one transaction per batch, committed outcomes
are in order and each is committed once. A per-key ledger of every handler call and DLQ write shows no record
handled before every earlier record of its key was terminal (its success, or its dead letter committed); what
a read_committed reader sees holds every retried hop once and every dead letter once; the group's committed
offsets reach the end of the source. Also when a transaction holding a follower hop aborts while keys are
blocked: the key state is rebuilt from the key-state topic (read_committed) and the batch read again, so the
aborted follower is handed off again, not taken for a record already behind its chain, and nothing is lost.
And when the main consumer is SIGKILLed with a follower hop in its open transaction: the restarted one fences
it, and reads the key state without it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from retrytopics import Event, KeyOrdering, RetryApp, RetryPolicy
from retrytopics.client_factory import KafkaClientFactory
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import Header
from retrytopics.core.ports import DeliveryCallback, ProducerPort

from .conftest import Kit, wait_until
from .test_key_order import _KEYS, _PER_KEY, _KeyLedger, _kill_the_main_consumer_while_keys_are_blocked

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


def test_exactly_once_a_sigkill_of_the_main_consumer_while_keys_are_blocked_keeps_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Guarantee (module docstring): the exactly-once main consumer, in a process of its own, is SIGKILLed right
    after producing a follower hop into its open transaction while keys are blocked; a new main consumer with
    the same instance id fences that transaction and rebuilds the blocked keys from what was committed. The
    shared ledger shows the order kept and every record handled or dead-lettered (calls may repeat: the killed
    batch's); read_committed, each dead letter and each retried hop is there once."""
    tiers, source = _kill_the_main_consumer_while_keys_are_blocked(
        kafka, kit, apps, unique_name, consumer_overrides, tmp_path, exactly_once=True, instance="worker"
    )
    dead = [read.value for read in kit.read_all(tiers.topics(source).dlq)]
    assert len(dead) == len(set(dead)), "each dead letter committed once"
    hops: Counter[tuple[str, bytes | None, bytes | None]] = Counter()
    for tier in tiers.topics(source).tiers:
        for read in kit.read_all(tier.topic):
            if read.header(_FOLLOWER_HEADER) is None:
                hops[(tier.topic, read.value, read.header("retry.reconsume_times"))] += 1
    assert hops and max(hops.values()) == 1, f"retried hops committed more than once: {hops.most_common(3)}"
