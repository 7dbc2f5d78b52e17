"""Exactly-once: a rebalance never commits a hand-off without its source offset.

Guarantee: records waiting in a tier consumer's memory are handed off at the top of a loop iteration, so
their transaction is still open when `consume()` runs the rebalance callbacks. When the partition is revoked
there, the transaction commits with the revoked partition's offset before the callback returns; the new owner
(another process) starts after the record, and the next topic holds one committed copy of the hand-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, decode
from retrytopics.observe.events import Event

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

#: one tier of 1 s: a tier record is due within `wait_in_memory` (1 s) when fetched, so it waits in memory
POLICY = RetryPolicy(delays=["1s"])


class Assignments:
    """Counts tier partitions assigned and revoked (a hook)."""

    def __init__(self) -> None:
        self.assigned = 0
        self.revoked = 0

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if ".retry." not in str(data.get("consumer")) or not data.get("partitions"):
            return
        if event is Event.PARTITIONS_ASSIGNED:
            self.assigned += 1
        elif event is Event.PARTITIONS_REVOKED:
            self.revoked += 1


def _group_rebalancing(kit: Kit, group: str) -> bool:
    futures = kit.admin.describe_consumer_groups([group], request_timeout=5)
    return futures[group].result(timeout=10).state in (
        ConsumerGroupState.PREPARING_REBALANCING,
        ConsumerGroupState.COMPLETING_REBALANCING,
    )


def test_a_revoke_commits_the_open_transaction_with_the_revoked_offsets(
    broker: Any,
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu's DescribeGroups never reports a rebalance in progress, so the test cannot time it")
    # setup: one app runs the main and tier consumers; its tier handler fails the record again (-> DLQ)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    calls: list[tuple[bytes, int]] = []
    in_tier, rebalancing = threading.Event(), threading.Event()
    lock = threading.Lock()

    def make_app(instance_id: str) -> tuple[RetryApp, Assignments]:
        # frequent heartbeats: the first member learns of the rebalance within the consume() after the handler
        overrides = {**consumer_overrides, "heartbeat.interval.ms": 100}
        app = RetryApp(
            kafka=kafka, group=group, consumer_overrides=overrides, exactly_once=True, instance_id=instance_id
        )  # two replicas: each its own transactional ids
        seen = Assignments()
        app.add_hook(seen)

        @app.handler(source, policy=POLICY)
        def handle(record: Record[bytes]) -> None:
            with lock:
                calls.append((record.value or b"", record.attempt))
                first_tier_call = record.attempt == 2 and not in_tier.is_set()
            if first_tier_call:
                in_tier.set()
                assert rebalancing.wait(30), "the second member never joined"
            raise RuntimeError(f"attempt {record.attempt} fails")

        return app, seen

    first, first_seen = make_app("replica-1")
    apps.append(first)
    first.provision()
    tier = first.topics(source).tiers[0].topic
    first.start(main=True, tiers="all")
    wait_until(lambda: first_seen.assigned, 30, "the tier consumer's assignment")
    kit.produce(source, [(b"k", b"x", [])])

    # when: while the tier handler runs on the record from memory, a second member joins the tier group;
    # the hand-off is produced in a transaction and the revoke arrives in the next consume()
    wait_until(in_tier.is_set, 30, "the tier handler")
    second, second_seen = make_app("replica-2")
    apps.append(second)
    second.start(main=False, tiers="all")
    wait_until(lambda: _group_rebalancing(kit, tier), 30, "the tier group to rebalance")
    rebalancing.set()
    wait_until(lambda: first_seen.revoked, 30, "the revoke of the first member's tier partition")
    # the first member leaves, so the partition goes to the second, whose duplicate audit is empty: had the
    # offset stayed uncommitted, it would hand the record off again
    assert first.stop()
    wait_until(lambda: second_seen.assigned, 30, "the second member's assignment")
    # past the record (1), or past the transaction's marker after it too (2), once the second member went idle
    wait_until(lambda: kit.committed(tier, tier, 1)[0] in (1, 2), 30, "the tier offset committed")
    wait_until(lambda: kit.read_all(first.topics(source).dlq), 30, "the DLQ record")
    assert second.stop()

    # then: one committed DLQ record, and the tier handler ran once (nobody read the record again)
    dlq = kit.read_all(first.topics(source).dlq)
    assert [(r.value, decode(list(r.headers)).dlq_reason) for r in dlq] == [(b"x", DlqReason.EXHAUSTED)]
    assert calls == [(b"x", 1), (b"x", 2)]
