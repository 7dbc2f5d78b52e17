"""Key-ordered retries on Apache Kafka (docs/key-ordering.md).

Guarantee (provisioning): a key-ordered handler's key-state topic is created by `provision()` and by
`topics create` (`provision_pipeline`) as the design needs it: compacted (it must hold the live state only,
one record per key), with the source's partition count (the state of source partition p is in partition p),
idempotently; a handler without ordering gets none.

Guarantee (the runtime): a key-ordered app on Apache Kafka handles every key in source order, whatever its
records' failures, under both `dead_head` policies (a per-key ledger; see the test), and so does a key-ordered
batch handler, whose calls never hold two records of one key.

Guarantee (reading at assignment): `read_to_end` on Apache Kafka gives every key-state record of the partitions
asked for, in log order (what `SourceChains.rebuild` needs: a later record of a key wins), skipping nothing the
memory broker would give and including an empty partition; a topic that does not exist is a
`KafkaClientError`, never an empty state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from retrytopics import BatchFailed, Event, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.client_factory import KafkaClientFactory
from retrytopics.connectors.admin import ProvisionOutcome
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import SourceChains
from retrytopics.core.keyorder.state_records import Chain, Closed, Fate, Passage, encode_record
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import provision_pipeline
from retrytopics.runtime.keyorder.key_state import read_key_state

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker


def _cleanup_policy(kit: Kit, topic: str) -> str:
    [future] = kit.admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return str(future.result(timeout=30)["cleanup.policy"].value)


def _partitions(kit: Kit, topic: str) -> int:
    return len(kit.admin.list_topics(topic, timeout=10).topics[topic].partitions)


def test_provision_and_topics_create_make_a_compacted_key_state_topic(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    # setup: an ordered and an unordered source of 3 partitions
    ordered, unordered = kit.create(unique_name("orders"), 3), kit.create(unique_name("refunds"), 3)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group)
    app.handler(ordered, policy=RetryPolicy(delays=["5s"]), ordering=KeyOrdering())(lambda record: None)
    app.handler(unordered, policy=RetryPolicy(delays=["5s"]))(lambda record: None)
    keys = app.topics(ordered).key_state_topic

    # when: provisioned twice
    first, second = app.provision(), app.provision()

    # then: the key-state topic of the ordered handler only, compacted, as many partitions as its source
    assert first[keys] is ProvisionOutcome.CREATED and second[keys] is ProvisionOutcome.EXISTS
    assert [name for name in first if name.endswith(".keys")] == [keys]
    assert _cleanup_policy(kit, keys) == "compact"
    assert _partitions(kit, keys) == 3
    assert _cleanup_policy(kit, app.topics(ordered).dlq) == "delete", "the tiers and DLQ keep their retention"

    # when: `topics create` for another group's ordered pipeline of the same source
    other = unique_name("audit")
    outcome = provision_pipeline(
        kafka, AppSettings(topic=ordered, group=other, delays=("5s",), key_ordering=True, replication_factor=1)
    )

    # then: its own compacted key-state topic, named like its tiers
    assert outcome[f"{ordered}.{other}.keys"] is ProvisionOutcome.CREATED
    assert _cleanup_policy(kit, f"{ordered}.{other}.keys") == "compact"
    assert _partitions(kit, f"{ordered}.{other}.keys") == 3


def test_the_key_state_is_read_to_its_end_in_log_order(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    # setup: an ordered handler's key-state topic (3 partitions) holding a chain that moved, a closed chain,
    # a malformed record, and nothing in partition 2
    source = kit.create(unique_name("orders"), 3)
    app = RetryApp(kafka=kafka, group=unique_name("billing"))
    app.handler(source, policy=RetryPolicy(delays=["5s", "1m"]), ordering=KeyOrdering())(lambda record: None)
    app.provision()
    topic = app.topics(source).key_state_topic
    a, b = ChainKey(source, 0, key_id(b"acct-1")), ChainKey(source, 1, key_id(b"acct-2"))
    written = [
        Chain(chain=a, head=4, frontier=4, at_tier=0, followers=0, since_ms=1),
        Chain(chain=b, head=2, frontier=2, at_tier=0, followers=0, since_ms=1),
        Chain(chain=a, head=4, frontier=9, at_tier=0, followers=1, since_ms=1),
        Passage(tier=0, chain=a, seen=9, fate=Fate.SENT, to_tier=1, after=9),
        Closed(chain=b),
    ]
    for record in written:
        key, value, partition = encode_record(record)
        kit.produce(topic, [(key, value, [])], partition=partition)
    kit.produce(topic, [(b"chain/x", b"{}", [])], partition=1)

    # when: a main consumer of source partitions 0 and 2, and a tier consumer, read it
    clients = KafkaClientFactory(kafka)
    mine = read_key_state(clients.read_to_end, topic, [0, 2], timeout_s=30)
    every = read_key_state(clients.read_to_end, topic, None, timeout_s=30)

    # then: log order per partition, the malformed record counted, the moved chain's followers go to tier 1
    assert mine.records == (written[0], written[2], written[3]) and mine.malformed == 0
    assert sorted(every.records, key=repr) == sorted(written, key=repr) and every.malformed == 1
    chains, _ = SourceChains.rebuild(KeyOrdering(), mine.records, source=source, partition=0)
    admission = chains.admit(key_id(b"acct-1"))
    assert (admission.tier, admission.after) == (1, 9)
    with pytest.raises(KafkaClientError):
        clients.read_to_end(unique_name("absent"), None, 5)


# -- the guarantee on the broker --------------------------------------------------------------------------------

#: keys over 3 partitions, records per key; key % 4 says how its records fail (`_failures`)
_KEYS, _PER_KEY = 12, 5
#: keys of the batch handler's ledger: a poll of one partition holds many keys
_BATCH_KEYS = 36


def _failures(key: int, seq: int) -> int:
    """Handler failures of record `seq` of key `key` before it succeeds (99: dead-lettered, exhausted)."""
    return [0, 1 if seq % 2 == 0 else 0, 3 if seq == 1 else 0, 99 if seq == 2 else 0][key % 4]


class _KeyLedger:
    """Every handler call and DLQ write of the app's threads, in order: (what, key, seq, in a tier)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, int, int, bool]] = []
        self.calls: Counter[tuple[int, int]] = Counter()
        self.batches: list[list[bytes | None]] = []

    def handle(self, record: Record[bytes]) -> None:
        if self._failed(record):
            raise RuntimeError(f"record {record.value!r} fails")

    def handle_batch(self, records: list[Record[bytes]]) -> None:
        """A batch handler's call: each record's outcome as `handle` would have it, the failed ones named in a
        `BatchFailed`; the keys each call held, kept."""
        with self.lock:
            self.batches.append([r.key for r in records])
        failed = [(r, RuntimeError(f"record {r.value!r} fails")) for r in records if self._failed(r)]
        if failed:
            raise BatchFailed(failed)

    def _failed(self, record: Record[bytes]) -> bool:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        in_tier = ".retry." in threading.current_thread().name
        with self.lock:
            self.calls[(key, seq)] += 1
            failed = self.calls[(key, seq)] <= _failures(key, seq)
            self.events.append(("fail" if failed else "ok", key, seq, in_tier))
        return failed

    def dead_lettered(self, record: Record[bytes], route: object) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        with self.lock:
            self.events.append(("dlq", key, seq, False))

    def terminal(self) -> set[tuple[int, int]]:
        with self.lock:
            return {(k, s) for what, k, s, _ in self.events if what in ("ok", "dlq")}


