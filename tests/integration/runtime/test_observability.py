"""Observability on Apache Kafka, on one running app shared by every check of this module.

Guarantees:
- the lag of a paused tier partition is true: records appended behind its head show in its lag within seconds
  (librdkafka's own lag freezes while a partition is paused; the consumers measure it, runtime/lag.py), and a
  consumer asks its end offsets at most once a second;
- Debian's Prometheus scrapes the app's `/metrics`, and every query of the dashboard (deploy/grafana/) returns
  data from it: no panel names a metric the app does not export.

The app: a source topic whose handler passes `ok` records, fails `flaky` ones once (handled on the 1 s tier:
lateness), fails `stuck` ones on every attempt (they end up waiting on the 60 s tier, paused) and dead-letters
`bad` ones (NonRetryable).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.observe.events import Event
from retrytopics.observe.metrics import PrometheusHook

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["1s", "60s"])


class LagRequests:
    """Counts the end-offset requests of each consumer, from the `lag.measured` events' times."""

    wanted_events = frozenset({Event.LAG_MEASURED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.measured_at: dict[str, set[int]] = {}

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            self.measured_at.setdefault(str(data["consumer"]), set()).add(int(data["measured_at"]))  # type: ignore[call-overload]


@dataclass
class Pipeline:
    app: RetryApp
    metrics: PrometheusHook
    requests: LagRequests
    kit: Kit
    source: str
    slow_tier: str
    port: int
    started_at_ms: float


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pipeline(kafka: KafkaConfig) -> Iterator[Pipeline]:
    name = f"observe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    kit = Kit(kafka)
    source = kit.create(f"{name}-orders", 2)
    metrics, requests = PrometheusHook(), LagRequests()
    overrides: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    # librdkafka's own lag, reported every second: the measured lag must win over it
    overrides.update({**metrics.consumer_properties(), "statistics.interval.ms": 1000})
    app = RetryApp(kafka=kafka, group=f"{name}-billing", consumer_overrides=overrides, hooks=[metrics, requests])

    @app.handler(source, policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        if record.value.startswith(b"bad"):
            raise NonRetryable(ValueError("unreadable order"))
        if record.value.startswith(b"stuck") or (record.value.startswith(b"flaky") and record.retry is None):
            raise TimeoutError("downstream timed out")

    app.provision()
    metrics.track_health(lambda: bool(app.healthy))
    port = _free_port()
    metrics.serve(port, addr="127.0.0.1")
    started_at_ms = time.time() * 1000
    app.start(main=True, tiers="all")
    try:
        records = [(f"k{i}".encode(), f"{kind}-{i}".encode(), []) for i, kind in enumerate(["ok"] * 8 + ["flaky"] * 4)]
        records += [(b"s", b"stuck-0", []), (b"b", b"bad-0", [])]
        kit.produce(source, records)
        yield Pipeline(app, metrics, requests, kit, source, app.topics(source).tiers[1].topic, port, started_at_ms)
    finally:
        app.stop()


def _value(metrics: PrometheusHook, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_paused_tier_partitions_lag_moves_when_records_are_added_behind_its_head(pipeline: Pipeline) -> None:
    # setup: the stuck record waits on the 60 s tier, its partition paused, its lag 1
    metrics, tier = pipeline.metrics, pipeline.slow_tier
    wait_until(lambda: _value(metrics, "retrytopics_paused_partitions", topic=tier) == 1, 60, "the 60 s tier paused")
    wait_until(lambda: _value(metrics, "retrytopics_consumer_lag", topic=tier) == 1, 30, "the tier's lag is 1")

    # when: three records are appended to each partition, so behind the paused head (those of the other partition
    # are read at once: a tier record without retry headers is dead-lettered, invalid_retry_headers)
    for partition in range(2):
        pipeline.kit.produce(tier, [(b"x", b"behind", [])] * 3, partition=partition)

    # then: the lag says 4 while the partition stays paused
    wait_until(lambda: _value(metrics, "retrytopics_consumer_lag", topic=tier) == 4, 20, "the paused tier's lag moved")
    assert _value(metrics, "retrytopics_paused_partitions", topic=tier) == 1
    # and each consumer asked its end offsets at most once a second since the app started (one answer: one
    # `measured_at`, shared by its partitions)
    elapsed_s = (time.time() * 1000 - pipeline.started_at_ms) / 1000
    with pipeline.requests.lock:
        answers = {consumer: len(times) for consumer, times in pipeline.requests.measured_at.items()}
    assert len(answers) == 3, answers  # the main consumer and both tiers measure
    assert all(count <= elapsed_s + 1 for count in answers.values()), (answers, elapsed_s)
