"""Rebalance while tier partitions are paused: a second tier consumer joins the tier's group, then leaves.

Guarantees: pauses are not carried over blindly; the joining consumer starts from the committed offsets and
pauses again on records that are not due; when it leaves, the first consumer takes its partitions back the
same way. No record is skipped, none is handled before its due time, none is handled twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from retrytopics import Event, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

N = 24
POLICY = RetryPolicy(delays=["6s"])


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Event, dict[str, object]]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.events.append((event, dict(data)))

    def assigned(self, consumer_suffix: str) -> list[object]:
        return [
            d["partitions"]
            for e, d in self.events
            if e is Event.PARTITIONS_ASSIGNED and str(d["consumer"]).endswith(consumer_suffix)
        ]


def test_pauses_survive_a_member_joining_and_leaving(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: every record fails once, so all of them wait 6 s in the tier
    source = kit.create(unique_name("orders"), 2)
    group = unique_name("billing")
    lock = threading.Lock()
    calls: list[dict[str, Any]] = []

    def make_app(name: str, recorder: Recorder) -> RetryApp:
        app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides, hooks=[recorder])

        @app.handler(source, policy=POLICY)
        def handle(record: Record[bytes]) -> None:
            with lock:
                calls.append(
                    {
                        "id": record.value,
                        "attempt": record.attempt,
                        "at": time.time() * 1000,
                        "due_at": record.retry.due_at if record.retry else None,
                        "app": name,
                    }
                )
            if record.attempt == 1:
                raise RuntimeError("first attempt fails")

        apps.append(app)
        return app

    first_events, second_events = Recorder(), Recorder()
    first = make_app("first", first_events)
    first.provision()
    kit.produce(source, [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(N)])
    first.start(main=True, tiers="all")
    wait_until(
        lambda: first.stats.retried == N and first.stats.paused_partitions == 2, 30, "both tier partitions paused"
    )

    # when: a second tier consumer joins while everything is paused ...
    second = make_app("second", second_events)
    second.start(main=False, tiers="all")
    wait_until(lambda: second.stats.paused_partitions >= 1, 20, "the newcomer to pause its share again")
    # ... and leaves before anything is due
    assert second.stop(timeout=30)

    # then: everything is handled exactly once on its second attempt, never early
    wait_until(lambda: sum(1 for c in calls if c["attempt"] == 2) >= N, 30, "every retry")
    time.sleep(0.5)  # (a duplicate, if any, would show up right behind; the assertion below is exact)
    retries = [c for c in calls if c["attempt"] == 2]
    assert sorted(c["id"] for c in retries) == sorted(f"v{i}".encode() for i in range(N))
    assert all(c["at"] >= c["due_at"] for c in retries), [c for c in retries if c["at"] < c["due_at"]]
    # then: the rebalance really happened while paused, in both directions
    tier = first.topics(source).tiers[0].topic
    assert second_events.assigned(tier) and any(second_events.assigned(tier))
    assert len(first_events.assigned(tier)) >= 3  # initial, shrunk, taken back
    assert first.stats.duplicates_suppressed == 0