def _ordered_app(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    ledger: _KeyLedger,
    dead_head: str,
    *,
    batch: bool,
    keys: int = _KEYS,
) -> tuple[RetryApp, str]:
    """An app with a key-ordered handler (`batch`: a batch handler) on a new source of 3 partitions, holding
    `_PER_KEY` records of each of `keys` keys (key k in partition k % 3, in seq order)."""
    source = kit.create(unique_name("orders"), 3)
    app = RetryApp(kafka=kafka, group=unique_name("billing"), on_dead_letter=ledger.dead_lettered)
    policy = RetryPolicy(delays=["200ms", "400ms"], max_retries=3)
    register = app.batch_handler if batch else app.handler
    register(source, policy=policy, ordering=KeyOrdering(dead_head=dead_head))(
        ledger.handle_batch if batch else ledger.handle
    )
    app.provision()
    for seq in range(_PER_KEY):
        for p in range(3):
            kit.produce(
                source,
                [(f"acct-{k}".encode(), f"{k}:{seq}".encode(), []) for k in range(keys) if k % 3 == p],
                partition=p,
            )
    return app, source


def _check_key_ledger(
    kit: Kit, app: RetryApp, source: str, ledger: _KeyLedger, dead_head: str, keys: int = _KEYS
) -> None:
    """No record handled before every earlier record of its key was terminal; each record handled or in the DLQ
    once with its reason (`blocked_by_key` only under `dead_letter`, behind an exhausted record); keys that
    never fail handled once each on the main consumer; followers handled in the tiers."""
    every = {(k, s) for k in range(keys) for s in range(_PER_KEY)}
    done: set[tuple[int, int]] = set()
    for what, key, seq, _ in ledger.events:
        if what != "dlq":
            missing = [(key, s) for s in range(seq) if (key, s) not in done]
            assert not missing, f"key {key} record {seq} handled before {missing} were terminal"
        if what != "fail":
            done.add((key, seq))
    dlq: dict[tuple[int, int], str] = {}
    for read in kit.read_all(app.topics(source).dlq):
        assert read.value is not None and read.header("retry.dlq_reason") is not None
        key, seq = (int(part) for part in read.value.decode().split(":"))
        assert (key, seq) not in dlq, "each record is dead-lettered once"
        dlq[(key, seq)] = (read.header("retry.dlq_reason") or b"").decode()
    ok = {(k, s) for what, k, s, _ in ledger.events if what == "ok"}
    assert ok | set(dlq) == every and not ok & set(dlq)
    assert {r for r, why in dlq.items() if why == "exhausted"} == {(k, 2) for k in range(keys) if k % 4 == 3}
    blocked = {r for r, why in dlq.items() if why == "blocked_by_key"}
    assert all(k % 4 == 3 and s > 2 for k, s in blocked) and bool(blocked) == (dead_head == "dead_letter")
    clean = [(what, k, s, in_tier) for what, k, s, in_tier in ledger.events if k % 4 == 0]
    assert len(clean) == _PER_KEY * len(range(0, keys, 4)) and not any(in_tier for *_, in_tier in clean)
    assert any(in_tier and what == "ok" and ledger.calls[(k, s)] == 1 for what, k, s, in_tier in ledger.events)


