"""Shared fixtures: one Kafka broker per test session, unique topic names per test.

Broker selection (first match wins):
1. `KAFKA_BOOTSTRAP_SERVERS` is set → that external cluster (plus the other `KAFKA_*` variables, see
   `KafkaConfig.from_env`);
2. `RETRYTOPICS_TEST_BROKER=testcontainers` → testcontainers' Kafka image (real Apache Kafka). Opting in
   without a reachable Docker daemon is an error, never a silent fallback;
3. otherwise the embedded tansu broker (`retrytopics.connectors.embedded`).

Embedded-broker behaviours the tests work around (never special-cased in library code):
- a consumer-group join takes about session.timeout.ms / 2, so test consumers use 6000 ms (a 3 s join);
- after a batched produce the high watermark under-reports, so tests that depend on end offsets produce
  with `batch.num.messages=1` (the embedded broker's `kafka_config()` carries that override);
- `offsets_for_times` answers are wrong, so timestamp options are verified only on real Kafka.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from retrytopics.connectors.config import KafkaConfig

# Spark workers must import the same interpreter's packages (retrytopics, confluent-kafka).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

#: Consumer settings the tests use for group membership (see the module docstring).
TEST_SESSION_TIMEOUT_MS = 6000


@dataclass(frozen=True)
class TestBroker:
    """The broker the session runs against."""

    kind: str  # "external" | "testcontainers" | "embedded"
    kafka: KafkaConfig

    @property
    def is_embedded(self) -> bool:
        return self.kind == "embedded"


def _testcontainers_broker() -> Iterator[TestBroker]:
    import docker
    from testcontainers.kafka import KafkaContainer

    try:
        docker.from_env().ping()
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(
            "RETRYTOPICS_TEST_BROKER=testcontainers, but no Docker daemon answers: " f"{exc}"
        ) from exc
    with KafkaContainer().with_kraft() as container:
        yield TestBroker("testcontainers", KafkaConfig(bootstrap=container.get_bootstrap_server()))


@pytest.fixture(scope="session")
def broker() -> Iterator[TestBroker]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield TestBroker("external", KafkaConfig.from_env())
        return
    if os.environ.get("RETRYTOPICS_TEST_BROKER", "").lower() == "testcontainers":
        yield from _testcontainers_broker()
        return
    from retrytopics.connectors.embedded import EmbeddedBroker

    with EmbeddedBroker() as embedded:
        yield TestBroker("embedded", embedded.kafka_config())


@pytest.fixture(scope="session")
def kafka(broker: TestBroker) -> KafkaConfig:
    return broker.kafka


_topic_counter = itertools.count()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("orders")` → a topic or group name no other test uses (also across reruns on a
    long-lived external cluster, thanks to the pid)."""
    test = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:60].strip("-")

    def make(base: str) -> str:
        return f"{base}-{test}-{os.getpid()}-{next(_topic_counter)}"

    return make


@pytest.fixture
def consumer_overrides() -> dict[str, int | str | bool]:
    """Group-membership settings for test consumers."""
    return {"session.timeout.ms": TEST_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500}