@pytest.mark.parametrize("dead_head", ["release", "dead_letter"])
def test_every_key_is_handled_in_source_order_on_apache_kafka(
    kafka: KafkaConfig, kit: Kit, apps: list[RetryApp], unique_name: Callable[[str], str], dead_head: str
) -> None:
    """Guarantee: on Apache Kafka, with tiers of a few hundred ms, no record is handled before every earlier
    record of its key is terminal; every record is handled successfully or in the DLQ with its reason
    (`blocked_by_key` only under `dead_letter`, behind an exhausted record); keys that never fail are handled
    once each on the main consumer; followers were handled in the tiers (the live key-state feed released
    them)."""
    ledger = _KeyLedger()
    app, source = _ordered_app(kafka, kit, unique_name, ledger, dead_head, batch=False)
    apps.append(app)
    app.start(main=True, tiers="all")
    every = {(k, s) for k in range(_KEYS) for s in range(_PER_KEY)}
    wait_until(lambda: ledger.terminal() >= every, 120, "every record handled or dead-lettered")
    assert app.stop(30) and app.error is None
    _check_key_ledger(kit, app, source, ledger, dead_head)


def test_a_key_ordered_batch_handler_handles_every_key_in_source_order_on_apache_kafka(
    kafka: KafkaConfig, kit: Kit, apps: list[RetryApp], unique_name: Callable[[str], str]
) -> None:
    """Guarantee: a key-ordered batch handler (on the source and both tiers, failures reported per record
    through `BatchFailed`) keeps the same per-key ledger on Apache Kafka as a single-record one, under
    `dead_letter` (module docstring); besides, no call held two records of one key, and calls held many
    records (keys spread over a poll cost no call)."""
    ledger = _KeyLedger()
    app, source = _ordered_app(kafka, kit, unique_name, ledger, "dead_letter", batch=True, keys=_BATCH_KEYS)
    apps.append(app)
    app.start(main=True, tiers="all")
    every = {(k, s) for k in range(_BATCH_KEYS) for s in range(_PER_KEY)}
    wait_until(lambda: ledger.terminal() >= every, 120, "every record handled or dead-lettered")
    assert app.stop(30) and app.error is None
    _check_key_ledger(kit, app, source, ledger, "dead_letter", keys=_BATCH_KEYS)
    for keys in ledger.batches:
        keyed = [k for k in keys if k is not None]
        assert len(keyed) == len(set(keyed)), f"a call held two records of one key: {keys}"
    assert max(len(keys) for keys in ledger.batches) >= _BATCH_KEYS // 3, "a poll's keys went to one call"


_WORKER = Path(__file__).with_name("key_order_worker.py")


def _worker_app() -> Any:
    """The worker module's `build_app` and `failures` (the scenario both processes run)."""
    sys.path.insert(0, str(_WORKER.parent))
    import key_order_worker  # type: ignore[import-not-found]

    return key_order_worker


def _produce(kit: Kit, source: str, keys: int, seqs: range) -> None:
    """Records `"<key>:<seq>"` of key `acct-<key>`, key k in partition k % 2, in seq order."""
    for seq in seqs:
        for p in (0, 1):
            kit.produce(
                source,
                [(f"acct-{k}".encode(), f"{k}:{seq}".encode(), []) for k in range(keys) if k % 2 == p],
                partition=p,
            )


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _terminal(path: Path) -> set[tuple[int, int]]:
    return {(e["key"], e["seq"]) for e in _ledger(path) if e["what"] in ("ok", "dlq")}


def _assert_key_order(events: list[dict[str, Any]], every: set[tuple[int, int]], failures: Any) -> None:
    """The per-key ledger proves the guarantee: no call for a record before every earlier record of its key
    was terminal (calls may repeat: at-least-once); each record handled, or in the DLQ as exhausted exactly
    when its failures say so (`release`: nothing `blocked_by_key`)."""
    done: set[tuple[int, int]] = set()
    for e in events:
        key, seq = e["key"], e["seq"]
        if e["what"] != "dlq":
            missing = [(key, s) for s in range(seq) if (key, s) not in done]
            assert not missing, f"key {key} record {seq} handled before {missing} were terminal"
        if e["what"] != "fail":
            done.add((key, seq))
    dlq = {(e["key"], e["seq"]): e["reason"] for e in events if e["what"] == "dlq"}
    assert set(dlq.items()) == {((k, s), "exhausted") for k, s in every if failures(k, s) == 99}
    assert {(e["key"], e["seq"]) for e in events if e["what"] == "ok"} == every - set(dlq)


def _spawn_worker(settings: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start the worker (`_until_killed` waits for it)."""
    return subprocess.Popen(
        [sys.executable, str(_WORKER), json.dumps(settings)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _until_killed(worker: subprocess.Popen[bytes]) -> None:
    """Wait until the worker SIGKILLs itself (it must, within a minute)."""
    try:
        assert worker.wait(60) == -signal.SIGKILL, "the worker killed itself after handing off followers"
    finally:
        worker.kill()
        worker.wait(10)


def _run_worker(settings: dict[str, Any]) -> None:
    """Run the worker until it SIGKILLs itself (it must, within a minute)."""
    _until_killed(_spawn_worker(settings))


def _kill_the_main_consumer_while_keys_are_blocked(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
    **worker_settings: Any,
) -> tuple[RetryApp, str]:
    """The scenario of the main consumer's SIGKILL (key_order_worker.py, with `worker_settings`): tier consumers
    here, the main consumer in a worker that kills itself after its 4th follower hop, then a new main consumer
    here; checks the shared ledger (order kept, every record terminal, the killed worker handled some). Returns
    the tier consumers' app and the source."""
    worker = _worker_app()
    keys, per_key = 12, 6
    source = kit.create(unique_name("orders"), 2)
    ledger = tmp_path / "ledger.jsonl"
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "ledger": str(ledger),
        "kill_after": 4,
        **worker_settings,
    }
    tiers = worker.build_app(settings)
    apps.append(tiers)
    tiers.provision()
    _produce(kit, source, keys, range(per_key))
    tiers.start(main=False, tiers="all")
    _run_worker(settings)

    main = worker.build_app(settings)
    apps.append(main)
    main.start(main=True)
    every = {(k, s) for k in range(keys) for s in range(per_key)}
    wait_until(lambda: _terminal(ledger) >= every, 120, "every record")
    assert main.stop(30) and tiers.stop(30) and main.error is None and tiers.error is None

    events = _ledger(ledger)
    _assert_key_order(events, every, worker.failures)
    assert {e["pid"] for e in events if "pid" in e} - {os.getpid()}, "the killed worker handled records"
    return tiers, source


def test_a_sigkill_of_the_main_consumer_while_keys_are_blocked_keeps_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Guarantee: the main consumer, in a process of its own, is SIGKILLed right after handing off a follower
    (its chain record unwritten, its offset uncommitted) while keys are blocked; a new main consumer rebuilds the
    blocked keys from the key-state topic. A ledger shared by both processes and the tier consumers shows no
    record handled before every earlier record of its key was terminal, and every record handled or in the
    DLQ (calls may repeat: at-least-once)."""
    _kill_the_main_consumer_while_keys_are_blocked(kafka, kit, apps, unique_name, consumer_overrides, tmp_path)


def test_a_sigkill_of_the_tier_consumers_while_followers_wait_in_them_keeps_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Guarantee: the tier consumers, in a process of their own, are SIGKILLed right after a tier forwarded a
    follower behind its re-failed head (the hop in flight, its passage unwritten, its tier offset uncommitted),
    while keys are blocked with followers in the tiers; new tier consumers rebuild what the tiers did from the
    key-state topic. The shared ledger shows no record handled before every earlier record of its key was
    terminal, and every record handled or in the DLQ (calls may repeat: at-least-once)."""
    worker = _worker_app()
    keys, per_key = 12, 6
    source = kit.create(unique_name("orders"), 2)
    ledger = tmp_path / "ledger.jsonl"
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "ledger": str(ledger),
        "kill_after": 2,
        "role": "tiers",
    }
    main = worker.build_app(settings)
    apps.append(main)
    main.provision()
    _produce(kit, source, keys, range(per_key))
    main.start(main=True)
    _run_worker(settings)
    killed = _terminal(ledger)

    tiers = worker.build_app(settings)
    apps.append(tiers)
    tiers.start(main=False, tiers="all")
    every = {(k, s) for k in range(keys) for s in range(per_key)}
    wait_until(lambda: _terminal(ledger) >= every, 120, "every record")
    assert main.stop(30) and tiers.stop(30) and main.error is None and tiers.error is None

    events = _ledger(ledger)
    _assert_key_order(events, every, worker.failures)
    assert any(e["pid"] != os.getpid() for e in events), "the killed tier consumers handled records"
    assert every - killed, "records were left to the restarted tier consumers"


def test_a_member_joining_while_keys_are_blocked_keeps_the_order(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
) -> None:
    """Guarantee: while keys are blocked (their heads fail in the tiers until the test lets them succeed, their
    followers handed off behind them), a second main consumer joins the group and the rebalance moves source
    partitions with blocked keys; records of those keys produced after the join are not handled before their
    heads: the per-key ledger shows no record handled before every earlier record of its key was terminal,
    every record handled (nothing dead-lettered), and the joiner took part."""
    keys, per_key = 12, 6
    source = kit.create(unique_name("orders"), 2)
    group = unique_name("billing")
    heads_fail = threading.Event()
    heads_fail.set()
    lock = threading.Lock()
    events: list[dict[str, Any]] = []

    def build(member: str, hook: _Followed) -> RetryApp:
        app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides, hooks=[hook])

        # the head of every key k % 4 == 2 (its record 1) fails until `heads_fail` is cleared, however long the
        # rebalance takes on a busy machine: its retries are unlimited, never exhausted
        policy = RetryPolicy(delays=["200ms", "400ms"], max_retries="unlimited")

        @app.handler(source, policy=policy, ordering=KeyOrdering())
        def handle(record: Record[bytes]) -> None:
            key, seq = (int(part) for part in record.value.decode().split(":"))
            failed = key % 4 == 2 and seq == 1 and heads_fail.is_set()
            with lock:
                events.append({"what": "fail" if failed else "ok", "key": key, "seq": seq, "member": member})
            if failed:
                raise RuntimeError(f"key {key} record {seq} fails")

        return app

    followed, joined = _Followed(), _Followed()
    first = build("first", followed)
    apps.append(first)
    first.provision()
    _produce(kit, source, keys, range(3))
    first.start(main=True, tiers="all")
    wait_until(lambda: followed.count >= 3, 60, "followers handed off behind the failing heads: keys blocked")

    joiner = build("joiner", joined)
    apps.append(joiner)
    joiner.start(main=True)
    wait_until(lambda: joined.assigned, 60, "the joiner assigned a source partition")
    _produce(kit, source, keys, range(3, per_key))
    every = {(k, s) for k in range(keys) for s in range(per_key)}

    def terminal() -> set[tuple[int, int]]:
        with lock:
            return {(e["key"], e["seq"]) for e in events if e["what"] == "ok"}

    wait_until(
        lambda: every - terminal() <= {(k, s) for k in range(2, keys, 4) for s in range(1, per_key)}, 60, "others"
    )
    heads_fail.clear()
    wait_until(lambda: terminal() >= every, 60, "every record")
    assert joiner.stop(30) and first.stop(30) and joiner.error is None and first.error is None

    _assert_key_order(list(events), every, lambda k, s: 0)
    assert joined.count or any(e["member"] == "joiner" for e in events), "the joiner handled or handed off records"


class _Followed:
    """Counts the followers an app's main consumer handed off, and whether it was assigned a source partition."""

    def __init__(self) -> None:
        self.count = 0
        self.assigned = False

    def on_event(self, event: Event, data: Any) -> None:
        if event is Event.KEY_ORDER_FOLLOWED:
            self.count += 1
        elif event is Event.PARTITIONS_ASSIGNED and data.get("partitions"):
            self.assigned = True
